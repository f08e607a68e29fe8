"""DP-SynRAG's private prediction on OpenVINO by KV cache precision, side by side on one
cluster of demo documents through the production path (issue 24, point 4: a decode step of
many rows at the public width is bound by reading the cache).

    env PYTHONPATH=src DPSYNTH_TORCH_THREADS=2 .venv/bin/python benchmarks/ov_kv_precision.py
        [--docs 80] [--precision f32|bf16] [--kv f32,f16,u8] [--rounds 3]

Every arm runs :func:`dpsynth.methods.synrag.private_prediction.open_documents` (each document
prefilled alone, decoded ``--docs`` rows a pass at the public width of ``--max-doc-tokens``)
with the decoder compiled in ``--precision`` and its cache in the arm's precision; this script
only puts each arm's compiled graph in the generator's cache of compiled graphs. The same
token sequence for every arm. Prints, per arm, the prefill seconds and the milliseconds of one
decode step (the fastest of ``--rounds`` alternating rounds), the step's speed against the
first arm, and the mean and largest KL(p_first || p_arm) per token over the full vocabulary.
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
    ap.add_argument("--docs", type=int, default=80)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--max-doc-tokens", type=int, default=384)
    ap.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--kv", default="f32,f16,u8", help="cache precisions, the first the reference")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import openvino as ov

    from dpsynth.bench.private_prediction import _kl as kl_rows
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator, ov_stepper
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import open_documents, prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    gen.set_logits_dtype("bfloat16" if args.precision == "bf16" else "float32")
    gen.set_stepper_engine("openvino")  # exports and compiles the default graph (untimed)
    slot = ov_stepper.runnable_precision(args.precision, int(gen.num_threads))
    slots = gen.__dict__["_ov_compiled"]  # ov_stepper.compiled's cache, one graph a precision
    core = ov.Core()
    graph = str(ov_stepper.ensure_exported(gen))
    arms = {}
    for kv in args.kv.split(","):
        arms[kv] = core.compile_model(core.read_model(graph), "CPU", {
            "INFERENCE_PRECISION_HINT": slot, "KV_CACHE_PRECISION": kv,
            "INFERENCE_NUM_THREADS": int(gen.num_threads), "PERFORMANCE_HINT": "LATENCY"})
    texts = list(make_demo_corpus(max(args.docs, 60), seed=0)["text"])[:args.docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    seq: list[int] = []  # set by the first arm's first pass, followed by every arm

    def run(kv: str) -> tuple[np.ndarray, float, float]:
        slots[slot] = arms[kv]  # open_documents compiles nothing: it takes this graph
        t0 = time.perf_counter()
        st, _ = open_documents(gen, texts, prefix, suffix, args.max_doc_tokens, rows=args.docs)
        prefill = time.perf_counter() - t0
        logits, step = [], 0.0
        with st:
            for n in range(args.tokens):
                z = st.logits()
                logits.append(z)
                if len(seq) <= n:
                    seq.append(int(np.argmax(z.sum(0))))
                t = time.perf_counter()
                st.advance(seq[n])
                step += time.perf_counter() - t
        return np.concatenate(logits), prefill, 1000 * step / args.tokens

    names = list(arms)
    best: dict[str, tuple[float, float]] = {}
    out: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for kv in names if r % 2 == 0 else names[::-1]:
            logits, prefill, step = run(kv)
            out[kv] = logits
            old = best.get(kv, (prefill, step))
            best[kv] = (min(old[0], prefill), min(old[1], step))
    ref = names[0]
    print(f"OpenVINO {slot}, {args.docs} documents a pass, width {args.max_doc_tokens}, "
          f"{args.tokens} steps, best of {args.rounds} rounds")
    for kv in names:
        kl = kl_rows(out[ref], out[kv])
        print(f"  KV {kv}: prefill {best[kv][0]:.2f} s, step {best[kv][1]:.1f} ms "
              f"({best[ref][1] / best[kv][1]:.2f}x {ref}), KL mean {kl.mean():.2g} "
              f"max {kl.max():.2g}")


if __name__ == "__main__":
    main()
