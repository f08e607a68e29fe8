"""Driver: one federated WASP voting round in Flower's simulation engine (Ray backend).

Dropouts: a party that fails after the SecAgg+ key-sharing stages contributes neither its votes
nor its noise share, so the sum carries N(0, (P_present / P) sigma^2) (the tests pass a
client-app factory whose parties drop out). The SecAgg+
reconstruction threshold is ``min_parties`` (default: all P), so with fewer survivors the
protocol halts before anything is unmasked (InsufficientPartiesError); with ``min_parties < P``
a smaller round is released with ``effective_sigma`` = sqrt(P_present / P) * sigma >=
sqrt(min_parties / P) * sigma, the worst case a caller must charge BEFORE the round
(dpsynth.federated.rounds.accounted_round).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dpsynth.errors import require
from dpsynth.federated.core import (
    FederatedResult,
    PartyData,
    VoteFn,
    clip_probability_bound,
    effective_sigma,
    validate_parties,
)
from dpsynth.privacy.distributed import (
    DEFAULT_MODULUS_RANGE,
    DEFAULT_QUANTIZATION_RANGE,
    QuantisationPlan,
    plan_quantisation,
)

#: A round's own one-machine Ray ("local"): two CPUs, and one actor that takes both.
_LOCAL_RAY_INIT_ARGS: dict[str, Any] = {
    "num_cpus": 2,
    "include_dashboard": False,
    "object_store_memory": 200 * 1024 * 1024,
}


class _SimulationParties:
    """Client-side party lookup by the simulation's partition id (never given to the server)."""

    def __init__(self, parties: Sequence[PartyData]) -> None:
        self.parties = list(parties)

    def __call__(self, context: Any) -> tuple[PartyData, int]:
        index = int(context.node_config["partition-id"])
        return self.parties[index], index


def federated_noisy_histogram(
    parties: Sequence[PartyData],
    candidate_embeddings: np.ndarray,
    candidate_labels: np.ndarray,
    vote_fn: VoteFn,
    sigma: float,
    *,
    vote_bound: float,
    seed: int | None,
    noise_mode: str = "seeded",
    min_parties: int | None = None,
    clipping_range: float | None = None,
    quantization_range: int = DEFAULT_QUANTIZATION_RANGE,
    vote_grid: float | None = None,
    modulus_range: int = DEFAULT_MODULUS_RANGE,
    timeout_s: float | None = 600.0,
    verbose: bool = False,
    grid_wrapper: Callable[[Any], Any] | None = None,
    ray_address: str = "local",
    client_app: Callable[..., Any] | None = None,
) -> FederatedResult:
    """Secure sum over parties of (local votes + N(0, sigma^2 / P)) via Flower SecAgg+.

    ``seed`` seeds each party's own noise source (research mode); use a fresh seed per round.
    ``vote_bound`` B: the public (config) bound each party clips every coordinate of its votes
    to (for Top-Q votes, weights <= 1, the declared ``max_records_per_party``); with sigma and
    the other arguments it fixes C and the grid, so nothing about the parties' sizes shapes the
    round. Raises InsufficientPartiesError when fewer than ``min_parties`` contribute.
    ``vote_grid``: the lattice the votes lie on (WASP: 2^-(Q-1)), so that each party's discrete
    Gaussian share is drawn on SecAgg+'s grid (:func:`plan_quantisation`).
    ``grid_wrapper`` (an audit) wraps the server's grid, e.g. to read every reply it receives.
    ``ray_address``: where the simulation runs (:func:`run_flower_simulation`);
    ``client_app``: builds the parties' ClientApp (default ``app.make_client_app``).
    """
    require("flwr", "federated", "federated voting (Flower)")
    from dpsynth.federated.app import ServerSink, make_client_app, make_server_app

    num_parties = len(parties)
    min_parties = _check_round(parties, noise_mode, min_parties)
    cand_emb, cand_lab = _candidates(candidate_embeddings, candidate_labels)
    plan = plan_quantisation(vote_bound=vote_bound, sigma=sigma, num_parties=num_parties,
                             clipping_range=clipping_range,
                             quantization_range=quantization_range, modulus_range=modulus_range,
                             vote_grid=vote_grid)

    sink = ServerSink()
    server_app = make_server_app(cand_emb, cand_lab, num_parties=num_parties,
                                 min_parties=min_parties, sigma=sigma, plan=plan, sink=sink,
                                 timeout_s=timeout_s, grid_wrapper=grid_wrapper)
    clients = (client_app or make_client_app)(_SimulationParties(parties), vote_fn,
                                              noise_mode=noise_mode, seed=seed)
    run_flower_simulation(server_app, clients, num_parties, verbose=verbose,
                          ray_address=ray_address)

    return _result(sink, plan, sigma, num_parties)


