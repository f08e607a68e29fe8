"""The one Private Evolution loop: generate -> [embed -> vote -> noise -> select -> vary] x T.

Methods differ in their parts, not in the loop: a `Strategy` says how the initial pool is
made, how candidates are scored from private data (always through the privacy session), and
how the next pool follows from the scores. The loop owns checkpoints and per-iteration stats,
so every method resumes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..runs import write_jsonl

if TYPE_CHECKING:
    from ..context import RunContext


@dataclass
class Pool:
    """Synthetic candidates: texts, joint label codes, and the index of the generator of each."""

    texts: list[str] = field(default_factory=list)
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    sources: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.texts)

    def take(self, idx: np.ndarray) -> Pool:
        idx = np.asarray(idx, dtype=np.int64)
        return Pool([self.texts[i] for i in idx], self.labels[idx], self.sources[idx])

    def extend(self, other: Pool) -> Pool:
        return Pool(self.texts + other.texts, np.concatenate([self.labels, other.labels]),
                    np.concatenate([self.sources, other.sources]))

    def to_state(self) -> dict[str, Any]:
        return {"texts": self.texts, "labels": self.labels.tolist(),
                "sources": self.sources.tolist()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Pool:
        return cls(list(state["texts"]), np.asarray(state["labels"], dtype=np.int64),
                   np.asarray(state["sources"], dtype=np.int64))

    @classmethod
    def build(cls, texts: list[str | None], labels: list[int], sources: list[int]) -> Pool:
        """A pool from generation results, dropping the failed (None) ones."""
        keep = [i for i, t in enumerate(texts) if t is not None]
        return cls([texts[i] for i in keep], np.asarray(labels, dtype=np.int64)[keep],
                   np.asarray(sources, dtype=np.int64)[keep])


class Strategy(Protocol):
    """The parts a method plugs into the loop."""

    def initial(self, ctx: RunContext) -> Pool: ...

    def score(self, ctx: RunContext, t: int, pool: Pool,
              emb: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """Noisy per-candidate scores (a released statistic) and aggregate stats."""
        ...

    def advance(self, ctx: RunContext, t: int, pool: Pool, emb: np.ndarray, scores: np.ndarray,
                last: bool) -> Pool: ...

    def finalize(self, ctx: RunContext, pool: Pool) -> Pool: ...

    def state(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...


CHECKPOINT = "evolution"


def evolve(ctx: RunContext, strategy: Strategy, iterations: int) -> Pool:
    """Run (or resume) the loop; returns the final synthetic pool.

    A checkpoint is written atomically after the initial pool and after every iteration. On
    resume the loop restarts at the first unfinished iteration; its noisy releases come back
    from the privacy session's store and its LLM calls from the request cache.
    """
    saved = ctx.run.load_checkpoint(CHECKPOINT)
    if saved is not None:
        pool = Pool.from_state(saved["pool"])
        strategy.restore(saved["strategy"])
        start = int(saved["iteration"])
        ctx.log(f"resuming at iteration {start} with {len(pool)} candidates")
    else:
        pool = strategy.initial(ctx)
        start = 0
        _save(ctx, 0, pool, strategy)
        ctx.log(f"initial pool: {len(pool)} candidates")
    for t in range(start, iterations):
        emb = ctx.embed_synthetic(pool.texts)
        scores, stats = strategy.score(ctx, t, pool, emb)
        pool = strategy.advance(ctx, t, pool, emb, scores, last=t == iterations - 1)
        _save(ctx, t + 1, pool, strategy)
        # The pool after a round is post-processing of released votes: safe to share, and the
        # evaluation draws its per-iteration FID curve from these files.
        write_jsonl(ctx.run.release / "iterations" / f"iter{t + 1}.jsonl", ctx.rows(pool))
        ctx.run.append_stats({"iteration": t + 1, "candidates": int(len(emb)),
                              "kept": int(len(pool)), **stats})
        ctx.log(f"iteration {t + 1}/{iterations}: {len(pool)} in pool")
    return strategy.finalize(ctx, pool)


def _save(ctx: RunContext, iteration: int, pool: Pool, strategy: Strategy) -> None:
    ctx.run.save_checkpoint(CHECKPOINT, {"iteration": iteration, "pool": pool.to_state(),
                                         "strategy": strategy.state()})
