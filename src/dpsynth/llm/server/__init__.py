"""An OpenAI-compatible HTTP server over any :class:`~dpsynth.llm.base.Generator`.

``POST /v1/chat/completions``, ``POST /v1/completions`` (a list of prompts is one request of
several completions), ``GET /v1/models`` and ``GET /v1/models/{model}``. What a request may
hold, and what is refused with 400 naming the parameter rather than ignored, is
:mod:`dpsynth.llm.openai_api`. Every error is the OpenAI body
``{"error": {"message", "type", "param", "code"}}``; bodies over ``max_body_bytes`` get 413.

* **Model name:** the server serves one name (``model_id``, ``--served-model-name``; default
  the generator's model id, e.g. ``smollm2``), listed by ``/v1/models``; a request naming
  another model gets 404 ``model_not_found``.
* **Choices:** ``n`` >= 1 choices per prompt, choice ``k`` sampled with seed ``seed + k``;
  the same seed and prompt give the same text (on a local model whatever the request is
  batched with, see below). ``max_tokens`` >= 1; left out, it is 16 on ``/v1/completions``
  (OpenAI's default) and ``default_max_tokens`` on chat; prompt + ``max_tokens`` over the
  model's context is a 400 (``context_length_exceeded``), and a chat request without
  ``max_tokens`` is given what is left of the context, up to ``default_max_tokens``.
* **finish_reason / usage:** ``"length"`` when ``max_tokens`` cut the text, ``"stop"`` when the
  model ended it (end-of-sequence token or a stop string). ``usage`` counts the prompt the
  model read once per prompt (chat template included) and every generated token (the
  end-of-sequence token included). Both come from the generator's
  :class:`~dpsynth.llm.base.Completion` (local models; ``Generator.complete``); a generator
  with only ``generate`` is counted with its tokenizer's ``encode`` when it has one (an
  estimate, with ``"length"`` when the text has ``max_tokens`` tokens), else zeros.
* **Streaming** (``stream: true``): server-sent events ``data: {chunk}`` ending with
  ``data: [DONE]``, in the chunk shapes the OpenAI client parses (``chat.completion.chunk``
  with a first ``delta`` of role and empty content, then content deltas, then an empty delta
  with ``finish_reason``; ``text_completion`` chunks on ``/v1/completions``;
  ``stream_options.include_usage`` adds a last chunk with ``usage``). On a local model
  (:func:`decode_rows`, token by token) this is real incremental streaming: each token's
  settled text (:mod:`dpsynth.llm.incremental`) is sent as it is decoded, and the chunks add
  up to exactly the text a non-streamed request gets. Any other generator (e.g. an
  OpenAI-compatible upstream) answers at once: one chunk with the whole text, then the final
  chunk. Headers go out once the request's generation has started, so 400/404/429/503 are
  ordinary HTTP answers; an error during generation is an event ``data: {"error": ...}``
  followed by ``[DONE]``.

Micro-batching: requests go to a :class:`MicroBatcher` whose one worker thread takes everything
queued (up to ``max_batch_requests`` completions; requests arriving while the model is busy
wait for the next round, and an idle model waits ``batch_window_s`` for company) and generates
it in one call. The queue is bounded: past ``max_pending`` queued completions a request gets
429 with ``Retry-After``, and one that waited longer than ``queue_timeout_s`` without being
started gets 503 with ``Retry-After``, so a client is always answered. On a local model
(:class:`~dpsynth.llm.local.LocalGenerator`) a batch is decoded by :func:`decode_rows`, which
samples every row from its own seeded random stream, so a request's seed holds whatever it is
batched with. The server sees prompts; run it inside the trusted area when prompts hold
private text (docs/methods.md §6).

The package, a file per idea: :mod:`~dpsynth.llm.server.app` (the app factory and
:func:`serve`), the routes of each API family (:mod:`~dpsynth.llm.server.models`,
:mod:`~dpsynth.llm.server.completions`, :mod:`~dpsynth.llm.server.chat`, over their shared
:mod:`~dpsynth.llm.server.service`; :mod:`~dpsynth.llm.server.streaming` for ``stream: true``,
:mod:`~dpsynth.llm.server.responses` for errors, :mod:`~dpsynth.llm.server.usage` for token
counts), the batching worker (:mod:`~dpsynth.llm.server.batcher`) and per-row decoding
(:mod:`~dpsynth.llm.server.decode`).
"""

from __future__ import annotations

from .app import create_app, serve
from .batcher import MicroBatcher, QueueFull, QueueTimeout
from .decode import DeltaSink, decode_rows
from .usage import estimated_completion

__all__ = [
    "DeltaSink",
    "MicroBatcher",
    "QueueFull",
    "QueueTimeout",
    "create_app",
    "decode_rows",
    "estimated_completion",
    "serve",
]
