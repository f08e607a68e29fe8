"""The loop's parts against brute-force references: voting, sensitivities, selection, cleaning."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from dpsynth.evolution.prompts import clean_generation, mask_words
from dpsynth.evolution.selection import (
    allocate,
    select_per_label,
    shrunk_counts,
    thresholded,
    top_indices,
)
from dpsynth.voting import knn_vote, topq_sensitivity, topq_vote, user_label_counts


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture()
def cloud() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(3)
    private = _unit(rng.normal(size=(300, 24)))
    cands = _unit(rng.normal(size=(40, 24)))
    return private, rng.integers(0, 4, 300), cands, rng.integers(0, 4, 40)


@pytest.mark.parametrize("k", [1, 3])
def test_knn_vote_matches_brute_force(cloud, k):
    private, plab, cands, clab = cloud
    ref = np.zeros(len(cands))
    for x, y in zip(private, plab, strict=True):
        idx = np.flatnonzero(clab == y)
        top = idx[np.argsort(-(cands[idx] @ x), kind="stable")[:k]]
        ref[top] += 1 / math.sqrt(k)
    np.testing.assert_allclose(knn_vote(private, plab, cands, clab, k=k, batch=17), ref,
                               atol=1e-9)


def test_knn_vote_has_sensitivity_one(cloud):
    private, plab, cands, clab = cloud
    full = knn_vote(private, plab, cands, clab, k=3)
    for drop in range(0, 300, 37):
        keep = np.arange(300) != drop
        diff = full - knn_vote(private[keep], plab[keep], cands, clab, k=3)
        assert np.linalg.norm(diff) == pytest.approx(1.0)


def test_user_level_votes_bounded_per_user(cloud):
    private, plab, cands, clab = cloud
    users = np.repeat(np.arange(30), 10)  # 30 users with 10 records each
    full = knn_vote(private, plab, cands, clab, k=1, users=users)
    for u in (0, 7, 29):
        keep = users != u
        _, inv = np.unique(users[keep], return_inverse=True)
        diff = full - knn_vote(private[keep], plab[keep], cands, clab, k=1, users=inv)
        assert np.linalg.norm(diff) <= 1.0 + 1e-9
    # without the bound a 10-record user would move the histogram by more than 1
    unbounded = knn_vote(private, plab, cands, clab, k=1)
    only_u0 = knn_vote(private[users == 0], plab[users == 0], cands, clab, k=1)
    assert np.linalg.norm(only_u0) > 1.0 and unbounded.sum() > full.sum()


def test_topq_sensitivity_brute_force():
    """Every ordering of 2Q candidates: the max L2 norm of a record's (H_near, H_far)."""
    q = 3
    n = 2 * q
    worst = 0.0
    for order in itertools.permutations(range(n)):
        near = np.zeros(n)
        far = np.zeros(n)
        for rank in range(q):
            near[order[rank]] += 2.0 ** -rank
            far[order[-1 - rank]] += 2.0 ** -rank
        worst = max(worst, float(np.linalg.norm(np.concatenate([near, far]))))
    assert worst == pytest.approx(topq_sensitivity(q))
    assert topq_sensitivity(8) == pytest.approx(1.6330, abs=1e-4)
    assert topq_sensitivity(1) == pytest.approx(math.sqrt(2))


def test_topq_vote_neighbouring_datasets(cloud):
    private, plab, cands, clab = cloud
    q = 4
    full = topq_vote(private, plab, cands, clab, q=q)
    n = len(cands)
    assert full.shape == (2 * n,)
    # weights: each record gives sum 2^-q to each histogram
    assert full[:n].sum() == pytest.approx(300 * sum(2.0 ** -i for i in range(q)))
    for drop in (0, 100, 299):
        keep = np.arange(300) != drop
        diff = full - topq_vote(private[keep], plab[keep], cands, clab, q=q)
        assert np.linalg.norm(diff) == pytest.approx(topq_sensitivity(q))
    # nearest really is nearest: record 0's top candidate gets its weight 1
    x, y = private[0], plab[0]
    idx = np.flatnonzero(clab == y)
    best = idx[np.argmax(cands[idx] @ x)]
    worst = idx[np.argmin(cands[idx] @ x)]
    keep = np.arange(300) != 0
    diff = full - topq_vote(private[keep], plab[keep], cands, clab, q=q)
    assert diff[best] == pytest.approx(1.0) and diff[n + worst] == pytest.approx(1.0)


def test_user_label_counts():
    labels = np.array([0, 0, 1, 2, 2, 2])
    np.testing.assert_allclose(user_label_counts(labels, 3, None), [2, 1, 3])
    users = np.array([0, 0, 0, 1, 1, 1])  # user 0: counts (2,1,0) -> norm sqrt 5
    out = user_label_counts(labels, 3, users)
    np.testing.assert_allclose(out, [2 / math.sqrt(5), 1 / math.sqrt(5), 1.0])


