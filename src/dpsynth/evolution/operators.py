"""Generation operators of the PE family over a pool: RANDOM_API, VARIATION_API and WASP's
contrastive generation. Each spreads its work over the run's generators by given weights."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import prompts as P
from .loop import Pool
from .selection import allocate

if TYPE_CHECKING:
    from ..context import RunContext


def split_by_weights(n: int, weights: np.ndarray) -> np.ndarray:
    """How many of n samples each generator makes (largest remainder on the weights)."""
    return allocate(n, np.asarray(weights, dtype=np.float64))


def _run_jobs(ctx: RunContext, instructions: list[str], labels: list[int], sources: list[int],
              tags: list[str]) -> tuple[Pool, np.ndarray]:
    """Send each instruction to its generator; keep the cleaned successes (and say which)."""
    texts: list[str | None] = [None] * len(instructions)
    src = np.asarray(sources, dtype=np.int64)
    for g, synth in enumerate(ctx.synthesizers):
        idx = np.flatnonzero(src == g)
        if len(idx) == 0:
            continue
        out = synth.complete([instructions[i] for i in idx], [tags[i] for i in idx],
                             progress=ctx.progress)
        for i, text in zip(idx, out, strict=True):
            texts[i] = text
    ok = np.array([i for i, t in enumerate(texts) if t is not None], dtype=np.int64)
    return Pool.build(texts, labels, sources), ok


def zero_shot(ctx: RunContext, per_label: np.ndarray, tag: str,
              weights: np.ndarray | None = None) -> Pool:
    """RANDOM_API: per_label[y] label-conditioned zero-shot samples for each label y."""
    n_gen = len(ctx.synthesizers)
    weights = np.ones(n_gen) if weights is None else weights
    instructions, labels, sources, tags = [], [], [], []
    task = ctx.config.prompts.task
    for y, n_y in enumerate(per_label):
        text = P.describe_labels(ctx.label_dict(y), ctx.config.prompts)
        for g, n_g in enumerate(split_by_weights(int(n_y), weights)):
            for j in range(int(n_g)):
                instructions.append(P.zero_shot_instruction(task, text))
                labels.append(y)
                sources.append(g)
                tags.append(f"{tag}/{y}/{g}/{j}")
    return _run_jobs(ctx, instructions, labels, sources, tags)[0]


def variations(ctx: RunContext, pool: Pool, n_each: int, tag: str) -> tuple[Pool, np.ndarray]:
    """VARIATION_API (docs/methods.md §1, step 3e): n_each variations of every sample in the
    pool, by the generator that wrote it; rephrase with a random style or fill in masked words.

    Returns the variations and, for each, the index of its parent in `pool`."""
    cfg = ctx.config.synthesis
    styles = ctx.config.prompts.styles
    rng = ctx.rng_for(tag)
    instructions, labels, sources, tags = [], [], [], []
    for i, text in enumerate(pool.texts):
        label = int(pool.labels[i])
        label_text = P.describe_labels(ctx.label_dict(label), ctx.config.prompts)
        for j in range(n_each):
            kind = cfg.variation
            if kind == "mixed":
                kind = "rephrase" if rng.random() < 0.5 else "fill_in"
            if kind == "rephrase":
                style = styles[int(rng.integers(len(styles)))]
                instr = P.rephrase_instruction(ctx.config.prompts.task, label_text, text, style)
            else:
                masked = P.mask_words(text, cfg.mask_rate, rng)
                instr = P.fill_in_instruction(ctx.config.prompts.task, label_text, masked)
            instructions.append(instr)
            labels.append(label)
            sources.append(int(pool.sources[i]))
            tags.append(f"{tag}/{i}/{j}")
    out, ok = _run_jobs(ctx, instructions, labels, sources, tags)
    return out, ok // max(n_each, 1)


def contrastive(ctx: RunContext, per_label: np.ndarray, weights: np.ndarray,
                good: dict[int, list[str]], bad: dict[int, list[str]], n_demos: int,
                tag: str) -> Pool:
    """WASP step 5: per label, new samples from prompts with random subsets of n_demos/2 good
    and n_demos/2 bad demonstrations; generators share the work by their weights."""
    half = max(1, n_demos // 2)
    rng = ctx.rng_for(tag)
    instructions, labels, sources, tags = [], [], [], []
    task = ctx.config.prompts.task
    for y, n_y in enumerate(per_label):
        label_text = P.describe_labels(ctx.label_dict(y), ctx.config.prompts)
        g_texts, b_texts = good.get(y, []), bad.get(y, [])
        for g, n_g in enumerate(split_by_weights(int(n_y), weights)):
            for j in range(int(n_g)):
                if g_texts and b_texts:
                    gi = rng.choice(len(g_texts), size=min(half, len(g_texts)), replace=False)
                    bi = rng.choice(len(b_texts), size=min(half, len(b_texts)), replace=False)
                    instr = P.contrastive_instruction(task, label_text,
                                                      [g_texts[k] for k in gi],
                                                      [b_texts[k] for k in bi])
                else:
                    instr = P.zero_shot_instruction(task, label_text)
                instructions.append(instr)
                labels.append(y)
                sources.append(g)
                tags.append(f"{tag}/{y}/{g}/{j}")
    return _run_jobs(ctx, instructions, labels, sources, tags)[0]
