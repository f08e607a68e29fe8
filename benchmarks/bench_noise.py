"""Noise cost: the exact discrete Gaussian (issue 28) vs today's floating-point Gaussian, side by
side in one run, and what it adds to a run's accounting.

    .venv/bin/python benchmarks/bench_noise.py [--repeats 5] [--out benchmarks/results/noise.md]

Cases (both noise modes, paths alternating which runs first in each repeat):

- a 10,000-candidate vote histogram (integer counts, sigma = 11.8, the T = 10 / eps = 1 scale):
  ``gaussian_mechanism`` (float N(0, sigma^2)) vs ``discrete_gaussian_mechanism`` on the integers;
- SecPE's centre sums: 1000 centres x 384 dims + 1000 counts = 385,000 real coordinates,
  sigma = 2: float noise vs rounding onto the 2^-32 grid with discrete Gaussian steps there;
- calibration of a 10-iteration Aug-PE plan (label counts + votes, 'pld'): continuous
  Gaussian PLD vs dp_accounting's discrete Gaussian PLD.
Median wall seconds of the repeats; the ratio is new / old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.bench.machine import Where, describe
from dpsynth.privacy import (
    DiscreteGaussianEvent,
    GaussianEvent,
    Lattice,
    ReleasePlan,
    Scaled,
    calibrate_gaussian_sigma,
    discrete_gaussian_mechanism,
    gaussian_mechanism,
    make_noise_source,
)
from dpsynth.privacy import calibration as calibration_module

ROOT = Path(__file__).resolve().parent


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _cases() -> dict[str, tuple[Callable[[str], object], Callable[[str], object]]]:
    votes = np.random.default_rng(0).poisson(3.0, 10_000).astype(np.float64)
    centres = np.random.default_rng(1).normal(size=385_000)
    counts, rounded = Lattice.counts(), Lattice.rounded(2.0)

    def noise(mode: str):  # a fresh key stream per draw, as in the session
        return make_noise_source(mode, 7 if mode == "seeded" else None).spawn("bench")

    def calibrate(events: ReleasePlan) -> Callable[[str], object]:
        def run(_mode: str) -> object:
            calibration_module._CALIBRATED.clear()
            return calibrate_gaussian_sigma(1.0, 1e-5, events)
        return run

    return {
        "histogram 10,000 (counts, sigma 11.8)": (
            lambda m: gaussian_mechanism(votes, 11.8, noise(m)),
            lambda m: discrete_gaussian_mechanism(votes, 11.8, counts, noise(m))),
        "SecPE 1000 x 384 + 1000 (real, sigma 2)": (
            lambda m: gaussian_mechanism(centres, 2.0, noise(m)),
            lambda m: discrete_gaussian_mechanism(centres, 2.0, rounded, noise(m))),
        "calibration, Aug-PE T = 10 ('pld')": (
            calibrate(ReleasePlan((Scaled(GaussianEvent(1.0, 1.0, 11)),))),
            calibrate(ReleasePlan((Scaled(DiscreteGaussianEvent(1.0, 1.0, 11, shifts=(1,))),)))),
    }


def measure(repeats: int) -> list[dict[str, object]]:
    rows = []
    for name, (old, new) in _cases().items():
        modes = ("secure", "seeded") if not name.startswith("calibration") else ("-",)
        for mode in modes:
            times: dict[str, list[float]] = {"old": [], "new": []}
            old(mode), new(mode)  # warm-up (imports, caches)
            for r in range(repeats):
                order = (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
                for tag, fn in order:
                    times[tag].append(_timed(lambda fn=fn, mode=mode: fn(mode)))
            o, n = statistics.median(times["old"]), statistics.median(times["new"])
            rows.append({"case": name, "mode": mode, "old": o, "new": n, "ratio": n / o})
    return rows


def render(rows: list[dict[str, object]], repeats: int, where: dict[str, Any]) -> str:
    out = ["## Noise: exact discrete Gaussian vs floating-point Gaussian (issue 28)", "",
           f"Machine: {describe(where)} (compare the ratios, measured side by side in one "
           "run).", "",
           f"Median of {repeats} repeats, paths alternating which runs first; a fresh key "
           "stream per draw as in the session.", "",
           "| case | noise | float Gaussian s | discrete Gaussian s | ratio |",
           "|---|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['mode']} | {r['old']:.4f} | {r['new']:.4f} | "
                   f"{r['ratio']:.1f}x |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "noise.md")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with Where() as where:
        rows = measure(args.repeats)
    text = render(rows, args.repeats, where.result())
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
