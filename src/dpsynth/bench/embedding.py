"""Benchmark: today's torch embedder vs a fast engine, side by side on the same texts.

Both engines are loaded first (the fast one exports its ONNX graph on first use, outside the
timing), warmed on a few texts, then timed in alternating rounds (torch, fast, torch, fast...)
so that the shared machine's load falls on both alike; each engine's rate is the median over
rounds. Agreement is the cosine between the two engines' vectors of every text (both are unit
norm). The texts are public benchmark data; nothing of them is printed.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np


def load_texts(path: Path, column: str = "text", limit: int | None = None) -> list[str]:
    """Texts of one column of a CSV / JSONL file (the first ``limit`` rows)."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".jsonl":
        frame = pd.read_json(path, lines=True, nrows=limit)
    else:
        frame = pd.read_csv(path, nrows=limit)
    if column not in frame.columns:
        raise ValueError(f"{path}: no column {column!r} (has {', '.join(map(str, frame.columns))})")
    return frame[column].fillna("").astype(str).tolist()


def demo_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` texts of the built-in (synthetic, public) demo corpus."""
    import tempfile

    from dpsynth.demo_corpus import write_demo_corpus

    with tempfile.TemporaryDirectory() as tmp:
        paths = write_demo_corpus(tmp, n=n, seed=seed, test_n=1)
        return load_texts(paths["private"])[:n]


def time_alternating(embedders: dict[str, Any], texts: list[str],
                     rounds: int) -> tuple[dict[str, list[float]], dict[str, np.ndarray]]:
    """Sentences/s of each embedder per round (rounds alternate between them) and vectors."""
    warm = texts[: min(len(texts), 8)]
    for emb in embedders.values():
        emb.embed(warm)
    rates: dict[str, list[float]] = {name: [] for name in embedders}
    vecs: dict[str, np.ndarray] = {}
    for _ in range(rounds):
        for name, emb in embedders.items():
            start = time.perf_counter()
            vecs[name] = emb.embed(texts)
            rates[name].append(len(texts) / (time.perf_counter() - start))
    return rates, vecs


def bench_embedding(
    texts: Sequence[str],
    *,
    engine: str = "auto",
    batch_size: int = 16,
    threads: int | None = None,
    rounds: int = 3,
    model: str = "minilm",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Sentences/s of torch and of ``engine`` on ``texts``, speedup and cosine agreement.

    ``extra``: more embedders (name -> object with ``embed``) timed in the same rounds and
    reported under ``"extra"``.
    """
    from dpsynth.embed import Embedder

    if not texts:
        raise ValueError("bench_embedding: no texts")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    texts = list(texts)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    fast = Embedder(model, engine=engine, batch_size=batch_size, threads=threads)
    fast_load = time.perf_counter() - t0
    base = Embedder(model, engine="torch", batch_size=batch_size)
    rates, vecs = time_alternating({"torch": base, "fast": fast, **(extra or {})}, texts,
                                   rounds)
    base_rate = statistics.median(rates["torch"])

    def summary(name: str) -> dict[str, Any]:
        cos = np.sum(vecs["torch"] * vecs[name], axis=1)
        rate = statistics.median(rates[name])
        return {"sentences_per_second": round(rate, 2), "speedup": round(rate / base_rate, 3),
                "min_cosine": float(np.min(cos)), "mean_cosine": float(np.mean(cos)),
                "rates": [round(r, 2) for r in rates[name]]}

    main = summary("fast")
    return {
        "engine": fast.engine_tag,
        "sentences_per_second": main["sentences_per_second"],
        "baseline_sentences_per_second": round(base_rate, 2),
        "speedup": main["speedup"],
        "min_cosine": main["min_cosine"],
        "mean_cosine": main["mean_cosine"],
        "texts": len(texts),
        "mean_chars": round(float(np.mean([len(t) for t in texts])), 1),
        "batch_size": batch_size,
        "threads": fast.threads,
        "rounds": rounds,
        "fast_rates": main["rates"],
        "baseline_rates": [round(r, 2) for r in rates["torch"]],
        "engine_load_seconds": round(fast_load, 2),
        "skipped_engines": fast.skipped,
        "extra": {name: summary(name) for name in (extra or {})},
        "load_average_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
