"""The DP-SynRAG paper's baselines (Table 1), research code outside the dpsynth package, so the
comparison can be rerun (``benchmarks/bench_medsynth.py``; the tests put this folder on the
path):

* :func:`rag_without_dp` -- RAG on the private store itself (NOT private; the upper line);
* :func:`no_rag` -- the generator alone;
* :func:`build_dp_synth_kb` -- DP-Synth (Amin et al. 2024): private prediction over random
  disjoint subsets, no clustering (each document in one subset: L = 1, whole budget on tokens);
* :func:`aug_pe_kb` -- an Aug-PE synthetic KB (``dpsynth.api.run_generation`` with method
  aug_pe; its release/synthetic.jsonl becomes the KB);
* :class:`DPRAG` -- query-time DP-RAG (Grislain 2025): every query runs a DP threshold
  retrieval over the private store and private prediction of the answer over the retrieved
  documents; the budget composes over queries and queries are refused once it is spent.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.config import ConfigError, RunConfig
from dpsynth.files import write_jsonl
from dpsynth.methods.base import Job, Method, Outcome, PrivacyPlan
from dpsynth.methods.synrag.accounting import calibrate_clip, cluster_events
from dpsynth.methods.synrag.config import SynRAGConfig, max_private_tokens
from dpsynth.methods.synrag.private_prediction import (
    DOC_MARK,
    predict_text,
    private_predict,
    split_prompt,
)
from dpsynth.methods.synrag.retrieval import THRESHOLD_GRID
from dpsynth.privacy import (
    Accountant,
    BudgetExceededError,
    ExponentialEvent,
    PrivacySession,
    ZCDPEvent,
    make_noise_source,
)
from dpsynth.rag.answer import SYSTEM, Answerer
from dpsynth.rag.index import KnowledgeBase, build_index
from dpsynth.run_folder import RunDir


def rag_without_dp(documents: Sequence[str], generator: Any, embedder: Any,
                   embeddings: np.ndarray | None = None, max_new_tokens: int = 48) -> Answerer:
    """RAG over the private documents themselves (no privacy at all)."""
    kb = KnowledgeBase.from_texts(documents, embedder, embeddings=embeddings)
    return Answerer(kb, generator, embedder, max_new_tokens=max_new_tokens)


def no_rag(generator: Any, embedder: Any = None, max_new_tokens: int = 48) -> Answerer:
    """The generator without retrieval."""
    return Answerer(None, generator, embedder, max_new_tokens=max_new_tokens)


def subset_of(text: str, subsets: int, seed: int) -> int:
    """A document's subset from a hash of its own text and a public seed: adding or removing
    one document never moves another (so the subsets compose in parallel)."""
    h = hashlib.sha256(f"{seed}\x00{text}".encode()).digest()
    return int.from_bytes(h[:8], "big") % subsets


class DPSynth(Method):
    """DP-Synth (Amin et al. 2024) as a method of the runner: synrag.clusters random disjoint
    subsets, one private-prediction document each (same prompt, T, tau; c calibrated to the
    whole target with L = 1); same self-filtering. A research baseline: not in the registry.

    With ``synrag.public_shortcut`` the texts are drawn by the SVT shortcut, which halts its
    private draws after m = max_private_tokens private tokens (the rest public, free): the
    m charged per subset are exactly the m that can be drawn (docs/methods.md §4).
    ``documents``: the private documents to use instead of the configured data's."""

    name = "dp_synth"
    releases = "knowledge_base"
    section = "synrag"
    config_model = SynRAGConfig

    def __init__(self, documents: Sequence[str] | None = None) -> None:
        self.documents = None if documents is None else list(documents)

    def plan(self, config: RunConfig, dataset: Any, run: RunDir) -> PrivacyPlan:
        scfg: SynRAGConfig = self.settings(config)
        eps, delta = config.privacy.epsilon, config.privacy.delta
        clip = calibrate_clip(eps, delta, lambda c: cluster_events(scfg, c, 1, retrieval=False))
        return PrivacyPlan("dp", None, "zcdp", (eps, delta), meta={"clip": clip},
                           notes={"clip": clip})

    def execute(self, job: Job) -> Outcome:
        from dpsynth.diagnostics import append_diagnostic
        from dpsynth.methods.synrag.filtering import self_filter
        from dpsynth.methods.synrag.pipeline import documents as private_documents
        from dpsynth.methods.synrag.pipeline import load_models

        config, run, main = job.config, job.run, job.session
        scfg: SynRAGConfig = self.settings(config)
        clip = float(job.plan.notes["clip"])
        docs = (self.documents if self.documents is not None
                else private_documents(config, job.dataset))
        generator, embedder = load_models(config, run,
                                          job.generators[0] if job.generators else None,
                                          job.embedder)
        store = job.store("subset-releases")
        m = scfg.clusters
        groups: list[list[str]] = [[] for _ in range(m)]
        for d in docs:
            groups[subset_of(d, m, config.privacy.seed)].append(d)
        # every subset's releases, charged once (parallel composition) before any is drawn
        main.record("dpsynth/subset_releases", cluster_events(scfg, clip, 1, retrieval=False),
                    {"subsets": m})
        texts = []
        for j, group in enumerate(groups):
            key = f"subset/{j:04d}"
            pred, n_private = predict_text(store, key, generator, group, scfg, clip)
            append_diagnostic(run, {"subset": j, "members": len(group),
                                    "truncated": pred.truncated, "private_tokens": n_private})
            texts.append(pred.text)
        keep = (self_filter(generator, texts, scfg.filter_question) if scfg.self_filter
                else [bool(t.strip()) for t in texts])
        rows = [{"id": j, "text": t} for j, (t, k) in enumerate(zip(texts, keep, strict=True))
                if k]
        write_jsonl(run.release / "synthetic_all.jsonl",
                    [{"id": j, "text": t, "kept": k}
                     for j, (t, k) in enumerate(zip(texts, keep, strict=True))])
        write_jsonl(run.release / "kb.jsonl", rows)
        build_index(run.release, [r["text"] for r in rows], embedder, config.embedder.model,
                    extra={"generator": config.generators[0].spec()})
        return Outcome({"subsets": m, "kb_passages": len(rows), "epsilon": None,
                        "delta": None, "clip": clip}, facts={"clip": clip, "subsets": m})

    def statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        cfg = job.config
        st = job.session.statement(cfg.privacy.unit, (cfg.privacy.epsilon, cfg.privacy.delta))
        st.update(method=self.name, clip=outcome.facts["clip"], subsets=outcome.facts["subsets"],
                  max_private_tokens_per_subset=max_private_tokens(self.settings(cfg)))
        return st


