"""OpenVINO bf16 engine for :class:`~dpsynth.llm.local.LocalGenerator` (sampling only).

Where the CPU multiplies bf16 natively (AVX512-BF16 or AMX) this engine runs SmolLM2 about
1.4x as fast as CTranslate2 int8 at the default batch of 64 (benchmarks/results/
generation.md): CTranslate2 copies every layer's whole KV cache on every step (a third of its
step on this model, profiled), where OpenVINO keeps the cache in place inside its fused
attention (the decoder graph of :mod:`dpsynth.llm.ov_stepper`, exported once and shared with
DP-SynRAG's stepper). bf16 is also closer to float32 than int8.

One batch (:meth:`OpenVinoEngine.generate`):

* the rows' common prefix (a chat template's system turn) is run once, with batch size 1,
  and every row continues its state; the rest of each distinct prompt is prefilled in one
  left-padded pass (pads are masked), and rows that repeat a prompt (a zero-shot batch holds
  a few label prompts, each row with its own seed) continue its state row: prefill is most
  of the generation time at short caps (the model's GEMMs are compute-bound here);
* each step, the output layer runs in torch on a bf16 copy of the float32 weights (float32
  where the decoder runs f32: one thread; read from the safetensors, so sampling alone never
  loads the float32 model once the decoder is exported), and
  :func:`~dpsynth.llm.sampling.next_tokens` draws each row's token from **the row's own
  seeded generator** (a row's text follows its request's seed and its logits, not a batch
  seed);
* a row that draws an end-of-sequence token, or whose text holds one of its stop strings, is
  dropped from the batch (OpenVINO reorders the cache by ``beam_idx``);
* the compiled decoder, the output layer and the sampling run on
  :func:`~dpsynth.llm.runtime.stepper_threads` (the configured threads, else every core), never
  on the cores idle at the moment: OpenVINO's numbers follow
  the thread count, and a seeded run must give the same texts whatever else the machine runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import ct2, ov_stepper
from .base import GenerationError, SamplingParams
from .runtime import stepper_threads, torch_threads
from .sampling import next_tokens


@contextlib.contextmanager
def _engine_errors() -> Iterator[None]:
    """An OpenVINO failure as a GenerationError (its message holds no prompt text)."""
    try:
        yield
    except Exception as exc:
        raise GenerationError(f"openvino generation failed ({type(exc).__name__})") from exc


def read_config(model_dir: Path) -> dict[str, Any]:
    """A model directory's ``config.json``, its text config where it has one."""
    config = json.loads((model_dir / "config.json").read_text())
    return dict(config.get("text_config") or config)


