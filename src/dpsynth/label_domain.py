"""Find a label domain privately, for ``data.label_domain: discover`` (docs/methods.md §0).

The default is a declared domain (``data.label_values``): public input, free of charge. When
the values are not known in advance, :func:`discover_label_domain` releases a noisy count of
every value present in each label column and keeps the values whose noisy count exceeds a
threshold ``tau``.

Contributions. Record level: each record adds 1 to its value. User level: each user adds
``1/sqrt(k')`` to each of their ``k' = min(k, m)`` most frequent values (``m`` distinct values
held, ``k = data.label_domain_max_values_per_user``; ties broken by the smaller value;
:func:`dpsynth.compute.kernels.user_value_weights`). The choice depends on the user's own
records only, so adding or removing a user changes no other user's contribution, and each
user's contribution vector has L2 norm ``sqrt(k' / k') = 1``.

Threshold (union bound over the values one user may touch). A value present only because of
the differing record or user has count exactly ``1/sqrt(k')`` (record level ``k' = 1``), and
that unit touches at most ``k'`` such values per column, so the chance that any of them is
kept in a column is at most

    B_k(tau) = max_{k'=1..k} k' * PhiBar((tau - 1/sqrt(k')) / sigma),

and ``tau`` is the smallest value with ``B_k(tau) <= d = delta_discover / n_columns``
(:func:`discovery_threshold`, solved with brentq). At ``k = 1`` (and at record level) this is
the closed form ``tau = 1 + sigma * Phi^-1(1 - d)``.

Accounting (the "stability-based histogram" argument, proven in docs/methods.md §0): for the
values present in both of two neighbouring data sets the count vectors differ by the differing
unit's contribution restricted to them, of L2 norm <= 1, so each column's count vector is a
Gaussian release of L2 sensitivity 1. The values present in one data set only appear in the
output only if one of their noisy counts passes ``tau``: probability <= ``d`` per column,
<= ``delta_discover`` over all columns (union bound), independent of all other noise. So with
the Gaussian events composed to (eps, delta), the run's guarantee is
(eps, delta + delta_discover): the extra delta must be part of the stated delta (calibrate the
rest of the run to ``target_delta - delta_discover``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from .compute.kernels import user_value_weights
from .privacy.events import DiscreteGaussianEvent
from .privacy.lattice import Lattice, count_lattice

if TYPE_CHECKING:
    from .config import DataConfig
    from .data import Dataset

__all__ = [
    "DiscoveredDomain",
    "apply_discovery",
    "declared_statement",
    "discover_from_counts",
    "discover_label_domain",
    "discovery_events",
    "discovery_threshold",
    "singleton_pass_probability",
    "unit_pass_bound",
    "undeclared_columns",
    "value_counts",
]

EVENT_NAME = "label_domain"


def _check_threshold_args(sigma: float, delta_discover: float, max_values_per_user: int
                          ) -> None:
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if not 0 < delta_discover < 1:
        raise ValueError(f"delta_discover must be in (0, 1), got {delta_discover}")
    if isinstance(max_values_per_user, bool) or not isinstance(max_values_per_user,
                                                               int | np.integer) \
            or max_values_per_user < 1:
        raise ValueError(f"max_values_per_user must be an integer >= 1, "
                         f"got {max_values_per_user!r}")


def _log_pass_bound(tau: float, sigma: float, max_values_per_user: int) -> float:
    """log B_k(tau) (module docstring), in log space so tiny deltas stay exact."""
    k = np.arange(1, int(max_values_per_user) + 1, dtype=np.float64)
    return float(np.max(np.log(k) + norm.logsf((tau - 1.0 / np.sqrt(k)) / sigma)))


def unit_pass_bound(sigma: float, tau: float, max_values_per_user: int = 1) -> float:
    """B_k(tau) = max_{k'=1..k} k' PhiBar((tau - 1/sqrt(k')) / sigma): a bound on the chance
    that any value held only by one record (k = 1) or one user (at most k values, each of count
    1/sqrt(k')) passes ``tau`` in a column (union bound over that unit's values)."""
    _check_threshold_args(sigma, 0.5, max_values_per_user)
    return float(np.exp(_log_pass_bound(tau, sigma, max_values_per_user)))


def discovery_threshold(sigma: float, delta_discover: float, max_values_per_user: int = 1
                        ) -> float:
    """The smallest ``tau`` with ``B_k(tau) <= delta_discover`` (:func:`unit_pass_bound`).

    ``k = 1`` (record level): ``tau = 1 + sigma * Phi^-1(1 - delta)``, the closed form. Larger
    ``k``: ``B_k`` is continuous and decreasing in ``tau`` and the root lies in
    ``[1 + sigma Phi^-1(1 - delta), 1 + sigma Phi^-1(1 - delta / k)]`` (at the left end the
    ``k' = 1`` term alone is ``delta``; at the right end every term is at most
    ``k PhiBar((tau - 1) / sigma) = delta``); brentq finds it to 1e-12 (relative), and the
    returned ``tau`` is checked to satisfy the bound (the bracket's right end otherwise)."""
    _check_threshold_args(sigma, delta_discover, max_values_per_user)
    return _threshold(float(sigma), float(delta_discover), int(max_values_per_user))


@functools.lru_cache(maxsize=64)
def _threshold(sigma: float, delta_discover: float, max_values_per_user: int) -> float:
    lo = 1.0 + sigma * float(norm.isf(delta_discover))
    if max_values_per_user == 1:
        return lo
    hi = 1.0 + sigma * float(norm.isf(delta_discover / max_values_per_user))
    log_d = float(np.log(delta_discover))

    def excess(tau: float) -> float:
        return _log_pass_bound(tau, sigma, max_values_per_user) - log_d

    if excess(lo) <= 0.0:  # the k' = 1 term dominates: the closed form already holds
        return lo
    xtol = 1e-12 * max(1.0, abs(hi))
    root = float(brentq(excess, lo, hi, xtol=xtol, rtol=4 * np.finfo(float).eps))
    tau = min(hi, root + 2 * xtol)  # brentq's root is within xtol: step to the safe side
    return tau if excess(tau) <= 0.0 else hi


def singleton_pass_probability(sigma: float, tau: float, count: float = 1.0) -> float:
    """P[count + N(0, sigma^2) > tau] (the chance a value with this true count is kept)."""
    return float(norm.sf((tau - count) / sigma))


def value_counts(
    values: Sequence[str], users: Sequence[str] | None = None, max_values_per_user: int = 1
) -> tuple[list[str], np.ndarray]:
    """Exact (private) counts of the distinct values present, in sorted value order.

    Record level: each record adds 1 to its value (L2 sensitivity 1). User level: each user
    adds ``1 / sqrt(k')`` to each of at most ``max_values_per_user`` of their values
    (:func:`dpsynth.compute.kernels.user_value_weights`, the rule both engines run), so every
    user's contribution has L2 norm 1 and adds at most 1 to any one value.
    """
    if users is None:
        uniq, counts = np.unique(np.asarray(values, dtype=object), return_counts=True)
        return [str(v) for v in uniq], counts.astype(np.float64)
    if len(users) != len(values):
        raise ValueError(f"{len(users)} user ids for {len(values)} values")
    held: dict[str, list[str]] = {}
    for v, u in zip(values, users, strict=True):
        held.setdefault(u, []).append(v)
    totals: dict[str, float] = {}
    for u in sorted(held):
        for v, w in user_value_weights(held[u], max_values_per_user):
            totals[v] = totals.get(v, 0.0) + w
    names = sorted(totals)
    return names, np.array([totals[v] for v in names], dtype=np.float64)


def discovery_lattice(user_level: bool) -> Lattice:
    """The public lattice of the value counts: integer counts (one record adds 1 to one value)
    or, at user level, sums of 1 / sqrt(m) truncated onto the 2^-32 grid."""
    return count_lattice(user_level)


def discovery_events(n_columns: int, sigma: float, user_level: bool = False
                     ) -> list[DiscreteGaussianEvent]:
    """The discrete Gaussian releases discovery makes (one per column, sensitivity 1), for
    planning and calibration."""
    if n_columns == 0:
        return []
    return [DiscreteGaussianEvent(sigma=sigma, sensitivity=1.0, count=n_columns,
                                  name=EVENT_NAME, shifts=discovery_lattice(user_level).shifts)]


@dataclass
class DiscoveredDomain:
    """What discovery kept, the privacy events it made and the delta it adds to the run."""

    values: dict[str, list[str]]
    events: list[DiscreteGaussianEvent]
    extra_delta: float
    threshold: float
    max_values_per_user: int = 1  # k of the threshold's union bound (1 at record level)

    def statement(self) -> dict[str, Any]:
        """The ``label_domain`` entry of release/privacy.json (public: parameters and the
        kept values, themselves a DP output)."""
        sigma = self.events[0].sigma if self.events else None
        return {
            "mode": "discover",
            "columns": sorted(self.values),
            "values": {c: list(v) for c, v in self.values.items()},
            "noise_sigma": sigma,
            "threshold": self.threshold,
            "delta_discover": self.extra_delta,
            "max_values_per_user": self.max_values_per_user,
            "note": "label values found privately: noisy counts (Gaussian, sensitivity 1 per "
                    "column; each user counts towards at most max_values_per_user values per "
                    "column, weighted to L2 norm 1) kept above a threshold at which any of the "
                    "values held only by one record or user passes with probability <= "
                    "delta_discover over all columns (union bound), included in the stated "
                    "delta",
        }


def declared_statement(columns: Sequence[str]) -> dict[str, Any]:
    """The ``label_domain`` entry of release/privacy.json for a declared (public) domain."""
    return {"mode": "declared", "columns": list(columns),
            "note": "label values are public input from the config; no budget spent on them"}


def discover_label_domain(
    columns: Mapping[str, Sequence[str]],
    noisy: Callable[[str, np.ndarray], np.ndarray],
    *,
    sigma: float,
    delta_discover: float,
    users: Sequence[str] | None = None,
    max_values_per_user: int = 1,
) -> DiscoveredDomain:
    """Privately find the values of each label column in ``columns`` (column -> the records'
    values).

    ``noisy(key, counts)`` must return ``counts + N(0, sigma^2)`` and account it, e.g.
    ``lambda key, c: session.noisy_counts(key, c, sigma, name="label_domain")``; keys are
    ``"label_domain/<column>"``. Composition (module docstring): the releases are
    :func:`discovery_events` (already recorded by a session-backed ``noisy``: add them to
    *planned* events for calibration, not to the session again), and the thresholding fails
    with probability <= ``delta_discover`` (split evenly over the columns), so the run states
    (eps, delta + ``extra_delta``) with ``extra_delta = delta_discover``. With ``users``, each
    user counts towards at most ``max_values_per_user`` values per column and the threshold
    takes the union bound over them (ignored at record level, where k' = 1).
    Kept values are sorted (post-processing of the noisy counts). Raises ``ValueError`` when a
    column keeps no value (declare the values, or lower the noise).
    """
    k = max_values_per_user if users is not None else 1
    counts = {col: value_counts(vals, users, k) for col, vals in columns.items()}
    return discover_from_counts(counts, noisy, sigma=sigma, delta_discover=delta_discover,
                                max_values_per_user=k, user_level=users is not None)


def discover_from_counts(
    counts: Mapping[str, tuple[list[str], np.ndarray]],
    noisy: Callable[[str, np.ndarray], np.ndarray],
    *,
    sigma: float,
    delta_discover: float,
    max_values_per_user: int,
    user_level: bool = False,
) -> DiscoveredDomain:
    """:func:`discover_label_domain` from the exact counts of each column's present values
    (``(sorted values, counts)``, e.g. summed over Ray shards by
    ``PrivateCompute.label_value_counts``). ``max_values_per_user``: the most values one unit
    adds to per column in those counts (1 at record level), for the threshold's union bound;
    required, so counts and threshold cannot silently disagree."""
    if not counts:
        return DiscoveredDomain(values={}, events=[], extra_delta=0.0, threshold=float("inf"),
                                max_values_per_user=max_values_per_user)
    tau = discovery_threshold(sigma, delta_discover / len(counts), max_values_per_user)
    kept: dict[str, list[str]] = {}
    for col, (names, counts_col) in counts.items():
        counts_col = np.asarray(counts_col, dtype=np.float64)
        released = np.asarray(noisy(f"{EVENT_NAME}/{col}", counts_col), dtype=np.float64)
        if released.shape != counts_col.shape:
            raise ValueError(f"noisy counts for {col!r} have shape {released.shape}, "
                             f"expected {counts_col.shape}")
        kept[col] = [n for n, c in zip(names, released, strict=True) if c > tau]
        if not kept[col]:
            raise ValueError(
                f"no value of label column {col!r} passed the discovery threshold "
                f"{tau:.1f} (noise sigma {sigma:g}): declare data.label_values.{col}, or lower "
                "data.label_domain_sigma"
            )
    return DiscoveredDomain(
        values=kept,
        events=discovery_events(len(counts), sigma, user_level),
        extra_delta=delta_discover,
        threshold=tau,
        max_values_per_user=max_values_per_user,
    )


def undeclared_columns(dataset: Dataset) -> list[str]:
    """Label columns of ``dataset`` without a public domain (left to discovery)."""
    return [c for c in dataset.label_columns if c not in (dataset.label_domain or {})]


def apply_discovery(
    dataset: Dataset,
    data: DataConfig,
    noisy: Callable[[str, np.ndarray], np.ndarray],
    *,
    user_level: bool = False,
) -> tuple[Dataset, DiscoveredDomain]:
    """Discover the undeclared label columns of ``dataset`` (``data.label_domain:
    discover``) and return the records whose values were kept, carrying the full domain.

    ``noisy`` as in :func:`discover_label_domain` with sigma ``data.label_domain_sigma``.
    The exact counts come from the dataset's engine (``compute.dataset_engine``: this process,
    or the Ray shards of a sharded dataset, which the driver never reads).
    Dropping the records whose value was not kept is post-processing of the released domain;
    how many were dropped is private (never log it). With ``user_level`` each user counts
    towards at most ``data.label_domain_max_values_per_user`` values per column and the
    threshold takes the union bound over them (module docstring); record level, k = 1.
    """
    from .compute import dataset_engine

    k = data.label_domain_max_values_per_user if user_level else 1
    cols = undeclared_columns(dataset)
    counts = dataset_engine(dataset, user_level).label_value_counts(cols, k) if cols else {}
    found = discover_from_counts(counts, noisy, sigma=data.label_domain_sigma,
                                 delta_discover=data.label_domain_delta,
                                 max_values_per_user=k, user_level=user_level)
    if not cols:
        return dataset, found
    return dataset.with_label_domain(found.values), found