def build_dp_synth_kb(config: RunConfig | str | Path, output_dir: str | Path, *,
                      generator: Any = None, embedder: Any = None,
                      documents: Sequence[str] | None = None,
                      overrides: dict[str, Any] | None = None, resume: bool = False) -> Path:
    """Build (or resume) a DP-Synth KB through the runner (:class:`DPSynth`); generator and
    embedder default to the config's models."""
    from dpsynth.runner import RunOptions, run_method

    return run_method(config, output_dir, resume=resume, overrides=overrides,
                      method=DPSynth(documents), options=RunOptions(
                          progress=False, generators=None if generator is None else [generator],
                          embedder=embedder))


def aug_pe_kb(config: RunConfig | str | Path, output_dir: str | Path, *, embedder: Any,
              overrides: dict[str, Any] | None = None) -> Path:
    """An Aug-PE run whose release/synthetic.jsonl becomes a KB (kb.jsonl + kb.faiss)."""
    import json

    from dpsynth.api import run_generation

    root = run_generation(config, output_dir, overrides={"method": "aug_pe", **(overrides or {})},
                          progress=False)
    rel = Path(root) / "release"
    texts = [json.loads(line)["text"] for line in
             (rel / "synthetic.jsonl").read_text(encoding="utf-8").splitlines() if line]
    write_jsonl(rel / "kb.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    build_index(rel, texts, embedder, "minilm")
    return Path(root)


class DPRAG:
    """Query-time DP-RAG over the private store: each query costs
    rho_q = eps_theta^2 / 8 + (T / 2) (c / tau)^2, composed over queries in ``session``
    (with the total target); a query that would exceed it is refused before any release."""

    def __init__(self, documents: Sequence[str], embeddings: np.ndarray, generator: Any,
                 embedder: Any, session: PrivacySession, *, target_size: int, eps_theta: float,
                 tokens: int, clip: float, temperature: float = 1.0,
                 max_doc_tokens: int = 256) -> None:
        if session.target is None:
            raise ConfigError("DP-RAG needs a session with a total (epsilon, delta) target")
        self.documents = list(documents)
        self.embeddings = np.asarray(embeddings, dtype=np.float32)
        self.generator = generator
        self.embedder = embedder
        self.session = session
        self.target_size = target_size
        self.eps_theta = eps_theta
        self.tokens = tokens
        self.clip = clip
        self.temperature = temperature
        self.max_doc_tokens = max_doc_tokens
        self.queries = sum(1 for k in session.keys() if k.endswith("/threshold"))  # noqa: SIM118

    @staticmethod
    def per_query(epsilon: float, delta: float, queries: int, tokens: int,
                  temperature: float = 1.0, threshold_share: float = 0.1) -> tuple[float, float]:
        """(eps_theta, c) such that ``queries`` queries exactly use (epsilon, delta) in zCDP:
        the threshold gets ``threshold_share`` of each query's rho, the tokens the rest."""
        acc_rho = rho_for_epsilon(epsilon, delta)
        rho_q = acc_rho / queries
        eps_theta = math.sqrt(8 * threshold_share * rho_q)
        clip = temperature * math.sqrt(2 * (1 - threshold_share) * rho_q / tokens)
        return eps_theta, clip

    def query_events(self) -> list:
        return [ExponentialEvent(self.eps_theta, 1, "dprag_threshold"),
                ZCDPEvent(0.5 * (self.clip / self.temperature) ** 2, self.tokens,
                          "dprag_token")]

    def can_answer(self) -> bool:
        t_eps, t_delta = self.session.target  # type: ignore[misc]
        return self.session.accountant.epsilon_if_added(self.query_events(), t_delta) <= (
            t_eps * (1 + 1e-9))

    def ask(self, question: str, k: int | None = None) -> dict[str, Any]:
        """A DP answer (no private passage is ever returned); raises BudgetExceededError when
        the budget cannot pay for one more query."""
        if not self.can_answer():
            raise BudgetExceededError(
                f"DP-RAG budget spent after {self.queries} queries (epsilon "
                f"{self.session.epsilon():.3f} of {self.session.target[0]:g})")  # type: ignore
        key = f"q{self.queries:06d}"
        q = np.asarray(self.embedder.embed([question]), dtype=np.float32)[0]
        sims = self.embeddings @ q
        theta = self.session.exponential_threshold(
            f"{key}/threshold", sims, int(k or self.target_size), THRESHOLD_GRID, self.eps_theta,
            mode="grid", name="dprag_threshold")
        chosen = [self.documents[i] for i in np.flatnonzero(sims > theta)]
        parts = qa_parts(self.generator, question)
        pred = private_predict(self.session, key, self.generator, chosen, instruction="",
                               tokens=self.tokens, clip=self.clip,
                               temperature=self.temperature,
                               max_doc_tokens=self.max_doc_tokens, parts=parts)
        self.queries += 1
        return {"question": question, "answer": pred.text, "passages": [],
                "epsilon_spent": self.session.epsilon()}

    def ask_many(self, questions: Sequence[str], k: int | None = None) -> list[dict[str, Any]]:
        return [self.ask(q, k) for q in questions]


def qa_parts(gen: Any, question: str) -> tuple[str, str]:
    """(prefix, suffix) of DP-RAG's per-document prompt: document, then the question."""
    user = f"Answer the question using the document.\nDocument:\n{DOC_MARK}\n\nQuestion: {question}"
    return split_prompt(gen, user, "\nAnswer:", system=SYSTEM)


def rho_for_epsilon(epsilon: float, delta: float) -> float:
    """Largest zCDP rho whose CKS conversion is <= epsilon at delta."""
    from dpsynth.privacy import zcdp_to_eps_cks

    lo, hi = 0.0, max(1.0, epsilon)
    while zcdp_to_eps_cks(hi, delta) <= epsilon:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if zcdp_to_eps_cks(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def dprag_session(store_dir: Path, epsilon: float, delta: float, seed: int | None = None
                  ) -> PrivacySession:
    """A zCDP session with the DP-RAG total target; secure noise unless a seed is given
    (research mode)."""
    return PrivacySession(Path(store_dir), Accountant("zcdp"),
                          make_noise_source("seeded" if seed is not None else "secure", seed),
                          target=(epsilon, delta))
