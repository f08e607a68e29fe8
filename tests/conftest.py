"""Shared fixtures. Model fixtures are session-scoped: each real model loads once per test run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DPSYNTH_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test when it is absent (it is never part of the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where converted model weights are cached; kept across sessions when DPSYNTH_CACHE is set."""
    env = os.environ.get("DPSYNTH_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def embedder():
    """The real offline all-MiniLM-L6-v2 embedder (no disk cache)."""
    from dpsynth.embed import Embedder

    return Embedder("minilm")


@pytest.fixture(scope="session")
def smollm():
    """The real offline SmolLM2-135M-Instruct generator (local transformers backend)."""
    from dpsynth.llm import load_generator

    return load_generator("smollm2")
