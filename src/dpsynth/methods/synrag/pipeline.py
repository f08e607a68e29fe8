"""The steps of a DP-SynRAG build (docs/methods.md §4), called by
:class:`dpsynth.methods.synrag.SynRAG`: operator notices, the public-vocabulary check, the
private documents as the driver sees them (:class:`Corpus`: exact partial statistics of the
document shards), models and the per-cluster generation.

Every planned cluster release is made, even for an empty cluster (its output is then pure
noise): skipping a release because a cluster is empty would depend on the private data. What
release/ and stats.jsonl hold is DP output only (noisy counts, thresholds, synthetic text);
exact cluster sizes stay in ``private/diagnostics.jsonl``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...compute.kernels import FIXED_POINT_BITS
from ...config import ConfigError, RunConfig
from ...diagnostics import append_diagnostic
from ...llm.base import Steppable
from ...progress import bar, step
from ...run_folder import RunDir
from .config import SynRAGConfig, parse_synrag, stepper_rows
from .keywords import BUILT_IN_VOCABULARIES
from .private_prediction import Rephrase, predict_text, rephrase_of, shortcut_of
from .retrieval import Retrieved, centre_sigma, retrieve_in_cluster
from .shard import DocumentShard, ShardFiles, documents_of, merge_selected, on_documents
from .support import Support, make_support, term_token_ids

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


def resolve_vocabulary(cfg: RunConfig, config: RunConfig | str | Path,
                        output_dir: str | Path | None = None) -> None:
    """A vocabulary file named in the config is relative to the config file's folder (set in
    place, so the stored config.yaml holds the absolute path); then
    :func:`check_vocabulary_public`."""
    scfg = parse_synrag(cfg)
    voc = scfg.vocabulary
    if (not isinstance(config, RunConfig) and isinstance(voc, str)
            and voc not in BUILT_IN_VOCABULARIES and not Path(voc).is_absolute()):
        scfg.vocabulary = str((Path(config).parent / voc).resolve())
    check_vocabulary_public(cfg, output_dir)


def check_vocabulary_public(cfg: RunConfig, output_dir: str | Path | None = None) -> None:
    """Refuse a vocabulary file that is (or lies inside) the private data or a run's private
    area: the histogram's coordinates must be public input (docs/methods.md §4, step 1), else
    the released key set would reveal words of the private documents."""
    voc = parse_synrag(cfg).vocabulary
    if not isinstance(voc, str) or voc in BUILT_IN_VOCABULARIES:
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
    users = dataset.users if cfg.privacy.unit == "user" else None
    return documents_of(dataset.texts, np.arange(len(dataset)), users)[0]


class Corpus:
    """The private documents as the build's driver sees them: the exact partial statistics of
    one :class:`DocumentShard` in this process (engine local), or of the Ray shard actors
    (engine ray: the driver never holds a document; docs/methods.md §4)."""

    def __init__(self, call: Callable[..., list[Any]], shards: tuple[Any, ...] = ()) -> None:
        self._call = call
        self.shards = shards  # the Ray shard actors ((): in this process)

    @classmethod
    def in_process(cls, cfg: RunConfig, dataset: Any, run: RunDir) -> Corpus:
        """One shard holding every document, its caches in the run's private area."""
        users = dataset.users if cfg.privacy.unit == "user" else None
        shard = DocumentShard.of_records(
            dataset.texts, np.arange(len(dataset)), users,
            ShardFiles(keywords=run.private / "keywords.json",
                       embeddings=run.private / "private-embeddings.npy"))
        return cls(lambda op, *args: [getattr(shard, op)(*args)])

    @classmethod
    def on_shards(cls, engine: Any) -> Corpus:
        """The shard actors of a :class:`dpsynth.compute.ray_engine.RayCompute`."""
        return cls(lambda op, *args: engine.map(on_documents, op, *args), tuple(engine.actors))

    @property
    def sharded(self) -> bool:
        return bool(self.shards)

    def n_documents(self) -> int:
        """How many documents there are (private: diagnostics only)."""
        return int(sum(self._call("size")))

    def keyword_histogram(self, vocab: Any, scfg: SynRAGConfig, tag: Any,
                          generator_factory: Any, progress: bool) -> np.ndarray:
        """Step 1: the true histogram h (float64), summed from the shards' exact counts; the
        keyword ids stay with the shards."""
        parts = self._call("keyword_counts", vocab, scfg.keywords_per_doc, scfg.keyword_fill,
                           tag, generator_factory, scfg.keyword_max_new_tokens,
                           progress and not self.sharded)
        return np.sum(parts, axis=0, dtype=np.int64).astype(np.float64)

    def cluster(self, seeds: np.ndarray, overlap: int) -> np.ndarray:
        """Step 2 on every shard; |C_r| per cluster (private: diagnostics only)."""
        parts = self._call("cluster", np.asarray(seeds, dtype=np.int64), int(overlap))
        return np.sum(parts, axis=0, dtype=np.int64)

    def embed(self, embedder_factory: Any, progress: bool = False) -> None:
        """Every shard embeds its documents (or reloads them); ``progress``: under a bar
        counting them (in this process only)."""
        self._call("embed", embedder_factory, progress and not self.sharded)

    def centre_sums(self) -> np.ndarray:
        """Per cluster, the exact sum of the member embeddings ([R, d] float64)."""
        parts = [p for p in self._call("centre_sums") if p is not None]
        total = np.sum(parts, axis=0, dtype=np.int64)
        return total.astype(np.float64) * 2.0**-FIXED_POINT_BITS

    def threshold_counts(self, r: int, direction: np.ndarray) -> np.ndarray:
        """#{d in C_r : sim(d, direction) > theta_g} per grid point, summed (int64)."""
        return np.sum(self._call("threshold_counts", r, direction), axis=0, dtype=np.int64)

    def select(self, key: str, r: int, direction: np.ndarray, theta: float) -> int:
        """Each shard keeps its part of S_r under ``key``; |S_r| (private: diagnostics)."""
        return int(sum(self._call("select", key, r, direction, theta)))

    def texts(self, key: str) -> list[str]:
        """S_r's texts in this process (engine local only)."""
        if self.sharded:
            raise RuntimeError("with compute.engine ray S_r stays on the shards: the logit "
                               "workers fetch it (methods.synrag.ray_prediction.OnShards)")
        return merge_selected(self._call("selected", key))


