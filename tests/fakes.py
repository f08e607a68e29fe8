"""Deterministic fakes of the model seams: a generator and an embedder that load nothing.

* :class:`FakeGenerator` follows the :class:`dpsynth.llm.Generator` protocol: each output is
  a string of words from a fixed public word list, chosen by hashing (prompt, sampling seed,
  nonce, occurrence, generator seed). It never copies prompt text, so a private string that
  shows up in a release was put there by the code under test, not by the fake. It also has
  the token-level surface DP-SynRAG's private prediction and self-filtering use
  (``encode``/``decode``/``encode_prompt``/``render``/``next_token_logits``/``open_stepper``,
  ``vocab_size``, ``eos_token_id``) over a small word vocabulary, with logits drawn from the
  hash of the token ids so far. Failures are configurable (empty outputs, refusals, raising).
* :class:`FakeEmbedder` maps a text to the normalised sum of hashed unit vectors of its words,
  so texts that share words land near each other and voting is meaningful.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from dpsynth.llm.base import (
    FALLBACK_STOPS,
    GenerationError,
    GenerationRequest,
    apply_stops,
    render_chat_fallback,
)

#: Public words the fake writes with (no private text can come from here).
WORDS: tuple[str, ...] = (
    "the", "a", "clinic", "appointment", "doctor", "nurse", "patient", "visit", "pain",
    "headache", "fever", "cough", "skin", "rash", "heart", "blood", "pressure", "test",
    "result", "follow", "up", "week", "morning", "evening", "call", "please", "help",
    "question", "about", "my", "your", "medicine", "dose", "refill", "pharmacy", "bill",
    "insurance", "form", "schedule", "cancel", "change", "time", "today", "tomorrow", "soon",
    "worried", "better", "worse", "since", "after", "before", "with", "and", "or", "not",
    "need", "want", "ask", "thank", "you", "still", "again", "new", "old", "child", "back",
    "knee", "eye", "ear", "throat", "sleep", "tired", "diet", "exercise", "report", "scan",
    "xray", "vaccine", "allergy", "yes", "no",
)
EOS_ID = len(WORDS)  # one past the words: the end-of-text token
_UNK_BASE = EOS_ID + 1
_UNK = 16  # unknown words hash into 16 extra ids (decoded as "w<id>")


def _digest(*parts: object) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str,
                                     ensure_ascii=False).encode("utf-8")).digest()


def _rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(int.from_bytes(_digest(*parts)[:8], "little"))


class FakeStepper:
    """Token-by-token logits over several prompts (the shape of ``dpsynth.llm.stepper.Stepper``)."""

    def __init__(self, gen: FakeGenerator, prompts: Sequence[str], shared_prefix: str) -> None:
        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        self._gen = gen
        prefix = gen.encode_prompt(shared_prefix) if shared_prefix else []
        self._rows = [prefix + gen.encode(p) for p in prompts]
        self.batch_size = len(prompts)
        self.closed = False

    def logits(self) -> np.ndarray:
        return self._gen.next_token_logits_ids(self._rows)

    def advance(self, token_id: int) -> None:
        if self.closed:
            raise RuntimeError("stepper is closed")
        for row in self._rows:
            row.append(int(token_id))

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> FakeStepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeGenerator:
    """A deterministic generator: the same request gives the same text, in any batch.

    ``words``: length of each output; ``seed``: a generator-level salt (two fakes with
    different seeds write differently); ``fail_every`` > 0: every n-th request (counted over
    the generator's life) returns "" (a failed generation, retried by the callers);
    ``refuse_every`` > 0: every n-th returns a refusal; ``raise_after``: the call that would
    take the total past this many requests raises :class:`GenerationError` (after reporting
    the finished ones through ``on_result``); ``transform``: post-processes each output
    (e.g. to inject a string in a test).
    """

    supports_chat = False

    def __init__(self, name: str = "fake", *, words: int = 12, seed: int = 0,
                 fail_every: int = 0, refuse_every: int = 0, raise_after: int | None = None,
                 transform: Callable[[str], str] | None = None) -> None:
        self.name = f"fake:{name}"
        self.model_id = name
        self.n_words = words
        self.seed = seed
        self.fail_every = fail_every
        self.refuse_every = refuse_every
        self.raise_after = raise_after
        self.transform = transform
        self.requests_seen = 0  # every request, including failed ones
        self.misses = 0  # "LLM calls" (dpsynth.context.RunContext.llm_counts reads this)
        self.calls = 0
        self.prompts: list[str] = []  # rendered prompts, for tests that inspect them
        self.vocab_size = EOS_ID + 1 + _UNK
        self.eos_token_id = EOS_ID
        self.eos_token_ids = (EOS_ID,)
        self.tokenizer = None  # no chat template; rag falls back to plain prompts

    # -- text generation ------------------------------------------------------------------
    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]:
        """Prompt text, stop strings, chat flag (the LocalGenerator convention)."""
        if isinstance(request.prompt, str):
            return request.prompt, request.params.stop, False
        return (render_chat_fallback(request.prompt), request.params.stop + FALLBACK_STOPS,
                True)

    def _text(self, request: GenerationRequest, occurrence: int) -> str:
        prompt = request.prompt if isinstance(request.prompt, str) else list(request.prompt)
        rng = _rng("fake-text", self.seed, prompt, request.params.seed, request.nonce,
                   occurrence, request.params.temperature)
        idx = rng.integers(0, len(WORDS) - 2, size=self.n_words)  # never "yes"/"no"
        text = " ".join(WORDS[int(i)] for i in idx)
        return text[0].upper() + text[1:] + "."

    def generate(self, requests: Sequence[GenerationRequest], *, progress: bool = True,
                 on_result: Callable[[int, str], None] | None = None) -> list[str]:
        """One text per request, same order."""
        self.calls += 1
        out: list[str] = []
        seen: dict[str, int] = {}
        for i, req in enumerate(requests):
            if self.raise_after is not None and self.requests_seen >= self.raise_after:
                raise GenerationError(f"{self.name}: injected failure", completed=i,
                                      total=len(requests))
            self.requests_seen += 1
            self.misses += 1
            text, _, _ = self.render(req)
            self.prompts.append(text)
            key = _digest(text, req.params.to_dict(), req.nonce).hex()
            occ = seen.get(key, 0)
            seen[key] = occ + 1
            if self.fail_every and self.requests_seen % self.fail_every == 0:
                result = ""
            elif self.refuse_every and self.requests_seen % self.refuse_every == 0:
                result = "I'm sorry, but I can't help with that."
            else:
                result = apply_stops(self._text(req, occ), req.params.stop)
            if self.transform is not None:
                result = self.transform(result)
            out.append(result)
            if on_result is not None:
                on_result(i, result)
        return out

    # -- tokens -----------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Word ids (unknown words hash into a few extra ids)."""
        ids = []
        index = _word_index()
        for word in re.findall(r"[\w']+", text.lower()):
            if word in index:
                ids.append(index[word])
            else:
                ids.append(_UNK_BASE + _digest("unk", word)[0] % _UNK)
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        parts = []
        for i in ids:
            i = int(i)
            if i < EOS_ID:
                parts.append(WORDS[i])
            elif i > EOS_ID:
                parts.append(f"w{i}")
        return " ".join(parts)

    # -- logits -----------------------------------------------------------------------------
    def next_token_logits_ids(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """``[B, vocab]`` float32 logits, each row a hash of its token ids."""
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("next_token_logits: every prompt must have at least one token")
        out = np.empty((len(rows), self.vocab_size), dtype=np.float32)
        for b, row in enumerate(rows):
            rng = _rng("fake-logits", self.seed, [int(t) for t in row])
            logits = 3.0 * rng.standard_normal(self.vocab_size)
            logits[EOS_ID] -= 4.0  # texts do not end at once
            out[b] = logits
        return out

    def next_token_logits(self, prompts: Sequence[str]) -> np.ndarray:
        return self.next_token_logits_ids([self.encode_prompt(p) or [0] for p in prompts])

    def open_stepper(self, prompts: Sequence[str], shared_prefix: str = "") -> FakeStepper:
        return FakeStepper(self, prompts, shared_prefix)


_INDEX: dict[str, int] = {}


def _word_index() -> dict[str, int]:
    if not _INDEX:
        _INDEX.update({w: i for i, w in enumerate(WORDS)})
    return _INDEX


class FakeEmbedder:
    """Unit float32 rows: the normalised sum of hashed word vectors (``Embedder.embed``)."""

    def __init__(self, dim: int = 32, name: str = "fake-embedder") -> None:
        self.dim = dim
        self.name = name
        self.computed = 0
        self.cached = 0
        self._words: dict[str, np.ndarray] = {}

    def _word(self, word: str) -> np.ndarray:
        vec = self._words.get(word)
        if vec is None:
            vec = _rng("fake-word", word).standard_normal(self.dim)
            self._words[word] = vec
        return vec

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = re.findall(r"\w+", str(text).lower()) or ["<empty>"]
            vec = np.sum([self._word(w) for w in words], axis=0)
            out[i] = vec / (np.linalg.norm(vec) or 1.0)
        self.computed += len(texts)
        return out

    def iter_embed(self, texts: Iterable[str], *, chunk: int = 1024) -> Iterator[np.ndarray]:
        buf: list[str] = []
        for t in texts:
            buf.append(t)
            if len(buf) == chunk:
                yield self.embed(buf)
                buf = []
        if buf:
            yield self.embed(buf)

    def close(self) -> None:
        return None


def fake_models(n_generators: int = 1, **kwargs: Any) -> tuple[list[FakeGenerator], FakeEmbedder]:
    """``n_generators`` fakes with distinct names and seeds, and one embedder."""
    gens = [FakeGenerator(f"g{i}", seed=i, **kwargs) for i in range(n_generators)]
    return gens, FakeEmbedder()
