"""The embedding engines: ``torch`` (sentence-transformers as shipped, the reference) and the
ONNX-graph engines ``onnx`` (ONNX Runtime) and ``openvino`` (bf16 where the CPU has it), which
run the graph :mod:`.export` writes; a fast engine must embed the public probe sentences like
torch (cosine >= ``MIN_AGREEMENT``, :mod:`.embedder`) before it is used.

Every engine embeds in passes of a fixed shape (:func:`fixed_shape_passes`): a text padded to a
width set by its own token count (a multiple of ``WIDTH_STEP``), ``batch_size`` rows a pass,
filler rows where fewer are left.
A batch padded to its longest text, of however many texts are left, picks its kernels (and
their rounding) by the other texts: measured on MiniLM, a text's vector moved by up to 2e-7
with its batch on every engine, so one record coming in would move the others' vectors and,
at a near tie, their votes. At a fixed shape the other rows change nothing, bit for bit
(tests/test_embed.py::test_a_texts_vector_is_its_own)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_bytes
from ..fixed_shape import (
    fixed_shape_arrays,
    fixed_shape_passes,
    padded_width,
)
from ..llm.runtime import import_openvino

#: Texts are padded to a multiple of this many tokens. Against 16 up to 64 and 32 beyond (the
#: DP-SGD rule), measured on MiniLM: 1.03x / 1.20x / 1.03x the texts a second (OpenVINO / ONNX
#: Runtime / torch) on Banking77's short texts, 1.0-1.13x on the longer demo texts
#: (benchmarks/results/embedding_fixed_shape.md, embedding.md).
WIDTH_STEP = 8

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


class FixedShapeEngine:
    """The fixed-shape pass loop shared by every engine (see the module docstring): tokenise
    each text alone, embed :func:`fixed_shape_passes`, keep the real rows."""

    batch_size: int
    dim: int
    max_len: int
    _tok: Any

    def _token_rows(self, texts: list[str]) -> list[list[int]]:
        """Each text's token ids alone, cut at ``max_len`` (no padding)."""
        return list(self._tok(texts, truncation=True, max_length=self.max_len)["input_ids"])

    def _pass(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _pad_and_filler(self, tokenizer: Any) -> None:
        self._pad_id = int(tokenizer.pad_token_id or 0)
        self._filler = list(tokenizer("", truncation=True, max_length=self.max_len)["input_ids"])

    def _probe_dim(self) -> int:
        """The vectors' dimension, from one pass of fillers."""
        width = padded_width(len(self._filler), self.max_len, WIDTH_STEP)
        return int(self._pass(*fixed_shape_arrays([], width, self.batch_size, self._pad_id,
                                                  self._filler)).shape[1])

    def encode(self, texts: list[str], progress: bool = False) -> np.ndarray:
        from ..progress import bar

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        token_rows = self._token_rows(texts)
        passes = fixed_shape_passes([len(r) for r in token_rows], self.batch_size, self.max_len,
                                    WIDTH_STEP)
        with bar("embedding (texts)", len(texts), progress) as advance:
            for width, idx in passes:
                ids, mask = fixed_shape_arrays([token_rows[i] for i in idx], width,
                                               self.batch_size, self._pad_id, self._filler)
                out[idx] = self._pass(ids, mask)[: len(idx)]
                advance(len(idx))
        return out


class EngineUnavailable(RuntimeError):
    """A fast engine cannot serve this model here (not installed, unsupported, disagrees)."""


class TorchEngine(FixedShapeEngine):
    """sentence-transformers on torch: the reference of the others (its modules, our passes)."""

    tag = "torch"

    def __init__(self, model_dir: Path, device: str, batch_size: int) -> None:
        from sentence_transformers import SentenceTransformer

        from ..llm.models import quiet_transformers

        self.batch_size = batch_size
        self.device = device
        with quiet_transformers():
            self._model = SentenceTransformer(str(model_dir), device=device,
                                              local_files_only=True)
        self._model.eval()
        self._tok = self._model.tokenizer
        self.max_len = int(self._model.max_seq_length or self._tok.model_max_length)
        self._pad_and_filler(self._tok)
        self.dim = self._probe_dim()

    def _pass(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import torch

        feats = {"input_ids": torch.from_numpy(ids).to(self.device),
                 "attention_mask": torch.from_numpy(mask).to(self.device)}
        with torch.inference_mode():
            vecs = self._model(feats)["sentence_embedding"]
            vecs = torch.nn.functional.normalize(vecs, p=2, dim=1)
        return vecs.float().cpu().numpy()


class GraphEngine(FixedShapeEngine):
    """The ONNX-graph engines' shared part: the model's tokenizer and its max length."""

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
        self._pad_and_filler(self._tok)
        self._load(export / model_file)
        self.dim = self._probe_dim()

    def _load(self, path: Path) -> None:
        raise NotImplementedError

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

    def _pass(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self._session.run(None, {"input_ids": ids, "attention_mask": mask})[0]


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

    def _pass(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with self._lock:
            res = self._request.infer({"input_ids": ids, "attention_mask": mask})
            return np.array(res[0], dtype=np.float32, copy=True)
