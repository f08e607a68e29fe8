"""DP-SynRAG's private side, one shard of documents at a time (docs/methods.md §4).

A :class:`DocumentShard` holds private documents (one per record, or one per user at user
level: the user's records joined in row order) under global ids (the record's row, or the
user's first row, so sorting by id gives the one-process order), and keeps what the build
learns about them: their keyword ids (step 1), their membership of the public clusters
(step 2), their embeddings and, per cluster, the retrieved set S_r (step 3). It answers only
with exact partial statistics, which the driver adds before its session draws any noise:
keyword counts, fixed-point sums of the member embeddings, and counts of members above each
grid threshold. The local engine runs one shard in the driver; with ``compute.engine: ray``
each Ray shard actor holds one (:func:`on_documents`, a shard kernel), saves its state in its
node's private compute folder (a restarted actor extracts and embeds nothing again) and hands
S_r's texts only to the logit workers (:mod:`dpsynth.methods.synrag.ray_prediction`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...compute.kernels import clipped_fixed_point
from ...compute.shard import Shard, shard_kernel
from ...files import atomic_write_bytes, atomic_write_json
from ...progress import bar
from .clusters import soft_clusters
from .keywords import extract_keywords, one_document_a_pass
from .retrieval import THRESHOLD_GRID

#: The operations a driver may call on a shard (:func:`on_documents`).
SHARD_OPS = frozenset({"size", "keyword_counts", "cluster", "embed", "centre_sums",
                       "threshold_counts", "select", "selected"})
#: ``shard.state`` key of a shard's :class:`DocumentShard`
DOCUMENTS = "synrag.documents"


def documents_of(texts: Any, rows: np.ndarray, users: Sequence[Any] | None
                 ) -> tuple[list[str], np.ndarray]:
    """(documents, global ids) of records in increasing ``rows``: one per record, or with
    ``users`` one per user, its records joined by newlines, under its first row."""
    from ...columns import chunks_of

    rows = np.asarray(rows, dtype=np.int64)
    if users is None:
        return [t for chunk in chunks_of(texts) for t in chunk], rows
    groups: dict[str, list[str]] = {}
    first: dict[str, int] = {}
    flat = (t for chunk in chunks_of(texts) for t in chunk)
    for row, text, user in zip(rows.tolist(), flat, users, strict=True):
        key = str(user)
        if key not in groups:
            groups[key], first[key] = [], row
        groups[key].append(text)
    return (["\n".join(v) for v in groups.values()],
            np.asarray(list(first.values()), dtype=np.int64))


def fixed_point(x: np.ndarray) -> np.ndarray:
    """Rows bounded to norm < 1 (the noisy centre's sensitivity) on the 2^-32 grid as int64
    (``compute.kernels.clipped_fixed_point``)."""
    return clipped_fixed_point(x, 1.0)


def similarities(emb: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """Cosine similarity of unit rows with a unit direction, row by row in float64 (the same
    value for a row whichever other rows are in ``emb``)."""
    return (np.asarray(emb, dtype=np.float64) * np.asarray(direction, np.float64)).sum(axis=1)


def grid_counts(sims: np.ndarray) -> np.ndarray:
    """c_g = #{s > theta_g} for every theta_g of :data:`THRESHOLD_GRID` (int64)."""
    s = np.sort(np.asarray(sims, dtype=np.float64))
    return (s.size - np.searchsorted(s, THRESHOLD_GRID, side="right")).astype(np.int64)


@dataclass(frozen=True)
class ShardFiles:
    """Where a shard keeps its state (``None``: in memory only)."""

    keywords: Path | None = None
    embeddings: Path | None = None
    state: Path | None = None


def shard_files(folder: Path, shard: int, shards: int) -> ShardFiles:
    """A Ray shard's files in its node's private compute folder."""
    stem = f"synrag-shard-{shard}-of-{shards}"
    return ShardFiles(folder / f"{stem}-keywords.json", folder / f"{stem}-embeddings.npy",
                      folder / f"{stem}-state.json")


class DocumentShard:
    """One shard's documents and what the build keeps about them (see the module doc)."""

    def __init__(self, texts: list[str], ids: np.ndarray, files: ShardFiles) -> None:
        self.texts = texts
        self.ids = np.asarray(ids, dtype=np.int64)
        self.files = files
        self.keywords: list[list[int]] | None = None
        self._emb: np.ndarray | None = None
        self.members: list[np.ndarray] = []  # per cluster: positions in this shard
        self.chosen: dict[str, np.ndarray] = {}  # S_r per cluster key: positions
        self._state: dict[str, Any] = {}
        self._reload()

    @classmethod
    def of_records(cls, texts: Any, rows: np.ndarray, users: Sequence[Any] | None,
                   files: ShardFiles) -> DocumentShard:
        """The documents of records (see :func:`documents_of`)."""
        docs, ids = documents_of(texts, rows, users)
        return cls(docs, ids, files)

    # -- state kept across a restart ---------------------------------------------------------
    def _reload(self) -> None:
        """A restarted shard: its keywords, clusters and retrieved sets from its state file."""
        path = self.files.state
        if path is None or not path.is_file():
            return
        state = json.loads(path.read_text("utf-8"))
        if state.get("documents") != len(self.texts):
            return
        self._state = state
        if "keywords_tag" in state:
            self.keywords = self._cached_keywords(state["keywords_tag"])
        if self.keywords is not None and "seeds" in state:
            self._members(np.asarray(state["seeds"], dtype=np.int64), int(state["overlap"]))
        self.chosen = {k: np.asarray(v, dtype=np.int64)
                       for k, v in state.get("chosen", {}).items()}

    def _save(self, **update: Any) -> None:
        self._state.update(update, documents=len(self.texts))
        if self.files.state is not None:
            _private_dir(self.files.state)
            atomic_write_json(self.files.state, self._state, mode=0o600)

    def _cached_keywords(self, tag: Any) -> list[list[int]] | None:
        path = self.files.keywords
        if path is None or not path.is_file():
            return None
        cached = json.loads(path.read_text("utf-8"))
        if cached.get("tag") != tag or len(cached.get("keywords", ())) != len(self.texts):
            return None
        return cached["keywords"]

    # -- the operations ----------------------------------------------------------------------
    def size(self) -> int:
        """Documents on this shard (private)."""
        return len(self.texts)

    def keyword_counts(self, vocab: Any, k: int, fill: str, tag: Any,
                       generator_factory: Any = None, max_new_tokens: int = 64,
                       progress: bool = False) -> np.ndarray:
        """Step 1: K keyword ids per document (the LLM's, from ``generator_factory``, asked
        one document a pass so each document's keywords are its own text's alone; topped up
        from the vocabulary; kept, and saved under ``tag``), and how many of this shard's
        documents hold each term (int64, length |V|)."""
        kws = self._cached_keywords(tag)
        if kws is None:
            with bar("keywords (documents)", len(self.texts),
                     progress and generator_factory is not None) as advance:
                answer = (one_document_a_pass(generator_factory(), max_new_tokens, advance)
                          if generator_factory is not None else None)
                kws = extract_keywords(self.texts, vocab, k, answer=answer, fill=fill)
            if self.files.keywords is not None:
                _private_dir(self.files.keywords)
                atomic_write_json(self.files.keywords, {"tag": tag, "keywords": kws},
                                  mode=0o600)
        self.keywords = kws
        self._save(keywords_tag=tag)
        flat = np.fromiter((j for ids in kws for j in ids), dtype=np.int64)
        return np.bincount(flat, minlength=len(vocab)).astype(np.int64)

    def _members(self, seeds: np.ndarray, overlap: int) -> None:
        if self.keywords is None:
            raise RuntimeError("DP-SynRAG: the keywords of this shard were not extracted")
        self.members = soft_clusters(self.keywords, seeds, overlap).members

    def cluster(self, seeds: np.ndarray, overlap: int) -> np.ndarray:
        """Step 2 on this shard: each document's clusters (a document's membership depends on
        its own keywords and the public seeds only). Returns |C_r| here (private)."""
        seeds = np.asarray(seeds, dtype=np.int64)
        self._members(seeds, int(overlap))
        self._save(seeds=seeds.tolist(), overlap=int(overlap))
        return np.array([m.size for m in self.members], dtype=np.int64)

    @property
    def emb(self) -> np.ndarray:
        if self._emb is None:
            path = self.files.embeddings
            if path is not None and path.is_file():
                emb = np.load(path)
                if len(emb) == len(self.texts):
                    self._emb = emb
            if self._emb is None:
                raise RuntimeError("DP-SynRAG: this shard's documents were not embedded")
        return self._emb

    def embed(self, embedder_factory: Any, progress: bool = False) -> None:
        """Embed the documents once (or reload the saved embeddings); ``progress``: under the
        embedder's bar (texts)."""
        try:
            self.emb  # noqa: B018 (reloads a saved file)
            return
        except RuntimeError:
            pass
        embedder = embedder_factory()
        emb = np.asarray(embedder.embed(self.texts, progress=True) if progress
                         else embedder.embed(self.texts), dtype=np.float32)
        if self.files.embeddings is not None:
            buf = io.BytesIO()
            np.save(buf, emb)
            _private_dir(self.files.embeddings)
            atomic_write_bytes(self.files.embeddings, buf.getvalue(), mode=0o600)
        self._emb = emb

    def centre_sums(self) -> np.ndarray | None:
        """Per cluster, the sum of the member embeddings on the 2^-32 grid ([R, d] int64;
        ``None`` when this shard holds no document)."""
        if not self.texts:
            return None
        emb = self.emb
        out = np.zeros((len(self.members), emb.shape[1]), dtype=np.int64)
        for r, mem in enumerate(self.members):
            if mem.size:
                out[r] = fixed_point(emb[mem]).sum(axis=0)
        return out

    def threshold_counts(self, r: int, direction: np.ndarray) -> np.ndarray:
        """c_g = #{d in C_r here : sim(d, direction) > theta_g} per grid point (int64)."""
        mem = self.members[r]
        sims = similarities(self.emb[mem], direction) if mem.size else np.zeros(0)
        return grid_counts(sims)

    def select(self, key: str, r: int, direction: np.ndarray, theta: float) -> int:
        """Keep S_r = {d in C_r : sim(d, direction) > theta} under ``key``; returns |S_r| here
        (private)."""
        mem = self.members[r]
        sims = similarities(self.emb[mem], direction) if mem.size else np.zeros(0)
        self.chosen[key] = mem[sims > theta]
        self._save(chosen={k: v.tolist() for k, v in self.chosen.items()})
        return int(self.chosen[key].size)

    def selected(self, key: str) -> tuple[np.ndarray, list[str]]:
        """(global ids, texts) of S_r kept under ``key``, in id order: for the logit workers
        only (never the driver, with the ray engine)."""
        pos = self.chosen[key]
        return self.ids[pos], [self.texts[i] for i in pos.tolist()]


def _private_dir(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)


def merge_selected(parts: Sequence[tuple[np.ndarray, list[str]]]) -> list[str]:
    """S_r's texts from every shard's :meth:`DocumentShard.selected`, in global id order (the
    order of the one-process build)."""
    ids = np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in parts] or [np.zeros(0)])
    texts = [t for _, ts in parts for t in ts]
    return [texts[i] for i in np.argsort(ids, kind="stable").tolist()]


@shard_kernel
def on_documents(shard: Shard, op: str, *args: Any) -> Any:
    """``DocumentShard.<op>(*args)`` on the documents of an engine's shard (made from its
    records on first use and kept in ``shard.state``; its files in the shard's private
    folder, so a restarted actor picks them up)."""
    if op not in SHARD_OPS:
        raise ValueError(f"unknown DP-SynRAG shard operation {op!r}")
    docs = shard.state.get(DOCUMENTS)
    if docs is None:
        text = shard.text
        docs = DocumentShard.of_records(
            text.texts, text.rows, text.users if shard.user_level else None,
            shard_files(shard.folder, shard.index, shard.shards) if shard.folder is not None
            else ShardFiles())
        shard.state[DOCUMENTS] = docs
    return getattr(docs, op)(*args)