def test_allocate_sums_and_follows_counts():
    parts = allocate(10, np.array([5.0, -3.0, 15.0]))
    assert parts.sum() == 10 and parts[1] == 0 and parts[2] > parts[0]
    assert allocate(7, np.array([-1.0, -2.0])).sum() == 7  # all negative -> uniform


def test_shrunk_counts_follow_the_counts_when_the_noise_is_small_and_not_when_it_is_large():
    counts = np.array([10.0, 50.0, 30.0, 90.0, 20.0])
    assert np.array_equal(shrunk_counts(counts, 0.0), counts)
    assert np.array_equal(shrunk_counts(counts[:3], 1e6), counts[:3])  # under 4 labels
    # James-Stein: m + (1 - (L - 3) v / S)(c - m), by hand
    m, spread = counts.mean(), float(np.sum((counts - counts.mean()) ** 2))
    assert np.allclose(shrunk_counts(counts, 100.0), m + (1 - 2 * 100.0 / spread) * (counts - m))
    assert np.allclose(shrunk_counts(counts, 1e6), m)  # noise beyond the spread: uniform


def test_shrunk_counts_split_samples_nearer_the_true_shares_at_a_small_epsilon():
    """Ten labels of about 50 records and a count noise of 18 (Aug-PE's (label x length)
    histogram at epsilon 1: sigma 6.5 on each of 8 cells): the split of 200 samples by the
    shrunk counts is nearer the split by the true counts than the split by the noisy ones,
    and leaves a label without samples far less often; at a noise of 1 the two splits
    agree."""
    rng = np.random.default_rng(0)
    true = rng.integers(40, 61, 10).astype(float)
    ideal = allocate(200, true)
    raw_err, shrunk_err, raw_empty, empty = [], [], 0, 0
    for _ in range(400):
        noisy = true + rng.normal(0, 18.3, 10)
        raw = allocate(200, noisy)
        raw_err.append(np.abs(raw - ideal).sum())
        split = allocate(200, shrunk_counts(noisy, 18.3 ** 2))
        shrunk_err.append(np.abs(split - ideal).sum())
        raw_empty, empty = raw_empty + int((raw == 0).any()), empty + int((split == 0).any())
    assert np.mean(shrunk_err) < 0.6 * np.mean(raw_err)
    assert empty * 5 < raw_empty
    noisy = true + rng.normal(0, 1.0, 10)
    assert np.abs(allocate(200, shrunk_counts(noisy, 1.0)) - allocate(200, noisy)).sum() <= 2


def test_selection_rank_and_sample():
    scores = np.array([0.0, 5.0, 1.0, 9.0, 0.5, 2.0])
    labels = np.array([0, 0, 0, 1, 1, 1])
    rng = np.random.default_rng(0)
    kept = select_per_label(scores, labels, np.array([2, 1]), "rank", rng)
    assert sorted(kept.tolist()) == [1, 2, 3]
    draws = select_per_label(scores, labels, np.array([500, 0]), "sample", rng)
    freq = np.bincount(draws, minlength=3)[:3] / 500
    assert freq[0] == 0 and freq[1] > 0.7  # proportional to scores 0, 5, 1
    np.testing.assert_allclose(thresholded(np.array([-1.0, 0.5, 3.0]), 1.0), [0, 0, 2.0])
    top = top_indices(scores, labels, 1)
    assert top[0].tolist() == [1] and top[1].tolist() == [3]


def test_clean_generation():
    assert clean_generation('Sure! Here is the rephrased text: "My knee hurts a lot."', 5) == \
        "My knee hurts a lot."
    assert clean_generation("I'm sorry, but I cannot help with that request.", 5) is None
    assert clean_generation("   ", 5) is None
    assert clean_generation("Text: short", 12) is None
    assert clean_generation("**Message:** Please call me back tomorrow.", 5) == \
        "Please call me back tomorrow."
    # drop_off_task: commentary on the prompt goes, a sample that says "for example" stays
    for remark in ("Consider rephrasing the bad examples to sound more natural.",
                   "The good examples are more specific about the card.",
                   "The new text is clear and concise."):
        assert clean_generation(remark, 5, drop_off_task=True) is None
        assert clean_generation(remark, 5) == remark
    # ... and so does a text in the assistant's voice or a form letter with template slots
    for reply in ("Hello there. I'm here to assist you. What do you need?",
                  "Welcome to our online banking platform! How may I assist you?",
                  "Dear [Bank Name], my card has not arrived.",
                  "Hi [User's Name], your transfer is on its way."):
        assert clean_generation(reply, 5, drop_off_task=True) is None
        assert clean_generation(reply, 5) == reply
    for sample in ("For example, the pasta was great and the staff were friendly.",
                   "Is the new version of the app why my card stopped working?",
                   "How can I get help with a declined card payment?",
                   "I'm happy to wait, but where is my new card [the one I ordered]?"):
        assert clean_generation(sample, 5, drop_off_task=True) == sample


