"""Checks a run makes before it touches the budget (docs/architecture.md, "The run lifecycle").

Everything that can fail without the private data fails here, before the ledger reserves
anything or the session draws any noise: the generator and embedder models named in the
config exist, the extras the config needs are installed, an OpenAI-compatible server answers
(and serves the named model), and the output folder can be written. A failure is a
:class:`~dpsynth.errors.DpsynthError` naming the field, the model or the URL; a run that fails
here has spent nothing, and its new folder is removed again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, GenerationError, OutputFolderError, require

#: seconds a server gets to answer the preflight request (a down server is named at once)
PROBE_TIMEOUT_S = 5.0


def check_output_writable(path: str | Path) -> None:
    """The run folder ``path`` can be created and written (its nearest existing ancestor is a
    writable folder)."""
    target = Path(path)
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputFolderError(f"--output {target}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OutputFolderError(f"--output {target}: the folder {probe} is not writable; "
                                "choose another --output")


def check_local_model(model: str, field: str) -> None:
    """An embedded generator name (``smollm2``, ``gemma3``) or a transformers directory."""
    from .llm.local import EMBEDDED_MODELS

    name = model.removeprefix("local:")
    if name in EMBEDDED_MODELS:
        return
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{field} {model!r}: not a known model ({', '.join(EMBEDDED_MODELS)}) "
                          "nor a local transformers model directory (with config.json)")


def check_embedder(model: str) -> None:
    """``minilm`` or a sentence-transformers model directory."""
    from .embed import EMBEDDED

    if model in EMBEDDED:
        return
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise ConfigError(f"embedder.model {model!r}: not a known embedder "
                          f"({', '.join(EMBEDDED)}) nor a sentence-transformers model directory")


def check_server(base_url: str, model: str, api_key_env: str | None, field: str,
                 timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One ``GET {base_url}/models``: the server answers and, where it lists its models,
    serves ``model``. Raises GenerationError naming the URL within ``timeout_s``."""
    import httpx

    headers = {}
    if api_key_env:
        key = os.environ.get(api_key_env)
        if not key:
            raise ConfigError(f"{field}.api_key_env names {api_key_env!r}, which is not set in "
                              "the environment")
        headers["Authorization"] = f"Bearer {key}"
    url = base_url.rstrip("/") + "/models"
    try:
        resp = httpx.get(url, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise GenerationError(f"{field}: the server at {base_url} does not answer "
                              f"({type(err).__name__}); start it or fix the URL") from None
    if resp.status_code in (401, 403):
        raise GenerationError(f"{field}: the server at {base_url} refused the API key "
                              f"(HTTP {resp.status_code})", status=resp.status_code)
    if resp.status_code != 200:  # some servers have no /models: the first request will tell
        return
    try:
        listed = [m.get("id") for m in resp.json().get("data", [])]
    except (ValueError, AttributeError):
        return
    if listed and model not in listed:
        raise GenerationError(f"{field}: the server at {base_url} does not serve model "
                              f"{model!r} (it lists {', '.join(map(str, listed[:5]))})")


def check_servers(urls: Sequence[str], model: str, api_key_env: str | None, field: str
                  ) -> list[str]:
    """:func:`check_server` on each replica of one generator: fails when none answers (or
    any refuses the key or the model); returns the URLs that did not answer (the run goes
    on without them: the fan-out retries them after their cool-down)."""
    down: list[str] = []
    last: GenerationError | None = None
    for url in urls:
        try:
            check_server(url, model, api_key_env, field)
        except GenerationError as err:
            if "does not answer" not in str(err):
                raise
            down.append(url)
            last = err
    if last is not None and len(down) == len(urls):
        if len(urls) > 1:
            raise GenerationError(f"{field}: none of its {len(urls)} servers answers "
                                  f"({', '.join(urls)}); start them or fix base_urls")
        raise last
    return down


def check_extras(config: Any) -> None:
    """The optional dependency groups the config needs are installed."""
    if config.compute.engine == "ray":
        require("ray", "ray", "compute.engine: ray")
    federated = getattr(getattr(config, "wasp", None), "federated", None)
    if config.method == "wasp" and federated is not None and federated.parties > 0:
        require("flwr", "federated", "wasp.federated")
        require("ray", "federated", "wasp.federated")
    if config.method == "secpe":
        secrets = getattr(getattr(config, "secpe", None), "secrets", None) or []
        if any(s.get("kind") == "pii" for s in secrets if isinstance(s, dict)):
            require("presidio_analyzer", "secpe", "secpe secrets of kind 'pii'")


def preflight(config: Any, output_dir: str | Path | None = None, *,
              generators: Sequence[Any] | None = None, embedder: Any | None = None,
              probe_servers: bool = True) -> None:
    """Every check above for one run's config; models given as ready objects (``generators``,
    ``embedder``) are not checked."""
    if output_dir is not None:
        check_output_writable(output_dir)
    check_extras(config)
    if generators is None:
        for i, gen in enumerate(config.generators):
            field = f"generators.{i}"
            if gen.backend == "local":
                check_local_model(gen.model, f"{field}.model")
            elif probe_servers:
                check_servers(gen.base_urls or [gen.base_url], gen.model, gen.api_key_env,
                              field)
    if embedder is None:
        check_embedder(config.embedder.model)
