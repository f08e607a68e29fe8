"""One decode step of DP-SynRAG's steppers on OpenVINO by batch size (issue 24, point 4: where
a cluster's time goes, and what batching clusters together could buy).

    env PYTHONPATH=src .venv/bin/python benchmarks/ov_step_batch.py [--precision bf16|f32]

Private rows: the first B demo documents behind the rephrase prompt's shared prefix (one
cluster of B documents). Public rows: B copies of the rephrase prompt without document (the
candidate set's one-row stepper, B clusters' worth). Prints the mean milliseconds of one
``advance`` (12 steps after a first one, 2 alternating rounds, the faster kept) per B; nothing
here is a dpsynth default, it only measures the engine.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--precision", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--private", default="1,16,32,80", help="private batch sizes")
    ap.add_argument("--public", default="1,5", help="public batch sizes")
    args = ap.parse_args()
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    gen.set_logits_dtype("bfloat16" if args.precision == "bf16" else "float32")
    gen.set_stepper_engine("openvino")
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    sizes = [int(b) for b in args.private.split(",")]
    docs = [d + suffix for d in make_demo_corpus(max(60, *sizes), seed=0)["text"]]

    def step_ms(rows: list[str], shared: str, steps: int = 12) -> float:
        with gen.open_stepper(rows, shared_prefix=shared) as st:
            st.advance(100)
            t0 = time.perf_counter()
            for k in range(steps):
                st.advance(101 + k)
            return 1000 * (time.perf_counter() - t0) / steps

    cases = [("private", b, docs[:b], prefix) for b in sizes] + [
        ("public", int(b), [prefix + suffix] * int(b), "") for b in args.public.split(",")]
    best: dict[tuple[str, int], float] = {}
    for r in range(2):
        for kind, b, rows, shared in cases if r == 0 else cases[::-1]:
            ms = step_ms(rows, shared)
            best[(kind, b)] = min(ms, best.get((kind, b), ms))
    print(f"OpenVINO {args.precision}, ms per step (one advance of every row)")
    for (kind, b), ms in best.items():
        print(f"  {kind} B={b}: {ms:.1f} ms ({ms / b:.1f} ms a row)")


if __name__ == "__main__":
    main()
