"""The OpenAI wire protocol of ``dpsynth llm serve``: request checks, answer and chunk shapes.

Pure functions over JSON bodies, no HTTP. :func:`parse_chat` and :func:`parse_completions`
turn a request body into a :class:`ParsedRequest` or raise :class:`ApiError`, which the server
answers as ``{"error": {"message", "type", "param", "code"}}`` (the OpenAI error body).

Accepted (both endpoints): ``model`` (must be the served name: 404 ``model_not_found``
otherwise; may be left out, as vLLM allows), ``max_tokens`` (>= 1; chat also
``max_completion_tokens``), ``temperature`` (0-2), ``top_p`` (0-1, not 0), ``top_k`` (a vLLM
extension; 0 or -1 = off), ``n`` (>= 1), ``stop`` (a string or up to 4), ``seed``,
``stream``, ``stream_options.include_usage``, ``user`` (an end-user id: recorded nowhere, it
changes no output). Chat: ``messages`` with roles system / developer (= system) / user /
assistant and string content or a list of text parts (joined by newlines). Completions:
``prompt``, a string or a list of strings.

Refused with 400 naming them, never ignored: every other parameter, and the ones below at any
value but the one that asks for nothing (what the API does when they are left out):
:data:`CHAT_NOOP` and :data:`COMPLETIONS_NOOP` (log-probabilities, ``echo``, tools and
functions, ``response_format`` other than text, ``logit_bias``, penalties, ``best_of``,
``suffix``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import CHAT_ROLES, Completion, Messages, Prompt, SamplingParams

#: The OpenAI API takes at most this many stop sequences.
MAX_STOPS = 4
#: OpenAI's default ``max_tokens`` on ``/v1/completions``.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream",
                     "stream_options", "stop", "seed", "user"})
CHAT_PARAMS = _COMMON | {"messages", "max_completion_tokens"}
COMPLETIONS_PARAMS = _COMMON | {"prompt"}


def _absent(v: Any) -> bool:
    return v is None


def _false(v: Any) -> bool:
    return v is None or v is False


def _zero(v: Any) -> bool:
    return v is None or (not isinstance(v, bool) and isinstance(v, int | float) and v == 0)


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}


#: Chat parameters accepted only at the value that asks for nothing.
CHAT_NOOP: Mapping[str, Callable[[Any], bool]] = {
    "logprobs": _false,
    "top_logprobs": _absent,
    "tools": _empty,
    "tool_choice": lambda v: v is None or v == "none",
    "functions": _empty,
    "function_call": lambda v: v is None or v == "none",
    "parallel_tool_calls": _absent,
    "response_format": lambda v: v is None or v == {"type": "text"},
    "logit_bias": _empty,
    "presence_penalty": _zero,
    "frequency_penalty": _zero,
}
#: Completions parameters accepted only at the value that asks for nothing.
COMPLETIONS_NOOP: Mapping[str, Callable[[Any], bool]] = {
    "logprobs": _absent,
    "echo": _false,
    "best_of": lambda v: v is None or (not isinstance(v, bool) and v == 1),
    "suffix": lambda v: v is None or v == "",
    "logit_bias": _empty,
    "presence_penalty": _zero,
    "frequency_penalty": _zero,
}


class ApiError(Exception):
    """A request the server answers with an OpenAI-shaped error (``status``, ``body()``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error",
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds, sent as Retry-After (429, 503)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ParsedRequest:
    """A checked request: its prompts, ``n`` choices each, and how to sample them.

    ``max_tokens`` is None when the request gave none (the server picks the default).
    Choice ``k`` of a prompt samples with seed ``seed + k`` (each its own random stream).
    """

    prompts: tuple[Prompt, ...]
    n: int
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int | None
    stream: bool
    include_usage: bool

    def params(self, max_tokens: int, choice: int) -> SamplingParams:
        """The sampling parameters of choice ``choice`` (0-based) of a prompt."""
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            max_new_tokens=max_tokens, stop=self.stop,
            seed=None if self.seed is None else self.seed + choice,
        )


