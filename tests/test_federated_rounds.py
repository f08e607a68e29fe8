"""Federated rounds are charged before they run: worst-case noise, threshold = min_parties, and
a crash between the charge and the result never yields an unaccounted round (fast, no Flower)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from dpsynth.config import RunConfig
from dpsynth.evolution.strategy import Pool
from dpsynth.federated.app import reconstruction_threshold
from dpsynth.federated.rounds import RoundBudgetSpentError, accounted_round, start_key
from dpsynth.methods.wasp import Wasp, WaspStrategy, worst_case_sigma
from dpsynth.privacy import Accountant, BudgetExceededError, GaussianEvent, PrivacySession
from dpsynth.privacy.noise import SeededNoise

DELTA = 1e-5


def _session(path, eps=None):
    target = None if eps is None else (eps, DELTA)
    return PrivacySession(path, Accountant("pld"), SeededNoise(0), target=target)


def _eps(sigma: float, count: int = 1) -> float:
    acc = Accountant("pld")
    acc.add(GaussianEvent(sigma=sigma, sensitivity=1.0, count=count))
    return acc.epsilon(DELTA)


def test_reconstruction_threshold_is_min_parties():
    assert reconstruction_threshold(5, 3) == 3
    assert reconstruction_threshold(3, 3) == 3  # all parties: any dropout halts SecAgg+
    assert reconstruction_threshold(10, 2) == 2
    with pytest.raises(ValueError, match="min_parties"):
        reconstruction_threshold(3, 4)
    with pytest.raises(ValueError, match="min_parties"):
        reconstruction_threshold(3, 1)


def test_round_is_charged_before_it_runs_and_stored(tmp_path):
    session = _session(tmp_path / "store", eps=10.0)
    event = GaussianEvent(sigma=2.0, sensitivity=1.0, name="topq_votes")
    seen = []

    def run_round():
        # the charge is already committed to the store when the round starts
        seen.append(session.has(start_key("iter0/topq", 1)))
        return np.arange(4.0)

    out = accounted_round(session, "iter0/topq", event, run_round, tmp_path / "res")
    np.testing.assert_array_equal(out, np.arange(4.0))
    assert seen == [True]
    # asked again (e.g. after a resume): the stored result, no new round, no new charge
    again = accounted_round(session, "iter0/topq", event, lambda: pytest.fail("ran again"),
                            tmp_path / "res")
    np.testing.assert_array_equal(again, out)
    assert sum(e["count"] for e in session.accountant.summary()) == 1


def test_budget_too_small_refuses_before_the_round(tmp_path):
    session = _session(tmp_path / "store", eps=0.5)
    event = GaussianEvent(sigma=1.0, sensitivity=1.0, name="topq_votes")  # eps >> 0.5
    with pytest.raises(BudgetExceededError):
        accounted_round(session, "iter0/topq", event, lambda: pytest.fail("round ran"),
                        tmp_path / "res")
    assert session.keys() == []


def test_crash_after_start_charges_the_rerun(tmp_path):
    store, res = tmp_path / "store", tmp_path / "res"
    event = GaussianEvent(sigma=3.0, sensitivity=1.0, name="topq_votes")
    session = _session(store, eps=10.0)

    def crash():
        raise RuntimeError("killed mid-round")

    with pytest.raises(RuntimeError, match="killed"):
        accounted_round(session, "iter0/topq", event, crash, res)
    session.close()
    resumed = _session(store, eps=10.0)  # replays the store: the first attempt is charged
    assert sum(e["count"] for e in resumed.accountant.summary()) == 1
    calls = []
    out = accounted_round(resumed, "iter0/topq", event,
                          lambda: calls.append(1) or np.ones(3), res)
    assert calls == [1] and out.tolist() == [1.0, 1.0, 1.0]
    # the re-run is a second, charged attempt under a new key
    assert resumed.has(start_key("iter0/topq", 2))
    assert sum(e["count"] for e in resumed.accountant.summary()) == 2
    assert resumed.epsilon() == pytest.approx(_eps(3.0, 2), rel=1e-3)


def test_crash_after_start_is_refused_when_the_budget_cannot_take_a_rerun(tmp_path):
    store, res = tmp_path / "store", tmp_path / "res"
    event = GaussianEvent(sigma=3.0, sensitivity=1.0, name="topq_votes")
    eps = 1.1 * _eps(3.0)  # room for one round, not two
    session = _session(store, eps=eps)
    with pytest.raises(ZeroDivisionError):
        accounted_round(session, "iter0/topq", event, lambda: 1 / 0, res)
    session.close()
    resumed = _session(store, eps=eps)
    with pytest.raises(RoundBudgetSpentError, match="budget is spent"):
        accounted_round(resumed, "iter0/topq", event, lambda: pytest.fail("round ran"), res)
    assert sum(e["count"] for e in resumed.accountant.summary()) == 1


class _View:
    """The parts of dpsynth.context.PrivateView that federated WASP reads."""

    def __init__(self, emb: np.ndarray, codes: np.ndarray, run: SimpleNamespace) -> None:
        self.private_embeddings, self.label_codes, self.run = emb, codes, run
        self.texts = [f"record {i}" for i in range(len(codes))]

    def __len__(self) -> int:
        return len(self.label_codes)

    def log(self, message: str) -> None:
        pass


def _wasp_strategy(tmp_path, session, sigma, parties=3, min_parties=2) -> WaspStrategy:
    """The production WaspStrategy with a small private view, its releaser and rngs."""
    from dpsynth.context import Releaser, Rngs

    cfg = RunConfig.model_validate({
        "method": "wasp", "privacy": {"seed": 0, "noise": "seeded"},
        "wasp": {"top_q": 2, "federated": {"parties": parties, "min_parties": min_parties}}})
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(30, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    view = _View(emb, np.zeros(30, dtype=np.int64),
                 SimpleNamespace(root=tmp_path, private=tmp_path / "private"))
    gen = SimpleNamespace(names=["g0"])
    return WaspStrategy(cfg, view, Releaser(session, sigma), gen, Rngs(0))


def _pool(n=6):
    return Pool([f"c{i}" for i in range(n)], np.zeros(n, dtype=np.int64),
                np.zeros(n, dtype=np.int64))


def test_wasp_charges_the_worst_case_before_any_sum(tmp_path, monkeypatch):
    """A budget that fits the full-noise round but not the worst case (only min_parties of P
    noise shares) is refused before Flower runs: the server never sees a sum."""
    import dpsynth.federated as fed_pkg
    from dpsynth.voting import topq_sensitivity

    calls = []
    monkeypatch.setattr(fed_pkg, "federated_noisy_histogram",
                        lambda *a, **k: calls.append(1) or pytest.fail("round ran"))
    sens = topq_sensitivity(2)
    sigma = 2.0  # noise multiplier
    full, worst = _eps(sigma), _eps(worst_case_sigma(sigma, 2, 3))
    assert worst > full
    session = _session(tmp_path / "store", eps=(full + worst) / 2)
    strategy = _wasp_strategy(tmp_path, session, sigma)
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(6, 8)).astype(np.float32)
    with pytest.raises(BudgetExceededError):
        strategy.federated("iter0/topq", _pool(), emb, sens)
    assert calls == [] and session.keys() == []


def test_wasp_round_is_accounted_at_worst_case_sigma(tmp_path, monkeypatch):
    import dpsynth.federated as fed_pkg
    from dpsynth.voting import topq_sensitivity

    session = _session(tmp_path / "store", eps=50.0)
    seen = {}

    def fake_round(parties, emb, labels, vote_fn, sigma, **kw):
        seen["charged_first"] = session.has(start_key("iter0/topq", 1))
        seen["min_parties"] = kw["min_parties"]
        return SimpleNamespace(histogram=np.zeros(2 * len(emb)), parties_present=3)

    monkeypatch.setattr(fed_pkg, "federated_noisy_histogram", fake_round)
    sens = topq_sensitivity(2)
    strategy = _wasp_strategy(tmp_path, session, 2.0)
    out = strategy.federated("iter0/topq", _pool(), np.eye(6, 8, dtype=np.float32), sens)
    assert out.shape == (12,)
    assert seen == {"charged_first": True, "min_parties": 2}
    (event,) = session.accountant.summary()
    # each of P = 3 parties adds a share of std sigma / sqrt(3); charged at min_parties = 2
    # shares, the worst case sqrt(2 / 3) sigma in all
    assert event["mechanism"] == "distributed_discrete_gaussian"
    assert event["sigma"] == pytest.approx(2.0 * sens / math.sqrt(3))
    assert event["parties"] == 2
    assert event["sigma"] * math.sqrt(event["parties"]) == pytest.approx(
        2.0 * sens * math.sqrt(2 / 3))
    assert event["sensitivity"] == pytest.approx(sens) and event["dimension"] == 12


def test_federated_calibration_plans_the_worst_case():
    cfg = RunConfig.model_validate({
        "method": "wasp", "synthesis": {"iterations": 3},
        "wasp": {"federated": {"parties": 4, "min_parties": 2}}})
    from dpsynth.voting import topq_sensitivity

    events = Wasp().release_plan(cfg, 2).at(5.0)
    sens = topq_sensitivity(cfg.wasp.top_q)
    assert [(e.sigma, e.count) for e in events] == [(5.0, 1), (5.0 * sens / 2.0, 3)]
    assert events[1].parties == 2 and events[1].sensitivity == pytest.approx(sens)
    # the worst case: 2 of 4 shares, std sqrt(2) * 5 sens / 2 = sqrt(1 / 2) * 5 sens
    assert events[1].sigma * math.sqrt(2) == pytest.approx(5.0 * sens * math.sqrt(0.5))
    Wasp().validate(cfg, 100, 2)
    bad = RunConfig.model_validate({
        "method": "wasp", "wasp": {"federated": {"parties": 3, "min_parties": 4}}})
    with pytest.raises(ValueError, match="min_parties"):
        Wasp().validate(bad, 100, 2)


def test_the_simulated_split_is_record_local_and_allows_empty_parties() -> None:
    """dpsynth.federated.split: one record more changes only the party it joins (the others
    keep theirs, whatever the record count), the shares are uneven, and a small data set may
    leave a party empty instead of failing (an empty party still adds its noise share)."""
    from dpsynth.federated.split import dirichlet_shares, record_owners, split_records

    shares = dirichlet_shares(5, 0.5, np.random.default_rng(3))
    assert shares.shape == (5,) and shares.sum() == pytest.approx(1.0)
    texts = [f"patient {i} asks about a bill" for i in range(400)]
    labels = np.arange(400) % 3
    key = b"k" * 32
    owners = record_owners(texts, labels, shares, key)
    counts = np.bincount(owners, minlength=5)
    assert counts.sum() == 400 and len(set(counts.tolist())) > 2  # uneven
    # expected counts follow the shares (multinomial, 400 draws)
    assert np.all(np.abs(counts - 400 * shares) < 5 * np.sqrt(400 * shares) + 1)
    more = record_owners([*texts, "one more record"], np.append(labels, 1), shares, key)
    np.testing.assert_array_equal(more[:400], owners)  # nobody else moved
    fewer = record_owners(texts[1:], labels[1:], shares, key)
    np.testing.assert_array_equal(fewer, owners[1:])
    split = split_records(owners, 5)
    assert sorted(np.concatenate(split).tolist()) == list(range(400))
    assert not np.array_equal(owners, record_owners(texts, labels, shares, b"x" * 32))
    tiny = split_records(record_owners(texts[:3], labels[:3], shares, key), 5)
    assert len(tiny) == 5 and sum(len(p) == 0 for p in tiny) >= 2
    with pytest.raises(ValueError, match=">= 2 parties"):
        dirichlet_shares(1, 1.0, np.random.default_rng(0))


def test_wasp_passes_the_configured_bound_not_a_party_size(tmp_path, monkeypatch):
    """The round's vote bound is wasp.federated.max_records_per_party (the config), and the
    exact party sizes go to private/diagnostics.jsonl only."""
    import dpsynth.federated as fed_pkg
    from dpsynth.diagnostics import read_diagnostics
    from dpsynth.voting import topq_sensitivity

    session = _session(tmp_path / "store", eps=50.0)
    seen = {}

    def fake_round(parties, emb, labels, vote_fn, sigma, **kw):
        seen["bound"], seen["sizes"] = kw["vote_bound"], [p.size for p in parties]
        return SimpleNamespace(histogram=np.zeros(2 * len(emb)), parties_present=3)

    monkeypatch.setattr(fed_pkg, "federated_noisy_histogram", fake_round)
    strategy = _wasp_strategy(tmp_path, session, 2.0)
    strategy.federated("iter0/topq", _pool(), np.eye(6, 8, dtype=np.float32),
                       topq_sensitivity(2))
    assert seen["bound"] == 10_000.0  # the documented default
    assert sum(seen["sizes"]) == 30
    (diag,) = read_diagnostics(tmp_path)
    assert diag["party_sizes"] == seen["sizes"] and diag["parties_over_max_records"] == 0
