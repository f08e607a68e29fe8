"""Private voting (docs/methods.md §1-§2): the label-ordered exact path against the old
per-label-copy path, approximate (PQ / IVF / HNSW) voting, sensitivity, determinism and memory."""

from __future__ import annotations

import json
import math
import tracemalloc

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.config import SynthesisConfig
from dpsynth.voting import (
    VoteIndex,
    knn_vote,
    nearest_candidates,
    topq_sensitivity,
    topq_vote,
    vote_index_from,
)

ANN = [VoteIndex(kind="pq", rerank=64, min_candidates=1),
       VoteIndex(kind="ivf", nprobe=4, min_candidates=1),
       VoteIndex(kind="hnsw", min_candidates=1)]


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(n_priv: int, n_cand: int, d: int = 32, topics: int = 20, seed: int = 0,
               labels: int = 1) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(topics, d)))

    def draw(n: int) -> np.ndarray:
        return _unit(centres[rng.integers(0, topics, n)] + 0.6 * rng.normal(size=(n, d))
                     / math.sqrt(d))

    return (draw(n_priv), rng.integers(0, labels, n_priv), draw(n_cand),
            rng.integers(0, labels, n_cand))


def _per_label(private, plab, cands, clab):
    """Per label with candidates: (candidate rows, private rows, a flat IP index of that label's
    candidates): the reference paths copy each label's rows, as the code before the refactor."""
    for y in np.unique(plab):
        ci = np.flatnonzero(clab == y)
        if len(ci) == 0:
            continue
        index = faiss.IndexFlatIP(cands.shape[1])
        index.add(np.ascontiguousarray(cands[ci]))
        yield ci, np.flatnonzero(plab == y), index


def _old_knn_vote(private, plab, cands, clab, k, users=None):
    """The pre-refactor path: per label, copy that label's private rows, exact faiss search."""
    hist = np.zeros(len(cands))
    per_user: dict[int, np.ndarray] = {}
    for ci, ri, index in _per_label(private, plab, cands, clab):
        kk = min(k, len(ci))
        _, ids = index.search(np.ascontiguousarray(private[ri]), kk)
        for r, row in zip(ri, ids, strict=True):
            vote = np.zeros(len(cands))
            vote[ci[row]] = 1 / math.sqrt(kk)
            if users is None:
                hist += vote
            else:
                per_user[users[r]] = per_user.get(users[r], 0) + vote
    for vote in per_user.values():
        hist += vote / max(1.0, float(np.linalg.norm(vote)))
    return hist


def _old_topq_vote(private, plab, cands, clab, q):
    n = len(cands)
    out = np.zeros(2 * n)
    for ci, ri, index in _per_label(private, plab, cands, clab):
        qq = min(q, len(ci))
        _, near = index.search(np.ascontiguousarray(private[ri]), qq)
        _, far = index.search(np.ascontiguousarray(-private[ri]), qq)
        w = 2.0 ** -np.arange(qq)
        for a, b in zip(near, far, strict=True):
            out[ci[a]] += w
            out[n + ci[b]] += w
    return out


@pytest.mark.parametrize("k", [1, 3])
def test_label_ordered_path_equals_old_per_label_copies(k):
    rng = np.random.default_rng(1)
    private = _unit(rng.normal(size=(700, 16)))
    cands = _unit(rng.normal(size=(60, 16)))
    plab, clab = rng.integers(0, 5, 700), rng.integers(0, 4, 60)  # label 4: no candidates
    users = rng.integers(0, 90, 700)
    ref = _old_knn_vote(private, plab, cands, clab, k)
    new = knn_vote(private, plab, cands, clab, k=k, batch=37)
    # the same votes (counts of 1/sqrt(k)); only the float summation order may differ
    np.testing.assert_array_equal(np.rint(new * math.sqrt(k)), np.rint(ref * math.sqrt(k)))
    np.testing.assert_allclose(new, ref, atol=1e-12)
    np.testing.assert_allclose(knn_vote(private, plab, cands, clab, k=k, users=users, batch=37),
                               _old_knn_vote(private, plab, cands, clab, k, users), atol=1e-12)
    np.testing.assert_array_equal(topq_vote(private, plab, cands, clab, q=k + 1, batch=37),
                                  _old_topq_vote(private, plab, cands, clab, k + 1))


def test_private_rows_are_not_copied_per_label():
    """At most one chunk of private rows is copied (plus O(M) index arrays), where the old
    path copied each label's rows: half of them here."""
    rng = np.random.default_rng(2)
    private = _unit(rng.normal(size=(40_000, 256)))
    plab = rng.integers(0, 2, len(private))
    cands = _unit(rng.normal(size=(200, 256)))
    clab = np.arange(200) % 2
    tracemalloc.start()
    knn_vote(private, plab, cands, clab, k=1, batch=512)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 0.1 * private.nbytes, (peak, private.nbytes)


@pytest.mark.parametrize("spec", ANN, ids=lambda s: s.kind)
def test_ann_agrees_with_exact_on_clustered_data(spec):
    private, plab, cands, clab = _clustered(3000, 2500, labels=2)

    def top1(index):
        ids = np.full(len(private), -1)
        for rows, found in nearest_candidates(private, plab, cands, clab, 1, index=index):
            ids[rows] = found[:, 0]
        return ids

    exact = top1(None)
    assert (exact >= 0).all() and (clab[exact] == plab).all()
    approx = top1(spec)
    assert (approx == exact).mean() >= 0.99
    hist = knn_vote(private, plab, cands, clab, k=2, index=spec)
    assert hist.sum() == pytest.approx(len(private) * 2 / math.sqrt(2))