def _check_round(parties: Sequence[PartyData], noise_mode: str, min_parties: int | None) -> int:
    """Refuse invalid parties or round settings (ValueError); returns ``min_parties`` (None:
    all parties)."""
    num_parties = len(parties)
    validate_parties(parties)
    if noise_mode not in ("seeded", "secure"):
        raise ValueError(f"noise_mode must be 'seeded' or 'secure', got {noise_mode!r}")
    if min_parties is None:
        min_parties = num_parties
    if not 2 <= min_parties <= num_parties:
        raise ValueError(f"min_parties must be in [2, {num_parties}], got {min_parties}")
    return min_parties


def _candidates(candidate_embeddings: np.ndarray,
                candidate_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The candidates as float32 [n, d] embeddings and [n] labels, or a ValueError."""
    cand_emb = np.asarray(candidate_embeddings, dtype=np.float32)
    cand_lab = np.asarray(candidate_labels)
    if cand_emb.ndim != 2 or cand_lab.ndim != 1 or cand_lab.shape[0] != cand_emb.shape[0]:
        raise ValueError(f"candidate_embeddings [n, d] and candidate_labels [n] disagree: "
                         f"{cand_emb.shape} vs {cand_lab.shape}")
    return cand_emb, cand_lab


def _result(sink: Any, plan: QuantisationPlan, sigma: float, num_parties: int) -> FederatedResult:
    """The round's released histogram as a :class:`FederatedResult`, or the server's error
    (nothing released)."""
    if sink.released is None:
        raise sink.error_kind(sink.error or "federated round released nothing")
    n = sink.parties_present
    return FederatedResult(
        histogram=sink.released,
        parties_present=n,
        num_parties=num_parties,
        sigma=float(sigma),
        effective_sigma=effective_sigma(sigma, n, num_parties),
        clipping_range=plan.clipping_range,
        clip_probability_bound=clip_probability_bound(plan, sigma, num_parties,
                                                      int(sink.released.size)),
    )


def simulation_backend(ray_address: str = "local") -> dict[str, Any]:
    """Flower's Ray backend settings: on ``"local"``, a one-machine Ray of two CPUs started for
    the round, where one actor runs all ClientApps in turn (Flower stops that Ray when the
    round ends); otherwise the running cluster at ``ray_address`` is joined (starting nothing:
    each round costs a connection, not a Ray start) and each party actor takes one CPU."""
    if ray_address == "local":
        return {"client_resources": {"num_cpus": 2, "num_gpus": 0.0},
                "init_args": dict(_LOCAL_RAY_INIT_ARGS)}
    return {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"address": ray_address, "include_dashboard": False}}


def run_flower_simulation(server_app: Any, client_app: Any, num_supernodes: int, *,
                          verbose: bool = False, ray_address: str = "local") -> None:
    """Run Flower's simulation engine on Ray (:func:`simulation_backend`)."""
    import warnings

    require("flwr.simulation", "federated", "Flower's simulation engine")
    require("ray", "federated", "Flower's simulation engine")
    import ray
    from flwr.simulation import run_simulation

    if ray_address == "local" and ray.is_initialized():
        # Flower would reuse this connection: the parties' records would go to whatever
        # cluster this process joined, not to a one-machine Ray of the round's own.
        from dpsynth.errors import ComputeError

        raise ComputeError(
            "wasp.federated.ray_address is 'local', but this process is already connected to "
            f"the Ray cluster at {ray.get_runtime_context().gcs_address}; the round would run "
            "there. Set wasp.federated.ray_address to that cluster's address to run it there, "
            "or call ray.shutdown() first"
        )

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    backend_config = simulation_backend(ray_address)
    flwr_logger = logging.getLogger("flwr")
    old_level = flwr_logger.level
    if not verbose:
        flwr_logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(server_app=server_app, client_app=client_app,
                           num_supernodes=num_supernodes, backend_name="ray",
                           backend_config=backend_config,  # type: ignore[arg-type]
                           verbose_logging=verbose)
    finally:
        flwr_logger.setLevel(old_level)
