"""Next-token sampling from a batch of logits, one seeded uniform per row and step.

Used by the OpenVINO generation engine (:mod:`dpsynth.llm.ov_generate`); the semantics are
those of :class:`~dpsynth.llm.base.SamplingParams` on every local engine:

* ``temperature == 0``: greedy (the most likely token, the lowest id on a tie);
* ``top_k > 0``: the ``k`` most likely tokens, their probabilities renormalised, then top-p
  within them (as transformers and CTranslate2 apply the two);
* ``top_k == 0`` and ``top_p < 1``: top-p over the whole vocabulary's probabilities (the
  smallest set of most likely tokens whose mass reaches ``top_p``), cut at
  :data:`TOPP_CANDIDATES` tokens where the nucleus would be larger;
* ``top_k == 0`` and ``top_p == 1``: the whole vocabulary.

A row's token is the inverse of its candidates' cumulative distribution at one uniform draw
from the row's own generator, so a row's tokens follow its seed and its logits only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import SamplingParams

#: Top-p without top-k keeps at most this many most likely tokens (both engines).
#: CTranslate2 sorts the whole vocabulary per row and step for top-p alone, which makes
#: sampling 2.6x slower there; it then takes the nucleus over the candidates' renormalised
#: mass. Measured on SmolLM2 chat outputs: the mass left outside the top 1024 is 0.3 % on
#: average at temperature 0.8 (1.6 % at 1.0), so the cut matters only at rare flat steps.
#: Plain temperature sampling (top_p = 1, the config default) and an explicit top_k are exact.
TOPP_CANDIDATES = 1024
#: Candidates looked at first for top-p without top-k: rows whose nucleus is larger go to
#: :data:`TOPP_CANDIDATES` (a top-k of 64 over SmolLM2's 49152 logits costs a quarter of one
#: of 1024).
FIRST_LOOK = 64


def nucleus(probs: np.ndarray, top_p: float) -> int:
    """How many of ``probs`` (sorted, most likely first; summing to 1 when renormalised, to
    less when cut from the whole vocabulary) the nucleus keeps: the fewest whose sum reaches
    ``top_p``, all of them where none does."""
    if top_p >= 1:
        return len(probs)
    cum = np.cumsum(probs, dtype=np.float64)
    return min(int(np.searchsorted(cum, top_p)) + 1, len(probs))


def draw(probs: np.ndarray, u: float) -> int:
    """Index of the candidate the uniform ``u`` in [0, 1) picks (inverse CDF of ``probs``,
    which need not sum to 1)."""
    cum = np.cumsum(probs, dtype=np.float64)
    return min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(probs) - 1)


def scaled(logits: Any, temperature: float, scratch: bool = False) -> Any:
    """``logits / temperature`` as float32 (the same numbers whichever way): in place when
    ``scratch`` (the caller's buffer, overwritten), the logits themselves at temperature 1
    (division by 1 is exact), else a new tensor."""
    z = logits.float()
    if temperature == 1:
        return z
    if scratch and z is logits:
        return z.div_(temperature)
    return z / temperature


def candidates(logits: Any, params: SamplingParams,
               scratch: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row of ``logits`` (torch ``[B, V]``): the candidate token ids, most likely first, and
    their probabilities (float64, not renormalised), following the module docstring.
    ``scratch``: the logits may be overwritten (see :func:`scaled`)."""
    import torch

    z = scaled(logits, params.temperature, scratch)
    vocab = z.shape[-1]
    if params.top_k:
        v, ix = torch.topk(z, min(params.top_k, vocab), dim=-1)
        probs = torch.softmax(v, dim=-1).double().numpy()
        return _cut(probs, ix.numpy(), params.top_p)
    if params.top_p >= 1:
        probs = torch.softmax(z, dim=-1).double().numpy()
        ids = np.arange(vocab)
        return [(ids, row) for row in probs]
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    v, ix = torch.topk(z, min(FIRST_LOOK, vocab), dim=-1)
    probs = torch.exp(v - lse).double().numpy()
    rows = _cut(probs, ix.numpy(), params.top_p)
    wide = [i for i, p in enumerate(probs) if p.sum() < params.top_p and vocab > FIRST_LOOK]
    if wide:
        sel = torch.as_tensor(wide)
        v, ix = torch.topk(z[sel], min(TOPP_CANDIDATES, vocab), dim=-1)
        more = _cut(torch.exp(v - lse[sel]).double().numpy(), ix.numpy(), params.top_p)
        for i, row in zip(wide, more, strict=True):
            rows[i] = row
    return rows


def _cut(probs: np.ndarray, ids: np.ndarray, top_p: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's nucleus: (ids, probabilities) of its first :func:`nucleus` candidates."""
    out = []
    for p, i in zip(probs, ids, strict=True):
        n = nucleus(p, top_p)
        out.append((i[:n], p[:n]))
    return out


def next_tokens(logits: Any, params: SamplingParams, rngs: list[np.random.Generator],
                scratch: bool = False) -> np.ndarray:
    """The next token of every row (int64 ``[B]``): greedy at temperature 0, else one uniform
    from each row's generator in ``rngs`` through :func:`candidates` and :func:`draw`
    (``scratch``: the logits may be overwritten)."""
    import torch

    if params.temperature <= 0:
        return torch.argmax(logits.float(), dim=-1).numpy().astype(np.int64)
    out = np.empty(len(rngs), dtype=np.int64)
    rows = candidates(logits, params, scratch)
    for r, ((ids, probs), rng) in enumerate(zip(rows, rngs, strict=True)):
        out[r] = int(ids[draw(probs, float(rng.random()))])
    return out
