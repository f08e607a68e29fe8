"""Accountants, conversions, calibration and the privacy CLI against known values."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from typer.testing import CliRunner

from dpsynth.privacy import (
    Accountant,
    ExponentialEvent,
    GaussianEvent,
    PrivacyConfigError,
    ReleasePlan,
    Scaled,
    ZCDPEvent,
    calibrate_gaussian_sigma,
    calibrate_steps,
    event_from_dict,
    gdp_delta,
    gdp_epsilon,
    overlapping,
    steps_epsilon,
    zcdp_to_delta_cks,
    zcdp_to_eps_cks,
    zcdp_to_eps_standard,
)

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------- reference values (docs/methods.md §0)


@pytest.mark.parametrize("kind", ["pld", "gdp"])
def test_sigma15_t10_gives_eps_07686(kind: str) -> None:
    acc = Accountant(kind)
    for _ in range(10):
        acc.add(GaussianEvent(sigma=15.0, sensitivity=1.0))
    assert acc.epsilon(1e-5) == pytest.approx(0.7686, abs=1e-3)


@pytest.mark.parametrize("kind", ["pld", "gdp"])
def test_calibrate_eps1_t10_gives_sigma_1180(kind: str) -> None:
    sigma = calibrate_steps(1.0, 1e-5, 10, kind=kind)
    assert sigma == pytest.approx(11.80, abs=0.01)


def test_gdp_closed_form_values() -> None:
    mu = math.sqrt(10) / 15
    assert gdp_epsilon(mu, 1e-5) == pytest.approx(0.7686, abs=1e-4)
    # delta(eps) is the exact inverse of epsilon(delta).
    for m, d in [(0.5, 1e-5), (1.0, 1e-3), (3.0, 1e-6)]:
        assert gdp_delta(m, gdp_epsilon(m, d)) == pytest.approx(d, rel=1e-6)
    # mu = 1 at eps = 0: delta = Phi(1/2) - Phi(-1/2) = 0.382925
    assert gdp_delta(1.0, 0.0) == pytest.approx(0.3829249, abs=1e-6)


# ------------------------------------------------------------------ agreement between kinds


@pytest.mark.parametrize(("sigma", "steps"), [(2.0, 1), (5.0, 20), (30.0, 100)])
def test_pld_matches_gdp_and_rdp_is_looser(sigma: float, steps: int) -> None:
    eps = {}
    for kind in ("pld", "gdp", "rdp", "zcdp"):
        acc = Accountant(kind)
        acc.add(GaussianEvent(sigma, 1.0, count=steps))
        eps[kind] = acc.epsilon(1e-5)
    assert eps["pld"] == pytest.approx(eps["gdp"], rel=2e-3)
    # The Gaussian is exactly rho-zCDP, so RDP and zCDP with CKS conversion agree closely and
    # both are looser than the exact GDP profile (by less than 20 % here).
    assert eps["rdp"] == pytest.approx(eps["zcdp"], rel=1e-2)
    assert eps["gdp"] < eps["rdp"] < 1.2 * eps["gdp"]


def test_sensitivity_scales_like_sigma() -> None:
    a, b = Accountant("pld"), Accountant("pld")
    a.add(GaussianEvent(10.0, 2.0, count=5))
    b.add(GaussianEvent(5.0, 1.0, count=5))
    assert a.epsilon(1e-5) == pytest.approx(b.epsilon(1e-5), rel=1e-6)


def test_subsampled_gaussian_pld_vs_rdp() -> None:
    ev = GaussianEvent(1.0, 1.0, count=1000, sampling_rate=0.01)
    pld, rdp = Accountant("pld"), Accountant("rdp")
    pld.add(ev)
    rdp.add(ev)
    e_pld, e_rdp = pld.epsilon(1e-5), rdp.epsilon(1e-5)
    # Subsampling amplifies: far below the full-batch value, and PLD is tighter than RDP.
    full = Accountant("gdp")
    full.add(GaussianEvent(1.0, 1.0, count=1000))
    assert e_pld < e_rdp < full.epsilon(1e-5) / 10
    assert e_pld > 0.5 * e_rdp
    # Cross-check with dp_accounting's own RDP accountant.
    ref = rdp_lib.RdpAccountant()
    ref.compose(dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.0)), 1000)
    assert e_rdp == pytest.approx(ref.get_epsilon(1e-5), rel=0.05)
    assert e_rdp <= ref.get_epsilon(1e-5) + 1e-9


def test_an_rdp_order_that_rounds_below_zero_counts_as_zero(caplog) -> None:
    """At a noise multiplier of 1e7 (a calibration's first check) a subsampled Gaussian's RDP
    sums round below 0 at most orders. A divergence is never negative: those orders count as
    0 and go through the conversion like any other (dp_accounting's conversion would warn
    once per order, 46 lines in a run's log, and read each such order's epsilon as 0)."""
    import logging

    from dpsynth.privacy.accountant import RDP_ORDERS, _rdp_curve, _rdp_vector

    ev = GaussianEvent(1e7, 1.0, count=63, sampling_rate=0.016)
    orders = np.asarray(RDP_ORDERS)
    raw = _rdp_vector({("gaussian", 1e7, 0.016): 63}, orders)
    assert (raw < 0).any()  # the rounding this guards against, still there
    curve = _rdp_curve({("gaussian", 1e7, 0.016): 63}, orders)
    assert (curve >= 0).all() and (curve >= raw).all()
    assert np.array_equal(curve[raw >= 1e-15], raw[raw >= 1e-15])
    with caplog.at_level(logging.WARNING):
        for kind in ("rdp", "pld"):
            acc = Accountant(kind)
            acc.add(ev)
            # (0, delta) and no less: the bound of a curve of zeros at the largest orders
            assert acc.epsilon(1e-5) == pytest.approx(0.0, abs=1e-9)
            assert 0.0 <= acc.delta(0.0) <= 1e-5
    assert not [r for r in caplog.records if "Negative Renyi" in r.getMessage()]
    # the same conversion as dp_accounting's on the clipped curve
    assert Accountant._rdp_epsilon({("gaussian", 1e7, 0.016): 63}, 1e-5) == \
        rdp_lib.compute_epsilon(orders, curve, 1e-5)[0]


@pytest.mark.parametrize("kind", ["zcdp", "gdp"])
def test_subsampled_gaussian_refused_by_closed_forms(kind: str) -> None:
    acc = Accountant(kind)
    with pytest.raises(PrivacyConfigError, match="subsampled.*votes"):
        acc.add(GaussianEvent(1.0, 1.0, sampling_rate=0.5, name="votes"))
    assert acc.events == []


def test_gdp_refuses_non_gaussian() -> None:
    acc = Accountant("gdp")
    with pytest.raises(PrivacyConfigError, match="ExponentialEvent.*theta"):
        acc.add(ExponentialEvent(0.4, name="theta"))
    with pytest.raises(PrivacyConfigError, match="ZCDPEvent"):
        acc.add(ZCDPEvent(0.1))


# ------------------------------------------------------------------ zCDP


def test_gaussian_rho() -> None:
    acc = Accountant("zcdp")
    acc.add(GaussianEvent(sigma=4.0, sensitivity=2.0, count=3))
    assert acc.rho() == pytest.approx(3 * 2.0**2 / (2 * 4.0**2))
    acc.add(ExponentialEvent(0.4, count=5))
    acc.add(ZCDPEvent(0.01, count=7))
    assert acc.rho() == pytest.approx(3 * 4 / 32 + 5 * 0.4**2 / 8 + 7 * 0.01)
    assert acc.epsilon(1e-5) == pytest.approx(zcdp_to_eps_cks(acc.rho(), 1e-5))


@pytest.mark.parametrize("rho", [1e-4, 0.01, 0.1, 1.0, 5.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_cks_conversion(rho: float, delta: float) -> None:
    std = zcdp_to_eps_standard(rho, delta)
    cks = zcdp_to_eps_cks(rho, delta)
    assert std == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    assert 0 < cks <= std
    # dp_accounting's RDP accountant with a ZCDpEvent uses the same conversion on a grid of
    # orders, so it can only be (slightly) looser; with a dense grid it agrees closely.
    ref = rdp_lib.RdpAccountant(orders=list(1.0 + np.geomspace(1e-3, 1e4, 3000)))
    ref.compose(dp_event.ZCDpEvent(rho))
    ref_eps = ref.get_epsilon(delta)
    assert cks <= ref_eps + 1e-9
    assert cks == pytest.approx(ref_eps, rel=1e-3)
    # delta <-> eps inverse.
    assert zcdp_to_delta_cks(rho, cks) == pytest.approx(delta, rel=1e-3)


def test_dp_synrag_paper_budget() -> None:
    """docs/methods.md §4: rho_hist = 0.1 + L (eps_theta^2/8 + 1/(2 sigma_mu^2) + T/2 (c/tau)^2)."""
    acc = Accountant("zcdp")
    acc.add(ZCDPEvent(0.1, name="keyword_hist"))
    acc.add(overlapping(ExponentialEvent(0.4, name="threshold"), 5))
    acc.add(overlapping(GaussianEvent(10.0, 1.0, name="centre"), 5))
    acc.add(overlapping(ZCDPEvent(0.5 * (0.1 / 1.0) ** 2, count=70, name="tokens"), 5))
    rho = 0.1 + 5 * (0.4**2 / 8 + 1 / 200 + 35 * 0.01)
    assert acc.rho() == pytest.approx(rho)
    assert acc.epsilon(1e-3) <= zcdp_to_eps_standard(rho, 1e-3)


def test_zcdp_in_pld_uses_rdp() -> None:
    ev = ZCDPEvent(0.05, count=20)
    pld, rdp = Accountant("pld"), Accountant("rdp")
    pld.add(ev)
    rdp.add(ev)
    assert pld.epsilon(1e-5) == pytest.approx(rdp.epsilon(1e-5))
    assert rdp.epsilon(1e-5) == pytest.approx(zcdp_to_eps_cks(1.0, 1e-5), rel=0.02)


# ------------------------------------------------------------------ exponential (pure DP)


@pytest.mark.parametrize("kind", ["pld", "rdp", "zcdp"])
def test_exponential_composed(kind: str) -> None:
    many = Accountant(kind)
    many.add(ExponentialEvent(0.1, count=100))
    eps = many.epsilon(1e-5)
    advanced = math.sqrt(2 * 100 * math.log(1e5)) * 0.1 + 100 * 0.1 * math.expm1(0.1)
    assert 1.0 < eps < advanced < 10.0  # better than advanced and basic composition


def test_pld_pure_dp_single() -> None:
    """One eps-DP mechanism in the PLD is (eps, ~0)-DP; RDP alone is a bit looser."""
    acc = Accountant("pld")
    acc.add(ExponentialEvent(1.0))
    assert acc.epsilon(1e-6) == pytest.approx(1.0, abs=1e-3)
    assert acc.delta(1.0 + 1e-3) < 1e-9
    # At eps = 0 the generic eps-DP pair has delta = (e - 1) / (e + 1); the reported value may
    # be lower (the bounded-range RDP bound of the exponential mechanism), never higher.
    assert 0.1 < acc.delta(0.0) <= math.expm1(1.0) / (math.e + 1) + 1e-9
    rdp = Accountant("rdp")
    rdp.add(ExponentialEvent(1.0))
    assert rdp.epsilon(1e-6) == pytest.approx(1.0, abs=1e-2)


# ------------------------------------------------------------------ events and summary


def test_event_roundtrip_and_overlapping() -> None:
    events = [
        GaussianEvent(3.0, 1.5, count=2, sampling_rate=0.1, name="votes"),
        ExponentialEvent(0.4, name="theta"),
        ZCDPEvent(0.02, count=70, name="tokens"),
    ]
    for ev in events:
        d = json.loads(json.dumps(ev.to_dict()))
        assert event_from_dict(d) == ev
        assert type(ev).from_dict(d) == ev
    assert overlapping(events[2], 5).count == 350
    with pytest.raises(PrivacyConfigError, match="sigma"):
        GaussianEvent(-1.0, 1.0)
    with pytest.raises(PrivacyConfigError, match="count"):
        ZCDPEvent(0.1, count=0)


def test_summary_groups_counts_and_copy() -> None:
    acc = Accountant("pld")
    for _ in range(3):
        acc.add(GaussianEvent(5.0, 1.0, name="votes"))
    acc.add(GaussianEvent(5.0, 1.0, name="labels"))
    rows = acc.summary()
    by_name = {r["name"]: r for r in rows}
    assert by_name["votes"]["count"] == 3 and by_name["labels"]["count"] == 1
    assert by_name["votes"]["mu"] == pytest.approx(0.2)
    c = acc.copy()
    c.add(GaussianEvent(5.0, 1.0))
    assert len(acc.events) == 4 and len(c.events) == 5
    assert c.epsilon(1e-5) > acc.epsilon(1e-5)
    assert acc.epsilon_if_added(GaussianEvent(5.0, 1.0), 1e-5) == pytest.approx(c.epsilon(1e-5))


# ------------------------------------------------------------------ calibration


@pytest.mark.parametrize(
    ("eps", "delta", "steps", "kind"),
    [(1.0, 1e-5, 10, "pld"), (4.0, 1e-6, 5, "rdp"), (2.0, 1e-5, 20, "zcdp"), (0.5, 1e-4, 3, "gdp")],
)
def test_calibration_round_trip(eps: float, delta: float, steps: int, kind: str) -> None:
    sigma = calibrate_steps(eps, delta, steps, kind=kind)
    got = steps_epsilon(sigma, delta, steps, kind=kind)
    assert got <= eps
    assert got == pytest.approx(eps, abs=2e-3)
    # A little less noise breaks the target: sigma is (near) the smallest that works.
    assert steps_epsilon(sigma * 0.99, delta, steps, kind=kind) > eps


def test_calibrate_plan_with_label_counts() -> None:
    plan = ReleasePlan((Scaled(GaussianEvent(1.0, 1.0, count=10, name="votes")),
                        Scaled(GaussianEvent(1.0, 1.0, name="labels"))))
    sigma = calibrate_gaussian_sigma(1.0, 1e-5, plan)
    # 11 releases of sensitivity 1 = sigma * sqrt(11/10) of the 10-step sigma.
    assert sigma == pytest.approx(11.797 * math.sqrt(1.1), rel=2e-3)
    acc = Accountant("pld")
    acc.extend(plan.at(sigma))
    assert acc.epsilon(1e-5) <= 1.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((0.0, 1e-5, 10), "epsilon"),
        ((-1.0, 1e-5, 10), "epsilon"),
        ((1.0, 0.0, 10), "delta"),
        ((1.0, 1.0, 10), "delta"),
        ((1.0, 1e-5, 0), "steps"),
    ],
)
def test_calibration_validates(args: tuple, field: str) -> None:
    with pytest.raises(PrivacyConfigError, match=field):
        calibrate_steps(*args)
    with pytest.raises(PrivacyConfigError, match="sensitivity"):
        calibrate_steps(1.0, 1e-5, 10, sensitivity=0.0)


# ------------------------------------------------------------------ CLI


def test_cli_calibrate_and_epsilon_json() -> None:
    from dpsynth.cli import app

    runner = CliRunner()
    res = runner.invoke(
        app,
        ["privacy", "calibrate", "--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--json"],
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sigma"] == pytest.approx(11.80, abs=0.01)
    res = runner.invoke(
        app, ["privacy", "epsilon", "--sigma", "15", "--delta", "1e-5", "--steps", "10", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["epsilon"] == pytest.approx(0.7686, abs=1e-3)
    res = runner.invoke(
        app,
        [
            "privacy",
            "epsilon",
            "--sigma",
            "15",
            "--delta",
            "1e-5",
            "--steps",
            "10",
            "--accountant",
            "gdp",
        ],
    )
    assert res.exit_code == 0 and "0.7686" in res.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["calibrate", "--epsilon", "-1", "--delta", "1e-5", "--steps", "10"], "epsilon"),
        (["calibrate", "--epsilon", "1", "--delta", "1.5", "--steps", "10"], "delta"),
        (["calibrate", "--epsilon", "1", "--delta", "1e-5", "--steps", "0"], "steps"),
        (["epsilon", "--sigma", "15", "--delta", "0", "--steps", "10"], "delta"),
        (["epsilon", "--sigma", "-2", "--delta", "1e-5", "--steps", "10"], "sigma"),
        (
            ["epsilon", "--sigma", "2", "--delta", "1e-5", "--steps", "3", "--accountant", "x"],
            "accountant",
        ),
    ],
)
def test_cli_bad_input_exit_2(argv: list[str], needle: str) -> None:
    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["privacy", *argv, "--json"])
    assert res.exit_code == 2
    assert needle in res.output
    assert "Traceback" not in res.output
    assert res.stdout.strip() == ""  # nothing on stdout: --json consumers see no fake result


def test_cli_subprocess() -> None:
    exe = Path(sys.executable).parent / "dpsynth"
    if not exe.exists():
        exe = REPO / ".venv" / "bin" / "dpsynth"
    cmd = [str(exe)]
    out = subprocess.run(
        [*cmd, "privacy", "epsilon", "--sigma", "15", "--delta", "1e-5", "--steps", "10", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(out.stdout)["epsilon"] == pytest.approx(0.7686, abs=1e-3)


def test_rdp_orders_cover_small_rho() -> None:
    # Tiny total rho needs large orders; the grid must still give a value close to CKS.
    acc = Accountant("rdp")
    acc.add(ZCDPEvent(1e-5))
    assert acc.epsilon(1e-5) == pytest.approx(zcdp_to_eps_cks(1e-5, 1e-5), rel=0.05)
    assert np.isfinite(acc.epsilon(1e-10))


# ------------------------------------------------------------------ dp_accounting's interface


def test_accountant_is_a_dp_accounting_accountant() -> None:
    import dp_accounting

    from dpsynth.privacy import PureDpEvent, to_dp_event

    acc = Accountant("pld")
    assert isinstance(acc, dp_accounting.PrivacyAccountant)
    # dp_accounting events compose like the named release events they stand for
    acc.compose(dp_accounting.GaussianDpEvent(15.0), 10)
    named = Accountant("pld")
    named.add(GaussianEvent(15.0, 1.0, count=10))
    assert acc.get_epsilon(1e-5) == pytest.approx(named.epsilon(1e-5)) == pytest.approx(
        0.76856, abs=2e-4
    )
    assert named.ledger == dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(15.0), 10
    )
    ev = to_dp_event([GaussianEvent(3.0, 1.5, sampling_rate=0.1), ExponentialEvent(0.4)])
    assert isinstance(ev, dp_accounting.ComposedDpEvent)
    assert ev.events[1] == PureDpEvent(0.4, True)
    # Laplace = pure eps = 1 / noise multiplier: one of them alone is (1, 0)-DP
    lap = Accountant("pld").compose(dp_accounting.LaplaceDpEvent(1.0))
    assert lap.get_epsilon(1e-9) == pytest.approx(1.0, abs=1e-3)
    assert Accountant("rdp").compose(dp_accounting.ZCDpEvent(0.02), 70).get_epsilon(
        1e-5
    ) == pytest.approx(Accountant("rdp").compose(ZCDPEvent(0.02, 70).dp_event()).epsilon(1e-5))
    gdp = Accountant("gdp")
    assert not gdp.supports(dp_accounting.LaplaceDpEvent(1.0))
    assert not Accountant("zcdp").supports(
        dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0))
    )
    assert not Accountant("pld").supports(dp_accounting.RandomizedResponseDpEvent(0.5, 2))
    with pytest.raises(dp_accounting.UnsupportedEventError):
        gdp.compose(dp_accounting.LaplaceDpEvent(1.0))


def test_calibrate_dp_mechanism_drives_the_accountant() -> None:
    """dp_accounting's own calibration on our accountant agrees with the package's one."""
    import dp_accounting

    sigma = dp_accounting.calibrate_dp_mechanism(
        lambda: Accountant("pld"),
        lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), 10),
        1.0,
        1e-5,
        dp_accounting.LowerEndpointAndGuess(1.0, 2.0),
        tol=1e-4,
    )
    assert sigma == pytest.approx(11.7973, abs=2e-3)
    assert calibrate_steps(1.0, 1e-5, 10) == pytest.approx(sigma, abs=2e-3)


def test_no_event_class_is_named_like_one_of_dp_accountings() -> None:
    """An upgrade of dp_accounting that adds a class of the same name (it has discussed a
    discrete Gaussian event) must not silently change which class an ``isinstance`` sees."""
    import inspect

    from dp_accounting import dp_event as theirs

    import dpsynth.privacy.accountant as our_accountant
    import dpsynth.privacy.events as our_events

    their_names = {n for n, v in vars(theirs).items() if inspect.isclass(v)}
    ours = {n for m in (our_events, our_accountant) for n, v in vars(m).items()
            if inspect.isclass(v) and v.__module__ == m.__name__}
    assert ours, "no classes found: the check would pass vacuously"
    assert not ours & their_names


def test_a_small_noise_multiplier_floods_no_warning_and_loses_no_soundness(caplog) -> None:
    """dp_accounting warns once per RDP order whose series does not converge (an infinite RDP
    there: a looser, still sound bound); a dp_finetune run printed ~440 of them. The
    accountant keeps them off the terminal (the orders stay excluded, as dp_accounting does)."""
    import logging

    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    from dpsynth.privacy import Accountant, GaussianEvent

    event = dp_event.PoissonSampledDpEvent(0.064, dp_event.GaussianDpEvent(0.782))
    with caplog.at_level(logging.WARNING):
        rdp_lib.RdpAccountant().compose(event, 16)
    assert any("failed to converge" in r.getMessage() for r in caplog.records)  # it can fail
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        acc = Accountant("rdp")
        acc.add(GaussianEvent(0.782, 1.0, 16, 0.064, "dp_sgd"))
        eps = acc.epsilon(1e-5)
    assert not any("failed to converge" in r.getMessage() for r in caplog.records)
    assert logging.getLogger("absl").level == logging.NOTSET  # restored
    assert 0 < eps < float("inf")


def test_subsampled_gaussian_rdp_is_dp_accountings_to_the_bit() -> None:
    """The RDP accountant keeps one Poisson-subsampled Gaussian step's curve per (q, noise
    multiplier) and reuses it at other step counts (a DP-SGD run's per-step reports): the
    epsilon is dp_accounting's own RdpAccountant's, bit for bit, first time and again."""
    from dpsynth.privacy.accountant import RDP_ORDERS

    orders = [a for a in RDP_ORDERS if a <= 1024]
    for steps in (94, 40, 94):  # a new step count, then the first again: the kept curve
        events = [GaussianEvent(0.78, 1.0, steps, 0.032, "dp_sgd"),
                  GaussianEvent(1.1, 1.0, 3, 0.016, "other")]
        ours = Accountant("rdp")
        ours.extend(events)
        ref = rdp_lib.RdpAccountant(orders=orders)
        ref.compose(dp_event.PoissonSampledDpEvent(0.032, dp_event.GaussianDpEvent(0.78)), steps)
        ref.compose(dp_event.PoissonSampledDpEvent(0.016, dp_event.GaussianDpEvent(1.1)), 3)
        assert ours.epsilon(1e-5) == ref.get_epsilon(1e-5)


def test_an_answer_is_computed_once_per_process_for_the_same_events(monkeypatch) -> None:
    """Accountants of the same kind, discretisation and composed events share their answers
    (a calibration asks several fresh accountants the same question); another event count,
    kind or query is computed for itself, and the shared answer is the one computed."""
    import dpsynth.privacy.accountant as accountant_mod
    from dpsynth.privacy import Accountant, GaussianEvent

    monkeypatch.setattr(accountant_mod, "_ANSWERS", {})
    calls: list[str] = []
    computed = Accountant._epsilon

    def counted(self, groups, delta):
        calls.append(self.kind)
        return computed(self, groups, delta)

    monkeypatch.setattr(Accountant, "_epsilon", counted)

    def eps(kind: str, count: int, delta: float = 1e-5) -> float:
        acc = Accountant(kind)
        acc.add(GaussianEvent(3.0, 1.0, count))
        return acc.epsilon(delta)

    first = eps("pld", 7)
    assert eps("pld", 7) == first and calls == ["pld"]  # a fresh accountant, not recomputed
    assert eps("pld", 8) > first and eps("rdp", 7) >= first and eps("pld", 7, 1e-6) > first
    assert calls == ["pld", "pld", "rdp", "pld"]
    monkeypatch.setattr(accountant_mod, "_ANSWERS", {})
    assert eps("pld", 7) == first and len(calls) == 5  # the same answer, computed again
