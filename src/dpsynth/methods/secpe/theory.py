"""(p, r)-secret protection for SecPE (ICLR 2026, "Secret-Protected Evolution"), docs/methods.md §3.

A mechanism A gives (p, r)-secret protection when, for every reconstruction attack B and every
secret s_j with prior success rate p_j, Pr[B(A(D_j)) = s_j] <= r_j. This is a single-point
relaxation of Gaussian DP: it is NOT differential privacy and must never be reported as such.

Contents (all pure functions):

* ``mu_to_r`` / ``r_to_mu``: Lemma 3.3, r = 1 - Phi(Phi^-1(1 - p) - mu), and its inverse
  eta = Phi^-1(1 - p) - Phi^-1(1 - r) (the per-secret budget of Eq. 4).
* ``secret_weights_lp`` / ``sampling_rates``: the SecretNoise linear program (Ganesh et al. 2025,
  "Hush!") giving record weights w_i and Poisson sampling rates rho_i.
* ``poisson_binomial_pmf``: the sensitivity distribution sum_{i contains s_j} Bern(rho_i).
* ``blowup``: B_{P,Q}(p) = sup{P(E) : Q(E) <= p} = inf_eps [e^eps p + H_{e^eps}(P || Q)] for the
  dominating pair P_j = N(sum Bern(rho_i), sigma^2)^{x T}, Q_j = N(0, sigma^2)^{x T}, via
  dp_accounting's mixture-of-Gaussians privacy loss distribution (pessimistic, both directions).
* ``calibrate_secret_sigma``: smallest sigma_j with B_j(p_j) <= r_j; sigma = max_j sigma_j.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.stats import norm

#: Default PLD discretisation of the privacy loss (dp_accounting's value_discretization_interval).
#: Pessimistic rounding keeps every blow-up an upper bound; 3e-3 is within ~1e-6 of 1e-3 on the
#: checks in tests/test_secpe_privacy.py and ~3x faster.
DEFAULT_DISCRETIZATION = 3e-3

#: Poisson-binomial tail mass dropped per step; added back to the blow-up as T * tail (see blowup).
DEFAULT_TAIL_MASS = 1e-12


# --------------------------------------------------------------------------------------------
# Lemma 3.3: mu-GDP <-> (p, r)
# --------------------------------------------------------------------------------------------


def _check_p(p: np.ndarray) -> None:
    if np.any(~np.isfinite(p)) or np.any(p <= 0) or np.any(p >= 1):
        raise ValueError(f"prior success rate p must lie in (0, 1), got {p!r}")


def mu_to_r(mu: float | np.ndarray, p: float | np.ndarray) -> float | np.ndarray:
    """Posterior success bound of a mu-GDP mechanism: r = 1 - Phi(Phi^-1(1 - p) - mu) (Lemma 3.3).

    Vectorised over secrets; mu = inf gives r = 1 (no protection).
    """
    mu_a = np.asarray(mu, dtype=np.float64)
    p_a = np.asarray(p, dtype=np.float64)
    _check_p(p_a)
    if np.any(mu_a < 0):
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    # norm.sf(x) = 1 - Phi(x), accurate in the upper tail; isf(p) = Phi^-1(1 - p).
    r = norm.sf(norm.isf(p_a) - mu_a)
    return float(r) if r.ndim == 0 else r


def r_to_mu(p: float | np.ndarray, r: float | np.ndarray) -> float | np.ndarray:
    """Per-secret GDP budget eta = Phi^-1(1 - p) - Phi^-1(1 - r) (Lemma 3.3 inverted, Eq. 4).

    r = 1 (or r = inf, i.e. r/p = inf) gives eta = inf: the secret needs no protection.
    Raises when r <= p (a bound below the prior is unattainable by any mechanism).
    """
    p_a = np.asarray(p, dtype=np.float64)
    r_a = np.asarray(r, dtype=np.float64)
    _check_p(p_a)
    p_b, r_b = np.broadcast_arrays(p_a, r_a)
    if np.any(np.isnan(r_b)) or np.any(r_b <= p_b):
        raise ValueError(
            f"posterior bound r must exceed the prior p for every secret (got p={p!r}, r={r!r})"
        )
    with np.errstate(divide="ignore", invalid="ignore"):
        eta = np.where(r_b >= 1.0, np.inf, norm.isf(p_b) - norm.isf(np.minimum(r_b, 1.0)))
    return float(eta) if eta.ndim == 0 else eta


# --------------------------------------------------------------------------------------------
# SecretNoise LP (Ganesh et al. 2025) and sampling rates
# --------------------------------------------------------------------------------------------


def secret_weights_lp(membership: sp.spmatrix | np.ndarray, eta: np.ndarray) -> np.ndarray:
    """SecretNoise LP: max sum_i w_i s.t. sum_{i contains s_j} w_i <= eta_j for all j, w >= 0.

    ``membership`` is [n_records x n_secrets] with a nonzero where record i contains secret j.
    Secrets with eta_j = inf impose no constraint. Every w_i is additionally bounded by the
    largest finite eta (records that only hold unconstrained secrets would otherwise be
    unbounded); this bound is never active for a record holding a constrained secret.
    Solved with scipy's HiGHS on the sparse constraint matrix.
    """
    a = sp.csr_matrix(membership, dtype=np.float64, copy=True)
    a.data[:] = 1.0
    n_rec, n_sec = a.shape
    eta = np.asarray(eta, dtype=np.float64).ravel()
    if eta.shape[0] != n_sec:
        raise ValueError(f"eta has {eta.shape[0]} entries but membership has {n_sec} secrets")
    if np.any(np.isnan(eta)) or np.any(eta <= 0):
        raise ValueError("every secret budget eta_j must be > 0 (r_j > p_j)")
    if n_rec == 0:
        return np.zeros(0)
    finite = np.isfinite(eta)
    if not finite.any():
        # No secret needs protection: weights are irrelevant (sigma = 0); return uniform ones.
        return np.ones(n_rec)
    cap = float(eta[finite].max())
    a_ub = a[:, np.flatnonzero(finite)].T.tocsr()  # [n_finite_secrets x n_records]
    res = linprog(
        c=-np.ones(n_rec),
        A_ub=a_ub,
        b_ub=eta[finite],
        bounds=(0.0, cap),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"SecretNoise LP failed: {res.message}")
    w = np.clip(np.asarray(res.x, dtype=np.float64), 0.0, None)
    # HiGHS satisfies constraints up to its feasibility tolerance (~1e-7); rescale so that every
    # constraint holds exactly (privacy must never rest on solver tolerance).
    load = a_ub @ w
    over = np.max(load / eta[finite]) if load.size else 0.0
    if over > 1.0:
        w = w / over
    return w


def sampling_rates(w: np.ndarray, rule: str = "paper") -> np.ndarray:
    """Poisson sampling rates rho_i from LP weights.

    rule="paper": rho_i = (1 / max_i w_i) * w_i / sum_i' w_i' (SecPE paper, SecretNoise step;
    docs/methods.md §3 agrees). Note this makes sum_i rho_i = 1 / max w, so few records are
    sampled; the rate is clipped to 1. rule="max": rho_i = w_i / max w (the record with the
    largest weight is always included). Either is private: the calibration below uses whatever
    rates are given.
    """
    w = np.asarray(w, dtype=np.float64)
    if w.size == 0:
        return w.copy()
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite and >= 0")
    wmax = float(w.max())
    if wmax <= 0:
        return np.zeros_like(w)
    if rule == "paper":
        rho = w / (wmax * float(w.sum()))
    elif rule == "max":
        rho = w / wmax
    else:
        raise ValueError(f"unknown sampling rule {rule!r} (use 'paper' or 'max')")
    return np.clip(rho, 0.0, 1.0)


def rates_per_secret(membership: sp.spmatrix, rho: np.ndarray) -> list[np.ndarray]:
    """For every secret j, the rates rho_i of the records that contain s_j."""
    csc = sp.csc_matrix(membership)
    rho = np.asarray(rho, dtype=np.float64)
    return [rho[csc.indices[csc.indptr[j] : csc.indptr[j + 1]]] for j in range(csc.shape[1])]


# --------------------------------------------------------------------------------------------
# Blow-up of the dominating pair via the mixture-of-Gaussians PLD
# --------------------------------------------------------------------------------------------


def poisson_binomial_pmf(
    rates: Sequence[float] | np.ndarray, tail_mass: float = DEFAULT_TAIL_MASS
) -> tuple[np.ndarray, np.ndarray, float]:
    """pmf of sum_i Bern(rho_i) by exact convolution, upper tail cut at mass <= tail_mass.

    Returns (support k = 0..K, probabilities renormalised over the kept support, dropped mass).
    The caller must account for the dropped mass (``blowup`` adds T * dropped to the bound).
    """
    rates = np.clip(np.asarray(rates, dtype=np.float64).ravel(), 0.0, 1.0)
    rates = rates[rates > 0]
    step_budget = tail_mass / max(rates.size, 1)
    pmf = np.ones(1)  # sub-probability: P(S_t = k and no partial sum was cut)
    for q in rates:
        nxt = np.zeros(pmf.size + 1)
        nxt[:-1] += pmf * (1.0 - q)
        nxt[1:] += pmf * q
        # Cut the upper tail whose mass is below this step's share of the budget. The kept
        # entries never exceed the true pmf, so the total dropped mass is 1 - sum(kept).
        tail = np.cumsum(nxt[::-1])[::-1]  # tail[k] = mass at >= k
        small = np.flatnonzero(tail <= step_budget)
        cut = max(int(small[0]), 1) if small.size else nxt.size
        pmf = nxt[:cut]
    dropped = float(max(0.0, 1.0 - pmf.sum()))
    kept = pmf / pmf.sum()
    cut = kept.size
    return np.arange(cut, dtype=np.float64), kept, dropped


@dataclass(frozen=True)
class BlowupResult:
    """Blow-up value and how it was obtained."""

    value: float
    epsilon: float  # minimising eps in inf_eps [e^eps p + H_{e^eps}]
    dropped_mass: float


def _pld(sigma: float, support: np.ndarray, probs: np.ndarray, T: int, disc: float):
    from dp_accounting.pld import privacy_loss_distribution as pldm

    mask = probs > 0
    sens, pr = support[mask], probs[mask]
    if sens.size == 1:
        # Point mass: the plain Gaussian mechanism (dp_accounting's mixture code can fail its
        # tail binary search on this degenerate case).
        pld = pldm.from_gaussian_mechanism(
            standard_deviation=sigma,
            sensitivity=float(sens[0]),
            pessimistic_estimate=True,
            value_discretization_interval=disc,
        )
    else:
        pld = None
        for bound in (-50.0, -49.5, -49.0):  # retry on the same tail-search failure
            try:
                pld = pldm.from_mixture_gaussian_mechanism(
                    standard_deviation=sigma,
                    sensitivities=sens.tolist(),
                    sampling_probs=pr.tolist(),
                    pessimistic_estimate=True,
                    value_discretization_interval=disc,
                    log_mass_truncation_bound=bound,
                )
                break
            except TypeError:
                continue
        if pld is None:
            raise RuntimeError(f"dp_accounting could not build the mixture PLD at sigma={sigma}")
    return pld.self_compose(T) if T > 1 else pld


def _inf_over_eps(pld, p: float) -> tuple[float, float]:
    """inf_eps [e^eps p + delta(eps)] over a grid refined twice (any eps gives an upper bound)."""
    lo, hi = -10.0, 60.0
    best_v, best_e = math.inf, 0.0
    for _ in range(3):
        eps = np.linspace(lo, hi, 801)
        vals = np.exp(eps) * p + np.asarray(pld.get_delta_for_epsilon(eps), dtype=np.float64)
        i = int(np.argmin(vals))
        if vals[i] < best_v:
            best_v, best_e = float(vals[i]), float(eps[i])
        step = eps[1] - eps[0]
        lo, hi = eps[max(i - 2, 0)], eps[min(i + 2, eps.size - 1)]
        if step < 1e-6:
            break
    return min(best_v, 1.0), best_e


def blowup(
    p: float,
    rates: Sequence[float] | np.ndarray | None,
    sigma: float,
    T: int = 1,
    *,
    sensitivities: Sequence[float] | None = None,
    probs: Sequence[float] | None = None,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail_mass: float = DEFAULT_TAIL_MASS,
) -> BlowupResult:
    """B_{P,Q}(p) = sup{P(E) : Q(E) <= p} = inf_eps [e^eps p + H_{e^eps}(P || Q)].

    P = N(S, sigma^2)^{x T}, Q = N(0, sigma^2)^{x T} with S = sum_i Bern(rates_i) (the SecPE
    dominating pair for one secret), or S given directly by (sensitivities, probs). The PLD is
    pessimistic and dp_accounting returns max(H(P||Q), H(Q||P)) over its remove/add directions,
    so the value is an upper bound on the blow-up in either direction. The truncated upper tail of
    S (mass tau per step) is added as T * tau: P = (1 - tau) P' + tau P'' gives
    P^{xT}(E) <= P'^{xT}(E) + T tau.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if T < 1:
        raise ValueError(f"T must be >= 1, got {T}")
    if sensitivities is not None:
        support = np.asarray(sensitivities, dtype=np.float64)
        pr = np.asarray(probs, dtype=np.float64)
        if support.shape != pr.shape or abs(pr.sum() - 1.0) > 1e-9 or np.any(pr < 0):
            raise ValueError("sensitivities and probs must have equal length; probs sum to 1")
        dropped = 0.0
    else:
        support, pr, dropped = poisson_binomial_pmf(
            rates if rates is not None else [], tail_mass
        )
    if np.all(support[pr > 0] == 0):
        return BlowupResult(value=p, epsilon=0.0, dropped_mass=0.0)  # P = Q
    if sigma <= 0:
        return BlowupResult(value=1.0, epsilon=math.inf, dropped_mass=dropped)
    pld = _pld(sigma, support, pr, T, discretization)
    value, eps = _inf_over_eps(pld, p)
    return BlowupResult(value=min(1.0, value + T * dropped), epsilon=eps, dropped_mass=dropped)


