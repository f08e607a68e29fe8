"""The real offline all-MiniLM-L6-v2 embedder and its on-disk cache."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.embed import Embedder

pytestmark = pytest.mark.models

SENTS = [
    "The cat sat on the mat.",
    "A kitten is resting on a rug.",
    "The central bank raised interest rates again.",
]


def test_unit_norm_dim_and_similarity(embedder) -> None:
    v = embedder.embed(SENTS)
    assert embedder.dim == 384 and embedder.name == "minilm"
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError, match="single str"):
        embedder.embed("not a list")  # type: ignore[arg-type]


def test_iter_embed_streams_chunks(embedder) -> None:
    chunks = list(embedder.iter_embed(iter(SENTS * 2), chunk=4))
    assert [c.shape for c in chunks] == [(4, 384), (2, 384)]
    np.testing.assert_allclose(np.vstack(chunks), np.vstack([embedder.embed(SENTS)] * 2), atol=1e-5)


def test_cache_computes_only_misses(embedder, tmp_path) -> None:
    emb = Embedder("minilm", cache_dir=tmp_path / "emb", batch_size=8)
    first = emb.embed(SENTS + [SENTS[0]])
    assert emb.computed == 3 and emb.cached == 0  # the duplicate is computed once
    db = tmp_path / "emb" / "embeddings.sqlite"
    assert (db.stat().st_mode & 0o777) == 0o600
    again = emb.embed(["A new sentence about rivers.", SENTS[2], SENTS[0]])
    assert emb.computed == 4 and emb.cached == 2
    np.testing.assert_array_equal(again[1], first[2])
    np.testing.assert_array_equal(again[2], first[0])
    np.testing.assert_allclose(first[:3], embedder.embed(SENTS), atol=1e-5)
    emb.close()
