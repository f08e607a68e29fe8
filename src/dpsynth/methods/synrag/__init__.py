"""DP-SynRAG, the build side (docs/methods.md §4): a differentially private synthetic knowledge
base. `dpsynth rag build CONFIG --output DIR` runs it through the one runner; serving the KB
(``dpsynth.rag.index`` / ``answer`` / ``service``) is separate and spends nothing.

Order: keywords (LLM, public vocabulary) -> noisy histogram -> soft clusters -> per cluster:
noisy centre, threshold, private prediction (checkpointed) -> self-filtering -> release/
(kb.jsonl, kb.faiss, synthetic_all.jsonl; the runner adds privacy.json and summary.json) and
stats.jsonl.

Where the documents are: a :class:`~dpsynth.methods.synrag.pipeline.Corpus`, one document
shard in this process (engine local) or the Ray shard actors (engine ray, the driver never
opens the private file): steps 1-3 run on the shards, which return exact partial statistics,
and the logit workers fetch S_r's texts from them (docs/methods.md §4).

Accounting: the histogram is a keyed release in the run's session; the per-cluster releases
are charged once there as overlapping(event, L) (Theorem 1) BEFORE any cluster noise is drawn,
and every cluster's draws are keyed in a second store (``private/cluster-releases``), so a
killed build resumes with the same noise and no extra charge.
"""

# SynRAG (and what it pulls in: the accountant, dp_accounting) loads on first use (PEP 562):
# a Ray logit worker or shard that needs only the private prediction does not import it.

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .method import SynRAG
    from .pipeline import check_vocabulary_public

__all__ = ["SynRAG", "check_vocabulary_public"]

_WHERE = {"SynRAG": "method", "check_vocabulary_public": "pipeline"}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
