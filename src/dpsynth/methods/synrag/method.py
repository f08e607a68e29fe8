"""DP-SynRAG as a registered method (:class:`SynRAG`): the run, its privacy plan and its
release; the package docstring gives the order of the steps."""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ... import progress
from ...config import ConfigError, RunConfig
from ...diagnostics import append_diagnostic
from ...files import SHARED_MODE, write_jsonl
from ...llm.base import LogitsDtypeChoice, StepperEngineChoice, StepperSettingsKept
from ...on_shards import engine_of
from ...privacy.lattice import Lattice
from ...rag.grounding import garbled_reason
from ...run_folder import RunDir
from .. import canonical_name
from ..base import Job, Method, Outcome, PrivacyPlan
from .accounting import cluster_events, resolve_clip, theorem1_epsilon, theorem1_rho
from .clusters import (
    histogram_sigma,
    noise_floor,
    top_keywords,
)
from .config import (
    SynRAGConfig,
    check_stepper,
    check_vocabulary,
    choose_stepper,
    max_private_tokens,
    resolve_logits_dtype,
    synrag_dict,
)
from .pipeline import (
    Corpus,
    Notice,
    check_vocabulary_public,
    generate_clusters,
    load_models,
    resolve_vocabulary,
)
from .retrieval import centre_sigma

if TYPE_CHECKING:
    from ...data import Dataset

__all__ = ["SynRAG"]


