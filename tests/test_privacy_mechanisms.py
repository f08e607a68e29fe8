"""Each mechanism draws from the distribution its privacy proof assumes (both noise modes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from chisquare import chi2_p, dgauss_chi2_p
from dpsynth.privacy import (
    Accountant,
    ExponentialEvent,
    PrivacyConfigError,
    PrivacySession,
    ZCDPEvent,
    make_noise_source,
    run_seed,
    threshold_log_weights,
)
from dpsynth.privacy.mechanisms import gumbel_argmax as _gumbel_argmax
from dpsynth.privacy.mechanisms import sample_threshold

MODES = ["seeded", "secure"]
ALPHA = 1e-4  # false-alarm rate of each statistical test (secure mode is not reproducible)


def _session(tmp_path: Path, mode: str) -> PrivacySession:
    return PrivacySession(tmp_path / "store", Accountant("pld"), make_noise_source(mode, 7))


# ------------------------------------------------------------------ noise sources


@pytest.mark.parametrize("mode", MODES)
def test_noise_source_distributions(mode: str) -> None:
    src = make_noise_source(mode, 3)
    assert src.mode == mode
    z = src.normal(40_000, scale=2.5)
    assert z.shape == (40_000,)
    assert stats.kstest(z / 2.5, "norm").pvalue > ALPHA
    assert stats.kstest(z / 2.5 / 1.1, "norm").pvalue < 1e-9  # the test has power
    u = src.uniform((200, 100))
    assert u.shape == (200, 100) and u.min() >= 0 and u.max() < 1
    assert stats.kstest(u.ravel(), "uniform").pvalue > ALPHA
    g = src.gumbel(40_000)
    assert stats.kstest(g, "gumbel_r").pvalue > ALPHA
    probs = np.array([0.5, 0.0, 0.2, 0.3])
    counts = np.bincount([src.choice(probs) for _ in range(6000)], minlength=4)
    assert counts[1] == 0
    assert chi2_p(counts[[0, 2, 3]], probs[[0, 2, 3]]) > ALPHA


def test_seeded_is_reproducible_and_secure_is_not() -> None:
    a, b = make_noise_source("seeded", 11), make_noise_source("seeded", 11)
    assert np.array_equal(a.normal(5), b.normal(5))
    # per-key streams: same key -> same noise, different keys -> different noise
    assert np.array_equal(a.spawn("k").normal(4), b.spawn("k").normal(4))
    assert not np.array_equal(a.spawn("k").normal(4), a.spawn("j").normal(4))
    s1, s2 = make_noise_source("secure", 11), make_noise_source("secure", 11)
    assert not np.array_equal(s1.normal(5), s2.normal(5))
    with pytest.raises(ValueError, match="noise mode"):
        make_noise_source("fast")


# ------------------------------------------------------------------ Gaussian / counts


@pytest.mark.parametrize("mode", MODES)
def test_gaussian_release_noise_scale(tmp_path: Path, mode: str) -> None:
    """A real value is rounded onto the 2^-32 grid and gets discrete Gaussian noise there
    (indistinguishable from N(0, sigma^2) at this scale); counts get integer noise with the
    discrete Gaussian's pmf."""
    sess = _session(tmp_path, mode)
    value = np.linspace(-50, 50, 20_000).reshape(100, 200)
    noisy = sess.gaussian("g", value, sensitivity=2.0, sigma=3.0)
    assert noisy.shape == value.shape
    resid = (noisy - value).ravel()
    assert stats.kstest(resid / 3.0, "norm").pvalue > ALPHA
    assert stats.kstest(resid / 3.3, "norm").pvalue < 1e-6
    assert np.array_equal(noisy * 2.0**32, np.rint(noisy * 2.0**32))  # on the public grid
    counts = np.arange(5000, dtype=float)
    nc = sess.noisy_counts("labels", counts, sigma=4.0)
    z = (nc - counts).astype(np.int64)
    assert np.array_equal(nc - counts, z)  # integer noise
    assert dgauss_chi2_p(z, 16.0) > ALPHA
    rows = {r["name"]: r for r in sess.accountant.summary()}
    # rounding to the grid adds grid * sqrt(d) to the sensitivity and sigma alike
    wider = 2.0 + 2.0**-32 * np.sqrt(value.size)
    assert rows["gaussian"]["sensitivity"] == wider
    assert rows["gaussian"]["sigma"] == pytest.approx(3.0 * wider / 2.0, rel=1e-15)
    assert rows["gaussian"]["mechanism"] == "discrete_gaussian"
    assert rows["noisy_counts"]["sensitivity"] == 1.0 and rows["noisy_counts"]["shifts"] == (1,)


