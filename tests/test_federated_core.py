"""Flower-free parts of federated WASP voting: quantisation plan, party noise, validation."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from dpsynth.evolution.voting import topq_vote
from dpsynth.federated.core import (
    PartyData,
    clip_probability_bound,
    effective_sigma,
    grid_round,
    party_noise,
    party_noisy_histogram,
    party_submission,
    plan_quantisation,
    validate_parties,
)


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_plan_picks_power_of_two_clipping_range_covering_votes_and_noise() -> None:
    plan = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4)
    # 12 + 10 * 3 / sqrt(4) = 27 -> next power of two is 32
    assert plan.clipping_range == 32.0
    assert plan.step == 64.0 / 2**22
    assert math.log2(plan.step).is_integer()  # dyadic grid: 2^-q vote weights are exact
    assert plan.error_bound(3) == pytest.approx(3 * plan.step)
    explicit = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4, clipping_range=100.0)
    assert explicit.clipping_range == 100.0


def test_plan_rejects_overflowing_or_bad_parameters() -> None:
    with pytest.raises(ValueError, match="modulus_range"):
        plan_quantisation(vote_bound=1.0, sigma=1.0, num_parties=2048)
    with pytest.raises(ValueError, match="num_parties"):
        plan_quantisation(vote_bound=1.0, sigma=1.0, num_parties=1)
    with pytest.raises(ValueError, match="clipping_range"):
        plan_quantisation(vote_bound=1.0, sigma=1.0, num_parties=3, clipping_range=-1.0)
    with pytest.raises(ValueError, match="sigma"):
        plan_quantisation(vote_bound=1.0, sigma=float("nan"), num_parties=3)


def test_clip_probability_bound_is_tiny_for_ten_sds_and_one_without_margin() -> None:
    plan = plan_quantisation(vote_bound=8.0, sigma=2.0, num_parties=4,
                             clipping_range=8.0 + 10.0 * 2.0 / 2.0)
    p = clip_probability_bound(plan, 2.0, 4, dim=1000)
    assert 0 < p < 1e-15
    assert p == pytest.approx(2 * 4 * 1000 * 0.5 * math.erfc(10 / math.sqrt(2)), rel=1e-9)
    no_margin = plan_quantisation(vote_bound=8.0, sigma=2.0, num_parties=4, clipping_range=8.0)
    assert clip_probability_bound(no_margin, 2.0, 4, dim=10) == 1.0


def test_effective_sigma_accounts_for_missing_noise_shares() -> None:
    assert effective_sigma(3.0, 10, 10) == 3.0
    assert effective_sigma(3.0, 9, 10) == pytest.approx(3.0 * math.sqrt(0.9))


def test_party_noise_is_seeded_per_party_and_secure_mode_is_unseeded() -> None:
    a0 = party_noise(2000, 1.0, noise_mode="seeded", seed=7, party_index=0)
    a0_again = party_noise(2000, 1.0, noise_mode="seeded", seed=7, party_index=0)
    a1 = party_noise(2000, 1.0, noise_mode="seeded", seed=7, party_index=1)
    b0 = party_noise(2000, 1.0, noise_mode="seeded", seed=8, party_index=0)
    np.testing.assert_array_equal(a0, a0_again)
    assert abs(np.corrcoef(a0, a1)[0, 1]) < 0.15  # independent parties
    assert not np.allclose(a0, b0)
    s1 = party_noise(2000, 2.0, noise_mode="secure", seed=7, party_index=0)
    s2 = party_noise(2000, 2.0, noise_mode="secure", seed=7, party_index=0)
    assert not np.allclose(s1, s2)  # secure mode ignores the seed
    assert 3.0 < float(np.var(s1)) < 5.0
    with pytest.raises(ValueError, match="noise_mode"):
        party_noise(3, 1.0, noise_mode="fast", seed=1, party_index=0)


def test_party_noisy_histogram_adds_sigma_over_sqrt_p_noise_to_votes() -> None:
    rng = np.random.default_rng(0)
    party = PartyData(_unit(rng, 9, 8), rng.integers(0, 3, 9))
    cand, cand_lab = _unit(rng, 12, 8), np.arange(12) % 3
    vote = functools.partial(topq_vote, q=3)
    y = party_noisy_histogram(party, cand, cand_lab, vote, sigma=2.0, num_parties=4,
                              vote_bound=9.0, noise_mode="seeded", seed=5, party_index=2)
    h = vote(party.embeddings, party.labels, cand, cand_lab)
    noise = party_noise(h.size, 1.0, noise_mode="seeded", seed=5, party_index=2)
    np.testing.assert_allclose(y, h + noise, atol=1e-12)  # std = 2 / sqrt(4) = 1


def test_votes_over_the_bound_are_clipped_not_refused_and_empty_parties_vote_nothing() -> None:
    """A refusal would make the round's outcome depend on a party's data: votes are clipped
    to [0, B] instead (1-Lipschitz per coordinate, so the sensitivity holds)."""
    rng = np.random.default_rng(1)
    party = PartyData(_unit(rng, 9, 8), np.zeros(9, dtype=int))
    cand, cand_lab = _unit(rng, 4, 8), np.zeros(4, dtype=int)
    vote = functools.partial(topq_vote, q=2)
    h = vote(party.embeddings, party.labels, cand, cand_lab)
    assert h.max() > 2.0  # 9 records of one label: some candidate gets more than 2
    y = party_noisy_histogram(party, cand, cand_lab, vote, sigma=1.0, num_parties=3,
                              vote_bound=2.0, noise_mode="seeded", seed=0, party_index=0)
    noise = party_noise(h.size, 1.0 / math.sqrt(3), noise_mode="seeded", seed=0, party_index=0)
    np.testing.assert_allclose(y - noise, np.clip(h, 0.0, 2.0), atol=1e-12)
    # clipping never increases the distance between neighbouring parties' votes
    other = PartyData(party.embeddings[1:], party.labels[1:])
    h2 = vote(other.embeddings, other.labels, cand, cand_lab)
    y2 = party_noisy_histogram(other, cand, cand_lab, vote, sigma=1.0, num_parties=3,
                               vote_bound=2.0, noise_mode="seeded", seed=0, party_index=0)
    assert np.linalg.norm(y - y2) <= np.linalg.norm(h - h2) + 1e-12

    empty = PartyData(np.zeros((0, 8), np.float32), np.zeros(0, dtype=int))
    assert validate_parties([party, empty]) == 8
    y0 = party_noisy_histogram(empty, cand, cand_lab, vote, sigma=1.0, num_parties=3,
                               vote_bound=2.0, noise_mode="seeded", seed=0, party_index=1)
    np.testing.assert_allclose(
        y0, party_noise(8, 1.0 / math.sqrt(3), noise_mode="seeded", seed=0, party_index=1))
    with pytest.raises(ValueError, match=">= 2 parties"):
        validate_parties([party])
    with pytest.raises(ValueError, match="labels"):
        PartyData(_unit(rng, 3, 8), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="integer"):
        PartyData(_unit(rng, 3, 8), np.zeros(3))


def test_grid_round_is_unbiased_within_one_step_and_exact_on_the_grid() -> None:
    """The party's own stochastic rounding onto SecAgg+'s grid: on the grid, within one step,
    unbiased, clipped to [-C, C], and what flwr's quantize then maps to integers exactly."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    c, r = 8.0, 2**10
    step = 2 * c / r
    rng = np.random.default_rng(0)
    x = rng.uniform(-7.9, 7.9, 5000)
    out = grid_round(x, c, r, rng.random(x.size))
    k = (out + c) / step
    np.testing.assert_array_equal(k, np.round(k))  # on the grid
    assert np.all(np.abs(out - x) < step)
    many = np.mean([grid_round(np.full(4000, 0.3 * step), c, r, rng.random(4000))
                    for _ in range(5)])
    assert many == pytest.approx(0.3 * step, abs=0.02 * step)  # E[round(x)] = x
    assert grid_round(np.array([-100.0, 100.0]), c, r, np.array([0.5, 0.5])).tolist() == [-c, c]
    # flwr's own stochastic rounding has nothing left to do: quantize is deterministic
    q1 = quantize([out], c, r)[0]
    q2 = quantize([out], c, r)[0]
    np.testing.assert_array_equal(q1, q2)
    np.testing.assert_array_equal(dequantize([q1], c, r)[0], out)