def test_writer_noun_is_the_head_of_the_public_writer():
    from dpsynth.evolution.prompts import writer_noun

    assert writer_noun("a customer of an online bank") == "customer"
    assert writer_noun("an angry Yelp reviewer") == "reviewer"
    assert writer_noun("a patient writing to their doctor.") == "patient"
    assert writer_noun("Customer") == "customer"
    assert writer_noun("") == "" and writer_noun("  ") == ""


def test_drop_off_task_drops_texts_about_the_writer_only_when_a_writer_is_set():
    writer = "a customer of an online bank"
    about = ("This customer wants to withdraw $21 from an ATM.",
             "A customer asks why their card has not arrived.",
             "The customer's card was declined twice today.",
             "Our customers often ask about top-up limits.",
             "A frustrated customer is asking about a refund.")
    for text in about:
        assert clean_generation(text, 5, drop_off_task=True, writer=writer) is None
        assert clean_generation(text, 5, drop_off_task=True) == text  # no writer: kept
        assert clean_generation(text, 5, writer=writer) == text  # drop_off_task off: kept
    own = ("I am a customer and my card still has not arrived.",
           "As a customer, why am I charged for a transfer?",
           "Why does the bank treat its clients like this? My card is blocked.",
           "My card has not arrived yet, can you check?")
    for text in own:
        assert clean_generation(text, 5, drop_off_task=True, writer=writer) == text
    # the rule follows the writer: another writer's noun, not a fixed list
    assert clean_generation("The patient reports a headache.", 5, drop_off_task=True,
                            writer="a patient writing to their doctor") is None
    assert clean_generation("The customer reports a headache.", 5, drop_off_task=True,
                            writer="a patient writing to their doctor") is not None


def test_refusals_go_but_a_customer_who_cannot_use_a_card_stays():
    for refusal in ("I cannot help with that request.", "I'm unable to assist with this.",
                    "I can't write that message for you.", "As an AI, I have no bank card."):
        assert clean_generation(refusal, 5) is None
    for text in ("I cannot use my card.", "I am unable to use contactless payments.",
                 "I can't see the funds I topped up. What happened?"):
        assert clean_generation(text, 5, drop_off_task=True,
                                writer="a customer of an online bank") == text


def test_mask_words_rate():
    rng = np.random.default_rng(1)
    masked = mask_words(" ".join(["word"] * 1000), 0.5, rng)
    share = masked.split().count("___") / 1000
    assert 0.45 < share < 0.55
    assert "___" in mask_words("one", 0.01, rng)


def test_echoed_instruction_sentences_are_removed():
    from dpsynth.evolution.prompts import instruction_sentences, rephrase_instruction

    instr = rephrase_instruction("a short review", "Review Stars: 1.0.", "Cold beer. Nice.",
                                 "casual")
    echoes = instruction_sentences(instr)
    assert "Review Stars: 1.0." in echoes
    assert not any("Cold beer" in e for e in echoes)  # the quoted text is not an echo
    got = clean_generation("review stars: 1.0. Cold beer, rude staff, never again.", 5,
                           echoes=echoes)
    assert got == "Cold beer, rude staff, never again."
    assert clean_generation("Review Stars: 1.0.", 5, echoes=echoes) is None  # only the echo


def test_the_synthesizer_applies_the_writer_rule():
    """The production path from a config to clean_generation: Synthesizer.complete passes the
    public writer on, and retries, then drops, a text about the writer."""
    from dpsynth.config import GeneratorConfig, SynthesisConfig
    from dpsynth.evolution.textgen import Synthesizer
    from fakes import FakeGenerator

    def run(text: str, writer: str) -> tuple[list[str | None], Synthesizer]:
        synthesizer = Synthesizer(FakeGenerator(transform=lambda _: text), GeneratorConfig(),
                                  SynthesisConfig(drop_off_task=True, retries=1), seed=0,
                                  writer=writer)
        return synthesizer.complete(["Write a question."] * 3, ["a", "b", "c"],
                                    progress=False), synthesizer

    about = "The customer asks why the card is blocked."
    out, dropped = run(about, "a customer of an online bank")
    assert out == [None] * 3
    assert dropped.counts.retried == 3 and dropped.counts.dropped == 3
    assert run(about, "")[0] == [about] * 3  # no writer: nothing to speak about
    own = "Why is my card blocked?"
    out, kept = run(own, "a customer of an online bank")
    assert out == [own] * 3 and kept.counts.retried == 0
