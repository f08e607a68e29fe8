"""DP-SGD cost on CPU (issue 45): seconds per training sample of one DP-SGD step on a LoRA
adapter of SmolLM2-135M, 64-token records, with each exact per-sample-gradient path of
``dpsynth.methods.dpfinetune.train`` side by side in one run, and the peak memory of each.

    .venv/bin/python benchmarks/bench_dp_finetune.py [--samples 64] [--threads 2]
        [--modes loop,hooks,ghost,plain] [--out benchmarks/results/dp_finetune.md]

Paths (all clip each record's gradient to C and add the same noise; the adapter: r = 8 on
q_proj and v_proj, the dp_finetune defaults):

- ``loop``: one record per forward and backward pass (the default: no pass mixes records);
- ``hooks``: Opacus's GradSampleModule on micro-batches of 8 (per-sample gradients from hooks);
- ``ghost``: Opacus's fast gradient clipping on micro-batches of 8 (per-sample norms, then a
  second backward pass of the clipped loss);
- ``plain``: reference only, NOT private: one non-DP backward pass per micro-batch of 8;
- ``PATH-top8``: the same path with adapters on the last 8 of the 30 layers only
  (``dp_finetune.lora_layers: 8``): the backward pass stops below them.

Each path runs in its own process (peak RSS = that process's maximum resident set, model
included); after a 2-record warm-up one step over ``--samples`` records (q = 1) is timed:
wall seconds per record, and CPU seconds per record (user + system of the process).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
TOKENS = 64


def one(mode: str, samples: int, threads: int) -> dict[str, float]:
    """Time one DP-SGD step of ``samples`` records with per-sample path ``mode``."""
    import numpy as np
    import torch

    from dpsynth.llm.local import LocalGenerator
    from dpsynth.methods.dpfinetune.train import (
        DPSGD,
        Example,
        StepSettings,
        attach_lora,
        collate,
        per_sample_loss,
    )
    from dpsynth.privacy import SeededNoise

    torch.set_num_threads(threads)
    gen = LocalGenerator("smollm2", engine="transformers", num_threads=threads)
    base, _, top = mode.partition("-top")
    model = attach_lora(gen.model, 8, 16.0, ["q_proj", "v_proj"], int(top) if top else None)
    rng = np.random.default_rng(0)
    examples = [Example(tuple(int(x) for x in rng.integers(100, 40000, size=TOKENS)), 8)
                for _ in range(samples)]
    noise = SeededNoise(1)
    settings = StepSettings(noise_multiplier=1.0, q=1.0, steps=1, expected_batch=samples,
                            clip=1.0, learning_rate=1e-3,
                            clipping="loop" if base == "plain" else base, micro_batch=8,
                            secure=False)
    trainer = DPSGD(model, examples, settings, Path(os.environ.get("TMPDIR", "/tmp"))
                    / f"bench-dpft-{os.getpid()}", noise.spawn, gen.pad_token_id)
    model.train()
    if base == "plain":
        def step() -> None:
            for lo in range(0, samples, 8):
                ids, attn, target = collate(examples[lo:lo + 8], gen.pad_token_id)
                per_sample_loss(model, ids, attn, target).sum().backward()
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
        ids, attn, target = collate(examples[:2], gen.pad_token_id)
        per_sample_loss(model, ids, attn, target).sum().backward()
        trainer.optimizer.zero_grad(set_to_none=True)
    else:
        trainer.clipped_sum(np.arange(2))  # warm-up

        def step() -> None:
            sums, _ = trainer.clipped_sum(np.arange(samples))
            for (_, p), g in zip(trainer.params, trainer.noisy_gradient(0, sums), strict=True):
                p.grad = g
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)
    cpu0 = os.times()
    t0 = time.perf_counter()
    step()
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return {"wall_per_sample": wall / samples, "cpu_per_sample": cpu / samples,
            "peak_rss_mib": peak, "samples": samples, "load_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", default="loop,hooks,ghost,plain,loop-top8,hooks-top8")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "dp_finetune.md")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.samples, args.threads)))
        return
    rows = {}
    for mode in args.modes.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", mode, "--samples",
                              str(args.samples), "--threads", str(args.threads)],
                             check=True, capture_output=True, text=True)
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(mode, rows[mode], flush=True)
    base = rows.get("hooks")
    lines = [
        "# DP-SGD on a LoRA adapter of SmolLM2-135M: per-sample gradient paths",
        "",
        f"`benchmarks/bench_dp_finetune.py --samples {args.samples} --threads {args.threads}`"
        f" on {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"{time.strftime('%Y-%m-%d')}: one DP-SGD step over {args.samples} records of "
        f"{TOKENS} tokens, LoRA r = 8 on q_proj / v_proj, clip 1, AdamW. Each path in its own "
        "process; peak RSS includes the float32 model (~0.5 GiB).",
        "",
        "| path | wall s / sample | CPU s / sample | peak RSS (MiB) | vs hooks | load (1 min) |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in rows.items():
        ratio = f"{base['wall_per_sample'] / r['wall_per_sample']:.2f}x" if base else "-"
        load = r.get("load_1min")
        lines.append(f"| {mode} | {r['wall_per_sample']:.3f} | {r['cpu_per_sample']:.3f} | "
                     f"{r['peak_rss_mib']:.0f} | {ratio} | "
                     f"{'-' if load is None else f'{load:.1f}'} |")
    lines += [
        "",
        "`plain` is a NOT private reference (one ordinary backward pass per micro-batch of 8, "
        "no clipping, no noise). `vs hooks` is Opacus's default hooks' wall time over the "
        "path's (above 1: faster than hooks); `load`: the machine's 1-minute load average when "
        "the path ended (above the core count, other processes shared the cores and the "
        "times are inflated: compare CPU seconds). `-top8`: adapters on the last 8 of 30 layers "
        "(`dp_finetune.lora_layers: 8`), another model than the rows above, not the same "
        "computation faster.",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
