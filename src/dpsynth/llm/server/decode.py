"""Per-row decoding of a local model: every row of a KV-cached batch sampled from its own
seeded random stream, so a request's seed holds whatever it is batched with. torch is
imported inside the functions, so that a server over an upstream never loads it."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..base import (
    Completion,
    CountsTokens,
    GenerationError,
    GenerationRequest,
    RowDecoder,
    SamplingParams,
    apply_stops,
)
from ..incremental import IncrementalText

if TYPE_CHECKING:
    import torch

#: Called from the batcher's thread with each newly settled piece of one completion's text.
DeltaSink = Callable[[str], None]
#: A request's rendering: prompt text, effective stop strings, whether it is a chat prompt.
Rendered = tuple[str, tuple[str, ...], bool]


def _filter_logits(logits: Any, params: SamplingParams) -> Any:
    """Temperature, top-k and top-p (nucleus) on a ``[B, V]`` float tensor."""
    import torch

    logits = logits / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, idx = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(ordered, dim=-1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest set reaching top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, idx, ordered)
    return logits


def _prompt_rows(gen: RowDecoder, requests: Sequence[GenerationRequest]
                 ) -> tuple[list[Rendered], list[list[int]]]:
    """Each request rendered and tokenised; a GenerationError when one is over the context."""
    params = requests[0].params
    rendered = [gen.render(r) for r in requests]
    rows = [gen.encode_prompt(text) for text, _, _ in rendered]
    for i, r in enumerate(rows):
        if len(r) + params.max_new_tokens > gen.max_context:
            raise GenerationError(f"{gen.name}: request {i} is over the context of "
                                  f"{gen.max_context} tokens", total=len(requests))
    return rendered, rows


def _left_padded(rows: Sequence[Sequence[int]], pad: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows left-padded to the longest: ids, attention mask, positions (int64 ``[B, width]``)."""
    import torch

    width = max(len(r) for r in rows)
    b = len(rows)
    ids = torch.full((b, width), int(pad), dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _row_streams(requests: Sequence[GenerationRequest]) -> list[torch.Generator]:
    """One random stream per row, seeded by its request (a random seed when it has none)."""
    import torch

    streams = []
    for r in requests:
        seed = r.params.seed if r.params.seed is not None else random.getrandbits(63)
        streams.append(torch.Generator().manual_seed(int(seed) % (2**63)))
    return streams


def _picks(logits: torch.Tensor, params: SamplingParams,
           streams: Sequence[torch.Generator]) -> list[int]:
    """The next token of each row: sampled from its own stream, or greedy at temperature 0."""
    import torch

    if params.temperature > 0:
        probs = torch.softmax(_filter_logits(logits, params), dim=-1)
        return [int(torch.multinomial(probs[i], 1, generator=streams[i]))
                for i in range(len(streams))]
    return [int(t) for t in logits.argmax(-1)]


class _Rows:
    """The tokens decoded so far of each row, which rows have ended, and their text sinks."""

    def __init__(self, gen: RowDecoder, rendered: Sequence[Rendered],
                 deltas: Sequence[DeltaSink | None] | None) -> None:
        b = len(rendered)
        self.gen = gen
        self.rendered = rendered
        self.sinks = list(deltas) if deltas is not None else [None] * b
        self.trackers = [IncrementalText(stops, is_chat) if sink is not None else None
                         for (_, stops, is_chat), sink in zip(rendered, self.sinks, strict=True)]
        self.eos = set(int(t) for t in gen.eos_token_ids)
        self.out: list[list[int]] = [[] for _ in range(b)]
        self.done = [False] * b

    def add(self, picks: Sequence[int]) -> None:
        """Append each live row's token; a row ends at end-of-sequence or a stop string."""
        for i, t in enumerate(picks):
            if self.done[i]:
                continue
            self.out[i].append(t)
            if t in self.eos:
                self.done[i] = True
                continue
            stops, tracker = self.rendered[i][1], self.trackers[i]
            if not stops and tracker is None:
                continue
            text = self.gen.decode(self.out[i])
            if stops and any(s in text for s in stops):
                self.done[i] = True
            if tracker is not None:
                piece = tracker.update(text)
                if piece:
                    self.sinks[i](piece)  # type: ignore[misc]

    def completions(self, prompts: Sequence[Sequence[int]]) -> list[Completion]:
        """The finished rows: text cut at stops, finish reason and token counts."""
        completions = []
        for row, prompt, ended, (_, stops, is_chat) in zip(self.out, prompts, self.done,
                                                            self.rendered, strict=True):
            text = apply_stops(self.gen.decode([t for t in row if t not in self.eos]), stops)
            completions.append(Completion(text.strip() if is_chat else text,
                                          "stop" if ended else "length", len(prompt), len(row)))
        return completions


def _decode(gen: RowDecoder, rows: _Rows, ids: torch.Tensor, mask: torch.Tensor,
            pos: torch.Tensor, params: SamplingParams,
            streams: Sequence[torch.Generator]) -> None:
    """The KV-cached decoding loop: one forward pass per step over every row."""
    import torch

    b = len(streams)
    with torch.inference_mode():
        logits, cache = gen.forward_last(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True
        )
        for step in range(params.max_new_tokens):
            picks = _picks(logits.float(), params, streams)
            rows.add(picks)
            if all(rows.done) or step == params.max_new_tokens - 1:
                break
            feed = torch.tensor([[int(gen.pad_token_id) if d else t]
                                 for t, d in zip(picks, rows.done, strict=True)])
            mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            logits, cache = gen.forward_last(
                cache, input_ids=feed, attention_mask=mask, position_ids=pos, use_cache=True
            )


def decode_rows(gen: RowDecoder, requests: Sequence[GenerationRequest],
                deltas: Sequence[DeltaSink | None] | None = None) -> list[Completion]:
    """Decode requests of equal sampling parameters (seeds aside) as one KV-cached batch.

    Row ``i`` samples from ``torch.Generator().manual_seed(seed_i)`` (a random seed when the
    request has none), so its random stream does not depend on the other rows; greedy when
    the temperature is 0. A row ends at an end-of-sequence token or a stop string (finish
    reason ``"stop"``) or after ``max_new_tokens`` (``"length"``). ``deltas[i]``, when given,
    is called with each newly settled piece of row ``i``'s text as it is decoded (streaming).
    ``gen`` is a :class:`~dpsynth.llm.base.RowDecoder` (the local backend).
    """
    params = requests[0].params
    rendered, prompts = _prompt_rows(gen, requests)
    ids, mask, pos = _left_padded(prompts, gen.pad_token_id)
    streams = _row_streams(requests)
    rows = _Rows(gen, rendered, deltas)
    try:
        _decode(gen, rows, ids, mask, pos, params, streams)
    except GenerationError:
        raise
    except Exception as exc:  # a torch error's message holds no prompt text
        raise GenerationError(f"{gen.name}: decoding failed ({type(exc).__name__})") from exc
    completions = rows.completions(prompts)
    if isinstance(gen, CountsTokens):
        gen.generated_tokens += sum(len(r) for r in rows.out)
    return completions
