"""SecPE secret clustering and representative voting against brute-force numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.evolution.representatives import (
    accumulate_private,
    add_representative_noise,
    assign_private,
    noisy_representatives,
    per_point_vote,
    public_centres,
    representative_vote,
)
from dpsynth.privacy.noise import SeededNoise


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


def test_representative_vote_matches_numpy_sigma0(data):
    public, private, cand = data
    centres, sizes = public_centres(public, 12, seed=0)
    rates = np.where(np.arange(len(private)) % 3 == 0, 0.0, 1.0)  # deterministic sampling
    clip_r = 1.0
    reps = noisy_representatives(centres, sizes, _chunks(private, 64), rates, clip_r, 0.0,
                                 SeededNoise(1))
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


def test_noise_scales_empirical():
    k, d = 2, 40_000
    sizes = np.array([1.0, 4.0])
    clip_r, sigma = 0.5, 2.0
    reps = add_representative_noise(np.zeros((k, d)), np.zeros(k), np.zeros((k, d)), sizes,
                                    clip_r, sigma, SeededNoise(5))
    expected = 2 * clip_r * sigma / sizes  # (2R / n_k) sigma = [2.0, 0.5]
    np.testing.assert_allclose(reps.centre_noise_std, expected)
    np.testing.assert_allclose(reps.e_tilde.std(axis=1), expected, rtol=0.02)
    np.testing.assert_allclose(reps.e_tilde.mean(axis=1), 0.0, atol=0.05)
    kk = 40_000
    reps2 = add_representative_noise(np.zeros((kk, 1)), np.zeros(kk), np.zeros((kk, 1)),
                                      np.full(kk, 10.0), clip_r, sigma, SeededNoise(6))
    dev = reps2.n_tilde - 10.0
    assert dev.std() == pytest.approx(sigma, rel=0.02)
    assert abs(dev.mean()) < 0.05


def test_per_point_vote_matches_numpy(data):
    _, private, cand = data
    x = private / np.linalg.norm(private, axis=1, keepdims=True)
    hist = per_point_vote(_chunks(x, 37), cand, batch=50)
    ref = np.bincount(np.argmax(x @ cand.T, axis=1), minlength=len(cand))
    np.testing.assert_array_equal(hist, ref)
    hist2 = per_point_vote(_chunks(x, 37), cand, k=3)
    assert hist2.sum() == 3 * len(x)


def test_bad_input_messages(data):
    public, private, _ = data
    centres, sizes = public_centres(public, 5, seed=0)
    with pytest.raises(ValueError, match="rates has"):
        accumulate_private(centres, _chunks(private, 64), np.ones(10), 1.0, SeededNoise(0))
    with pytest.raises(ValueError, match=r"n_k >= 1"):
        add_representative_noise(np.zeros((2, 3)), np.zeros(2), np.zeros((2, 3)),
                                 np.array([0.0, 1.0]), 1.0, 1.0, SeededNoise(0))


def test_clip_radius_below_centre_norm_rejected():
    centres = np.array([[0.9, 0.0], [0.0, 0.2]], dtype=np.float32)
    with pytest.raises(ValueError, match="clip_R=0.5"):
        add_representative_noise(np.zeros((2, 2)), np.zeros(2), centres, np.ones(2), 0.5, 1.0,
                                 SeededNoise(0))
