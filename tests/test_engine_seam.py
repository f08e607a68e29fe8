"""The engine seam (issue 47): a caller learns where a dataset's records are through
:func:`dpsynth.on_shards.engine_of` (a runtime-checkable Protocol), never by probing the
dataset with getattr; a test shows the probe check can fail."""

from __future__ import annotations

import re
from pathlib import Path

from dpsynth.compute import LocalCompute
from dpsynth.on_shards import OnShards, engine_of

SRC = Path(__file__).resolve().parents[1] / "src" / "dpsynth"
_PROBE = re.compile(r"getattr\([^,]+,\s*[\"']compute[\"']")


def probes(text: str) -> list[str]:
    """The lines of ``text`` that ask an object for its engine by getattr."""
    return [line.strip() for line in text.splitlines() if _PROBE.search(line)]


def test_no_getattr_probe_for_an_engine_in_src() -> None:
    found = [f"{p.relative_to(SRC)}: {line}" for p in sorted(SRC.rglob("*.py"))
             for line in probes(p.read_text(encoding="utf-8"))]
    assert found == []
    assert probes('engine = getattr(dataset, "compute", None)')  # it can fail


def test_engine_of_names_the_shards_engine_or_none() -> None:
    engine = LocalCompute.__new__(LocalCompute)

    class Sharded:
        def __init__(self) -> None:
            self.compute = engine

    class InProcess:
        texts = ["a", "b"]

    assert isinstance(Sharded(), OnShards) and engine_of(Sharded()) is engine
    assert not isinstance(InProcess(), OnShards) and engine_of(InProcess()) is None
