"""Step 3 of DP-SynRAG: DP retrieval inside one cluster.

mu_r = sum_{d in C_r} phi(d) + N(0, sigma_mu^2 I) (unit embeddings: L2 sensitivity 1,
rho = 1 / (2 sigma_mu^2)); theta by the exponential mechanism with utility
-|#{d in C_r : sim(d, mu_r) > theta} - k| (sensitivity 1, eps_theta, rho = eps_theta^2 / 8);
S_r = {d in C_r : sim(d, mu_r) > theta}.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...privacy.lattice import Lattice

SIM_RANGE = np.array([-1.0, 1.0])  # public range of cosine similarity
# Public grid of candidate thresholds (step 0.01). The grid form of the exponential mechanism
# gives every candidate the same base weight; the interval form weights by interval length,
# which with few documents puts most mass on the long empty stretch above the largest
# similarity (S_r empty) at the paper's eps_theta = 0.4.
THRESHOLD_GRID = np.round(np.linspace(-1.0, 1.0, 201), 2)


def centre_sigma(rho_centre: float) -> float:
    """sigma_mu with 1 / (2 sigma_mu^2) = rho_centre."""
    return math.sqrt(1.0 / (2.0 * rho_centre))


@dataclass(frozen=True)
class Retrieved:
    """The releases of DP retrieval in one cluster (S_r itself is kept where the documents
    are: :meth:`dpsynth.methods.synrag.shard.DocumentShard.select`)."""

    theta: float
    centre: np.ndarray  # the released noisy centre (unnormalised)
    direction: np.ndarray  # centre / ||centre|| (zero if the centre is zero)


def retrieve_in_cluster(
    session: Any,
    key: str,
    total: np.ndarray,
    counts_of: Callable[[np.ndarray], np.ndarray],
    *,
    sigma_mu: float,
    eps_theta: float,
    target: int,
) -> Retrieved:
    """Noisy centre and exponential-mechanism threshold of one cluster, from exact partial
    statistics: ``total`` = sum of the member embeddings, ``counts_of(direction)`` = #{members
    with sim > theta_g} per point of :data:`THRESHOLD_GRID` (summed over the shards). Both
    releases are keyed under ``key`` in ``session`` (stored: a resumed build reuses them, never
    redraws); the one-process build and the sharded one call this same function."""
    centre = np.asarray(
        session.gaussian(f"{key}/centre", total, 1.0, sigma_mu, name="cluster_centre",
                         lattice=Lattice.fixed_point())
    )
    norm = float(np.linalg.norm(centre))
    direction = centre / norm if norm > 0 else centre
    theta = float(
        session.threshold_from_counts(
            f"{key}/threshold", counts_of(direction), int(target), THRESHOLD_GRID, eps_theta,
            name="cluster_threshold",
        )
    )
    return Retrieved(theta, centre, direction)
