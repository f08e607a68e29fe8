"""Step 4 of DP-SynRAG: private prediction of one synthetic document per cluster.

Each d in S_r gets the prompt p_d = "<instruction> Document: d". For token n,
z_n = sum_{d in S_r} clip_c(logits(p_d, y_<n)) and y_n ~ softmax(z_n / tau) over the FULL
vocabulary (no top-k / top-p): an exponential mechanism with per-coordinate sensitivity c,
rho = (1/2) (c / tau)^2 per token (METHODS.md section 4; the sampling and its accounting are
:meth:`dpsynth.privacy.PrivacySession.private_token`).

Speed: one forward pass per token for ALL documents of the cluster (a KV-cached
:class:`~dpsynth.llm.local.Stepper`), the shared instruction prefix computed once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..privacy import clip_logits

log = logging.getLogger("dpsynth.rag")

_MARK = "\u0000DOC\u0000"


def prompt_parts(gen: Any, instruction: str) -> tuple[str, str]:
    """(shared prefix, per-document suffix) of the rephrase prompt: the prompt of document d
    is prefix + d + suffix. The prefix ends with a newline (a token boundary)."""
    user = f"{instruction}\nDocument:\n{_MARK}"
    if getattr(gen, "supports_chat", False):
        text = str(gen.tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True))
    else:
        text = f"{user}\n\nRephrased document:\n"
    prefix, suffix = text.split(_MARK)
    return prefix, suffix


def truncate_documents(gen: Any, docs: Sequence[str], max_tokens: int) -> tuple[list[str], int]:
    """Documents cut to at most ``max_tokens`` tokens, and how many were cut (never dropped)."""
    out: list[str] = []
    cut = 0
    for d in docs:
        ids = gen.encode(d)
        if len(ids) > max_tokens:
            cut += 1
            out.append(gen.decode(ids[:max_tokens]))
        else:
            out.append(d)
    return out, cut


def clipped_sum(logits: np.ndarray, clip: float) -> np.ndarray:
    """z = sum over rows of clip_c(logits) (METHODS.md section 4)."""
    return np.asarray(clip_logits(np.asarray(logits, dtype=np.float64), clip)).sum(axis=0)


@dataclass(frozen=True)
class Prediction:
    """One synthetic document from private prediction."""

    text: str
    token_ids: list[int]
    steps: int  # private tokens drawn (<= T; EOS stops early)
    truncated: int  # documents truncated to max_doc_tokens


def private_predict(
    session: Any,
    key: str,
    gen: Any,
    documents: Sequence[str],
    *,
    instruction: str,
    tokens: int,
    clip: float,
    temperature: float,
    max_doc_tokens: int,
    parts: tuple[str, str] | None = None,
) -> Prediction:
    """Private prediction over ``documents`` (one cluster's S_r). Every token is a keyed
    release ``{key}/tok{n}`` in ``session`` (a resumed build replays stored tokens).

    With no documents z = 0: the tokens are uniform over the vocabulary (the same mechanism
    run on an empty set; its release is still made and charged). ``parts`` = (prefix, suffix)
    overrides the rephrase prompt (document i reads prefix + d_i + suffix)."""
    eos = set(getattr(gen, "eos_token_ids", (gen.eos_token_id,)))
    out: list[int] = []
    if not documents:
        z = np.zeros(int(gen.vocab_size))
        for n in range(tokens):
            tok = session.private_token(f"{key}/tok{n:04d}", z, clip, temperature)
            if tok in eos:
                return Prediction(gen.decode(out), out, n + 1, 0)
            out.append(int(tok))
        return Prediction(gen.decode(out), out, tokens, 0)
    docs, cut = truncate_documents(gen, documents, max_doc_tokens)
    if cut:
        log.info("%s: %d of %d documents truncated to %d tokens", key, cut, len(docs),
                 max_doc_tokens)
    prefix, suffix = parts if parts is not None else prompt_parts(gen, instruction)
    steps = 0
    with gen.open_stepper([d + suffix for d in docs], shared_prefix=prefix) as stepper:
        for n in range(tokens):
            z = clipped_sum(stepper.logits(), clip)
            tok = session.private_token(f"{key}/tok{n:04d}", z, clip, temperature)
            steps = n + 1
            if tok in eos:
                break
            out.append(int(tok))
            if n + 1 < tokens:
                stepper.advance(int(tok))
    return Prediction(gen.decode(out).strip(), out, steps, cut)


def separate_logit_sum(gen: Any, documents: Sequence[str], instruction: str,
                       clip: float, prefix_tokens: Sequence[int] = ()) -> np.ndarray:
    """Reference for tests: z at the next step computed document by document (one unbatched
    forward pass per document, no shared cache) after the tokens ``prefix_tokens``."""
    prefix, suffix = prompt_parts(gen, instruction)
    rows = [gen.encode_prompt(prefix) + gen.encode(d + suffix) + list(prefix_tokens)
            for d in documents]
    logits = np.concatenate([gen.next_token_logits_ids([r]) for r in rows])
    return clipped_sum(logits, clip)
