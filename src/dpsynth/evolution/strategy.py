"""What a PE method hands the shared loop (:func:`dpsynth.methods.loop.evolve`): a strategy
with three verbs (docs/architecture.md, "Seams"). ``initial`` makes the first pool, ``vote``
scores a pool from private data (every noisy statistic through its
:class:`~dpsynth.context.Releaser`) and returns a :class:`VoteResult`, ``next`` makes the
following pool from the vote. Its state is a dataclass (:class:`StrategyState`), checkpointed
by the loop.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .pool import Pool

__all__ = ["Pool", "Start", "Starter", "Strategy", "StrategyState", "VoteResult"]


@dataclass
class StrategyState:
    """What a strategy carries between iterations (checkpointed as JSON). ``quota``: the
    released samples per label; the loop trims the final pool to it."""

    quota: np.ndarray | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StrategyState:
        out = {}
        for f in dataclasses.fields(cls):
            if f.name not in raw:
                continue
            value = raw[f.name]
            if value is not None and "ndarray" in str(f.type):
                value = np.asarray(value)
            out[f.name] = value
        return cls(**out)


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


@dataclass
class Start:
    """The initial pool and, where the method has one, the zero-shot reference set (written
    to release/zero_shot.jsonl by the loop)."""

    pool: Pool
    reference: Pool | None = None


@dataclass
class VoteResult:
    """A vote over a pool: per-candidate ``scores`` (post-processing of released statistics),
    every released histogram by name (WASP: ``near`` and ``far``), other released values by
    name (SecPE: the noisy representatives per label), and aggregate ``stats`` for stats.jsonl
    (noisy or public values only)."""

    scores: np.ndarray
    histograms: dict[str, np.ndarray] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    released: dict[Any, Any] = field(default_factory=dict)


@runtime_checkable
class Starter(Protocol):
    """A strategy without private votes (zero-shot): the initial pool is the release."""

    state: StrategyState

    def initial(self) -> Start: ...


@runtime_checkable
class Strategy(Starter, Protocol):
    """The parts a voting method plugs into the loop."""

    def vote(self, t: int, pool: Pool, emb: np.ndarray) -> VoteResult: ...

    def next(self, t: int, pool: Pool, vote: VoteResult, last: bool) -> Pool: ...
