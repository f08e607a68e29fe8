"""Flower-free parts of federated WASP voting: quantisation plan, the parties' discrete
Gaussian shares on SecAgg+'s grid, validation."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from dpsynth.federated.core import (
    PartyData,
    clip_probability_bound,
    effective_sigma,
    grid_top_q,
    party_submission,
    validate_parties,
)
from dpsynth.privacy.distributed import plan_quantisation
from dpsynth.voting import topq_vote


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_plan_picks_power_of_two_clipping_range_covering_votes_and_noise() -> None:
    plan = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4)
    # 12 + 10 * 3 / sqrt(4) = 27 -> next power of two is 32
    assert plan.clipping_range == 32.0
    assert plan.step == 64.0 / 2**22
    assert math.log2(plan.step).is_integer()  # dyadic grid: 2^-q vote weights are exact
    # a finer vote lattice raises R until the votes lie on the grid
    fine = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4, vote_grid=2.0**-20)
    assert fine.clipping_range == 32.0 and fine.step == 2.0**-20
    assert fine.quantization_range == 2**26
    coarse = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4, vote_grid=2.0**-7)
    assert coarse.quantization_range == 2**22  # already fine enough
    with pytest.raises(ValueError, match="power of two"):
        plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=4, vote_grid=0.3)
    # as fine as the modulus allows (P R < 2^32): then the weights below the step are left
    # out of the votes (Top-Q depth), never rounded
    capped = plan_quantisation(vote_bound=12.0, sigma=3.0, num_parties=200, vote_grid=2.0**-20)
    assert capped.quantization_range == 2**24 and 200 * 2**24 < 2**32
    # C = 16 (12 + 10 * 3 / sqrt(200)), so the step is 32 / 2^24
    assert capped.step == 2.0**-19 and grid_top_q(21, capped.step) == 20
    assert grid_top_q(8, capped.step) == 8
    with pytest.raises(ValueError, match="coarser than a whole vote"):
        grid_top_q(4, 4.0)
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


def _submit(party: PartyData, cand: np.ndarray, cand_lab: np.ndarray, q: int, *,
            sigma: float, parties: int, bound: float, seed: int | None = 5, index: int = 0,
            mode: str = "seeded") -> tuple[np.ndarray, float]:
    plan = plan_quantisation(vote_bound=bound, sigma=sigma, num_parties=parties,
                             vote_grid=2.0 ** -(q - 1))
    sub = party_submission(party, cand, cand_lab, functools.partial(topq_vote, q=q),
                           sigma=sigma, num_parties=parties, vote_bound=bound,
                           clipping_range=plan.clipping_range,
                           quantization_range=plan.quantization_range, noise_mode=mode,
                           seed=seed, party_index=index)
    return sub, plan.step


def test_a_submission_is_the_votes_plus_a_discrete_gaussian_share_on_the_grid() -> None:
    """y_l = clip_B(h_l) + Delta Z_l, Z_l ~ N_Z(0, (sigma / sqrt(P) / Delta)^2): on the grid
    (SecAgg+'s quantisation then has nothing to round), reproducible when seeded, fresh when
    secure, and of the share's variance."""
    from flwr.common.secure_aggregation.quantization import dequantize, quantize

    rng = np.random.default_rng(0)
    party = PartyData(_unit(rng, 9, 8), rng.integers(0, 3, 9))
    cand, cand_lab = _unit(rng, 3000, 8), np.arange(3000) % 3
    h = topq_vote(party.embeddings, party.labels, cand, cand_lab, q=3)
    sub, step = _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0)
    steps = (sub - h) / step
    np.testing.assert_array_equal(steps, np.round(steps))  # the noise is whole grid steps
    assert float(np.var(sub - h)) == pytest.approx(1.0, rel=0.1)  # std 2 / sqrt(4) = 1
    again, _ = _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0)
    assert sub.tobytes() == again.tobytes()  # seeded per party: reproducible
    other, _ = _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0, index=1)
    assert abs(np.corrcoef(sub - h, other - h)[0, 1]) < 0.1  # independent parties
    s1, _ = _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0, mode="secure")
    s2, _ = _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0, mode="secure")
    assert not np.array_equal(s1, s2)  # secure mode ignores the seed
    plan = plan_quantisation(vote_bound=9.0, sigma=2.0, num_parties=4, vote_grid=0.25)
    c, r = plan.clipping_range, plan.quantization_range
    q1 = quantize([sub], c, r)[0]
    np.testing.assert_array_equal(dequantize([q1], c, r)[0], sub)  # exact on SecAgg+'s grid
    with pytest.raises(ValueError, match="noise_mode"):
        _submit(party, cand, cand_lab, 3, sigma=2.0, parties=4, bound=9.0, mode="fast")


