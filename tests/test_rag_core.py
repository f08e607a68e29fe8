"""DP-SynRAG pieces without models: accounting, clip, sampling, threshold, keywords, clusters."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpsynth.config import ConfigError
from dpsynth.methods.synrag.accounting import (
    calibrate_clip,
    planned_events,
    resolve_clip,
    theorem1_epsilon,
    theorem1_rho,
)
from dpsynth.methods.synrag.clusters import (
    histogram_sigma,
    keyword_counts,
    noise_floor,
    soft_clusters,
    top_keywords,
)
from dpsynth.methods.synrag.config import SynRAGConfig
from dpsynth.methods.synrag.keywords import Vocabulary, extract_keywords, parse_keywords
from dpsynth.methods.synrag.private_prediction import clipped_sum
from dpsynth.methods.synrag.retrieval import centre_sigma
from dpsynth.privacy import (
    Accountant,
    PrivacySession,
    make_noise_source,
    zcdp_to_eps_cks,
    zcdp_to_eps_standard,
)


def test_theorem1_matches_accountant_and_closed_form() -> None:
    cfg = SynRAGConfig(keywords_per_doc=10, rho_hist=0.1, overlap=5, eps_theta=0.4,
                       rho_centre=0.009, tokens=70, temperature=1.0)
    c = 0.1
    sigma_h = histogram_sigma(10, 0.1)
    assert 10 / (2 * sigma_h**2) == pytest.approx(0.1)
    rho = theorem1_rho(10, sigma_h, 5, 0.4, centre_sigma(0.009), 70, c, 1.0)
    # by hand: 0.1 + 5 (0.02 + 0.009 + 35 * 0.01)
    assert rho == pytest.approx(0.1 + 5 * (0.4**2 / 8 + 0.009 + 35 * c**2))
    acc = Accountant("zcdp")
    acc.extend(planned_events(cfg, c))
    assert acc.rho() == pytest.approx(rho, rel=1e-12)
    delta = 1e-3
    assert theorem1_epsilon(rho, delta) == pytest.approx(
        rho + math.sqrt(4 * rho * math.log(1 / delta)))
    # the accountant reports the tighter CKS conversion, never above the standard one
    assert acc.epsilon(delta) == pytest.approx(zcdp_to_eps_cks(rho, delta), rel=1e-9)
    assert acc.epsilon(delta) <= zcdp_to_eps_standard(rho, delta)


def test_clip_is_calibrated_to_the_target() -> None:
    cfg = SynRAGConfig()
    c = resolve_clip(cfg, 10.0, 1e-3)
    acc = Accountant("zcdp")
    acc.extend(planned_events(cfg, c))
    assert acc.epsilon(1e-3) == pytest.approx(10.0, rel=1e-6)
    acc2 = Accountant("zcdp")
    acc2.extend(planned_events(cfg, c * 1.01))
    assert acc2.epsilon(1e-3) > 10.0
    # the paper's setting gives c of order 0.1
    assert 0.05 < c < 0.2
    with pytest.raises(ConfigError, match="already take epsilon"):
        calibrate_clip(0.05, 1e-3, lambda cc: planned_events(cfg, cc))
    with pytest.raises(ConfigError, match="synrag.clip"):
        resolve_clip(SynRAGConfig(clip=5.0), 10.0, 1e-3)


def test_clip_logits_formula_and_errors() -> None:
    # docs/methods.md §4: l = exp(logits - max) - 1; centre by (max+min)/2; sup-norm <= c
    from dpsynth.methods.synrag.clipping import clip_logits
    from dpsynth.privacy import PrivacyConfigError

    row = np.array([2.0, 0.0])
    a = math.expm1(-2.0) / 2.0  # half the span
    assert np.allclose(clip_logits(row, 10.0), [-a, a])
    assert np.allclose(clip_logits(row, 0.1), [0.1, -0.1])
    masked = np.random.default_rng(1).normal(0, 5, size=(3, 50))
    masked[0, :10] = -np.inf  # masked tokens are allowed
    assert np.abs(clip_logits(masked, 0.3)).max() <= 0.3 + 1e-12
    with pytest.raises(PrivacyConfigError, match="NaN"):
        clip_logits(np.array([0.0, np.nan]), 1.0)
    with pytest.raises(PrivacyConfigError, match="clip c"):
        clip_logits(row, 0.0)
    with pytest.raises(PrivacyConfigError, match="entirely -inf"):
        clip_logits(np.array([-np.inf, -np.inf]), 1.0)


def test_clipped_sum_properties() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 5, size=(7, 300))
    c = 0.3
    from dpsynth.methods.synrag.clipping import clip_logits

    rows = clip_logits(logits, c)
    assert np.all(np.abs(rows).max(axis=1) <= c + 1e-12)
    # centred: max + min = 0 on each row
    np.testing.assert_allclose(rows.max(axis=1) + rows.min(axis=1), 0, atol=1e-12)
    # order preserved inside a row (monotone transform)
    assert np.array_equal(np.argsort(rows[0], kind="stable"),
                          np.argsort(logits[0], kind="stable"))
    z = clipped_sum(logits, c)
    np.testing.assert_allclose(z, rows.sum(axis=0))
    # one more document moves each coordinate by at most c
    z2 = clipped_sum(np.vstack([logits, rng.normal(0, 50, size=(1, 300))]), c)
    assert np.abs(z2 - z).max() <= c + 1e-12


def test_private_token_samples_the_full_softmax(tmp_path) -> None:
    z = np.array([2.0, 1.0, 0.0, -1.0, -3.0, -3.0])  # the two last: tail (no top-k cut)
    tau = 2.0  # the tail holds ~7 % of the mass: ~40 expected draws of 600
    session = PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 3))
    n = 600
    draws = np.array([session.private_token(f"t{i}", z, 0.1, tau) for i in range(n)])
    p = np.exp(z / tau) / np.exp(z / tau).sum()
    counts = np.bincount(draws, minlength=len(z))
    assert counts[4] + counts[5] > 0  # the tail is reachable
    chi2 = stats.chisquare(counts, n * p)
    assert chi2.pvalue > 1e-3
    assert session.accountant.rho() == pytest.approx(n * 0.5 * (0.1 / tau) ** 2)


def test_threshold_selects_about_k(tmp_path) -> None:
    rng = np.random.default_rng(1)
    sims = np.clip(rng.normal(0.4, 0.2, size=400), -1, 1)
    session = PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 0))
    got = []
    for i in range(20):
        theta = session.exponential_threshold(f"th{i}", sims, 50, np.array([-1.0, 1.0]), 2.0,
                                              mode="interval")
        got.append(int((sims > theta).sum()))
    assert np.median(np.abs(np.array(got) - 50)) <= 4
    assert max(abs(g - 50) for g in got) <= 15


def test_parse_keywords_from_ugly_outputs() -> None:
    vocab = Vocabulary(["fever", "rash", "Snizzlejerk Fever", "cough", "headache",
                        "Quessoprazine"], "test")
    ugly = ('Sure! Here are the keywords:\n1. "Fever"\n2) RASH.\n- snizzlejerk  fever\n'
            "* cough; Headache, unknownword, the")
    ids = parse_keywords(ugly, vocab, 10)
    assert [vocab.terms[i] for i in ids] == ["fever", "rash", "snizzlejerk fever", "cough",
                                             "headache"]
    assert parse_keywords("Keywords: rash, rash, RASH", vocab, 10) == [vocab.index["rash"]]
    assert len(parse_keywords("fever, rash, cough, headache", vocab, 2)) == 2
    assert parse_keywords("", vocab, 3) == []
    assert parse_keywords("I cannot help with that.", vocab, 3) == []
    # a sentence with a vocabulary term inside
    assert parse_keywords("The patient has a bad cough and takes quessoprazine", vocab, 5) == [
        vocab.index["cough"], vocab.index["quessoprazine"]]
    # top-up from the text when the LLM gives too few, never more than K
    kws = extract_keywords(["Fever and rash after Quessoprazine, also a cough."], vocab, 3,
                           answer=lambda prompt: "nothing useful")
    assert [vocab.terms[i] for i in kws[0]] == ["fever", "rash", "quessoprazine"]
    # the public vocabulary order can set the priority of the top-up (e.g. diseases first)
    kws = extract_keywords(["Fever and rash after Quessoprazine, also a cough."], vocab, 2,
                           fill="vocabulary_order")
    assert [vocab.terms[i] for i in kws[0]] == ["fever", "rash"]
    kws = extract_keywords(["a cough, then Quessoprazine and a rash"], vocab, 2,
                           fill="vocabulary_order")
    assert [vocab.terms[i] for i in kws[0]] == ["rash", "cough"]
    # stop words never enter the vocabulary
    assert "the" not in Vocabulary(["the", "fever"], "t").index


def test_soft_clusters_respect_overlap() -> None:
    rng = np.random.default_rng(2)
    kws = [list(rng.choice(30, size=6, replace=False)) for _ in range(200)]
    counts = keyword_counts(kws, 30)
    assert counts.sum() == 200 * 6
    seeds = top_keywords(counts, 12, 0.0)
    for overlap in (1, 2, 5):
        cl = soft_clusters(kws, seeds, overlap)
        m = cl.memberships(200)
        assert m.max() <= overlap
        for seed, mem in zip(cl.seeds, cl.members, strict=True):
            assert all(int(seed) in kws[i] for i in mem)
    # least frequent first: with L = 1 the least frequent seed keeps all its documents
    cl1 = soft_clusters(kws, seeds, 1)
    least = int(seeds[-1])
    assert len(cl1.members[-1]) == sum(least in k for k in kws)


def test_noise_floor_and_top_keywords() -> None:
    sigma = histogram_sigma(10, 0.1)
    assert sigma == pytest.approx(math.sqrt(50))
    floor = noise_floor(sigma, 1000)
    noisy = np.array([floor + 1, floor - 1, 3 * floor, 0.0])
    assert list(top_keywords(noisy, 5, floor)) == [2, 0]
    assert list(top_keywords(noisy, 1, floor)) == [2]


def test_public_shortcut_accounting() -> None:
    from dpsynth.methods.synrag.config import max_private_tokens

    cfg = SynRAGConfig(tokens=40, public_shortcut=True, svt_epsilon=0.1, svt_max_private=10)
    assert max_private_tokens(cfg) == 10
    c = resolve_clip(cfg, 10.0, 1e-3)
    acc = Accountant("zcdp")
    acc.extend(planned_events(cfg, c))
    rho = theorem1_rho(10, histogram_sigma(10, 0.1), 5, 0.4, centre_sigma(0.009), 10, c, 1.0,
                       svt_epsilon=0.1)
    assert acc.rho() == pytest.approx(rho)
    assert acc.epsilon(1e-3) == pytest.approx(10.0, rel=1e-6)
    # only m = 10 private tokens (and their SVT instances) are paid for: with a cheap SVT c is
    # larger than without the shortcut; with an expensive one it is smaller
    assert c > resolve_clip(SynRAGConfig(tokens=40), 10.0, 1e-3)
    costly = SynRAGConfig(tokens=40, public_shortcut=True, svt_epsilon=0.3, svt_max_private=10)
    assert resolve_clip(costly, 10.0, 1e-3) < resolve_clip(SynRAGConfig(tokens=40), 10.0, 1e-3)
