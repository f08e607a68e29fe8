"""Step 1 of DP-SynRAG: K keywords per document, restricted to a PUBLIC vocabulary.

Why the vocabulary must be public: the histogram h = sum_d 1[w in keywords(d)] is released with
Gaussian noise over a FIXED coordinate set. If the coordinates (the vocabulary) were read off
the private documents, the mere presence of a rare word in the released key set would reveal
that some document contains it. So the vocabulary comes from outside the data:

* a list given in the config or a file (e.g. a public medical term list);
* ``"demo"``: the terms of :func:`dpsynth.demo_corpus.demo_knowledge` (the demo's public
  knowledge table, a function of the seed only, shipped with the package); ``"demo-diseases"``:
  its disease names only;
* ``"tokenizer"`` (default): whole-word tokens of the generator's tokenizer (alphabetic, at
  least 4 letters, not an English stop word). The tokenizer was trained long before and
  independently of the private data.

Each document contributes at most K distinct terms (indicator row with <= K ones), so the
histogram has L2 sensitivity sqrt(K) (docs/methods.md §4, step 1) whatever the LLM says.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ...config import ConfigError

log = logging.getLogger("dpsynth.rag")

_WORD = re.compile(r"[^\W\d_]+(?:['-][^\W\d_]+)*", re.UNICODE)
_SPLIT = re.compile(r"[,;\n|/\u2022*\t]+|\s+-\s+|\band\b|\d+[.)]\s*")
_LEAD = re.compile(r"^(?:keywords?|key words?|answer|output|here are[^:]*)\s*:\s*", re.I)
MAX_TERM_WORDS = 5


def normalise(term: str) -> str:
    """Lower-case, words only, single spaces: the form terms are matched in."""
    return " ".join(w.lower() for w in _WORD.findall(term))


def _stop_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    extra = {"patient", "patients", "doctor", "hello", "thanks", "thank", "please", "dear",
             "would", "like", "know", "need", "really", "also", "since", "feel", "feeling",
             "been", "have", "having", "days", "weeks", "week", "month", "months", "just"}
    return frozenset(ENGLISH_STOP_WORDS) | extra


class Vocabulary:
    """An ordered set of public terms (single or multi-word) with a normalised index; each
    term's first spelling in the public list is kept for prompts (``spellings``)."""

    def __init__(self, terms: Iterable[str], source: str) -> None:
        self.source = source
        self.terms: list[str] = []
        self.spellings: list[str] = []
        self.index: dict[str, int] = {}
        stops = _stop_words()
        for t in terms:
            n = normalise(str(t))
            if not n or n in self.index or n in stops or len(n.split()) > MAX_TERM_WORDS:
                continue
            self.index[n] = len(self.terms)
            self.terms.append(n)
            self.spellings.append(" ".join(str(t).split()))
        if not self.terms:
            raise ConfigError(f"synrag.vocabulary ({source}): no usable term")
        self.max_words = max(len(t.split()) for t in self.terms)

    def __len__(self) -> int:
        return len(self.terms)

    def find_in(self, text: str) -> list[int]:
        """Vocabulary terms occurring in ``text`` as whole words, in order of first occurrence
        (longer terms first at the same position)."""
        words = [w.lower() for w in _WORD.findall(text)]
        out: list[int] = []
        seen: set[int] = set()
        for i in range(len(words)):
            for n in range(min(self.max_words, len(words) - i), 0, -1):
                j = self.index.get(" ".join(words[i : i + n]))
                if j is not None and j not in seen:
                    seen.add(j)
                    out.append(j)
        return out


def tokenizer_terms(tokenizer: Any) -> list[str]:
    """Whole-word tokens of a BPE/SentencePiece tokenizer: alphabetic, >= 4 letters."""
    out = []
    for tok in tokenizer.get_vocab():
        text = tokenizer.convert_tokens_to_string([tok])
        if not text.startswith(" "):
            continue
        word = text[1:]
        if len(word) >= 4 and word.isascii() and word.isalpha() and word.islower():
            out.append(word)
    return sorted(set(out))


def demo_terms(seed: int = 0) -> list[str]:
    """Terms of the demo corpus' public knowledge table: disease and drug names, departments,
    symptom words."""
    from ...demo_corpus import demo_knowledge

    terms: list[str] = []
    for k in demo_knowledge(seed):
        terms += [k["disease"], k["drug"], k["department"]]
        for s in k["symptoms"]:
            terms += _WORD.findall(s)
    return terms


#: ``synrag.vocabulary`` values that name a built-in public vocabulary, not a file.
BUILT_IN_VOCABULARIES = ("demo", "demo-diseases", "tokenizer")