def test_votes_over_the_bound_are_clipped_not_refused_and_empty_parties_vote_nothing() -> None:
    """A refusal would make the round's outcome depend on a party's data: votes are clipped
    to [0, B] instead (1-Lipschitz per coordinate, so the sensitivity holds)."""
    rng = np.random.default_rng(1)
    party = PartyData(_unit(rng, 9, 8), np.zeros(9, dtype=int))
    cand, cand_lab = _unit(rng, 4, 8), np.zeros(4, dtype=int)
    h = topq_vote(party.embeddings, party.labels, cand, cand_lab, q=2)
    assert h.max() > 2.0  # 9 records of one label: some candidate gets more than 2
    y, _ = _submit(party, cand, cand_lab, 2, sigma=1.0, parties=3, bound=2.0, seed=0)
    empty = PartyData(np.zeros((0, 8), np.float32), np.zeros(0, dtype=int))
    noise, _ = _submit(empty, cand, cand_lab, 2, sigma=1.0, parties=3, bound=2.0, seed=0)
    np.testing.assert_allclose(y - noise, np.clip(h, 0.0, 2.0), atol=1e-12)  # same share
    assert validate_parties([party, empty]) == 8  # an empty party adds its share only
    # clipping never increases the distance between neighbouring parties' votes
    other = PartyData(party.embeddings[1:], party.labels[1:])
    h2 = topq_vote(other.embeddings, other.labels, cand, cand_lab, q=2)
    y2, _ = _submit(other, cand, cand_lab, 2, sigma=1.0, parties=3, bound=2.0, seed=0)
    assert np.linalg.norm(y - y2) <= np.linalg.norm(h - h2) + 1e-12
    with pytest.raises(ValueError, match=">= 2 parties"):
        validate_parties([party])
    with pytest.raises(ValueError, match="labels"):
        PartyData(_unit(rng, 3, 8), np.zeros(4, dtype=int))
    with pytest.raises(ValueError, match="integer"):
        PartyData(_unit(rng, 3, 8), np.zeros(3))


def test_the_plan_comes_from_public_inputs_only() -> None:
    """C and the grid are functions of (B, sigma, P, R, modulus): the round API takes B from the
    caller (no default from party sizes), and the deployment reads it from its run config."""
    import inspect

    from dpsynth.federated.app import deploy_plan
    from dpsynth.federated.simulation import federated_noisy_histogram

    assert set(inspect.signature(plan_quantisation).parameters) == {
        "vote_bound", "sigma", "num_parties", "clipping_range", "quantization_range",
        "modulus_range", "noise_bound_sds", "vote_grid"}
    bound = inspect.signature(federated_noisy_histogram).parameters["vote_bound"]
    assert bound.default is inspect.Parameter.empty and bound.kind is bound.KEYWORD_ONLY
    plan = deploy_plan({"max-records-per-party": 10_000}, 4.0, 10)
    assert plan == plan_quantisation(vote_bound=10_000.0, sigma=4.0, num_parties=10,
                                     vote_grid=2.0**-7)
    assert plan.clipping_range == 16384.0 and plan.step == 2.0**-7  # Top-8 weights on the grid
    with pytest.raises(ValueError, match="max-records-per-party"):
        deploy_plan({"vote-bound": 100.0}, 4.0, 10)
    with pytest.raises(ValueError, match="max-records-per-party"):
        deploy_plan({"max-records-per-party": 0}, 4.0, 10)


def fit_config(sigma: float, parties: int, bound: float, clip: float, levels: int) -> dict:
    """A party's fit config as the server sends it (federated.app's keys)."""
    from dpsynth.federated import app

    return {app.CFG_SIGMA: sigma, app.CFG_NUM_PARTIES: parties, app.CFG_VOTE_BOUND: bound,
            app.CFG_CLIPPING_RANGE: clip, app.CFG_QUANTIZATION_RANGE: levels}


def test_party_refuses_a_sigma_below_its_floor_and_bad_round_arguments_are_named() -> None:
    from dpsynth.federated.app import PartyClient
    from dpsynth.federated.simulation import federated_noisy_histogram

    rng = np.random.default_rng(3)
    party = PartyData(_unit(rng, 5, 8), rng.integers(0, 2, 5))
    cand, cand_lab = _unit(rng, 6, 8), np.arange(6) % 2
    client = PartyClient(party, 0, functools.partial(topq_vote, q=2), noise_mode="seeded",
                         seed=1, min_sigma=2.0)
    with pytest.raises(ValueError, match="below this party's minimum"):
        client.fit([cand, cand_lab], fit_config(1.0, 3, 5.0, 16.0, 2**22))
    out, weight, metrics = client.fit([cand, cand_lab], fit_config(2.0, 3, 5.0, 16.0, 2**22))
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


@pytest.mark.parametrize("sigma", [0.5, 3.0, 40.0])
def test_the_round_clip_delta_bounds_every_plans_clip_probability(sigma: float) -> None:
    """The delta a round adds (issue 43: the clipping event was stated but not added) is the
    closed form 2 P dim Phi(-k), and bounds the clipping probability of the plan that a
    round of any sigma gets, so it can be fixed before sigma is calibrated."""
    from scipy.stats import norm

    from dpsynth.federated.core import clip_probability_bound, round_clip_delta

    parties, dim = 5, 24
    beta = round_clip_delta(parties, dim)
    assert beta == pytest.approx(2 * parties * dim * norm.sf(10.0), rel=1e-9)
    plan = plan_quantisation(vote_bound=4.0, sigma=sigma, num_parties=parties)
    assert clip_probability_bound(plan, sigma, parties, dim) <= beta * (1 + 1e-12)