def test_party_submission_is_the_noisy_votes_rounded_with_the_same_source() -> None:
    rng = np.random.default_rng(4)
    party = PartyData(_unit(rng, 7, 8), rng.integers(0, 2, 7))
    cand, cand_lab = _unit(rng, 6, 8), np.arange(6) % 2
    vote = functools.partial(topq_vote, q=3)
    plan = plan_quantisation(vote_bound=100.0, sigma=2.0, num_parties=3)
    kw = dict(sigma=2.0, num_parties=3, vote_bound=100.0, noise_mode="seeded", seed=9,
              party_index=1)
    sub = party_submission(party, cand, cand_lab, vote, clipping_range=plan.clipping_range,
                           quantization_range=plan.quantization_range, **kw)
    again = party_submission(party, cand, cand_lab, vote, clipping_range=plan.clipping_range,
                             quantization_range=plan.quantization_range, **kw)
    assert sub.tobytes() == again.tobytes()  # seeded: reproducible, rounding included
    y = party_noisy_histogram(party, cand, cand_lab, vote, **kw)
    assert np.max(np.abs(sub - y)) < plan.step
    assert not np.array_equal(sub, y)


def test_the_plan_comes_from_public_inputs_only() -> None:
    """C and the grid are functions of (B, sigma, P, R, modulus): the round API takes B from the
    caller (no default from party sizes), and the deployment reads it from its run config."""
    import inspect

    from dpsynth.federated.app import deploy_plan
    from dpsynth.federated.simulation import federated_noisy_histogram

    assert set(inspect.signature(plan_quantisation).parameters) == {
        "vote_bound", "sigma", "num_parties", "clipping_range", "quantization_range",
        "modulus_range", "noise_bound_sds"}
    bound = inspect.signature(federated_noisy_histogram).parameters["vote_bound"]
    assert bound.default is inspect.Parameter.empty and bound.kind is bound.KEYWORD_ONLY
    plan = deploy_plan({"max-records-per-party": 10_000}, 4.0, 10)
    assert plan == plan_quantisation(vote_bound=10_000.0, sigma=4.0, num_parties=10)
    assert plan.clipping_range == 16384.0 and plan.step == 2.0**-7  # Top-8 weights on the grid
    with pytest.raises(ValueError, match="max-records-per-party"):
        deploy_plan({"vote-bound": 100.0}, 4.0, 10)
    with pytest.raises(ValueError, match="max-records-per-party"):
        deploy_plan({"max-records-per-party": 0}, 4.0, 10)


