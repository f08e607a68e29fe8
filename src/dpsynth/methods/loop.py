"""The one Private Evolution loop: generate -> [embed -> vote -> noise -> select -> vary] x T.

Methods differ in their parts, not in the loop: each hands it a strategy
(:mod:`dpsynth.evolution.strategy`). The loop owns checkpoints, per-iteration stats and every
release file (zero_shot.jsonl, iterations/, synthetic.jsonl), so every method resumes and
releases the same way. It stands on the methods' floor, above the parts it drives
(docs/architecture.md, "Floors"): the loop calls down into the strategy it is handed and the
strategy calls down into the shared parts, so no call climbs back up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import progress
from ..context import Rngs
from ..evolution.operators import Generation
from ..evolution.parts import trim_to_quota
from ..evolution.pool import Pool
from ..evolution.prompts import MOSTLY_CUT, cut_share
from ..evolution.strategy import Starter, Strategy
from ..files import SHARED_MODE, write_jsonl
from ..run_folder import RunDir

CHECKPOINT = "evolution"


def evolve(strategy: Starter, gen: Generation, run: RunDir, rngs: Rngs,
           iterations: int) -> Pool:
    """Run (or resume) the loop; writes the release files and returns the released pool.

    A checkpoint is written atomically after the initial pool and after every iteration. On
    resume the loop restarts at the first unfinished iteration; its noisy releases come back
    from the privacy session's store and its LLM calls from the request cache.
    """
    if iterations and not isinstance(strategy, Strategy):
        raise TypeError(f"{type(strategy).__name__} cannot vote: it runs with 0 iterations")
    generated = FilterShares(gen)
    saved = run.load_checkpoint(CHECKPOINT)
    if saved is not None:
        pool = Pool.from_state(saved["pool"])
        strategy.state = type(strategy.state).from_json(saved["strategy"])
        start = int(saved["iteration"])
        initial_filtered = saved.get("initial_filtered", {})
        gen.label_gates = {int(g): dict(gate) for g, gate in
                           saved.get("label_gates", {}).items()}
        run.log(f"resuming at iteration {start} with {len(pool)} candidates")
    else:
        progress.stage("initial pool")
        begun = strategy.initial()
        pool = begun.pool
        if begun.reference is not None:
            write_jsonl(run.release / "zero_shot.jsonl", gen.rows(begun.reference),
                        mode=SHARED_MODE)
        start = 0
        initial_filtered = {f"{k}_initial": v for k, v in generated.since_last().items()}
        _save(run, 0, pool, strategy, initial_filtered, gen)
        run.log(f"initial pool: {len(pool)} candidates")
    for t in range(start, iterations):
        assert isinstance(strategy, Strategy)
        progress.stage(f"iteration {t + 1}/{iterations}")
        generated.since_last()  # this round's generations only: a resumed round counts alike
        emb = gen.embed(pool.texts)
        with progress.step("private vote and noise"):
            vote = strategy.vote(t, pool, emb)
        pool = strategy.next(t, pool, vote, last=t == iterations - 1)
        # The pool after a round is post-processing of released votes: safe to share, and the
        # evaluation draws its per-iteration FID curve from these files. Both are written
        # before the checkpoint (each write replaces its own), so a stop in between repeats
        # the round - same noise from the store, same texts from the request cache - and a
        # resumed run never misses a round's files.
        write_jsonl(run.release / "iterations" / f"iter{t + 1}.jsonl", gen.rows(pool),
                    mode=SHARED_MODE)
        run.append_stats({"iteration": t + 1, "candidates": int(len(emb)),
                          "kept": int(len(pool)), **vote.stats, **generated.since_last(),
                          **(initial_filtered if t == 0 else {})})
        _save(run, t + 1, pool, strategy, initial_filtered, gen)
        run.log(f"iteration {t + 1}/{iterations}: {len(pool)} in pool")
    quota = strategy.state.quota
    final = pool if quota is None else trim_to_quota(pool, quota, rngs)
    progress.stage("release")
    _release(run, gen, final, generated)
    progress.stage("")
    return final


def _release(run: RunDir, gen: Generation, final: Pool, generated: FilterShares) -> None:
    """release/synthetic.jsonl, after the warnings on what the filters refused and on texts
    that stop mid-sentence."""
    generated.warn_if_mostly_filtered(run)
    warn_if_mostly_cut(run, final.texts, "a larger generators[].max_new_tokens, or "
                       "synthesis.max_words set to the texts' length in words")
    write_jsonl(run.release / "synthetic.jsonl", gen.rows(final), mode=SHARED_MODE)
    run.log(f"release: {len(final)} synthetic samples in {run.release / 'synthetic.jsonl'}")


#: the share of generations the filters refused above which a run warns
MOSTLY_FILTERED = 0.5


def warn_if_mostly_cut(run: RunDir, texts: Sequence[str], change: str) -> None:
    """Warn when more than :data:`MOSTLY_CUT` of the released ``texts`` stop mid-sentence
    (a token cap cut them with no full sentence in their second half to trim back to,
    :func:`~dpsynth.evolution.prompts.trim_to_sentence`), with ``change``: what to change.
    Synthetic texts only."""
    share = cut_share(texts)
    if share <= MOSTLY_CUT:
        return
    message = (f"{share:.0%} of the released texts stop mid-sentence: the token cap cut "
               f"them with no full sentence to trim back to. What to change: {change}")
    progress.warn(message)
    run.log(f"warning: {message}")


class FilterShares:
    """How many generations the public filters refused (chatter, echoes, placeholders,
    duplicates: :func:`dpsynth.evolution.prompts.clean_generation`), per iteration for
    stats.jsonl and over this attempt for the closing warning. Synthetic texts only."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        self.last = self._now()

    def _now(self) -> tuple[int, int, int, int]:
        counts = self.gen.counts()
        return (counts.get("sent", 0), counts.get("rejected", 0), counts.get("off_label", 0),
                counts.get("short", 0))

    def since_last(self) -> dict[str, Any]:
        """{"generated", "filtered_share", "off_label_share", "short_share"} since the previous
        call (or the start); the off-label and short shares are parts of the filtered one."""
        now, before = self._now(), self.last
        self.last = now
        n = now[0] - before[0]

        def share(k: int) -> float:
            return round((now[k] - before[k]) / n, 4) if n else 0.0

        return {"generated": n, "filtered_share": share(1), "off_label_share": share(2),
                "short_share": share(3)}

    def warn_if_mostly_filtered(self, run: RunDir) -> None:
        """Warn when most generations were refused, as the report's caveat reads the same
        shares: how many as chatter (the text filters), as another label's text (the label
        check) and as shorter than the length band, with what to change for each, the larger
        part first."""
        sent, rejected, off, short = self._now()
        if not sent or rejected / sent <= MOSTLY_FILTERED:
            return
        chatter, other, brief = (rejected - off - short) / sent, off / sent, short / sent
        parts = sorted(
            [(chatter, f"{chatter:.0%} were refused by the filters (assistant chatter, echoes "
                       "of the prompt, placeholders, answers, duplicates)",
              "for the chatter, prompts.writer and prompts.task in the words of the texts' "
              "writers, a larger generator, or more synthesis.retries"),
             (other, f"{other:.0%} were another label's text (the label check refused them)",
              "for the other labels' texts, each label described in plain words in "
              "prompts.label_descriptions, or a larger generator"),
             (brief, f"{brief:.0%} were shorter than the length band's short end",
              "for the short texts, a lower synthesis.min_words, or a generator that writes "
              "at the records' length")],
            key=lambda part: -part[0])
        parts = [p for p in parts if p[0] > 0]
        message = (f"{rejected / sent:.0%} of this run's generations were refused, so most of "
                   "what the model wrote was not a record of the task: "
                   + " and ".join(p[1] for p in parts) + ". What to change: "
                   + "; ".join(p[2] for p in parts))
        progress.warn(message)
        run.log(f"warning: {message}")


def _save(run: RunDir, iteration: int, pool: Pool, strategy: Starter,
          initial_filtered: dict[str, Any], gen: Generation) -> None:
    run.save_checkpoint(CHECKPOINT, {"iteration": iteration, "pool": pool.to_state(),
                                     "strategy": strategy.state.to_json(),
                                     "initial_filtered": initial_filtered,
                                     "label_gates": {str(g): gate for g, gate
                                                     in gen.label_gates.items()}})
