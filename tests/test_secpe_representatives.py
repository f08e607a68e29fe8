"""SecPE secret clustering and representative voting against brute-force numpy references.

The noise tests go through ``release_representatives``, the function SecPE's ``score`` calls,
with a real privacy session (stored, accounted release)."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.methods.secpe import representatives as rep
from dpsynth.methods.secpe.representatives import (
    JOINT_SENSITIVITY,
    PrivateAccumulation,
    RepresentativeGroup,
    RepresentativeNoise,
    accumulate_private,
    assign_private,
    nearest_count_vote,
    public_centres,
    release_representatives,
    representative_vote,
)
from dpsynth.privacy import Accountant, PrivacySession
from dpsynth.privacy.noise import SeededNoise


def _session(path, seed=5):
    return PrivacySession(path, Accountant("pld"), SeededNoise(seed))


def _zero_group(k, d, sizes, centres=None):
    acc = PrivateAccumulation(sums=np.zeros((k, d)), counts=np.zeros(k, dtype=np.int64),
                              n_seen=0, n_sampled=0)
    cent = np.zeros((k, d)) if centres is None else centres
    return RepresentativeGroup(cent, np.asarray(sizes, dtype=np.float64), acc)


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _chunks(x, size):
    return [x[s : s + size] for s in range(0, len(x), size)]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    d = 16
    public = _unit(rng, 600, d)
    private = _unit(rng, 500, d) * rng.uniform(0.5, 2.0, (500, 1)).astype(np.float32)
    cand = _unit(rng, 80, d)
    return public, private, cand


def _brute_force(centres, sizes, private, rates_mask, clip_r, cand):
    c = centres.astype(np.float64)
    x = private[rates_mask].astype(np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = x * np.minimum(1.0, clip_r / norms)
    lab = np.argmin(((x[:, None, :] - c[None, :, :]) ** 2).sum(-1), axis=1)
    k = len(c)
    sums = np.zeros_like(c)
    for i, j in enumerate(lab):
        sums[j] += x[i]
    m = np.bincount(lab, minlength=k)
    e = (sizes[:, None] * c + sums) / (sizes + m)[:, None]
    n = sizes + m
    nn = np.argmin(((e[:, None, :] - cand[None, :, :]) ** 2).sum(-1), axis=1)  # L2 nearest
    return e, n, np.bincount(nn, weights=n, minlength=len(cand))


def test_public_centres_sizes(data):
    public, _, _ = data
    centres, sizes = public_centres(public, 12, seed=0)
    assert centres.shape == (len(sizes), 16) and len(sizes) <= 12
    assert sizes.sum() == len(public) and np.all(sizes >= 1)


def test_representative_vote_matches_numpy_sigma0(data, tmp_path):
    public, private, cand = data
    centres, sizes = public_centres(public, 12, seed=0)
    rates = np.where(np.arange(len(private)) % 3 == 0, 0.0, 1.0)  # deterministic sampling
    clip_r = 1.0
    acc = accumulate_private(centres, _chunks(private, 64), rates, clip_r, SeededNoise(1))
    session = _session(tmp_path)
    (reps,) = release_representatives(session, "k", [RepresentativeGroup(centres, sizes, acc)],
                                      RepresentativeNoise(clip_r, 0.0))
    assert session.keys() == []  # sigma 0: no protection asked, nothing released or charged
    e, n, hist = _brute_force(centres, sizes, private, rates > 0, clip_r, cand)
    np.testing.assert_allclose(reps.e_tilde, e, atol=1e-5)
    np.testing.assert_allclose(reps.n_tilde, n)
    got = representative_vote(reps.e_tilde, reps.n_tilde, cand)
    np.testing.assert_allclose(got, hist)
    assert got.sum() == pytest.approx(len(public) + (rates > 0).sum())


def test_cached_labels_give_same_result(data):
    public, private, _ = data
    centres, sizes = public_centres(public, 10, seed=0)
    labels = assign_private(centres, _chunks(private, 100), 0.8)
    rates = np.ones(len(private))
    a = accumulate_private(centres, _chunks(private, 64), rates, 0.8, SeededNoise(0))
    b = accumulate_private(centres, _chunks(private, 77), rates, 0.8, SeededNoise(0),
                           labels=labels)
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_allclose(a.sums, b.sums, atol=1e-5)
    assert a.n_sampled == len(private)


def test_poisson_sampling_rate(data):
    _, private, _ = data
    centres = np.zeros((1, 16), dtype=np.float32)
    big = np.tile(private, (20, 1))  # 10 000 rows
    acc = accumulate_private(centres, _chunks(big, 999), np.full(len(big), 0.3), 1.0,
                             SeededNoise(3))
    assert acc.n_sampled == pytest.approx(3000, abs=4 * np.sqrt(10000 * 0.21))


def test_noise_scales_empirical(tmp_path):
    """Centre k gets Delta_k sigma = (R + max(1, R)) / n_k * sigma per coordinate, counts sigma;
    the release is one accounted Gaussian of sensitivity sqrt(2)."""
    k, d = 2, 40_000
    sizes = np.array([1.0, 4.0])
    clip_r, sigma = 0.5, 2.0
    session = _session(tmp_path)
    (reps,) = release_representatives(session, "iter0/representatives",
                                      [_zero_group(k, d, sizes)],
                                      RepresentativeNoise(clip_r, sigma), sampling_rate=0.5)
    expected = (clip_r + 1.0) * sigma / sizes  # (R + max(1, R)) / n_k * sigma = [3.0, 0.75]
    np.testing.assert_allclose(reps.centre_noise_std, expected)
    np.testing.assert_allclose(reps.e_tilde.std(axis=1), expected, rtol=0.02)
    np.testing.assert_allclose(reps.e_tilde.mean(axis=1), 0.0, atol=0.05)
    (event,) = session.accountant.summary()
    assert event["sensitivity"] == pytest.approx(JOINT_SENSITIVITY)
    assert event["sigma"] == pytest.approx(sigma) and event["sampling_rate"] == 0.5
    # asking again returns the stored release: the noise is never redrawn
    (again,) = release_representatives(session, "iter0/representatives",
                                       [_zero_group(k, d, sizes)],
                                       RepresentativeNoise(clip_r, sigma), sampling_rate=0.5)
    np.testing.assert_array_equal(again.e_tilde, reps.e_tilde)
    assert len(session.accountant.summary()) == 1
    kk = 40_000
    (reps2,) = release_representatives(_session(tmp_path / "b", 6), "n",
                                       [_zero_group(kk, 1, np.full(kk, 10.0))],
                                       RepresentativeNoise(clip_r, sigma))
    dev = reps2.n_tilde - 10.0
    assert dev.std() == pytest.approx(sigma, rel=0.02)
    assert abs(dev.mean()) < 0.05


@pytest.mark.parametrize("clip_r", [0.1, 0.5, 1.0, 2.0])
def test_centre_sensitivity_bounds_the_worst_record(clip_r):
    """One added row x moves a centre by (x - e~_k) / (n_k + m_k + 1): with unit public rows and
    x antipodal to the centre this reaches (R + 1) / (n_k + 1); Delta_k must cover it (and the
    old 2R / n_k does not for R < 1)."""
    n = 5
    e = np.zeros(8)
    e[0] = 1.0  # all n public rows equal the unit vector e_0
    x = -clip_r * e  # a clipped private row pointing the other way
    before = e
    after = (n * e + x) / (n + 1)
    shift = np.linalg.norm(after - before)
    delta = RepresentativeNoise(clip_r, 1.0).centre_sensitivity(np.array([n]))[0]
    assert shift <= delta
    assert delta == pytest.approx((clip_r + max(1.0, clip_r)) / n)
    if clip_r < 1:
        assert shift > 2 * clip_r / n  # the old scale understated the shift


def test_nearest_count_vote_matches_numpy(data):
    _, private, cand = data
    x = private / np.linalg.norm(private, axis=1, keepdims=True)
    hist = nearest_count_vote(_chunks(x, 37), cand, batch=50)
    ref = np.bincount(np.argmax(x @ cand.T, axis=1), minlength=len(cand))
    np.testing.assert_array_equal(hist, ref)
    hist3 = nearest_count_vote(_chunks(x, 37), cand, k=3)
    top3 = np.argsort(-(x @ cand.T), axis=1)[:, :3]
    np.testing.assert_array_equal(hist3, np.bincount(top3.ravel(), minlength=len(cand)))


def test_nearest_count_vote_is_weight_one_not_aug_pe(data):
    """Weight 1 per neighbour: equal to Aug-PE's kNN vote (1/sqrt(k)) for k = 1 and one label,
    sqrt(k) times it for k > 1."""
    from dpsynth.voting import knn_vote

    _, private, cand = data
    x = (private / np.linalg.norm(private, axis=1, keepdims=True)).astype(np.float32)
    one = np.zeros(len(x), dtype=np.int64)
    one_c = np.zeros(len(cand), dtype=np.int64)
    for k in (1, 3):
        aug = knn_vote(x, one, cand, one_c, k=k)
        counts = nearest_count_vote(_chunks(x, 37), cand, k=k)
        np.testing.assert_allclose(counts, aug * np.sqrt(k), rtol=1e-9, atol=1e-9)


def test_bad_input_messages(data, tmp_path):
    public, private, _ = data
    centres, sizes = public_centres(public, 5, seed=0)
    with pytest.raises(ValueError, match="rates has"):
        accumulate_private(centres, _chunks(private, 64), np.ones(10), 1.0, SeededNoise(0))
    with pytest.raises(ValueError, match=r"n_k >= 1"):
        release_representatives(_session(tmp_path), "k", [_zero_group(2, 3, [0.0, 1.0])],
                                RepresentativeNoise(1.0, 1.0))
    with pytest.raises(ValueError, match="clip_R"):
        RepresentativeNoise(0.0, 1.0)


def test_centre_longer_than_public_norm_rejected(tmp_path):
    centres = np.array([[1.5, 0.0], [0.0, 0.2]])
    with pytest.raises(ValueError, match="public_norm=1.0"):
        release_representatives(_session(tmp_path), "k", [_zero_group(2, 2, [1, 1], centres)],
                                RepresentativeNoise(0.5, 1.0))
    # with the true bound of the public rows the same centres are accepted
    (reps,) = release_representatives(_session(tmp_path / "b"), "k",
                                      [_zero_group(2, 2, [1, 1], centres)],
                                      RepresentativeNoise(0.5, 1.0, public_norm=1.5))
    np.testing.assert_allclose(reps.centre_noise_std, [2.0, 2.0])  # (0.5 + 1.5) / 1 * 1


def test_secpe_score_uses_the_clip_below_one_bound(tmp_path):
    """Production path: SecPEStrategy.vote at clip R = 0.1 on unit embeddings releases centres
    with noise (R + 1) / n_k * sigma per coordinate (not 2R / n_k * sigma)."""
    from dpsynth.compute import LocalCompute
    from dpsynth.config import RunConfig
    from dpsynth.data import Dataset
    from dpsynth.evolution.strategy import Pool
    from dpsynth.methods.secpe import SecPEStrategy, SecretPlan

    rng = np.random.default_rng(0)
    n_pub, n_priv, d = 300, 40, 2048
    texts = [f"public note {i}" for i in range(n_pub)] + [f"zebra note {i}" for i in range(n_priv)]
    cfg = RunConfig.model_validate({
        "method": "secpe", "synthesis": {"iterations": 1}, "privacy": {"seed": 0},
        "secpe": {"secrets": [{"kind": "strings", "values": ["zebra"]}], "clip": 0.1,
                  "clusters": 3, "p": 1e-4, "r_over_p": 10}})
    emb = _unit(rng, n_pub + n_priv, d)
    codes = np.zeros(len(texts), dtype=np.int64)
    data = Dataset(texts, {"label": ["x"] * len(texts)}, None, "mem", "text", ["label"], None)
    compute = LocalCompute(lambda: emb, codes, None, data)
    data.compute = compute  # type: ignore[attr-defined]  (dataset_engine: this engine)
    plan = SecretPlan.build(cfg, data)
    assert plan.protects and len(plan.public_idx) == n_pub
    session = _session(tmp_path)
    from dpsynth.context import Releaser, Rngs

    class _View:  # the parts of dpsynth.context.PrivateView that SecPE's vote reads
        n_labels = 1

        def __init__(self) -> None:
            self.compute = compute

        def __len__(self) -> int:
            return len(texts)

    view = _View()
    strategy = SecPEStrategy(cfg, plan, view, Releaser(session, plan.sigma), None, Rngs(0))
    cand = _unit(rng, 10, d)
    vote = strategy.vote(0, Pool([f"c{i}" for i in range(10)], np.zeros(10, dtype=np.int64),
                                 np.zeros(10, dtype=np.int64)), cand)
    cent, sizes = strategy.centres()[0]
    # the exact statistic, from the same Poisson coins the production path drew (one per
    # record; the rates the engine kept: 0 for the public rows)
    coins = session.noise_for("iter0/poisson").uniform(len(texts))
    from dpsynth.methods.secpe.kernels import shard_rates

    rates = shard_rates(compute.shard)
    assert rates is not None and not rates[:n_pub].any() and rates[n_pub:].any()
    taken = np.flatnonzero(coins < rates)
    assert taken.min() >= n_pub
    acc = accumulate_private(cent, [emb[taken]], np.ones(len(taken)), 0.1,
                             session.noise_for("unused"))
    exact = (sizes[:, None] * cent + acc.sums) / (sizes + acc.counts)[:, None]
    rep = vote.released[0]
    expected = (0.1 + 1.0) / sizes * plan.sigma
    np.testing.assert_allclose(rep.centre_noise_std, expected, rtol=1e-6)
    np.testing.assert_allclose((rep.e_tilde - exact).std(axis=1), expected, rtol=0.1)
    (event,) = session.accountant.summary()
    assert event["sensitivity"] == pytest.approx(JOINT_SENSITIVITY)
    assert event["sigma"] == pytest.approx(plan.sigma)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_centres_sum_depends_on_its_own_rows_only(seed):
    """Each centre's sum is its rows' clipped sum (to float32 rounding), and rows of other
    centres, before, between or after its own, leave it unchanged bit for bit."""
    rng = np.random.default_rng(seed)
    k, m, d = 37, 5000, 24
    x = rng.standard_normal((m, d), dtype=np.float32)
    scale = rng.random(m, dtype=np.float32)
    lab = rng.integers(0, k, m)
    sums, counts = np.zeros((k, d)), np.zeros(k, np.int64)
    rep._add_to_centres(sums, counts, x, scale, lab)
    exact = np.zeros((k, d))
    np.add.at(exact, lab, scale[:, None].astype(np.float64) * x)
    np.testing.assert_allclose(sums, exact, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(counts, np.bincount(lab, minlength=k))
    # centre 0's rows alone, in their order, and the same rows among shuffled others
    own = np.flatnonzero(lab == 0)
    alone, alone_counts = np.zeros((k, d)), np.zeros(k, np.int64)
    rep._add_to_centres(alone, alone_counts, x[own], scale[own], lab[own])
    others = rng.permutation(np.flatnonzero(lab != 0))
    order = np.sort(np.concatenate([own, others[: len(others) // 2]]))
    mixed, mixed_counts = np.zeros((k, d)), np.zeros(k, np.int64)
    rep._add_to_centres(mixed, mixed_counts, x[order], scale[order], lab[order])
    assert alone[0].tobytes() == sums[0].tobytes() == mixed[0].tobytes()
