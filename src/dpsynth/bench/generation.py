"""Local generation throughput: the default engine against today's default path, side by side.

Baseline: :class:`~dpsynth.llm.local.LocalGenerator` on transformers float32 at batch 16 (the
demo's setting before the engine choice). Candidate: ``LocalGenerator`` with every default
(engine ``auto``, batch and threads picked for the machine). Where the default is not
ctranslate2 and ctranslate2 is installed, the ctranslate2 int8 engine (the next best) runs in
the same rounds too (``ctranslate2_tokens_per_second``, ``speedup_vs_ctranslate2``). All get
the same chat prompts with the same per-request seeds; rounds alternate the order so that a
change in the shared machine's load hits every path. Tokens are counted up to and including
EOS. Quality: the candidate's next-token distribution against float32 on the same prompts
(:func:`dpsynth.llm.engine_check.compare_with_float`), plus sample outputs and refusal / empty
counts.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

from ..llm import GenerationRequest, SamplingParams, ct2
from ..llm.engine_check import compare_with_float

SUBJECTS = (
    "a repeat prescription",
    "knee pain after physiotherapy",
    "moving an appointment",
    "test results",
    "a rash that will not go away",
    "a sick note for work",
    "a child's vaccination",
    "headaches at night",
)
REFUSAL = re.compile(r"\b(I'm sorry|I am sorry|I can(?:'|no)t|as an AI|I apologi[sz]e)", re.I)


def prompts(n: int, max_new_tokens: int) -> list[GenerationRequest]:
    """``n`` chat requests like the demo's (patient messages), seeds 0..n-1."""
    return [
        GenerationRequest(
            (
                {
                    "role": "user",
                    "content": "Write a short message that a patient sends to their clinic "
                    f"about {SUBJECTS[i % len(SUBJECTS)]}.",
                },
            ),
            SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=max_new_tokens, seed=i),
        )
        for i in range(n)
    ]


def _timed(gen: Any, reqs: list[GenerationRequest]) -> tuple[float, float, int, list[str]]:
    """Wall seconds, CPU seconds of this process, generated tokens, texts."""
    before = gen.generated_tokens
    t0, c0 = time.perf_counter(), time.process_time()
    out = gen.generate(reqs, progress=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, gen.generated_tokens - before, out


def bench_generation(
    model: str = "smollm2",
    n_prompts: int = 64,
    max_new_tokens: int = 64,
    rounds: int = 1,
    baseline_batch: int = 16,
    samples: int = 3,
) -> dict[str, Any]:
    """Throughput of both paths on the same requests; see the module docstring."""
    from ..llm.local import LocalGenerator
    from ..llm.runtime import default_threads, stepper_threads

    if n_prompts < 1 or max_new_tokens < 1 or rounds < 1:
        raise ValueError("prompts, tokens and rounds must be >= 1")
    load_start = os.getloadavg()[0]
    base = LocalGenerator(model, engine="transformers", batch_size=baseline_batch)
    cand = LocalGenerator(model)
    arms = [("base", base), ("cand", cand)]
    if cand.engine != "ctranslate2" and ct2.available():
        # on the threads the openvino candidate runs on: left to the idle cores it would take
        # one when the bench's own load lifts the load average (a ratio across thread counts
        # says little)
        arms.append(("ct2", LocalGenerator(model, engine="ctranslate2",
                                           num_threads=stepper_threads(cand))))
    reqs = prompts(n_prompts, max_new_tokens)
    warm = [GenerationRequest(r.prompt, SamplingParams(max_new_tokens=2, seed=0)) for r in reqs[:2]]
    for _, g in arms:
        g.generate(warm, progress=False)
    tot = {key: [0.0, 0, 0.0] for key, _ in arms}
    outs: dict[str, list[str]] = {}
    for r in range(rounds):
        order = tuple(arms)
        for key, g in order if r % 2 == 0 else order[::-1]:
            wall, cpu, toks, out = _timed(g, reqs)
            tot[key][0] += wall
            tot[key][1] += toks
            tot[key][2] += cpu
            outs[key] = out
    base_tps = tot["base"][1] / tot["base"][0]
    cand_tps = tot["cand"][1] / tot["cand"][0]
    base_cpu = tot["base"][1] / tot["base"][2]
    cand_cpu = tot["cand"][1] / tot["cand"][2]
    res: dict[str, Any] = {
        "model": cand.name,
        "engine": cand.engine,
        "batch_size": cand.batch_size,
        "threads": (stepper_threads(cand) if cand.engine == "openvino" else
                    getattr(cand.sampling_engine, "last_threads", 0) or cand.num_threads),
        "tokens_per_second": round(cand_tps, 2),
        "baseline": f"transformers float32, batch {baseline_batch}",
        "baseline_threads": base.num_threads,
        "baseline_tokens_per_second": round(base_tps, 2),
        "speedup": round(cand_tps / base_tps, 3),
        # Per CPU-second of this process: the ratio the machine's load does not distort.
        "tokens_per_cpu_second": round(cand_cpu, 2),
        "baseline_tokens_per_cpu_second": round(base_cpu, 2),
        "speedup_cpu": round(cand_cpu / base_cpu, 3),
        "prompts": n_prompts,
        "max_new_tokens": max_new_tokens,
        "rounds": rounds,
        "tokens": {"baseline": tot["base"][1], "engine": tot["cand"][1]},
        "seconds": {"baseline": round(tot["base"][0], 2), "engine": round(tot["cand"][0], 2)},
        "cpu_seconds": {"baseline": round(tot["base"][2], 2), "engine": round(tot["cand"][2], 2)},
        "cores": len(os.sched_getaffinity(0)),
        "default_threads_now": default_threads(),
        "load_avg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
    }
    for key, name in (("base", "baseline"), ("cand", "engine")):
        out = outs[key]
        res[f"{name}_empty"] = sum(1 for t in out if not t.strip())
        res[f"{name}_refusals"] = sum(1 for t in out if REFUSAL.search(t))
        res[f"{name}_samples"] = out[:samples]
    if "ct2" in tot:
        ct2_tps, ct2_cpu = tot["ct2"][1] / tot["ct2"][0], tot["ct2"][1] / tot["ct2"][2]
        res["ctranslate2_tokens_per_second"] = round(ct2_tps, 2)
        res["ctranslate2_tokens_per_cpu_second"] = round(ct2_cpu, 2)
        res["speedup_vs_ctranslate2"] = round(cand_tps / ct2_tps, 3)
        res["speedup_vs_ctranslate2_cpu"] = round(cand_cpu / ct2_cpu, 3)
    if cand.sampling_engine is not None:
        pairs = [(cand.render(r)[0], out) for r, out in zip(reqs[:8], outs["base"], strict=False)]
        res["quality"] = compare_with_float(cand, pairs)
    return res
