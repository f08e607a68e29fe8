"""PQ fast-scan voting with exact re-rank (docs/methods.md §1): trained and built on the public
candidates only, one vote per record, the exact vote on well-separated data."""

from __future__ import annotations

import math

import faiss
import numpy as np
import pytest

import dpsynth.voting as voting
from dpsynth.voting import VoteIndex, knn_vote, nearest_candidates, topq_vote

PQ = VoteIndex(kind="pq", min_candidates=1)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _separated(n_priv: int, n_cand: int, d: int = 48, labels: int = 3,
               seed: int = 0) -> tuple[np.ndarray, ...]:
    """Each private record is a small perturbation of one candidate of its label, so its
    nearest candidate is clear (well-separated data)."""
    rng = np.random.default_rng(seed)
    cands = _unit(rng.normal(size=(n_cand, d)))
    clab = rng.integers(0, labels, n_cand)
    src = rng.integers(0, n_cand, n_priv)
    private = _unit(cands[src] + 0.05 * rng.normal(size=(n_priv, d)) / math.sqrt(d))
    return private, clab[src], cands, clab


def test_pq_vote_equals_exact_vote_on_separated_data():
    private, plab, cands, clab = _separated(4000, 1500)
    exact = knn_vote(private, plab, cands, clab, k=1)
    np.testing.assert_array_equal(knn_vote(private, plab, cands, clab, k=1, index=PQ), exact)
    exact3 = knn_vote(private, plab, cands, clab, k=3)
    np.testing.assert_array_equal(knn_vote(private, plab, cands, clab, k=3, index=PQ), exact3)


@pytest.mark.parametrize("k", [1, 4])
def test_every_record_casts_exactly_one_vote_per_label(k):
    private, plab, cands, clab = _separated(3000, 1200, seed=1)
    hist = knn_vote(private, plab, cands, clab, k=k, index=PQ)
    for y in range(3):  # each record's vote vector has norm 1 and stays in its label's block
        mass = hist[clab == y].sum()
        assert mass == pytest.approx((plab == y).sum() * k / math.sqrt(k))
    for rows, found in nearest_candidates(private, plab, cands, clab, k, index=PQ):
        assert found.shape == (len(rows), k)
        assert (clab[found] == plab[rows][:, None]).all()
        assert all(len(set(r)) == k for r in found.tolist())  # k distinct candidates
    near_far = topq_vote(private, plab, cands, clab, q=3, index=PQ)
    assert near_far.sum() == pytest.approx(2 * len(private) * (1 + 0.5 + 0.25))


def test_pq_index_sees_only_the_candidates(monkeypatch):
    """Every array faiss trains or fills the PQ / refine index with is a set of candidate rows
    of one label, never a private row."""
    private, plab, cands, clab = _separated(2000, 1200, seed=2)
    seen: list[np.ndarray] = []
    real = faiss.IndexRefineFlat

    class Spy(real):  # type: ignore[misc, valid-type]
        def train(self, x):
            seen.append(np.array(x))
            return super().train(x)

        def add(self, x):
            seen.append(np.array(x))
            return super().add(x)

    monkeypatch.setattr(voting.faiss, "IndexRefineFlat", Spy)
    knn_vote(private, plab, cands, clab, k=2, index=PQ)
    assert len(seen) == 2 * 3  # train + add, one index per label
    cand_rows = {r.tobytes() for r in cands}
    priv_rows = {r.tobytes() for r in private}
    for x in seen:
        rows = {r.tobytes() for r in np.ascontiguousarray(x, dtype=np.float32)}
        assert rows <= cand_rows and not rows & priv_rows
        assert len({int(clab[i]) for i, r in enumerate(cands) if r.tobytes() in rows}) == 1


def test_pq_falls_back_to_exact_for_small_labels_and_validates():
    private, plab, cands, clab = _separated(500, 120, seed=3)  # < 256 candidates per label
    lc = voting._LabelCandidates(cands, np.arange(len(cands)), PQ)
    assert lc.kind == "exact"
    np.testing.assert_array_equal(knn_vote(private, plab, cands, clab, index=PQ),
                                  knn_vote(private, plab, cands, clab))
    big = _unit(np.random.default_rng(0).normal(size=(600, 48)))
    assert voting._LabelCandidates(big, np.arange(600), PQ).kind == "pq"
    with pytest.raises(ValueError, match="divide"):
        voting._LabelCandidates(big, np.arange(600), VoteIndex(kind="pq", pq_m=5,
                                                               min_candidates=1))
    with pytest.raises(ValueError, match="< 16 dimensions"):
        voting._LabelCandidates(big, np.arange(600), VoteIndex(kind="pq", pq_m=1,
                                                               min_candidates=1))
    with pytest.raises(ValueError, match="rerank"):
        VoteIndex(kind="pq", rerank=0)
