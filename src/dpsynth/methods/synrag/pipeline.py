"""The steps of a DP-SynRAG build (docs/methods.md §4), called by
:class:`dpsynth.methods.synrag.SynRAG`: operator notices, the public-vocabulary check, the
private documents, models, keywords, private embeddings and the per-cluster generation.

Every planned cluster release is made, even for an empty cluster (its output is then pure
noise): skipping a release because a cluster is empty would depend on the private data. What
release/ and stats.jsonl hold is DP output only (noisy counts, thresholds, synthetic text);
exact cluster sizes stay in ``private/diagnostics.jsonl``.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...config import ConfigError, RunConfig
from ...diagnostics import append_diagnostic
from ...io import atomic_write_bytes, atomic_write_json
from ...runs import RunDir
from .config import SynRAGConfig
from .keywords import extract_keywords
from .private_prediction import predict_text
from .retrieval import centre_sigma, retrieve_in_cluster

log = logging.getLogger("dpsynth.rag")


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


def documents(cfg: RunConfig, dataset: Any) -> list[str]:
    """The private documents: one per record, or one per user when privacy.unit is 'user'
    (each user's records joined, so that record-level DP on documents is user-level DP)."""
    texts = list(dataset.texts)
    if cfg.privacy.unit == "user":
        groups: dict[str, list[str]] = {}
        for t, u in zip(texts, dataset.users, strict=True):
            groups.setdefault(str(u), []).append(t)
        texts = ["\n".join(v) for v in groups.values()]
    return texts


def load_models(cfg: RunConfig, run: RunDir, generator: Any = None,
                embedder: Any = None) -> tuple[Any, Any]:
    """The generator (must expose next-token logits) and the embedder."""
    if generator is None:
        from ...llm import load_generator

        g = cfg.generators[0]
        extra = {"batch_size": g.batch_size} if g.backend == "local" else {}
        generator = load_generator(g.spec(), **extra)
    if not hasattr(generator, "open_stepper"):
        raise ConfigError("DP-SynRAG's private prediction needs next-token logits: use a local "
                          "generator (generators[0].backend: local)")
    if embedder is None:
        from ...embed import Embedder

        embedder = Embedder(cfg.embedder.model, cache_dir=run.private / "embed-cache")
    return generator, embedder


def document_keywords(gen: Any, docs: list[str], vocab: Any, scfg: SynRAGConfig, run: RunDir,
                      fingerprint: str, progress: bool) -> list[list[int]]:
    """K keyword ids per document, cached in the private area (a resume reuses them)."""
    from ...llm import GenerationRequest, SamplingParams

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


def keyword_histogram(cfg: RunConfig, scfg: SynRAGConfig, dataset: Any, vocab: Any,
                      kws: list[list[int]]) -> np.ndarray:
    """The true keyword histogram h (docs/methods.md §4): with the vocabulary extractor from
    the dataset's engine (``PrivateCompute.keyword_histogram``, the kernels the Ray shards
    run); with the LLM extractor, the counts of the keywords ``kws`` already extracted here
    for the clustering (the engine would ask the LLM about every document a second time)."""
    from ...compute import data_compute
    from .clusters import keyword_counts

    if scfg.keyword_extractor == "vocabulary":
        engine = data_compute(dataset, cfg.privacy.unit == "user")
        return engine.keyword_histogram(vocab, scfg.keywords_per_doc, scfg.keyword_fill)
    return keyword_counts(kws, len(vocab))


def private_embeddings(embedder: Any, docs: list[str], run: RunDir) -> np.ndarray:
    """Embeddings of the private documents, cached in the private area (mode 0600, set before
    anything is written; a resume reuses them)."""
    path = run.private / "private-embeddings.npy"
    if path.is_file():
        emb = np.load(path)
        if len(emb) == len(docs):
            return emb
    emb = np.asarray(embedder.embed(docs), dtype=np.float32)
    buf = io.BytesIO()
    np.save(buf, emb)
    atomic_write_bytes(path, buf.getvalue(), mode=0o600)
    return emb


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
        from ...compute.rag import cluster_predictions

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
            if r in ray_preds and not scfg.public_shortcut:
                pred, n_private = ray_preds[r], ray_preds[r].steps
            else:
                pred, n_private = predict_text(store, key, gen, chosen, scfg, clip)
            if pred.truncated:
                note.private(f"cluster {r}: {pred.truncated} document(s) longer than "
                             f"{scfg.max_doc_tokens} tokens were truncated (not dropped)",
                             cluster=r)
            state = {"cluster": r, "keyword": keyword, "noisy_count": float(noisy[seed]),
                     "theta": got.theta, "text": pred.text, "tokens": pred.steps,
                     "private_tokens": n_private}
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
