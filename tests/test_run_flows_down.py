"""Issue 47: a run flows down its floors. benchmarks/run_trace.py's profiler follows a run of
each PE method on the fakes (the production runner, loop, planner, calibration and engine)
and places every call between two rooms on docs/architecture.md's floors: no call climbs to a
higher floor but along the named arrow (reading a config validates a method's section through
the lazy registry) and, for a method with statistics of its own, the engine running the
shard kernels it was handed (docs/adding-a-method.md, "A method's own statistics")."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from test_release_check import CENSUS_SIZES, pe_config, private_rows, run_pe, write_csv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from run_trace import Trace  # noqa: E402  (the trace tool the benchmark runs)

#: the climbs a run may make: the named arrow of docs/architecture.md ("Floors")
NAMED = {("dpsynth.config", "dpsynth.methods")}


def _traced(fn: Any) -> Trace:
    trace = Trace()
    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return trace


@pytest.mark.parametrize("method", ["aug_pe", "wasp", "secpe", "zero_shot"])
def test_a_run_calls_no_floor_above_its_own(method: str, tmp_path: Path) -> None:
    data = write_csv(tmp_path / "d.csv", private_rows(40))
    cfg = pe_config(method, data, **{"synthesis.population": None,
                                     **CENSUS_SIZES.get(method, {})})
    trace = _traced(lambda: run_pe(cfg, tmp_path / "run"))
    climbs = trace.summary()["climbs"]
    kernels = {pair: fns for pair, fns in climbs.items() if pair not in NAMED}
    for (caller, callee), fns in kernels.items():  # only the engine running a shard kernel
        assert caller == "dpsynth.compute" and callee.startswith("dpsynth.methods."), \
            (caller, callee, dict(fns))
        for call in fns:
            assert call.split(" -> ")[0] in ("LocalCompute.map", "LocalCompute.map_keeping",
                                             "LocalCompute.off_driver"), call
    if method != "secpe":  # the one method here with statistics of its own
        assert not kernels, dict(kernels)
    # the trace sees climbs: reading the config climbs along the named arrow in every run
    assert set(climbs) >= NAMED and trace.summary()["rooms"] > 10
