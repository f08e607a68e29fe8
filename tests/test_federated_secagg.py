"""Federated WASP voting through a real Flower simulation (Ray backend) with SecAgg+.

The first test runs on the default ``ray_address="local"`` (a one-machine Ray started and
stopped by the round); the others join the session's real two-node cluster (``ray_cluster``)
as ``wasp.federated.ray_address`` does, so they pay a connection instead of a Ray start."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpsynth.federated.app import PartyClient, ServerSink, make_client_app, make_server_app
from dpsynth.federated.core import (
    FederatedRoundError,
    InsufficientPartiesError,
    PartyData,
    party_submission,
)
from dpsynth.federated.simulation import (
    _SimulationParties,
    federated_noisy_histogram,
    run_flower_simulation,
)
from dpsynth.privacy.distributed import plan_quantisation
from dpsynth.voting import topq_vote

SIGMA = 1.5
VOTE = functools.partial(topq_vote, q=4)
BOUND = 11.0  # the public vote bound B (>= the largest party's 11 records: nothing is clipped)

pytestmark = pytest.mark.cluster  # every test runs Flower's simulation engine (Ray)


def zero_votes(party_embeddings: np.ndarray, party_labels: np.ndarray,
               candidate_embeddings: np.ndarray, candidate_labels: np.ndarray) -> np.ndarray:
    """A vote function that casts no votes: concat(H_near, H_far) = 0 (noise-only rounds)."""
    return np.zeros(2 * len(candidate_embeddings), dtype=np.float64)


class ObservedGrid:
    """A Flower grid that shows every reply message the server receives to an observer."""

    def __init__(self, grid: Any, observer: Any) -> None:
        self._grid = grid
        self._observer = observer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self._observer(replies)
        return replies


class DroppedParty(PartyClient):
    """A party that fails after the SecAgg+ key-sharing stages: neither its votes nor its
    noise share reach the sum."""

    def fit(self, parameters: Any, config: Any) -> Any:
        raise RuntimeError("simulated party dropout")


def dropping(*indices: int) -> Callable[..., Any]:
    """A client-app factory (``make_client_app``'s signature) whose parties at ``indices``
    drop out; the others are the production :class:`PartyClient`."""
    dropped = frozenset(indices)

    def party(data: PartyData, index: int, vote_fn: Any, **kwargs: Any) -> PartyClient:
        return (DroppedParty if index in dropped else PartyClient)(data, index, vote_fn,
                                                                   **kwargs)

    return functools.partial(make_client_app, party=party)


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def setup() -> tuple[list[PartyData], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2024)
    sizes = [4, 11, 7]  # uneven parties
    parties = [PartyData(_unit(rng, m, 16), rng.integers(0, 3, m)) for m in sizes]
    cand = _unit(rng, 15, 16)
    cand_lab = np.arange(15) % 3
    return parties, cand, cand_lab


def _submission(party: PartyData, i: int, cand: np.ndarray, cand_lab: np.ndarray,
                seed: int, n: int = 3) -> np.ndarray:
    """Party i's submission (votes + its discrete Gaussian share on the grid), recomputed
    outside Flower with the same seed and the plan the round uses."""
    plan = plan_quantisation(vote_bound=BOUND, sigma=SIGMA, num_parties=n)
    return party_submission(party, cand, cand_lab, VOTE, sigma=SIGMA, num_parties=n,
                            vote_bound=BOUND, clipping_range=plan.clipping_range,
                            quantization_range=plan.quantization_range, noise_mode="seeded",
                            seed=seed, party_index=i)


def _noisy_sum(parties: list[PartyData], cand: np.ndarray, cand_lab: np.ndarray, seed: int,
               include: list[int]) -> np.ndarray:
    """The parties' noisy submissions, recomputed outside Flower with the same seeds."""
    return sum(_submission(parties[i], i, cand, cand_lab, seed, len(parties)) for i in include)


def test_secure_sum_is_the_noisy_sum_and_server_sees_only_the_aggregate(setup) -> None:
    """The aggregate is exactly the sum of the parties' noisy submissions (recomputed outside
    Flower with the same seeds: on SecAgg+'s grid, nothing is rounded), and nothing else
    reaches the server."""
    import ray

    if ray.is_initialized():  # left connected to the test cluster by an earlier test: the
        ray.shutdown()  # default "local" round must start (and stop) its own Ray
    parties, cand, cand_lab = setup
    # The server factory takes only public inputs.
    params = set(inspect.signature(make_server_app).parameters)
    assert params == {"candidate_embeddings", "candidate_labels", "num_parties", "min_parties",
                      "sigma", "plan", "sink", "timeout_s", "grid_wrapper"}

    plan = plan_quantisation(vote_bound=BOUND, sigma=SIGMA, num_parties=3)
    sink = ServerSink()
    replies = []
    server_app = make_server_app(cand, cand_lab, num_parties=3, min_parties=3, sigma=SIGMA,
                                 plan=plan, sink=sink,
                                 grid_wrapper=lambda grid: ObservedGrid(grid, replies.extend))
    closure = inspect.getclosurevars(server_app._main).nonlocals  # noqa: SLF001
    assert not any(isinstance(v, (PartyData, _SimulationParties, list)) for v in closure.values())
    client_app = make_client_app(_SimulationParties(parties), VOTE, noise_mode="seeded", seed=5)
    run_flower_simulation(server_app, client_app, 3)

    expected = _noisy_sum(parties, cand, cand_lab, 5, [0, 1, 2])
    assert sink.released is not None and sink.parties_present == 3
    assert np.max(np.abs(sink.released - expected)) <= 1e-9
    # The strategy received 3 results, each carrying only the (averaged) aggregate.
    assert len(sink.observed) == 3
    for arr in sink.observed:
        np.testing.assert_allclose(arr * 3, sink.released, atol=1e-9)
    # The noise is really there: the release is far from the noise-free vote sum, whose total
    # mass (each record spends sum_q 2^-q twice) it keeps up to noise.
    true_votes = sum(VOTE(p.embeddings, p.labels, cand, cand_lab) for p in parties)
    assert np.max(np.abs(sink.released - true_votes)) > 100 * plan.step
    mass = 2 * sum(p.size for p in parties) * sum(2.0**-q for q in range(4))
    assert abs(sink.released.sum() - mass) < 6 * SIGMA * math.sqrt(sink.released.size)

    # On the wire: 4 SecAgg+ stages x 3 parties; no plain arrays, and the masked vectors
    # dequantise to noise unrelated to any party's noisy histogram.
    from flwr.common import bytes_to_ndarray

    assert len(replies) == 12
    locals_ = [_submission(p, i, cand, cand_lab, 5) for i, p in enumerate(parties)]
    masked = []
    for msg in replies:
        assert not msg.has_error()
        assert all(len(rec) == 0 for rec in msg.content.array_records.values())
        cfg = msg.content.config_records["secaggplus_configs"]
        if "masked_params" in cfg:
            factor, vec = (bytes_to_ndarray(b) for b in cfg["masked_params"])
            masked.append(vec.astype(np.float64) * plan.step - plan.clipping_range)
    assert len(masked) == 3
    for vec in masked:
        for loc in locals_:
            close = np.abs(vec - loc) <= 10 * plan.step
            assert close.mean() < 0.2, "a masked vector reveals a party's histogram"


def test_a_local_round_refuses_a_process_already_connected_to_a_cluster(setup,
                                                                        ray_cluster) -> None:
    """ray_address "local" promises a one-machine Ray of the round's own: in a process that
    already joined a cluster (where Flower would run the parties), the round refuses before
    any party starts, naming the setting."""
    from dpsynth.errors import ComputeError

    parties, cand, cand_lab = setup
    with pytest.raises(ComputeError, match="wasp.federated.ray_address"):
        federated_noisy_histogram(parties, cand, cand_lab, VOTE, SIGMA, vote_bound=BOUND,
                                  seed=20)


def test_one_dropout_releases_with_reduced_effective_sigma(setup, ray_cluster) -> None:
    parties, cand, cand_lab = setup
    res = federated_noisy_histogram(parties, cand, cand_lab, VOTE, SIGMA, vote_bound=BOUND,
                                    seed=21, min_parties=2, client_app=dropping(1),
                                    ray_address=ray_cluster)
    assert res.parties_present == 2
    assert res.effective_sigma == pytest.approx(SIGMA * math.sqrt(2 / 3))
    # SecAgg+ recovered the dropped party's pairwise masks: the sum of the two survivors.
    expected = _noisy_sum(parties, cand, cand_lab, 21, [0, 2])
    assert np.max(np.abs(res.histogram - expected)) <= 1e-9


def test_one_dropout_below_minimum_halts_before_any_sum(setup, ray_cluster) -> None:
    """Reconstruction threshold = min_parties = 3: with one dropout SecAgg+ cannot unmask, so
    the server never holds a sum (not even one the strategy would then refuse)."""
    parties, cand, cand_lab = setup
    plan = plan_quantisation(vote_bound=11.0, sigma=SIGMA, num_parties=3)
    sink = ServerSink()
    server_app = make_server_app(cand, cand_lab, num_parties=3, min_parties=3, sigma=SIGMA,
                                 plan=plan, sink=sink)
    client_app = dropping(0)(_SimulationParties(parties), VOTE, noise_mode="seeded", seed=22)
    run_flower_simulation(server_app, client_app, 3, ray_address=ray_cluster)
    assert sink.released is None and sink.observed == []
    assert sink.error_kind is InsufficientPartiesError
    assert "SecAgg+ halted" in (sink.error or "") and "(3)" in (sink.error or "")


def test_too_many_dropouts_halt_secure_aggregation(setup, ray_cluster) -> None:
    parties, cand, cand_lab = setup
    with pytest.raises(FederatedRoundError, match="SecAgg\\+ halted"):
        federated_noisy_histogram(parties, cand, cand_lab, VOTE, SIGMA, vote_bound=BOUND,
                                  seed=23, min_parties=2, client_app=dropping(0, 2),
                                  ray_address=ray_cluster)


def test_zero_votes_aggregate_has_variance_sigma_squared(ray_cluster) -> None:
    rng = np.random.default_rng(7)
    parties = [PartyData(_unit(rng, 3, 8), rng.integers(0, 2, 3)) for _ in range(4)]
    cand = _unit(rng, 300, 8)
    cand_lab = np.arange(300) % 2
    sigma = 2.0
    res = federated_noisy_histogram(parties, cand, cand_lab, zero_votes, sigma, vote_bound=3.0,
                                    seed=None,
                                    noise_mode="secure", ray_address=ray_cluster)
    assert res.parties_present == 4 and res.effective_sigma == sigma
    assert res.clip_probability_bound < 1e-12
    x = res.histogram
    n = x.size  # 600 coordinates of N(0, sigma^2) if every party adds N(0, sigma^2 / 4)
    assert abs(x.mean()) < 5 * sigma / math.sqrt(n)
    stat = (n - 1) * x.var(ddof=1) / sigma**2
    lo, hi = stats.chi2.ppf([1e-6, 1 - 1e-6], n - 1)
    assert lo < stat < hi, f"variance {x.var(ddof=1):.3f} vs sigma^2 {sigma**2}"


def test_a_larger_largest_party_releases_the_same_bytes(ray_cluster) -> None:
    """Issue 23, finding 6: C and the grid come from the public vote bound, not from party
    sizes. The largest party grows from 63 to 64 records, across the power of two of the old
    C = next_pow2(largest + 10 sigma / sqrt(P)) (64 vs 128 here); the new record's label has no
    candidate, so it casts no vote. With the same seeded noise (and the parties' own rounding)
    the released sums are byte-identical, and so is everything the round reports."""
    rng = np.random.default_rng(11)
    small = [PartyData(_unit(rng, m, 8), rng.integers(0, 3, m)) for m in (9, 5)]
    big_emb, big_lab = _unit(rng, 63, 8), rng.integers(0, 3, 63)
    cand, cand_lab = _unit(rng, 12, 8), np.arange(12) % 3
    sigma = 0.05 * math.sqrt(3)  # 10 sigma / sqrt(3) = 0.5: 63.5 -> 64, 64.5 -> 128
    results = []
    for emb, lab in ((big_emb, big_lab),
                     (np.vstack([big_emb, _unit(rng, 1, 8)]), np.append(big_lab, 3))):
        parties = [PartyData(emb, lab), *small]
        results.append(federated_noisy_histogram(
            parties, cand, cand_lab, VOTE, sigma, vote_bound=100.0, seed=31,
            ray_address=ray_cluster))
    a, b = results
    assert a.histogram.tobytes() == b.histogram.tobytes()
    assert (a.clipping_range, a.clip_probability_bound) == (b.clipping_range,
                                                           b.clip_probability_bound)
    assert a.clipping_range == 128.0  # next_pow2(100 + 0.5), from the bound alone