def load_vocabulary(spec: str | list[str], *, tokenizer: Any = None, demo_seed: int = 0,
                    base: Path | None = None) -> Vocabulary:
    """Build the public vocabulary from ``synrag.vocabulary`` (see the module docstring)."""
    if isinstance(spec, list):
        return Vocabulary(spec, "config list")
    if spec == "demo":
        return Vocabulary(demo_terms(demo_seed), "demo knowledge")
    if spec == "demo-diseases":
        from ...demo_corpus import demo_knowledge

        return Vocabulary([k["disease"] for k in demo_knowledge(demo_seed)], "demo diseases")
    if spec == "tokenizer":
        if tokenizer is None:
            raise ConfigError("synrag.vocabulary 'tokenizer' needs a local generator")
        return Vocabulary(tokenizer_terms(tokenizer), "tokenizer")
    path = Path(spec)
    if not path.is_absolute() and base is not None:
        path = base / path
    if not path.is_file():
        raise ConfigError(f"synrag.vocabulary: {spec!r} is not 'demo', 'demo-diseases', "
                          "'tokenizer' or a file")
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            terms = json.loads(text)
        except ValueError:
            raise ConfigError(f"{path}: not a valid JSON list of terms") from None
        if not isinstance(terms, list):
            raise ConfigError(f"{path}: expected a JSON list of terms")
        return Vocabulary([str(t) for t in terms], str(path))
    return Vocabulary(text.splitlines(), str(path))


def parse_keywords(raw: str, vocab: Vocabulary, k: int) -> list[int]:
    """Vocabulary ids of the keywords in a messy LLM answer, distinct, in order, at most k.

    Handles lists with commas, semicolons, bullets, numbering, quotes, a leading
    "Keywords:", sentences around the list: each piece is matched whole, else the vocabulary
    terms inside it are taken."""
    out: list[int] = []
    seen: set[int] = set()
    for piece in _SPLIT.split(raw or ""):
        piece = _LEAD.sub("", piece.strip().strip("\"'`[](){}.:"))
        if not piece:
            continue
        j = vocab.index.get(normalise(piece))
        ids = [j] if j is not None else vocab.find_in(piece)
        for i in ids:
            if i not in seen:
                seen.add(i)
                out.append(i)
                if len(out) >= k:
                    return out
    return out


def keyword_prompt(document: str, k: int) -> tuple[dict[str, str], ...]:
    """The chat prompt asking for K keywords of one document."""
    return (
        {"role": "system", "content": "You extract keywords. Answer with a comma-separated "
                                      "list of keywords only."},
        {"role": "user", "content": f"List the {k} most important keywords (diseases, "
                                    f"symptoms, treatments, topics) of this document.\n\n"
                                    f"Document: {document}"},
    )


def extract_keywords(
    documents: Sequence[str],
    vocab: Vocabulary,
    k: int,
    *,
    answer: Callable[[tuple[dict[str, str], ...]], str] | None = None,
    fill: str = "appearance",
) -> list[list[int]]:
    """K keyword ids per document: the LLM's vocabulary-restricted keywords (when ``answer``
    is given), topped up with vocabulary terms found in the document (in order of first
    occurrence, or of the public vocabulary list with ``fill="vocabulary_order"``). Never
    more than k.

    Rows apart: ``answer`` takes ONE document's prompt and returns the model's text for it,
    so the model never sees two documents in one pass, and a document's keywords are a
    function of its own text alone, whatever other documents exist or in which order. The
    sensitivity sqrt(K) of the keyword histogram rests on it (docs/methods.md §4, step 1): a
    batched pass (padding, length-sorted batches) let one added document change the
    keywords of others."""
    out: list[list[int]] = []
    for doc in documents:
        ids = parse_keywords(answer(keyword_prompt(doc, k)), vocab, k) if answer else []
        if len(ids) < k:
            have = set(ids)
            found = vocab.find_in(doc)
            if fill == "vocabulary_order":
                found = sorted(found)
            ids += [j for j in found if j not in have][: k - len(ids)]
        out.append(ids[:k])
    return out


def one_document_a_pass(generator: Any, max_new_tokens: int,
                        advance: Callable[[], None] = lambda: None
                        ) -> Callable[[tuple[dict[str, str], ...]], str]:
    """The ``answer`` of :func:`extract_keywords` on a generator: greedy decoding of one
    request per ``generate`` call (a batch of one: no padding, no other row), ``advance``
    called after each document (a progress bar)."""
    from ...llm import GenerationRequest, SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)

    def answer(prompt: tuple[dict[str, str], ...]) -> str:
        text = generator.generate([GenerationRequest(prompt, params)], progress=False)[0]
        advance()
        return text

    return answer