@pytest.mark.parametrize("spec", ANN, ids=lambda s: s.kind)
def test_ann_sensitivity_one_record_moves_only_its_own_vote(spec):
    """The index is built on the candidates only, so removing a record changes no other
    record's neighbours: the histogram moves by exactly that record's vote (L2 norm 1)."""
    private, plab, cands, clab = _clustered(600, 2500, labels=2, seed=4)
    k = 3
    full = knn_vote(private, plab, cands, clab, k=k, index=spec)
    neighbours = {int(r): ids for rows, found in nearest_candidates(
        private, plab, cands, clab, k, index=spec) for r, ids in zip(rows, found, strict=True)}
    for drop in range(0, 600, 97):
        keep = np.arange(600) != drop
        diff = full - knn_vote(private[keep], plab[keep], cands, clab, k=k, index=spec)
        own = np.zeros(len(cands))
        own[neighbours[drop]] = 1 / math.sqrt(k)
        np.testing.assert_allclose(diff, own, atol=1e-9)
        assert np.linalg.norm(diff) == pytest.approx(1.0)
    q = 4
    near_far = topq_vote(private, plab, cands, clab, q=q, index=spec)
    diff = near_far - topq_vote(private[1:], plab[1:], cands, clab, q=q, index=spec)
    assert np.linalg.norm(diff) == pytest.approx(topq_sensitivity(q))


@pytest.mark.parametrize("spec", ANN, ids=lambda s: s.kind)
def test_ann_user_level_bound(spec):
    private, plab, cands, clab = _clustered(500, 2500, seed=5)
    users = np.repeat(np.arange(50), 10)
    full = knn_vote(private, plab, cands, clab, k=1, users=users, index=spec)
    for u in (0, 13, 49):
        keep = users != u
        _, inv = np.unique(users[keep], return_inverse=True)
        diff = full - knn_vote(private[keep], plab[keep], cands, clab, k=1, users=inv,
                               index=spec)
        assert np.linalg.norm(diff) <= 1.0 + 1e-9


@pytest.mark.parametrize("spec", [None, *ANN], ids=lambda s: s.kind if s else "exact")
def test_vote_is_deterministic_across_threads_and_ties_go_to_lowest_index(spec):
    private, plab, cands, clab = _clustered(4000, 2500, seed=6)
    cands[[700, 1200, 2400]] = cands[300]  # identical candidates: a 4-way tie
    private[:20] = _unit(cands[300][None] + 1e-3 * np.random.default_rng(0).normal(
        size=(20, cands.shape[1])))
    before = faiss.omp_get_max_threads()
    try:
        runs = []
        for threads in (1, 2, 2):
            faiss.omp_set_num_threads(threads)
            runs.append(knn_vote(private, plab, cands, clab, k=2, index=spec))
    finally:
        faiss.omp_set_num_threads(before)
    np.testing.assert_array_equal(runs[0], runs[1])
    np.testing.assert_array_equal(runs[1], runs[2])
    for _rows, found in nearest_candidates(private[:20], plab[:20], cands, clab, 2, index=spec):
        assert (found == [300, 700]).all(), found  # of the tied four, the two lowest indices


def test_vote_index_config_and_validation():
    syn = SynthesisConfig(voting="ivf", voting_nprobe=3, voting_nlist=10)
    spec = vote_index_from(syn)
    assert (spec.kind, spec.nprobe, spec.nlist) == ("ivf", 3, 10)
    assert vote_index_from(SynthesisConfig()).kind == "exact"
    with pytest.raises(ValueError, match="exact, pq, ivf or hnsw"):
        VoteIndex(kind="lsh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="nprobe"):
        VoteIndex(kind="ivf", nprobe=0)
    with pytest.raises(ValueError, match="labels"):
        knn_vote(np.zeros((3, 4), np.float32), np.zeros(2, int), np.zeros((2, 4), np.float32),
                 np.zeros(2, int))


def test_bench_knn_json_small(small_probe):
    res = CliRunner().invoke(app, ["bench", "knn", "--private", "3000", "--synthetic", "500",
                                   "--dim", "32", "--clusters", "20", "--nprobe", "2",
                                   "--no-reference", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    for key in ("exact_seconds", "ann_seconds", "speedup", "agreement",
                "secpe_speedup_vs_fastest_exact"):
        assert isinstance(out[key], float), key
    assert out["speedup"] == pytest.approx(out["exact_seconds"] / out["ann_seconds"], rel=1e-6)
    assert 0.0 <= out["agreement"] <= 1.0


@pytest.mark.parametrize("method", ["aug_pe", "wasp"])
def test_config_voting_reaches_the_vote(tmp_path, monkeypatch, method):
    """`synthesis.voting` travels from the config through the compute engine to the search."""
    from pathlib import Path

    import dpsynth.voting as voting
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config
    from fakes import FakeEmbedder, FakeGenerator
    from test_release_check import pe_config, private_rows, write_csv

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    seen: list[VoteIndex] = []
    real = voting._searches  # what knn_vote and topq_vote both search through

    def spy(*args, **kwargs):
        seen.append(voting._as_index(args[5]))
        return real(*args, **kwargs)

    monkeypatch.setattr(voting, "_searches", spy)
    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"synthesis.voting": "hnsw", "synthesis.voting_ef_search": 40,
                       "wasp.top_q": 3, "wasp.demonstrations": 2})
    run = Path(run_generation(parse_config(cfg), tmp_path / "run", progress=False,
                              generators=[FakeGenerator("fake-g0")], embedder=FakeEmbedder()))
    assert (run / "release" / "synthetic.jsonl").is_file()
    assert seen and all(s.kind == "hnsw" and s.ef_search == 40 for s in seen)
