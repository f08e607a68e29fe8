"""Descriptions of single releases, from the worst case of one record (or one user).

An event says what a mechanism guarantees, not what it computed: the accountant composes events.
The privacy core speaks dp_accounting's event language: each release event below (which also
carries a ``name`` and its sensitivity, for the statement and the release store) converts to a
``dp_accounting`` event with :meth:`dp_event` (``GaussianDpEvent``, ``PoissonSampledDpEvent``,
``SelfComposedDpEvent``, ``ZCDpEvent``), plus :class:`PureDpEvent` for the exponential mechanism,
:class:`LatticeDiscreteGaussianDpEvent` for the discrete Gaussian with a known lattice shift
profile and :class:`DistributedDiscreteGaussianDpEvent` for a sum of parties' discrete Gaussian
shares, which dp_accounting has no class for (no class here is named like one of dp_accounting's,
so an upgrade that adds one cannot shadow ours: tests/test_privacy_accounting.py). Every
Gaussian release of the session is a :class:`DiscreteGaussianEvent`; :class:`GaussianEvent`
(continuous noise) remains for noise drawn outside the session (the federated parties'
shares) and for calibration references.
Composition semantics (docs/methods.md §0):

- ``count`` is the number of identical sequential compositions of the same mechanism.
- Overlapping parallel composition (each record takes part in at most L of the parts, e.g.
  DP-SynRAG's soft clusters, docs/methods.md §4): account the per-part event L times, see
  :func:`overlapping`.
- Disjoint parallel composition (the parts partition D, e.g. per-label vote histograms in Aug-PE):
  account ONE release whose sensitivity covers all parts together (a record changes only its own
  part, so the joint L2 sensitivity is that of one part). Do not add one event per part.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import attr
from dp_accounting import dp_event

from .errors import PrivacyConfigError


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDpEvent(dp_event.DpEvent):
    """A mechanism that is pure epsilon-DP, e.g. the exponential mechanism (eps = 2 Delta_u /
    tau), which is moreover eps^2/8-zCDP by bounded range (Cesar & Rogers 2021) when
    ``bounded_range`` is true. dp_accounting has no class for it; the accountants here do."""

    epsilon: float
    bounded_range: bool = True


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LatticeDiscreteGaussianDpEvent(dp_event.DpEvent):
    """The discrete Gaussian N_Z(0, sigma^2) per coordinate (``sigma`` in lattice steps) whose
    neighbouring inputs differ, up to order and signs, by a sub-vector of the integer
    ``shifts``: rho = sum s^2 / (2 sigma^2) (CKS 2020, Theorem 14), and an exact PLD, the
    composition of dp_accounting's 1-D discrete Gaussian PLDs of each shift."""

    sigma: float
    shifts: tuple[int, ...]


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DistributedDiscreteGaussianDpEvent(dp_event.DpEvent):
    """The sum of ``parties`` independent N_Z(0, sigma^2) shares (``sigma`` in lattice steps
    per party) added to a ``dimension``-d lattice statistic of L2 sensitivity ``sensitivity``
    (lattice steps): RDP(alpha) <= min(alpha eps^2 / 2 + tau d, (alpha / 2)(eps + tau sqrt(d))^2)
    with eps = sensitivity / (sqrt(parties) sigma), tau = 10 sum_{k=1}^{parties-1}
    exp(-2 pi^2 sigma^2 k / (k + 1)) (Kairouz, Liu & Steinke 2021, Theorem 1 / Prop. 14)."""

    sigma: float
    sensitivity: float
    parties: int
    dimension: int


def _check_count(count: int) -> None:
    if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 1:
        raise PrivacyConfigError(f"count must be an integer >= 1, got {count!r}")


