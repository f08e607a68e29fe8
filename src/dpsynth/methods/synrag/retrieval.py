"""Step 3 of DP-SynRAG: DP retrieval inside one cluster.

mu_r = sum_{d in C_r} phi(d) + N(0, sigma_mu^2 I) (unit embeddings: L2 sensitivity 1,
rho = 1 / (2 sigma_mu^2)); theta by the exponential mechanism with utility
-|#{d in C_r : sim(d, mu_r) > theta} - k| (sensitivity 1, eps_theta, rho = eps_theta^2 / 8);
S_r = {d in C_r : sim(d, mu_r) > theta}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    """The result of DP retrieval in one cluster."""

    theta: float
    selected: np.ndarray  # indices into the corpus (S_r)
    centre: np.ndarray  # the released noisy centre (unnormalised)


def retrieve_in_cluster(
    session: Any,
    key: str,
    embeddings: np.ndarray,
    members: np.ndarray,
    *,
    sigma_mu: float,
    eps_theta: float,
    target: int,
) -> Retrieved:
    """Noisy centre, exponential-mechanism threshold, S_r. Both releases are keyed under
    ``key`` in ``session`` (stored: a resumed build reuses them, never redraws)."""
    dim = embeddings.shape[1]
    total = embeddings[members].sum(axis=0) if members.size else np.zeros(dim)
    centre = np.asarray(
        session.gaussian(f"{key}/centre", total, 1.0, sigma_mu, name="cluster_centre")
    )
    norm = float(np.linalg.norm(centre))
    direction = centre / norm if norm > 0 else centre
    sims = embeddings[members] @ direction if members.size else np.zeros(0)
    theta = float(
        session.exponential_threshold(
            f"{key}/threshold", sims, int(target), THRESHOLD_GRID, eps_theta, mode="grid",
            name="cluster_threshold",
        )
    )
    return Retrieved(theta, members[sims > theta], centre)
