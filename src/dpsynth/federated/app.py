"""Flower apps for WASP's federated voting: a SecAgg+ ServerApp and a party ClientApp.

Server side (``make_server_app``): broadcasts the public candidates (embeddings, labels) and the
public round parameters (sigma, P, vote bound B, clipping range C, quantisation range R; all
from the config and sigma, never from party sizes), runs flwr's ``SecAggPlusWorkflow`` inside a
``DefaultWorkflow`` (one round) and hands the *aggregate only* to a ``ServerSink``. The factory
takes no party data; the workflow unmasks only the sum of the parties' quantised vectors.

Client side (``make_client_app``): a ``ClientApp`` with ``secaggplus_mod``; on the fit stage the
party computes y_l = clip_B(h_l) plus its discrete Gaussian share of std sigma / sqrt(P) on the
public grid, drawn from its own noise source (core.party_submission); secaggplus_mod then
quantises (exactly, the value is already on its grid) and masks y_l before anything leaves the
party.

SecAgg+ weighting: the workflow averages sum_l w_l x_l / sum_l w_l; every party reports weight 1
(max_weight 1.0, so no weight quantisation error) and the server multiplies the mean by the
number of contributing parties to recover the sum.

Deployment apps (``server_app`` / ``client_app`` module attributes, see deploy.md) read their
inputs from the run config (server; the public bound is ``max-records-per-party``) and node
config (parties).
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.client import Client, NumPyClient
from flwr.client.mod import secaggplus_mod
from flwr.clientapp import ClientApp
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import LegacyContext, ServerConfig
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid, ServerApp

from dpsynth.federated.core import (
    FederatedRoundError,
    InsufficientPartiesError,
    PartyData,
    VoteFn,
    party_submission,
)
from dpsynth.federated.party_budget import PartyBudget, party_budget
from dpsynth.privacy.distributed import QuantisationPlan, plan_quantisation

CFG_SIGMA = "dpsynth-sigma"
CFG_NUM_PARTIES = "dpsynth-num-parties"
CFG_VOTE_BOUND = "dpsynth-vote-bound"
CFG_CLIPPING_RANGE = "dpsynth-clipping-range"
CFG_QUANTIZATION_RANGE = "dpsynth-quantization-range"


@dataclass
class ServerSink:
    """What the server side ends up with: the released aggregate or an error, never per-party data.

    ``observed`` records every array the strategy received (tests check that each one equals the
    aggregate); ``wire`` optionally records every reply message the server's grid received.
    """

    released: np.ndarray | None = None
    parties_present: int = 0
    error: str | None = None
    error_kind: type[FederatedRoundError] = FederatedRoundError
    observed: list[np.ndarray] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fail(self, message: str, kind: type[FederatedRoundError] = FederatedRoundError) -> None:
        with self.lock:
            if self.error is None:
                self.error, self.error_kind = message, kind


def reconstruction_threshold(num_parties: int, min_parties: int) -> int:
    """SecAgg+ key-reconstruction threshold t = min_parties.

    Fewer than t surviving parties cannot reconstruct the masks, so SecAgg+ halts and nothing is
    unmasked: a sum carrying fewer than min_parties noise shares (noise variance below
    min_parties / P sigma^2, the worst case each round is charged for) never reaches the server.
    """
    if not 2 <= min_parties <= num_parties:
        raise ValueError(f"min_parties must be in [2, {num_parties}], got {min_parties}")
    return int(min_parties)


class SecureSumStrategy(Strategy):
    """Legacy Strategy for one SecAgg+ round: broadcast candidates, release the sum or refuse."""

    def __init__(self, candidate_embeddings: np.ndarray, candidate_labels: np.ndarray, *,
                 num_parties: int, min_parties: int, sigma: float, plan: QuantisationPlan,
                 sink: ServerSink, wait_timeout_s: int = 600) -> None:
        super().__init__()
        self._candidates = [np.asarray(candidate_embeddings, dtype=np.float32),
                            np.asarray(candidate_labels, dtype=np.int64)]
        self.num_parties = num_parties
        self.min_parties = min_parties
        self.sigma = float(sigma)
        self.plan = plan
        self.sink = sink
        self.wait_timeout_s = wait_timeout_s

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return ndarrays_to_parameters(self._candidates)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        # num_available() refreshes the node registry (wait_for alone polls only every 5 s).
        deadline = time.monotonic() + self.wait_timeout_s
        while client_manager.num_available() < self.num_parties and time.monotonic() < deadline:
            time.sleep(0.05)
        if client_manager.num_available() < self.num_parties:
            self.sink.fail(f"only {client_manager.num_available()} of {self.num_parties} parties "
                           "connected", InsufficientPartiesError)
            return []
        clients = client_manager.sample(self.num_parties, self.num_parties)
        config: dict[str, Scalar] = {
            CFG_SIGMA: self.sigma, CFG_NUM_PARTIES: self.num_parties,
            CFG_VOTE_BOUND: self.plan.vote_bound,
            CFG_CLIPPING_RANGE: self.plan.clipping_range,  # the same plan SecAgg+ runs with
            CFG_QUANTIZATION_RANGE: self.plan.quantization_range}
        fit_ins = FitIns(parameters, config)
        return [(c, fit_ins) for c in clients]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        n = len(results)
        arrays = [parameters_to_ndarrays(res.parameters) for _, res in results]
        with self.sink.lock:
            self.sink.observed.extend(a[0].copy() for a in arrays if a)
        if n == 0:
            self.sink.fail("no party contributed to the secure sum", InsufficientPartiesError)
            return None, {}
        mean = np.asarray(arrays[0][0], dtype=np.float64)
        if n < self.min_parties:
            self.sink.fail(
                f"only {n} of {self.num_parties} parties contributed (minimum {self.min_parties});"
                " the sum would carry noise variance "
                f"{n}/{self.num_parties} * sigma^2, nothing released", InsufficientPartiesError)
            return None, {}
        with self.sink.lock:
            self.sink.released = mean * n
            self.sink.parties_present = n
        return None, {}

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, Any]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[Any],
                           failures: list[Any]) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int,
                 parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None


def make_server_app(candidate_embeddings: np.ndarray, candidate_labels: np.ndarray, *,
                    num_parties: int, min_parties: int, sigma: float, plan: QuantisationPlan,
                    sink: ServerSink, timeout_s: float | None = 600.0,
                    grid_wrapper: Callable[[Grid], Grid] | None = None) -> ServerApp:
    """ServerApp running one SecAgg+ round; its inputs are public (no party data, no seed).
    ``grid_wrapper``: the server's grid as the caller wraps it (an audit that reads every
    reply the server receives)."""
    threshold = reconstruction_threshold(num_parties, min_parties)

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = SecureSumStrategy(
            candidate_embeddings, candidate_labels, num_parties=num_parties,
            min_parties=min_parties, sigma=sigma, plan=plan, sink=sink)
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1),
                               strategy=strategy)
        workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
            num_shares=1.0,  # every party shares its keys with all others
            reconstruction_threshold=threshold,
            max_weight=1.0,
            clipping_range=plan.clipping_range,
            quantization_range=plan.quantization_range,
            modulus_range=plan.modulus_range,
            timeout=timeout_s,
        ))
        workflow(grid if grid_wrapper is None else grid_wrapper(grid), legacy)
        if sink.released is None:
            sink.fail(f"SecAgg+ halted: fewer than the reconstruction threshold ({threshold}) of "
                      f"{num_parties} parties completed the protocol; nothing released",
                      InsufficientPartiesError)

    return app


class PartyClient(NumPyClient):
    """One party: computes its noisy local histogram from the broadcast candidates."""

    def __init__(self, party: PartyData, party_index: int, vote_fn: VoteFn, *,
                 noise_mode: str, seed: int | None, min_sigma: float = 0.0,
                 budget: PartyBudget | None = None) -> None:
        self.min_sigma = min_sigma
        #: a deployment party's own ledger, charged before its votes leave (None: simulated
        #: parties, whose run the runner charges)
        self.budget = budget
        self.party = party
        self.party_index = party_index
        self.vote_fn = vote_fn
        self.noise_mode = noise_mode
        self.seed = seed

    def fit(self, parameters: list[np.ndarray],
            config: dict[str, Scalar]) -> tuple[list[np.ndarray], int, dict[str, Scalar]]:
        cand_emb, cand_lab = parameters
        sigma = float(config[CFG_SIGMA])
        if sigma < self.min_sigma:
            raise ValueError(f"server asked for sigma {sigma} below this party's minimum "
                             f"{self.min_sigma}; refusing to contribute")
        if self.budget is not None:  # refused past the party's cap, before anything is drawn
            clip = float(config[CFG_CLIPPING_RANGE])
            self.budget.charge(sigma, int(config[CFG_NUM_PARTIES]),
                               2.0 * clip / int(config[CFG_QUANTIZATION_RANGE]), len(cand_emb) * 2)
        noisy = party_submission(
            self.party, cand_emb, cand_lab, self.vote_fn,
            sigma=sigma, num_parties=int(config[CFG_NUM_PARTIES]),
            vote_bound=float(config[CFG_VOTE_BOUND]),
            clipping_range=float(config[CFG_CLIPPING_RANGE]),
            quantization_range=int(config[CFG_QUANTIZATION_RANGE]),
            noise_mode=self.noise_mode, seed=self.seed, party_index=self.party_index)
        # Weight 1 for every party (see module docstring); no metrics leave the party.
        return [noisy], 1, {}


PartyLoader = Callable[[Context], tuple[PartyData, int]]
#: Builds a party's client: ``(party data, party index, vote_fn, noise_mode=, seed=)``
PartyFactory = Callable[..., NumPyClient]
#: Builds a round's ClientApp: :func:`make_client_app`'s signature (a test passes one whose
#: parties drop out)
ClientAppFactory = Callable[..., ClientApp]


def make_client_app(load_party: PartyLoader, vote_fn: VoteFn, *, noise_mode: str = "secure",
                    seed: int | None = None, party: PartyFactory = PartyClient) -> ClientApp:
    """ClientApp with secaggplus_mod; ``load_party(context) -> (PartyData, party_index)``;
    ``party`` builds each party's client (default :class:`PartyClient`)."""

    def client_fn(context: Context) -> Client:
        data, index = load_party(context)
        return party(data, index, vote_fn, noise_mode=noise_mode, seed=seed).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


