"""The release of a DP fine-tune: texts sampled from the tuned model, conditioned on each label's
prompt, N_y per label split from the DP noisy label counts (or evenly). Post-processing of the
DP-SGD output and the noisy counts: it reads no private record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...evolution.selection import allocate, shrunk_counts


def quota(samples: int, noisy_counts: np.ndarray | None, n_labels: int,
          noise_var: float = 0.0) -> np.ndarray:
    """Samples per label: the total split in proportion to the noisy counts shrunk toward
    their mean by their noise variance (:func:`shrunk_counts`; negatives 0, by largest
    remainder; docs/methods.md §1), or evenly without counts."""

    weights = (np.ones(n_labels) if noisy_counts is None
               else shrunk_counts(np.asarray(noisy_counts), noise_var))
    return allocate(samples, weights)


def sample_texts(model: Any, tokenizer: Any, heads: Sequence[Sequence[int]],
                 per_prompt: Sequence[int],
                 *, seed_for: Callable[..., int], max_new_tokens: int,
                 temperature: float, top_p: float, batch: int, eos_ids: Sequence[int],
                 pad_id: int, top_k: int | None = None,
                 clean: Callable[[str], str | None] | None = None,
                 check: Callable[[list[int], list[str]], np.ndarray] | None = None,
                 retries: int = 0) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(label index, text) for ``per_prompt[y]`` samples after each label's prompt ids
    ``heads[y]`` (:func:`dpsynth.methods.dpfinetune.prompts.label_heads`), ``batch`` at a
    time, each batch seeded by ``seed_for(y, first index)`` (a resumed or repeated run
    samples the same texts from the same model); and the counts of refused texts (``refused``,
    of them ``off_label``) and of those left out (``dropped``).

    ``clean``: the PE methods' public text filters (a text, or None for one they refuse);
    ``check(labels, texts)``: a mask of the texts the label check refuses, over every label's
    texts of one attempt at once (its gate needs many). A refused text is drawn again, up to
    ``retries`` more times (``seed_for(y, first index, attempt)``). After the last try a slot
    still empty keeps the last text only the label check refused (the check steers, as in
    the PE methods: it never empties a release), and is left out when the filters refused
    every try."""
    counts = {"refused": 0, "off_label": 0, "dropped": 0}
    kept: list[list[str]] = [[] for _ in heads]
    fallback: list[list[str]] = [[] for _ in heads]  # the last attempt's off-label texts
    model.eval()
    for attempt in range(retries + 1 if clean is not None or check is not None else 1):
        drawn: list[tuple[int, str]] = []
        for y, (head, n) in enumerate(zip(heads, per_prompt, strict=True)):
            need = int(n) - len(kept[y])
            for lo in range(0, max(0, need), batch):
                seed = seed_for(y, lo) if attempt == 0 else seed_for(y, lo, attempt)
                for text in _draw(model, tokenizer, head, min(batch, need - lo), seed,
                                  max_new_tokens, temperature, top_p, top_k, eos_ids, pad_id):
                    cleaned = text if clean is None else clean(text)
                    if cleaned is None:
                        counts["refused"] += 1
                    else:
                        drawn.append((y, cleaned))
        off = (check([y for y, _ in drawn], [t for _, t in drawn])
               if check is not None and drawn else np.zeros(len(drawn), dtype=bool))
        counts["refused"] += int(off.sum())
        counts["off_label"] += int(off.sum())
        off_label: list[list[str]] = [[] for _ in heads]
        for (y, text), refuse in zip(drawn, off, strict=True):
            (off_label if refuse else kept)[y].append(text)
        fallback = [new or old for new, old in zip(off_label, fallback, strict=True)]
    for y, n in enumerate(per_prompt):
        kept[y] += fallback[y][:max(0, int(n) - len(kept[y]))]
    counts["dropped"] = sum(int(n) - len(k) for n, k in zip(per_prompt, kept, strict=True))
    return [(y, text) for y, texts in enumerate(kept) for text in texts], counts


def _draw(model: Any, tokenizer: Any, head: Sequence[int], rows: int, seed: int,
          max_new_tokens: int, temperature: float, top_p: float, top_k: int | None,
          eos_ids: Sequence[int], pad_id: int) -> list[str]:
    """``rows`` texts sampled after ``head`` in one seeded generate call."""
    import torch

    ids = torch.tensor([[int(i) for i in head]] * rows, dtype=torch.long)
    torch.manual_seed(seed % (2**63))
    with torch.no_grad():
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             do_sample=True, temperature=temperature, top_p=top_p,
                             top_k=top_k or 0, max_new_tokens=max_new_tokens,
                             eos_token_id=list(eos_ids), pad_token_id=pad_id)
    return [tokenizer.decode(_until(row, eos_ids), skip_special_tokens=True).strip()
            for row in gen[:, len(head):].tolist()]


def _until(row: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """The tokens before the first end-of-text token."""
    stop = set(int(e) for e in eos_ids)
    out = []
    for t in row:
        if int(t) in stop:
            break
        out.append(int(t))
    return out
