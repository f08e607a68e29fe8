"""DP-SynRAG's private prediction on OpenVINO: float weights against int8 weights (NNCF's
weight compression, per-channel), side by side on one cluster of demo documents, the same
token sequence for every arm (issue 24, point 4: is int8 the next factor?).

    .venv/bin/pip install nncf        # not a dependency of dpsynth
    env PYTHONPATH=src .venv/bin/python benchmarks/ov_int8_weights.py [--docs 16] [--tokens 24]
        [--precision f32|bf16] [--public] [--groups 0,16,32,64,128] [--keep 'PATTERN;...']

Every arm runs :class:`dpsynth.llm.ov_stepper.OpenVinoStepper` (the default engine) compiled in
``--precision``; this script only puts another compiled graph, an int8 one, in the generator's
cache of compiled graphs. ``--groups`` adds int8 symmetric arms by the group size of
OpenVINO's dynamic quantisation of the activations (int8 arithmetic where the CPU has VNNI or
AMX; the plugin's default is 32; 0 turns it off), ``--keep`` arms with the layers whose names
match left in float. ``--public`` also times the one-row public stepper (the rephrase prompt
without document: the candidate set's public top tokens), where a coarser model costs no
privacy, only candidates: its row reports how many of the reference's top 64 tokens the arm
keeps. Prints, per arm, prefill and decode seconds (the fastest of 2 alternating rounds), the
speed against the float graph, and the mean and largest KL(p_float || p_arm) per token over the
full vocabulary.
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
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--public", action="store_true")
    ap.add_argument("--groups", default="", help="DYNAMIC_QUANTIZATION_GROUP_SIZE values: an "
                    "int8 sym arm each (0: activations not quantised)")
    ap.add_argument("--keep", default="", help="';'-separated node-name patterns left in float "
                    "(an arm each, with each --groups value)")
    args = ap.parse_args()
    import nncf
    import openvino as ov

    from dpsynth.bench.private_prediction import _kl as kl_rows
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator, ov_stepper
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    gen.set_logits_dtype("bfloat16" if args.precision == "bf16" else "float32")
    gen.set_stepper_engine("openvino")  # exports and compiles the float graph (untimed)
    slot = ov_stepper.runnable_precision(args.precision, int(gen.num_threads))
    graph = str(ov_stepper.ensure_exported(gen))
    slots = gen.__dict__["_ov_compiled"]  # ov_stepper.compiled's cache, one graph a precision
    core = ov.Core()
    options = {"INFERENCE_PRECISION_HINT": slot,
               "KV_CACHE_PRECISION": ov_stepper.KV_CACHE_PRECISION[slot],
               "INFERENCE_NUM_THREADS": int(gen.num_threads), "PERFORMANCE_HINT": "LATENCY"}
    arms = {slot: ov_stepper.compiled(gen, slot)}
    for name, mode in (("int8 asym", nncf.CompressWeightsMode.INT8_ASYM),
                       ("int8 sym", nncf.CompressWeightsMode.INT8_SYM)):
        arms[name] = core.compile_model(nncf.compress_weights(core.read_model(graph), mode=mode),
                                        "CPU", options)
    keep = [k for k in args.keep.split(";") if k]
    for group in (int(g) for g in args.groups.split(",") if g):
        dq = options | {"DYNAMIC_QUANTIZATION_GROUP_SIZE": group}
        for pattern in [None, *keep]:
            scope = nncf.IgnoredScope(patterns=[pattern], validate=False) if pattern else None
            model = nncf.compress_weights(core.read_model(graph),
                                          mode=nncf.CompressWeightsMode.INT8_SYM,
                                          ignored_scope=scope)
            arms[f"int8 sym, group {group}" + (f", {pattern} float" if pattern else "")] = \
                core.compile_model(model, "CPU", dq)
    texts = list(make_demo_corpus(max(args.docs, 60), seed=0)["text"])[:args.docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    seq: list[int] = []  # set by the first float pass, followed by every arm

    def run(name: str, rows: list[str], shared: str) -> tuple[list[np.ndarray], float, float]:
        slots[slot] = arms[name]  # the stepper compiles nothing: it takes this graph
        logits = []
        t0 = time.perf_counter()
        st = gen.open_stepper(rows, shared_prefix=shared)
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

    cases = {"private": ([t + suffix for t in texts], prefix)}
    if args.public:
        cases["public"] = ([prefix + suffix], "")
    for case, (rows, shared) in cases.items():
        seq.clear()
        best: dict[str, tuple[list[np.ndarray], float, float]] = {}
        names = list(arms)
        for r in range(2):
            for name in names if r == 0 else names[::-1]:
                got = run(name, rows, shared)
                if name not in best or got[1] + got[2] < best[name][1] + best[name][2]:
                    best[name] = got
        ref, base = best[slot][0], best[slot][1] + best[slot][2]
        print(f"{case}: {len(rows)} row(s), {args.tokens} tokens, {args.precision} inference")
        for name, (logits, prefill, decode) in best.items():
            kl = np.concatenate([kl_rows(a, b) for a, b in zip(ref, logits, strict=True)])
            kept = np.mean([np.isin(np.argsort(-b[0])[:64], np.argsort(-a[0])[:64]).mean()
                            for a, b in zip(ref, logits, strict=True)])
            print(f"  {name}: prefill {prefill:.2f} s, decode {decode:.2f} s, "
                  f"{base / (prefill + decode):.2f}x {slot}, KL mean {kl.mean():.5f} "
                  f"max {kl.max():.4f}" + (f", top-64 kept {kept:.3f}" if case == "public"
                                           else ""))

if __name__ == "__main__":
    main()
