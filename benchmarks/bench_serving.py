"""Serving throughput of `dpsynth llm serve`: one request at a time vs micro-batching.

Both modes run side by side in one process on 127.0.0.1 over the same model and the same burst
(``--clients`` concurrent clients, ``--requests`` chat completions with fixed seeds). Prints
JSON on stdout and writes a markdown section to benchmarks/results/serving.md (copied into
BENCHMARKS.md). Ratios matter; absolute numbers depend on the shared machine's load.

    .venv/bin/python benchmarks/bench_serving.py --clients 32 --requests 64 --tokens 16
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from dpsynth.bench.machine import Where, describe

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results" / "serving.md"


def markdown(res: dict) -> str:
    one, mb = res["one_at_a_time"], res["micro_batched"]

    def row(name: str, r: dict) -> str:
        return (f"| {name} | {r['completions_per_s']:.2f} | {r['wall_s']:.1f} | "
                f"{r['latency_p50_s']:.1f} | {r['latency_max_s']:.1f} | {r['generate_calls']} | "
                f"{r['mean_batch']:.1f} | {r['status_counts']} |")

    return "\n".join([
        "## Serving: `dpsynth llm serve` one at a time vs micro-batching",
        "",
        f"Machine: {describe(res['machine'])}; torch threads {res['torch_threads']}. "
        "`benchmarks/bench_serving.py` (or "
        "`dpsynth bench serving --json`):",
        f"`{res['model']}`, {res['clients']} concurrent clients on 127.0.0.1, "
        f"{res['requests']} chat completions of up to {res['max_new_tokens']} tokens, sampled "
        "with fixed per-request seeds.",
        "",
        "| mode | completions/s | wall s | p50 latency s | max latency s | generate calls "
        "| mean batch | answers |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
        row("one at a time (max batch 1, the old server)", one),
        row(f"micro-batched (max batch {res['max_batch']})", mb),
        "",
        f"Micro-batched / one-at-a-time throughput: **{res['speedup']:.2f}x**. Texts identical "
        f"in both modes: {res['same_text_both_modes']} (each request samples from its own "
        "seeded stream; a differing text comes from float round-off of padded batches).",
        "",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--no-write", action="store_true", help="do not write results/serving.md")
    args = ap.parse_args()

    from dpsynth.bench.serving import bench_serving

    with Where() as where:
        res = bench_serving(args.model, args.clients, args.requests, args.tokens,
                            args.max_batch)
    res["machine"] = where.result()
    print(json.dumps(res))
    if not args.no_write:
        RESULTS.write_text(markdown(res))


if __name__ == "__main__":
    main()
