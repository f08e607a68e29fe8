"""Downstream utility: logistic regression on embeddings, fine-tuned MiniLM, next-token LM."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsynth.eval.common import MetricUnavailable
from dpsynth.eval.utility import (
    finetune_scores,
    logreg_scores,
    majority_baseline,
    next_token_accuracy,
)


@pytest.fixture(scope="module")
def demo_frames(tmp_path_factory):
    from dpsynth.demo_corpus import write_demo_corpus

    # 60 / 30 texts: logreg scores 0.63 against a 0.30 majority rate and 0.30 with shuffled
    # labels here (300 / 150: 0.88, 0.29, 0.18), far past the 0.1 margins asserted below
    paths = write_demo_corpus(tmp_path_factory.mktemp("demo"), n=60, seed=0, test_n=30)
    return {"private": pd.read_csv(paths["private"]), "test": pd.read_csv(paths["test"])}


@pytest.fixture(scope="module")
def demo(demo_frames, embedder):
    return {
        **demo_frames,
        "private_emb": embedder.embed(demo_frames["private"]["text"].tolist()),
        "test_emb": embedder.embed(demo_frames["test"]["text"].tolist()),
    }


@pytest.mark.models
def test_logreg_on_real_data_beats_chance_and_shuffled_labels(demo):
    for column in ("department",):  # urgency is much harder from the text alone
        y_train = demo["private"][column].tolist()
        y_test = demo["test"][column].tolist()
        chance = majority_baseline(y_test)
        real = logreg_scores(demo["private_emb"], y_train, demo["test_emb"], y_test)
        shuffled = logreg_scores(
            demo["private_emb"], list(np.random.default_rng(0).permutation(y_train)),
            demo["test_emb"], y_test,
        )
        assert real["n_train"] == 60 and real["n_test"] == 30
        assert real["accuracy"] > chance + 0.1, (column, real, chance)
        assert real["accuracy"] > shuffled["accuracy"] + 0.1, (column, real, shuffled)
        assert real["macro_f1"] > shuffled["macro_f1"]


def test_logreg_refuses_single_class():
    x = np.random.default_rng(0).normal(size=(10, 4))
    with pytest.raises(MetricUnavailable, match="single class"):
        logreg_scores(x, ["a"] * 10, x, ["a", "b"] * 5)


SPORT = [
    "I loved the football match last night", "the soccer team won the league",
    "our basketball coach trains the players", "tennis final was a thrilling game",
    "he scored a goal in the second half", "the runners finished the marathon",
    "a great swim at the olympic pool", "the baseball pitcher threw a fast ball",
    "cycling race up the mountain stage", "the boxer won the title fight",
]
FOOD = [
    "bake the cake with flour and sugar", "this pasta sauce needs more garlic",
    "chop the onions and fry them in butter", "the soup was salty but warm",
    "roast the chicken with lemon and herbs", "a slice of chocolate pie for dessert",
    "mix eggs and milk for pancakes", "the curry was spicy and delicious",
    "grill the vegetables for the salad", "fresh bread from the oven smells good",
]


@pytest.mark.models
def test_finetune_one_epoch_beats_chance_on_easy_split():
    train_x, train_y = SPORT[:6] + FOOD[:6], ["sport"] * 6 + ["food"] * 6
    test_x, test_y = SPORT[6:] + FOOD[6:], ["sport"] * 4 + ["food"] * 4
    res = finetune_scores(train_x, train_y, test_x, test_y, epochs=1, batch_size=4,
                          max_length=24, head_lr=1e-2)
    assert res["epochs"] == 1 and len(res["train_loss"]) == 1
    assert res["accuracy"] > 0.5 + 0.2, res


def test_next_token_accuracy_prefers_in_domain_training_text(demo_frames):
    demo = demo_frames
    test_texts = demo["test"]["text"].tolist()
    in_domain = next_token_accuracy(demo["private"]["text"].tolist(), test_texts)
    off_domain = next_token_accuracy(SPORT + FOOD, test_texts)
    assert in_domain["n_test_tokens"] > 1000
    assert in_domain["accuracy"] > off_domain["accuracy"] + 0.1
    with pytest.raises(MetricUnavailable):
        next_token_accuracy(["   "], test_texts)


# -- how sure a difference of two accuracies is (the report's verdict) ------------------------


def test_wilson_interval_matches_the_published_example():
    from dpsynth.eval.utility import wilson_interval

    low, high = wilson_interval(81, 263)  # Newcombe (1998), the score method: 0.2553-0.3662
    assert low == pytest.approx(0.2553, abs=1e-4) and high == pytest.approx(0.3662, abs=1e-4)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0


def test_difference_interval_paired_and_independent():
    from dpsynth.eval.utility import difference_interval, paired_counts

    # large n: the paired interval is McNemar's normal one, diff +-1.96 sqrt(b+c-(b-c)^2/n)/n
    n, b, c = 10000, 500, 400
    paired = {"n": n, "both": 6000, "first_only": b, "second_only": c,
              "neither": n - 6000 - b - c}
    low, high = difference_interval(0, 0, 0, 0, paired)
    half = 1.959964 * np.sqrt(b + c - (b - c) ** 2 / n) / n
    assert low == pytest.approx(0.01 - half, abs=5e-4)
    assert high == pytest.approx(0.01 + half, abs=5e-4)
    # two classifiers that agree on most texts: paired is much narrower than independent
    independent = difference_interval(0.65, 0.64, n, n)
    assert independent[0] < low and independent[1] > high
    assert independent[0] < 0 < independent[1]  # +1 point on 10000 texts, unpaired: unclear
    assert low > 0  # paired: measurable
    counts = paired_counts(["a", "b", "a", "b"], ["a", "b", "b", "b"], ["a", "a", "a", "a"])
    assert counts == {"n": 4, "both": 1, "first_only": 2, "second_only": 1, "neither": 0}


def test_majority_share_of_a_test_file(tmp_path):
    from dpsynth.eval.utility import majority_share_of_file

    path = tmp_path / "test.csv"
    pd.DataFrame({"text": list("abcde"), "y": ["x", "x", "x", "z", "w"]}).to_csv(path,
                                                                                index=False)
    assert majority_share_of_file(path, "y") == pytest.approx(0.6)
    assert majority_share_of_file(path, "absent") is None
    assert majority_share_of_file(tmp_path / "missing.csv", "y") is None


def test_every_text_releasing_method_is_one_eval_evaluates() -> None:
    """`dpsynth eval` opens the release of every registered method that releases text (a
    dp_finetune run was refused: issue 45's side-by-side found it)."""
    from dpsynth.eval.release import TEXT_METHODS
    from dpsynth.methods import REGISTRY, method_class

    text = {name for name in REGISTRY if method_class(name).releases == "text"}
    assert text <= set(TEXT_METHODS), sorted(text - set(TEXT_METHODS))
    assert "dp_finetune" in text  # the registry is read, not an empty set
