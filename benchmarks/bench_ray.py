"""The vote step on `compute.engine: ray` against `engine: local`, side by side in one run.

M private records (a CSV of synthetic texts, read by the shards themselves), N candidates,
MiniLM's dimension (384), L labels (a record searches the N / L candidates of its label; the
Aug-PE voting benchmark's setting is L = 10).
The embedder is a deterministic stand-in (a vectorised hash of the row number to a unit vector)
so the vote, not the model, is measured; the real embedder's rate is measured on a sample and
extrapolated. Both engines run the same kernels (dpsynth.compute.kernels) and the releases'
histograms must be bitwise equal (checked).

    .venv/bin/python benchmarks/bench_ray.py --private 1000000 --synthetic 10000 --shards 2

Writes benchmarks/results/ray.md (and prints it). The Ray cluster is a one-machine Ray started
by this process (`compute.address: local`, one CPU per shard) and shut down at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


class HashEmbedder:
    """Unit vectors from a vectorised hash of the number in each text (picklable, fast)."""

    def __init__(self, dim: int = 384) -> None:
        self.dim = dim

    def embed(self, texts: list[str], *, progress: bool = False) -> np.ndarray:
        ids = np.array([int(re.search(r"\d+", t).group()) for t in texts], dtype=np.float64)
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        j = np.arange(self.dim, dtype=np.float64)
        for start in range(0, len(ids), 65536):
            x = np.sin(ids[start:start + 65536, None] * 12.9898 + j * 78.233) * 43758.5453
            v = (x - np.floor(x) - 0.5).astype(np.float32)
            out[start:start + 65536] = v / np.linalg.norm(v, axis=1, keepdims=True)
        return out


def write_private(path: Path, m: int, labels: int) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("text,label\n")
        for i in range(m):
            fh.write(f"record {i} asks about a bill,l{i % labels}\n")


def real_embed_rate(n: int = 256) -> float | None:
    """Sentences per second of the configured embedder (minilm) on this machine, or None."""
    try:
        from dpsynth.embed import Embedder

        emb = Embedder("minilm", cache_dir=None)
        texts = [f"patient message number {i} about a bill and a refill" for i in range(n)]
        emb.embed(texts[:16])  # warm
        start = time.perf_counter()
        emb.embed(texts)
        return n / (time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 (reported, not fatal)
        print(f"real embedder not measured: {type(err).__name__}: {err}", file=sys.stderr)
        return None


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--private", type=int, default=1_000_000)
    ap.add_argument("--synthetic", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--labels", type=int, default=10, help="label classes (records search "
                                                          "only their label's candidates)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "ray.md")
    args = ap.parse_args()

    import ray

    from dpsynth.compute import LocalCompute
    from dpsynth.compute.ray_engine import DataSpec, GivenEmbedder, RayCompute
    from dpsynth.data import load_dataset

    m, n, d = args.private, args.synthetic, args.dim
    load = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    data = work / "private.csv"
    write_private(data, m, args.labels)
    rng = np.random.default_rng(0)
    cand = rng.standard_normal((n, d)).astype(np.float32)
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    cand_labels = np.arange(n, dtype=np.int64) % args.labels
    values = {"label": [f"l{j}" for j in range(args.labels)]}
    embedder = HashEmbedder(d)

    # -- engine: local (this process) -----------------------------------------------------
    t0 = time.perf_counter()
    ds = load_dataset(data, "text", ["label"], None, label_values=values, on_duplicate="ignore")
    read_local = time.perf_counter() - t0
    t0 = time.perf_counter()
    emb = embedder.embed(ds.texts)
    embed_local = time.perf_counter() - t0
    codes, _ = ds.joint_label_codes()
    local = LocalCompute(lambda: emb, codes, None)
    _ = local.shard  # partition keys (hashing) outside the timed vote
    t0 = time.perf_counter()
    h_local = local.knn_histogram(cand, cand_labels, args.k)
    vote_local = time.perf_counter() - t0
    driver_rss_local = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fingerprint = ds.fingerprint()
    emb = local = ds = None  # free the driver's copy before the shards load theirs

    # -- engine: ray (shards read, embed and hold the rows) -----------------------------------
    spec = DataSpec(path=str(data), text="text", labels=("label",), user=None, max_chars=20000,
                    limit=None, label_values=values, domain=None, user_level=False,
                    fingerprint=fingerprint, n_records=m)
    t0 = time.perf_counter()
    eng = RayCompute(spec, GivenEmbedder(embedder), work / "compute", args.shards, "local")
    try:
        start_s = time.perf_counter() - t0
        pids = ray.get([a.pid.remote() for a in eng.actors])
        shard_rss = [rss_mb(p) for p in pids]
        t0 = time.perf_counter()
        h_ray = eng.knn_histogram(cand, cand_labels, args.k)
        vote_ray = time.perf_counter() - t0
        timing = dict(eng.last_timing)
        put_s = eng.last_put_s
        # a second vote: the steady state of later iterations (actors warm)
        t0 = time.perf_counter()
        eng.knn_histogram(cand, cand_labels, args.k)
        vote_ray2 = time.perf_counter() - t0
        # the driver's exact sum of the partials, timed alone
        from dpsynth.compute import kernels

        parts = eng._map("knn_partial", eng._shared(cand), cand_labels, args.k,
                         user_level=False)
        t0 = time.perf_counter()
        kernels.finish(kernels.sum_partials(parts), n, kernels.knn_weights(cand_labels, args.k))
        sum_s = time.perf_counter() - t0
    finally:
        eng.close()
    identical = h_local.tobytes() == h_ray.tobytes()
    rate = real_embed_rate()
    shard_kernel = max(timing["shard_kernel_s"])
    result = {
        "private": m, "synthetic": n, "dim": d, "shards": args.shards, "k": args.k,
        "labels": args.labels,
        "load_before": [round(x, 2) for x in load], "load_after": list(os.getloadavg()),
        "local": {"read_s": read_local, "embed_s": embed_local, "vote_s": vote_local,
                  "driver_peak_rss_mb": driver_rss_local},
        "ray": {"start_read_embed_s": start_s, "vote_s": vote_ray, "vote_warm_s": vote_ray2,
                "put_candidates_s": put_s, "shard_vote_s": timing["shard_kernel_s"],
                "ship_and_overhead_s": vote_ray - shard_kernel - sum_s - put_s,
                "driver_sum_s": sum_s, "shard_rss_mb": shard_rss},
        "overhead_ratio": vote_ray / vote_local, "overhead_ratio_warm": vote_ray2 / vote_local,
        "identical": identical,
        "bytes_out_per_shard": int(cand.nbytes + cand_labels.nbytes),
        "bytes_back_per_shard": int(n * 8),
        "real_embedder_sentences_per_s": rate,
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(result), encoding="utf-8")
    if not identical:
        raise SystemExit("the ray histogram differs from the local one")


def markdown(r: dict[str, Any]) -> str:
    lo, ra = r["local"], r["ray"]
    lines = [
        f"# Vote step: engine ray vs engine local (M = {r['private']:,}, N = {r['synthetic']:,},"
        f" d = {r['dim']}, {r['labels']} labels, k = {r['k']}, {r['shards']} shards, one "
        "machine)",
        "",
        f"Load (uptime): {r['uptime']}",
        "",
        "| | engine local | engine ray |",
        "|---|---|---|",
        f"| read private file | {lo['read_s']:.1f} s (driver) | in shard start-up |",
        f"| embed (hash stand-in) | {lo['embed_s']:.1f} s | {ra['start_read_embed_s']:.1f} s "
        "(start actors + read + embed + write shard files) |",
        f"| vote step (first) | {lo['vote_s']:.1f} s | {ra['vote_s']:.1f} s |",
        f"| vote step (warm) | | {ra['vote_warm_s']:.1f} s |",
        f"| of which: ship candidates (put) | | {ra['put_candidates_s'] * 1000:.0f} ms |",
        f"| of which: vote on shards | | {', '.join(f'{t:.1f}' for t in ra['shard_vote_s'])} s "
        "(per shard, in parallel) |",
        f"| of which: driver's exact sum | | {ra['driver_sum_s'] * 1000:.1f} ms |",
        f"| of which: scheduling, transfer, get | | {ra['ship_and_overhead_s']:.2f} s |",
        f"| overhead ratio ray / local | | **{r['overhead_ratio']:.2f}x** (warm "
        f"{r['overhead_ratio_warm']:.2f}x) |",
        f"| release histogram bitwise equal | | {r['identical']} |",
        f"| memory | driver peak {lo['driver_peak_rss_mb']:.0f} MB | per shard "
        f"{', '.join(f'{x:.0f}' for x in ra['shard_rss_mb'])} MB |",
        f"| bytes out per shard per vote | | {r['bytes_out_per_shard'] / 1e6:.1f} MB |",
        f"| bytes back per shard per vote | | {r['bytes_back_per_shard'] / 1e3:.0f} kB |",
        "",
    ]
    if r["real_embedder_sentences_per_s"]:
        rate = r["real_embedder_sentences_per_s"]
        lines.append(f"Real embedder (minilm) on this machine: {rate:.0f} sentences/s, so "
                     f"{r['private']:,} records take {r['private'] / rate / 3600:.1f} h on one "
                     "process; on the shards it divides by the shard count (each shard embeds "
                     "only its own rows).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
