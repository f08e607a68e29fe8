"""DP-SynRAG with sharded documents (docs/methods.md §4): the build's partial statistics from
any number of document shards equal the one-shard ones, the count-based threshold mechanism is
the values-based one, and a restarted shard picks up its state without asking the LLM again.
The build on a real Ray cluster is tests/test_compute_ray.py's DP-SynRAG test."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpsynth.compute import partition
from dpsynth.methods.synrag.keywords import Vocabulary
from dpsynth.methods.synrag.pipeline import Corpus
from dpsynth.methods.synrag.retrieval import THRESHOLD_GRID, retrieve_in_cluster
from dpsynth.methods.synrag.shard import (
    DocumentShard,
    ShardFiles,
    grid_counts,
    merge_selected,
    shard_files,
)
from dpsynth.privacy import Accountant, PrivacySession, make_noise_source
from dpsynth.privacy.errors import PrivacyConfigError
from dpsynth.privacy.mechanisms import threshold_from_counts, threshold_mechanism
from fakes import FakeEmbedder

WORDS = ["fever", "cough", "rash", "headache", "nausea", "fatigue", "insomnia", "itch",
         "dizzy", "pain", "clinic", "weekend"]
VOCAB = Vocabulary(WORDS[:10], "test")


def _records(n: int = 120, seed: int = 3) -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(seed)
    texts = [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(2, 7))))
             for i in range(n)]
    users = [f"u{int(rng.integers(0, 30))}" for _ in range(n)]
    return texts, users


def _shards(texts: list[str], users: list[str] | None, n: int) -> list[DocumentShard]:
    """The production partition (partition.buckets_of) into ``n`` document shards."""
    buckets = partition.buckets_of(partition.record_keys(len(texts), users))
    out = []
    for s in range(n):
        rows = np.flatnonzero(partition.shard_of(buckets, n) == s)
        out.append(DocumentShard.of_records([texts[i] for i in rows], rows,
                                            None if users is None else
                                            [users[i] for i in rows], ShardFiles()))
    return out


def _corpus(shards: list[DocumentShard]) -> Corpus:
    return Corpus(lambda op, *args: [getattr(s, op)(*args) for s in shards])


def _session(tmp_path: Any, name: str) -> PrivacySession:
    return PrivacySession(tmp_path / name, Accountant("zcdp"), make_noise_source("seeded", 5))


@pytest.mark.parametrize("seed", range(6))
def test_the_count_based_threshold_is_the_values_based_one(seed):
    rng = np.random.default_rng(seed)
    sims = np.clip(rng.normal(0.3, 0.3, size=int(rng.integers(0, 60))), -1, 1)
    target = int(rng.integers(0, 12))
    counts = grid_counts(sims)
    assert counts.tolist() == [(sims > g).sum() for g in THRESHOLD_GRID]
    for stream in range(4):
        by_values = threshold_mechanism(sims, target, THRESHOLD_GRID, 0.7,
                                        make_noise_source("seeded", 100 * seed + stream),
                                        "grid")
        by_counts = threshold_from_counts(counts, target, THRESHOLD_GRID, 0.7,
                                          make_noise_source("seeded", 100 * seed + stream))
        assert by_counts == by_values


def test_the_sessions_count_threshold_draws_and_charges_as_the_values_one(tmp_path):
    sims = np.linspace(-0.2, 0.9, 37)
    with _session(tmp_path, "values") as a, _session(tmp_path, "counts") as b:
        for i in range(5):
            t_a = a.exponential_threshold(f"c/{i}", sims, 6, THRESHOLD_GRID, 1.5,
                                          name="cluster_threshold")
            t_b = b.threshold_from_counts(f"c/{i}", grid_counts(sims), 6, THRESHOLD_GRID, 1.5,
                                          name="cluster_threshold")
            assert t_a == t_b
        assert a.accountant.rho() == b.accountant.rho() > 0
        # a stored key replays; malformed counts are refused before anything is drawn
        assert b.threshold_from_counts("c/0", grid_counts(sims), 6, THRESHOLD_GRID, 1.5) == \
            a.exponential_threshold("c/0", sims, 6, THRESHOLD_GRID, 1.5)
        for bad in (grid_counts(sims)[:-1], -grid_counts(sims) - 1,
                    grid_counts(sims).astype(float)):
            with pytest.raises(PrivacyConfigError, match="counts"):
                b.threshold_from_counts("bad", bad, 6, THRESHOLD_GRID, 1.5)


@pytest.mark.parametrize("unit", ["record", "user"])
def test_sharded_documents_give_the_one_shard_retrieval(tmp_path, unit):
    """Keyword counts, cluster sizes, exact centre sums, grid counts, the released centre and
    threshold, and S_r in global order: the same from 1 and from 3 shards."""
    texts, users = _records()
    ids = users if unit == "user" else None
    seeds = np.array([3, 0, 5, 1])
    results = []
    for n in (1, 3):
        shards = _shards(texts, ids, n)
        corpus = _corpus(shards)
        hist = corpus.keyword_histogram(VOCAB, _scfg(), "tag", None, False)
        sizes = corpus.cluster(seeds, 2)
        corpus.embed(FakeEmbedder)
        sums = corpus.centre_sums()
        got = []
        with _session(tmp_path, f"{unit}-{n}") as session:
            for r in range(len(seeds)):
                key = f"cluster/{r:04d}"
                ret = retrieve_in_cluster(session, key, sums[r],
                                          lambda d, r=r, c=corpus: c.threshold_counts(r, d),
                                          sigma_mu=0.5, eps_theta=2.0, target=6)
                size = corpus.select(key, r, ret.direction, ret.theta)
                chosen = merge_selected([s.selected(key) for s in shards])
                assert len(chosen) == size
                got.append((ret.theta, ret.centre.tobytes(), chosen))
        results.append((hist.tobytes(), sizes.tolist(), sums.tobytes(), got))
    assert results[0] == results[1]
    assert any(chosen for _, _, chosen in results[0][3])  # retrieval selected documents
    assert sum(results[0][1]) > 0


def _scfg() -> Any:
    from dpsynth.methods.synrag.config import SynRAGConfig

    return SynRAGConfig.model_validate({"keyword_extractor": "vocabulary",
                                        "keywords_per_doc": 3})


class _Counting:
    """A generator factory whose generator counts its requests (or refuses any)."""

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.requests = 0

    def __call__(self) -> Any:
        from fakes import FakeGenerator

        owner = self

        class Gen(FakeGenerator):
            def generate(self, requests: Any, **kw: Any) -> Any:
                if owner.refuse:
                    raise AssertionError("the LLM was asked again")
                owner.requests += len(requests)
                return super().generate(requests, **kw)

        return Gen("fake-g0")


def test_a_restarted_shard_picks_up_its_state_without_asking_the_llm(tmp_path):
    texts, users = _records(40)
    rows = np.arange(len(texts)) * 2  # global ids of a shard: not 0..n-1
    files = shard_files(tmp_path / "compute", 1, 2)
    first = DocumentShard.of_records(texts, rows, users, files)
    llm = _Counting()
    counts = first.keyword_counts(VOCAB, 3, "appearance", ["tag"], llm, 16)
    assert llm.requests == first.size() > 0
    sizes = first.cluster(np.array([2, 4]), 1)
    first.embed(FakeEmbedder)
    direction = np.ones(FakeEmbedder().dim) / np.sqrt(FakeEmbedder().dim)
    n = first.select("cluster/0001", 1, direction, -1.0)
    assert n == sizes[1] > 0
    again = DocumentShard.of_records(texts, rows, users, files)  # a restarted actor

    def no_embedder() -> Any:
        raise AssertionError("embedded again")

    again.embed(no_embedder)
    assert again.selected("cluster/0001")[1] == first.selected("cluster/0001")[1]
    assert set(again.selected("cluster/0001")[0].tolist()) <= set(rows.tolist())
    assert again.centre_sums().tobytes() == first.centre_sums().tobytes()
    assert again.keyword_counts(VOCAB, 3, "appearance", ["tag"], _Counting(refuse=True),
                                16).tobytes() == counts.tobytes()
    for path in (files.keywords, files.embeddings, files.state):
        assert path is not None and path.stat().st_mode & 0o077 == 0  # private files


def test_the_driver_of_a_sharded_corpus_gets_no_text():
    corpus = Corpus(lambda op, *args: [], shards=("actor",))
    with pytest.raises(RuntimeError, match="stays on the shards"):
        corpus.texts("cluster/0000")


def test_fixed_point_rows_stay_strictly_inside_the_clip_norm() -> None:
    """The sensitivity the noise is calibrated for holds exactly: float32 unit rows (norm up to
    1 + 1e-7) and rows far outside come out with norm < clip on the 2^-32 grid."""
    from dpsynth.compute.kernels import FIXED_POINT_BITS, clipped_fixed_point

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 384)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # float32 rounding: some norms exceed 1
    assert (np.linalg.norm(x.astype(np.float64), axis=1) > 1.0).any()
    for clip, rows in ((1.0, x), (0.5, x), (1.0, 3 * x)):
        back = clipped_fixed_point(rows, clip).astype(np.float64) * 2.0 ** -FIXED_POINT_BITS
        norms = np.linalg.norm(back, axis=1)
        assert norms.max() < clip and norms.min() > clip * (1 - 1e-6)
