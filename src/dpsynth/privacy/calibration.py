"""Noise calibration: the smallest sigma whose planned run meets a target (epsilon, delta)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from dp_accounting import calibrate_dp_mechanism
from dp_accounting.dp_event import DpEvent
from dp_accounting.mechanism_calibration import (
    BracketInterval,
    ExplicitBracketInterval,
    LowerEndpointAndGuess,
    NoBracketIntervalFoundError,
)

from ..files import read_cache_file, user_cache_dir, write_cache_file
from .accountant import Accountant
from .errors import PrivacyConfigError
from .events import GaussianEvent, to_dp_event
from .planned import ReleasePlan, Scaled

# Smallest sigma the search considers (below it every real plan is far above any target).
_SIGMA_MIN = 1e-3

#: a run's releases at any trial noise multiplier (:mod:`dpsynth.privacy.planned`)
Plan = ReleasePlan


def validate_epsilon_delta(epsilon: float, delta: float) -> None:
    """Raise PrivacyConfigError unless epsilon > 0 (finite) and 0 < delta < 1."""
    if not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
        raise PrivacyConfigError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not isinstance(delta, int | float) or not (0.0 < delta < 1.0):
        raise PrivacyConfigError(f"delta must be in the open interval (0, 1), got {delta!r}")


def plan_epsilon(plan: Plan, sigma: float, delta: float, kind: str = "pld") -> float:
    """epsilon at ``delta`` of the events ``plan.at(sigma)``."""
    acc = Accountant(kind)
    acc.extend(plan.at(sigma))
    return acc.epsilon(delta)


def calibrate_gaussian_sigma(
    epsilon: float,
    delta: float,
    plan: Plan,
    kind: str = "pld",
    tol: float = 1e-4,
    *,
    sigma_max: float = 1e7,
) -> float:
    """Smallest sigma (up to ``tol``, rounded towards more noise) such that the run
    ``plan.at(sigma)`` is (epsilon, delta)-DP under accountant ``kind`` (docs/methods.md §0).

    The one calibration of the package, built on ``dp_accounting.calibrate_dp_mechanism``:
    the plan becomes one ``ComposedDpEvent`` per sigma and a fresh :class:`Accountant` judges
    it. For 'pld' the cheap RDP calibration (never below the PLD answer) first gives a tight
    bracket. The returned sigma always meets the target.
    """
    validate_epsilon_delta(epsilon, delta)
    if not (tol > 0):
        raise PrivacyConfigError(f"tol must be > 0, got {tol!r}")

    def event(s: float) -> DpEvent:
        return to_dp_event(plan.at(s))

    def eps_at(s: float) -> float:
        return Accountant(kind).compose(event(s)).get_epsilon(delta)

    # A resumed run, or another run of the same plan in this process, asks again: the answer
    # for the same target, accountant and plan (a value, compared whole) is reused once the
    # accountant confirms it still meets the target.
    key = (float(epsilon), float(delta), kind, float(tol), float(sigma_max), plan)
    cached = _CALIBRATED.get(key)
    if cached is not None and eps_at(cached) <= epsilon:
        return cached
    # Another process (`plan` before `generate`, a resume, a second run of a config) solved the
    # same plan: its answer on disk is taken only when the accountant confirms that it meets
    # the target and that tol less noise would not (a stale or edited entry costs a search).
    disk = SigmaCache()
    stored = disk.get(key)
    if stored is not None and eps_at(stored) <= epsilon and (
            stored - tol <= _SIGMA_MIN or eps_at(stored - tol) > epsilon):
        sigma = stored
    else:
        sigma = _calibrate(epsilon, delta, kind, tol, sigma_max, event, eps_at, plan)
        disk.put(key, sigma)
    if len(_CALIBRATED) >= 256:
        _CALIBRATED.pop(next(iter(_CALIBRATED)))
    _CALIBRATED[key] = sigma
    return sigma


#: calibrate_gaussian_sigma's answers in this process (see the comment there)
_CALIBRATED: dict[tuple, float] = {}


class SigmaCache:
    """Solved noise multipliers on disk, shared by this user's processes
    (``$XDG_CACHE_HOME/dpsynth/noise-calibration.json``): each keyed by a hash of the target,
    the accountant, the plan and dp_accounting's version. A noise multiplier is released in
    every privacy statement, so the file holds nothing a release does not; a file that cannot
    be read or written only costs a search."""

    VERSION = 1
    #: entries kept (the oldest are dropped)
    LIMIT = 1024

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else user_cache_dir() / "noise-calibration.json"

    @staticmethod
    def digest(key: tuple) -> str | None:
        """The entry's name, or None for a key without a stable text form."""
        text = repr((key, version("dp-accounting")))
        return None if " at 0x" in text else hashlib.sha256(text.encode()).hexdigest()

    def _read(self) -> dict[str, float]:
        entries = read_cache_file(self.path, self.VERSION).get("sigma")
        return entries if isinstance(entries, dict) else {}

    def get(self, key: tuple) -> float | None:
        name = self.digest(key)
        value = self._read().get(name) if name else None
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else None

    def put(self, key: tuple, sigma: float) -> None:
        name = self.digest(key)
        if name is None:
            return
        entries = self._read()
        entries.pop(name, None)
        entries[name] = sigma
        while len(entries) > self.LIMIT:
            entries.pop(next(iter(entries)))
        write_cache_file(self.path, {"sigma": entries}, self.VERSION, mode=0o600)


