"""Find a label domain privately, for ``data.label_domain: discover`` (docs/methods.md §0).

The default is a declared domain (``data.label_values``): public input, free of charge. When
the values are not known in advance, :func:`discover_label_domain` releases a noisy count of
every value present in each label column and keeps the values whose noisy count exceeds a
threshold ``tau`` set so that a value held by a single record (or user) is kept with
probability at most ``d = delta_discover / n_columns`` in its column:

    tau = 1 + sigma * Phi^-1(1 - d)
    P[1 + N(0, sigma^2) > tau] = 1 - Phi((tau - 1) / sigma) = d.

Accounting (the "stability-based histogram" argument): for a value present in both of two
neighbouring data sets the counts differ by at most 1, so the column's count vector is a
Gaussian release of L2 sensitivity 1 (a record holds one value per column; with users, each
user's contribution to a column is scaled to L2 norm 1, see :func:`value_counts`). The one
thing the Gaussian bound does not cover is a value present in one data set only (held by the
differing record or user alone, count <= 1): it appears in the output only if its noisy count
passes ``tau``, which happens with probability <= ``d`` per column, <= ``delta_discover`` over
all columns (union bound). So with the Gaussian events composed to (eps, delta), the run's
guarantee is (eps, delta + delta_discover): the extra delta must be part of the stated delta
(calibrate the rest of the run to ``target_delta - delta_discover``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.stats import norm

from .privacy.events import DiscreteGaussianEvent
from .privacy.lattice import Lattice, count_lattice, truncate_to_grid

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
    "undeclared_columns",
    "value_counts",
]

EVENT_NAME = "label_domain"


def discovery_threshold(sigma: float, delta_discover: float) -> float:
    """``tau = 1 + sigma * Phi^-1(1 - delta_discover)``: a count-1 value passes w.p. delta."""
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if not 0 < delta_discover < 1:
        raise ValueError(f"delta_discover must be in (0, 1), got {delta_discover}")
    return 1.0 + sigma * float(norm.isf(delta_discover))


def singleton_pass_probability(sigma: float, tau: float, count: float = 1.0) -> float:
    """P[count + N(0, sigma^2) > tau] (the chance a value with this true count is kept)."""
    return float(norm.sf((tau - count) / sigma))


def value_counts(
    values: Sequence[str], users: Sequence[str] | None = None
) -> tuple[list[str], np.ndarray]:
    """Exact (private) counts of the distinct values present, in sorted value order.

    Record level: each record adds 1 to its value (L2 sensitivity 1). User level: a user with
    ``m`` distinct values adds ``1 / sqrt(m)`` to each, so every user's contribution has L2
    norm 1 and adds at most 1 to any one value (the threshold argument still holds).
    """
    if users is None:
        uniq, counts = np.unique(np.asarray(values, dtype=object), return_counts=True)
        return [str(v) for v in uniq], counts.astype(np.float64)
    if len(users) != len(values):
        raise ValueError(f"{len(users)} user ids for {len(values)} values")
    held: dict[str, set[str]] = {}
    for v, u in zip(values, users, strict=True):
        held.setdefault(u, set()).add(v)
    totals: dict[str, float] = {}
    for vals in held.values():
        # truncated onto the public 2^-32 grid: an exact lattice sum for the discrete Gaussian
        w = truncate_to_grid(1.0 / math.sqrt(len(vals)))
        for v in vals:
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
            "note": "label values found privately: noisy counts (Gaussian, sensitivity 1 per "
                    "column) kept above a threshold that a one-record value passes with "
                    "probability <= delta_discover, which is included in the stated delta",
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
) -> DiscoveredDomain:
    """Privately find the values of each label column in ``columns`` (column -> the records'
    values).

    ``noisy(key, counts)`` must return ``counts + N(0, sigma^2)`` and account it, e.g.
    ``lambda key, c: session.noisy_counts(key, c, sigma, name="label_domain")``; keys are
    ``"label_domain/<column>"``. Composition (module docstring): the releases are
    :func:`discovery_events` (already recorded by a session-backed ``noisy``: add them to
    *planned* events for calibration, not to the session again), and the thresholding fails
    with probability <= ``delta_discover`` (split evenly over the columns), so the run states
    (eps, delta + ``extra_delta``) with ``extra_delta = delta_discover``.
    Kept values are sorted (post-processing of the noisy counts). Raises ``ValueError`` when a
    column keeps no value (declare the values, or lower the noise).
    """
    counts = {col: value_counts(vals, users) for col, vals in columns.items()}
    return discover_from_counts(counts, noisy, sigma=sigma, delta_discover=delta_discover,
                                user_level=users is not None)


def discover_from_counts(
    counts: Mapping[str, tuple[list[str], np.ndarray]],
    noisy: Callable[[str, np.ndarray], np.ndarray],
    *,
    sigma: float,
    delta_discover: float,
    user_level: bool = False,
) -> DiscoveredDomain:
    """:func:`discover_label_domain` from the exact counts of each column's present values
    (``(sorted values, counts)``, e.g. summed over Ray shards by
    ``PrivateCompute.label_value_counts``)."""
    if not counts:
        return DiscoveredDomain(values={}, events=[], extra_delta=0.0, threshold=float("inf"))
    tau = discovery_threshold(sigma, delta_discover / len(counts))
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
    The exact counts come from the dataset's engine (``compute.data_compute``: this process,
    or the Ray shards of a sharded dataset, which the driver never reads).
    Dropping the records whose value was not kept is post-processing of the released domain;
    how many were dropped is private (never log it). With ``user_level`` each user's
    contribution is bounded (:func:`value_counts`).
    """
    from .compute import data_compute

    cols = undeclared_columns(dataset)
    counts = data_compute(dataset, user_level).label_value_counts(cols) if cols else {}
    found = discover_from_counts(counts, noisy, sigma=data.label_domain_sigma,
                                 delta_discover=data.label_domain_delta, user_level=user_level)
    if not cols:
        return dataset, found
    return dataset.with_label_domain(found.values), found