def test_party_refuses_a_sigma_below_its_floor_and_bad_round_arguments_are_named() -> None:
    from dpsynth.federated.app import (
        CFG_CLIPPING_RANGE,
        CFG_NUM_PARTIES,
        CFG_QUANTIZATION_RANGE,
        CFG_SIGMA,
        CFG_VOTE_BOUND,
        PartyClient,
    )
    from dpsynth.federated.simulation import federated_noisy_histogram

    rng = np.random.default_rng(3)
    party = PartyData(_unit(rng, 5, 8), rng.integers(0, 2, 5))
    cand, cand_lab = _unit(rng, 6, 8), np.arange(6) % 2
    client = PartyClient(party, 0, functools.partial(topq_vote, q=2), noise_mode="seeded",
                         seed=1, min_sigma=2.0)
    cfg = {CFG_NUM_PARTIES: 3, CFG_VOTE_BOUND: 5.0, CFG_CLIPPING_RANGE: 16.0,
           CFG_QUANTIZATION_RANGE: 2**22}
    with pytest.raises(ValueError, match="below this party's minimum"):
        client.fit([cand, cand_lab], {**cfg, CFG_SIGMA: 1.0})
    out, weight, metrics = client.fit([cand, cand_lab], {**cfg, CFG_SIGMA: 2.0})
    assert weight == 1 and metrics == {} and out[0].shape == (12,)

    parties = [party, party]
    with pytest.raises(ValueError, match="min_parties"):
        federated_noisy_histogram(parties, cand, cand_lab, topq_vote, 1.0, vote_bound=5.0,
                                  seed=0, min_parties=3)
    with pytest.raises(ValueError, match="noise_mode"):
        federated_noisy_histogram(parties, cand, cand_lab, topq_vote, 1.0, vote_bound=5.0,
                                  seed=0, noise_mode="fast")


def test_the_simulation_starts_its_own_ray_or_joins_the_configured_cluster() -> None:
    """``wasp.federated.ray_address``: 'local' starts a two-CPU Ray with one actor for the
    round; an address joins that cluster (no num_cpus, which Ray refuses when joining) with one
    CPU per party actor; a malformed address is a named config error."""
    from dpsynth.config import ConfigError, parse_config
    from dpsynth.federated.simulation import simulation_backend

    local = simulation_backend("local")
    assert local["init_args"]["num_cpus"] == local["client_resources"]["num_cpus"] == 2
    joined = simulation_backend("10.0.0.5:6379")
    assert joined["init_args"] == {"address": "10.0.0.5:6379", "include_dashboard": False}
    assert joined["client_resources"]["num_cpus"] == 1
    assert parse_config({"method": "wasp"}).wasp.federated.ray_address == "local"
    with pytest.raises(ConfigError, match="wasp.federated.ray_address"):
        parse_config({"method": "wasp", "wasp": {"federated": {"ray_address": "cluster"}}})