def parse_chat(body: Any, *, served: str, max_choices: int) -> ParsedRequest:
    """Check a ``/v1/chat/completions`` body (see the module docstring)."""
    obj = _object(body)
    _refuse_unsupported(obj, CHAT_PARAMS, CHAT_NOOP)
    limit = _int(obj, "max_completion_tokens", 1)
    legacy = _int(obj, "max_tokens", 1)
    if limit is not None and legacy is not None and limit != legacy:
        raise ApiError(400, "'max_tokens' and 'max_completion_tokens' differ; give one",
                       param="max_completion_tokens")
    prompt = _messages(obj.get("messages"))
    return _parsed(obj, (prompt,), limit if limit is not None else legacy, served, max_choices)


def parse_completions(body: Any, *, served: str, max_choices: int) -> ParsedRequest:
    """Check a ``/v1/completions`` body (see the module docstring)."""
    obj = _object(body)
    _refuse_unsupported(obj, COMPLETIONS_PARAMS, COMPLETIONS_NOOP)
    prompt = obj.get("prompt")
    prompts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(prompts, list) or not prompts or not all(
        isinstance(p, str) for p in prompts
    ):
        raise ApiError(400, "'prompt' must be a string or a non-empty list of strings (token "
                            "ids are not supported)", param="prompt")
    if any(not p for p in prompts):
        raise ApiError(400, "'prompt' must not be an empty string", param="prompt")
    return _parsed(obj, tuple(prompts), _int(obj, "max_tokens", 1), served, max_choices)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _refuse_unsupported(body: Mapping[str, Any], params: frozenset[str],
                        noop: Mapping[str, Callable[[Any], bool]]) -> None:
    """400 naming every parameter this server would otherwise have to ignore."""
    unsupported = sorted(k for k, ok in noop.items() if k in body and not ok(body[k]))
    unknown = sorted(k for k in body if k not in params and k not in noop)
    if not unsupported and not unknown:
        return
    parts = []
    if unsupported:
        parts.append("not supported by this server (only left out, or at the value that asks "
                     f"for nothing): {', '.join(unsupported)}")
    if unknown:
        parts.append(f"unrecognized request argument(s): {', '.join(unknown)}")
    raise ApiError(400, "; ".join(parts), param=(unsupported + unknown)[0],
                   code="unsupported_parameter")


def _parsed(body: Mapping[str, Any], prompts: tuple[Prompt, ...], max_tokens: int | None,
            served: str, max_choices: int) -> ParsedRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    if model is not None and model != served:
        raise ApiError(404, f"The model '{model}' does not exist: this server serves "
                            f"'{served}'", param="model", code="model_not_found")
    n = _int(body, "n", 1)
    n = 1 if n is None else n
    if n * len(prompts) > max_choices:
        raise ApiError(400, f"{n * len(prompts)} choices requested (n x prompts); at most "
                            f"{max_choices}", param="n")
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be > 0", param="top_p")
    top_k = _int(body, "top_k", -1)
    seed = _int(body, "seed", None)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be a boolean", param="stream")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise ApiError(400, "'user' must be a string", param="user")
    return ParsedRequest(
        prompts=prompts, n=n, max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=max(0, top_k or 0), stop=_stops(body.get("stop")), seed=seed,
        stream=bool(stream), include_usage=_include_usage(body.get("stream_options"),
                                                          bool(stream)),
    )


def _int(body: Mapping[str, Any], key: str, minimum: int | None) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"'{key}' must be an integer", param=key)
    if minimum is not None and v < minimum:
        raise ApiError(400, f"'{key}' must be >= {minimum}, got {v}", param=key)
    return v


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError(400, f"'{key}' must be a number", param=key)
    if not lo <= v <= hi:
        raise ApiError(400, f"'{key}' must be in [{lo:g}, {hi:g}], got {v}", param=key)
    return float(v)