def test_gaussian_rejects_non_finite(tmp_path: Path) -> None:
    sess = _session(tmp_path, "seeded")
    with pytest.raises(PrivacyConfigError, match="value contains non-finite"):
        sess.gaussian("bad", np.array([1.0, np.nan]), 1.0, 1.0)
    with pytest.raises(PrivacyConfigError, match="sigma"):
        sess.gaussian("bad", np.array([1.0]), 1.0, 0.0)
    assert not sess.has("bad") and sess.accountant.events == []


# ------------------------------------------------------------------ exponential mechanism


@pytest.mark.parametrize("mode", MODES)
def test_exponential_sampler_frequencies(mode: str) -> None:
    src = make_noise_source(mode, 5)
    u = np.array([0.0, 1.0, 2.0, 3.0, -1.0, 2.5])
    eps, sens = 1.2, 1.5
    logits = eps * u / (2 * sens)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    draws = [_gumbel_argmax(src, logits) for _ in range(20_000)]
    counts = np.bincount(draws, minlength=u.size)
    assert chi2_p(counts, probs) > ALPHA
    # power: the frequencies are NOT those of twice the epsilon
    wrong = np.exp(2 * logits - 2 * logits.max())
    wrong /= wrong.sum()
    assert chi2_p(counts, wrong) < 1e-6


@pytest.mark.parametrize("mode", MODES)
def test_exponential_release_through_session(tmp_path: Path, mode: str) -> None:
    sess = _session(tmp_path, mode)
    u = np.array([0.0, 2.0, 4.0, -np.inf])
    probs = np.exp(np.array([0.0, 2.0, 4.0]) * 1.0 / 2)
    probs /= probs.sum()
    picks = [sess.exponential(f"e{i}", u, 1.0, 1.0) for i in range(300)]
    counts = np.bincount(picks, minlength=4)
    assert counts[3] == 0  # excluded candidate
    assert chi2_p(counts[:3], probs) > ALPHA
    assert sess.accountant.summary()[0]["count"] == 300
    assert sess.accountant.summary()[0]["epsilon"] == 1.0


def test_threshold_grid_utilities() -> None:
    values = np.array([0.1, 0.5, 0.5, 0.9])
    cands = np.array([0.0, 0.4, 0.6, 1.0])
    logw, pts = threshold_log_weights(values, 2, cands, 2.0, "grid")
    # #{v > theta} = 4, 3, 1, 0 -> utility -2, -1, -1, -2 -> log weight eps * u / 2
    assert np.allclose(logw, [-2.0, -1.0, -1.0, -2.0])
    assert np.array_equal(pts, cands)


@pytest.mark.parametrize("mode", MODES)
def test_threshold_interval_mechanism(tmp_path: Path, mode: str) -> None:
    values = np.array([0.2, 0.3, 0.3, 0.7, 1.5])  # 1.5 is clipped to the public range
    logw, pts = threshold_log_weights(values, 2, np.array([0.0, 1.0]), 1.0, "interval")
    assert np.allclose(pts, [0.0, 0.2, 0.3, 0.3, 0.7, 1.0, 1.0])
    # intervals [0,.2) [.2,.3) [.3,.3) [.3,.7) [.7,1) [1,1): counts above 5,4,3,2,1,0
    lengths = np.diff(pts)
    util = -np.abs(np.array([5, 4, 3, 2, 1, 0]) - 2)
    with np.errstate(divide="ignore"):
        assert np.allclose(logw, np.log(lengths) + util / 2.0)
    probs = lengths * np.exp(util / 2.0)
    probs /= probs.sum()
    src = make_noise_source(mode, 9)
    thetas = np.array([sample_threshold(src, logw, pts, "interval") for _ in range(8000)])
    assert thetas.min() >= 0.0 and thetas.max() <= 1.0
    idx = np.searchsorted(pts[1:], thetas, side="right")
    counts = np.bincount(idx, minlength=6)
    assert counts[2] == 0 and counts[5] == 0  # zero-length intervals are never chosen
    assert chi2_p(counts, probs) > ALPHA
    # uniform inside the chosen interval [0.3, 0.7)
    inside = thetas[(thetas >= 0.3) & (thetas < 0.7)]
    assert stats.kstest((inside - 0.3) / 0.4, "uniform").pvalue > ALPHA
    # through the session: same mechanism, accounted as eps-DP
    sess = _session(tmp_path, mode)
    got = [
        sess.exponential_threshold(f"t{i}", values, 2, np.array([0.0, 1.0]), 1.0, mode="interval")
        for i in range(150)
    ]
    sidx = np.bincount(np.searchsorted(pts[1:], got, side="right"), minlength=6)
    assert chi2_p(sidx, probs) > ALPHA
    assert sess.accountant.summary()[0]["epsilon"] == 1.0
    assert sess.accountant.summary()[0]["count"] == 150
    grid = sess.exponential_threshold("grid", values, 2, np.array([0.25, 0.5]), 1.0)
    assert grid in (0.25, 0.5)
    with pytest.raises(PrivacyConfigError, match="mode"):
        sess.exponential_threshold("x", values, 2, np.array([0.0, 1.0]), 1.0, mode="dense")


