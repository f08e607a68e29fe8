"""One shared token at a time over many prompts, on a local model's KV cache (DP-SynRAG's
private prediction, docs/methods.md §4)."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import GenerationError, RowsApartOpener


def cache_keyword(module: Any) -> str:
    """The KV-cache keyword of a decoder's forward (``cache`` in newer transformers)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else \
        "past_key_values"


def output_logits(model: Any, hidden: Any, ids: np.ndarray | None) -> np.ndarray:
    """The output layer of ``model`` on the last hidden states ``[B, H]`` (torch), over the
    whole vocabulary (``ids`` None) or the rows ``ids`` only; float32 ``[B, V or len(ids)]``,
    with the model's final logit soft-capping where it has one."""
    import torch
    import torch.nn.functional as F

    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    with torch.inference_mode():
        hidden = hidden.to(device=weight.device, dtype=weight.dtype)
        if ids is not None:
            index = torch.as_tensor(np.asarray(ids, dtype=np.int64), device=weight.device)
            weight = weight.index_select(0, index)
            bias = bias.index_select(0, index) if bias is not None else None
        out = F.linear(hidden, weight, bias).float()
        cap = getattr(model.config, "final_logit_softcapping", None)
        if cap:
            out = torch.tanh(out / cap) * cap
    return out.cpu().numpy().astype(np.float32, copy=False)


