"""Aug-PE voting at speed: dpsynth's faiss path against a plain NumPy / scikit-learn reference
on the same arrays (M private, N candidates, labels), time and peak memory, one run.

    .venv/bin/python benchmarks/bench_augpe_voting.py --private 100000 --synthetic 10000

Each path runs in its own subprocess so that its peak resident memory (ru_maxrss) is its own;
peak memory is reported above the baseline of a process that only holds the arrays.
Writes JSON to stdout and a markdown section to benchmarks/results/augpe_voting.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dpsynth.bench.machine import Where, describe

OUT = Path(__file__).parent / "results" / "augpe_voting.md"


def make_arrays(m: int, n: int, dim: int, labels: int, seed: int):
    rng = np.random.default_rng(seed)
    priv = rng.standard_normal((m, dim), dtype=np.float32)
    priv /= np.linalg.norm(priv, axis=1, keepdims=True)
    cand = rng.standard_normal((n, dim), dtype=np.float32)
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    return priv, rng.integers(0, labels, m), cand, rng.integers(0, labels, n)


def reference_vote(priv, plab, cand, clab, k: int) -> np.ndarray:
    """The straightforward implementation: scikit-learn NearestNeighbors (brute force, cosine)
    per label, then a NumPy histogram."""
    from sklearn.neighbors import NearestNeighbors

    hist = np.zeros(len(cand))
    for y in np.unique(plab):
        ci = np.flatnonzero(clab == y)
        nn = NearestNeighbors(n_neighbors=min(k, len(ci)), algorithm="brute", metric="cosine")
        nn.fit(cand[ci])
        _, ids = nn.kneighbors(priv[plab == y])
        np.add.at(hist, ci[ids.ravel()], 1 / np.sqrt(ids.shape[1]))
    return hist


def child(path: str, args: argparse.Namespace) -> None:
    priv, plab, cand, clab = make_arrays(args.private, args.synthetic, args.dim, args.labels,
                                         args.seed)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if path == "faiss":
        from dpsynth.voting import knn_vote

        hist = knn_vote(priv, plab, cand, clab, k=args.k)
    elif path == "reference":
        hist = reference_vote(priv, plab, cand, clab, args.k)
    else:
        hist = np.zeros(len(cand))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_extra_mb": (peak - base) / 1024,
                      "checksum": float(np.round(hist.sum(), 6)),
                      "hist_head": np.round(hist[:50], 6).tolist()}))


def run_child(path: str, argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", path, *argv], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--private", type=int, default=100_000)
    ap.add_argument("--synthetic", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--labels", type=int, default=10)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        child(args.child, args)
        return
    argv = [f"--private={args.private}", f"--synthetic={args.synthetic}", f"--dim={args.dim}",
            f"--labels={args.labels}", f"--k={args.k}", f"--seed={args.seed}"]
    with Where() as where:
        fast = run_child("faiss", argv)
        ref = run_child("reference", argv)
    agree = fast["hist_head"] == ref["hist_head"] and fast["checksum"] == ref["checksum"]
    result = {
        "private": args.private, "synthetic": args.synthetic, "dim": args.dim,
        "labels": args.labels, "k": args.k,
        "faiss_seconds": round(fast["seconds"], 3),
        "reference_seconds": round(ref["seconds"], 3),
        "speedup": round(ref["seconds"] / fast["seconds"], 2),
        "faiss_peak_mb": round(fast["peak_extra_mb"], 1),
        "reference_peak_mb": round(ref["peak_extra_mb"], 1),
        "same_histogram": agree,
        "machine": where.result(),
    }
    print(json.dumps(result))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        "### Aug-PE voting: faiss vs NumPy/scikit-learn reference\n\n"
        f"M = {args.private:,} private, N = {args.synthetic:,} candidates, d = {args.dim}, "
        f"{args.labels} labels, k = {args.k}; one run, each path in its own process.\n\n"
        f"Machine: {describe(result['machine'])}.\n\n"
        "| path | seconds | peak extra memory (MB) |\n|---|---|---|\n"
        f"| dpsynth knn_vote (faiss IndexFlatIP, batched) | {result['faiss_seconds']} | "
        f"{result['faiss_peak_mb']} |\n"
        f"| reference (sklearn NearestNeighbors brute cosine + NumPy) | "
        f"{result['reference_seconds']} | {result['reference_peak_mb']} |\n\n"
        f"Speed-up {result['speedup']}x; identical histograms: {agree}.\n"
    )


if __name__ == "__main__":
    main()
