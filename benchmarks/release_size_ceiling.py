"""The ceiling a release's size sets (issue 44): the side-by-side jobs' classifier trained on
N real private records instead of N synthetic texts, for N = 200, 500, 1000 and all 2000.

    env PYTHONPATH=src .venv/bin/python benchmarks/release_size_ceiling.py \
        [--out benchmarks/results/release_size_ceiling.json]

The jobs are `bench_side_by_side.py`'s (Banking77, all 77 intents, and Yelp, category and
stars: 2000 private records drawn with seed 0, scored on the held-out test split by logistic
regression on MiniLM embeddings). Each size is 10 seeded draws of the private records (mean
and standard deviation). With a side-by-side run's zero-shot score at the same N, the share of
the zero-shot -> real gap that N real records close is the most a release of N texts can be
expected to close; `dpsynth eval` gives the operator the same figure for a run
(``private_at_size``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_side_by_side as sbs  # noqa: E402
from dpsynth.embed import Embedder  # noqa: E402
from dpsynth.eval.utility import logreg_scores  # noqa: E402

SIZES = (200, 500, 1000)
DRAWS = 10


def ceilings(dataset: str, embedder: Embedder) -> dict[str, dict[str, object]]:
    """Per label column: accuracy on the test split at each size (mean, sd) and at 2000."""
    sbs.DATASET, sbs.RECORDS, sbs.INTENTS = dataset, 2000, 0
    _, private, test, _ = sbs.job()
    px = embedder.embed(private["text"].astype(str).tolist())
    tx = embedder.embed(test["text"].astype(str).tolist())
    out: dict[str, dict[str, object]] = {}
    for col in (c for c in private.columns if c != "text"):
        y, ty = private[col].astype(str).to_numpy(), test[col].astype(str).tolist()
        row: dict[str, object] = {"all": round(logreg_scores(px, y.tolist(), tx, ty)
                                               ["accuracy"], 4)}
        for n in SIZES:
            accs = []
            for seed in range(DRAWS):
                idx = np.random.default_rng(seed).choice(len(private), n, replace=False)
                accs.append(logreg_scores(px[idx], y[idx].tolist(), tx, ty)["accuracy"])
            row[str(n)] = {"mean": round(float(np.mean(accs)), 4),
                           "sd": round(float(np.std(accs)), 4)}
        out[col] = row
        print(dataset, col, json.dumps(row), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    embedder = Embedder("minilm")
    result = {"draws": DRAWS, "embedder": embedder.engine_tag,
              "sets": {name: ceilings(name, embedder) for name in ("banking77", "yelp")}}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
