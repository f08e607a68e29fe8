"""PrivacySession: the one door through which private data leaves as noisy statistics.

Every release has a unique ``key`` naming the statistic (e.g. ``"iter3/votes"``) and goes through
ONE template (docs/methods.md §0):

    stored? -> admit -> draw -> commit

- stored?  a key released before returns its stored value and charges nothing: noise is never
  redrawn for a statistic that was released ("Resume");
- admit    the events must be accountable and fit in the target BEFORE any noise is drawn;
- draw     a pure mechanism (:mod:`dpsynth.privacy.mechanisms`) runs with the key's noise stream;
- commit   value and events are written durably (:class:`ReleaseStore`), then accounted.

:meth:`PrivacySession.release_external` is the same template for a value computed outside the
session (e.g. a secure sum whose noise the federated parties add): it admits BEFORE calling
``compute``, so nothing is computed on private data that the budget would refuse.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import mechanisms as mech
from .accountant import Accountant
from .errors import BudgetExceededError, PrivacyConfigError
from .events import DiscreteGaussianEvent, Event, ExponentialEvent, ZCDPEvent, as_event_list
from .lattice import FIXED_POINT_GRID, Lattice, lattice_points
from .mechanisms import threshold_log_weights
from .noise import NoiseSource, make_noise_source
from .store import ReleaseStore

log = logging.getLogger("dpsynth.privacy")

UNITS = ("record", "user")


class PrivacySession:
    """Persistent, resume-safe releases with budget enforcement.

    ``target`` = (epsilon, delta): a release that would take epsilon at the target delta above
    the target epsilon raises :class:`BudgetExceededError` before any noise is drawn.
    When the noise source has ``spawn(key)`` (both built-in sources do), each release draws from
    a per-key stream: with seeded noise a resumed run can never reuse another key's noise.
    The store is locked for this process until :meth:`close` (or process exit).
    """

    def __init__(
        self,
        store_dir: Path,
        accountant: Accountant,
        noise: NoiseSource,
        target: tuple[float, float] | None = None,
    ) -> None:
        if target is not None:
            t_eps, t_delta = target
            if not (isinstance(t_eps, int | float) and math.isfinite(t_eps) and t_eps > 0):
                raise PrivacyConfigError(f"target epsilon must be > 0, got {t_eps!r}")
            if not (isinstance(t_delta, int | float) and 0 < t_delta < 1):
                raise PrivacyConfigError(f"target delta must be in (0, 1), got {t_delta!r}")
            target = (float(t_eps), float(t_delta))
        self.target = target
        self.accountant = accountant
        self.noise = noise
        self.store = ReleaseStore(Path(store_dir))
        self.store_dir = self.store.store_dir
        if self.store.legacy:
            self.store.close()
            raise PrivacyConfigError(
                f"{self.store.path}: this release store was written before dpsynth drew "
                "discrete Gaussian noise (docs/methods.md §0); its floating-point draws are not "
                "mixed with discrete ones: finish the run with the dpsynth version that started "
                "it, or start a new run")
        for rec in self.store.records.values():
            for ev in rec["_events"]:
                self.accountant.add(ev)

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the store's lock; the session can still be read but no longer release."""
        self.store.close()

    def __enter__(self) -> PrivacySession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the release template ------------------------------------------------------------------
    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            raise PrivacyConfigError(f"release key must be a non-empty string, got {key!r}")

    def _stored(self, key: str, events: list[Event]) -> tuple[bool, Any]:
        """(True, value) when ``key`` was released before (nothing is charged again)."""
        self._check_key(key)
        if not self.store.has(key):
            return False, None
        if [e.to_dict() for e in events] != [e.to_dict() for e in self.store.events(key)]:
            log.warning(
                "release %r was stored with different privacy parameters; the stored value is "
                "reused and accounted with its original parameters",
                key,
            )
        return True, self.store.value(key)

    def _admit(self, events: list[Event]) -> None:
        """Check the events can be accounted and fit in the target, before any noise is drawn."""
        for ev in events:
            self.accountant.check(ev)
        if self.target is None:
            return
        t_eps, t_delta = self.target
        if not self.accountant.fits_if_added(events, t_eps * (1.0 + 1e-9), t_delta):
            new_eps = self.accountant.epsilon_if_added(events, t_delta)
            names = ", ".join(sorted({e.name for e in events}))
            raise BudgetExceededError(
                f"release of {names} would take epsilon to {new_eps:.4f} at delta={t_delta:g}, "
                f"above the target epsilon={t_eps:g} (spent so far: "
                f"{self.accountant.epsilon(t_delta):.4f}); raise the target or add more noise"
            )

    def _commit(self, key: str, events: list[Event], value: Any) -> None:
        self.store.write(key, events, value, self.noise.mode)
        for ev in events:
            self.accountant.add(ev)

    def _release(
        self, key: str, events: list[Event], draw: Callable[[NoiseSource], Any]
    ) -> Any:
        """THE release template: stored? -> admit -> draw -> commit."""
        found, stored = self._stored(key, events)
        if found:
            return stored
        self._admit(events)
        value = draw(self._noise_for(key))
        self._commit(key, events, value)
        return value

    def release_external(
        self, key: str, events: Event | Iterable[Event], compute: Callable[[], Any]
    ) -> Any:
        """A release computed outside the session (e.g. a federated secure sum, noise added by
        the parties): a stored key returns its value and ``compute`` is NOT called; otherwise
        the events are admitted BEFORE ``compute()`` runs, and its result is committed."""
        evs = as_event_list(events)
        if not evs:
            raise PrivacyConfigError(f"release {key!r}: at least one event is required")
        return self._release(key, evs, lambda _noise: compute())

    def noise_for(self, key: str) -> NoiseSource:
        """The noise stream of one release key (independent per key; same on resume when
        seeded). Also for a mechanism's own randomness, e.g. Poisson sampling coins."""
        return self._noise_for(key)

    def _noise_for(self, key: str) -> NoiseSource:
        spawn = getattr(self.noise, "spawn", None)
        return spawn(key) if callable(spawn) else self.noise

    # -- mechanisms ----------------------------------------------------------------------------
    def gaussian(
        self,
        key: str,
        value: np.ndarray,
        sensitivity: float,
        sigma: float,
        *,
        name: str = "gaussian",
        sampling_rate: float = 1.0,
        lattice: Lattice | None = None,
    ) -> np.ndarray:
        """Discrete Gaussian mechanism on a public lattice (docs/methods.md §0): value =
        grid * n, released as grid * (n + Z) with Z exact discrete Gaussian steps of std
        sigma / grid. The caller guarantees that ``value`` has L2 sensitivity <=
        ``sensitivity`` (and, with sampling_rate < 1, that it was computed on a Poisson sample
        of that rate) and, for an exact ``lattice``, that it lies on it. ``lattice`` None: the
        value is real and rounded onto the fixed-point grid (:meth:`Lattice.rounded`), charged
        at sensitivity Delta + grid sqrt(d) with sigma grown alike (same noise multiplier)."""
        lat = lattice if lattice is not None else Lattice.rounded(sigma)
        size = int(np.asarray(value).size)
        sens, sig = mech.charged_parameters(lat, sensitivity, sigma, size)
        spacing = np.asarray(lat.grid, dtype=np.float64).ravel()
        grid = float(spacing[0]) if spacing.size == 1 else 1.0  # recorded (used with shifts)
        events: list[Event] = [
            DiscreteGaussianEvent(sig, sens, 1, sampling_rate, name, lat.shifts, grid)]
        if not self.store.has(key):
            v = mech.as_finite_array("value", value)
            lattice_points(v, lat.spacing(v.shape), lat.exact, name=f"release {key!r}")
        return self._release(
            key, events, lambda n: mech.discrete_gaussian_mechanism(value, sig, lat, n))

    def noisy_counts(
        self, key: str, counts: np.ndarray, sigma: float, *, name: str = "noisy_counts",
        lattice: Lattice | None = None,
    ) -> np.ndarray:
        """Counts (each record adds 1 to one cell: L2 sensitivity 1) + discrete Gaussian noise
        of std sigma; ``lattice`` defaults to integer counts with shift profile (1,) (give
        ``Lattice.fixed_point()`` for user-level counts truncated onto the 2^-32 grid)."""
        lat = lattice if lattice is not None else Lattice.counts()
        return self.gaussian(key, counts, 1.0, sigma, name=name, lattice=lat)

    def exponential(
        self,
        key: str,
        utilities: np.ndarray,
        sensitivity: float,
        epsilon: float,
        *,
        name: str = "exponential",
    ) -> int:
        """Exponential mechanism: index i with probability proportional to
        exp(eps u_i / (2 Delta_u)), by Gumbel-max; eps-DP. Entries equal to -inf are excluded
        candidates (that exclusion must not depend on private data)."""
        events: list[Event] = [ExponentialEvent(epsilon, 1, name)]
        if not self.store.has(key):
            mech.check_positive("sensitivity", sensitivity)
            mech.check_utilities(utilities)
        return self._release(
            key, events, lambda n: mech.exponential_mechanism(utilities, sensitivity, epsilon, n)
        )

    def exponential_threshold(
        self,
        key: str,
        values: np.ndarray,
        target: int,
        candidates: np.ndarray,
        epsilon: float,
        *,
        mode: str = "grid",
        name: str = "threshold",
    ) -> float:
        """Choose a threshold theta with about ``target`` values above it (DP-SynRAG retrieval,
        docs/methods.md §4): utility -|#{v > theta} - target|, sensitivity 1, eps-DP.

        mode="grid": theta among ``candidates`` with probability proportional to
        exp(eps u(theta) / 2).
        mode="interval": theta anywhere in [min(candidates), max(candidates)] (a public range,
        e.g. [-1, 1] for cosine similarity): the range is cut at the sorted values, an interval
        is drawn with probability proportional to length * exp(eps u / 2) and theta uniformly
        inside it (the exponential mechanism over the continuous range, uniform base measure).
        """
        events: list[Event] = [ExponentialEvent(epsilon, 1, name)]
        if not self.store.has(key):
            mech.check_threshold_target(target)
            threshold_log_weights(values, int(target), candidates, epsilon, mode)
        return self._release(
            key,
            events,
            lambda n: mech.threshold_mechanism(values, target, candidates, epsilon, n, mode),
        )

    def threshold_from_counts(
        self,
        key: str,
        counts: np.ndarray,
        target: int,
        candidates: np.ndarray,
        epsilon: float,
        *,
        name: str = "threshold",
    ) -> float:
        """:meth:`exponential_threshold` in "grid" mode given the counts c_g = #{v > theta_g}
        per candidate instead of the values (DP-SynRAG with sharded documents: each shard
        counts its own, the sums come here). The same event and, for the same counts, the same
        draw as the values-based form."""
        events: list[Event] = [ExponentialEvent(epsilon, 1, name)]
        if not self.store.has(key):
            mech.check_threshold_target(target)
            mech.check_threshold_counts(counts, candidates)
        return self._release(
            key,
            events,
            lambda n: mech.threshold_from_counts(counts, target, candidates, epsilon, n),
        )

    def private_token(
        self,
        key: str,
        clipped_logit_sum: np.ndarray,
        clip: float,
        temperature: float,
        *,
        support: np.ndarray | None = None,
        name: str = "private_prediction",
    ) -> int:
        """One private token of DP-SynRAG (docs/methods.md §4): y ~ softmax(z / tau) (no top-k
        / top-p), z = sum of clipped logit rows. An exponential mechanism with per-coordinate
        sensitivity c: rho = (1/2) (c / tau)^2 per token. Over the FULL vocabulary (z indexed
        by token id), or with ``support`` (distinct token ids fixed from public inputs and
        earlier releases only, z[i] the sum for ``support[i]``) over that outcome set: the
        same mechanism on fewer outcomes, same charge. Returns the token id."""
        events: list[Event] = [ZCDPEvent(mech.private_token_rho(clip, temperature), 1, name)]
        ids = None
        if support is not None:
            ids = np.asarray(support, dtype=np.int64).ravel()
            if not self.store.has(key) and (
                    ids.size != np.asarray(clipped_logit_sum).size
                    or np.unique(ids).size != ids.size):
                raise PrivacyConfigError("private_token: support must hold distinct token ids, "
                                         "one per entry of the clipped logit sum")
        if not self.store.has(key):
            mech.check_logit_sum(clipped_logit_sum)

        def draw(n: NoiseSource) -> int:
            i = mech.private_token_mechanism(clipped_logit_sum, temperature, n)
            return int(ids[i]) if ids is not None else i

        return self._release(key, events, draw)

    def record(self, key: str, event: Event | Iterable[Event], value: Any = None) -> Any:
        """Account a release whose value is already computed elsewhere. Prefer
        :meth:`release_external`, which admits before the value is computed. Same semantics: a
        stored key returns its stored value and charges nothing."""
        return self.release_external(key, event, lambda: value)

    # -- queries -------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether ``key`` has been released."""
        return self.store.has(key)

    def get(self, key: str) -> Any:
        """The stored noisy value of ``key`` (KeyError if it was never released)."""
        return self.store.value(key)

    def keys(self) -> list[str]:
        """Keys of all releases, in release order."""
        return list(self.store.records)

    def _delta_or_target(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.target is None:
            raise PrivacyConfigError("delta is required when the session has no target")
        return self.target[1]

    def epsilon(self, delta: float | None = None) -> float:
        """epsilon spent so far at ``delta`` (default: the target delta)."""
        return self.accountant.epsilon(self._delta_or_target(delta))

    def _noise_label(self) -> str:
        recs = self.store.records.values()
        modes = {rec.get("noise", "seeded") for rec in recs} | {self.noise.mode}
        return "secure" if modes == {"secure"} else "seeded"

    def spent(self) -> dict[str, Any]:
        """Spending so far: epsilon at the target delta (when there is a target) and counts."""
        out: dict[str, Any] = {
            "releases": len(self.store.records),
            "accountant": self.accountant.kind,
            "noise": self._noise_label(),
        }
        if self.target is not None:
            out.update(
                epsilon=self.accountant.epsilon(self.target[1]),
                delta=self.target[1],
                target_epsilon=self.target[0],
                target_delta=self.target[1],
            )
        return out

    def statement(self, unit: str, target: tuple[float, float]) -> dict[str, Any]:
        """The privacy statement written to release/privacy.json (with the noise mode and a
        plain ``noise_note``)."""
        if unit not in UNITS:
            raise PrivacyConfigError(f"unit must be one of {UNITS}, got {unit!r}")
        t_eps, t_delta = target
        noise = self._noise_label()
        return {
            "epsilon": self.accountant.epsilon(t_delta),
            "delta": t_delta,
            "target_epsilon": t_eps,
            "target_delta": t_delta,
            "unit": unit,
            "accountant": self.accountant.kind,
            "noise": noise,
            "noise_note": noise_note(noise),
            "gaussian_noise": GAUSSIAN_NOISE,
            "releases": len(self.store.records),
            "mechanisms": self.accountant.summary(),
        }


#: privacy.json's ``gaussian_noise``: how every Gaussian release is drawn (docs/methods.md §0).
GAUSSIAN_NOISE = {
    "sampler": "exact discrete Gaussian (Canonne, Kamath & Steinke 2020), integer arithmetic",
    "lattices": "counts on the integers; votes on their public weights; real values on the "
                "fixed-point grid",
    "fixed_point_grid": FIXED_POINT_GRID,
}


def noise_note(mode: str) -> str:
    """One plain sentence on what the noise mode means for the guarantee (privacy.json)."""
    if mode == "secure":
        return (
            "Noise was drawn from the operating system's cryptographic random source; it cannot "
            "be recomputed. Gaussian noise is an exact discrete Gaussian on a public grid."
        )
    if mode == "seeded":
        return (
            "Noise was drawn from a seeded generator (research mode): the guarantee holds only "
            "while the seed stays secret (it is kept in the run's private folder). Gaussian "
            "noise is an exact discrete Gaussian on a public grid."
        )
    return "No noise was added: this output carries no differential-privacy guarantee."


__all__ = ["PrivacySession", "noise_note"]


@dataclass(frozen=True)
class StoreOpener:
    """How a method opens a second store of noise, ``private/<folder>`` (DP-SynRAG's
    per-cluster releases): the run's accountant (``accountant``) and noise (``noise``, with the
    run's ``seed`` in seeded mode), no cap of its own. A value the runner hands down in the
    job, so opening a store calls down into the privacy core, never back into the runner."""

    private: Path
    accountant: str
    noise: str
    seed: int | None = None

    def __call__(self, folder: str) -> PrivacySession:
        return PrivacySession(self.private / folder, Accountant(self.accountant),
                              make_noise_source(self.noise, self.seed))
