"""The :class:`Embedder`: unit-norm float32 sentence embeddings on the fastest engine that
agrees with torch (``auto``: openvino, else onnx, else torch), computed only for texts not
already in its cache."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .cache import VectorStore, text_hash
from .engines import EngineUnavailable, GraphEngine, OnnxEngine, OpenVinoEngine, TorchEngine
from .export import export_onnx
from .models import EMBEDDED, available_cores, minilm_dir

ENGINES = ("auto", "torch", "onnx", "openvino")
AUTO_ORDER = ("openvino", "onnx", "torch")
MIN_AGREEMENT = 0.999
#: Version of the cached vectors: 2 = fixed-shape passes (engines.fixed_shape_passes), 3 = their
#: widths a multiple of 8 tokens (engines.WIDTH_STEP).
VECTORS = "v3"


GRAPH_ENGINES: dict[str, type[GraphEngine]] = {"onnx": OnnxEngine,
                                                 "openvino": OpenVinoEngine}


def open_graph_engine(name: str, model_dir: Path, batch_size: int, threads: int,
                      cache_root: Path | None) -> GraphEngine:
    """A fast engine over the cached ONNX export, refused unless it agrees with torch on the
    probe sentences (cosine >= :data:`MIN_AGREEMENT`)."""
    export = export_onnx(model_dir, cache_root)
    engine = GRAPH_ENGINES[name](model_dir, export, batch_size, threads)
    agree = engine.agreement(export)
    if agree < MIN_AGREEMENT:
        raise EngineUnavailable(f"engine {engine.tag!r} agrees with torch only to cosine "
                                f"{agree:.5f} < {MIN_AGREEMENT} on the probe sentences")
    return engine


class Embedder:
    """Unit-norm float32 sentence embeddings, computed only for texts not already cached.

    ``model`` is ``"minilm"`` or a sentence-transformers model directory; ``engine`` one of
    ``ENGINES`` (``engine_tag`` says which ran, e.g. ``openvino-bf16``). ``computed`` and
    ``cached`` count texts embedded by the model and texts served from the cache.
    """

    def __init__(
        self,
        model: str = "minilm",
        *,
        cache_dir: Path | None = None,
        batch_size: int = 16,
        device: str = "cpu",
        engine: str = "auto",
        threads: int | None = None,
        model_cache: Path | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if engine not in ENGINES:
            raise ValueError(f"embedder engine {engine!r}: expected one of {', '.join(ENGINES)}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if model in EMBEDDED:
            path = minilm_dir()
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
        self.threads = threads or available_cores()
        self.skipped: dict[str, str] = {}  # engine -> why auto passed it over
        self._engine = self._open(engine, device, model_cache)
        self.engine_tag: str = self._engine.tag
        self.dim: int = int(self._engine.dim)
        # vectors of different engines differ in the last digits: cache them apart; and none
        # from before the fixed-shape passes (a vector then depended on its batch)
        engine_key = "" if self.engine_tag == "torch" else f"@{self.engine_tag}"
        self.cache_key = f"{self.name}{engine_key}/{VECTORS}"
        self._store = (
            VectorStore(Path(cache_dir) / "embeddings.sqlite", self.dim)
            if cache_dir is not None
            else None
        )
        self.computed = 0
        self.cached = 0

    def _open(self, engine: str, device: str, model_cache: Path | None) -> Any:
        if engine == "torch" or device != "cpu":
            if engine not in ("torch", "auto"):
                raise ValueError(f"engine {engine!r} runs on the CPU only (device {device!r})")
            return TorchEngine(self.model_dir, device, self.batch_size)
        if engine != "auto":
            return open_graph_engine(engine, self.model_dir, self.batch_size, self.threads,
                                 model_cache)
        for name in AUTO_ORDER[:-1]:
            try:
                return open_graph_engine(name, self.model_dir, self.batch_size, self.threads,
                                     model_cache)
            except EngineUnavailable as exc:
                self.skipped[name] = str(exc)
        return TorchEngine(self.model_dir, device, self.batch_size)

    def _encode(self, texts: list[str], progress: bool) -> np.ndarray:
        vecs = self._engine.encode(texts, progress)
        self.computed += len(texts)
        return np.asarray(vecs, dtype=np.float32).reshape(len(texts), self.dim)

    def encode_uncached(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` straight from the engine (no sqlite cache read or write)."""
        return self._encode(checked_texts(texts), False)

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embeddings ``[n, dim]`` float32 with unit L2 norm, in the order of ``texts``."""
        texts = checked_texts(texts)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        if self._store is None:
            out[:] = self._encode(texts, progress)
            return out
        hashes = [text_hash(t) for t in texts]
        found = self._store.get(self.cache_key, sorted(set(hashes)))
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
            self._store.put(self.cache_key, miss_hashes, vecs)
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


def checked_texts(texts: Sequence[str]) -> list[str]:
    """``texts`` as a list of strings (a single str or a non-str item is a TypeError)."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single str")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"embed(): texts[{i}] is {type(t).__name__}, not str")
    return texts
