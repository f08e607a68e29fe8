"""calibrate_gaussian_sigma reuses an answer only after the accountant confirms it for the plan
at hand: a cached sigma can never miss the target."""

from __future__ import annotations

import pytest

from dpsynth.privacy import Accountant, GaussianEvent
from dpsynth.privacy import calibration as cal

EPS, DELTA = 2.0, 1e-5


def _eps(plan: cal.Plan, sigma: float, kind: str) -> float:
    acc = Accountant(kind)
    acc.extend(plan(sigma))
    return acc.epsilon(DELTA)


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    cal._CALIBRATED.clear()


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_the_same_plan_is_answered_once_with_the_same_sigma(kind: str) -> None:
    calls: list[float] = []

    def plan(s: float) -> list[GaussianEvent]:
        calls.append(s)
        return [GaussianEvent(sigma=s, sensitivity=1.0, count=3)]

    first = cal.calibrate_gaussian_sigma(EPS, DELTA, plan, kind=kind)
    searched = len(calls)
    calls.clear()
    again = cal.calibrate_gaussian_sigma(EPS, DELTA, plan, kind=kind)
    assert len(calls) <= 3 < searched  # two probes and the confirmation, no search
    assert again == first and _eps(plan, again, kind) <= EPS


def test_a_plan_that_only_agrees_at_the_probes_is_calibrated_for_itself() -> None:
    def cheap(s: float) -> list[GaussianEvent]:
        return [GaussianEvent(sigma=s, sensitivity=1.0, count=2)]

    def costly(s: float) -> list[GaussianEvent]:  # same events at sigma 1 and 3 only
        return cheap(s) if s in (1.0, 3.0) else [GaussianEvent(sigma=s, sensitivity=1.0,
                                                               count=20)]

    low = cal.calibrate_gaussian_sigma(EPS, DELTA, cheap, kind="rdp")
    high = cal.calibrate_gaussian_sigma(EPS, DELTA, costly, kind="rdp")
    assert _eps(costly, low, "rdp") > EPS  # the cached answer would miss the target ...
    assert _eps(costly, high, "rdp") <= EPS < _eps(costly, high * 0.99, "rdp")  # ... so not used
