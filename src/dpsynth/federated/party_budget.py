"""A party's own budget in a federated deployment (deploy.md).

The budget belongs to the data, and in a deployment the data lies on the party's host, where
no dpsynth runner accounts it: the server only ever sees a secure sum. So before its noisy
votes leave the host, the party charges the round to its own budget ledger (the host's
default ledger unless the node config names one) and refuses the round past its cap.

The charge is the party's worst case that it accepts: the unmasked sum holds at least
``trust_parties`` noise shares of std sigma / sqrt(P) (1 by default: its own share alone, as
if every other party colluded or dropped out), so one of its records is protected by the
distributed discrete Gaussian of that many shares (Kairouz, Liu & Steinke 2021, the same event
a simulated run is charged with at ``min_parties``). The simulated parties of a dpsynth run
have no budget of their own: the runner charges the whole run on the data's ledger.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..identity import DataIdentity, file_digest
from ..privacy.distributed import share_sigma
from ..privacy.ledger import DEFAULT_TOTAL_EPSILON
from ..voting import topq_sensitivity

if TYPE_CHECKING:  # the accountant is imported when a round is charged, not with the party
    from ..privacy import BudgetLedger

#: WASP's default Top-Q depth (the deployment's default vote grid 2^-7)
DEFAULT_TOP_Q = 8


@dataclass(frozen=True)
class PartyBudget:
    """One party's ledger, the identity of its data file and how it charges a round."""

    ledger: BudgetLedger
    identity: DataIdentity
    delta: float = 1e-5
    sensitivity: float = topq_sensitivity(DEFAULT_TOP_Q)
    trust_parties: int = 1
    total_epsilon: float | None = None
    total_delta: float | None = None
    #: The cap of a source with none of its own (the ledger's default; None: ``no-cap``).
    default_epsilon: float | None = DEFAULT_TOTAL_EPSILON

    def round_epsilon(self, sigma: float, num_parties: int, step: float, dim: int) -> float:
        """Epsilon at :attr:`delta` of one round for one of this party's records."""
        from ..privacy import Accountant, DistributedDiscreteGaussianEvent

        acc = Accountant("pld")
        acc.add(DistributedDiscreteGaussianEvent(
            sigma=share_sigma(sigma, num_parties), sensitivity=self.sensitivity,
            parties=self.trust_parties, dimension=dim, grid=step, name="party_round"))
        return acc.epsilon(self.delta)

    def charge(self, sigma: float, num_parties: int, step: float, dim: int) -> float:
        """Charge one round (reserved and settled at once: it is released as it leaves);
        raises BudgetRefusedError past the cap, before anything is computed. Returns the
        epsilon charged."""
        eps = self.round_epsilon(sigma, num_parties, step, dim)
        run_id = f"party-round-{uuid.uuid4().hex[:12]}"
        self.ledger.reserve(self.identity, run_id, eps, self.delta, self.total_epsilon,
                            self.total_delta, details={"method": "wasp-federated-party",
                                                       "trust_parties": self.trust_parties},
                            default_epsilon=self.default_epsilon)
        self.ledger.settle(run_id, eps, self.delta)
        return eps


def party_budget(data_path: str | Path, node_config: Any) -> PartyBudget:
    """A deployment party's budget from its node config: ``ledger`` (default: the host's
    ledger), ``source`` (default: the data file's path), ``delta`` (1e-5), ``total-epsilon``
    and ``total-delta`` (the source's cap; without them the ledger's default epsilon cap
    holds unless ``no-cap`` is true), ``trust-parties`` (1) and ``vote-sensitivity`` (Top-Q's
    at Q = 8)."""
    from ..privacy import BudgetLedger

    path = Path(data_path)
    digest = file_digest(path)
    ledger = node_config.get("ledger")
    identity = DataIdentity(name=str(node_config.get("source") or path.resolve()),
                            content=digest, records=digest, sketch=())

    def number(key: str, default: float | None) -> float | None:
        value = node_config.get(key, default)
        return None if value is None else float(value)

    trust = int(node_config.get("trust-parties", 1))
    if trust < 1:
        raise ValueError(f"node config 'trust-parties' must be >= 1, got {trust}")
    return PartyBudget(
        BudgetLedger(str(ledger) if ledger else None), identity,
        delta=float(node_config.get("delta", 1e-5)),
        sensitivity=float(node_config.get("vote-sensitivity",
                                          topq_sensitivity(DEFAULT_TOP_Q))),
        trust_parties=trust, total_epsilon=number("total-epsilon", None),
        total_delta=number("total-delta", None),
        default_epsilon=None if _flag(node_config.get("no-cap", False)) else DEFAULT_TOTAL_EPSILON)


def _flag(value: Any) -> bool:
    """A node-config boolean (Flower passes strings from the command line)."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


__all__ = ["PartyBudget", "party_budget"]
