"""Zero-shot generation with no private data at all (epsilon 0): the reference every private
method must beat. Labels are split evenly over the label classes seen in the data (the label
domain is treated as public)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import RunConfig
from ..evolution import operators as ops
from ..evolution.loop import Pool
from ..evolution.selection import allocate
from .base import Method

if TYPE_CHECKING:
    from ..context import RunContext


class ZeroShotStrategy:
    def __init__(self) -> None:
        self.quota: np.ndarray | None = None

    def initial(self, ctx: RunContext) -> Pool:
        self.quota = allocate(ctx.config.synthesis.samples, np.ones(ctx.n_labels))
        return ops.zero_shot(ctx, self.quota, "init")

    def score(self, ctx: RunContext, t: int, pool: Pool, emb: np.ndarray):  # pragma: no cover
        raise AssertionError("zero_shot makes no private releases")

    def advance(self, ctx, t, pool, emb, scores, last):  # pragma: no cover
        raise AssertionError("zero_shot has no iterations")

    def finalize(self, ctx: RunContext, pool: Pool) -> Pool:
        return pool

    def state(self) -> dict[str, Any]:
        return {"quota": None if self.quota is None else self.quota.tolist()}

    def restore(self, state: dict[str, Any]) -> None:
        self.quota = None if state["quota"] is None else np.asarray(state["quota"])


class ZeroShot(Method):
    name = "zero_shot"
    private_votes = False

    def iterations(self, config: RunConfig) -> int:
        return 0

    def vote_releases(self, config: RunConfig, n_labels: int) -> int:
        return 0

    def strategy(self, ctx: RunContext) -> ZeroShotStrategy:
        return ZeroShotStrategy()