def _stops(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    stops = [v] if isinstance(v, str) else v
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "'stop' must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"'stop' takes at most {MAX_STOPS} sequences", param="stop")
    return tuple(stops)


def _include_usage(v: Any, stream: bool) -> bool:
    if v is None:
        return False
    if not stream:
        raise ApiError(400, "'stream_options' is only allowed when 'stream' is true",
                       param="stream_options")
    if not isinstance(v, dict) or set(v) - {"include_usage"}:
        raise ApiError(400, "'stream_options' takes only 'include_usage'",
                       param="stream_options")
    usage = v.get("include_usage")
    if usage is not None and not isinstance(usage, bool):
        raise ApiError(400, "'stream_options.include_usage' must be a boolean",
                       param="stream_options")
    return bool(usage)


def _messages(v: Any) -> Messages:
    if not isinstance(v, list) or not v:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(v):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"'{where}' must be an object", param="messages")
        extra = sorted(k for k, val in m.items() if k not in ("role", "content")
                       and val is not None)
        if extra:
            raise ApiError(400, f"'{where}': not supported: {', '.join(extra)}",
                           param="messages", code="unsupported_parameter")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in CHAT_ROLES:
            raise ApiError(400, f"'{where}.role' must be one of system, developer, user, "
                                "assistant", param="messages")
        out.append({"role": str(role), "content": _content(m.get("content"), where)})
    return tuple(out)


def _content(v: Any, where: str) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and v and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        and set(p) <= {"type", "text"} for p in v
    ):
        return "\n".join(p["text"] for p in v)
    raise ApiError(400, f"'{where}.content' must be a string or a list of text parts "
                        "({'type': 'text', 'text': ...})", param="messages")


# ------------------------------------------------------------------------------- answers
def usage_body(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_body(rid: str, created: int, model: str, choices: Sequence[Completion],
              usage: dict[str, int]) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [
            {"index": k, "message": {"role": "assistant", "content": c.text},
             "logprobs": None, "finish_reason": c.finish_reason}
            for k, c in enumerate(choices)
        ],
        "usage": usage,
    }


def completions_body(rid: str, created: int, model: str, choices: Sequence[Completion],
                     usage: dict[str, int]) -> dict[str, Any]:
    """A ``text_completion`` object."""
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [
            {"index": k, "text": c.text, "logprobs": None, "finish_reason": c.finish_reason}
            for k, c in enumerate(choices)
        ],
        "usage": usage,
    }


@dataclass(frozen=True)
class ChunkMaker:
    """The stream chunks of one request: ``chat.completion.chunk`` or ``text_completion``.

    With ``include_usage`` every chunk carries ``"usage": null`` and :meth:`usage` makes the
    last one (no choices), as the OpenAI API streams them.
    """

    chat: bool
    rid: str
    created: int
    model: str
    include_usage: bool

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "id": self.rid, "object": "chat.completion.chunk" if self.chat else
            "text_completion", "created": self.created, "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            obj["usage"] = None
        return obj

    def _choice(self, index: int, text: str | None, finish: str | None,
                role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": index, "text": text or "", "logprobs": None,
                    "finish_reason": finish}
        delta: dict[str, Any] = {"role": "assistant"} if role else {}
        if text is not None:
            delta["content"] = text
        return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}

    def role(self, index: int) -> dict[str, Any]:
        """The first chat chunk of a choice: the assistant role and empty content."""
        return self._chunk([self._choice(index, "", None, role=True)])

    def text(self, index: int, text: str) -> dict[str, Any]:
        return self._chunk([self._choice(index, text, None)])

    def finish(self, index: int, reason: str) -> dict[str, Any]:
        """The last chunk of a choice: no new text, its finish reason."""
        return self._chunk([self._choice(index, None, reason)])

    def usage(self, usage: dict[str, int]) -> dict[str, Any]:
        obj = self._chunk([])
        obj["usage"] = usage
        return obj


def sse(obj: Mapping[str, Any]) -> bytes:
    """One server-sent event ``data: {json}`` and its blank line."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() \
        + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