# ---------------------------------------------------------------------------------------------
# Deployment entry points (`flwr run`; see deploy.md). Inputs come from config files on each host.


def _import_vote_fn(ref: str) -> VoteFn:
    module, _, attr = ref.partition(":")
    if not module or not attr:
        raise ValueError(f"vote-fn must look like 'package.module:function', got {ref!r}")
    fn = getattr(importlib.import_module(module), attr)
    if not callable(fn):
        raise ValueError(f"vote-fn {ref!r} is not callable")
    return fn


def _deploy_load_party(context: Context) -> tuple[PartyData, int]:
    path = context.node_config.get("data-path")
    if not path:
        raise ValueError("node config 'data-path' (an .npz with embeddings, labels) is required")
    with np.load(str(path)) as z:
        party = PartyData(embeddings=z["embeddings"], labels=z["labels"])
    return party, int(context.node_config.get("party-index", 0))


def _deploy_client_fn(context: Context) -> Client:
    """Party side of a deployment: noise from the OS CSPRNG; the party's node config may pin
    the vote function (``vote-fn``) and a floor on sigma (``min-sigma``) the server must meet;
    every round is charged to the party's own ledger first (:mod:`.party_budget`)."""
    party, index = _deploy_load_party(context)
    ref = context.node_config.get("vote-fn") or context.run_config["vote-fn"]
    vote_fn = _import_vote_fn(str(ref))
    min_sigma = float(context.node_config.get("min-sigma", 0.0))
    budget = party_budget(str(context.node_config["data-path"]), context.node_config)
    return PartyClient(party, index, vote_fn, noise_mode="secure", seed=None,
                       min_sigma=min_sigma, budget=budget).to_client()


