"""Peak memory of loading a large private CSV: the streaming loader (texts kept on disk in a
memory-mapped Arrow file, labels and users as codes) against a whole-file pandas load (how
``load_dataset`` read files before: every column parsed at once, then turned into Python
lists), side by side in one run, each in its own fresh subprocess.

    .venv/bin/python benchmarks/bench_loader.py --rows 1000000 \\
        --out benchmarks/results/loader.md

The CSV is generated (synthetic sentences of 10-60 words, 3 labels, ~50,000 users) into a
temporary folder and removed afterwards. Peak RSS is the subprocess's ``VmHWM`` (Linux); the
import baseline (pandas, pyarrow, dpsynth) is measured the same way and reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from dpsynth.bench.machine import Where, describe

ROOT = Path(__file__).resolve().parent

ARMS = {
    "baseline": """
import dpsynth.data, pandas, pyarrow
""",
    "streaming": """
from dpsynth.data import load_dataset
ds = load_dataset(PATH, "text", ["label"], user="user", max_chars=None, text_dir=TMP)
fp = ds.fingerprint()
n = len(ds)
""",
    "whole_file": """
import pandas as pd
df = pd.read_csv(PATH, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8",
                 encoding_errors="replace")
texts, labels, users = (df[c].astype("str").tolist() for c in ("text", "label", "user"))
del df
n = len(texts)
""",
}


def write_csv(path: Path, rows: int, seed: int = 0) -> None:
    """A CSV of ``rows`` synthetic records, written in chunks."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(5000)])
    first = True
    for start in range(0, rows, 100_000):
        m = min(100_000, rows - start)
        lengths = rng.integers(10, 61, size=m)
        words = vocab[rng.integers(0, len(vocab), size=int(lengths.sum()))]
        cuts = np.cumsum(lengths)[:-1]
        texts = [" ".join(w) for w in np.split(words, cuts)]
        frame = pd.DataFrame({"text": texts,
                              "label": rng.choice(["low", "medium", "high"], size=m),
                              "user": [f"user{u}" for u in rng.integers(0, 50_000, size=m)]})
        frame.to_csv(path, mode="w" if first else "a", header=first, index=False)
        first = False


_SAMPLER = """
import json, re, threading, time
def _status(key):
    return int(re.search(key + r':\\s+(\\d+)', open('/proc/self/status').read()).group(1))
_peak = [0]
_stop = threading.Event()
def _sample():
    while not _stop.is_set():
        _peak[0] = max(_peak[0], _status('RssAnon'))
        time.sleep(0.005)
threading.Thread(target=_sample, daemon=True).start()
t0 = time.perf_counter()
def done():
    _stop.set()
    return {'seconds': time.perf_counter() - t0, 'peak_mb': _status('VmHWM') / 1024,
            'peak_anon_mb': max(_peak[0], _status('RssAnon')) / 1024}
"""


def run_arm(code: str, path: Path, tmp: Path) -> dict[str, float]:
    """Run one arm in a fresh interpreter; its peak RSS (MB) and wall seconds."""
    # VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would report this parent's peak.
    # VmHWM counts the pages of a memory-mapped file that were read (clean, shared, dropped by
    # the kernel under pressure); RssAnon (sampled every 5 ms) is the process's own memory.
    script = (f"PATH = {str(path)!r}\nTMP = {str(tmp)!r}\n" + _SAMPLER + code +
              "\nprint(json.dumps(done()))\n")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "loader.md")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-loader-"))
    try:
        path = tmp / "private.csv"
        start = time.perf_counter()
        write_csv(path, args.rows)
        size_mb = path.stat().st_size / 2**20
        print(f"wrote {args.rows:,} rows ({size_mb:,.0f} MB) in "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        results = {}
        with Where() as where:
            for name, code in ARMS.items():
                results[name] = run_arm(code, path, tmp)
                print(name, results[name], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results["baseline"]["peak_anon_mb"]
    s, w = results["streaming"], results["whole_file"]
    ratio = (s["peak_anon_mb"] - base) / (w["peak_anon_mb"] - base)

    def row(label: str, r: dict[str, float]) -> str:
        return (f"| {label} | {r['peak_anon_mb']:,.0f} MB | {r['peak_anon_mb'] - base:,.0f} MB | "
                f"{r['peak_mb']:,.0f} MB | {r['seconds']:.1f} |")

    lines = [
        f"# Loading a {args.rows:,}-row private CSV: streaming loader vs whole-file pandas load",
        "",
        f"Machine: {describe(where.result())}. CSV: {size_mb:,.0f} MB (text of 10-60 "
        "words, a label, a user id). Each arm runs in its own fresh subprocess "
        "(`python benchmarks/bench_loader.py`).",
        "",
        "| | peak own memory (RssAnon) | above imports | peak RSS incl. mapped file pages "
        "(VmHWM) | seconds |",
        "|---|---|---|---|---|",
        f"| imports only (pandas, pyarrow, dpsynth) | {base:,.0f} MB | - | "
        f"{results['baseline']['peak_mb']:,.0f} MB | - |",
        row("whole-file pandas load, columns as lists (the loader before)", w),
        row("streaming loader: validate + texts to a memory-mapped Arrow file + fingerprint", s),
        "",
        f"Streaming / whole-file peak own memory above imports: **{ratio:.2f}x**. The streaming "
        "arm also validates every record (empty texts, duplicates, label values) and computes "
        "the dataset fingerprint by reading the text file back in chunks; the whole-file arm "
        "only parses. VmHWM also counts the pages of the memory-mapped text file that were "
        "read (clean file pages the kernel drops under pressure), so own memory is the fair "
        "measure. What the streaming loader keeps per record: int32 label and user codes, the "
        "row number, a 64-bit duplicate hash and the text length (~36 bytes); the duplicate "
        "search (one sort of the hashes) adds a transient ~50 bytes per record, so memory still "
        "grows with M, by about 90 bytes per record instead of the ~730 of the whole-file "
        f"load. It takes {s['seconds'] / w['seconds']:.1f}x as long (it validates and "
        "fingerprints; wall time here is under the shared machine's load). pyarrow's mimalloc pool "
        "keeps ~40 MB of freed chunk buffers (ARROW_DEFAULT_MEMORY_POOL=system returns them).",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    (args.out.with_suffix(".json")).write_text(json.dumps(
        {"rows": args.rows, "csv_mb": size_mb, "results": results, "ratio_above_imports": ratio,
         "machine": where.result()},
        indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