def _calibrate(epsilon: float, delta: float, kind: str, tol: float, sigma_max: float,
               event: Callable[[float], DpEvent], eps_at: Callable[[float], float],
               plan: Plan) -> float:
    """The search of :func:`calibrate_gaussian_sigma` (no cache)."""

    # ('pld' delegates this check to its RDP calibration below, which is never below it)
    if kind != "pld" and eps_at(sigma_max) > epsilon:
        raise PrivacyConfigError(
            f"no sigma <= {sigma_max:g} reaches epsilon={epsilon} at delta={delta}: the plan "
            "has a part that does not depend on sigma and already exceeds the target"
        )
    bracket: BracketInterval
    if kind == "pld":
        # RDP's sigma is never below the PLD one: bracket downwards from it.
        hi = calibrate_gaussian_sigma(epsilon, delta, plan, "rdp", tol, sigma_max=sigma_max)
        lo = 0.8 * hi
        while eps_at(lo) <= epsilon:
            if lo <= _SIGMA_MIN:
                return lo
            hi, lo = lo, max(_SIGMA_MIN, lo / 2.0)
        bracket = ExplicitBracketInterval(lo, hi)
    else:
        if eps_at(_SIGMA_MIN) <= epsilon:
            return _SIGMA_MIN
        bracket = LowerEndpointAndGuess(_SIGMA_MIN, 1.0)
    try:
        sigma = float(
            calibrate_dp_mechanism(
                lambda: Accountant(kind),
                event,
                epsilon,
                delta,
                bracket_interval=bracket,
                tol=tol / 4.0,
            )
        )
    except (NoBracketIntervalFoundError, ValueError) as err:
        raise PrivacyConfigError(
            f"no sigma reaches epsilon={epsilon} at delta={delta} ({err})"
        ) from None
    # Round towards more noise, and never return a sigma that misses the target.
    sigma = min(sigma_max, sigma + tol / 4.0)
    while eps_at(sigma) > epsilon:
        sigma += tol / 2.0
    return sigma


def calibrate_steps(
    epsilon: float,
    delta: float,
    steps: int,
    sensitivity: float = 1.0,
    kind: str = "pld",
    tol: float = 1e-4,
) -> float:
    """sigma for ``steps`` Gaussian releases of L2 sensitivity ``sensitivity`` (e.g. T Aug-PE
    iterations) meeting (epsilon, delta); docs/methods.md §0: eps=1, delta=1e-5, T=10 -> 11.80."""
    validate_epsilon_delta(epsilon, delta)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PrivacyConfigError(f"steps must be an integer >= 1, got {steps!r}")
    if (
        not isinstance(sensitivity, int | float)
        or not math.isfinite(sensitivity)
        or sensitivity <= 0
    ):
        raise PrivacyConfigError(f"sensitivity must be a finite number > 0, got {sensitivity!r}")
    return calibrate_gaussian_sigma(
        epsilon, delta, ReleasePlan((Scaled(GaussianEvent(1.0, sensitivity, steps)),)), kind=kind,
        tol=tol)


def steps_epsilon(
    sigma: float, delta: float, steps: int, sensitivity: float = 1.0, kind: str = "pld"
) -> float:
    """epsilon at ``delta`` of ``steps`` Gaussian releases with noise ``sigma``."""
    if not isinstance(delta, int | float) or not (0.0 < delta < 1.0):
        raise PrivacyConfigError(f"delta must be in the open interval (0, 1), got {delta!r}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise PrivacyConfigError(f"steps must be an integer >= 1, got {steps!r}")
    acc = Accountant(kind)
    acc.add(GaussianEvent(sigma, sensitivity, steps))
    return acc.epsilon(delta)