def load_models(cfg: RunConfig, run: RunDir, generator: Any = None,
                embedder: Any = None) -> tuple[Any, Any]:
    """The generator (must expose next-token logits) and the embedder."""
    if generator is None:
        from ...llm import load_generator

        generator = load_generator(cfg.generators[0].load_spec())
    if not isinstance(generator, Steppable):
        raise ConfigError("DP-SynRAG's private prediction needs next-token logits: use a local "
                          "generator (generators[0].backend: local)")
    if embedder is None:
        from ...embed import Embedder

        embedder = Embedder(cfg.embedder.model, cache_dir=run.private / "embed-cache")
    return generator, embedder


def cluster_prompts(scfg: SynRAGConfig, gen: Any, vocab: Any
                    ) -> Callable[[int], tuple[Support | None, Rephrase]]:
    """seed (a vocabulary index) -> the public inputs of that cluster's text, both functions
    of its released keyword in the public list's spelling (docs/methods.md §4): the candidate
    set (``synrag.support``; None: the whole vocabulary) of the public vocabulary's tokens
    (computed once), the keyword, end-of-text and the public model's top tokens at each step;
    and the rephrase prompt naming the keyword."""
    ids = (term_token_ids(gen, [*vocab.terms, *vocab.spellings])
           if scfg.support == "public" and scfg.support_vocabulary
           else np.zeros(0, dtype=np.int64))

    def of(seed: int) -> tuple[Support | None, Rephrase]:
        spelling = vocab.spellings[int(seed)]
        support = (None if scfg.support == "full"
                   else make_support(gen, ids, spelling, scfg.support_top))
        return support, rephrase_of(scfg, spelling)

    return of


