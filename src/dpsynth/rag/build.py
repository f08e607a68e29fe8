"""The DP-SynRAG pipeline (docs/methods.md §4): `dpsynth rag build CONFIG --output DIR`.

Order: config -> data -> planned accounting (c calibrated) -> keywords (LLM, public
vocabulary) -> noisy histogram -> soft clusters -> per cluster: noisy centre, threshold,
private prediction (checkpointed) -> self-filtering -> release/ (kb.jsonl, kb.faiss,
privacy.json, summary.json) and stats.jsonl.

Accounting: the histogram is a keyed release in the run's session; the per-cluster releases
are charged once there as overlapping(event, L) (Theorem 1) BEFORE any cluster noise is drawn,
and every cluster's draws are keyed in a second store (``private/cluster-releases``), so a
killed build resumes with the same noise and no extra charge. Every planned cluster release is
made, even for an empty cluster (its output is then pure noise): skipping a release because a
cluster is empty would depend on the private data. What release/ and stats.jsonl hold is
DP output only (noisy counts, thresholds, synthetic text); exact cluster sizes stay in
``private/diagnostics.jsonl``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ConfigError, RunConfig
from ..diagnostics import append_diagnostic
from ..runs import RunDir, atomic_write_json, write_jsonl
from .accounting import cluster_events, resolve_clip, theorem1_epsilon, theorem1_rho
from .clusters import histogram_sigma, keyword_counts, noise_floor, soft_clusters, top_keywords
from .config import SynRAGConfig, max_private_tokens, parse_synrag, synrag_dict
from .filtering import self_filter
from .keywords import extract_keywords, load_vocabulary
from .private_prediction import Shortcut, private_predict, private_predict_shortcut
from .retrieval import centre_sigma, retrieve_in_cluster

log = logging.getLogger("dpsynth.rag")

METHOD = "dp_synrag"


class Notice:
    """Operator messages. Public ones (functions of released values and public inputs) go to
    the logger or ``echo``, the run's log.txt and, as warnings, summary.json; :meth:`private`
    ones (exact facts about the private data) go to ``echo`` or the logger and to
    private/diagnostics.jsonl only (docs/methods.md §6)."""

    def __init__(self, run: RunDir, echo: Callable[[str], None] | None) -> None:
        self.run = run
        self.echo = echo
        self.messages: list[str] = []

    def __call__(self, message: str, warn: bool = False) -> None:
        self.run.log(message)
        if self.echo is None:
            (log.warning if warn else log.info)(message)
        if warn:
            self.messages.append(message)
        if self.echo is not None:
            self.echo(message)

    def private(self, message: str, warn: bool = False, **record: Any) -> None:
        """An exact fact about the private data: operator only (never log.txt or release/)."""
        append_diagnostic(self.run, {"message": message, "warning": warn, **record})
        if self.echo is not None:
            self.echo(f"[private] {message}")
        else:
            (log.warning if warn else log.info)("[private] %s", message)


def _resolve_vocabulary(cfg: RunConfig, config: RunConfig | str | Path,
                        output_dir: str | Path | None = None) -> None:
    """A vocabulary file named in the config is relative to the config file's folder (set in
    place, so the stored config.yaml holds the absolute path); then
    :func:`check_vocabulary_public`."""
    voc = cfg.synrag.get("vocabulary")
    if (not isinstance(config, RunConfig) and isinstance(voc, str)
            and voc not in ("demo", "tokenizer") and not Path(voc).is_absolute()):
        cfg.synrag["vocabulary"] = str((Path(config).parent / voc).resolve())
    check_vocabulary_public(cfg, output_dir)


def check_vocabulary_public(cfg: RunConfig, output_dir: str | Path | None = None) -> None:
    """Refuse a vocabulary file that is (or lies inside) the private data or a run's private
    area: the histogram's coordinates must be public input (docs/methods.md §4, step 1), else
    the released key set would reveal words of the private documents."""
    voc = cfg.synrag.get("vocabulary")
    if not isinstance(voc, str) or voc in ("demo", "tokenizer"):
        return
    path = Path(voc).resolve()
    private: list[Path] = []
    if cfg.data.path != "demo":
        private.append(Path(cfg.data.path).resolve())
    if output_dir is not None:
        private.append((Path(output_dir) / "private").resolve())
    for p in private:
        if path == p or p in path.parents:
            raise ConfigError(
                f"synrag.vocabulary: {voc!r} is the private data or inside a private area "
                f"({p}); the keyword vocabulary must be PUBLIC input (a term list in the config, "
                "a public file, 'demo' or 'tokenizer'), never built from the private documents")
    if any(q.name == "private" and (q.parent / "run.json").is_file() for q in path.parents):
        raise ConfigError(f"synrag.vocabulary: {voc!r} lies in a run's private/ folder; the "
                          "keyword vocabulary must be public input")


def private_documents(cfg: RunConfig, run: RunDir) -> tuple[list[str], str]:
    """The private documents (one per user when privacy.unit is 'user': each user's records
    are joined, so that record-level DP on documents is user-level DP) and a fingerprint."""
    from ..api import load_run_data

    data = load_run_data(cfg, run)
    texts = list(data.texts)
    if cfg.privacy.unit == "user":
        groups: dict[str, list[str]] = {}
        for t, u in zip(texts, data.users, strict=True):
            groups.setdefault(str(u), []).append(t)
        texts = ["\n".join(v) for v in groups.values()]
    return texts, data.fingerprint()


def open_sessions(cfg: RunConfig, run: RunDir) -> tuple[Any, Any]:
    """(run session with the target: the statement; cluster store without target)."""
    from ..api import _noise_seed
    from ..privacy import Accountant, PrivacySession, make_noise_source

    seed = _noise_seed(cfg, run)  # the run's private seed (seeded research mode) or None
    target = (cfg.privacy.epsilon, cfg.privacy.delta)
    main = PrivacySession(run.private / "releases", Accountant("zcdp"),
                          make_noise_source(cfg.privacy.noise, seed), target=target)
    clusters = PrivacySession(run.private / "cluster-releases", Accountant("zcdp"),
                              make_noise_source(cfg.privacy.noise, seed), target=None)
    return main, clusters


def load_models(cfg: RunConfig, run: RunDir, generator: Any = None,
                embedder: Any = None) -> tuple[Any, Any]:
    """The generator (must expose next-token logits) and the embedder."""
    if generator is None:
        from ..llm import load_generator

        g = cfg.generators[0]
        extra = {"batch_size": g.batch_size} if g.backend == "local" else {}
        generator = load_generator(g.spec(), **extra)
    if not hasattr(generator, "open_stepper"):
        raise ConfigError("DP-SynRAG's private prediction needs next-token logits: use a local "
                          "generator (generators[0].backend: local)")
    if embedder is None:
        from ..embed import Embedder

        embedder = Embedder(cfg.embedder.model, cache_dir=run.private / "embed-cache")
    return generator, embedder


def document_keywords(gen: Any, docs: list[str], vocab: Any, scfg: SynRAGConfig, run: RunDir,
                      fingerprint: str, progress: bool) -> list[list[int]]:
    """K keyword ids per document, cached in the private area (a resume reuses them)."""
    from ..llm import GenerationRequest, SamplingParams

    path = run.private / "keywords.json"
    tag = [fingerprint, vocab.source, len(vocab), scfg.keywords_per_doc, scfg.keyword_extractor,
           scfg.keyword_fill]
    if path.is_file():
        cached = json.loads(path.read_text())
        if cached.get("tag") == tag:
            return cached["keywords"]
    generate = None
    if scfg.keyword_extractor == "llm":
        params = SamplingParams(temperature=0.0, max_new_tokens=scfg.keyword_max_new_tokens)

        def generate(prompts: list) -> list[str]:
            return gen.generate([GenerationRequest(p, params) for p in prompts],
                                progress=progress)
    kws = extract_keywords(docs, vocab, scfg.keywords_per_doc, generate=generate,
                           fill=scfg.keyword_fill)
    atomic_write_json(path, {"tag": tag, "keywords": kws}, mode=0o600)
    return kws


def private_embeddings(embedder: Any, docs: list[str], run: RunDir) -> np.ndarray:
    path = run.private / "private-embeddings.npy"
    if path.is_file():
        emb = np.load(path)
        if len(emb) == len(docs):
            return emb
    emb = np.asarray(embedder.embed(docs), dtype=np.float32)
    with open(path, "wb") as fh:
        np.save(fh, emb)
    path.chmod(0o600)
    return emb


def build_kb(
    config: RunConfig | str | Path,
    output_dir: str | Path,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    generator: Any = None,
    embedder: Any = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    stop_after_clusters: int | None = None,
) -> Path:
    """Build (or resume) a DP synthetic knowledge base; returns the run folder.

    ``stop_after_clusters`` stops (raising KeyboardInterrupt) after that many clusters were
    generated in this call: a test hook that simulates a killed build."""
    from ..api import open_run

    def check(cfg: RunConfig) -> None:  # before run.create writes config.yaml
        parse_synrag(cfg)
        _resolve_vocabulary(cfg, config, output_dir)

    run, cfg, meta = open_run(config, output_dir, resume=resume, overrides=overrides,
                              method=METHOD, check=check)
    started = time.time()
    try:
        scfg = parse_synrag(cfg)
        eps, delta = cfg.privacy.epsilon, cfg.privacy.delta
        clip = resolve_clip(scfg, eps, delta)
        note = Notice(run, echo)
        docs, fingerprint = private_documents(cfg, run)
        if not docs:
            raise ConfigError("the private data has no records")
        if not resume:
            from ..api import _ledger, _noise_seed

            # keyed (HMAC) fingerprint: the raw digest never leaves this process
            fingerprint = _ledger(cfg).dataset_id(fingerprint)
            run.update_meta(dataset_fingerprint=fingerprint, clip=clip)
            _ledger(cfg).reserve(fingerprint, meta["run_id"], eps, delta,
                                 cfg.privacy.total_epsilon, cfg.privacy.total_delta,
                                 noise_seed=_noise_seed(cfg, run))
        else:
            fingerprint = run.meta().get("dataset_fingerprint", fingerprint)
        gen, emb_model = load_models(cfg, run, generator, embedder)
        vocab = load_vocabulary(scfg.vocabulary, tokenizer=getattr(gen, "tokenizer", None),
                                demo_seed=cfg.data.demo_seed)
        note(f"{METHOD}: vocabulary of {len(vocab)} public terms ({vocab.source}), "
             f"clip c = {clip:.5g}")
        note.private(f"{len(docs)} private documents", documents=len(docs))
        main, store = open_sessions(cfg, run)

        # 1. keywords and the noisy histogram
        kws = document_keywords(gen, docs, vocab, scfg, run, fingerprint, progress)
        k = scfg.keywords_per_doc
        sigma_h = histogram_sigma(k, scfg.rho_hist)
        noisy = np.asarray(main.gaussian("synrag/keyword_histogram",
                                         keyword_counts(kws, len(vocab)), math.sqrt(k),
                                         sigma_h, name="keyword_histogram"))
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
        else:
            # 2-4. all cluster releases, charged once by overlapping composition
            main.record("synrag/cluster_releases", cluster_events(scfg, clip),
                        {"clusters": int(len(seeds))})
        clusters = soft_clusters(kws, seeds, scfg.overlap)
        emb = private_embeddings(emb_model, docs, run) if len(seeds) else None
        results = generate_clusters(cfg, scfg, run, store, gen, docs, emb, clusters, vocab,
                                    noisy, clip, note, stop_after_clusters)

        # 5. self-filtering (post-processing)
        texts = [r["text"] for r in results]
        keep = (self_filter(gen, texts, scfg.filter_question) if scfg.self_filter
                else [bool(t.strip()) for t in texts])
        rows = [{"id": r["cluster"], "text": r["text"], "keyword": r["keyword"]}
                for r, kp in zip(results, keep, strict=True) if kp]
        write_jsonl(run.release / "synthetic_all.jsonl",
                    [{**r, "kept": bool(kp)} for r, kp in zip(results, keep, strict=True)])
        write_jsonl(run.release / "kb.jsonl", rows)
        from .index import build_index

        build_index(run.release, [r["text"] for r in rows], emb_model, cfg.embedder.model,
                    extra={"generator": cfg.generators[0].spec(),
                           "answer_max_new_tokens": scfg.answer_max_new_tokens,
                           "retrieve": scfg.retrieve})
        if results and not rows:
            note("self-filtering kept no synthetic document: the KB is empty", warn=True)

        rho = theorem1_rho(k, sigma_h, scfg.overlap, scfg.eps_theta,
                           centre_sigma(scfg.rho_centre), max_private_tokens(scfg), clip,
                           scfg.temperature, scfg.svt_epsilon if scfg.public_shortcut else 0.0)
        statement = main.statement("record" if cfg.privacy.unit == "record" else "user",
                                   (eps, delta))
        statement.update(
            method=METHOD, clip=clip,
            theorem1={"rho_planned": rho, "epsilon_planned_standard": theorem1_epsilon(rho, delta),
                      "rho_spent": main.accountant.rho()},
            synrag=synrag_dict(scfg),
            note="record = one document (one user's joined records with unit 'user'); "
                 "per-cluster releases composed by overlapping parallel composition over L",
        )
        atomic_write_json(run.release / "privacy.json", statement)
        summary = {"method": METHOD, "clusters": len(results),
                   "kb_passages": len(rows), "epsilon": statement["epsilon"], "delta": delta,
                   "clip": clip, "warnings": note.messages}
        # wall time depends on the private data (document count, cluster sizes): operator only
        append_diagnostic(run, {"wall_seconds": round(time.time() - started, 1)})
        atomic_write_json(run.release / "summary.json", summary)
        from ..api import _ledger

        _ledger(cfg).settle(meta["run_id"], float(statement["epsilon"]), delta)
        run.update_meta(status="finished",
                        finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        note(f"finished: {len(rows)} of {len(results)} synthetic documents kept, "
             f"epsilon {statement['epsilon']:.4f} at delta {delta:g}")
        return run.root
    except BaseException as err:
        run.update_meta(status="failed", error=type(err).__name__)
        raise


def generate_clusters(cfg: RunConfig, scfg: SynRAGConfig, run: RunDir, store: Any, gen: Any,
                      docs: list[str], emb: np.ndarray | None, clusters: Any, vocab: Any,
                      noisy: np.ndarray, clip: float, note: Notice,
                      stop_after: int | None) -> list[dict[str, Any]]:
    """Steps 3-4 for every cluster, with a checkpoint per cluster."""
    results: list[dict[str, Any]] = []
    done_now = 0
    sigma_mu = centre_sigma(scfg.rho_centre)

    def retrieve(r: int, members: np.ndarray) -> Any:  # keyed: a second call replays
        return retrieve_in_cluster(store, f"cluster/{r:04d}", emb, members, sigma_mu=sigma_mu,
                                   eps_theta=scfg.eps_theta, target=scfg.target_size)

    ray_preds: dict[int, Any] = {}
    if cfg.compute.engine == "ray" and not scfg.public_shortcut:
        # every pending cluster's private prediction at once on Ray (dpsynth.compute.rag);
        # the tokens are still released here, by this session, in cluster order
        from ..compute.rag import cluster_predictions

        jobs = [(r, f"cluster/{r:04d}", [docs[i] for i in retrieve(r, m).selected])
                for r, m in enumerate(clusters.members)
                if run.load_checkpoint(f"cluster-{r:04d}") is None]
        note(f"private prediction of {len(jobs)} clusters on Ray ({cfg.compute.shards} "
             "workers)")  # the cluster count follows the released histogram
        ray_preds = cluster_predictions(
            cfg, store, gen, jobs, instruction=scfg.rephrase_instruction, tokens=scfg.tokens,
            clip=clip, temperature=scfg.temperature, max_doc_tokens=scfg.max_doc_tokens)
    for r, (seed, members) in enumerate(zip(clusters.seeds, clusters.members, strict=True)):
        keyword = vocab.terms[int(seed)]
        name = f"cluster-{r:04d}"
        state = run.load_checkpoint(name)
        if state is None:
            key = f"cluster/{r:04d}"
            got = retrieve(r, members)
            if members.size == 0:
                note.private(f"cluster {r} ('{keyword}') is empty: its releases are still made "
                             "and charged (pure noise output, usually removed by "
                             "self-filtering)", warn=True, cluster=r)
            elif got.selected.size < scfg.target_size:
                note.private(f"cluster {r} ('{keyword}') has fewer than k = "
                             f"{scfg.target_size} documents above its threshold: its text "
                             "rests on fewer documents (same charge)", warn=True, cluster=r)
            chosen = [docs[i] for i in got.selected]
            n_private = None
            if scfg.public_shortcut:
                shortcut = Shortcut(scfg.svt_epsilon, max_private_tokens(scfg),
                                    scfg.svt_threshold if scfg.svt_threshold is not None
                                    else scfg.target_size * clip)
                pred, n_private = private_predict_shortcut(
                    store, key, gen, chosen, instruction=scfg.rephrase_instruction,
                    tokens=scfg.tokens, clip=clip, temperature=scfg.temperature,
                    max_doc_tokens=scfg.max_doc_tokens, shortcut=shortcut)
            elif r in ray_preds:
                pred = ray_preds[r]
            else:
                pred = private_predict(store, key, gen, chosen,
                                       instruction=scfg.rephrase_instruction,
                                       tokens=scfg.tokens, clip=clip,
                                       temperature=scfg.temperature,
                                       max_doc_tokens=scfg.max_doc_tokens)
            if pred.truncated:
                note.private(f"cluster {r}: {pred.truncated} document(s) longer than "
                             f"{scfg.max_doc_tokens} tokens were truncated (not dropped)",
                             cluster=r)
            state = {"cluster": r, "keyword": keyword, "noisy_count": float(noisy[seed]),
                     "theta": got.theta, "text": pred.text, "tokens": pred.steps,
                     "private_tokens": pred.steps if n_private is None else n_private}
            append_diagnostic(run, {"cluster": r, "members": int(members.size),
                                    "selected": int(got.selected.size),
                                    "truncated": pred.truncated})
            run.save_checkpoint(name, state)
            run.append_stats({"iteration": r + 1, "stage": "cluster",
                              **{k: v for k, v in state.items() if k != "text"}})
            done_now += 1
        results.append(state)
        if stop_after is not None and done_now >= stop_after and r + 1 < len(clusters.seeds):
            raise KeyboardInterrupt(f"stopped after {done_now} clusters (test hook)")
    return results
