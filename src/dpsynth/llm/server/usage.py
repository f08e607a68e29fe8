"""Token counts of a generator's answers: its own :class:`~dpsynth.llm.base.Completion`
counts, else an estimate with its tokenizer's ``encode``, else zeros."""

from __future__ import annotations

from ..base import Completion, GenerationRequest, TokenEncoder


def estimated_completion(gen: object, request: GenerationRequest, text: str) -> Completion:
    """A plain text of a generator without ``complete``, counted with its ``encode`` if any.

    An estimate: ``"length"`` when the text has ``max_new_tokens`` tokens by that count.
    """
    if not isinstance(gen, TokenEncoder):
        return Completion(text, "stop")
    prompt = request.prompt if isinstance(request.prompt, str) else "\n".join(
        m["content"] for m in request.prompt)
    n = len(gen.encode(text))
    return Completion(text, "length" if n >= request.params.max_new_tokens else "stop",
                      len(gen.encode(prompt)), n)


def prompt_count(gen: object, done: Completion, req: GenerationRequest) -> int:
    """The prompt tokens of ``done``: its own count, else the estimate, else 0."""
    if done.prompt_tokens is not None:
        return done.prompt_tokens
    estimate = estimated_completion(gen, req, "").prompt_tokens
    return estimate or 0


def completion_count(gen: object, done: Completion) -> int:
    """The generated tokens of ``done``: its own count, else the estimate, else 0."""
    if done.completion_tokens is not None:
        return done.completion_tokens
    return len(gen.encode(done.text)) if isinstance(gen, TokenEncoder) else 0