# ------------------------------------------------------------------ private prediction


@pytest.mark.parametrize("mode", MODES)
def test_private_token_full_softmax(tmp_path: Path, mode: str) -> None:
    sess = _session(tmp_path, mode)
    z = np.array([0.5, 0.2, -0.3, 0.0, 0.45, -1.0, 0.1, 0.3])
    tau = 0.25
    probs = np.exp(z / tau - (z / tau).max())
    probs /= probs.sum()
    src = make_noise_source(mode, 2)
    counts = np.bincount([_gumbel_argmax(src, z / tau) for _ in range(20_000)], minlength=z.size)
    # every token has positive probability: a top-k truncation would zero the tail
    assert counts.min() > 0
    assert chi2_p(counts, probs) > ALPHA
    toks = [sess.private_token(f"tok{i}", z, clip=0.1, temperature=tau) for i in range(200)]
    assert chi2_p(np.bincount(toks, minlength=z.size), probs) > ALPHA
    ev = sess.accountant.events[0]
    assert isinstance(ev, ZCDPEvent) and ev.rho == pytest.approx(0.5 * (0.1 / 0.25) ** 2)
    assert sess.accountant.summary()[0]["count"] == 200
    assert sess.accountant.summary()[0]["name"] == "private_prediction"


def test_record_and_statement(tmp_path: Path) -> None:
    sess = PrivacySession(
        tmp_path / "s", Accountant("pld"), make_noise_source("secure"), target=(5.0, 1e-5)
    )
    out = sess.record("fed/round0", [ExponentialEvent(0.5, name="fed")], np.arange(3.0))
    assert np.array_equal(out, np.arange(3.0))
    assert np.array_equal(sess.get("fed/round0"), np.arange(3.0))
    st = sess.statement("record", (5.0, 1e-5))
    assert set(st) >= {
        "epsilon",
        "delta",
        "target_epsilon",
        "target_delta",
        "unit",
        "accountant",
        "noise",
        "mechanisms",
    }
    assert st["noise"] == "secure" and st["unit"] == "record" and st["accountant"] == "pld"
    assert st["epsilon"] == pytest.approx(0.5, abs=1e-3) and st["delta"] == 1e-5
    assert st["mechanisms"][0]["name"] == "fed"
    with pytest.raises(PrivacyConfigError, match="unit"):
        sess.statement("household", (5.0, 1e-5))


# ------------------------------------------------------------------ defaults and the run seed


def test_noise_is_secure_by_default() -> None:
    from dpsynth.config import PrivacyConfig

    assert make_noise_source().mode == "secure"
    cfg = PrivacyConfig()
    assert cfg.noise == "secure" and cfg.seed is None
    a, b = make_noise_source("seeded"), make_noise_source("seeded")  # no seed: fresh entropy
    assert not np.array_equal(a.normal(8), b.normal(8))


def test_run_seed_is_drawn_once_kept_private_and_reused(tmp_path: Path) -> None:
    private = tmp_path / "private"
    s1 = run_seed(private)
    assert s1 == run_seed(private) == run_seed(private, s1)  # resume: the same seed
    assert (private / "seed").stat().st_mode & 0o777 == 0o600
    assert run_seed(tmp_path / "other") != s1  # 128 random bits per run
    with pytest.raises(ValueError, match="resumed run must keep its seed"):
        run_seed(private, s1 + 1)
    assert run_seed(tmp_path / "given", 42) == 42 == run_seed(tmp_path / "given")
