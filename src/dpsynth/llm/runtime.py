"""Where and how fast a local model runs: its CPU threads (never more than the idle cores),
its device (the CPU or a GPU torch sees) and its engine (CTranslate2 int8 or transformers)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from . import ct2


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """torch threads for this process: ``$DPSYNTH_TORCH_THREADS``, else the idle cores.

    The cores this process may use, less the current one-minute load (at least 1): on a shared
    machine OpenMP threads that wait for busy cores make a small model many times slower
    (measured here: 22 s with 2 threads against 2.6 s with 1 for 16 tokens at load 11).
    """
    env = os.environ.get("DPSYNTH_TORCH_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError as exc:
            raise ConfigError(f"DPSYNTH_TORCH_THREADS must be an integer, got {env!r}") from exc
    cores = available_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cores
    return max(1, min(cores, round(cores - load + 1)))


def idle_threads() -> int:
    """:func:`default_threads`, never more than the cores this process may use."""
    return min(default_threads(), available_cores())


ENGINES = ("auto", "transformers", "ctranslate2", "openvino")
#: Requests per engine batch when none is given (a constant per engine, never a function of
#: the load: batch composition fixes the batch seeds, so it must not change run to run).
AUTO_BATCH = {"openvino": 64, "ctranslate2": 64, "transformers": 32}


def resolve_engine(engine: str) -> str:
    """``auto`` -> ``ctranslate2`` when that package is installed, else ``transformers`` (a
    :class:`~dpsynth.llm.local.LocalGenerator` then prefers ``openvino`` where it fits: that
    needs the model, :func:`~dpsynth.llm.local.openvino_fits`)."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    return "ctranslate2" if ct2.available() else "transformers"


DEVICE_FORMS = "cpu, cuda, cuda:N or auto"


def resolve_device(device: str) -> str:
    """The torch device of a local model: ``cpu``; ``cuda`` / ``cuda:N`` (refused with a
    clear error when torch sees no such GPU); ``auto`` (the first GPU when torch sees one,
    else the CPU)."""
    form = str(device).strip().lower()
    if form == "cpu":
        return "cpu"
    if form not in ("auto", "cuda") and not (form.startswith("cuda:") and form[5:].isdigit()):
        raise ConfigError(f"device {device!r}: use {DEVICE_FORMS}")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if form == "auto":
        return "cuda" if gpus else "cpu"
    if not gpus:
        raise ConfigError(
            f"device {device!r}: torch sees no GPU (torch {torch.__version__}"
            f"{', a CPU-only build' if torch.version.cuda is None else ''}); use device: cpu "
            "or auto, or install a CUDA build of torch (docs/gpu.md)")
    index = int(form[5:]) if ":" in form else 0
    if index >= gpus:
        raise ConfigError(f"device {device!r}: torch sees {gpus} GPU(s) (cuda:0 to "
                          f"cuda:{gpus - 1})")
    return form


def import_openvino() -> Any:
    """``import openvino`` without its telemetry: openvino_telemetry, when openvino finds it,
    writes ``~/intel/openvino_ga_cid`` on import and tries to send usage data; hidden from
    the import, openvino uses its own stub (nothing written, nothing sent)."""
    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return openvino


def stepper_threads(gen: Any) -> int:
    """The threads a stepper (OpenVINO or torch) runs on: the generator's configured threads
    (``generators[].threads``), else every core this process may use, never the cores idle
    at the moment. Its logits follow the thread count (OpenVINO's float32 logits of SmolLM2
    differ by up to 0.012 between one thread and two, and on one thread bf16 runs as f32:
    0.47), so a count read from the load would make a seeded build's release depend on what
    else ran on the machine."""
    configured = getattr(gen, "configured_threads", None)
    return min(int(configured), available_cores()) if configured else available_cores()


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch on ``n`` threads inside the block, its count before restored after."""
    import torch

    before = torch.get_num_threads()
    if before != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
