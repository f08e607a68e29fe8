"""Zero-shot generation with no private data at all (epsilon 0): the reference every private
method must beat. Samples are split evenly over the public label classes."""

from __future__ import annotations

import numpy as np

from ..config import RunConfig
from ..context import PrivateView, Releaser, Rngs
from ..evolution.operators import Generation
from ..evolution.parts import zero_shot_to_quota
from ..evolution.selection import allocate
from ..evolution.strategy import Start, StrategyState
from ..privacy import ReleasePlan
from .base import Job, Outcome, PrivacyPlan
from .pe import PEMethod


class ZeroShotStrategy:
    """RANDOM_API only: the initial pool is the release (no vote, no next pool)."""

    def __init__(self, samples: int, n_labels: int, gen: Generation) -> None:
        self.samples = samples
        self.n_labels = n_labels
        self.gen = gen
        self.state = StrategyState()

    def initial(self) -> Start:
        self.state.quota = allocate(self.samples, np.ones(self.n_labels))
        return Start(zero_shot_to_quota(self.gen, self.state.quota, "init"))


class ZeroShot(PEMethod):
    name = "zero_shot"
    private_passes = ()
    private_votes = False

    def release_plan(self, config: RunConfig, n_labels: int) -> ReleasePlan:
        """Nothing: no private record is read."""
        return ReleasePlan()

    def strategy(self, config: RunConfig, view: PrivateView, releaser: Releaser,
                 gen: Generation, rngs: Rngs, plan: PrivacyPlan) -> ZeroShotStrategy:
        return ZeroShotStrategy(config.synthesis.samples, view.n_labels, gen)

    def guarantee_statement(self, job: Job, outcome: Outcome) -> dict[str, object]:
        p = job.config.privacy
        return {"epsilon": 0.0, "delta": 0.0, "target_epsilon": p.epsilon,
                "target_delta": p.delta, "unit": p.unit, "accountant": p.accountant,
                "noise": p.noise, "mechanisms": [],
                "note": "no private record was read: label values are public input"}