def generate_clusters(cfg: RunConfig, scfg: SynRAGConfig, run: RunDir, store: Any, gen: Any,
                      corpus: Corpus, sizes: np.ndarray, seeds: np.ndarray, vocab: Any,
                      noisy: np.ndarray, clip: float, note: Notice,
                      progress: bool = False) -> list[dict[str, Any]]:
    """Steps 3-4 for every cluster (``sizes``: the exact |C_r|, for diagnostics only), with a
    checkpoint per cluster; ``progress``: a bar of the pending clusters' token steps (the
    released cluster count times ``synrag.tokens``)."""
    results: list[dict[str, Any]] = []
    retrieve = _Retrieval(store, corpus, scfg)
    prompts_of = cluster_prompts(scfg, gen, vocab)
    ray_preds: dict[int, Any] = {}
    if corpus.sharded:
        ray_preds = _predict_on_ray(cfg, scfg, run, store, gen, corpus, seeds, clip, note,
                                    retrieve, prompts_of)
    pending = sum(run.load_checkpoint(f"cluster-{r:04d}") is None for r in range(len(seeds)))
    steps = 0 if corpus.sharded else pending * scfg.tokens
    with bar("private prediction (tokens)", steps, progress) as advance:
        for r, seed in enumerate(seeds):
            keyword = vocab.terms[int(seed)]
            name = f"cluster-{r:04d}"
            state = run.load_checkpoint(name)
            if state is None:
                key = f"cluster/{r:04d}"
                got, selected = retrieve(r)
                _note_size(note, scfg, r, keyword, sizes[r], selected)
                if r in ray_preds:
                    pred, n_private = ray_preds[r]
                else:
                    support, prompt = prompts_of(seed)
                    pred, n_private = predict_text(store, key, gen, corpus.texts(key), scfg,
                                                   clip, support, prompt, advance)
                if pred.truncated:
                    note.private(f"cluster {r}: {pred.truncated} document(s) longer than "
                                 f"{scfg.max_doc_tokens} tokens were truncated (not dropped)",
                                 cluster=r)
                state = {"cluster": r, "keyword": keyword, "noisy_count": float(noisy[seed]),
                         "theta": got.theta, "text": pred.text, "tokens": pred.steps,
                         "private_tokens": n_private}
                append_diagnostic(run, {"cluster": r, "members": int(sizes[r]),
                                        "selected": int(selected), "truncated": pred.truncated})
                # stats before the checkpoint (as the PE loop): a stop in between repeats it
                run.append_stats({"iteration": r + 1, "stage": "cluster",
                                  **{k: v for k, v in state.items() if k != "text"}})
                run.save_checkpoint(name, state)
            results.append(state)
    return results


class _Retrieval:
    """Cluster r's retrieval (its noisy centre and threshold) and selection, as (retrieved,
    number selected); keyed in the store, and kept: a second call replays. The centre sums
    are computed once, at the first call."""

    def __init__(self, store: Any, corpus: Corpus, scfg: SynRAGConfig) -> None:
        self.store, self.corpus, self.scfg = store, corpus, scfg
        self.sigma_mu = centre_sigma(scfg.rho_centre)
        self.sums: list[np.ndarray] = []
        self.retrieved: dict[int, tuple[Retrieved, int]] = {}

    def __call__(self, r: int) -> tuple[Retrieved, int]:
        if r not in self.retrieved:
            corpus, scfg = self.corpus, self.scfg
            if not self.sums:
                self.sums.append(corpus.centre_sums())
            key = f"cluster/{r:04d}"
            got = retrieve_in_cluster(self.store, key, self.sums[0][r],
                                      lambda d: corpus.threshold_counts(r, d),
                                      sigma_mu=self.sigma_mu, eps_theta=scfg.eps_theta,
                                      target=scfg.target_size)
            self.retrieved[r] = got, corpus.select(key, r, got.direction, got.theta)
        return self.retrieved[r]


def _predict_on_ray(cfg: RunConfig, scfg: SynRAGConfig, run: RunDir, store: Any, gen: Any,
                    corpus: Corpus, seeds: np.ndarray, clip: float, note: Notice,
                    retrieve: _Retrieval,
                    prompts_of: Callable[[int], tuple[Support | None, Rephrase]]
                    ) -> dict[int, Any]:
    """Every pending cluster's private prediction at once on Ray (.ray_prediction): the
    workers fetch S_r from the shards; the tokens are still released here, by this session,
    in cluster order. Cluster r -> (prediction, private tokens)."""
    from .ray_prediction import OnShards, cluster_predictions

    jobs = [(r, f"cluster/{r:04d}", OnShards(corpus.shards, retrieve(r)[1]),
             *prompts_of(seeds[r]))
            for r in range(len(seeds)) if run.load_checkpoint(f"cluster-{r:04d}") is None]
    note(f"private prediction of {len(jobs)} clusters on Ray ({cfg.compute.shards} "
         "workers)")  # the cluster count follows the released histogram
    with step(f"private prediction of {len(jobs)} clusters on Ray"):
        return cluster_predictions(
            cfg, store, gen, jobs, tokens=scfg.tokens,
            clip=clip, temperature=scfg.temperature, max_doc_tokens=scfg.max_doc_tokens,
            rows=stepper_rows(scfg),
            shortcut=shortcut_of(scfg, clip))


def _note_size(note: Notice, scfg: SynRAGConfig, r: int, keyword: str, size: int,
               selected: int) -> None:
    """Warn (operator only) of an empty cluster, or one with fewer than k documents
    selected: its releases are still made and charged."""
    if size == 0:
        note.private(f"cluster {r} ('{keyword}') is empty: its releases are still made "
                     "and charged (pure noise output, usually removed by "
                     "self-filtering)", warn=True, cluster=r)
    elif selected < scfg.target_size:
        note.private(f"cluster {r} ('{keyword}') has fewer than k = "
                     f"{scfg.target_size} documents above its threshold: its text "
                     "rests on fewer documents (same charge)", warn=True, cluster=r)