# --------------------------------------------------------------------------------------------
# Calibration of sigma
# --------------------------------------------------------------------------------------------


def _rates_key(rates: np.ndarray) -> tuple[float, ...]:
    # Rates rounded UP to 1e-12 so secrets with (numerically) equal multisets share one
    # computation; rounding up can only raise the sampling rate, i.e. it is conservative.
    r = np.asarray(rates, dtype=np.float64)
    r = r[r > 0]
    return tuple(np.sort(np.minimum(np.ceil(r * 1e12) / 1e12, 1.0)).tolist())


def calibrate_one_sigma(
    p: float,
    r: float,
    rates: Sequence[float] | np.ndarray,
    T: int,
    *,
    rel_tol: float = 1e-3,
    discretization: float = DEFAULT_DISCRETIZATION,
    lower_hint: float | None = None,
) -> float:
    """Smallest sigma (to rel_tol, rounded up) with B_{P,Q}(p) <= r for one secret: see
    :func:`_calibrate_one_sigma`. A pure function of its arguments, so one process computes each
    distinct case once (a resumed or repeated run of the same data reuses it)."""
    rates = np.ascontiguousarray(rates, dtype=np.float64)
    return _calibrate_cached(float(p), float(r), rates.tobytes(), int(T), float(rel_tol),
                             float(discretization), lower_hint)


