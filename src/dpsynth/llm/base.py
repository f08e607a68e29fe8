"""The generator protocol shared by every LLM backend (local transformers, OpenAI-compatible).

A PE-family method only ever sees :class:`Generator`: a batch of :class:`GenerationRequest`
in, the same number of strings out, in the same order. Backends differ in how they get there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from ..errors import GenerationError as GenerationError  # re-export; lives in dpsynth.errors
from ..progress import bar

Messages = tuple[dict[str, str], ...]
Prompt = str | Messages
ResultCallback = Callable[[int, str], None]
"""Called as ``on_result(index, text)`` as soon as request ``index`` of a call has finished."""

CHAT_ROLES = ("system", "user", "assistant")

#: Stop strings added when chat messages were rendered with :func:`render_chat_fallback`,
#: so that a base model does not go on to write the next turn itself.
FALLBACK_STOPS = ("\nUser:", "\nSystem:")


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    ``temperature == 0`` means greedy decoding; ``top_k == 0`` disables top-k;
    ``seed`` makes a local generation reproducible (see ``LocalGenerator`` for batches).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}"
            )
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("SamplingParams.stop must be a tuple of non-empty strings")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``stop`` as a list)."""
        d = asdict(self)
        d["stop"] = list(self.stop)
        return d

    def without_seed(self) -> SamplingParams:
        """The same parameters with ``seed=None`` (the key local batches are grouped by)."""
        return SamplingParams(
            self.temperature, self.top_p, self.top_k, self.max_new_tokens, self.stop, None
        )


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (plain completion text, or chat messages) and how to sample it.

    ``nonce`` is extra cache-key material only (it is never sent to a model): two otherwise
    identical requests with different nonces are different cache entries.
    """

    prompt: Prompt
    params: SamplingParams = field(default_factory=SamplingParams)
    nonce: str | int = 0

    def __post_init__(self) -> None:
        if isinstance(self.prompt, str):
            return
        if isinstance(self.prompt, Sequence):
            msgs = tuple(_check_message(m, i) for i, m in enumerate(self.prompt))
            if not msgs:
                raise ValueError("GenerationRequest.prompt: chat messages must not be empty")
            object.__setattr__(self, "prompt", msgs)
            return
        raise TypeError(
            "GenerationRequest.prompt must be a str or a sequence of "
            f"{{'role', 'content'}} dicts, got {type(self.prompt).__name__}"
        )

    @property
    def is_chat(self) -> bool:
        return not isinstance(self.prompt, str)


def _check_message(m: Any, i: int) -> dict[str, str]:
    if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
        raise ValueError(f"GenerationRequest.prompt[{i}] must be a dict with 'role' and 'content'")
    role, content = m["role"], m["content"]
    if role not in CHAT_ROLES:
        raise ValueError(f"GenerationRequest.prompt[{i}].role must be one of {CHAT_ROLES}")
    if not isinstance(content, str):
        raise ValueError(f"GenerationRequest.prompt[{i}].content must be a str")
    return {"role": role, "content": content}


def render_chat_fallback(messages: Sequence[Mapping[str, str]]) -> str:
    """Render chat messages as plain text for a model without a chat template.

    The documented fallback template is::

        System: <system content>

        User: <user content>

        Assistant: <assistant content>

        ...

        Assistant:

    i.e. one ``Role: content`` block per message separated by blank lines, ending with an
    open ``Assistant:`` turn. Generation from such a prompt also stops at
    :data:`FALLBACK_STOPS` so that the model does not write the next user turn.
    """
    parts = [f"{m['role'].capitalize()}: {m['content'].strip()}" for m in messages]
    parts.append("Assistant:")
    return "\n\n".join(parts)


def apply_stops(text: str, stops: Sequence[str]) -> str:
    """Cut ``text`` at the earliest occurrence of any stop string (the stop is not kept)."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if 0 <= i < cut:
            cut = i
    return text[:cut]


def request_key(generator_name: str, request: GenerationRequest, occurrence: int = 0) -> str:
    """sha256 over (generator name, prompt, params incl. seed, nonce, occurrence index).

    ``occurrence`` numbers identical requests inside one call (0, 1, 2, ...), so that asking
    for the same prompt k times yields k cache entries rather than one answer repeated.
    """
    payload = json.dumps(
        [
            generator_name,
            request.prompt if isinstance(request.prompt, str) else list(request.prompt),
            request.params.to_dict(),
            request.nonce,
            occurrence,
        ],
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


FinishReason = Literal["stop", "length"]
FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length")


@dataclass(frozen=True)
class Completion:
    """One generated text and how it ended (what an OpenAI-compatible server reports).

    ``finish_reason`` is ``"stop"`` when the model ended the text (an end-of-sequence token
    or a stop string) and ``"length"`` when ``max_new_tokens`` cut it. ``prompt_tokens`` is
    the length of the prompt the model read (chat template and special tokens included) and
    ``completion_tokens`` the tokens it generated (the end-of-sequence token included, so a
    ``"length"`` completion has exactly ``max_new_tokens``); ``None`` where the backend
    cannot count.
    """

    text: str
    finish_reason: FinishReason
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Completion.finish_reason must be one of {FINISH_REASONS}, "
                             f"got {self.finish_reason!r}")


