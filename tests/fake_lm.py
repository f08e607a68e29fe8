"""A tiny deterministic "language model" with the local backend's token-level surface.

:class:`TokenFake` has what :func:`dpsynth.llm.server.decode_rows` needs (``render``,
``encode_prompt``, ``forward_last`` over a KV "cache", ``decode``, ``eos_token_ids``,
``pad_token_id``, ``max_context``), so ``dpsynth llm serve`` decodes it token by token on the
production path, fast and exactly. Each token is one public word (decoded with a leading
space). Next-token logits are a hash of the row's tokens so far; a prompt holding the word
``brief`` ends (end-of-sequence) after :data:`BRIEF_WORDS` words, any other prompt never
ends by itself. ``gate``/``gate_after`` hold decoding before step ``gate_after`` until the
gate is set (``held`` says it is waiting), so a test can see chunks arrive mid-generation;
``fail_at`` raises at that step.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpsynth.llm.base import Completion, GenerationRequest
from fakes import WORDS

EOS = len(WORDS)
VOCAB = EOS + 1
BRIEF_WORDS = 3
BRIEF = WORDS.index("help")  # prompts are encoded onto the word list; "brief" maps here


class _Cache:
    def __init__(self, rows: list[list[int]]) -> None:
        self.prompt_lengths = [len(r) for r in rows]
        self.rows = rows


class TokenFake:
    """See the module docstring."""

    name = "fake:tiny"
    model_id = "tiny"
    supports_chat = True

    def __init__(self, *, max_context: int = 256, gate: threading.Event | None = None,
                 gate_after: int = 2, fail_at: int | None = None) -> None:
        self.max_context = max_context
        self.eos_token_ids = (EOS,)
        self.eos_token_id = EOS
        self.pad_token_id = EOS
        self.vocab_size = VOCAB
        self.gate = gate
        self.gate_after = gate_after
        self.held = threading.Event()
        self.fail_at = fail_at
        self.steps = 0  # decoding steps of the current batch

    # -- text --------------------------------------------------------------------------------
    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]:
        if isinstance(request.prompt, str):
            return request.prompt, request.params.stop, False
        text = " ".join(f"{m['role']} : {m['content']}" for m in request.prompt)
        return text + " assistant :", request.params.stop, True

    def encode(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word.lower().strip(".,!?") == "brief":
                ids.append(BRIEF)
            else:  # any other word: a hashed id that is never BRIEF
                h = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % (EOS - 1)
                ids.append(h + (h >= BRIEF))
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text) or [0]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f" {WORDS[int(i)]}" for i in ids if int(i) != EOS)

    # -- the model ---------------------------------------------------------------------------
    def _logits(self, cache: _Cache) -> Any:
        import torch

        out = np.empty((len(cache.rows), VOCAB), dtype=np.float32)
        for b, (row, plen) in enumerate(zip(cache.rows, cache.prompt_lengths, strict=True)):
            digest = hashlib.sha256(np.asarray(row, dtype=np.int64).tobytes()).digest()
            logits = 2.0 * np.random.default_rng(int.from_bytes(digest[:8], "little")) \
                .standard_normal(VOCAB)
            brief = BRIEF in row[:plen]
            logits[EOS] = 100.0 if brief and len(row) - plen >= BRIEF_WORDS else -100.0
            out[b] = logits
        return torch.from_numpy(out)

    def forward_last(self, cache: _Cache | None = None, **inputs: Any) -> tuple[Any, _Cache]:
        ids = inputs["input_ids"].tolist()
        if cache is None:
            mask = inputs["attention_mask"].tolist()
            cache = _Cache([[t for t, m in zip(r, mr, strict=True) if m] for r, mr in
                            zip(ids, mask, strict=True)])
            self.steps = 0
        else:
            for row, new in zip(cache.rows, ids, strict=True):
                row.extend(new)
            self.steps += 1
            if self.fail_at is not None and self.steps >= self.fail_at:
                raise RuntimeError("injected decoding failure")
            if self.gate is not None and self.steps == self.gate_after:
                self.held.set()
                self.gate.wait(timeout=20)
                self.held.clear()
        return self._logits(cache), cache

    def generate(self, requests: Sequence[GenerationRequest], *,
                 progress: bool = True) -> list[str]:
        from dpsynth.llm.server import decode_rows

        return [decode_rows(self, [r])[0].text for r in requests]


class ReportingFake:
    """A generator without token-level decoding that reports how each text ended.

    Its text is ``"answer <i> seed=<seed>"``; ``finish_reason`` "length" and 7 generated
    tokens of a prompt of 3, whatever was asked.
    """

    name = "fake:reporting"
    supports_chat = True

    def generate(self, requests: Sequence[GenerationRequest], *,
                 progress: bool = True) -> list[str]:
        return [c.text for c in self.complete(requests, progress=progress)]

    def complete(self, requests: Sequence[GenerationRequest], *,
                 progress: bool = True) -> list[Completion]:
        return [Completion(f"answer {i} seed={r.params.seed}", "length", 3, 7)
                for i, r in enumerate(requests)]
