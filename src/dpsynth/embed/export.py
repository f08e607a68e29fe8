"""The ONNX export of a sentence-transformers model (transformer, mean pooling, L2
normalisation), made locally from the offline weights on first use and cached under the model
cache with the torch embeddings of the probe sentences; nothing is downloaded."""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_bytes
from .engines import PROBES, EngineUnavailable, TorchEngine
from .models import model_cache_root

EXPORT_VERSION = 1


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

    from ..llm.models import quiet_transformers

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
    ref = TorchEngine(model_dir, "cpu", 16).encode(list(PROBES))
    buf = npy_bytes(ref)
    atomic_write_bytes(out / "probes-torch.npy", buf)
    return out


def npy_bytes(arr: np.ndarray) -> bytes:
    import io

    handle = io.BytesIO()
    np.save(handle, arr)
    return handle.getvalue()
