"""The embedder's fixed-shape passes (each text padded to a width of its own, ``batch_size``
rows a pass, fillers where fewer are left: a vector is its text's alone) against the batching
they replaced (texts sorted longest first, each batch padded to its longest: a vector moved
with its batch by up to 2e-7), side by side on the same texts, every engine.

    env PYTHONPATH=src .venv/bin/python benchmarks/embed_fixed_shape.py \\
        [--csv ../shared/data/banking77/train.csv] [--limit 2000] [--rounds 3]
        [--batch-size 16] [--old-batch-size 64]

The previous arm is the same engine's model call on the old batches (this script only forms
them), at the old default of 64 texts a batch; the new arm at the new default of 16 rows a pass
(fewer filler rows where many widths each end in a part-filled pass). Prints, per engine, texts
a second of each arm (the fastest of ``--rounds`` alternating rounds), their ratio, and the
largest difference between the arms' vectors.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]


def batched(engine, texts: list[str], size: int) -> np.ndarray:
    """The batching before the fixed-shape passes: longest first, ``size`` texts a batch, padded
    to each batch's longest."""
    if engine.tag == "torch":
        return np.asarray(engine._model.encode(texts, batch_size=size,
                                               convert_to_numpy=True, normalize_embeddings=True,
                                               show_progress_bar=False), dtype=np.float32)
    out = np.empty((len(texts), engine.dim), dtype=np.float32)
    order = np.argsort([-len(t) for t in texts], kind="stable")
    for s in range(0, len(texts), size):
        idx = order[s : s + size]
        enc = engine._tok([texts[i] for i in idx], padding=True, truncation=True,
                          max_length=engine.max_len, return_tensors="np")
        out[idx] = engine._pass(enc["input_ids"].astype(np.int64),
                               enc["attention_mask"].astype(np.int64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", default=str(ROOT.parent / "shared/data/banking77/train.csv"))
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=16, help="rows a fixed-shape pass")
    ap.add_argument("--old-batch-size", type=int, default=64, help="texts a batch before")
    ap.add_argument("--engines", default="openvino,onnx,torch")
    args = ap.parse_args()
    from dpsynth.embed import Embedder

    with open(args.csv, newline="", encoding="utf-8") as f:
        texts = [row["text"] for row, _ in zip(csv.DictReader(f), range(args.limit),
                                               strict=False)]
    print(f"{len(texts)} texts of {args.csv}: batches of {args.old_batch_size} against passes "
          f"of {args.batch_size} rows, best of {args.rounds} rounds")
    for name in args.engines.split(","):
        engine = Embedder("minilm", engine=name, batch_size=args.batch_size)._engine
        arms = {"batched": lambda e=engine: batched(e, texts, args.old_batch_size),
                "fixed shape": lambda e=engine: e.encode(texts)}
        best: dict[str, float] = {}
        vecs: dict[str, np.ndarray] = {}
        for r in range(args.rounds):
            for arm in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                t = time.perf_counter()
                vecs[arm] = arms[arm]()
                best[arm] = min(best.get(arm, 1e9), time.perf_counter() - t)
        rate = {a: len(texts) / s for a, s in best.items()}
        diff = float(np.abs(vecs["batched"] - vecs["fixed shape"]).max())
        print(f"  {engine.tag}: batched {rate['batched']:.0f} texts/s, fixed shape "
              f"{rate['fixed shape']:.0f} texts/s ({rate['fixed shape'] / rate['batched']:.2f}x),"
              f" largest difference {diff:.1e}")


if __name__ == "__main__":
    main()
