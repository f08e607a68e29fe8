"""How far one document's clipped logits move when other documents share its cluster (issue 24's
private prediction; docs/methods.md §4, "Rows apart").

    env PYTHONPATH=src DPSYNTH_TORCH_THREADS=2 .venv/bin/python benchmarks/row_shift.py

For each engine and precision, one demo document's next-token logits over 4 steps, computed
alone and beside others (one row more; a longer row, which pads a batched stepper's rows; 15
more rows), on the batched stepper (``gen.open_stepper``, the private prediction's path until
2026-12-03) and on the production path (``open_documents``: each row prefilled alone, decoded
at fixed shapes). Prints the largest change of clip_c (c = 0.3) per coordinate: the amount by
which each other row of a cluster moves when one document comes in, which the sensitivity c
of the clipped sum must cover (it covers 0 only).
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

CLIP = 0.3


def main() -> None:
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator
    from dpsynth.methods.synrag.clipping import clip_logits
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import open_documents, prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    texts = list(make_demo_corpus(60, seed=0)["text"])
    target, longer = texts[0], texts[0] + " It started after a long trip abroad." * 2
    steps = [int(t) for t in gen.encode(" The patient has")][:3]
    companions = {"one row more": [texts[1]], "a longer row": [longer],
                  "15 rows more": texts[1:16]}

    def first_row(docs: list[str], production: bool) -> np.ndarray:
        st = (open_documents(gen, docs, prefix, suffix, 160)[0] if production else
              gen.open_stepper([d + suffix for d in docs], shared_prefix=prefix))
        with st:
            seen = [st.logits()[0]]
            for tok in steps:
                st.advance(tok)
                seen.append(st.logits()[0])
        return np.asarray(clip_logits(np.stack(seen).astype(np.float64), CLIP))

    print("| engine | path | " + " | ".join(companions) + " |")
    print("|---|---|" + "---|" * len(companions))
    for engine, dtype in (("openvino", "bfloat16"), ("openvino", "float32"),
                          ("transformers", "bfloat16"), ("transformers", "float32")):
        gen.set_logits_dtype(dtype)
        gen.set_stepper_engine(engine)
        for production in (False, True):
            alone = first_row([target], production)
            shifts = [np.abs(first_row([target, *more], production) - alone).max()
                      for more in companions.values()]
            path = "rows apart (production)" if production else "batched"
            print(f"| {engine} {dtype} | {path} | " + " | ".join(f"{s:.1e}" for s in shifts)
                  + " |", flush=True)


if __name__ == "__main__":
    main()
