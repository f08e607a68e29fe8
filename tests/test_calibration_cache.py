"""calibrate_gaussian_sigma reuses an answer only for the same plan (a value, compared
whole), and only after the accountant confirms it for that plan: a cached sigma can never miss
the target. The same holds for the answers another process left on disk (SigmaCache), which
are also refused when tol less noise would meet the target."""

from __future__ import annotations

import json
import stat

import pytest

from dpsynth.privacy import Accountant, GaussianEvent, ReleasePlan, Scaled
from dpsynth.privacy import calibration as cal

EPS, DELTA = 2.0, 1e-5


def _eps(plan: ReleasePlan, sigma: float, kind: str) -> float:
    acc = Accountant(kind)
    acc.extend(plan.at(sigma))
    return acc.epsilon(DELTA)


def _plan(count: int) -> ReleasePlan:
    return ReleasePlan((Scaled(GaussianEvent(sigma=1.0, sensitivity=1.0, count=count)),))


@pytest.fixture(autouse=True)
def _empty_cache(tmp_path, monkeypatch) -> None:
    cal._CALIBRATED.clear()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _counted(monkeypatch) -> list[float]:
    searches: list[float] = []
    search = cal._calibrate

    def counted(*args, **kwargs) -> float:
        searches.append(args[0])
        return search(*args, **kwargs)

    monkeypatch.setattr(cal, "_calibrate", counted)
    return searches


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_the_same_plan_is_answered_once_with_the_same_sigma(kind: str, monkeypatch) -> None:
    searches = _counted(monkeypatch)
    first = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(3), kind=kind)
    searched = len(searches)
    again = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(3), kind=kind)  # an equal value
    assert searched >= 1 and len(searches) == searched  # answered from the cache
    assert again == first and _eps(_plan(3), again, kind) <= EPS


def test_another_plan_is_calibrated_for_itself() -> None:
    low = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(2), kind="rdp")
    high = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(20), kind="rdp")
    assert _eps(_plan(20), low, "rdp") > EPS  # the first answer would miss the target ...
    assert _eps(_plan(20), high, "rdp") <= EPS < _eps(_plan(20), high * 0.99, "rdp")  # ... so
    # the second plan got its own


def test_a_cached_answer_is_confirmed_before_it_is_reused() -> None:
    plan = _plan(3)
    key = (EPS, DELTA, "rdp", 1e-4, 1e7, plan)
    cal._CALIBRATED[key] = 0.01  # an answer that misses the target (a stale or bad entry)
    sigma = cal.calibrate_gaussian_sigma(EPS, DELTA, plan, kind="rdp")
    assert sigma > 0.01 and _eps(plan, sigma, "rdp") <= EPS


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_another_process_reuses_the_answer_on_disk(kind: str, monkeypatch) -> None:
    first = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(3), kind=kind)
    cal._CALIBRATED.clear()  # a new process: only the disk remembers
    searches = _counted(monkeypatch)
    again = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(3), kind=kind)
    assert searches == [] and again == first
    path = cal.SigmaCache().path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())["sigma"]  # hashes and noise multipliers only
    assert all(len(k) == 64 and isinstance(v, float) for k, v in stored.items())
    other = cal.calibrate_gaussian_sigma(EPS, DELTA, _plan(4), kind=kind)
    assert len(searches) >= 1 and _eps(_plan(4), other, kind) <= EPS  # its own search


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_an_edited_entry_on_disk_is_not_used(factor: float, monkeypatch) -> None:
    """Too little noise would miss the target; too much would waste utility: either is
    found by the accountant, and the search runs again."""
    plan = _plan(3)
    first = cal.calibrate_gaussian_sigma(EPS, DELTA, plan, kind="rdp")
    cache = cal.SigmaCache()
    data = json.loads(cache.path.read_text())
    data["sigma"] = {k: v * factor for k, v in data["sigma"].items()}
    cache.path.write_text(json.dumps(data))
    cal._CALIBRATED.clear()
    searches = _counted(monkeypatch)
    again = cal.calibrate_gaussian_sigma(EPS, DELTA, plan, kind="rdp")
    assert len(searches) == 1 and again == first
    assert cache.get((EPS, DELTA, "rdp", 1e-4, 1e7, plan)) == first  # the entry is mended
