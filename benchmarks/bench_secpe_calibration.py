"""SecPE's per-secret sigma calibration: the search in effective Gaussian mu (production,
``methods.secpe.theory._calibrate_one_sigma``) against plain bisection in log sigma over the same
blow-up (the previous method, kept here as the baseline), side by side in one run.

    .venv/bin/python benchmarks/bench_secpe_calibration.py   # -> results/secpe_calibration.md

Both start from the same Gaussian bracket, narrow on the coarse PLD grid (1e-2) to the same
relative tolerance and finish on the fine grid (3e-3); both return a sigma that meets the bound
on the fine grid. Columns: PLD constructions (blow-up evaluations) and seconds per case.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from dpsynth.bench.machine import Where, describe
from dpsynth.methods.secpe import theory
from harness import ROOT, markdown

CASES = [  # (name, p, r, T, rates of the records holding the secret)
    ("3 records at rate 0.05, T 3", 1e-4, 1e-3, 3, np.full(3, 0.05)),
    ("2 records at 0.2 and 0.5, T 2", 1e-4, 1e-3, 2, np.array([0.2, 0.5])),
    ("1 record at rate 1, T 5 (Gaussian)", 1e-4, 1e-3, 5, np.array([1.0])),
    ("40 records at rate 0.01, T 4", 1e-4, 5e-4, 4, np.full(40, 0.01)),
    ("4 mixed rates, T 1", 1e-4, 2e-3, 1, np.array([0.3, 0.3, 0.9, 0.02])),
]
TOL, FINE, COARSE = 1e-3, theory.DEFAULT_DISCRETIZATION, 1e-2


def bisection(p: float, r: float, rates: np.ndarray, T: int) -> float:
    """The baseline: bracket from the dominating Gaussian, bisect in log sigma on the coarse
    grid to 1e-2, then on the fine grid to TOL (what production did before the mu search)."""
    eta = float(theory.r_to_mu(p, r))
    support, _, _ = theory.poisson_binomial_pmf(rates)

    def ok(sigma: float, disc: float) -> bool:
        return theory.blowup(p, rates, sigma, T, discretization=disc).value <= r

    hi = max(float(support[-1]), 1.0) * math.sqrt(T) / eta * 1.05
    while not ok(hi, COARSE):
        hi *= 2.0
    lo = hi / 2.0
    while ok(lo, COARSE):
        hi, lo = lo, lo / 2.0
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid, COARSE) else (mid, hi)
    lo = hi / 1.03
    while not ok(hi, FINE):
        lo, hi = hi, hi * 1.03
    while hi / lo > 1.0 + TOL:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid, FINE) else (mid, hi)
    return hi


def timed(fn: Any) -> tuple[float, int, float]:
    """(sigma, PLD constructions, seconds) of one calibration."""
    count = [0]
    real = theory.blowup

    def counted(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(*args, **kwargs)

    theory.blowup = counted
    try:
        start = time.perf_counter()
        sigma = fn()
        return sigma, count[0], time.perf_counter() - start
    finally:
        theory.blowup = real


def main() -> None:
    rows = []
    totals = [0.0, 0.0]
    with Where() as where:
        for name, p, r, T, rates in CASES:
            s_new, n_new, t_new = timed(
                lambda p=p, r=r, T=T, rates=rates: theory._calibrate_one_sigma(
                    p, r, rates, T, rel_tol=TOL, discretization=FINE, lower_hint=None))
            s_old, n_old, t_old = timed(
                lambda p=p, r=r, T=T, rates=rates: bisection(p, r, rates, T))
            for sigma in (s_new, s_old):  # both meet the bound on the fine grid
                assert theory.blowup(p, rates, sigma, T, discretization=FINE).value <= r
            totals[0] += t_old
            totals[1] += t_new
            rows.append({"case": name, "sigma (mu search)": round(s_new, 6),
                         "sigma (bisection)": round(s_old, 6), "PLDs (mu search)": n_new,
                         "PLDs (bisection)": n_old, "seconds (mu search)": round(t_new, 2),
                         "seconds (bisection)": round(t_old, 2),
                         "speed-up": round(t_old / t_new, 2)})
            print(rows[-1], flush=True)
        rows.append({"case": "all cases", "seconds (mu search)": round(totals[1], 2),
                     "seconds (bisection)": round(totals[0], 2),
                     "speed-up": round(totals[0] / totals[1], 2)})
    intro = (f"p, r per case, rel_tol {TOL}, coarse grid {COARSE}, fine grid {FINE}; each "
             "case runs both searches one after the other in one process. Machine: "
             f"{describe(where.result())}.")
    (ROOT / "results" / "secpe_calibration.md").write_text(
        markdown("SecPE sigma calibration: mu search vs bisection", intro, rows))


if __name__ == "__main__":
    main()