@functools.lru_cache(maxsize=256)
def _calibrate_cached(p: float, r: float, rates: bytes, T: int, rel_tol: float,
                      discretization: float, lower_hint: float | None) -> float:
    return _calibrate_one_sigma(p, r, np.frombuffer(rates, dtype=np.float64), T,
                                rel_tol=rel_tol, discretization=discretization,
                                lower_hint=lower_hint)


def _narrow(gap: Callable[[float], float], lo: float, g_lo: float, hi: float, g_hi: float,
            ratio: float) -> tuple[float, float]:
    """Shrink a bracket with gap(lo) > 0 >= gap(hi) until hi / lo <= ratio; returns (lo, hi).

    ``gap`` is close to linear in 1 / sigma (a Gaussian pair's mu is sensitivity / sigma), so
    each probe is the false-position estimate in 1 / sigma, placed half the tolerance past it,
    alternately above and below, so that both ends close in: with a good estimate two probes end
    the search. An estimate at an end of the bracket, or two probes that did not halve it, fall
    back to bisection in log sigma."""
    half = math.log(ratio) / 2.0
    probes, pair_start, bisect = 0, math.log(hi / lo), False
    while hi / lo > ratio * (1.0 + 1e-12):
        a, b = math.log(lo), math.log(hi)
        u = 1.0 / hi + g_hi * (1.0 / hi - 1.0 / lo) / (g_lo - g_hi)  # root of the chord in 1/s
        x = -math.log(u) + (half if probes % 2 == 0 else -half)
        if bisect or not a + 0.02 * (b - a) <= x <= b - 0.02 * (b - a):
            x = 0.5 * (a + b)
        mid = math.exp(x)
        g_mid = gap(mid)
        if g_mid <= 0:
            hi, g_hi = mid, g_mid
        else:
            lo, g_lo = mid, g_mid
        probes += 1
        if probes % 2 == 0:
            width = math.log(hi / lo)
            bisect, pair_start = width > 0.5 * pair_start, width
    return lo, hi