@runtime_checkable
class Generator(Protocol):
    """Anything that turns a batch of requests into texts.

    ``name`` is a stable id ``"backend:model"`` used in cache keys. ``generate`` returns one
    string per request in the same order. Backends in this package also accept an optional
    keyword ``on_result(index, text)`` called as each request finishes, which the request
    cache uses so that an exception never loses finished work.

    A backend that can say how each text ended also has ``complete(requests, *, progress)``
    returning one :class:`Completion` per request (the local and OpenAI-compatible backends
    do; ``dpsynth llm serve`` reads it for ``finish_reason`` and ``usage``). ``generate``
    stays the method every PE-family caller uses.
    """

    name: str
    supports_chat: bool

    def generate(
        self, requests: Sequence[GenerationRequest], *, progress: bool = True
    ) -> list[str]: ...


@runtime_checkable
class Completer(Protocol):
    """Says how each text ended: ``complete`` returns one :class:`Completion` per request."""

    def complete(
        self, requests: Sequence[GenerationRequest], *, progress: bool = True
    ) -> list[Completion]: ...


@runtime_checkable
class TokenEncoder(Protocol):
    """Counts tokens: ``encode(text)`` gives the token ids of ``text``."""

    def encode(self, text: str) -> list[int]: ...


@runtime_checkable
class PromptTokens(Protocol):
    """Renders a request to its prompt text and counts its tokens against ``max_context``."""

    max_context: int

    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]: ...

    def encode_prompt(self, text: str) -> list[int]: ...


@runtime_checkable
class RowDecoder(Protocol):
    """Batching row by row: what :func:`dpsynth.llm.server.decode_rows` decodes, each row of a
    KV-cached batch from its own seeded stream (the local backend; the server's batcher)."""

    name: str
    max_context: int
    pad_token_id: int
    eos_token_ids: tuple[int, ...]

    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def forward_last(self, cache: Any = None, **inputs: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class CountsTokens(Protocol):
    """Keeps a running count of the tokens it generated."""

    generated_tokens: int


@runtime_checkable
class NextTokenScorer(Protocol):
    """Next-token logits ``[B, vocab]`` of rendered plain-text prompts."""

    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]: ...

    def next_token_logits(self, prompts: Sequence[str]) -> Any: ...


@runtime_checkable
class Steppable(Protocol):
    """Opens a KV-cached stepper over prompts (DP-SynRAG's private prediction)."""

    def open_stepper(self, prompts: Sequence[str], shared_prefix: str = "") -> Any: ...


@runtime_checkable
class RowsApartOpener(Protocol):
    """Opens its own stepper whose rows' logits each depend on that row's prompt alone."""

    def open_rows_apart(self, prompts: Sequence[str], shared_prefix: str = "",
                        width: int | None = None, rows: int = 16) -> Any: ...


@runtime_checkable
class LogitsDtypeChoice(Protocol):
    """Runs its stepper in a chosen dtype (``float32`` or ``bfloat16``)."""

    def set_logits_dtype(self, dtype: str) -> None: ...


@runtime_checkable
class StepperEngineChoice(Protocol):
    """Runs its stepper on a chosen engine (``transformers`` or ``openvino``)."""

    def set_stepper_engine(self, engine: str) -> None: ...


@runtime_checkable
class StepperSettingsKept(Protocol):
    """Puts its stepper's settings (dtype, engine, threads) back after a block that set them."""

    def stepper_settings_kept(self) -> contextlib.AbstractContextManager[None]: ...


@runtime_checkable
class NamedModel(Protocol):
    """Has a model id (``smollm2``, a directory's name): the name a server serves it under."""

    model_id: str


#: Every capability protocol a generator may satisfy beside :class:`Generator`, by name.
CAPABILITIES: dict[str, type] = {
    "completions": Completer,
    "token_counts": TokenEncoder,
    "prompt_tokens": PromptTokens,
    "row_decoding": RowDecoder,
    "generated_tokens": CountsTokens,
    "next_token_logits": NextTokenScorer,
    "stepper": Steppable,
    "rows_apart": RowsApartOpener,
    "logits_dtype": LogitsDtypeChoice,
    "stepper_engine": StepperEngineChoice,
    "model_id": NamedModel,
}


def capabilities(gen: object) -> frozenset[str]:
    """The names (:data:`CAPABILITIES`) of the capability protocols ``gen`` satisfies."""
    return frozenset(k for k, proto in CAPABILITIES.items() if isinstance(gen, proto))


def checked_generator(gen: object) -> Generator:
    """``gen`` when it satisfies :class:`Generator`, else a TypeError."""
    if not isinstance(gen, Generator):
        raise TypeError(f"{type(gen).__name__} is not a Generator (it needs name, "
                        "supports_chat and generate)")
    return gen


@contextlib.contextmanager
def progress_bar(enabled: bool, total: int, label: str) -> Iterator[Any]:
    """A bar of ``total`` items (texts: the label says so) on the run's one progress display
    (:mod:`dpsynth.progress`; a display of its own outside a run); yields ``advance(n=1)``,
    called with the items each batch finished."""
    with bar(label, total, enabled) as advance:
        yield advance