class SharedTokenStepper:
    """What every stepper engine shares: rows that all advance by the same token, the output
    layer on demand, and the checks. An engine implements ``_is_open``, ``_head(ids)`` (logits
    over ``ids``, None = the whole vocabulary), ``_step(token_id)`` (one forward pass of every
    row) and ``_free``; it sets ``_gen``, ``batch_size``, ``tokens`` and ``_length``."""

    _gen: Any
    batch_size: int
    tokens: list[int]
    _length: int
    _logits: np.ndarray | None = None

    def _is_open(self) -> bool:
        raise NotImplementedError

    def _head(self, ids: np.ndarray | None) -> np.ndarray:
        raise NotImplementedError

    def _step(self, token_id: int) -> None:
        raise NotImplementedError

    def _free(self) -> None:
        raise NotImplementedError

    def logits(self) -> np.ndarray:
        """Next-token logits ``[B, V]`` (float32) of every row."""
        if not self._is_open():
            raise GenerationError("stepper is closed")
        if self._logits is None:
            self._logits = self._head(None)
        return self._logits

    def logits_at(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Next-token logits ``[B, len(ids)]`` (float32) of every row at the token ``ids``
        only: the output layer's rows for ``ids``, nothing else computed."""
        if not self._is_open():
            raise GenerationError("stepper is closed")
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= self._gen.vocab_size:
            raise ValueError("logits_at: ids must be a non-empty list of vocabulary ids")
        return self._head(ids)

    def advance(self, token_id: int) -> None:
        """Append the same token to every row: one batched forward pass over the KV cache."""
        if not self._is_open():
            raise GenerationError("stepper is closed")
        if not 0 <= int(token_id) < self._gen.vocab_size:
            raise ValueError(f"advance: token_id {token_id} outside the vocabulary")
        if self._length + 1 > self._gen.max_context:
            raise GenerationError(f"stepper: context of {self._gen.max_context} tokens is full")
        self._step(int(token_id))
        self._length += 1
        self.tokens.append(int(token_id))
        self._logits = None

    def close(self) -> None:
        """Free the KV cache."""
        self._free()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Stepper(SharedTokenStepper):
    """Decode one shared token at a time over many prompts, reusing the KV cache.

    Private prediction in DP-SynRAG: every row (a private document) proposes next-token
    logits, a DP mechanism picks one token, and :meth:`advance` appends that same token to
    all rows -- one forward pass of the whole batch per token, over ``past_key_values``. The
    model is :meth:`LocalGenerator.stepper_model` (float32 or bf16). The last hidden state is
    kept and the output layer applied on demand: :meth:`logits` over the whole vocabulary, or
    :meth:`logits_at` over a given set of token ids only (DP-SynRAG's public candidate set;
    the other rows of the output layer are never computed).
    """

    def __init__(self, gen: Any, prompts: Sequence[str], shared_prefix: str) -> None:
        """``gen``: the :class:`dpsynth.llm.local.LocalGenerator` whose model runs the rows."""
        import torch

        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        self._gen = gen
        self._model = gen.stepper_model()
        self._device = next(self._model.parameters()).device
        self.batch_size = len(prompts)
        self.tokens: list[int] = []
        with torch.inference_mode():
            if shared_prefix:
                prefix = gen.encode_prompt(shared_prefix)
                rows = [gen.encode(p) for p in prompts]
                if any(not r for r in rows):
                    raise ValueError("open_stepper: each prompt needs at least one token")
                _, cache = self._forward(
                    None,
                    input_ids=torch.tensor([prefix]),
                    position_ids=torch.arange(len(prefix)).unsqueeze(0),
                )
                cache.batch_repeat_interleave(self.batch_size)
                ids, smask = gen.pad_left(rows)
                pmask = torch.ones((self.batch_size, len(prefix)), dtype=torch.long)
                mask = torch.cat([pmask, smask], dim=1)
                pos = len(prefix) + (smask.cumsum(-1) - 1).clamp(min=0)
                hidden, cache = self._forward(cache, input_ids=ids, attention_mask=mask,
                                              position_ids=pos)
                self._length = len(prefix) + max(len(r) for r in rows)
            else:
                rows = [gen.encode_prompt(p) for p in prompts]
                ids, mask = gen.pad_left(rows)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                hidden, cache = self._forward(None, input_ids=ids, attention_mask=mask,
                                              position_ids=pos)
                self._length = ids.shape[1]
        self._cache: Any = cache
        self._mask = mask
        self._next_pos = pos[:, -1:] + 1
        self._hidden = hidden
        self._logits = None

    def _forward(self, cache: Any, **inputs: Any) -> tuple[Any, Any]:
        """One forward pass of the decoder (no output layer): (last hidden state [B, H],
        new KV cache)."""
        base = self._model.get_decoder()
        kw: dict[str, Any] = {k: v.to(self._device) for k, v in inputs.items()}
        kw["use_cache"] = True
        if cache is not None:
            kw[cache_keyword(base)] = cache
        out = base(**kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.last_hidden_state[:, -1, :], new_cache

    def _is_open(self) -> bool:
        return self._cache is not None

    def _head(self, ids: np.ndarray | None) -> np.ndarray:
        return output_logits(self._model, self._hidden, ids)

    def _step(self, token_id: int) -> None:
        import torch

        b = self.batch_size
        self._mask = torch.cat([self._mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        with torch.inference_mode():
            self._hidden, self._cache = self._forward(
                self._cache,
                input_ids=torch.full((b, 1), token_id, dtype=torch.long),
                attention_mask=self._mask,
                position_ids=self._next_pos,
            )
        self._next_pos = self._next_pos + 1

    def _free(self) -> None:
        self._cache = None
        self._hidden = None


class RowsApart:
    """Many prompts, each row's logits a function of its own prompt alone: every row in a
    stepper of its own (a batch of one, no padding), all advanced by the same token.

    A batched stepper's numbers depend on the batch: left padding to the longest row and the
    batch size pick the kernels and their summation order, so in bf16 one row's clipped logits
    moved by up to 0.02 (OpenVINO) and 0.07 (torch) when another row was added
    (benchmarks/row_shift.py; docs/methods.md §4, "Rows apart"). Here nothing of one row's
    computation sees another. The engine-agnostic form (any generator's ``open_stepper``);
    :class:`dpsynth.llm.ov_stepper.OpenVinoRowsApart` keeps the decode batched at shapes
    fixed by public values."""

    def __init__(self, steppers: Sequence[Any]) -> None:
        if not steppers:
            raise ValueError("open_stepper: prompts must not be empty")
        self._rows = list(steppers)
        self.batch_size = len(self._rows)
        self.tokens: list[int] = []

    def logits(self) -> np.ndarray:
        return np.concatenate([np.asarray(s.logits()) for s in self._rows])

    def logits_at(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        at = [getattr(s, "logits_at", None) for s in self._rows]
        if all(callable(f) for f in at):
            return np.concatenate([np.asarray(f(ids)) for f in at])
        return self.logits()[:, np.asarray(ids, dtype=np.int64)]

    def advance(self, token_id: int) -> None:
        for s in self._rows:
            s.advance(int(token_id))
        self.tokens.append(int(token_id))

    def close(self) -> None:
        for s in self._rows:
            s.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_rows_apart(gen: Any, prompts: Sequence[str], shared_prefix: str = "",
                    width: int | None = None, rows: int = 16) -> Any:
    """A stepper over ``prompts`` whose every row's logits depend on that row's prompt alone
    (see :class:`RowsApart`): the generator's own ``open_rows_apart`` where it has one (the
    OpenVINO stepper: rows prefilled one by one, decoded ``rows`` at a time at the public
    ``width``), else one ``open_stepper`` per prompt."""
    if isinstance(gen, RowsApartOpener):
        return gen.open_rows_apart(prompts, shared_prefix, width=width, rows=rows)
    return rows_apart_of(lambda p: gen.open_stepper([p], shared_prefix=shared_prefix), prompts)


def rows_apart_of(open_one: Any, prompts: Sequence[str]) -> RowsApart:
    """:class:`RowsApart` over ``open_one(prompt)`` for each prompt (those opened are closed
    again if one fails)."""
    opened: list[Any] = []
    try:
        for prompt in prompts:
            opened.append(open_one(prompt))
    except BaseException:
        for st in opened:
            st.close()
        raise
    return RowsApart(opened)
