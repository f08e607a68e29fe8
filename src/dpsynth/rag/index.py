"""A faiss index over a knowledge base of passages (synthetic only for DP-SynRAG's release/).

Files in the folder: ``kb.jsonl`` (passages), ``kb.faiss`` (inner-product index over unit
embeddings, i.e. cosine similarity) and ``index.json`` (embedder name, size, dimension).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..embed.protocols import TextEmbedder
from ..errors import InputError, MissingFileError
from ..files import SHARED_MODE, atomic_write_bytes, atomic_write_json, read_jsonl
from ..knn import flat_index


def _faiss() -> Any:
    import faiss

    return faiss


def build_index(folder: Path, texts: Sequence[str], embedder: Any, embedder_name: str,
                embeddings: np.ndarray | None = None, extra: dict[str, Any] | None = None) -> Path:
    """Embed ``texts`` and write ``folder/kb.faiss`` and ``folder/index.json`` (with
    ``extra`` public metadata, e.g. the generator to answer with), readable by others: the
    index of a knowledge base is released with it."""
    faiss = _faiss()
    folder = Path(folder)
    emb = embeddings if embeddings is not None else (
        np.asarray(embedder.embed(list(texts)), dtype=np.float32) if texts else None)
    dim = int(emb.shape[1]) if emb is not None else (int(embedder.dim) if isinstance(
        embedder, TextEmbedder) else 384)
    index = flat_index(emb if emb is not None else np.zeros((0, dim), np.float32), "ip")
    atomic_write_bytes(folder / "kb.faiss", faiss.serialize_index(index).tobytes(),
                       mode=SHARED_MODE)
    atomic_write_json(folder / "index.json", {"embedder": embedder_name, "passages": len(texts),
                                              "dim": dim, "metric": "inner_product",
                                              **(extra or {})}, mode=SHARED_MODE)
    return folder / "kb.faiss"


@dataclass
class KnowledgeBase:
    """Passages + their faiss index, searched by cosine similarity."""

    passages: list[dict[str, Any]]
    index: Any
    embedder_name: str
    meta: dict[str, Any] | None = None

    @classmethod
    def open(cls, folder: str | Path) -> KnowledgeBase:
        """Open ``folder`` (a release/ folder holding kb.jsonl, kb.faiss, index.json)."""
        folder = Path(folder)
        for name in ("kb.jsonl", "kb.faiss", "index.json"):
            if not (folder / name).is_file():
                raise MissingFileError(f"{folder}: no {name} (not a built knowledge base)")
        faiss = _faiss()
        passages = read_jsonl(folder / "kb.jsonl")
        raw = np.frombuffer((folder / "kb.faiss").read_bytes(), dtype=np.uint8)
        try:
            index = faiss.deserialize_index(raw)
        except RuntimeError:
            raise InputError(f"{folder}: kb.faiss is not a faiss index; rebuild the index") \
                from None
        try:
            meta = json.loads((folder / "index.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise InputError(f"{folder}: index.json is not valid JSON; rebuild the index") \
                from None
        if index.ntotal != len(passages):
            raise InputError(f"{folder}: kb.faiss has {index.ntotal} vectors for "
                             f"{len(passages)} passages; rebuild the index")
        return cls(passages, index, str(meta.get("embedder", "minilm")), meta)

    @classmethod
    def from_texts(cls, texts: Sequence[str], embedder: Any, embedder_name: str = "minilm",
                   embeddings: np.ndarray | None = None) -> KnowledgeBase:
        """An in-memory KB (used by the baselines, e.g. RAG on the private store)."""
        emb = embeddings if embeddings is not None else np.asarray(
            embedder.embed(list(texts)), dtype=np.float32)
        index = flat_index(emb, "ip")
        return cls([{"id": i, "text": t} for i, t in enumerate(texts)], index, embedder_name)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query_embeddings: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Top-k (passage position, similarity) for each query embedding."""
        q = np.ascontiguousarray(np.atleast_2d(query_embeddings), dtype=np.float32)
        if len(self) == 0:
            return [[] for _ in range(len(q))]
        scores, ids = self.index.search(q, min(k, len(self)))
        return [[(int(i), float(s)) for i, s in zip(row_i, row_s, strict=True) if i >= 0]
                for row_i, row_s in zip(ids, scores, strict=True)]