def _gap(p: float, rates: np.ndarray, T: int, isf_r: float,
         disc: float) -> Callable[[float], float]:
    """mu_eff(sigma) - eta at discretisation ``disc``: <= 0 exactly where B(sigma) <= r
    (``isf_r``: Phi^-1(1 - r))."""
    def gap(sigma: float) -> float:
        value = blowup(p, rates, sigma, T, discretization=disc).value
        return isf_r - float(norm.isf(min(value, 1.0 - 1e-15)))
    return gap


def _passing(gap: Callable[[float], float], hi: float) -> tuple[float, float]:
    """(sigma, gap(sigma)) for the first of hi, 2 hi, 4 hi, ... that meets the bound."""
    g_hi = gap(hi)
    while g_hi > 0:
        hi *= 2.0
        if hi > 1e12:
            raise RuntimeError("sigma calibration diverged")
        g_hi = gap(hi)
    return hi, g_hi


def _calibrate_one_sigma(
    p: float,
    r: float,
    rates: np.ndarray,
    T: int,
    *,
    rel_tol: float,
    discretization: float,
    lower_hint: float | None,
) -> float:
    """Smallest sigma (to rel_tol, rounded up) with B_{P,Q}(p) <= r for one secret.

    The search runs on gap(sigma) = mu_eff(sigma) - eta, where mu_eff = Phi^-1(1 - p) -
    Phi^-1(1 - B(sigma)) is the Gaussian-DP mu that would give the same blow-up (Lemma 3.3):
    exactly sensitivity / sigma for a Gaussian pair, nearly so for the mixture. Start: the
    (truncated) pair is dominated, by joint convexity of H, by the Gaussian pair with sensitivity
    K = largest kept value of S, which meets the bound at sigma = K sqrt(T) / eta; from there
    mu_eff ~ 1 / sigma puts the first estimate near the root. A search at a coarse
    discretisation (1e-2; pessimistic, so still an upper bound) narrows the bracket to rel_tol
    (:func:`_narrow`), then two probes at ``discretization`` usually confirm it; the returned
    sigma is always one that was verified at ``discretization``.
    """
    rates = np.asarray(rates, dtype=np.float64)
    eta = float(r_to_mu(p, r))
    if math.isinf(eta) or not np.any(rates > 0):
        return 0.0
    support, _, _ = poisson_binomial_pmf(rates)
    ratio = 1.0 + rel_tol
    isf_r = float(norm.isf(r))

    def gap_at(disc: float) -> Callable[[float], float]:
        return _gap(p, rates, T, isf_r, disc)

    coarse = gap_at(max(discretization, 1e-2))
    hi, g_hi = _passing(coarse, max(float(support[-1]), 1.0) * math.sqrt(T) / eta * 1.05)
    # Below the root: the hint (a sigma already known to fall short), else the estimate
    # hi * mu_eff(hi) / eta a step lower; every probe that still passes lowers hi.
    lo = lower_hint if lower_hint is not None and lower_hint < hi else None
    while True:
        if lo is None:
            # g_hi + eta = mu_eff(hi) >= 0; the floor keeps lo > 0 should it round to 0
            lo = max(min(hi * (g_hi + eta) / eta / math.sqrt(ratio), hi / ratio), hi * 1e-6)
        g_lo = coarse(lo)
        if g_lo > 0:
            break
        hi, g_hi, lo = lo, g_lo, None
        if hi < 1e-9:
            return _verified(gap_at(discretization), hi, ratio)  # (next to) no noise needed
    lo, hi = _narrow(coarse, lo, g_lo, hi, g_hi, ratio)
    if discretization >= 1e-2:
        return hi
    return _verified(gap_at(discretization), hi, ratio)