def _check_positive(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise PrivacyConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _coerce(obj: Any, *names: str) -> None:
    """Store numeric fields as plain floats/ints (JSON-ready, numpy scalars accepted)."""
    for n in names:
        v = getattr(obj, n)
        object.__setattr__(obj, n, int(v) if n == "count" else float(v))


class _EventMixin:
    """JSON round trip shared by the event dataclasses."""

    TYPE: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (inverse: :func:`event_from_dict` or ``cls.from_dict``)."""
        return {"type": self.TYPE, **dataclasses.asdict(self)}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """Rebuild an event of this class from ``to_dict()`` output."""
        if d.get("type", cls.TYPE) != cls.TYPE:
            raise PrivacyConfigError(f"expected event type {cls.TYPE!r}, got {d.get('type')!r}")
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = set(d) - fields - {"type"}
        if unknown:
            raise PrivacyConfigError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in fields})


@dataclass(frozen=True)
class GaussianEvent(_EventMixin):
    """Gaussian mechanism f(D) + N(0, sigma^2 I) with L2 sensitivity Delta, optionally on a
    Poisson subsample with rate q, composed ``count`` times. Alone: mu-GDP, mu = Delta / sigma."""

    TYPE: ClassVar[str] = "gaussian"
    sigma: float
    sensitivity: float
    count: int = 1
    sampling_rate: float = 1.0
    name: str = "gaussian"

    def __post_init__(self) -> None:
        _check_positive("sigma", self.sigma)
        _check_positive("sensitivity", self.sensitivity)
        _check_count(self.count)
        _check_positive("sampling_rate", self.sampling_rate)
        _coerce(self, "sigma", "sensitivity", "count", "sampling_rate")
        if not (0.0 < self.sampling_rate <= 1.0):
            raise PrivacyConfigError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")

    @property
    def noise_multiplier(self) -> float:
        """sigma / Delta."""
        return self.sigma / self.sensitivity

    def dp_event(self) -> dp_event.DpEvent:
        """The dp_accounting event: Gaussian(sigma / Delta), Poisson-subsampled when q < 1,
        self-composed ``count`` times."""
        one: dp_event.DpEvent = dp_event.GaussianDpEvent(self.noise_multiplier)
        if self.sampling_rate < 1.0:
            one = dp_event.PoissonSampledDpEvent(self.sampling_rate, one)
        return _self_composed(one, self.count)


@dataclass(frozen=True)
class DiscreteGaussianEvent(_EventMixin):
    """Discrete Gaussian mechanism on a public lattice (docs/methods.md §0): f(D) on
    ``grid * Z^d`` plus grid * N_Z(0, (sigma / grid)^2) per coordinate, f of L2 sensitivity
    Delta (value units), composed ``count`` times. Alone: rho-zCDP with rho = Delta^2 /
    (2 sigma^2) in any dimension (Canonne, Kamath & Steinke 2020, Theorem 14).

    ``grid``: the lattice spacing (1.0 for per-coordinate spacings). ``shifts`` (in steps of
    ``grid``), when given, is the exact worst case of one record's change
    (:class:`dpsynth.privacy.lattice.Lattice`); the 'pld' accountant then composes
    dp_accounting's discrete Gaussian PLDs. ``sampling_rate`` < 1 (a Poisson sample) is
    recorded but not used: the charge is the full-batch one, an upper bound."""

    TYPE: ClassVar[str] = "discrete_gaussian"
    sigma: float
    sensitivity: float
    count: int = 1
    sampling_rate: float = 1.0
    name: str = "gaussian"
    shifts: tuple[int, ...] = ()
    grid: float = 1.0

    def __post_init__(self) -> None:
        _check_positive("sigma", self.sigma)
        _check_positive("sensitivity", self.sensitivity)
        _check_count(self.count)
        _check_positive("sampling_rate", self.sampling_rate)
        _check_positive("grid", self.grid)
        _coerce(self, "sigma", "sensitivity", "count", "sampling_rate", "grid")
        if not (0.0 < self.sampling_rate <= 1.0):
            raise PrivacyConfigError(f"sampling_rate must be in (0, 1], got {self.sampling_rate!r}")
        shifts = tuple(self.shifts)
        if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1
               for v in shifts):
            raise PrivacyConfigError(f"shifts must be integers >= 1, got {self.shifts!r}")
        object.__setattr__(self, "shifts", tuple(int(v) for v in shifts))
        if shifts and self.grid * math.sqrt(sum(v * v for v in shifts)) > (
                self.sensitivity * (1.0 + 1e-9)):
            raise PrivacyConfigError(
                f"shifts {self.shifts} on grid {self.grid:g} exceed the sensitivity "
                f"{self.sensitivity:g}")

    @property
    def noise_multiplier(self) -> float:
        """sigma / Delta."""
        return self.sigma / self.sensitivity

    @property
    def rho(self) -> float:
        """zCDP parameter of one application: Delta^2 / (2 sigma^2)."""
        return 0.5 / self.noise_multiplier**2

    def dp_event(self) -> dp_event.DpEvent:
        """:class:`LatticeDiscreteGaussianDpEvent` (lattice sigma, shifts) when the shift profile
        is known, else ``ZCDpEvent(rho)``; ``count`` times."""
        one: dp_event.DpEvent
        if self.shifts:
            one = LatticeDiscreteGaussianDpEvent(self.sigma / self.grid, self.shifts)
        else:
            one = dp_event.ZCDpEvent(self.rho)
        return _self_composed(one, self.count)


@dataclass(frozen=True)
class DistributedDiscreteGaussianEvent(_EventMixin):
    """A lattice statistic noised by ``parties`` independent discrete Gaussian shares of std
    ``sigma`` each (value units; lattice ``grid``), L2 sensitivity Delta over ``dimension``
    coordinates (:mod:`dpsynth.privacy.distributed`; Kairouz, Liu & Steinke 2021). Charge a
    round at the fewest parties whose shares can be in the sum."""

    TYPE: ClassVar[str] = "distributed_discrete_gaussian"
    sigma: float
    sensitivity: float
    parties: int
    dimension: int
    grid: float = 1.0
    count: int = 1
    name: str = "distributed_gaussian"

    def __post_init__(self) -> None:
        _check_positive("sigma", self.sigma)
        _check_positive("sensitivity", self.sensitivity)
        _check_positive("grid", self.grid)
        _check_count(self.count)
        _check_count(self.parties)
        _check_count(self.dimension)
        _coerce(self, "sigma", "sensitivity", "grid", "count")
        object.__setattr__(self, "parties", int(self.parties))
        object.__setattr__(self, "dimension", int(self.dimension))

    def dp_event(self) -> dp_event.DpEvent:
        """:class:`DistributedDiscreteGaussianDpEvent` in lattice steps, ``count`` times."""
        one = DistributedDiscreteGaussianDpEvent(self.sigma / self.grid,
                                                 self.sensitivity / self.grid, self.parties,
                                                 self.dimension)
        return _self_composed(one, self.count)


@dataclass(frozen=True)
class ExponentialEvent(_EventMixin):
    """Exponential mechanism (softmax(u / tau) with utility sensitivity Delta_u): pure eps-DP with
    eps = 2 Delta_u / tau, and eps^2/8-zCDP via bounded range (Cesar & Rogers 2021)."""

    TYPE: ClassVar[str] = "exponential"
    epsilon: float
    count: int = 1
    name: str = "exponential"

    def __post_init__(self) -> None:
        _check_positive("epsilon", self.epsilon)
        _check_count(self.count)
        _coerce(self, "epsilon", "count")

    @property
    def rho(self) -> float:
        """zCDP parameter of one application: eps^2 / 8."""
        return self.epsilon**2 / 8.0

    def dp_event(self) -> dp_event.DpEvent:
        """The dp_accounting event: :class:`PureDpEvent` (bounded range), ``count`` times."""
        return _self_composed(PureDpEvent(self.epsilon, True), self.count)


@dataclass(frozen=True)
class ZCDPEvent(_EventMixin):
    """A mechanism given directly as rho-zCDP (RDP of order alpha is rho * alpha), e.g. one private
    token of DP-SynRAG: rho = (1/2) (c / tau)^2 (docs/methods.md §4)."""

    TYPE: ClassVar[str] = "zcdp"
    rho: float
    count: int = 1
    name: str = "zcdp"

    def __post_init__(self) -> None:
        _check_positive("rho", self.rho)
        _check_count(self.count)
        _coerce(self, "rho", "count")

    def dp_event(self) -> dp_event.DpEvent:
        """The dp_accounting event: ``ZCDpEvent(rho)``, ``count`` times."""
        return _self_composed(dp_event.ZCDpEvent(self.rho), self.count)


def _self_composed(event: dp_event.DpEvent, count: int) -> dp_event.DpEvent:
    return event if count == 1 else dp_event.SelfComposedDpEvent(event, count)


Event = (GaussianEvent | DiscreteGaussianEvent | DistributedDiscreteGaussianEvent
         | ExponentialEvent | ZCDPEvent)

_TYPES: dict[str, type] = {
    "gaussian": GaussianEvent,
    "discrete_gaussian": DiscreteGaussianEvent,
    "distributed_discrete_gaussian": DistributedDiscreteGaussianEvent,
    "exponential": ExponentialEvent,
    "zcdp": ZCDPEvent,
}


RELEASE_EVENTS = (GaussianEvent, DiscreteGaussianEvent, DistributedDiscreteGaussianEvent,
                  ExponentialEvent, ZCDPEvent)


def as_event_list(events: Event | Iterable[Event]) -> list[Event]:
    """One release event or several, as a list (each checked to be a release event)."""
    evs = [events] if isinstance(events, RELEASE_EVENTS) else list(events)  # type: ignore[arg-type]
    for ev in evs:
        if not isinstance(ev, RELEASE_EVENTS):
            raise PrivacyConfigError(f"not a privacy event: {type(ev).__name__}")
    return evs


def to_dp_event(events: Event | Iterable[Event]) -> dp_event.DpEvent:
    """The dp_accounting event of one or several release events (``ComposedDpEvent``)."""
    evs = as_event_list(events)
    if len(evs) == 1:
        return evs[0].dp_event()
    return dp_event.ComposedDpEvent([e.dp_event() for e in evs])


def event_from_dict(d: dict[str, Any]) -> Event:
    """Inverse of ``event.to_dict()``."""
    kind = d.get("type")
    if kind not in _TYPES:
        raise PrivacyConfigError(f"event type must be one of {sorted(_TYPES)}, got {kind!r}")
    return _TYPES[kind].from_dict(d)


def overlapping(event: Event, times: int) -> Event:
    """Overlapping parallel composition: each record is in at most ``times`` parts, each part
    released by ``event``; equivalent (for the worst-case record) to ``times`` compositions."""
    _check_count(times)
    return dataclasses.replace(event, count=event.count * times)


def params_key(event: Event) -> tuple:
    """The mechanism's parameters without count and name (events with equal keys compose as
    one self-composition)."""
    if isinstance(event, GaussianEvent):
        return ("gaussian", float(event.noise_multiplier), float(event.sampling_rate))
    if isinstance(event, DiscreteGaussianEvent):
        if event.shifts:
            return ("discrete_gaussian", float(event.sigma / event.grid), event.shifts)
        return ("zcdp", float(event.rho))
    if isinstance(event, DistributedDiscreteGaussianEvent):
        return ("distributed_discrete_gaussian", float(event.sigma / event.grid),
                float(event.sensitivity / event.grid), event.parties, event.dimension)
    if isinstance(event, ExponentialEvent):
        return ("exponential", float(event.epsilon))
    if isinstance(event, ZCDPEvent):
        return ("zcdp", float(event.rho))
    raise PrivacyConfigError(f"not a privacy event: {type(event).__name__}")
