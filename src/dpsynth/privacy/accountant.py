"""Privacy accounting: compose the events of a run and convert to (epsilon, delta).

Kinds (docs/methods.md §0):

- ``"pld"`` (default): privacy loss distributions from ``dp_accounting`` (Gaussian, Poisson-
  subsampled Gaussian, and exponential mechanisms as generic pure eps-DP; pessimistic
  discretisation). epsilon is ALSO computed with the RDP accountant below and the smaller of the
  two (both sound upper bounds for the same run) is reported; for Gaussian runs that is the PLD
  value. zCDP events have no PLD: a run holding any is reported by RDP alone. Other pure-DP
  events (:class:`PureDpEvent` without bounded range, ``LaplaceDpEvent``) are RDP
  min(eps, alpha eps^2 / 2) (pure DP implies eps^2/2-zCDP).
- ``"rdp"``: Renyi DP on a grid of orders; Gaussians via ``dp_accounting``; rho-zCDP as
  RDP(alpha) = rho * alpha (exact); exponential as min(eps, alpha eps^2 / 8) per order (pure DP
  and bounded-range zCDP, Cesar & Rogers 2021). Conversion to (eps, delta) is
  ``dp_accounting``'s (Canonne-Kamath-Steinke / Asoodeh et al.).
- ``"zcdp"``: rho adds up; Gaussian rho = Delta^2 / (2 sigma^2), exponential rho = eps^2 / 8;
  conversion by :func:`zcdp_to_eps_cks`. Subsampled Gaussians are refused.
- ``"gdp"``: Gaussian DP closed form, mu = sqrt(sum count (Delta / sigma)^2). Only full-batch
  continuous Gaussian events (anything else is refused at ``add``, discrete Gaussians too:
  their tradeoff curve is not exactly mu-GDP).

Discrete Gaussian releases (docs/methods.md §0): rho = Delta^2 / (2 sigma^2) in every kind
(Canonne-Kamath-Steinke 2020, Theorem 14; RDP alpha rho). With a known shift profile the
'pld' kind composes dp_accounting's discrete Gaussian PLD (``from_discrete_gaussian_mechanism``,
pessimistic) of each shift; without one the release has no PLD and the run is reported by RDP.
A sum of P parties' discrete Gaussian shares is RDP min(alpha eps^2 / 2 + tau d,
(alpha / 2)(eps + tau sqrt(d))^2) (Kairouz, Liu & Steinke 2021), rho = (eps + tau sqrt(d))^2 / 2
for 'zcdp', no PLD.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation, PrivacyAccountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
from scipy import optimize
from scipy.special import log_ndtr

from .errors import PrivacyConfigError
from .events import (
    RELEASE_EVENTS,
    DiscreteGaussianEvent,
    DistributedDiscreteGaussianDpEvent,
    Event,
    ExponentialEvent,
    GaussianEvent,
    LatticeDiscreteGaussianDpEvent,
    PureDpEvent,
    as_event_list,
)

KINDS = ("pld", "rdp", "zcdp", "gdp")

RDP_ORDERS: tuple[float, ...] = tuple(
    sorted(
        set(rdp_lib.DEFAULT_RDP_ORDERS)
        | {1.0 + x / 100.0 for x in range(1, 10)}
        | {80.0, 96.0, 160.0, 192.0, 384.0, 768.0}
        | {float(round(x)) for x in np.geomspace(1536.0, 1e6, 30)}
    )
)
# dp_accounting's subsampled-Gaussian RDP costs O(order) per integer order; above this order the
# full-batch Gaussian RDP alpha / (2 nm^2) is used, a valid upper bound (subsampling never hurts).
_SUBSAMPLED_MAX_ORDER = 1024.0

# Above this many discretisation steps of privacy loss, the PLD of pure-DP events is skipped and
# the (sound) RDP bound is used alone, to keep budget checks fast.
_PLD_MAX_SPAN = 2_000_000
# dp_accounting's discrete Gaussian PLD enumerates about 23 sigma lattice points per shift;
# above this lattice sigma the (sound) RDP bound is used alone.
_DGAUSS_PLD_MAX_SIGMA = 2.0**15


def _check_delta(delta: float) -> None:
    if isinstance(delta, bool) or not (isinstance(delta, numbers.Real) and 0.0 < delta < 1.0):
        raise PrivacyConfigError(f"delta must be in (0, 1), got {delta!r}")


def _check_epsilon(epsilon: float) -> None:
    if isinstance(epsilon, bool) or not (
        isinstance(epsilon, numbers.Real) and math.isfinite(epsilon) and epsilon >= 0
    ):
        raise PrivacyConfigError(f"epsilon must be a finite number >= 0, got {epsilon!r}")


# ----------------------------------------------------------------------------- zCDP conversions


def zcdp_to_eps_standard(rho: float, delta: float) -> float:
    """rho-zCDP -> (eps, delta)-DP (Bun & Steinke 2016, Prop. 1.3):
    eps = rho + 2 sqrt(rho log(1/delta))."""
    _check_delta(delta)
    if rho < 0:
        raise PrivacyConfigError(f"rho must be >= 0, got {rho!r}")
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _cks_eps_at(alpha: float, rho: float, delta: float) -> float:
    """Canonne-Kamath-Steinke 2020 Prop. 12 at order alpha > 1 for RDP(alpha) = alpha * rho:
    eps = alpha rho + (log(1/delta) + (alpha - 1) log(1 - 1/alpha) - log(alpha)) / (alpha - 1)."""
    am1 = alpha - 1.0
    return (
        alpha * rho
        + (math.log(1.0 / delta) + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1
    )


def zcdp_to_eps_cks(rho: float, delta: float) -> float:
    """rho-zCDP -> (eps, delta)-DP by the tighter conversion of Canonne, Kamath & Steinke 2020
    (Prop. 12 / Cor. 13), minimised over the order alpha > 1; never above the standard one."""
    _check_delta(delta)
    if rho < 0:
        raise PrivacyConfigError(f"rho must be >= 0, got {rho!r}")
    if rho == 0:
        return 0.0
    # Grid over t = log(alpha - 1), then refine the best cell by bounded scalar minimisation.
    ts = np.linspace(-12.0, 14.0, 261)
    vals = [_cks_eps_at(1.0 + math.exp(t), rho, delta) for t in ts]
    i = int(np.argmin(vals))
    lo, hi = ts[max(i - 1, 0)], ts[min(i + 1, len(ts) - 1)]
    res = optimize.minimize_scalar(
        lambda t: _cks_eps_at(1.0 + math.exp(t), rho, delta),
        bounds=(lo, hi),
        method="bounded",
        options={"xatol": 1e-10},
    )
    best = min(float(res.fun), float(vals[i]))
    return max(0.0, min(best, zcdp_to_eps_standard(rho, delta)))


def zcdp_to_delta_cks(rho: float, epsilon: float) -> float:
    """Smallest delta with rho-zCDP => (epsilon, delta)-DP by the CKS 2020 bound:
    delta = min_alpha exp((alpha - 1)(alpha rho - eps)) / alpha * (1 - 1/alpha)^(alpha - 1)."""
    _check_epsilon(epsilon)
    if rho == 0:
        return 0.0

    def log_delta(t: float) -> float:
        a = 1.0 + math.exp(t)
        return (a - 1.0) * (a * rho - epsilon) + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)

    ts = np.linspace(-12.0, 14.0, 261)
    vals = [log_delta(t) for t in ts]
    i = int(np.argmin(vals))
    res = optimize.minimize_scalar(
        log_delta, bounds=(ts[max(i - 1, 0)], ts[min(i + 1, len(ts) - 1)]), method="bounded"
    )
    return float(min(1.0, math.exp(min(float(res.fun), vals[i]))))


# ------------------------------------------------------------------------------ Gaussian DP


def gdp_delta(mu: float, eps: float) -> float:
    """delta(eps) of mu-GDP (Dong, Roth & Su 2019, Cor. 2.13):
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), evaluated in log space."""
    if mu < 0 or not math.isfinite(mu):
        raise PrivacyConfigError(f"mu must be finite and >= 0, got {mu!r}")
    _check_epsilon(eps)
    if mu == 0:
        return 0.0
    a = math.exp(float(log_ndtr(-eps / mu + mu / 2.0)))
    b = math.exp(eps + float(log_ndtr(-eps / mu - mu / 2.0)))
    return max(0.0, a - b)


def gdp_epsilon(mu: float, delta: float) -> float:
    """Smallest eps >= 0 with gdp_delta(mu, eps) <= delta (root finding; delta is decreasing)."""
    _check_delta(delta)
    if mu == 0 or gdp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu)
    while gdp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: gdp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12))


# ----------------------------------------------------------------------------- accountant


Groups = dict[tuple, int]


def _label(event: Any) -> str:
    name = getattr(event, "name", None)
    return f"{type(event).__name__}(name={name!r})" if name is not None else repr(event)


def _check_supported(kind: str, event: Event) -> None:
    """Refuse a release event this kind cannot account (message names the event)."""
    if not isinstance(event, RELEASE_EVENTS):
        raise PrivacyConfigError(f"not a privacy event: {type(event).__name__}")
    err = _collect(kind, event.dp_event(), 1, {})
    if err is not None:
        raise PrivacyConfigError(err.replace("{label}", _label(event)))


def _collect(kind: str, event: dp_event.DpEvent, count: int, out: Groups) -> str | None:
    """Walk a dp_accounting event into ``out`` (mechanism key -> count); an error message
    (with a ``{label}`` placeholder) when ``kind`` cannot account it."""
    if isinstance(event, dp_event.NoOpDpEvent):
        return None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _collect(kind, event.event, count * int(event.count), out)
    if isinstance(event, dp_event.ComposedDpEvent):
        for sub in event.events:
            err = _collect(kind, sub, count, out)
            if err is not None:
                return err
        return None
    key, err = _mechanism_key(kind, event)
    if err is not None:
        return err
    assert key is not None
    if kind == "gdp" and key[0] != "gaussian":
        return (
            "the 'gdp' accountant only composes continuous Gaussian mechanisms, got {label} "
            "(dpsynth's releases add discrete Gaussian noise, docs/methods.md §0); use "
            "accountant 'pld', 'rdp' or 'zcdp'"
        )
    out[key] = out.get(key, 0) + count
    return None


def _mechanism_key(kind: str, event: dp_event.DpEvent) -> tuple[tuple | None, str | None]:
    """(the group key of one mechanism event, None), or (None, the error message with a
    ``{label}`` placeholder) when ``kind`` cannot account it."""
    if isinstance(event, dp_event.GaussianDpEvent):
        if not event.noise_multiplier > 0:
            return None, "{label}: a Gaussian with noise multiplier 0 has no finite epsilon"
        return ("gaussian", float(event.noise_multiplier), 1.0), None
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        inner = event.event
        q = float(event.sampling_probability)
        if not isinstance(inner, dp_event.GaussianDpEvent) or not inner.noise_multiplier > 0:
            return None, "{label}: only Poisson-subsampled Gaussians are supported"
        if not 0.0 < q <= 1.0:
            return None, "{label}: sampling probability must be in (0, 1]"
        if q < 1.0 and kind in ("zcdp", "gdp"):
            return None, (
                f"the {kind!r} accountant cannot account the Poisson-subsampled {{label}} "
                f"(sampling_rate={q}); use accountant 'pld' or 'rdp'"
            )
        return ("gaussian", float(inner.noise_multiplier), q), None
    if isinstance(event, PureDpEvent):
        return ("exponential" if event.bounded_range else "pure", float(event.epsilon)), None
    if isinstance(event, dp_event.LaplaceDpEvent):
        if not event.noise_multiplier > 0:
            return None, "{label}: a Laplace with noise multiplier 0 has no finite epsilon"
        return ("pure", 1.0 / float(event.noise_multiplier)), None
    if isinstance(event, dp_event.ZCDpEvent):
        if event.xi != 0:
            return None, "{label}: (xi, rho)-zCDP with xi != 0 is not supported"
        return ("zcdp", float(event.rho)), None
    if isinstance(event, LatticeDiscreteGaussianDpEvent):
        if not event.sigma > 0 or not event.shifts:
            return None, "{label}: a discrete Gaussian needs sigma > 0 and a shift profile"
        return ("dgauss", float(event.sigma), tuple(int(v) for v in event.shifts)), None
    if isinstance(event, DistributedDiscreteGaussianDpEvent):
        if not (event.sigma > 0 and event.sensitivity > 0 and event.parties >= 1
                and event.dimension >= 1):
            return None, "{label}: invalid distributed discrete Gaussian"
        return ("ddgauss", float(event.sigma), float(event.sensitivity), int(event.parties),
                int(event.dimension)), None
    return None, f"{{label}}: the {kind!r} accountant does not support {type(event).__name__}"


@contextlib.contextmanager
def _quiet_orders() -> Iterator[None]:
    """dp_accounting logs a warning per RDP order whose subsampled-Gaussian series does not
    converge (hundreds for a small noise multiplier) and gives that order an infinite RDP,
    which only loosens the bound: the operator's terminal is spared the warnings."""
    logger = logging.getLogger("absl")  # absl logs through the standard logging module
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