client_app = ClientApp(client_fn=_deploy_client_fn, mods=[secaggplus_mod])


def deploy_plan(run_config: Any, sigma: float, num_parties: int) -> QuantisationPlan:
    """A deployment round's quantisation plan from its run config only: the public bound
    ``max-records-per-party`` (each party clips its votes to it) and sigma, as in a dpsynth
    run (``wasp.federated.max_records_per_party``); no party reports its size."""
    bound = run_config.get("max-records-per-party")
    if bound is None:
        raise ValueError(
            "run config 'max-records-per-party' is required: the public bound on the records "
            "of one party (each party clips every vote coordinate to it; see deploy.md)")
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound >= 1:
        raise ValueError(f"run config 'max-records-per-party' must be a number >= 1, got "
                         f"{bound!r}")
    grid = run_config.get("vote-grid", 2.0 ** -7)  # WASP's Top-Q lattice 2^-(Q-1), Q = 8
    return plan_quantisation(vote_bound=float(bound), sigma=sigma, num_parties=num_parties,
                             vote_grid=float(grid))

server_app = ServerApp()


@server_app.main()
def _deploy_server_main(grid: Grid, context: Context) -> None:
    """Run one round from run-config inputs; write the released sum (or error) to output-path."""
    from dpsynth.federated.core import clip_probability_bound, effective_sigma

    cfg = context.run_config
    with np.load(str(cfg["candidates-path"])) as z:
        cand_emb, cand_lab = z["embeddings"], z["labels"]
    num_parties = int(cfg["num-parties"])
    min_parties = int(cfg.get("min-parties", num_parties))
    sigma = float(cfg["sigma"])
    plan = deploy_plan(cfg, sigma, num_parties)
    sink = ServerSink()
    inner = make_server_app(cand_emb, cand_lab, num_parties=num_parties,
                            min_parties=min_parties, sigma=sigma, plan=plan, sink=sink)
    inner(grid, context)
    out = str(cfg["output-path"])
    if sink.released is None:
        raise sink.error_kind(sink.error or "no release")
    np.savez(out, histogram=sink.released, parties_present=sink.parties_present,
             effective_sigma=effective_sigma(sigma, sink.parties_present, num_parties),
             clip_probability_bound=clip_probability_bound(
                 plan, sigma, num_parties, int(sink.released.size)))
