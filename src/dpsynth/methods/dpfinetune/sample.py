"""The release of a DP fine-tune: texts sampled from the tuned model, conditioned on each label's
prompt, N_y per label split from the DP noisy label counts (or evenly). Post-processing of the
DP-SGD output and the noisy counts: it reads no private record."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...evolution.selection import allocate


def quota(samples: int, noisy_counts: np.ndarray | None, n_labels: int) -> np.ndarray:
    """Samples per label: the total split in proportion to the noisy counts (negatives 0, by
    largest remainder; docs/methods.md §1 step 1), or evenly without counts."""

    weights = np.ones(n_labels) if noisy_counts is None else np.asarray(noisy_counts)
    return allocate(samples, weights)


def sample_texts(model: Any, tokenizer: Any, heads: Sequence[Sequence[int]],
                 per_prompt: Sequence[int],
                 *, seed_for: Callable[[int, int], int], max_new_tokens: int,
                 temperature: float, top_p: float, batch: int, eos_ids: Sequence[int],
                 pad_id: int, top_k: int | None = None) -> list[tuple[int, str]]:
    """(label index, text) for ``per_prompt[y]`` samples after each label's prompt ids
    ``heads[y]`` (:func:`dpsynth.methods.dpfinetune.prompts.label_heads`),
    ``batch`` at a time, each batch seeded by ``seed_for(y, first index)`` (a resumed or
    repeated run samples the same texts from the same model)."""
    import torch

    out: list[tuple[int, str]] = []
    model.eval()
    for y, (head, n) in enumerate(zip(heads, per_prompt, strict=True)):
        head = [int(i) for i in head]
        for lo in range(0, int(n), batch):
            b = min(batch, int(n) - lo)
            ids = torch.tensor([head] * b, dtype=torch.long)
            torch.manual_seed(seed_for(y, lo) % (2**63))
            with torch.no_grad():
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     do_sample=True, temperature=temperature, top_p=top_p,
                                     top_k=top_k or 0, max_new_tokens=max_new_tokens,
                                     eos_token_id=list(eos_ids), pad_token_id=pad_id)
            for row in gen[:, len(head):].tolist():
                cut = [t for t in _until(row, eos_ids)]
                text = tokenizer.decode(cut, skip_special_tokens=True).strip()
                out.append((y, text))
    return out


def _until(row: Sequence[int], eos_ids: Sequence[int]) -> list[int]:
    """The tokens before the first end-of-text token."""
    stop = set(int(e) for e in eos_ids)
    out = []
    for t in row:
        if int(t) in stop:
            break
        out.append(int(t))
    return out