#: :meth:`Accountant._query`'s answers in this process, by (kind, discretisation, events, query)
_ANSWERS: dict[tuple, float] = {}
_ANSWERS_MAX = 4096


@functools.lru_cache(maxsize=512)
def _poisson_gaussian_rdp(q: float, nm: float, orders: tuple[float, ...]) -> np.ndarray:
    """One Poisson-subsampled Gaussian step's RDP curve, as dp_accounting's RdpAccountant
    computes it (the series over each order: the slow part of RDP accounting). Kept per
    (q, noise multiplier, orders): a run's per-step epsilon reports and its checks of one
    calibrated sigma ask for the same curve again, at another step count."""
    acct = rdp_lib.RdpAccountant(orders=list(orders))
    with _quiet_orders():
        acct.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(nm)), 1)
    curve = np.array(acct.rdp, dtype=np.float64)
    curve.flags.writeable = False
    return curve


def _rdp_vector(groups: Groups, orders: np.ndarray) -> np.ndarray:
    """Total RDP curve of the grouped events over ``orders``. The subsampled Gaussians' curves
    add up as dp_accounting's RdpAccountant adds them (count x one step's curve, in group
    order, then onto the rest), so the sum is the same to the bit."""
    small = orders <= _SUBSAMPLED_MAX_ORDER
    subsampled = np.zeros(int(small.sum()), dtype=np.float64)
    total = np.zeros_like(orders, dtype=np.float64)
    for key, count in groups.items():
        if key[0] == "gaussian":
            _, nm, q = key
            if q >= 1.0:
                total += count * orders / (2.0 * nm**2)
            else:
                subsampled += count * _poisson_gaussian_rdp(
                    float(q), float(nm), tuple(float(a) for a in orders[small]))
                total[~small] += count * orders[~small] / (2.0 * nm**2)
        elif key[0] == "exponential":
            eps = key[1]
            total += count * np.minimum(eps, orders * eps**2 / 8.0)
        elif key[0] == "pure":
            eps = key[1]
            total += count * np.minimum(eps, orders * eps**2 / 2.0)
        elif key[0] == "ddgauss":
            total += count * ddgauss_rdp(orders, *key[1:])
        else:
            total += count * _group_rho(key) * orders
    total[small] += subsampled
    return total


