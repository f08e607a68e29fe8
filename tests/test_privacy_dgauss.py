"""The exact discrete Gaussian (issue 28, docs/methods.md §0): the sampler's distribution, its
lattice outputs, its accounting, the store format and the distributed pieces."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from chisquare import cell_groups, dgauss_chi2_p, grouped
from dpsynth.privacy import (
    Accountant,
    DiscreteGaussianEvent,
    DistributedDiscreteGaussianEvent,
    GaussianEvent,
    Lattice,
    PrivacyConfigError,
    PrivacySession,
    ddgauss_rdp,
    ddgauss_rho,
    ddgauss_tau,
    dgauss,
    discrete_gaussian_mechanism,
    gaussian_mechanism,
    make_noise_source,
    party_share,
    share_sigma,
    sum_shares,
    zcdp_to_eps_cks,
)
from dpsynth.privacy.lattice import (
    FIXED_POINT_GRID,
    lattice_points,
    rounded_sensitivity,
    rounding_tv_bound,
)
from dpsynth.privacy.mechanisms import lattice_variance
from dpsynth.privacy.noise import SeededNoise

MODES = ["seeded", "secure"]
ALPHA = 1e-4  # false-alarm rate of each statistical test (secure mode is not reproducible)
N = 60_000


def _noise(mode: str, seed: int = 5):
    return make_noise_source(mode, seed if mode == "seeded" else None)


# ------------------------------------------------------------------ the sampler


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sigma", [0.3, 0.7, 1.0, 3.5, 25.0, 1500.0])
def test_sampler_matches_the_exact_pmf(mode: str, sigma: float) -> None:
    x = dgauss.sample(_noise(mode), sigma**2, N)
    assert x.dtype == np.int64 and x.shape == (N,)
    assert dgauss_chi2_p(x, sigma**2) > ALPHA
    # the test has power: 6 % more spread is rejected
    assert dgauss_chi2_p(x, (1.06 * sigma) ** 2) < 1e-3 or sigma < 0.5


def test_sampler_at_tiny_and_huge_sigma() -> None:
    # sigma = 1/4: P(x != 0) = 2 e^-8 / Z, so almost all draws are 0, none beyond +-2
    x = dgauss.sample(_noise("seeded"), Fraction(1, 16), N)
    assert 0 < np.count_nonzero(x) < 100 and np.abs(x).max() <= 2
    # sigma = 2^30 (a real release on the 2^-32 grid): the continuous limit, exactly centred
    s = 2.0**30
    y = dgauss.sample(_noise("secure"), s * s, N).astype(np.float64) / s
    assert stats.kstest(y, "norm").pvalue > ALPHA
    assert stats.kstest(y / 1.06, "norm").pvalue < 1e-6
    assert dgauss.sample(_noise("seeded"), 4.0, 0).shape == (0,)
    with pytest.raises(ValueError, match="outside"):
        dgauss.sample(_noise("seeded"), 1e-4, 3)
    with pytest.raises(ValueError, match="outside"):
        dgauss.sample(_noise("seeded"), 2.0**90, 3)


def test_sampler_matches_opendp() -> None:
    """Two-sample chi-square: our draws against OpenDP's exact discrete Gaussian (its integer
    make_gaussian, Rust, OS randomness)."""
    dp = pytest.importorskip("opendp.prelude")
    dp.enable_features("contrib")
    for sigma in (0.7, 3.5):
        meas = dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)),
                                  dp.l2_distance(T=int), scale=sigma)
        theirs = np.asarray(meas([0] * 40_000), dtype=np.int64)
        ours = dgauss.sample(_noise("secure"), sigma**2, 40_000)
        lo = min(theirs.min(), ours.min())
        a = np.bincount(theirs - lo)
        b = np.bincount(ours - lo, minlength=a.size)
        a = np.pad(a, (0, b.size - a.size))
        groups = cell_groups(a + b, 10)
        table = np.vstack([grouped(a, groups), grouped(b, groups)])
        assert stats.chi2_contingency(table).pvalue > ALPHA, sigma
        # and the map OpenDP states for the integer release is our rho
        assert meas.map(1) == pytest.approx(0.5 / sigma**2)


def test_variance_is_never_below_the_request() -> None:
    for q in [Fraction(1, 256), Fraction(1, 16), 0.09, 1.0, 2.0, 12.25, 1e3**2,
              Fraction(10**25, 3), (2.0**40) ** 2, Fraction(11.797307)**2]:
        p = dgauss.variance_params(q)
        qq = dgauss.as_fraction(q)
        assert p.variance >= qq
        assert (p.variance - qq) / qq <= Fraction(1, 2**dgauss.PRECISION_BITS)
        assert p.t == math.isqrt(qq.numerator // qq.denominator) + 1
        assert p.b & (p.b - 1) == 0  # a power of two
    assert dgauss.variance_params(Fraction(1, 4)).variance == Fraction(1, 4)  # exact when it can
    # the mechanism asks for at least (sigma / grid)^2 (1 + 2^-44): covers float grids 1/sqrt(k)
    g = 1.0 / math.sqrt(3.0)
    assert lattice_variance(2.0, g) >= Fraction(4) * 3


def test_seeded_draws_are_reproducible_per_key_and_secure_ones_are_not() -> None:
    a, b = make_noise_source("seeded", 9), make_noise_source("seeded", 9)
    assert np.array_equal(dgauss.sample(a.spawn("k"), 9.0, 500),
                          dgauss.sample(b.spawn("k"), 9.0, 500))
    assert not np.array_equal(dgauss.sample(a.spawn("k"), 9.0, 500),
                              dgauss.sample(a.spawn("j"), 9.0, 500))
    s = make_noise_source("secure")
    assert not np.array_equal(dgauss.sample(s, 9.0, 500), dgauss.sample(s, 9.0, 500))


@pytest.mark.parametrize("mode", MODES)
def test_uniform_integers_are_uniform(mode: str) -> None:
    src = _noise(mode, 3)
    x = src.integers(np.full(70_000, 7, np.int64))
    assert x.min() >= 0 and x.max() <= 6
    assert stats.chisquare(np.bincount(x, minlength=7)).pvalue > ALPHA
    big = np.int64(3 * 2**60 + 1)  # a bound far from a power of two: rejection matters
    y = src.integers(np.full(50_000, big, np.int64)).astype(np.float64) / float(big)
    assert y.min() >= 0 and y.max() < 1 and stats.kstest(y, "uniform").pvalue > ALPHA
    with pytest.raises(ValueError, match="high"):
        src.integers(np.array([0]))


@pytest.mark.parametrize("high", [1, 2, 7, 2**32, 2**32 + 1, 3 * 2**60 + 1])
def test_seeded_integers_with_one_bound_are_numpys_per_entry_draws(high: int) -> None:
    """The seeded source's one-bound fast path draws what numpy's per-entry path draws, and
    leaves the stream where that path leaves it (a seeded run's noise is unchanged by it)."""
    fast = SeededNoise(11)
    reference = np.random.Generator(np.random.PCG64(np.random.SeedSequence(11)))
    got = fast.integers(np.full((40, 25), high, np.int64))
    want = reference.integers(0, np.full((40, 25), high, np.int64), dtype=np.int64)
    assert got.shape == (40, 25) and got.dtype == np.int64
    np.testing.assert_array_equal(got, want)
    mixed = np.array([high, high + 1, 5], np.int64)  # then the per-entry path, same stream
    np.testing.assert_array_equal(fast.integers(mixed),
                                  reference.integers(0, mixed, dtype=np.int64))


def test_overflow_is_refused_not_biased() -> None:
    p = dgauss.variance_params(2.0**80)
    with pytest.raises(dgauss.SamplerOverflow):
        dgauss._accept(_noise("seeded"), np.array([p.t * 5000], dtype=np.int64), p)


# ------------------------------------------------------------------ lattices, no float gap


@pytest.mark.parametrize("mode", MODES)
def test_outputs_of_neighbours_lie_on_one_lattice(mode: str) -> None:
    """Mironov 2012: a float sampler's set of outputs around f(D) differs from the set around
    f(D'). Here every output is grid * integer for both, and the noise is the same
    integer-valued law, so the two output sets are the same lattice."""
    noise = _noise(mode, 1)
    for lattice, f_d, f_d2 in [(Lattice.counts(), 40.0, 41.0),
                               (Lattice(2.0**-7), 3.0, 3.0 + 2.0**-7),
                               (Lattice.fixed_point(), 0.25, 0.25 + 2.0**-32)]:
        g = float(lattice.grid)
        a = discrete_gaussian_mechanism(np.full(20_000, f_d), 3.0 * g * 50, lattice, noise)
        b = discrete_gaussian_mechanism(np.full(20_000, f_d2), 3.0 * g * 50, lattice, noise)
        for out, f in ((a, f_d), (b, f_d2)):
            steps = out / g
            assert np.array_equal(steps, np.rint(steps))  # on the lattice
            z = steps - f / g
            assert np.array_equal(z, np.rint(z))  # integer noise steps
        assert dgauss_chi2_p(np.rint(a / g - f_d / g).astype(np.int64), 150.0**2) > ALPHA
        assert dgauss_chi2_p(np.rint(b / g - f_d2 / g).astype(np.int64), 150.0**2) > ALPHA
    # a rounded (real) release: values closer than half a grid step give the same outputs
    rnd = Lattice.rounded(1.0)
    x = discrete_gaussian_mechanism(np.array([0.1]), 1.0, rnd, make_noise_source("seeded", 4))
    y = discrete_gaussian_mechanism(np.array([0.1 + 2.0**-40]), 1.0, rnd,
                                    make_noise_source("seeded", 4))
    assert np.array_equal(x, y) and float(x[0] / FIXED_POINT_GRID).is_integer()
    # while the float sampler's outputs are not on any such grid
    c = gaussian_mechanism(np.zeros(1000), 1.0, make_noise_source("seeded", 4)) / FIXED_POINT_GRID
    assert not np.array_equal(c, np.rint(c))


def test_lattice_checks_name_the_release(tmp_path: Path) -> None:
    sess = PrivacySession(tmp_path / "s", Accountant("pld"), make_noise_source("seeded", 1))
    with pytest.raises(PrivacyConfigError, match="'votes' does not lie on its public grid"):
        sess.gaussian("votes", np.array([1.0, 2.5]), 1.0, 2.0, lattice=Lattice.counts())
    with pytest.raises(PrivacyConfigError, match="shift profile"):
        sess.gaussian("v", np.array([1.0]), 1.0, 2.0, lattice=Lattice.counts(4))
    with pytest.raises(PrivacyConfigError, match="too large"):
        sess.gaussian("v", np.array([2.0**60]), 1.0, 2.0, lattice=Lattice.counts())
    assert sess.keys() == []
    # 1 / sqrt(k) grids: counts times a float weight are recovered exactly
    w = 1.0 / np.sqrt(np.array([3.0, 3.0, 2.0]))
    assert np.array_equal(lattice_points(np.array([7.0, 0.0, 5.0]) * w, w, True), [7, 0, 5])


def test_rounding_adds_at_most_grid_sqrt_d() -> None:
    rng = np.random.default_rng(0)
    g, d = 2.0**-6, 50
    for _ in range(200):
        v = rng.normal(size=d)
        u = rng.normal(size=d)
        v2 = v + 0.7 * u / np.linalg.norm(u)
        rv, rv2 = g * np.rint(v / g), g * np.rint(v2 / g)
        assert np.linalg.norm(rv - rv2) <= rounded_sensitivity(0.7, g, d) + 1e-12


def test_tv_bound_of_the_rounded_release_holds() -> None:
    """docs/methods.md §3: TV(N_Z(0, s^2), round(N(0, s^2))) <= 0.0202/s^2 + ..., checked
    against the exact distance at small s, where it is largest."""
    for s in (1.0, 2.0, 4.0, 10.0):
        k = np.arange(-int(40 * s) - 5, int(40 * s) + 6)
        p = np.exp(dgauss.log_pmf(s * s, k))
        r = stats.norm.cdf((k + 0.5) / s) - stats.norm.cdf((k - 0.5) / s)
        tv = 0.5 * np.abs(p - r).sum()
        assert tv <= rounding_tv_bound(s, 1.0, 1) - 0.5 / (s * math.sqrt(2 * math.pi)) + 1e-12
        assert tv > 0.2 * (0.0202 / s**2)  # and the bound is not vacuous
    # a SecPE-sized release: d = 1000 x 384 + 1000 coordinates on the 2^-32 grid, sigma = 2
    assert rounding_tv_bound(2.0, FIXED_POINT_GRID, 385_000) < 1e-7


# ------------------------------------------------------------------ accounting


def test_discrete_events_charge_rho_in_every_kind() -> None:
    ev = DiscreteGaussianEvent(3.0, 1.5, count=4)
    rho = 4 * 1.5**2 / (2 * 9.0)
    z = Accountant("zcdp")
    z.add(ev)
    assert z.rho() == pytest.approx(rho)
    assert z.epsilon(1e-6) == pytest.approx(zcdp_to_eps_cks(rho, 1e-6))
    r, cont = Accountant("rdp"), Accountant("rdp")
    r.add(ev)
    cont.add(GaussianEvent(3.0, 1.5, count=4))  # the same RDP curve alpha rho
    assert r.epsilon(1e-6) == pytest.approx(cont.epsilon(1e-6), rel=1e-9)
    p = Accountant("pld")
    p.add(ev)  # no shift profile: no PLD, the run is reported by RDP
    assert p.epsilon(1e-6) == pytest.approx(r.epsilon(1e-6), rel=1e-12)
    with pytest.raises(PrivacyConfigError, match="continuous Gaussian"):
        Accountant("gdp").add(ev)
    with pytest.raises(PrivacyConfigError, match="exceed the sensitivity"):
        DiscreteGaussianEvent(3.0, 1.0, shifts=(1, 1))


def test_pld_of_a_shift_profile_is_dp_accountings_discrete_gaussian() -> None:
    sigma, delta = 15.0, 1e-5
    acc = Accountant("pld")
    acc.add(DiscreteGaussianEvent(sigma, 1.0, count=10, shifts=(1,)))
    ref = pld_lib.from_discrete_gaussian_mechanism(sigma, sensitivity=1,
                                                   value_discretization_interval=1e-4)
    assert acc.epsilon(delta) == pytest.approx(
        ref.self_compose(10).get_epsilon_for_delta(delta), rel=1e-9)
    cont = Accountant("pld")
    cont.add(GaussianEvent(sigma, 1.0, count=10))
    # docs/methods.md §0: 0.76898 discrete vs 0.76856 continuous (charging the continuous PLD
    # for discrete noise would understate epsilon)
    assert acc.epsilon(delta) == pytest.approx(0.76898, abs=2e-5)
    assert cont.epsilon(delta) == pytest.approx(0.76856, abs=2e-5)
    # a profile in lattice steps: a WASP-like record on grid 1/4 with shifts (4, 2, 1)
    grid = 0.25
    sens = grid * math.sqrt(21)
    two = Accountant("pld")
    two.add(DiscreteGaussianEvent(2.0, sens, shifts=(4, 2, 1), grid=grid))
    parts = [pld_lib.from_discrete_gaussian_mechanism(8.0, sensitivity=s,
                                                      value_discretization_interval=1e-4)
             for s in (1, 2, 4)]
    want = parts[0].compose(parts[1]).compose(parts[2]).get_epsilon_for_delta(delta)
    assert two.epsilon(delta) == pytest.approx(want, rel=1e-9)


def test_renyi_divergence_of_the_product_discrete_gaussian() -> None:
    """CKS 2020 Theorem 14, checked exactly: for a shift v in Z^d the Renyi divergence of the
    product discrete Gaussian is at most alpha ||v||^2 / (2 sigma^2), with equality at integer
    alpha (the normaliser is largest at integer centres)."""
    sigma = 0.8
    x = np.arange(-60, 61, dtype=np.float64)
    logp = dgauss.log_pmf(sigma**2, x)

    def renyi_1d(shift: int, alpha: float) -> float:
        logq = dgauss.log_pmf(sigma**2, x - shift)
        return float(np.logaddexp.reduce(alpha * logp + (1 - alpha) * logq)) / (alpha - 1)

    for alpha in (1.5, 2.0, 3.0, 7.5):
        d = renyi_1d(1, alpha) + renyi_1d(2, alpha)  # v = (1, 2), independent coordinates
        bound = alpha * 5 / (2 * sigma**2)
        assert d <= bound * (1 + 1e-9)
        if float(alpha).is_integer():
            assert d == pytest.approx(bound, rel=1e-9)


def test_distributed_discrete_gaussian_accounting() -> None:
    s, delta_l, parties, dim = 4.0, 3.0, 5, 200
    tau = ddgauss_tau(s, parties)
    assert tau == pytest.approx(10 * sum(math.exp(-2 * math.pi**2 * s**2 * k / (k + 1))
                                         for k in range(1, parties)))
    eps = delta_l / (math.sqrt(parties) * s)
    orders = np.array([2.0, 8.0, 64.0])
    want = np.minimum(orders * eps**2 / 2 + tau * dim,
                      orders / 2 * (eps + tau * math.sqrt(dim)) ** 2)
    assert np.allclose(ddgauss_rdp(orders, s, delta_l, parties, dim), want)
    assert ddgauss_rho(s, delta_l, parties, dim) == pytest.approx(
        0.5 * (eps + tau * math.sqrt(dim)) ** 2)
    # one party: tau = 0 and the charge is the discrete Gaussian's
    assert ddgauss_tau(s, 1) == 0.0
    ev = DistributedDiscreteGaussianEvent(sigma=2.0, sensitivity=1.5, parties=4, dimension=dim,
                                          grid=0.5)
    z = Accountant("zcdp")
    z.add(ev)
    assert z.rho() == pytest.approx(ddgauss_rho(4.0, 3.0, 4, dim))
    r = Accountant("rdp")
    r.add(ev)
    p = Accountant("pld")
    p.add(ev)
    assert p.epsilon(1e-5) == pytest.approx(r.epsilon(1e-5))  # no PLD: RDP
    assert ev == type(ev).from_dict(json.loads(json.dumps(ev.to_dict())))


@pytest.mark.parametrize("mode", MODES)
def test_party_shares_add_up_to_the_total_noise(mode: str) -> None:
    grid, sigma, parties = 0.5, 3.0, 4
    sp = share_sigma(sigma, parties)
    local = [np.full(30_000, 2.0 * p) for p in range(parties)]  # on the grid
    shares = [party_share(v, grid, sp, _noise(mode, 10 + i)) for i, v in enumerate(local)]
    assert all(s.dtype == np.int64 for s in shares)
    total = sum_shares(shares, grid)
    noise = total - sum(local)
    assert np.array_equal(noise / grid, np.rint(noise / grid))
    assert np.std(noise) == pytest.approx(sigma, rel=0.03)
    with pytest.raises(PrivacyConfigError, match="grid"):
        party_share(np.array([0.3]), grid, sp, _noise(mode))
    with pytest.raises(PrivacyConfigError, match="grid steps"):
        party_share(np.array([0.0]), 1.0, 0.5, _noise(mode))
    with pytest.raises(PrivacyConfigError, match="integer"):
        sum_shares([np.array([0.5])], grid)


# ------------------------------------------------------------------ the store


def test_store_records_its_format_and_refuses_old_float_draws(tmp_path: Path) -> None:
    store = tmp_path / "s"
    sess = PrivacySession(store, Accountant("pld"), make_noise_source("seeded", 1))
    v = sess.noisy_counts("labels", np.array([3.0, 4.0]), 2.0)
    sess.close()
    rec = json.loads((store / "releases.jsonl").read_text().splitlines()[0])
    assert rec["format"] == 2 and rec["events"][0]["type"] == "discrete_gaussian"
    again = PrivacySession(store, Accountant("pld"), make_noise_source("seeded", 1))
    assert np.array_equal(again.noisy_counts("labels", np.array([3.0, 4.0]), 2.0), v)
    again.close()
    old = tmp_path / "old"
    old.mkdir()
    line = {"key": "iter0/votes", "noise": "seeded", "time": "2026-01-01T00:00:00Z",
            "events": [GaussianEvent(2.0, 1.0).to_dict()],
            "value": {"kind": "array", "dtype": "float64", "shape": [2], "data": [0.1, 0.2]}}
    (old / "releases.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(PrivacyConfigError, match="before dpsynth drew discrete Gaussian"):
        PrivacySession(old, Accountant("pld"), make_noise_source("seeded", 1))


def test_user_level_vectors_are_exact_lattice_sums() -> None:
    """User-level votes and counts: each user's vector, scaled to norm <= 1, is truncated onto
    the 2^-32 grid before the sum, so the sum is an exact lattice statistic of sensitivity 1."""
    from dpsynth.label_domain import value_counts
    from dpsynth.voting import knn_vote, user_label_counts

    rng = np.random.default_rng(3)
    emb = rng.normal(size=(300, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    cand = rng.normal(size=(40, 8)).astype(np.float32)
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    labels, cand_labels = rng.integers(0, 2, 300), rng.integers(0, 2, 40)
    users = rng.integers(0, 25, 300)
    hist = knn_vote(emb, labels, cand, cand_labels, 3, users=users)
    counts = user_label_counts(labels, 2, users)
    _, vcounts = value_counts([str(v) for v in labels], [str(u) for u in users])
    for stat in (hist, counts, vcounts):
        steps = stat / FIXED_POINT_GRID
        assert np.array_equal(steps, np.rint(steps))
        lattice_points(stat, np.full(stat.shape, FIXED_POINT_GRID), True)  # accepted as exact
    one = knn_vote(emb[users == 0], labels[users == 0], cand, cand_labels, 3,
                   users=np.zeros(int((users == 0).sum()), dtype=np.int64))
    assert np.linalg.norm(one) <= 1.0  # truncation never grows the bounded vector


def test_secpe_discretisation_bound_is_recovered_from_its_releases(tmp_path: Path) -> None:
    """SecPE's statement adds the total variation of its rounded releases (docs/methods.md
    §3) to private diagnostics; the dimension comes back from the charged sensitivity."""
    from dpsynth.methods.secpe import discretisation_tv
    from dpsynth.methods.secpe.representatives import JOINT_SENSITIVITY

    sess = PrivacySession(tmp_path / "s", Accountant("pld"), make_noise_source("seeded", 2))
    d = 40 * 16 + 40
    for t in range(3):
        sess.gaussian(f"iter{t}/representatives", np.random.default_rng(t).normal(size=d),
                      JOINT_SENSITIVITY, 2.0, name="representatives", sampling_rate=0.3)
    ev = sess.store.events("iter0/representatives")[0]
    assert ev.grid == FIXED_POINT_GRID
    assert discretisation_tv(sess) == pytest.approx(
        3 * rounding_tv_bound(ev.sigma, FIXED_POINT_GRID, d), rel=1e-12)
