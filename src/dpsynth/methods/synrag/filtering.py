"""Step 5 of DP-SynRAG: self-filtering (free post-processing: it reads only synthetic text).

The LLM is asked a YES/NO question about each synthetic document ("Does the following document
contain any specific diagnosis names? Answer only YES or NO."); the YES are kept. With a local
model the answer is read from the next-token logits (YES-like vs NO-like tokens), which is
robust for small models; with a remote one from a short greedy generation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...llm import GenerationRequest, SamplingParams
from ...llm.base import NextTokenScorer
from ...progress import bar

_YES = ("YES", "Yes", "yes", " YES", " Yes", " yes")
_NO = ("NO", "No", "no", " NO", " No", " no")


def filter_prompt(question: str, document: str) -> tuple[dict[str, str], ...]:
    """The YES/NO chat prompt for one synthetic document."""
    return ({"role": "user",
             "content": f"{question} Answer only YES or NO.\n\nDocument: {document}"},)


def _first_ids(gen: Any, words: Sequence[str]) -> list[int]:
    ids = {gen.encode(w)[0] for w in words if gen.encode(w)}
    return sorted(ids)


def parse_yes_no(text: str) -> bool:
    """True when a generated answer starts with yes (ignoring case and punctuation)."""
    m = re.search(r"[A-Za-z]+", text or "")
    return bool(m) and m.group(0).lower() in {"yes", "y"}


def self_filter(gen: Any, documents: Sequence[str], question: str,
                batch_size: int = 8, progress: bool = False) -> list[bool]:
    """Keep-flags for ``documents`` (empty documents are never kept); ``progress``: under a
    bar counting the synthetic texts."""
    keep = [False] * len(documents)
    todo = [i for i, d in enumerate(documents) if d.strip()]
    if not todo:
        return keep
    if isinstance(gen, NextTokenScorer):
        yes, no = _first_ids(gen, _YES), _first_ids(gen, _NO)
        with bar("self-filter (texts)", len(todo), progress) as advance:
            for s in range(0, len(todo), batch_size):
                idx = todo[s : s + batch_size]
                prompts = [gen.render(GenerationRequest(filter_prompt(question,
                                                                      documents[i])))[0]
                           for i in idx]
                logits = np.asarray(gen.next_token_logits(prompts))
                for row, i in zip(logits, idx, strict=True):
                    keep[i] = bool(row[yes].max() > row[no].max())
                advance(len(idx))
        return keep
    params = SamplingParams(temperature=0.0, max_new_tokens=3)
    answers = gen.generate([GenerationRequest(filter_prompt(question, documents[i]), params)
                            for i in todo], progress=progress)
    for i, a in zip(todo, answers, strict=True):
        keep[i] = parse_yes_no(a)
    return keep