#: the least positive RDP value the conversions see (exp(-r) < 1 in float64 from ~1.1e-16)
_RDP_FLOOR = 1e-15


def _rdp_curve(groups: Groups, orders: np.ndarray) -> np.ndarray:
    """:func:`_rdp_vector` as the conversions take it: a Renyi divergence is never negative,
    so an order whose sum rounds below 0 (a subsampled Gaussian at a noise multiplier of
    1e7, as a calibration's first check asks: -2e-14) counts as 0. dp_accounting's
    conversion would log a warning per such order and read that order's epsilon as 0
    outright, where 0 goes through the same bound as every other order. A positive value
    under :data:`_RDP_FLOOR` is raised to it (more divergence: conservative): dp_accounting's
    delta bound takes ``log1p(-exp(-r))``, a math domain error where ``exp(-r)`` rounds to 1."""
    curve = np.maximum(_rdp_vector(groups, orders), 0.0)
    return np.where((curve > 0) & (curve < _RDP_FLOOR), _RDP_FLOOR, curve)


def dgauss_rho(sigma: float, shifts: tuple[int, ...]) -> float:
    """zCDP rho of the discrete Gaussian with lattice std ``sigma`` and shift profile
    ``shifts``: sum s^2 / (2 sigma^2) (CKS 2020, Theorem 14)."""
    return sum(v * v for v in shifts) / (2.0 * sigma**2)


