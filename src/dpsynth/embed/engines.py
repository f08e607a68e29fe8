"""The embedding engines: ``torch`` (sentence-transformers as shipped, the reference) and the
ONNX-graph engines ``onnx`` (ONNX Runtime) and ``openvino`` (bf16 where the CPU has it), which
run the graph :mod:`.export` writes; a fast engine must embed the public probe sentences like
torch (cosine >= ``MIN_AGREEMENT``, :mod:`.embedder`) before it is used."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_bytes

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


class EngineUnavailable(RuntimeError):
    """A fast engine cannot serve this model here (not installed, unsupported, disagrees)."""


class TorchEngine:
    """sentence-transformers on torch: today's path and the reference of the others."""

    tag = "torch"

    def __init__(self, model_dir: Path, device: str, batch_size: int) -> None:
        from sentence_transformers import SentenceTransformer

        from ..llm.models import quiet_transformers

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
        from ..progress import bar

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


class GraphEngine:
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
        from ..progress import bar

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


class OnnxEngine(GraphEngine):
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


class OpenVinoEngine(GraphEngine):
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
