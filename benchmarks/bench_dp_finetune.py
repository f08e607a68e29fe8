"""DP-SGD cost on CPU (issue 45): the per-sample-gradient paths of dp_finetune side by side.

A thin wrapper of :func:`dpsynth.bench.dp_finetune.bench_dp_finetune` (the code behind
``dpsynth bench dp-finetune``; its docstring says what is measured): each path in its own
process, CPU and wall seconds per record of one DP-SGD step on a LoRA adapter of SmolLM2-135M
and the peak memory of each, with the machine and its load (``dpsynth.bench.machine.Where``).
Prints JSON and writes the markdown table to ``--out``.

    .venv/bin/python benchmarks/bench_dp_finetune.py [--samples 64] [--threads 2] [--mixed]
        [--modes loop,hooks,ghost,plain,loop-top8,hooks-top8]
        [--out benchmarks/results/dp_finetune.md]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent


def main() -> None:
    from dpsynth.bench.dp_finetune import bench_dp_finetune, lines, markdown
    from dpsynth.bench.machine import Where

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--mixed", action="store_true",
                    help="record lengths drawn from tokens/4 to tokens (seed 0)")
    ap.add_argument("--modes", default="loop,hooks,ghost,plain,loop-top8,hooks-top8")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "dp_finetune.md")
    args = ap.parse_args()
    with Where() as where:
        res = bench_dp_finetune(args.model, args.modes.split(","), args.samples, args.threads,
                                args.tokens, args.micro_batch, mixed=args.mixed)
    res["machine"] = where.result()
    print(json.dumps(res))
    print("\n".join(lines(res)), file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(res, "benchmarks/bench_dp_finetune.py "
                                      + " ".join(sys.argv[1:])), encoding="utf-8")
    print(args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