def ddgauss_tau(sigma: float, parties: int) -> float:
    """tau = 10 sum_{k=1}^{P-1} exp(-2 pi^2 sigma^2 k / (k + 1)) (KLS 2021, Theorem 1), sigma
    the per-party lattice std: how far a sum of P discrete Gaussians is from one."""
    return 10.0 * sum(math.exp(-2.0 * math.pi**2 * sigma**2 * k / (k + 1.0))
                      for k in range(1, int(parties)))


def ddgauss_rdp(orders: np.ndarray, sigma: float, sensitivity: float, parties: int,
                dimension: int) -> np.ndarray:
    """RDP of the distributed discrete Gaussian (KLS 2021, Prop. 14 / Eq. 17): eps =
    Delta / (sqrt(P) sigma), min(alpha eps^2 / 2 + tau d, (alpha / 2)(eps + tau sqrt(d))^2)."""
    a = np.asarray(orders, dtype=np.float64)
    eps = sensitivity / (math.sqrt(parties) * sigma)
    tau = ddgauss_tau(sigma, parties)
    return np.minimum(a * eps**2 / 2.0 + tau * dimension,
                      a / 2.0 * (eps + tau * math.sqrt(dimension)) ** 2)


def ddgauss_rho(sigma: float, sensitivity: float, parties: int, dimension: int) -> float:
    """zCDP rho of the distributed discrete Gaussian: (eps + tau sqrt(d))^2 / 2 (the second
    branch of :func:`ddgauss_rdp`, linear in alpha)."""
    eps = sensitivity / (math.sqrt(parties) * sigma)
    return 0.5 * (eps + ddgauss_tau(sigma, parties) * math.sqrt(dimension)) ** 2


