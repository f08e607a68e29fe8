"""Whether a RAG answer stays within its sources, and whether a synthetic passage reads as
text: public checks on released passages and generated answers (no private record).

:func:`unsupported_terms` lists the content words of an answer that neither the retrieved
passages nor the question contain (a disease the passages never name, say): the answer is
flagged as unsupported. :func:`garbled_reason` says why a synthetic passage is not text (a
loop of repeated words, mostly non-words, too short), for the build to drop it and say so.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

_WORD = re.compile(r"[a-z][a-z'-]*")
#: words an answer may use without a source: how answers are worded, not what they claim
_ANSWER_WORDS = frozenset({
    "likely", "probably", "possibly", "might", "could", "would", "should", "based",
    "answer", "question", "document", "documents", "passage", "given", "information",
    "provided", "according", "suggests", "suggest", "indicates", "indicate", "seems",
    "appears", "condition", "diagnosis", "symptoms", "patient", "recommend", "recommended",
    "doctor", "consult", "treatment", "help", "helps", "sure", "unknown", "unclear",
    "cause", "causes", "caused", "sounds", "feel", "feeling", "experience", "experiencing",
    "have", "having", "case", "related", "usually", "common", "sign", "signs",
})


def content_words(text: str) -> list[str]:
    """The words of ``text`` that carry its claim: four letters or more, not a stop word or
    an answer's wording (:data:`_ANSWER_WORDS`), lower-case, in order, once each."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        w = w.strip("'-")
        if len(w) >= 4 and w not in ENGLISH_STOP_WORDS and w not in _ANSWER_WORDS \
                and w not in out:
            out.append(w)
    return out


def unsupported_terms(answer: str, passages: Sequence[str], question: str = "") -> list[str]:
    """Content words of ``answer`` found in none of ``passages`` nor the ``question`` (a
    word counts as found when a source holds it or its first five letters start a source
    word: 'infections' is supported by 'infection')."""
    source = set(_WORD.findall(" ".join([*passages, question]).lower()))
    stems = {w[:5] for w in source if len(w) >= 5}
    return [w for w in content_words(answer)
            if w not in source and not (len(w) >= 5 and w[:5] in stems)]


def garbled_reason(text: str) -> str | None:
    """Why a synthetic passage is not text, or None when it reads as text: ``"loop"`` (a
    three-word sequence repeated three times or more), ``"non-words"`` (under half of its
    tokens are words of letters) or ``"too short"`` (under five words)."""
    tokens = text.split()
    if len(tokens) < 5:
        return "too short"
    words = [t.lower() for t in tokens if _WORD.fullmatch(t.lower().strip(".,;:!?\"'()"))]
    if len(words) < 0.5 * len(tokens):
        return "non-words"
    trigrams = Counter(zip(words, words[1:], words[2:], strict=False))
    if trigrams and max(trigrams.values()) >= 3:
        return "loop"
    return None
