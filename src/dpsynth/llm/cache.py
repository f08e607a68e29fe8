"""On-disk request cache: a resumed run pays for no LLM call twice.

Keys are :func:`~dpsynth.llm.base.request_key` (generator name, prompt, sampling parameters
including the seed, nonce, and the occurrence index of identical requests within one call).
Results are written one by one as they arrive, so an exception or a crash in the middle of a
batch keeps every finished result. Prompts and outputs may hold private text: the SQLite file
is created with mode 0600 and belongs in the run's private area.
"""

from __future__ import annotations

import inspect
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import GenerationRequest, Generator, ResultCallback, request_key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS generations (
    key TEXT PRIMARY KEY,
    generator TEXT NOT NULL,
    output TEXT NOT NULL,
    created REAL NOT NULL
)
"""


class RequestCache:
    """A SQLite (WAL) map from request key to generated text, file mode 0600."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        self._db.commit()

    def get_many(self, keys: Sequence[str]) -> dict[str, str]:
        """The cached outputs of those keys that are present."""
        found: dict[str, str] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT key, output FROM generations WHERE key IN ({marks})", chunk
                ).fetchall()
                found.update(rows)
        return found

    def put(self, key: str, generator: str, output: str) -> None:
        """Store one result and commit at once."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO generations VALUES (?, ?, ?, ?)",
                (key, generator, output, time.time()),
            )
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM generations").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _accepts_on_result(fn: Any) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "on_result" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def request_keys(name: str, requests: Sequence[GenerationRequest]) -> list[str]:
    """Cache keys of a call's requests; identical requests get occurrence 0, 1, 2, ..."""
    seen: dict[str, int] = {}
    keys: list[str] = []
    for r in requests:
        base = request_key(name, r, 0)
        k = seen.get(base, 0)
        seen[base] = k + 1
        keys.append(base if k == 0 else request_key(name, r, k))
    return keys


class CachedGenerator:
    """A :class:`Generator` that answers from a :class:`RequestCache` and sends only misses.

    Counters: ``hits`` and ``misses`` (requests), ``delivered`` (misses answered and stored:
    the calls actually paid for), ``calls`` (calls of the inner generator).
    Inner generators without an ``on_result`` keyword are called in chunks of
    ``fallback_chunk`` requests so that finished chunks are stored. Other attributes
    (``next_token_logits``, ``open_stepper``, ``tokenizer`` ...) are the inner generator's.
    """

    def __init__(self, inner: Generator, cache: RequestCache, *, fallback_chunk: int = 32) -> None:
        self.inner = inner
        self.fallback_chunk = fallback_chunk
        self.cache = cache
        self.name: str = inner.name
        self.supports_chat: bool = inner.supports_chat
        self.hits = 0
        self.misses = 0
        self.delivered = 0
        self.calls = 0

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet (during unpickling): avoid recursion
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        """Cached outputs for hits; the inner generator for misses, each stored on arrival."""
        keys = request_keys(self.name, requests)
        found = self.cache.get_many(keys)
        out: list[str | None] = [found.get(k) for k in keys]
        miss = [i for i, t in enumerate(out) if t is None]
        self.hits += len(requests) - len(miss)
        self.misses += len(miss)
        if on_result is not None:
            for i, t in enumerate(out):
                if t is not None:
                    on_result(i, t)
        if miss:

            def store(j: int, text: str) -> None:
                i = miss[j]
                if out[i] is None:
                    self.cache.put(keys[i], self.name, text)
                    self.delivered += 1
                    out[i] = text
                    if on_result is not None:
                        on_result(i, text)

            if _accepts_on_result(self.inner.generate):
                self.calls += 1
                texts = self.inner.generate(  # type: ignore[call-arg]
                    [requests[i] for i in miss], progress=progress, on_result=store
                )
                for j, t in enumerate(texts):
                    store(j, t)
            else:  # a foreign generator: store chunk by chunk
                for s in range(0, len(miss), self.fallback_chunk):
                    self.calls += 1
                    part = miss[s : s + self.fallback_chunk]
                    texts = self.inner.generate([requests[i] for i in part], progress=progress)
                    for j, t in enumerate(texts, start=s):
                        store(j, t)
        return [t if t is not None else "" for t in out]
