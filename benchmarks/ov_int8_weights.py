"""DP-SynRAG's private prediction on OpenVINO: f32 weights against int8 weights (NNCF's
weight compression, per-channel), side by side on one cluster of demo documents, the same
token sequence for both (issue 24, point 4: is int8 the next factor where bf16 is missing?).

    .venv/bin/pip install nncf        # not a dependency of dpsynth
    env PYTHONPATH=src .venv/bin/python benchmarks/ov_int8_weights.py [--docs 16] [--tokens 24]

Both arms run :class:`dpsynth.llm.ov_stepper.OpenVinoStepper` (the default engine); this script
only puts a second compiled graph, the int8 one, in the generator's cache of compiled graphs.
Prints, per arm, prefill and decode seconds (the fastest of 2 alternating rounds), the speed
against f32, and the mean and largest KL(p_f32 || p_arm) per token over the full vocabulary.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    import nncf
    import openvino as ov

    from dpsynth.bench.private_prediction import _kl as kl_rows
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator, ov_stepper
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    gen.set_stepper_engine("openvino")  # exports and compiles f32 (untimed)
    graph = str(ov_stepper.ensure_exported(gen))
    slots = gen.__dict__["_ov_compiled"]  # ov_stepper.compiled's cache, one graph a precision
    core = ov.Core()
    options = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32",
               "INFERENCE_NUM_THREADS": int(gen.num_threads), "PERFORMANCE_HINT": "LATENCY"}
    arms = {"f32": ov_stepper.compiled(gen, "f32")}
    for name, mode in (("int8 asym", nncf.CompressWeightsMode.INT8_ASYM),
                       ("int8 sym", nncf.CompressWeightsMode.INT8_SYM)):
        arms[name] = core.compile_model(nncf.compress_weights(core.read_model(graph), mode=mode),
                                        "CPU", options)
    texts = list(make_demo_corpus(max(args.docs, 60), seed=0)["text"])[:args.docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    rows = [t + suffix for t in texts]
    seq: list[int] = []  # set by the first f32 pass, followed by every arm

    def run(name: str) -> tuple[list[np.ndarray], float, float]:
        slots["f32"] = arms[name]  # the stepper compiles nothing: it takes this graph
        logits = []
        t0 = time.perf_counter()
        st = gen.open_stepper(rows, shared_prefix=prefix)
        t1 = time.perf_counter()
        for n in range(args.tokens):
            z = st.logits()
            logits.append(z)
            if len(seq) <= n:
                seq.append(int(np.argmax(z.sum(0))))
            if n + 1 < args.tokens:
                st.advance(seq[n])
        t2 = time.perf_counter()
        st.close()
        return logits, t1 - t0, t2 - t1

    best: dict[str, tuple[list[np.ndarray], float, float]] = {}
    names = list(arms)
    for r in range(2):
        for name in names if r == 0 else names[::-1]:
            got = run(name)
            if name not in best or got[1] + got[2] < best[name][1] + best[name][2]:
                best[name] = got
    ref, base = best["f32"][0], best["f32"][1] + best["f32"][2]
    print(f"{args.docs} documents, {args.tokens} tokens")
    for name, (logits, prefill, decode) in best.items():
        kl = np.concatenate([kl_rows(a, b) for a, b in zip(ref, logits, strict=True)])
        print(f"{name}: prefill {prefill:.2f} s, decode {decode:.2f} s, "
              f"{base / (prefill + decode):.2f}x f32, KL mean {kl.mean():.5f} max {kl.max():.4f}")


if __name__ == "__main__":
    main()
