"""DP-SGD's accounting (Abadi et al. 2016; Mironov, Talwar & Zhang 2019): T steps of the
Poisson-subsampled Gaussian mechanism, each record in a step's batch with probability q, its
gradient clipped to L2 norm C and N(0, (sigma C)^2) added to the sum, is the dp_accounting event
``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), T)`` (add/remove one
record). At user level (``privacy.unit: user``) the unit sampled and clipped is a user (each
user in a step's batch with probability q, the user's gradient clipped to C as one), so the
same event holds for add/remove one user, with q = B / users. Pure functions: the noise
multiplier is solved from the target before anything is trained, with the project's one
calibration (:func:`dpsynth.privacy.calibrate_gaussian_sigma`)."""

from __future__ import annotations

import math
from typing import Any

from dp_accounting import dp_event

from ...errors import ConfigError
from ...privacy import (
    Accountant,
    DiscreteGaussianEvent,
    GaussianEvent,
    ReleasePlan,
    Scaled,
    calibrate_gaussian_sigma,
)
from ...privacy.lattice import FIXED_POINT_GRID

#: the accountants that can state a Poisson-subsampled Gaussian (zCDP cannot; GDP only
#: full-batch)
ACCOUNTANTS = ("pld", "rdp")


def noise_to_signal(noise_multiplier: float, expected_batch: float, coordinates: int) -> float:
    """sigma sqrt(d) / B: about the norm of one step's noise on the mean gradient,
    N(0, (sigma C / B)^2 I_d) over the adapter's d coordinates, in units of C, the largest norm
    the mean of the clipped gradients can have (Abadi et al. 2016, Algorithm 1). Above 1 the
    noise outweighs anything the records can say in one step."""
    return float(noise_multiplier) * math.sqrt(int(coordinates)) / float(expected_batch)


def noise_over_run(step_ratio: float, steps: int) -> float:
    """:func:`noise_to_signal` over a run of T steps: ratio / sqrt(T). The sum of T updates
    carries T times a steady mean gradient and sqrt(T) times one step's independent noise
    (plain SGD; for Adam a heuristic), so the ratio of the two falls as sqrt(T): more steps
    at one noise multiplier are what let a run learn through noisy steps."""
    return float(step_ratio) / math.sqrt(max(1, int(steps)))


def schedule(records: int, batch_size: int, epochs: float) -> tuple[float, int]:
    """(q, T): the Poisson rate q = min(1, B / n) of an expected batch of B out of n units
    (records, or users at user level), and T = ceil(epochs / q) steps (one epoch = 1 / q
    steps in expectation)."""
    if records < 1 or batch_size < 1 or not (epochs > 0):
        raise ConfigError(f"schedule needs units (records or users), batch_size >= 1 and "
                          f"epochs > 0, got {records}, {batch_size}, {epochs}")
    q = min(1.0, batch_size / records)
    return q, max(1, math.ceil(epochs / q - 1e-9))


def dp_sgd_dp_event(noise_multiplier: float, q: float, steps: int) -> dp_event.DpEvent:
    """The dp_accounting event of T DP-SGD steps at sampling rate q and noise multiplier
    sigma (noise std / clip)."""
    one = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(noise_multiplier))
    return dp_event.SelfComposedDpEvent(one, steps)


def dp_sgd_event(noise_multiplier: float, q: float, steps: int) -> Any:
    """The same mechanism as a release event of the session (``GaussianEvent`` with
    sensitivity 1 in units of the clip, ``sampling_rate`` q, ``count`` T): its
    :meth:`dp_event` is :func:`dp_sgd_dp_event` (for T > 1 and q < 1)."""

    return GaussianEvent(noise_multiplier, 1.0, steps, q, "dp_sgd")


def label_count_event(sigma: float, user_level: bool = False) -> Any:
    """The noisy label counts, discrete Gaussian of std ``sigma`` (docs/methods.md §0): one
    record adds 1 to one cell (shift profile (1,)); at user level each user's count vector,
    scaled to L2 norm <= 1 and truncated onto the 2^-32 grid, is one user's contribution (the
    lattice of :func:`dpsynth.privacy.lattice.count_lattice`, no shift profile: zCDP)."""

    if user_level:
        return DiscreteGaussianEvent(sigma, 1.0, 1, 1.0, "label_counts", (), FIXED_POINT_GRID)
    return DiscreteGaussianEvent(sigma, 1.0, 1, 1.0, "label_counts", (1,))


def planned_events(noise_multiplier: float, q: float, steps: int,
                   label_sigma: float | None, user_level: bool = False) -> list[Any]:
    """Every release of a run: the label counts (when released) and the T DP-SGD steps."""
    events = [] if label_sigma is None else [label_count_event(label_sigma, user_level)]
    return [*events, dp_sgd_event(noise_multiplier, q, steps)]


def check_accountant(kind: str) -> None:
    """Refuse an accountant that cannot state the subsampled Gaussian."""
    if kind not in ACCOUNTANTS:
        raise ConfigError(f"method dp_finetune: privacy.accountant {kind!r} cannot account "
                          f"Poisson-subsampled DP-SGD; use one of {', '.join(ACCOUNTANTS)}")


def solve_noise_multiplier(epsilon: float, delta: float, q: float, steps: int, kind: str,
                           label_sigma: float | None = None, user_level: bool = False) -> float:
    """The smallest noise multiplier (to 1e-4, rounded up) whose run (the label counts at
    their fixed std, then T DP-SGD steps) is (epsilon, delta)-DP under accountant ``kind``
    (per record, or per user with ``user_level``)."""

    check_accountant(kind)
    labels = [] if label_sigma is None else [label_count_event(label_sigma, user_level)]
    plan = ReleasePlan((*labels, Scaled(dp_sgd_event(1.0, q, steps))))
    return float(calibrate_gaussian_sigma(epsilon, delta, plan, kind=kind))


def run_epsilon(noise_multiplier: float, q: float, steps: int, delta: float, kind: str,
                label_sigma: float | None = None, user_level: bool = False) -> float:
    """epsilon at ``delta`` of the run after ``steps`` DP-SGD steps (the per-step report)."""

    acc = Accountant(kind)
    acc.extend(planned_events(noise_multiplier, q, steps, label_sigma, user_level))
    return float(acc.epsilon(delta))