def _group_rho(key: tuple) -> float:
    if key[0] == "gaussian":
        return 1.0 / (2.0 * key[1] ** 2)
    if key[0] == "exponential":
        return key[1] ** 2 / 8.0
    if key[0] == "pure":
        return key[1] ** 2 / 2.0
    if key[0] == "dgauss":
        return dgauss_rho(key[1], key[2])
    if key[0] == "ddgauss":
        return ddgauss_rho(*key[1:])
    return float(key[1])


def _zcdp_rho(groups: Groups) -> float:
    return sum(count * _group_rho(key) for key, count in groups.items())


def _gdp_mu(groups: Groups) -> float:
    return math.sqrt(sum(count / key[1] ** 2 for key, count in groups.items()))


class Accountant(PrivacyAccountant):
    """Composes the privacy events of one run; see the module docstring for the kinds.

    A ``dp_accounting.PrivacyAccountant``: ``compose(dp_event, count)``, ``supports``,
    ``get_epsilon`` / ``get_delta`` and ``ledger`` work as in dp_accounting (so
    ``dp_accounting.calibrate_dp_mechanism`` can drive it). :meth:`add` takes the named release
    events of :mod:`dpsynth.privacy.events`, which also feed :meth:`summary`.
    """

    def __init__(self, kind: str = "pld", *, value_discretization_interval: float = 1e-4) -> None:
        if kind not in KINDS:
            raise PrivacyConfigError(f"accountant kind must be one of {KINDS}, got {kind!r}")
        super().__init__(NeighboringRelation.ADD_OR_REMOVE_ONE)
        self.kind = kind
        self.value_discretization_interval = value_discretization_interval
        self.events: list[Event] = []
        self._groups: Groups = {}
        self._cache: dict[tuple[str, float], float] = {}

    # -- dp_accounting interface ---------------------------------------------------------------
    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> PrivacyAccountant.CompositionErrorDetails | None:
        groups: Groups = {}
        err = _collect(self.kind, event, count, groups)
        if err is not None:
            return PrivacyAccountant.CompositionErrorDetails(
                invalid_event=event, error_message=err.replace("{label}", repr(event))
            )
        if do_compose:
            for key, c in groups.items():
                self._groups[key] = self._groups.get(key, 0) + c
            self._cache.clear()
        return None

    def get_epsilon(self, target_delta: float) -> float:
        """dp_accounting's name for :meth:`epsilon`."""
        return self.epsilon(target_delta)

    def get_delta(self, target_epsilon: float) -> float:
        """dp_accounting's name for :meth:`delta`."""
        return self.delta(target_epsilon)

    # -- state ---------------------------------------------------------------------------------
    def add(self, event: Event) -> None:
        """Compose one more release event (raises PrivacyConfigError when this kind cannot
        account it)."""
        _check_supported(self.kind, event)
        self.compose(event.dp_event())
        self.events.append(event)

    def extend(self, events: Iterable[Event]) -> None:
        """Add several events."""
        for e in events:
            self.add(e)

    def copy(self) -> Accountant:
        """An independent accountant with the same events."""
        vdi = self.value_discretization_interval
        new = Accountant(self.kind, value_discretization_interval=vdi)
        new.events = list(self.events)
        new._groups = dict(self._groups)
        new._cache = dict(self._cache)
        new._ledger = copy.deepcopy(self._ledger)
        return new

    def __copy__(self) -> Accountant:
        return self.copy()

    def __deepcopy__(self, memo: dict) -> Accountant:
        return self.copy()

    # -- queries -------------------------------------------------------------------------------
    def epsilon(self, delta: float) -> float:
        """Smallest epsilon such that the composed run is (epsilon, delta)-DP (by this kind)."""
        _check_delta(delta)
        return self._query(("eps", float(delta)), lambda: self._epsilon(self._groups, delta))

    def delta(self, epsilon: float) -> float:
        """Smallest delta such that the composed run is (epsilon, delta)-DP (by this kind)."""
        _check_epsilon(epsilon)
        return self._query(("delta", float(epsilon)), lambda: self._delta(self._groups, epsilon))

    def _query(self, ck: tuple[str, float], compute: Callable[[], float]) -> float:
        """``compute()``'s answer, kept for this accountant and, by the composed events, for
        every accountant of this process: an answer is a function of (kind, discretisation,
        the events composed, the query) alone, and a calibration asks the same several times
        (dp_accounting's search re-evaluates its bracket's ends and its root, each on a fresh
        accountant; a PLD evaluation is 0.3 s for the tiny example and seconds for DP-SGD)."""
        if ck not in self._cache:
            key = (self.kind, self.value_discretization_interval,
                   frozenset(self._groups.items()), ck)
            if key not in _ANSWERS:
                if len(_ANSWERS) >= _ANSWERS_MAX:
                    _ANSWERS.pop(next(iter(_ANSWERS)))
                _ANSWERS[key] = compute()
            self._cache[ck] = _ANSWERS[key]
        return self._cache[ck]

    def check(self, event: Event) -> None:
        """Raise PrivacyConfigError when this kind cannot account ``event`` (nothing is added)."""
        _check_supported(self.kind, event)

    def _groups_with(self, events: Event | Iterable[Event]) -> Groups:
        groups = dict(self._groups)
        for ev in as_event_list(events):
            _check_supported(self.kind, ev)
            _collect(self.kind, ev.dp_event(), 1, groups)
        return groups

    def epsilon_if_added(self, events: Event | Iterable[Event], delta: float) -> float:
        """epsilon at ``delta`` if ``events`` were added (the accountant is not changed)."""
        _check_delta(delta)
        return self._epsilon(self._groups_with(events), delta)

    def fits_if_added(self, events: Event | Iterable[Event], epsilon: float, delta: float) -> bool:
        """Whether the run stays (epsilon, delta)-DP by this kind if ``events`` were added.
        For 'pld' the cheap RDP bound is tried first (the reported value is never above it)."""
        _check_delta(delta)
        groups = self._groups_with(events)
        if self.kind == "pld" and groups and self._rdp_epsilon(groups, delta) <= epsilon:
            return True
        return self._epsilon(groups, delta) <= epsilon

    def rho(self) -> float:
        """Total zCDP rho (kinds 'zcdp'; also meaningful for 'gdp' without subsampling)."""
        if self.kind not in ("zcdp", "gdp"):
            raise PrivacyConfigError(f"rho() needs accountant 'zcdp' or 'gdp', not {self.kind!r}")
        return _zcdp_rho(self._groups)

    def gdp_mu(self) -> float:
        """Total mu of the 'gdp' accountant."""
        if self.kind != "gdp":
            raise PrivacyConfigError(f"gdp_mu() needs accountant 'gdp', not {self.kind!r}")
        return _gdp_mu(self._groups)

    def summary(self) -> list[dict]:
        """One row per mechanism (type, name and parameters), with its total count."""
        rows: dict[tuple, dict] = {}
        for e in self.events:
            d = e.to_dict()
            count = d.pop("count")
            k = tuple(sorted(d.items()))
            if k not in rows:
                rows[k] = {"mechanism": d.pop("type"), **d, "count": 0}
                if isinstance(e, GaussianEvent | DiscreteGaussianEvent):
                    rows[k]["mu"] = e.sensitivity / e.sigma
                if isinstance(e, ExponentialEvent | DiscreteGaussianEvent):
                    rows[k]["rho"] = e.rho
            rows[k]["count"] += count
        return list(rows.values())

    # -- internals -----------------------------------------------------------------------------
    @staticmethod
    def _rdp_epsilon(groups: Groups, delta: float) -> float:
        orders = np.asarray(RDP_ORDERS)
        return float(rdp_lib.compute_epsilon(orders, _rdp_curve(groups, orders), delta)[0])

    @staticmethod
    def _rdp_delta(groups: Groups, epsilon: float) -> float:
        orders = np.asarray(RDP_ORDERS)
        return float(rdp_lib.compute_delta(orders, _rdp_curve(groups, orders), epsilon)[0])

    def _epsilon(self, groups: Groups, delta: float) -> float:
        if not groups:
            return 0.0
        if self.kind == "gdp":
            return gdp_epsilon(_gdp_mu(groups), delta)
        if self.kind == "zcdp":
            return zcdp_to_eps_cks(_zcdp_rho(groups), delta)
        rdp_eps = self._rdp_epsilon(groups, delta)
        if self.kind == "rdp":
            return rdp_eps
        # pld: both bounds are sound for the same run; report the smaller.
        pld = self._pld(groups)
        if pld is None:
            return rdp_eps
        return min(rdp_eps, float(pld.get_epsilon_for_delta(delta)))

    def _delta(self, groups: Groups, epsilon: float) -> float:
        if not groups:
            return 0.0
        if self.kind == "gdp":
            return gdp_delta(_gdp_mu(groups), epsilon)
        if self.kind == "zcdp":
            return zcdp_to_delta_cks(_zcdp_rho(groups), epsilon)
        rdp_delta = min(1.0, self._rdp_delta(groups, epsilon))
        if self.kind == "rdp":
            return rdp_delta
        pld = self._pld(groups)
        if pld is None:
            return rdp_delta
        return min(rdp_delta, float(pld.get_delta_for_epsilon(epsilon)))

    def _pld(self, groups: Groups) -> pld_lib.PrivacyLossDistribution | None:
        """The composed PLD, or None when some event has none (zCDP) or would be too costly."""
        vdi = self.value_discretization_interval
        if any(k[0] in ("zcdp", "ddgauss") for k in groups):
            return None
        if any(k[0] == "dgauss" and k[1] > _DGAUSS_PLD_MAX_SIGMA for k in groups):
            return None
        span = sum(c * k[1] for k, c in groups.items() if k[0] in ("exponential", "pure")) / vdi
        if span > _PLD_MAX_SPAN:
            return None
        parts: list[pld_lib.PrivacyLossDistribution] = []
        # Full-batch Gaussians compose exactly into one Gaussian with mu^2 = sum count / nm^2.
        mu2 = sum(c / k[1] ** 2 for k, c in groups.items() if k[0] == "gaussian" and k[2] >= 1.0)
        if mu2 > 0:
            parts.append(
                pld_lib.from_gaussian_mechanism(
                    standard_deviation=1.0 / math.sqrt(mu2),
                    sensitivity=1.0,
                    value_discretization_interval=vdi,
                )
            )
        for key, count in groups.items():
            if key[0] == "gaussian" and key[2] < 1.0:
                one = pld_lib.from_gaussian_mechanism(
                    standard_deviation=key[1],
                    sensitivity=1.0,
                    sampling_prob=key[2],
                    value_discretization_interval=vdi,
                )
                parts.append(one.self_compose(count) if count > 1 else one)
            elif key[0] == "dgauss":
                one = _dgauss_pld(key[1], key[2], vdi)
                parts.append(one.self_compose(count) if count > 1 else one)
            elif key[0] in ("exponential", "pure"):
                one = pld_lib.from_privacy_parameters(
                    pld_common.DifferentialPrivacyParameters(key[1], 0.0),
                    value_discretization_interval=vdi,
                )
                parts.append(one.self_compose(count) if count > 1 else one)
        total = parts[0]
        for p in parts[1:]:
            total = total.compose(p)
        return total


