"""A resumed run is the same run: what may change on ``--resume``, and the check that nothing
else did (docs/architecture.md, "The run lifecycle").

A run's privacy follows from its whole config (the target, the method's sizes, the data spec,
the prompts that shape what the votes select), so a resume keeps all of it except the fields
in :data:`RESUMABLE`: where the servers are, how long to wait, how many requests at once and
how many threads. Nothing there touches the private data or the noise.

At its start a run records :func:`config_digest` of its locked fields in run.json and in its
ledger entries, and the locked fields themselves in ``private/run-lock.json``. A resume
refuses a stored config.yaml whose locked fields differ (naming them), a CONFIG argument that
differs from the stored config, a ``--set`` of a locked field, and (in the runner) a private
file whose records changed.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import ConfigError

#: config fields that may change when a run is resumed (dotted paths; ``*`` = any list index)
RESUMABLE: tuple[str, ...] = (
    "generators.*.base_url",
    "generators.*.base_urls",
    "generators.*.endpoint_cooldown_s",
    "generators.*.api_key_env",
    "generators.*.max_concurrency",
    "generators.*.timeout_s",
    "generators.*.retry_budget_s",
    "generators.*.max_attempts",
    "generators.*.outage_patience_s",
    "generators.*.threads",
    "generators.*.batch_size",
    "embedder.batch_size",
    "embedder.threads",
    "compute.address",
    "compute.timeout_s",
    "llm_cache",
)


def resumable(path: str) -> bool:
    """Whether the dotted config field ``path`` may change on resume."""
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in RESUMABLE)


def _leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key in sorted(node):
            yield from _leaves(node[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list) and node and all(isinstance(v, Mapping) for v in node):
        for i, item in enumerate(node):
            yield from _leaves(item, f"{prefix}.{i}")
        yield f"{prefix}.#", len(node)
    else:
        yield prefix, node


def locked_fields(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The config's fields (as a ``model_dump(mode="json")`` mapping) that a resume keeps,
    flattened to dotted paths."""
    return {path: value for path, value in _leaves(raw) if not resumable(path)}


def config_digest(raw: Mapping[str, Any]) -> str:
    """sha256 of the locked fields (canonical JSON): what run.json and the ledger keep."""
    text = json.dumps(locked_fields(raw), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def diff_locked(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The dotted fields of two :func:`locked_fields` maps whose values differ (or exist on
    one side only)."""
    return sorted(k for k in a.keys() | b.keys() if a.get(k, _MISSING) != b.get(k, _MISSING))


def changed_fields(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """The dotted locked fields of two configs whose values differ."""
    return diff_locked(locked_fields(before), locked_fields(after))


_MISSING = object()


def refuse_changes(changed: list[str], what: str) -> None:
    """Raise ConfigError naming the locked fields ``what`` changed (nothing when empty)."""
    if not changed:
        return
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    raise ConfigError(
        f"{what} changes {shown}: a resumed run continues with the config it started with "
        "(its privacy, data and method settings are fixed); pass the run's own config.yaml, or "
        "the same CONFIG and --set options as its first attempt. Only where the servers are, "
        "timeouts, concurrency and threads may change on resume (dpsynth.resume.RESUMABLE); "
        "to change anything else, start a new run")