def stored_output_layer(model_dir: Path, config: dict[str, Any]) -> tuple[Any, Any]:
    """The output layer's (weight, bias or None) as stored in the directory's safetensors,
    float torch tensors, without loading the model: ``lm_head.weight``, else the input
    embedding where the config ties the two; (None, None) when neither is there."""
    from safetensors import safe_open

    names = ["lm_head.weight"]
    if config.get("tie_word_embeddings"):
        names.append("model.embed_tokens.weight")
    for name in names:
        for path in sorted(model_dir.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                keys = set(f.keys())
                if name in keys:
                    bias = f.get_tensor("lm_head.bias") if "lm_head.bias" in keys else None
                    return f.get_tensor(name), bias
    return None, None


class LogitBuffers:
    """The output layer's ``[rows, V]`` product and its float32 copy, allocated once per batch
    and reused by every decode step (rows that end shrink the batch: a step uses the first
    rows).

    Allocating them afresh each step (12.6 MB and 6.3 MB at 64 rows of SmolLM2's 49152 logits,
    plus the temperature's copy) left glibc's heap holding freed blocks among the KV-cache
    buffers OpenVINO reallocates when rows leave the batch: over 128 Yelp-length texts the
    resident set grew about 2.0 GB that way and 1.2-1.5 GB with these buffers, the same texts
    at 1.04-1.10x the speed (benchmarks/results/generation_memory.md)."""

    def __init__(self, rows: int, weight: Any) -> None:
        import torch

        self._raw = torch.empty((rows, weight.shape[0]), dtype=weight.dtype)
        self._f32 = self._raw if weight.dtype == torch.float32 else torch.empty(
            (rows, weight.shape[0]), dtype=torch.float32)

    def product(self, h: Any, weight: Any, bias: Any) -> Any:
        """``F.linear(h, weight, bias).float()`` written into the buffers' first rows."""
        import torch

        raw, f32 = self._raw[: h.shape[0]], self._f32[: h.shape[0]]
        if bias is None:
            torch.mm(h, weight.t(), out=raw)
        else:
            torch.addmm(bias, h, weight.t(), out=raw)
        if f32 is not raw:
            f32.copy_(raw)
        return f32


def distinct_rows(rows: Sequence[Sequence[int]]) -> tuple[list[Sequence[int]], np.ndarray]:
    """(each distinct row once, in first-seen order; the index of each row's among them)."""
    first: dict[tuple[int, ...], int] = {}  # insertion order: first-seen order
    index = np.asarray([first.setdefault(tuple(r), len(first)) for r in rows], dtype=np.int64)
    return [list(key) for key in first], index


class OpenVinoEngine:
    """Batched sampling on the OpenVINO decoder of a :class:`LocalGenerator` (see the module
    docstring); ``precision`` as :func:`dpsynth.llm.ov_stepper.compiled` takes it."""

    def __init__(self, gen: Any, precision: str = "bf16") -> None:
        import torch

        self._gen = gen
        self._compiled = ov_stepper.compiled(gen, precision)
        self.threads = stepper_threads(gen)
        self.precision = ov_stepper.runnable_precision(precision, self.threads)
        self.eos_token_ids = frozenset(int(e) for e in gen.eos_token_ids)
        config = read_config(Path(gen.model_dir))
        weight, bias = stored_output_layer(Path(gen.model_dir), config)
        if weight is None:  # not under a name we know: the loaded model's own
            head = gen.model.get_output_embeddings()
            weight, bias = head.weight.detach(), getattr(head, "bias", None)
            bias = bias.detach() if bias is not None else None
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        self._weight = weight.float().to(dtype)
        self._bias = bias.float().to(dtype) if bias is not None else None
        self._softcap = config.get("final_logit_softcapping")

    def logits(self, hidden: np.ndarray, into: LogitBuffers | None = None) -> Any:
        """The output layer on last hidden states ``[B, H]``: float32 torch ``[B, V]``, on the
        decoder's threads (torch's float32 product of 7 rows differs in the last bits between
        one thread and two, and torch's threads follow the idle cores).

        With ``into``, the product is written into its first ``B`` rows and a view of them is
        returned (valid until the next call with the same buffers), the same numbers as
        without: a decode step then allocates no ``[B, V]`` array (see :class:`LogitBuffers`)."""
        import torch
        import torch.nn.functional as F

        with torch.inference_mode(), torch_threads(self.threads):
            h = torch.from_numpy(hidden).to(self._weight.dtype)
            if into is None:
                out = F.linear(h, self._weight, self._bias).float()
            else:
                out = into.product(h, self._weight, self._bias)
            if self._softcap:
                out = torch.tanh(out / self._softcap) * self._softcap
        return out

    def open_rows(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, np.ndarray, np.ndarray,
                                                                  np.ndarray, np.ndarray]:
        """Prefill ``prompts`` (token ids; their common prefix once, see
        :func:`dpsynth.llm.ov_stepper.prefill`, and each distinct prompt once: a zero-shot
        batch repeats a few label prompts, each row with its own seed): (infer request, last
        hidden states ``[B, H]``, valid keys ``[B, length]``, next positions ``[B, 1]``, the
        request's state row each row continues ``[B]``, for the first :meth:`step`)."""
        request = self._compiled.create_infer_request()
        unique, state_rows = distinct_rows(prompts)
        head = ct2.shared_prefix(unique)
        head = head if head >= ct2.MIN_STATIC_PREFIX else 0
        with _engine_errors():
            hidden, valid, pos = ov_stepper.prefill(
                self._compiled, request, self._gen.pad_left, list(unique[0][:head]),
                [list(p[head:]) for p in unique])
        return request, hidden[state_rows], valid[state_rows], pos[state_rows], state_rows

    def step(self, request: Any, tokens: np.ndarray, keep: np.ndarray, valid: np.ndarray,
             pos: np.ndarray, state_rows: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]:
        """Feed ``tokens`` (int64 ``[K]``) to the rows ``keep`` of the request's batch (the
        others are dropped); (their last hidden states, their valid keys). ``state_rows``:
        the request's state row of each row of the batch (after :meth:`open_rows`; else the
        rows are the state's)."""
        valid = np.concatenate([valid[keep], np.ones((len(keep), 1), dtype=bool)], axis=1)
        beams = keep if state_rows is None else state_rows[keep]
        with _engine_errors():
            hidden = ov_stepper.last_hidden(self._compiled, request, tokens[:, None],
                                            ov_stepper.decode_mask(valid), pos,
                                            beams.astype(np.int32))
        return hidden, valid

    def continuation_log_probs(self, head: Sequence[int], cont: Sequence[int]) -> np.ndarray:
        """Log-probabilities ``[len(cont), V]`` of the next token at each position that
        predicts a token of ``cont`` after the prompt ``head`` (teacher-forced steps)."""
        import torch

        request, hidden, valid, pos, _ = self.open_rows([list(head)])
        rows = [hidden]
        one = np.zeros(1, dtype=np.int64)
        for t in list(cont)[:-1]:
            hidden, valid = self.step(request, np.asarray([t], dtype=np.int64), one, valid, pos)
            pos = pos + 1
            rows.append(hidden)
        return torch.log_softmax(self.logits(np.concatenate(rows)), -1).numpy()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int | None],
        stops: Sequence[tuple[str, ...]],
        decode: Callable[[Sequence[int]], str],
    ) -> list[tuple[list[int], bool]]:
        """Generated token ids per prompt (EOS dropped) and whether the row ended by EOS
        (:meth:`dpsynth.llm.ct2.Ct2Engine.generate`'s contract, with a seed per row)."""
        rngs = [np.random.default_rng(None if s is None else int(s) % 2**63) for s in seeds]
        out: list[list[int]] = [[] for _ in prompts]
        ended = [False] * len(prompts)
        request, hidden, valid, pos, state_rows = self.open_rows(prompts)
        first: np.ndarray | None = state_rows  # the first step gathers the prefilled rows
        alive = np.arange(len(prompts))
        buffers = LogitBuffers(len(prompts), self._weight)
        for step in range(params.max_new_tokens):
            logits = self.logits(hidden, into=buffers)
            with torch_threads(self.threads):
                tokens = next_tokens(logits, params, [rngs[r] for r in alive], scratch=True)
            keep = []
            for j, (r, t) in enumerate(zip(alive, tokens, strict=True)):
                if int(t) in self.eos_token_ids:
                    ended[r] = True
                    continue
                out[r].append(int(t))
                if not (stops[r] and any(s in decode(out[r]) for s in stops[r])):
                    keep.append(j)
            if not keep or step == params.max_new_tokens - 1:
                break
            kept = np.asarray(keep)
            hidden, valid = self.step(request, tokens[kept], kept, valid, pos[kept], first)
            alive, pos, first = alive[kept], pos[kept] + 1, None
        return [(ids, end) for ids, end in zip(out, ended, strict=True)]
