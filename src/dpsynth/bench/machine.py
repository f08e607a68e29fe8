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

Neither the load average nor the CPU's name says what the machine delivers. "AMD EPYC" with 2
cores named two machines here: one with AVX-512 (bf16, VNNI) whose float32 GEMM reached 190
GFLOP/s and an array copy 28 GB/s, and, on 2026-12-05, one with AVX2 only that reached 42 and
7-16 at a load of 0.1; a guest on a contended host reads a low load too. So :class:`Where`
also probes what the machine delivers, before and after the measurement
(:func:`probe_capacity`: a float32 GEMM and an array copy, about half a second on the faster
machine), reports the rates beside the result, and compares the lower of the two probes with
:data:`CAPACITY_REFERENCE`, what a healthy machine of this CPU model, core count and
instruction sets reached. A probe under :data:`HEALTHY_SHARE` of it marks the run ``slowed``
and not quiet; a machine with no reference is reported, not judged.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: Instruction sets that decide which kernels run (GEMM, int8 dot products, bf16).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
             "amx_bf16", "amx_int8")
QUIET_LOAD = 1.0
#: What :func:`probe_capacity` reaches at its default sizes on a healthy, quiet machine, per
#: (CPU model, cores, the :data:`ISA_FLAGS` listed): numpy float32 GEMM (GFLOP/s) and array
#: copy (GB/s, bytes read and written), from the quiet `dpsynth bench all` runs in
#: benchmarks/results (bench_all_quiet3.json, 2026-12-05: 190.2 on a 2048 GEMM and 28.3 on a
#: 512 MB copy, best of 5; the 512 MB copy stands for the probe's 64 MB one, both far beyond
#: the 32 MB of L3). The probe is small so that it adds little to a process whose peak memory
#: a benchmark reads (128 MB at most, freed before the measurement starts).
CAPACITY_REFERENCE: dict[tuple[str, int, tuple[str, ...]], dict[str, float]] = {
    ("AMD EPYC", 2, ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni")):
        {"gemm_gflops": 190.0, "copy_gbs": 28.0},
}
PROBE_SIZE, PROBE_MB = 2048, 64
#: A probe under this share of its reference (either rate) marks the measurement ``slowed``.
HEALTHY_SHARE = 0.6


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


def probe_capacity(size: int = PROBE_SIZE, mb: int = PROBE_MB,
                   repeats: int = 3) -> dict[str, float]:
    """What the machine delivers now: the best of ``repeats`` numpy float32 GEMMs of
    ``size``^3 (GFLOP/s) and copies of ``mb`` MB (GB/s, read plus write)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    src = np.ones(mb * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    gemm = copy = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ a
        gemm = min(gemm, time.perf_counter() - t)
        t = time.perf_counter()
        np.copyto(dst, src)
        copy = min(copy, time.perf_counter() - t)
    return {"gemm_gflops": round(2 * size**3 / gemm / 1e9, 1),
            "copy_gbs": round(2 * src.nbytes / copy / 1e9, 1), "gemm_size": size, "copy_mb": mb}


def capacity(probes: list[dict[str, float]], info: dict[str, Any]) -> dict[str, Any]:
    """The lower of ``probes``' rates, each as a share of :data:`CAPACITY_REFERENCE` for
    ``info``'s CPU model, cores and instruction sets, and ``slowed`` (None where there is no
    reference, or the probes ran at other sizes than the reference's: a small GEMM is slower
    per FLOP)."""
    low = {key: min(p[key] for p in probes) for key in ("gemm_gflops", "copy_gbs")}
    ref = CAPACITY_REFERENCE.get((info.get("cpu_model", ""), int(info.get("cores", 0)),
                                  tuple(info.get("isa", ()))))
    if any((p.get("gemm_size", PROBE_SIZE), p.get("copy_mb", PROBE_MB)) != (PROBE_SIZE, PROBE_MB)
           for p in probes):
        ref = None
    if ref is None:
        return {**low, "reference": None, "share": None, "slowed": None}
    share = min(low[key] / ref[key] for key in low)
    return {**low, "reference": ref, "share": round(share, 2), "slowed": share < HEALTHY_SHARE}


class Where:
    """Context manager around one measurement; :meth:`result` is its ``"machine"`` object."""

    def __init__(self, sample_every: float = 5.0, start_load: float | None = None,
                 probe: Callable[[], dict[str, float]] | None = probe_capacity) -> None:
        """``start_load``: the load average the quiet rule reads at the start (default: the
        one at :meth:`__enter__`; a suite passes its own start's). ``probe``: what measures the
        machine's capacity before and after (None: not probed, not judged on it)."""
        self._every = sample_every
        self._probe = probe
        self.probes: list[dict[str, float]] = []
        self._start_load = start_load
        self._stop = threading.Event()
        self.load_start = self.load_end = self.load_max = 0.0
        self._t0 = self._busy0 = self._own0 = 0.0
        self.wall = self.other_cpu = 0.0
        self.own_elsewhere = 0.0

    def count_as_own(self, cpu_seconds: float) -> None:
        """CPU time the measurement spent in processes that are not this one's reaped children
        (e.g. a Ray cluster's workers), so that it is not read as other processes' load."""
        self.own_elsewhere += cpu_seconds

    def _sample(self) -> None:
        while not self._stop.wait(self._every):
            self.load_max = max(self.load_max, os.getloadavg()[0])

    def __enter__(self) -> Where:
        if self._probe is not None:  # outside the timed span: its CPU is not the run's
            self.probes.append(self._probe())
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
        self.other_cpu = max(0.0, _busy_seconds() - self._busy0 - own - self.own_elsewhere)
        if self._probe is not None:
            self.probes.append(self._probe())

    @property
    def other_load(self) -> float:
        """Mean number of cores other processes kept busy during the measurement."""
        return self.other_cpu / self.wall if self.wall > 0 else 0.0

    def quiet(self, info: dict[str, Any]) -> bool:
        """Load average <= 1 at the start, other processes below one core on average, and the
        machine not slowed (:func:`capacity`) where it was probed."""
        start = self.load_start if self._start_load is None else self._start_load
        slowed = bool(self.probes) and capacity(self.probes, info)["slowed"] is True
        return start <= QUIET_LOAD and self.other_load <= QUIET_LOAD and not slowed

    def result(self, info: dict[str, Any] | None = None) -> dict[str, Any]:
        """Machine info with this measurement's load, capacity and ``quiet``."""
        info = info if info is not None else machine_info()
        return {
            **info,
            "load_average_1m": {"start": round(self.load_start, 2),
                                "end": round(self.load_end, 2),
                                "max": round(self.load_max, 2)},
            "other_load": round(self.other_load, 2),
            "wall_seconds": round(self.wall, 2),
            "capacity": capacity(self.probes, info) if self.probes else None,
            "quiet": self.quiet(info),
            "quiet_rule": "load average <= 1 at the start, other processes' CPU use <= 1 "
                          f"core on average during the run, and the capacity probes at least "
                          f"{HEALTHY_SHARE} of this CPU's reference",
        }


def describe(m: dict[str, Any]) -> str:
    """One line for a result file: the CPU, its instruction sets, the load and the verdict
    (``m`` is :meth:`Where.result`)."""
    la, cap = m["load_average_1m"], m.get("capacity")
    probed = ""
    if cap:
        share = (f" ({cap['share']} of this CPU's reference"
                 f"{': slowed' if cap['slowed'] else ''})" if cap["share"] is not None
                 else " (no reference for this CPU)")
        probed = f"; GEMM {cap['gemm_gflops']} GFLOP/s, copy {cap['copy_gbs']} GB/s{share}"
    return (f"{m['cpu_model']}, {m['cores']} cores, {' '.join(m['isa']) or 'no listed ISA'}; "
            f"load average {la['start']} -> {la['end']} (max {la['max']}), other processes "
            f"{m['other_load']} cores{probed}; quiet: {str(m['quiet']).lower()}")