def test_federated_wasp_adds_every_rounds_clip_delta_to_its_statement() -> None:
    """The planned rounds' clipping bound leaves the accountant's target and joins the stated
    delta (a fake session of our own boundary returns the accountant's part)."""
    from types import SimpleNamespace

    from dpsynth.config import parse_config
    from dpsynth.federated.core import round_clip_delta
    from dpsynth.methods.base import Outcome
    from dpsynth.methods.wasp import Wasp

    raw = {"method": "wasp", "privacy": {"epsilon": 4.0, "delta": 1e-5},
           "synthesis": {"iterations": 3, "max_candidates": 40},
           "wasp": {"federated": {"parties": 4, "min_parties": 3}}}
    cfg = parse_config(raw)
    beta = 3 * round_clip_delta(4, 80)
    assert beta > 0 and Wasp().release_plan(cfg, 2).delta_outside == pytest.approx(beta)
    targets = []

    def statement(unit: str, target: tuple[float, float]) -> dict:
        targets.append(target)
        return {"epsilon": 3.9, "delta": target[1], "target_delta": target[1]}

    # the run's plan carries it to the statement; beta itself (~1e-20) vanishes next to 1e-5
    # in floating point, so the statement is checked with a visible one
    from dpsynth.methods.pe import plan_pe
    from dpsynth.planning import PlanInputs

    # (labels None: planned before the votes, as a discovering run is; no calibration)
    assert plan_pe(Wasp(), cfg, PlanInputs(100, None)).notes["delta_outside"] == pytest.approx(
        beta)
    job = SimpleNamespace(config=cfg, session=SimpleNamespace(statement=statement),
                          plan=SimpleNamespace(notes={"delta_outside": 1e-6}))
    out = Wasp().guarantee_statement(job, Outcome({}))  # type: ignore[arg-type]
    assert targets == [(4.0, pytest.approx(9e-6))]
    assert out["delta"] == pytest.approx(1e-5) and out["target_delta"] == 1e-5
    raw["wasp"]["federated"]["parties"] = 0
    assert Wasp().release_plan(parse_config(raw), 2).delta_outside == 0.0


def test_a_deployment_party_charges_its_own_ledger_before_its_votes_leave(tmp_path) -> None:
    """Issue 43: a deployed round released a secure sum that no ledger counted. Each party
    charges its own ledger first (its worst case: its own share alone), and refuses a round
    past its cap before anything is drawn; simulated parties carry no budget."""
    from dpsynth.federated.app import PartyClient
    from dpsynth.federated.core import PartyData
    from dpsynth.federated.party_budget import party_budget
    from dpsynth.privacy import (
        Accountant,
        BudgetLedger,
        BudgetRefusedError,
        DistributedDiscreteGaussianEvent,
    )

    rng = np.random.default_rng(0)
    data = tmp_path / "party1.npz"
    emb = rng.normal(size=(12, 4)).astype(np.float32)
    np.savez(data, embeddings=emb / np.linalg.norm(emb, axis=1, keepdims=True),
             labels=np.zeros(12, dtype=np.int64))
    ledger = tmp_path / "ledger.json"
    node = {"data-path": str(data), "ledger": str(ledger), "total-epsilon": 3.0}
    budget = party_budget(data, node)
    sigma, parties = 6.0, 3
    plan = plan_quantisation(vote_bound=4.0, sigma=sigma, num_parties=parties,
                             vote_grid=2.0 ** -7)
    config = fit_config(sigma, parties, 4.0, plan.clipping_range, plan.quantization_range)
    cand = [emb[:5], np.zeros(5, dtype=np.int64)]
    client = PartyClient(PartyData(emb, np.zeros(12, dtype=np.int64)), 1,
                         functools.partial(topq_vote, q=8), noise_mode="secure", seed=None,
                         budget=budget)
    acc = Accountant("pld")
    acc.add(DistributedDiscreteGaussianEvent(
        sigma=sigma / math.sqrt(parties), sensitivity=budget.sensitivity, parties=1,
        dimension=10, grid=plan.step))
    per_round = acc.epsilon(1e-5)
    assert 1.0 < per_round < 3.0  # two rounds do not fit a cap of 3
    client.fit(cand, config)
    (src,) = BudgetLedger(ledger).sources()
    assert src["epsilon"] == pytest.approx(per_round) and src["total_epsilon"] == 3.0
    with pytest.raises(BudgetRefusedError, match="total is epsilon=3"):
        client.fit(cand, config)
    assert BudgetLedger(ledger).sources()[0]["epsilon"] == pytest.approx(per_round)
