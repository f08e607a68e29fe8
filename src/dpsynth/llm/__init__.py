"""LLM backends behind one :class:`Generator` protocol, plus an on-disk request cache.

What a generator can do beyond ``generate`` is a runtime-checkable protocol each
(:data:`~dpsynth.llm.base.CAPABILITIES`); callers branch on ``isinstance`` against them, never
on ``hasattr``. :func:`load_generator` imports a backend's module only when its spec names it
(a registry of backends: ``import dpsynth.llm`` stays light), and checks what it built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .base import (
    Completion,
    GenerationError,
    GenerationRequest,
    Generator,
    SamplingParams,
    checked_generator,
    render_chat_fallback,
)
from .cache import CachedGenerator, RequestCache

__all__ = [
    "Completion",
    "GenerationError",
    "GenerationRequest",
    "Generator",
    "SamplingParams",
    "load_generator",
    "render_chat_fallback",
]

_OPENAI_KEYS = {
    "base_url",
    "base_urls",
    "endpoint_cooldown_s",
    "model",
    "api_key_env",
    "chat",
    "max_concurrency",
    "timeout",
    "retry_budget_s",
    "max_attempts",
    "outage_patience_s",
    "breaker_threshold",
    "probe_interval_s",
    "backoff_base",
    "backoff_max",
    "max_retry_after",
    "extra_body",
}
_LOCAL_KEYS = {"model", "cache_dir", "batch_size", "num_threads", "engine", "device"}


def load_generator(
    spec: str | Path | dict[str, Any], *, cache_path: Path | None = None, **kwargs: Any
) -> Generator:
    """Build a generator from a name, a directory or a dict.

    * ``"smollm2"`` / ``"gemma3"``: the embedded GGUF models (local backend);
    * a local HF model directory;
    * ``{"backend": "local", "model": ..., "batch_size": ..., "num_threads": ...,
      "engine": "auto" | "transformers" | "ctranslate2" | "openvino", "device": "cpu" | "cuda" |
      "auto"}`` (see
      :class:`~dpsynth.llm.local.LocalGenerator`; ``None`` values mean "pick for the machine");
    * ``{"backend": "openai", "base_url": ..., "model": ..., "api_key_env": "OPENAI_API_KEY",
      "chat": true, ...}`` (other keys: see :class:`~dpsynth.llm.openai_compat.OpenAIGenerator`);
      ``"base_urls": [url1, url2, ...]`` instead of ``base_url`` spreads the requests over
      several replicas of the model (:mod:`dpsynth.llm.fanout`; ``max_concurrency`` is per
      endpoint).

    ``kwargs`` go to the backend's constructor. With ``cache_path`` the generator is wrapped in
    a :class:`~dpsynth.llm.cache.CachedGenerator` over a SQLite file at that path.
    """
    gen: Generator
    if isinstance(spec, dict):
        gen = _from_dict(spec, kwargs)
    elif isinstance(spec, str | Path):
        from .local import LocalGenerator

        gen = LocalGenerator(spec, **{k: v for k, v in kwargs.items() if v is not None})
    else:
        raise TypeError(f"generator spec must be a str, Path or dict, got {type(spec).__name__}")
    gen = checked_generator(gen)  # the one check; callers then branch on capability protocols
    if cache_path is not None:
        gen = CachedGenerator(gen, RequestCache(Path(cache_path)))
    return gen


def _from_dict(spec: dict[str, Any], kwargs: dict[str, Any]) -> Generator:
    """The generator of a dict spec (its ``backend``'s keys checked)."""
    conf = dict(spec)
    backend = conf.pop("backend", "local")
    conf.update(kwargs)
    if backend == "openai":
        unknown = set(conf) - _OPENAI_KEYS
        if unknown:
            raise ConfigError(f"generator spec: unknown openai keys {sorted(unknown)}")
        if conf.get("base_url") is None and conf.get("base_urls") is None:
            raise ConfigError("generator spec: openai backend needs 'base_url' or 'base_urls'")
        if "model" not in conf:
            raise ConfigError("generator spec: openai backend needs 'model'")
        from .openai_compat import OpenAIGenerator

        conf.setdefault("base_url", None)
        return OpenAIGenerator(**conf)
    if backend == "local":
        unknown = set(conf) - _LOCAL_KEYS
        if unknown:
            raise ConfigError(f"generator spec: unknown local keys {sorted(unknown)}")
        from .local import LocalGenerator

        return LocalGenerator(**{k: v for k, v in conf.items() if v is not None})
    raise ConfigError(f"generator spec: unknown backend {backend!r} (local or openai)")
