"""CLI commands: ``dpsynth llm serve`` and ``dpsynth llm generate``."""

from __future__ import annotations

import json
from typing import Any

import typer

from .. import progress

group = typer.Typer(
    help="Language models: serve one over an OpenAI-compatible API, or try a prompt.",
    no_args_is_help=True,
)


def _spec(model: str) -> str | dict[str, Any]:
    """A model name/directory, or a JSON generator spec such as '{"backend": "openai", ...}'."""
    if model.lstrip().startswith("{"):
        try:
            spec = json.loads(model)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--model: invalid JSON ({exc.msg})") from exc
        if not isinstance(spec, dict):
            raise typer.BadParameter("--model: JSON spec must be an object")
        return spec
    return model


@group.command("serve")
def serve_cmd(
    model: str = typer.Option("smollm2", help="smollm2, gemma3, a model directory or JSON spec"),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default; any "
                             "other address needs --api-key)"),
    api_key: str | None = typer.Option(
        None, "--api-key", help="Every request must send 'Authorization: Bearer KEY' (the "
        "openai client's api_key); required off loopback; default $DPSYNTH_API_KEY"),
    port: int = typer.Option(8000, help="TCP port"),
    batch_size: int = typer.Option(8, help="Local batch size of direct generate calls"),
    max_batch: int = typer.Option(
        32, "--max-batch", min=1,
        help="Completions of concurrent requests decoded together (1 = one at a time)",
    ),
    max_pending: int = typer.Option(
        256, min=1, help="Queued completions before answering 429 with Retry-After"
    ),
    queue_timeout: float = typer.Option(
        60.0, min=0.0, help="Seconds a request may wait unstarted before a 503 with Retry-After"
    ),
    max_body_bytes: int = typer.Option(1_000_000, help="Largest accepted request body"),
    served_model_name: str | None = typer.Option(
        None, help="The model name clients send and /v1/models lists (default: the model's "
        "id, e.g. smollm2); a request naming another model gets 404"),
    default_max_tokens: int = typer.Option(
        512, min=1, help="max_tokens of a chat request that gives none (cut to what is left "
        "of the context); /v1/completions defaults to 16, as OpenAI"),
) -> None:
    """Serve a generator at http://HOST:PORT/v1 (chat/completions, completions, models).

    OpenAI-conformant for what it supports (streaming, n, stop, seed, finish_reason, usage);
    any other parameter is refused with 400 naming it (README, "llm serve"). Concurrent
    requests are micro-batched; the queue is bounded and pushes back with 429/503 and
    Retry-After rather than letting a client wait past its timeout.
    """
    from ..errors import require
    from ..llm import load_generator

    for module in ("fastapi", "uvicorn"):
        require(module, "serve", "`dpsynth llm serve`")
    from ..api_key import server_api_key
    from ..llm.server import serve

    key = server_api_key(host, api_key)  # refused off loopback without a key, before loading
    spec = _spec(model)
    kwargs: dict[str, Any] = {"batch_size": batch_size} if isinstance(spec, str) else {}
    with progress.session(), progress.step("loading the model"):  # then "ready at URL"
        gen = load_generator(spec, **kwargs)
    serve(gen, host=host, port=port, model_id=served_model_name, max_body_bytes=max_body_bytes,
          max_batch_requests=max_batch, max_pending=max_pending, queue_timeout_s=queue_timeout,
          default_max_tokens=default_max_tokens, api_key=key)


@group.command("generate")
def generate_cmd(
    prompt: str = typer.Argument(..., help="Prompt text"),
    model: str = typer.Option("smollm2", help="smollm2, gemma3, a model directory or JSON spec"),
    chat: bool = typer.Option(True, "--chat/--plain", help="Send as a user message or as text"),
    max_new_tokens: int = typer.Option(48, help="Tokens to generate"),
    temperature: float = typer.Option(0.0, help="0 = greedy"),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass"),
    seed: int | None = typer.Option(None, help="Sampling seed"),
    n: int = typer.Option(1, help="Number of completions"),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON"),
) -> None:
    """Generate from one prompt (a smoke test of a backend)."""
    from ..llm import GenerationRequest, SamplingParams, load_generator

    try:
        params = SamplingParams(
            temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    body: str | tuple[dict[str, str], ...] = (
        ({"role": "user", "content": prompt},) if chat else prompt
    )
    reqs = [GenerationRequest(body, params, nonce=k) for k in range(n)]
    with progress.session(enabled=not as_json):
        with progress.step("loading the model"):
            gen = load_generator(_spec(model))
        texts = gen.generate(reqs, progress=not as_json)
    if as_json:
        typer.echo(json.dumps({"model": gen.name, "outputs": texts}))
    else:
        for t in texts:
            typer.echo(t)


def register(root: typer.Typer) -> None:
    """Add the ``llm`` command group to the root app."""
    root.add_typer(group, name="llm")