class SynRAG(Method):
    """DP-SynRAG as a registered method; ``source`` (the config file, resolving a relative
    vocabulary path) and ``output_dir`` (refused as the vocabulary's home) are optional."""

    name = "synrag"
    private_passes = ("keywords", "embed", "logits")
    releases = "knowledge_base"
    section = "synrag"
    config_model = SynRAGConfig
    #: with compute.engine: ray the documents stay on the shard actors (keywords, clusters,
    #: embeddings, S_r): the driver gets partial statistics, the logit workers S_r's texts
    sharded_data: ClassVar[bool] = True

    def __init__(self, source: RunConfig | str | Path | None = None,
                 output_dir: str | Path | None = None) -> None:
        self.source = source
        self.output_dir = output_dir

    def check(self, config: RunConfig) -> None:
        if canonical_name(config.method) != self.name:
            raise ConfigError(
                f"method: {config.method!r} names another method, and this command builds a "
                "DP-SynRAG knowledge base: set method: synrag in the config (or run "
                f"`dpsynth generate` for {config.method!r})")
        scfg = self.settings(config)
        first = config.generators[0]
        if first.backend != "local":
            raise ConfigError(
                f"generators.0.backend {first.backend!r}: DP-SynRAG needs a local generator "
                "(backend: local): its private prediction reads next-token logits, which a "
                "server does not give (and on Ray shards one server could batch two documents "
                "together, docs/methods.md §4)")
        check_stepper(scfg.stepper, str(first.model))
        if self.source is None:
            check_vocabulary_public(config, self.output_dir)
        else:
            resolve_vocabulary(config, self.source, self.output_dir)
        if scfg.vocabulary != "tokenizer":  # public: a missing or empty list fails here,
            check_vocabulary(scfg.vocabulary, config.data.demo_seed)  # before any charge

    def plan(self, config: RunConfig, dataset: Dataset, run: RunDir) -> PrivacyPlan:
        """The clip c calibrated so that Theorem 1 meets the (epsilon, delta) target."""
        scfg = self.settings(config)
        eps, delta = config.privacy.epsilon, config.privacy.delta
        if len(dataset) == 0:
            raise ConfigError("the private data has no records")
        clip = resolve_clip(scfg, eps, delta)
        return PrivacyPlan("dp", None, "zcdp", (eps, delta), meta={"clip": clip},
                           notes={"clip": clip})

    def execute(self, job: Job) -> Outcome:
        started = time.time()
        scfg: SynRAGConfig = self.settings(job.config)
        clip = float(job.plan.notes["clip"])
        note = Notice(job.run, job.echo)
        corpus, gen, emb_model = self._corpus_and_models(job)
        kept = (gen.stepper_settings_kept() if isinstance(gen, StepperSettingsKept)
                else contextlib.nullcontext())
        with kept:  # a generator passed in comes back with its own stepper settings
            self._set_stepper(gen, scfg, note)
            return self._build(job, scfg, clip, note, started, corpus, gen, emb_model)

    def _build(self, job: Job, scfg: SynRAGConfig, clip: float, note: Notice, started: float,
               corpus: Corpus, gen: Any, emb_model: Any) -> Outcome:
        """Steps 1-5 on the loaded documents and models (the package docstring's order)."""
        from ...rag.index import build_index
        from .filtering import self_filter
        from .keywords import load_vocabulary

        cfg, run, main = job.config, job.run, job.session
        vocab = load_vocabulary(scfg.vocabulary, tokenizer=getattr(gen, "tokenizer", None),
                                demo_seed=cfg.data.demo_seed)
        note(f"{self.name}: vocabulary of {len(vocab)} public terms ({vocab.source}), "
             f"clip c = {clip:.5g}")
        n_docs = corpus.n_documents()
        note.private(f"{n_docs} private documents", documents=n_docs)
        store = job.store("cluster-releases")

        # 1. keywords (kept with the documents) and the noisy histogram
        progress.stage("keywords and histogram")
        noisy, sigma_h, seeds = _keyword_histogram(job, scfg, corpus, gen, vocab, note)
        if len(seeds):
            # 2-4. all cluster releases, charged once by overlapping composition
            main.record("synrag/cluster_releases", cluster_events(scfg, clip),
                        {"clusters": int(len(seeds))})
        progress.stage("clusters and private prediction")
        sizes = corpus.cluster(seeds, scfg.overlap)  # exact |C_r|: diagnostics only
        if len(seeds):
            corpus.embed(_embedder(cfg, run, emb_model, job.embedder, corpus), job.progress)
        results = generate_clusters(cfg, scfg, run, store, gen, corpus, sizes, seeds, vocab,
                                    noisy, clip, note, job.progress)

        # 5. self-filtering (post-processing)
        progress.stage("self-filter and release")
        texts = [r["text"] for r in results]
        keep = (self_filter(gen, texts, scfg.filter_question, progress=job.progress)
                if scfg.self_filter else [bool(t.strip()) for t in texts])
        rows, dropped = _write_release(run, scfg, results, keep, note)
        build_index(run.release, [r["text"] for r in rows], emb_model, cfg.embedder.model,
                    extra={"generator": cfg.generators[0].spec(),
                           "answer_max_new_tokens": scfg.answer_max_new_tokens,
                           "retrieve": scfg.retrieve})
        if results and not rows:
            note(_empty_kb(scfg, len(results)), warn=True)
        # wall time depends on the private data (document count, cluster sizes): operator only
        append_diagnostic(run, {"wall_seconds": round(time.time() - started, 1)})
        summary = {"clusters": len(results), "kb_passages": len(rows),
                   "garbled_dropped": dict(sorted(dropped.items())), "epsilon": None,
                   "delta": cfg.privacy.delta, "clip": clip, "warnings": note.messages}
        return Outcome(summary, facts={"sigma_h": sigma_h, "clip": clip},
                       message=f"{len(rows)} of {len(results)} synthetic documents kept")

    def _corpus_and_models(self, job: Job) -> tuple[Corpus, Any, Any]:
        """The documents (on the Ray shards, or in this process), the generator and the
        embedder."""
        cfg = job.config
        engine = engine_of(job.dataset)
        corpus = (Corpus.on_shards(engine) if engine is not None and engine.engine == "ray"
                  else Corpus.in_process(cfg, job.dataset, job.run))
        gen, emb_model = load_models(cfg, job.run,
                                     job.generators[0] if job.generators else None, job.embedder)
        return corpus, gen, emb_model

    def _set_stepper(self, gen: Any, scfg: SynRAGConfig, note: Notice) -> None:
        """The private prediction's dtype and engine (``synrag.logits_dtype``, ``.stepper``)."""
        if isinstance(gen, LogitsDtypeChoice):
            gen.set_logits_dtype(resolve_logits_dtype(scfg.logits_dtype))
        if isinstance(gen, StepperEngineChoice):
            note(f"{self.name}: private prediction on {choose_stepper(gen, scfg.stepper)}")

    def statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """The zCDP accountant's (epsilon, delta) with Theorem 1's planned total."""
        cfg = job.config
        scfg: SynRAGConfig = self.settings(cfg)
        eps, delta = cfg.privacy.epsilon, cfg.privacy.delta
        clip, sigma_h = outcome.facts["clip"], outcome.facts["sigma_h"]
        rho = theorem1_rho(scfg.keywords_per_doc, sigma_h, scfg.overlap, scfg.eps_theta,
                           centre_sigma(scfg.rho_centre), max_private_tokens(scfg), clip,
                           scfg.temperature,
                           scfg.svt_epsilon if scfg.public_shortcut else 0.0)
        statement = job.session.statement("record" if cfg.privacy.unit == "record" else "user",
                                          (eps, delta))
        statement.update(
            method=self.name, clip=clip,
            theorem1={"rho_planned": rho, "epsilon_planned_standard": theorem1_epsilon(rho, delta),
                      "rho_spent": job.session.accountant.rho()},
            synrag=synrag_dict(scfg),
            note="record = one document (one user's joined records with unit 'user'); "
                 "per-cluster releases composed by overlapping parallel composition over L",
        )
        return statement


def _llm(cfg: RunConfig, scfg: SynRAGConfig, gen: Any, corpus: Corpus) -> Any:
    """The keyword extractor's generator factory (None: vocabulary matching only): on Ray the
    shards load the configured model themselves (or get the given generator)."""
    if scfg.keyword_extractor != "llm":
        return None
    if corpus.sharded:
        from .ray_prediction import generator_factory

        return generator_factory(cfg, gen)
    return lambda: gen