def _verified(fine: Callable[[float], float], hi: float, ratio: float) -> float:
    """The fine phase: ``hi`` passed at the coarse grid; confirm it, and that hi / ratio fails,
    at the fine one (its bound is tighter, so its root is a hair lower: two probes)."""
    g_hi = fine(hi)
    while g_hi > 0:
        hi *= 1.03
        g_hi = fine(hi)
    lo = hi / ratio
    g_lo = fine(lo)
    while g_lo <= 0:
        hi, g_hi, lo = lo, g_lo, lo / 1.03
        if lo < 1e-9:
            return hi
        g_lo = fine(lo)
    return _narrow(fine, lo, g_lo, hi, g_hi, ratio)[1]


def calibrate_secret_sigma(
    p: np.ndarray | float,
    r: np.ndarray | float,
    rates_per_secret: list[np.ndarray],
    T: int,
    *,
    exact_per_secret: bool = False,
    rel_tol: float = 1e-3,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> tuple[float, np.ndarray]:
    """sigma = max_j sigma_j, sigma_j the smallest sigma with B_j(p_j) <= r_j (SecretNoise).

    Secrets with the same (p, r, rate multiset) share one computation. With
    exact_per_secret=False (default, fast) secrets are visited hardest-first (largest expected
    sensitivity / eta); a secret already satisfied at the running maximum is only checked, and its
    entry in the returned array is that running maximum (an upper bound on sigma_j, flagged by
    being >= its exact value). With exact_per_secret=True every sigma_j is bisected.
    Returns (sigma, sigma_j per secret). sigma = 0 when no secret needs protection.
    """
    n_sec = len(rates_per_secret)
    p_a = np.broadcast_to(np.asarray(p, dtype=np.float64), (n_sec,))
    r_a = np.broadcast_to(np.asarray(r, dtype=np.float64), (n_sec,))
    eta = np.atleast_1d(r_to_mu(p_a, r_a)) if n_sec else np.zeros(0)
    groups: dict[tuple, list[int]] = {}
    for j in range(n_sec):
        key = (float(p_a[j]), float(r_a[j]), _rates_key(rates_per_secret[j]))
        groups.setdefault(key, []).append(j)

    def hardness(key: tuple) -> float:
        e = float(r_to_mu(key[0], key[1]))
        return 0.0 if math.isinf(e) else sum(key[2]) / e + len(key[2]) * 1e-9

    out = np.zeros(n_sec)
    sigma = 0.0
    verified: list[tuple[float, float, np.ndarray]] = []  # satisfied at the running sigma
    for key in sorted(groups, key=hardness, reverse=True):
        pj, rj, rates = key
        rates_a = np.asarray(rates)
        desc = np.sort(rates_a)[::-1]
        if math.isinf(eta[groups[key][0]]) or rates_a.size == 0:
            s = 0.0
        elif not exact_per_secret and sigma > 0 and any(
            pj <= pv and rj >= rv and _dominated(desc, dv) for pv, rv, dv in verified
        ):
            s = sigma  # dominated by a secret already satisfied at sigma (see _dominated)
        elif exact_per_secret or sigma == 0.0:
            s = calibrate_one_sigma(pj, rj, rates_a, T, rel_tol=rel_tol,
                                    discretization=discretization)
        elif blowup(pj, rates_a, sigma, T, discretization=discretization).value <= rj:
            s = sigma  # upper bound; exact value not needed for the release
        else:
            s = calibrate_one_sigma(pj, rj, rates_a, T, rel_tol=rel_tol,
                                    discretization=discretization, lower_hint=sigma)
        out[groups[key]] = s
        sigma = max(sigma, s)
        if s > 0 and len(verified) < 64:
            verified.append((pj, rj, desc))
    return sigma, out


def _dominated(a_desc: np.ndarray, b_desc: np.ndarray) -> bool:
    """Whether rate multiset a is dominated by b (both sorted descending): |a| <= |b| and
    a_i <= b_i. Then the pair for a is dominated by the pair for b in every hockey-stick
    divergence, both directions, hence after T-fold composition too: raising one rate q -> q'
    writes P_q = (q/q') P_q' + (1 - q/q') A (A = without that record), H is convex, and
    H(A||Q) <= H(P_q'||Q) because the optimal event is a half-line (likelihood ratio monotone in
    x) and P_q' is A shifted stochastically upwards (same argument for H(Q||.)). Blow-up is also
    increasing in p and decreasing in sigma, so B_a(p_a) <= B_b(p_b) <= r_b <= r_a."""
    return a_desc.size <= b_desc.size and bool(np.all(a_desc <= b_desc[: a_desc.size]))


@dataclass(frozen=True)
class SecretNoisePlan:
    """Everything the SecPE mechanism needs from the SecretNoise calibration (no secret values).

    sigma is for a unit-sensitivity release per sampled record (see
    dpsynth.methods.secpe.representatives.JOINT_SENSITIVITY for releasing centres and counts
    together).
    """

    sigma: float
    rates: np.ndarray  # rho_i per private record (rows of the membership matrix)
    weights: np.ndarray  # LP weights w_i
    eta: np.ndarray  # per-secret GDP budget
    sigma_per_secret: np.ndarray
    p: np.ndarray
    r: np.ndarray
    T: int


def plan_secret_noise(
    membership: sp.spmatrix,
    p: float | np.ndarray,
    r: float | np.ndarray,
    T: int,
    *,
    rule: str = "paper",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> SecretNoisePlan:
    """LP weights -> sampling rates -> per-secret calibration -> sigma (SecretNoise, s.3.2).

    ``membership`` is [private records x secrets]; p and r are scalars or per-secret arrays.
    """
    m = sp.csr_matrix(membership)
    n_sec = m.shape[1]
    p_a = np.broadcast_to(np.asarray(p, dtype=np.float64), (n_sec,)).copy()
    r_a = np.broadcast_to(np.asarray(r, dtype=np.float64), (n_sec,)).copy()
    eta = np.atleast_1d(r_to_mu(p_a, r_a)) if n_sec else np.zeros(0)
    w = secret_weights_lp(m, eta)
    rho = sampling_rates(w, rule=rule)
    sigma, per = calibrate_secret_sigma(
        p_a, r_a, rates_per_secret(m, rho), T, discretization=discretization
    )
    return SecretNoisePlan(sigma=sigma, rates=rho, weights=w, eta=eta, sigma_per_secret=per,
                           p=p_a, r=r_a, T=T)


def plan_from_hits(
    parts: Sequence[Sequence[dict]],
    specs: Sequence[object],
    n_records: int,
    p: float,
    r: float,
    T: int,
    *,
    discretization: float = DEFAULT_DISCRETIZATION,
) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, object]]:
    """SecretNoise over a sharded secret scan: merges the shards' hits (``parts``, from
    ``methods.secpe.kernels.secret_hits``) into the private membership and runs
    :func:`plan_secret_noise` (r >= 1: no protection asked, every private record sampled).

    Returns ((private rows, their rates): for the shards only; a summary: ``sigma_star``
    (per unit shift), ``max_rate`` and the distinct secrets per type, for the driver). With
    ``compute.engine: ray`` this runs in a Ray task (docs/architecture.md)."""
    from ...secrets import merge_secret_hits, secret_index_from_hits

    index = secret_index_from_hits(merge_secret_hits(parts, len(specs)), specs, n_records)
    private = index.split()[0].astype(np.int64)
    sigma = 0.0
    if index.no_secrets:
        rates = np.zeros(0)
    elif r < 1.0:
        noise = plan_secret_noise(index.private_membership(), p, r, T,
                                  discretization=discretization)
        rates, sigma = np.asarray(noise.rates, dtype=np.float64), float(noise.sigma)
    else:
        rates = np.ones(len(private))  # r = 1: no protection asked
    per_type: dict[str, int] = {}
    for t in index.types:
        per_type[t] = per_type.get(t, 0) + 1
    summary: dict[str, object] = {
        "sigma_star": sigma, "max_rate": float(rates.max()) if len(rates) else 1.0,
        "secrets_per_type": dict(sorted(per_type.items()))}
    return (private, rates), summary
