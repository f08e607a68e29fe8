"""Where SmolLM2's sampling memory goes: the resident set of the default OpenVINO engine over
Yelp-length texts against the same job with glibc's heap kept from holding freed memory.

The side by side at 2000 records saw the bench process peak at 11.0 GB on an Aug-PE Yelp run
(texts up to 256 words) and 7.6 GB on WASP. Each mode runs in a fresh process (the resident
set is per process) on the same seeded requests, and must write the same texts:

* ``default``: the engine as shipped (one ``[B, V]`` logits buffer a batch,
  ``ov_generate.LogitBuffers``);
* ``old``: the engine before 2026-12-06 (a fresh ``[B, V]`` product, float copy and
  temperature copy each decode step);
* ``mmap<N>``: glibc's ``M_MMAP_THRESHOLD`` fixed at N bytes before loading (allocations of N
  bytes and more are mapped apart and returned when freed; the default threshold grows to
  32 MB after the first large free, so the per-step logits buffers land in the heap);
* ``trim<K>``: ``malloc_trim(0)`` every K decode steps (freed heap pages handed back).

Usage: .venv/bin/python benchmarks/gen_memory.py [--texts 128] [--max-new 256]
       [--modes old,default,mmap65536] [--out FILE]
(one mode inside a process: ``--one MODE``, which the parent calls).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "generation_memory.md"
TOPICS = ["a restaurant", "a hotel", "a hair salon", "a grocery store", "a museum", "a bar",
          "a dentist", "a garden centre", "a wedding planner", "a shoe shop"]


def one(mode: str, texts: int, max_new: int) -> dict:
    """One mode in this process: peak resident set above the loaded model, tokens/s."""
    import psutil

    libc = ctypes.CDLL("libc.so.6")
    if mode.startswith("mmap"):
        libc.mallopt(-3, int(mode[4:]))  # M_MMAP_THRESHOLD (fixed: no dynamic growth)
    from dpsynth.llm import ov_generate
    from dpsynth.llm.base import GenerationRequest, SamplingParams
    from dpsynth.llm.local import LocalGenerator

    if mode == "old":
        import torch.nn.functional as F

        from dpsynth.llm import sampling

        ov_generate.LogitBuffers.product = lambda self, h, w, b: F.linear(h, w, b).float()
        sampling.scaled = lambda logits, t, scratch=False: logits.float() / t
    if mode.startswith("trim"):
        every, step, calls = int(mode[4:]), ov_generate.OpenVinoEngine.step, [0]

        def trimmed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] % every == 0:
                libc.malloc_trim(0)
            return step(self, *args, **kwargs)

        ov_generate.OpenVinoEngine.step = trimmed
    proc = psutil.Process()
    gen = LocalGenerator("smollm2")
    reqs = [GenerationRequest(
        [{"role": "user", "content": f"Write a Yelp review of {TOPICS[i % len(TOPICS)]} "
                                     f"({i % 5 + 1} stars)."}],
        SamplingParams(temperature=1.0, top_k=50, max_new_tokens=max_new, seed=i))
        for i in range(texts)]
    gen.generate(reqs[:4], progress=False)  # compiled and warm
    base = proc.memory_info().rss
    peak, stop = [base], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    t0, tokens0 = time.time(), gen.generated_tokens
    out = gen.generate(reqs, progress=False)
    wall = time.time() - t0
    stop.set()
    watcher.join()
    return {"mode": mode, "engine": gen.engine, "texts": texts, "max_new": max_new,
            "wall_s": round(wall, 1), "tokens_s": round((gen.generated_tokens - tokens0) / wall, 1),
            "loaded_mb": base >> 20, "extra_peak_mb": (peak[0] - base) >> 20,
            "texts_sha": hashlib.sha256("\x00".join(out).encode()).hexdigest()[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--texts", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--modes", default="old,default,mmap65536")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--one")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.texts, args.max_new)))
        return
    rows, loads = [], [os.getloadavg()]
    for _ in range(args.rounds):
        for mode in args.modes.split(","):
            res = subprocess.run([sys.executable, __file__, "--one", mode, "--texts",
                                  str(args.texts), "--max-new", str(args.max_new)],
                                 capture_output=True, text=True, check=True)
            rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg())
            print(json.dumps(rows[-1]), flush=True)
    base = next(r for r in rows if r["mode"] == "default")
    seen = ", ".join("/".join(f"{x:.2f}" for x in ld) for ld in loads)
    lines = ["# Sampling memory: SmolLM2 on the default engine", "",
             f"{args.texts} seeded chat requests (Yelp reviews), up to {args.max_new} new tokens, "
             f"top_k 50, the default batch; each mode a fresh process; `benchmarks/gen_memory.py"
             f" --texts {args.texts} --max-new {args.max_new}`. Load average (1 / 5 / 15 min) "
             f"before and after each mode: {seen}."
             " Every mode must write the same texts (the hash column).", "",
             "| mode | engine | peak above the loaded model (MB) | tokens/s | vs default | texts |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['engine']} | {r['extra_peak_mb']} | {r['tokens_s']} | "
              f"{r['tokens_s'] / base['tokens_s']:.2f}x | {r['texts_sha']} |" for r in rows]
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(args.out)


if __name__ == "__main__":
    main()
