"""Where a benchmark ran: CPU model, the instruction sets that matter, cores, and the load.

Every ``dpsynth bench ...`` result carries a ``"machine"`` object (:class:`Where`): the CPU
model, which of :data:`ISA_FLAGS` ``/proc/cpuinfo`` lists, the cores this process may use, the
1-minute load average at the start and the end of the measurement (and the highest seen in
between, sampled every few seconds), and ``"quiet"``.

A benchmark's own threads raise the load average too (a 2-thread benchmark running a minute on
2 cores reads about 2 by itself), so "the load during the run" is taken as the load of *other*
processes: the machine's busy CPU time over the run (``/proc/stat``) minus the CPU time of this
process and its reaped children (``os.times``), per second of wall time (``other_load``).
``quiet`` is false when the load average exceeded 1 at the start, or other processes kept more
than one core busy on average during the run. Inside a suite (``dpsynth bench all``) the start
that counts is the suite's: a section's own start reads the load the previous section left
(``Where(start_load=...)``), which says nothing about other processes.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

#: Instruction sets that decide which kernels run (GEMM, int8 dot products, bf16).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
             "amx_bf16", "amx_int8")
QUIET_LOAD = 1.0


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """CPU model, logical CPUs listed and the :data:`ISA_FLAGS` present, from /proc/cpuinfo
    text (x86 ``flags``; ARM ``Features``)."""
    model = ""
    flags: set[str] = set()
    cpus = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key == "processor":
            cpus += 1
        elif key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    present = [f for f in ISA_FLAGS if f in flags]
    return {"cpu_model": model or "unknown", "logical_cpus": cpus, "isa": present,
            "amx": any(f.startswith("amx") for f in present)}


def _busy_seconds(stat: str | None = None) -> float:
    """Busy CPU-seconds of the whole machine since boot (all cores), from /proc/stat."""
    if stat is None:
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return float("nan")
    fields = [int(v) for v in stat.splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """:func:`parse_cpuinfo` of this machine plus the cores this process may use."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text("utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    info = parse_cpuinfo(cpuinfo)
    info["cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 0)
    return info


class Where:
    """Context manager around one measurement; :meth:`result` is its ``"machine"`` object."""

    def __init__(self, sample_every: float = 5.0, start_load: float | None = None) -> None:
        """``start_load``: the load average the quiet rule reads at the start (default: the
        one at :meth:`__enter__`; a suite passes its own start's)."""
        self._every = sample_every
        self._start_load = start_load
        self._stop = threading.Event()
        self.load_start = self.load_end = self.load_max = 0.0
        self._t0 = self._busy0 = self._own0 = 0.0
        self.wall = self.other_cpu = 0.0

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            self.load_max = max(self.load_max, os.getloadavg()[0])

    def __enter__(self) -> Where:
        self.load_start = self.load_max = os.getloadavg()[0]
        self._t0, self._busy0, self._own0 = time.perf_counter(), _busy_seconds(), _own_seconds()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.load_end = os.getloadavg()[0]
        self.load_max = max(self.load_max, self.load_end)
        self.wall = time.perf_counter() - self._t0
        own = _own_seconds() - self._own0
        self.other_cpu = max(0.0, _busy_seconds() - self._busy0 - own)

    @property
    def other_load(self) -> float:
        """Mean number of cores other processes kept busy during the measurement."""
        return self.other_cpu / self.wall if self.wall > 0 else 0.0

    @property
    def quiet(self) -> bool:
        """Load average <= 1 at the start and other processes below one core on average."""
        start = self.load_start if self._start_load is None else self._start_load
        return start <= QUIET_LOAD and self.other_load <= QUIET_LOAD

    def result(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Machine info with this measurement's load and ``quiet``."""
        return {
            **(info if info is not None else machine_info()),
            "load_average_1m": {"start": round(self.load_start, 2),
                                "end": round(self.load_end, 2),
                                "max": round(self.load_max, 2)},
            "other_load": round(self.other_load, 2),
            "wall_seconds": round(self.wall, 2),
            "quiet": self.quiet,
            "quiet_rule": "load average <= 1 at the start and other processes' CPU use <= 1 "
                          "core on average during the run",
        }
