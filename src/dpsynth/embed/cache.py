"""The on-disk vector cache of an embedder: SQLite (model and engine, sha256(text)) -> float32
vector, mode 0600 (embeddings of private text are private)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def text_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class VectorStore:
    """SQLite table (model, sha256(text)) -> float32 vector bytes."""

    def __init__(self, path: Path, dim: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        os.chmod(path, 0o600)
        self.dim = dim
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS vectors (model TEXT NOT NULL, hash TEXT NOT NULL, "
            "vec BLOB NOT NULL, PRIMARY KEY (model, hash))"
        )
        self._db.commit()

    def get(self, model: str, hashes: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for s in range(0, len(hashes), 500):
                chunk = list(hashes[s : s + 500])
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT hash, vec FROM vectors WHERE model = ? AND hash IN ({marks})",
                    [model, *chunk],
                ).fetchall()
                for h, blob in rows:
                    vec = np.frombuffer(blob, dtype=np.float32)
                    if vec.shape == (self.dim,):
                        found[h] = vec
        return found

    def put(self, model: str, hashes: Sequence[str], vecs: np.ndarray) -> None:
        with self._lock:
            self._db.executemany(
                "INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                [
                    (model, h, np.ascontiguousarray(v, dtype=np.float32).tobytes())
                    for h, v in zip(hashes, vecs, strict=True)
                ],
            )
            self._db.commit()

    def close(self) -> None:
        with self._lock:
            self._db.close()
