"""The public candidate set of DP-SynRAG's private tokens (docs/methods.md §4, step 4).

Each private token is drawn from softmax(z_n / tau) over a set S_n of token ids fixed BEFORE
any private document is looked at, from public inputs and released values only:

* the top ``support_top`` tokens of the generator's next-token distribution given the rephrase
  instruction with NO document and the tokens released so far (a batch of its own, so its
  numbers depend on nothing private);
* every token of the public keyword vocabulary's terms, in the forms a text writes them
  (as is, capitalised, lower case, each with and without a leading space): the fictional
  disease names a public model cannot know are there;
* the tokens of the cluster's released keyword (released by the noisy histogram);
* the end-of-text tokens (a text can end).

Choosing S_n is post-processing of (public inputs, earlier releases), so the token is the
exponential mechanism over the fixed outcome set S_n: same sensitivity c, same charge
(1/2)(c/tau)^2 as over the whole vocabulary (:meth:`dpsynth.privacy.PrivacySession.
private_token` with ``support``). A set read from a private document's own logits would not
be: its membership would leak the document.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


def term_forms(term: str) -> list[str]:
    """The spellings of a vocabulary term a text may contain: as is, Capitalised, Title Case
    and lower case, each with and without a leading space."""
    forms = {term, term[:1].upper() + term[1:], term.title(), term.lower()}
    return sorted({f for t in forms for f in (t, " " + t)})


def term_token_ids(gen: Any, terms: Iterable[str]) -> np.ndarray:
    """Sorted distinct token ids of every form (:func:`term_forms`) of ``terms``."""
    ids: set[int] = set()
    for term in terms:
        term = str(term).strip()
        if term:
            for form in term_forms(term):
                ids.update(int(i) for i in gen.encode(form))
    vocab = int(gen.vocab_size)
    return np.asarray(sorted(i for i in ids if 0 <= i < vocab), dtype=np.int64)


def top_tokens(logits: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` largest entries of a logit row (ties to the lower id), sorted by id."""
    row = np.asarray(logits, dtype=np.float64).ravel()
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    k = min(k, row.size)
    order = np.lexsort((np.arange(row.size), -row))[:k]
    return np.sort(order).astype(np.int64)


@dataclass(frozen=True)
class Support:
    """The fixed part of one text's candidate set (vocabulary, keyword, end-of-text ids) and
    how many public top tokens join it at each step."""

    fixed: np.ndarray  # sorted distinct ids
    top: int

    def at(self, public_logits: np.ndarray | None) -> np.ndarray:
        """S_n: the fixed ids and the top tokens of the public next-token logits (one row,
        from the prompt without any document). Sorted distinct ids."""
        if public_logits is None or self.top == 0:
            return self.fixed
        return np.union1d(self.fixed, top_tokens(public_logits, self.top)).astype(np.int64)


def make_support(gen: Any, vocabulary_ids: np.ndarray, keyword: str | None,
                 top: int) -> Support:
    """The :class:`Support` of one cluster's text: ``vocabulary_ids`` (:func:`term_token_ids`
    of the public vocabulary, or empty), the tokens of ``keyword`` (its released seed term)
    and the end-of-text ids."""
    eos = np.asarray([int(e) for e in getattr(gen, "eos_token_ids", (gen.eos_token_id,))],
                     dtype=np.int64)
    fixed = np.union1d(np.asarray(vocabulary_ids, dtype=np.int64), eos)
    if keyword:
        fixed = np.union1d(fixed, term_token_ids(gen, [keyword]))
    return Support(fixed.astype(np.int64), int(top))


def support_logits(stepper: Any, ids: np.ndarray | None) -> np.ndarray:
    """The stepper's rows at the candidate ``ids`` (all ids when None): through the
    stepper's ``logits_at`` (only those rows of the output layer), else by indexing."""
    if ids is None:
        return stepper.logits()
    at = getattr(stepper, "logits_at", None)
    if callable(at):
        return at(ids)
    return np.asarray(stepper.logits())[:, ids]


def disease_token_share(gen: Any, texts: Sequence[str], names: Sequence[str],
                        support: np.ndarray) -> float:
    """Share of the tokens spelling ``names[i]`` inside ``texts[i]`` (as tokenised in the
    text) that lie in ``support`` (a benchmark measure of the candidate set; texts without
    their name are skipped)."""
    inside = total = 0
    sup = set(np.asarray(support, dtype=np.int64).tolist())
    for text, name in zip(texts, names, strict=True):
        pos = text.lower().find(name.lower())
        if pos < 0:
            continue
        before = gen.encode(text[:pos].rstrip())
        whole = gen.encode(text[:pos + len(name)])
        span = whole[len(before):] if whole[:len(before)] == before else gen.encode(" " + name)
        total += len(span)
        inside += sum(int(t) in sup for t in span)
    return inside / total if total else float("nan")
