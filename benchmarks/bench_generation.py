"""Generation and embedding throughput, measured side by side in one run.

Local generator: tokens/s of batched generation against one request at a time, over the same
model and prompts (sampling with fixed seeds; tokens counted up to and including EOS).
Embedder: sentences/s. Prints JSON on stdout and writes a markdown section to
benchmarks/results/generation.md. Ratios matter here; absolute numbers depend on the load of
the (shared) machine, which is recorded.

    .venv/bin/python benchmarks/bench_generation.py --prompts 16 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results" / "generation.md"
TOPICS = [
    "a bakery",
    "a train station",
    "a library",
    "a football match",
    "a hospital",
    "a mountain hike",
    "a job interview",
    "a rainy day",
]


def machine() -> dict[str, object]:
    """CPU model, cores, load: the context the numbers were taken in."""
    import torch

    from harness import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def bench_generation(model: str, n_prompts: int, n_tokens: int, batch_size: int) -> dict:
    from dpsynth.llm import GenerationRequest, SamplingParams
    from dpsynth.llm.local import LocalGenerator

    gen = LocalGenerator(model, batch_size=batch_size)
    reqs = [
        GenerationRequest(
            ({"role": "user", "content": f"Write a short review of {TOPICS[i % len(TOPICS)]}."},),
            SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=n_tokens, seed=i),
        )
        for i in range(n_prompts)
    ]
    gen.generate(reqs[:2], progress=False)  # warm-up

    def run(batched: bool) -> dict[str, float]:
        before = gen.generated_tokens
        t0 = time.perf_counter()
        if batched:
            gen.generate(reqs, progress=False)
        else:
            for r in reqs:
                gen.generate([r], progress=False)
        wall = time.perf_counter() - t0
        tokens = gen.generated_tokens - before
        return {"seconds": round(wall, 3), "tokens": tokens, "tokens_per_s": tokens / wall}

    batched = run(True)
    single = run(False)
    return {
        "model": gen.name,
        "prompts": n_prompts,
        "max_new_tokens": n_tokens,
        "batch_size": batch_size,
        "batched": batched,
        "one_at_a_time": single,
        "speedup": batched["tokens_per_s"] / single["tokens_per_s"],
    }


def bench_embedder(n: int) -> dict:
    from dpsynth.embed import Embedder

    emb = Embedder("minilm")
    texts = [
        f"Review {i}: the staff at {TOPICS[i % len(TOPICS)]} were friendly and quick."
        for i in range(n)
    ]
    emb.embed(texts[:8])  # warm-up
    t0 = time.perf_counter()
    emb.embed(texts)
    wall = time.perf_counter() - t0
    return {
        "model": emb.name,
        "sentences": n,
        "seconds": round(wall, 3),
        "sentences_per_s": n / wall,
    }


def markdown(res: dict) -> str:
    m, g, e = res["machine"], res["generation"], res["embedder"]
    return "\n".join(
        [
            "## Generation and embedding throughput",
            "",
            f"Machine: {m['cpu']}, {m['usable_cores']} usable cores of {m['cores']}, "
            f"torch threads {m['torch_threads']}, 1-min load {m['load_avg_1m']} at start "
            f"(shared machine: compare ratios, not absolute numbers).",
            "",
            f"`{g['model']}`, {g['prompts']} chat prompts x up to {g['max_new_tokens']} new "
            f"tokens, sampling with fixed seeds, batch size {g['batch_size']}:",
            "",
            "| mode | generated tokens | seconds | tokens/s |",
            "|---|---:|---:|---:|",
            f"| batched | {g['batched']['tokens']} | {g['batched']['seconds']:.1f} | "
            f"{g['batched']['tokens_per_s']:.1f} |",
            f"| one at a time | {g['one_at_a_time']['tokens']} | "
            f"{g['one_at_a_time']['seconds']:.1f} | {g['one_at_a_time']['tokens_per_s']:.1f} |",
            "",
            f"Batched / one-at-a-time throughput: **{g['speedup']:.2f}x**.",
            "",
            f"Embedder `{e['model']}` (all-MiniLM-L6-v2): {e['sentences']} sentences in "
            f"{e['seconds']:.1f} s = **{e['sentences_per_s']:.0f} sentences/s**.",
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--sentences", type=int, default=512)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    gen = bench_generation(args.model, args.prompts, args.tokens, args.batch_size)
    res = {
        "machine": {**machine(), "load_avg_1m": load_start},
        "generation": gen,
        "embedder": bench_embedder(args.sentences),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(res))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