#: how the build's note names each reason a passage was dropped as garbled
GARBLED = {"loop": "a loop of repeated words", "non-words": "mostly non-words",
           "too short": "under five words"}


def _keyword_histogram(job: Job, scfg: SynRAGConfig, corpus: Corpus, gen: Any, vocab: Any,
                       note: Notice) -> tuple[np.ndarray, float, np.ndarray]:
    """Step 1: the documents' keywords (kept with them), the noisy keyword histogram released
    and charged in the run's session, and the seeds above the noise floor; returns (noisy
    histogram, sigma_h, seeds)."""
    cfg, run = job.config, job.run
    k = scfg.keywords_per_doc
    tag = [job.fingerprint, vocab.source, len(vocab), k, scfg.keyword_extractor,
           scfg.keyword_fill]
    hist = corpus.keyword_histogram(vocab, scfg, tag, _llm(cfg, scfg, gen, corpus),
                                    job.progress)
    sigma_h = histogram_sigma(k, scfg.rho_hist)
    noisy = np.asarray(job.session.gaussian("synrag/keyword_histogram", hist, math.sqrt(k),
                                            sigma_h, name="keyword_histogram",
                                            lattice=Lattice.counts(k)))
    floor = (scfg.min_noisy_count if scfg.min_noisy_count is not None
             else noise_floor(sigma_h, len(vocab)))
    seeds = top_keywords(noisy, scfg.clusters, floor)
    run.append_stats({"iteration": 0, "stage": "histogram", "sigma_h": sigma_h,
                      "noise_floor": floor, "seeds": len(seeds),
                      "top": [[vocab.terms[int(j)], round(float(noisy[j]), 2)]
                              for j in seeds[:20]]})
    if len(seeds) == 0:
        note(f"keyword histogram: nothing above noise (no noisy count reaches "
             f"{floor:.1f} = sigma_h sqrt(2 ln |V|)); no cluster is formed and the KB is "
             "empty. Only the histogram was released and charged. More documents, a "
             "vocabulary closer to the documents or a larger synrag.rho_hist would help.",
             warn=True)
    return noisy, sigma_h, seeds


def _write_release(run: RunDir, scfg: SynRAGConfig, results: list[dict[str, Any]],
                   keep: list[bool], note: Notice) -> tuple[list[dict[str, Any]], Counter[str]]:
    """Drop garbled passages (``synrag.drop_garbled``) from those ``keep`` kept, and write
    release/synthetic_all.jsonl (every passage, marked) and kb.jsonl (the kept ones);
    returns (the KB's rows, the count of passages dropped as garbled by reason)."""
    texts = [r["text"] for r in results]
    garbled = [garbled_reason(t) if scfg.drop_garbled and kp else None
               for t, kp in zip(texts, keep, strict=True)]
    keep = [kp and g is None for kp, g in zip(keep, garbled, strict=True)]
    dropped = Counter(g for g in garbled if g is not None)
    if dropped:
        note(f"dropped {sum(dropped.values())} of {len(results)} synthetic passages as "
             "garbled: " + ", ".join(f"{n} {GARBLED[why]}" for why, n in
                                    sorted(dropped.items())), warn=True)
    rows = [{"id": r["cluster"], "text": r["text"], "keyword": r["keyword"]}
            for r, kp in zip(results, keep, strict=True) if kp]
    write_jsonl(run.release / "synthetic_all.jsonl",
                [{**r, "kept": bool(kp), **({"garbled": g} if g else {})}
                 for r, kp, g in zip(results, keep, garbled, strict=True)],
                mode=SHARED_MODE)
    write_jsonl(run.release / "kb.jsonl", rows, mode=SHARED_MODE)
    return rows, dropped


def _empty_kb(scfg: SynRAGConfig, n_results: int) -> str:
    """The warning of a build whose knowledge base kept none of its ``n_results`` texts."""
    return ("the knowledge base is EMPTY: "
            + ("self-filtering kept none of the " if scfg.self_filter else "none of the ")
            + f"{n_results} synthetic texts. To change: "
            + ("synrag.self_filter: false (the default; the filter is unreliable on "
               "small models), " if scfg.self_filter else "")
            + "more documents per cluster (a larger synrag.target_size or fewer "
            "synrag.clusters), fewer private tokens (synrag.tokens, or "
            "synrag.public_shortcut) or a larger privacy.epsilon, so that the clip c "
            "grows; `rag build --require-passages` makes this an error")


def _embedder(cfg: RunConfig, run: RunDir, emb_model: Any, given: Any, corpus: Corpus) -> Any:
    """The embedder factory of the documents' shards: this process's embedder, or on Ray the
    given one shipped as is, else the configured model built on each shard."""
    if not corpus.sharded:
        return lambda: emb_model
    from ...compute.ray_engine import EmbedderSpec, GivenEmbedder

    if given is not None:
        return GivenEmbedder(given)
    return EmbedderSpec(cfg.embedder.model, str(run.private / "embed-cache"),
                        cfg.embedder.batch_size)
