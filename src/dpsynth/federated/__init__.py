"""Federated WASP voting over Flower SecAgg+ (docs/methods.md §2, federated variant).

``federated_noisy_histogram`` runs one round in Flower's simulation engine; ``rounds`` charges a
round before it runs (``accounted_round``); ``split`` splits a simulated run's records over its
parties (record-local); ``app`` holds the
ServerApp/ClientApp (also usable in a real deployment, see deploy.md). Flower is imported only
when a round runs.
"""

from dpsynth.federated.core import (
    FederatedResult,
    FederatedRoundError,
    InsufficientPartiesError,
    PartyData,
    VoteFn,
    effective_sigma,
    party_submission,
)
from dpsynth.federated.simulation import federated_noisy_histogram
from dpsynth.privacy.distributed import QuantisationPlan, plan_quantisation

__all__ = [
    "FederatedResult",
    "FederatedRoundError",
    "InsufficientPartiesError",
    "PartyData",
    "QuantisationPlan",
    "VoteFn",
    "effective_sigma",
    "federated_noisy_histogram",
    "party_submission",
    "plan_quantisation",
]
