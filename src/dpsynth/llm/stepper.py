"""One shared token at a time over many prompts, on a local model's KV cache (DP-SynRAG's
private prediction, docs/methods.md §4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import GenerationError


class Stepper:
    """Decode one shared token at a time over many prompts, reusing the KV cache.

    Private prediction in DP-SynRAG: every row (a private document) proposes next-token
    logits, a DP mechanism picks one token, and :meth:`advance` appends that same token to
    all rows -- one forward pass of the whole batch per token, over ``past_key_values``.
    """

    def __init__(self, gen: Any, prompts: Sequence[str], shared_prefix: str) -> None:
        """``gen``: the :class:`dpsynth.llm.local.LocalGenerator` whose model runs the rows."""
        import torch

        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        self._gen = gen
        self.batch_size = len(prompts)
        self.tokens: list[int] = []
        with torch.inference_mode():
            if shared_prefix:
                prefix = gen.encode_prompt(shared_prefix)
                rows = [gen.encode(p) for p in prompts]
                if any(not r for r in rows):
                    raise ValueError("open_stepper: each prompt needs at least one token")
                _, cache = gen.forward_last(
                    input_ids=torch.tensor([prefix]),
                    position_ids=torch.arange(len(prefix)).unsqueeze(0),
                    use_cache=True,
                )
                cache.batch_repeat_interleave(self.batch_size)
                ids, smask = gen._pad_left(rows)
                pmask = torch.ones((self.batch_size, len(prefix)), dtype=torch.long)
                mask = torch.cat([pmask, smask], dim=1)
                pos = len(prefix) + (smask.cumsum(-1) - 1).clamp(min=0)
                logits, cache = gen.forward_last(
                    cache,
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=pos,
                    use_cache=True,
                )
                self._length = len(prefix) + max(len(r) for r in rows)
            else:
                rows = [gen.encode_prompt(p) for p in prompts]
                ids, mask = gen._pad_left(rows)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                logits, cache = gen.forward_last(
                    input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
                )
                self._length = ids.shape[1]
        self._cache: Any = cache
        self._mask = mask
        self._next_pos = pos[:, -1:] + 1
        self._logits = logits.float().cpu().numpy().astype(np.float32, copy=False)

    def logits(self) -> np.ndarray:
        """Next-token logits ``[B, V]`` (float32) of every row."""
        if self._cache is None:
            raise GenerationError("stepper is closed")
        return self._logits

    def advance(self, token_id: int) -> None:
        """Append the same token to every row: one batched forward pass over the KV cache."""
        import torch

        if self._cache is None:
            raise GenerationError("stepper is closed")
        if not 0 <= int(token_id) < self._gen.vocab_size:
            raise ValueError(f"advance: token_id {token_id} outside the vocabulary")
        if self._length + 1 > self._gen.max_context:
            raise GenerationError(f"stepper: context of {self._gen.max_context} tokens is full")
        b = self.batch_size
        self._mask = torch.cat([self._mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        with torch.inference_mode():
            logits, self._cache = self._gen.forward_last(
                self._cache,
                input_ids=torch.full((b, 1), int(token_id), dtype=torch.long),
                attention_mask=self._mask,
                position_ids=self._next_pos,
                use_cache=True,
            )
        self._next_pos = self._next_pos + 1
        self._length += 1
        self.tokens.append(int(token_id))
        self._logits = logits.float().cpu().numpy().astype(np.float32, copy=False)

    def close(self) -> None:
        """Free the KV cache."""
        self._cache = None

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