def _dgauss_pld(sigma: float, shifts: tuple[int, ...], vdi: float
                ) -> pld_lib.PrivacyLossDistribution:
    """dp_accounting's (pessimistic) discrete Gaussian PLD of each shift, composed: the
    product mechanism's privacy loss is the sum of the coordinates' (independent noise)."""
    total = None
    for shift, times in sorted(_multiset(shifts).items()):
        one = _dgauss_pld_1d(sigma, shift, vdi)
        one = one.self_compose(times) if times > 1 else one
        total = one if total is None else total.compose(one)
    assert total is not None
    return total


def _multiset(values: tuple[int, ...]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


_DGAUSS_PLD_CACHE: dict[tuple[float, int, float], pld_lib.PrivacyLossDistribution] = {}


def _dgauss_pld_1d(sigma: float, shift: int, vdi: float) -> pld_lib.PrivacyLossDistribution:
    key = (sigma, shift, vdi)
    if key not in _DGAUSS_PLD_CACHE:
        if len(_DGAUSS_PLD_CACHE) >= 256:
            _DGAUSS_PLD_CACHE.pop(next(iter(_DGAUSS_PLD_CACHE)))
        _DGAUSS_PLD_CACHE[key] = pld_lib.from_discrete_gaussian_mechanism(
            sigma, sensitivity=shift, value_discretization_interval=vdi)
    return _DGAUSS_PLD_CACHE[key]


__all__ = [
    "KINDS",
    "Accountant",
    "ddgauss_rdp",
    "ddgauss_rho",
    "ddgauss_tau",
    "dgauss_rho",
    "gdp_delta",
    "gdp_epsilon",
    "zcdp_to_delta_cks",
    "zcdp_to_eps_cks",
    "zcdp_to_eps_standard",
]
