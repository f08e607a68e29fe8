"""The label check: a candidate must read as its own label, judged on public inputs only.

A small generator asked for a text of one label often writes one of another (SmolLM2-135M's
zero-shot Banking77 messages: 60 % match their intent by a classifier trained on real data,
79 % of those the check keeps).
A record votes among the candidates of its own label, so an off-label winner is released under
the wrong label and teaches a downstream classifier the wrong thing.

The check embeds each candidate and each value of a label column (its public description, or
its readable name) and keeps the candidate when its own value is among the ``top_k`` nearest
values. It reads synthetic texts and the public label domain only: it costs no budget.

It applies to a column only when the embedder separates that column's values at all: on the
candidates of the call, the share passing must beat chance by Cohen's kappa >= ``MIN_KAPPA``,
and significantly (a one-sided binomial test). The gate is decided once per generator, on the
first call with enough candidates to judge (:func:`enough_to_decide`), and then kept for the
run (the loop's checkpoint holds it, so a resumed run checks as the first attempt did);
before that no column is checked.
Sentiment-like columns ('4 stars' vs '5 stars') fail that gate and are left alone; checked on
them, the filter drops texts nearly at random (benchmarks/results/label_check.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from scipy.stats import binomtest

from ..embed.protocols import TextEmbedder

#: kappa of the candidates' agreement with their own label, over chance, below which a
#: column is not checked. Measured on SmolLM2's zero-shot candidates: Banking77 intents 0.58,
#: Yelp business category 0.65, Yelp stars 0.25 (label_check.md).
MIN_KAPPA = 0.3

#: and the agreement must beat chance by a one-sided binomial test at this level: a call of
#: a dozen candidates reaches kappa 0.3 by luck alone
GATE_P_VALUE = 0.01


def enough_to_decide(n_values: int) -> int:
    """Candidates a call needs before the gate of a column of ``n_values`` values is judged:
    30, and 3 per value."""
    return max(30, 3 * n_values)


def top_k_for(n_values: int) -> int:
    """How many nearest values may hold a candidate's own one: 1 up to 39 values, then one
    more per 20 (Banking77's 77 intents: 3; real records' own intent is within the 3
    nearest names for 80 % of them, the nearest for 62 %)."""
    return max(1, n_values // 20)


def own_ranks(candidates: np.ndarray, values: np.ndarray, own: np.ndarray) -> np.ndarray:
    """For each candidate (unit rows of ``candidates``), how many values (unit rows of
    ``values``) are strictly nearer than its own value ``own[i]`` by cosine: 0 = nearest."""
    sims = candidates @ values.T
    mine = sims[np.arange(len(candidates)), own]
    return (sims > mine[:, None]).sum(axis=1)


def kappa(passed: float, k: int, n_values: int) -> float:
    """Cohen's kappa of a pass share against the chance share ``k / n_values``."""
    chance = min(1.0, k / n_values)
    return 0.0 if chance >= 1.0 else (passed - chance) / (1.0 - chance)


class LabelCheck:
    """The check of one generation call: per label column, the values' embeddings and,
    decided on the call's first batch of candidates, whether the column is checked.

    ``domain``: column -> its values in declared order (public); ``value_text(column, value)``:
    what the embedder reads for a value; ``embedder``: the run's embedder (unit-norm vectors;
    its cache the vote then reads); ``gate``: column -> checked, decided by an
    earlier call (None: decide on this call's candidates)."""

    def __init__(self, domain: Mapping[str, Sequence[str]],
                 value_text: Callable[[str, str], str],
                 embedder: TextEmbedder, gate: Mapping[str, bool] | None = None) -> None:
        self.domain = {col: list(vals) for col, vals in domain.items() if len(vals) > 1}
        self.embedder = embedder
        self.values = {col: self.embed([value_text(col, v) for v in vals])
                       for col, vals in self.domain.items()}
        #: column -> checked; None until a call had enough candidates to judge
        self.gate: dict[str, bool] | None = dict(gate) if gate is not None else None
        #: column -> kappa of the call that decided the gate (for the run log)
        self.kappas: dict[str, float] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-norm vectors of ``texts`` by the run's embedder (no progress bar)."""
        return self.embedder.embed(list(texts), progress=False)

    def refused(self, texts: Sequence[str], labels: Sequence[Mapping[str, str]]
                ) -> np.ndarray:
        """A mask over ``texts``: True where the text fails a checked column (its own value
        not among the :func:`top_k_for` nearest)."""
        out = np.zeros(len(texts), dtype=bool)
        if not texts or not self.domain:
            return out
        vectors = self.embed(list(texts))
        fails = {}
        for col, vals in self.domain.items():
            index = {v: j for j, v in enumerate(vals)}
            own = np.array([index[lab[col]] for lab in labels], dtype=np.int64)
            fails[col] = own_ranks(vectors, self.values[col], own) >= top_k_for(len(vals))
        if self.gate is None and all(len(texts) >= enough_to_decide(len(vals))
                                     for vals in self.domain.values()):
            self.gate = {col: self._decide(col, f) for col, f in fails.items()}
        for col, f in fails.items():
            if self.gate is not None and self.gate.get(col, False):
                out |= f
        return out

    def _decide(self, col: str, fails: np.ndarray) -> bool:
        n_values = len(self.domain[col])
        chance = min(1.0, top_k_for(n_values) / n_values)
        passed = int(len(fails) - fails.sum())
        k = kappa(passed / len(fails), top_k_for(n_values), n_values)
        self.kappas[col] = round(k, 3)
        significant = binomtest(passed, len(fails), chance, alternative="greater"
                                ).pvalue < GATE_P_VALUE
        return bool(k >= MIN_KAPPA and significant)
