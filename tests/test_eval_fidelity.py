"""Fidelity metrics: FID, kNN precision/recall, MAUVE, length and label distributions."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.eval.common import MetricUnavailable
from dpsynth.eval.fidelity import (
    fid,
    frechet_distance,
    knn_precision_recall,
    label_comparison,
    length_comparison,
    mauve_score,
    total_variation,
)


def test_frechet_distance_matches_closed_form_for_diagonal_gaussians():
    mu1, mu2 = np.array([0.0, 1.0, -2.0]), np.array([1.0, 3.0, -2.0])
    v1, v2 = np.array([1.0, 4.0, 0.25]), np.array([4.0, 9.0, 1.0])
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(v1) - np.sqrt(v2)) ** 2)
    assert frechet_distance(mu1, np.diag(v1), mu2, np.diag(v2)) == pytest.approx(expected)


def test_frechet_distance_full_covariance_matches_scalar_case():
    # 1-D: (m1 - m2)^2 + (s1 - s2)^2
    assert frechet_distance(np.array([2.0]), np.array([[9.0]]), np.array([0.0]),
                            np.array([[1.0]])) == pytest.approx(4.0 + 4.0)


def test_fid_identical_sets_is_zero_and_shift_matches_closed_form():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 4))
    y = rng.normal(size=(20000, 4)) * np.array([1.0, 2.0, 1.0, 1.0]) + np.array([1.0, 0, 0, 2.0])
    assert fid(x, x) == pytest.approx(0.0, abs=1e-6)
    # closed form: ||m||^2 = 5 plus (1 - 2)^2 = 1 from the scaled axis
    assert fid(x, y) == pytest.approx(6.0, rel=0.05)


def test_fid_refuses_too_few_samples_and_bad_values():
    rng = np.random.default_rng(1)
    with pytest.raises(MetricUnavailable, match="at least 2 samples"):
        fid(rng.normal(size=(1, 8)), rng.normal(size=(50, 8)))
    bad = rng.normal(size=(10, 3))
    bad[2, 1] = np.nan
    with pytest.raises(MetricUnavailable, match="NaN"):
        fid(bad, rng.normal(size=(10, 3)))


def test_fid_rank_deficient_covariance_still_finite():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(20, 64)), rng.normal(size=(20, 64)) + 0.5
    value = fid(x, y)
    assert np.isfinite(value) and value > fid(x, rng.normal(size=(20, 64)))


def _two_clusters(rng: np.random.Generator, n: int) -> np.ndarray:
    a = rng.normal(size=(n // 2, 2)) * 0.3 + np.array([-4.0, 0.0])
    b = rng.normal(size=(n - n // 2, 2)) * 0.3 + np.array([4.0, 0.0])
    return np.vstack([a, b])


def test_knn_precision_recall_on_point_clouds():
    rng = np.random.default_rng(3)
    real = _two_clusters(rng, 400)
    same = _two_clusters(rng, 400)
    pr = knn_precision_recall(real, same, k=3)
    assert pr["precision"] > 0.85 and pr["recall"] > 0.85
    # mode collapse: synthetic covers one cluster only -> high precision, recall about 1/2
    collapsed = rng.normal(size=(400, 2)) * 0.3 + np.array([-4.0, 0.0])
    pr = knn_precision_recall(real, collapsed, k=3)
    assert pr["precision"] > 0.85
    assert 0.35 < pr["recall"] < 0.6
    # far away: neither
    pr = knn_precision_recall(real, same + 50.0, k=3)
    assert pr["precision"] == 0.0 and pr["recall"] == 0.0


def test_knn_precision_recall_needs_more_than_k_samples():
    with pytest.raises(MetricUnavailable, match="k=5"):
        knn_precision_recall(np.zeros((5, 2)), np.ones((40, 2)), k=5)


def test_mauve_high_for_same_distribution_low_for_different():
    rng = np.random.default_rng(4)
    p = rng.normal(size=(300, 16))
    q_same = rng.normal(size=(300, 16))
    q_diff = rng.normal(size=(300, 16)) + 3.0
    same = mauve_score(p, q_same, num_buckets=10)
    diff = mauve_score(p, q_diff, num_buckets=10)
    assert same > 0.8
    assert diff < 0.3
    with pytest.raises(MetricUnavailable, match="MAUVE needs"):
        mauve_score(p[:5], q_same)


def test_distributions():
    assert total_variation({"a": 0.5, "b": 0.5}, {"a": 1.0}) == pytest.approx(0.5)
    lab = label_comparison(["x", "x", "y", "y"], ["x", "x", "x", "x"])
    assert lab["tv"] == pytest.approx(0.5) and lab["synthetic"] == {"x": 0.5, "y": 0.5}
    short = ["one two"] * 20
    long = ["one two three four five six seven eight nine ten"] * 20
    assert length_comparison(short, short)["tv"] == pytest.approx(0.0)
    cmp = length_comparison(short, long)
    assert cmp["tv"] == pytest.approx(1.0) and cmp["ks"] == pytest.approx(1.0)
    assert cmp["synthetic"]["mean"] == 2 and cmp["real"]["mean"] == 10
    with pytest.raises(MetricUnavailable):
        length_comparison([], long)
