"""DP-SynRAG's private prediction for many clusters at once on Ray (docs/methods.md §4).

Clusters are disjoint work, but every token is a release that depends on the cluster's earlier
noisy tokens, and every release goes through the driver's one privacy session. So the work is
split as: a :class:`LogitWorker` actor holds a generator and, per cluster, a KV-cached stepper
over the cluster's documents; given the released prefix it returns the clipped logit sum z
(documents and logits never leave the worker, only z does); the driver releases token n of
every unfinished cluster through the session, in cluster order, then asks for step n + 1.
With sharded documents (:class:`OnShards`) the worker fetches S_r's texts itself from the
shard actors that keep them (:func:`dpsynth.methods.synrag.shard.on_documents`), in global id
order, and truncates them there: the texts go from shard to worker, never through the driver.
Each release key has its own noise stream (``PrivacySession.noise_for``), so the tokens are
those of :func:`dpsynth.methods.synrag.private_prediction.private_predict` run cluster after
cluster.

Parallelism: the forward passes of up to ``workers`` clusters run at once; the driver's share
per step is one sampling over the vocabulary per cluster and one round trip. A worker that dies
is restarted by Ray and rebuilds a cluster's stepper from the documents (or fetches them again
from the shards) and the released prefix it is sent with every step, so a retried step
returns the same z.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...compute.ray_engine import ray_get
from ...llm.runtime import stepper_threads
from .config import STEPPER_ROWS
from .private_prediction import (
    Prediction,
    PublicSide,
    Rephrase,
    Shortcut,
    ShortcutText,
    clipped_sum,
    open_documents,
    shortcut_stats,
)
from .shard import merge_selected, on_documents
from .support import Support, support_logits

MAX_RESTARTS = 4


@dataclass(frozen=True)
class GivenGenerator:
    """A generator object given to the run (e.g. a test fake), shipped to workers by pickle."""

    generator: Any

    def __call__(self) -> Any:
        return self.generator


@dataclass(frozen=True)
class OnShards:
    """A cluster's S_r kept by the shard actors ``shards`` under the cluster's key: the
    worker fetches the texts itself. ``size`` (|S_r|, private) only says whether it has any."""

    shards: tuple[Any, ...]
    size: int


def fetch_selected(key: str, source: OnShards) -> list[str]:
    """S_r's texts from the shard actors, in global id order (on a worker)."""
    import ray

    answers = ray.get([s.run.remote(on_documents, "selected", key) for s in source.shards])
    return merge_selected([part for part, _ in answers])


class LogitWorker:
    """Holds a generator and one stepper per open cluster; answers with clipped logit sums."""

    def __init__(self, generator_factory: Any) -> None:
        self.gen = generator_factory()
        #: key -> (stepper, tokens advanced, documents truncated)
        self.steppers: dict[str, tuple[Any, int, int]] = {}

    def step(self, key: str, docs: list[str] | OnShards, prefix: str, suffix: str,
             max_doc_tokens: int, released: list[int], clip: float,
             ids: np.ndarray | None = None, rows: int = STEPPER_ROWS) -> tuple[np.ndarray, int]:
        """(z for the next token of cluster ``key`` after the ``released`` tokens, over the
        public candidate ``ids`` (None: the whole vocabulary), how many of its documents were
        truncated to ``max_doc_tokens``). ``docs``: the documents, or where the shards keep
        them; ``rows``: documents per decode pass (:func:`open_documents`)."""
        stepper, cut = self._stepper(key, docs, prefix, suffix, max_doc_tokens, released, rows)
        return clipped_sum(support_logits(stepper, ids), clip), cut

    def step_shortcut(self, key: str, docs: list[str] | OnShards, prefix: str, suffix: str,
                      max_doc_tokens: int, released: list[int], clip: float,
                      pub_clip: np.ndarray, ids: np.ndarray | None = None,
                      rows: int = STEPPER_ROWS) -> tuple[np.ndarray, float, int]:
        """As :meth:`step` for the public-token shortcut: (z, the SVT query q against the
        clipped public row ``pub_clip``, documents truncated)."""
        stepper, cut = self._stepper(key, docs, prefix, suffix, max_doc_tokens, released, rows)
        z, q = shortcut_stats(support_logits(stepper, ids), pub_clip, clip)
        return z, q, cut

    def _stepper(self, key: str, docs: list[str] | OnShards, prefix: str, suffix: str,
                 max_doc_tokens: int, released: list[int], rows: int) -> tuple[Any, int]:
        """The cluster's stepper advanced by ``released`` (opened, or reopened, as needed)."""
        stepper, done, cut = self.steppers.get(key, (None, 0, 0))
        if stepper is None or done > len(released):
            if stepper is not None:
                stepper.close()
            texts = fetch_selected(key, docs) if isinstance(docs, OnShards) else docs
            stepper, cut = open_documents(self.gen, texts, prefix, suffix, max_doc_tokens, rows)
            done = 0
        for tok in released[done:]:
            stepper.advance(int(tok))
        self.steppers[key] = (stepper, len(released), cut)
        return stepper, cut

    def close(self, key: str) -> None:
        stepper, _, _ = self.steppers.pop(key, (None, 0, 0))
        if stepper is not None:
            stepper.close()


@dataclass
class _Job:
    key: str
    docs: Any  # a ray ref to the documents, or OnShards; None: no document
    out: list[int]
    cut: int = 0
    steps: int = 0
    done: bool = False


def _source(documents: list[str] | OnShards) -> Any:
    """What a worker is sent for a cluster's documents: a ray ref to them, or where the shards
    keep them; None when there is no document (z = 0, no worker is asked)."""
    import ray

    if isinstance(documents, OnShards):
        return documents if documents.size > 0 else None
    return ray.put(list(documents)) if documents else None


def private_predict_clusters(session: Any, gen: Any,
                             clusters: Sequence[tuple[str, list[str] | OnShards,
                                                      Support | None, Rephrase]],
                             workers: Sequence[Any], *, tokens: int,
                             clip: float, temperature: float,
                             max_doc_tokens: int, timeout_s: float | None = None,
                             rows: int = STEPPER_ROWS) -> list[Prediction]:
    """``private_predict`` for every (key, documents, support, prompt) in ``clusters`` (the
    documents, or :class:`OnShards`: where the shard actors keep them; the public candidate
    set, None for the whole vocabulary; the cluster's :class:`Rephrase`), the logit sums
    computed by the ``workers`` (Ray actor handles of :class:`LogitWorker`) over the
    candidates this process sends (computed here from public inputs and released tokens),
    every token released by ``session`` on this process. Returns the predictions in the
    order of ``clusters``."""

    eos = set(getattr(gen, "eos_token_ids", (gen.eos_token_id,)))
    parts = [prompt.parts(gen) for _, _, _, prompt in clusters]
    jobs = [_Job(key, _source(documents), []) for key, documents, _, _ in clusters]
    publics = [PublicSide(gen, prompt, support) for _, _, support, prompt in clusters]
    try:
        for n in range(tokens):
            active = [i for i, job in enumerate(jobs) if not job.done]
            if not active:
                break
            ids = {i: publics[i].ids() for i in active}
            refs = {i: workers[i % len(workers)].step.remote(
                        jobs[i].key, jobs[i].docs, *parts[i], max_doc_tokens,
                        list(jobs[i].out), clip, ids[i], rows)
                    for i in active if jobs[i].docs is not None}
            zs = {}
            answers = ray_get(list(refs.values()), timeout_s, f"token step {n}")
            for i, (z, cut) in zip(refs, answers, strict=True):
                zs[i], jobs[i].cut = z, cut
            for i in active:  # releases in cluster order, through the one session
                job = jobs[i]
                size = int(gen.vocab_size) if ids[i] is None else ids[i].size
                extra = {"support": ids[i]} if ids[i] is not None else {}
                tok = int(session.private_token(f"{job.key}/tok{n:04d}",
                                                zs.get(i, np.zeros(size)), clip, temperature,
                                                **extra))
                job.steps = n + 1
                if tok in eos:
                    job.done = True
                    continue
                job.out.append(tok)
                if n + 1 == tokens:
                    job.done = True
                else:
                    publics[i].advance(tok)
    finally:
        for p in publics:
            p.close()
        for i, job in enumerate(jobs):
            if job.docs is not None:
                workers[i % len(workers)].close.remote(job.key)
    return [Prediction(prompt.text(gen, job.out, clean=job.docs is not None), job.out,
                       job.steps, job.cut)
            for job, (_, _, _, prompt) in zip(jobs, clusters, strict=True)]


def shortcut_predict_clusters(session: Any, gen: Any,
                              clusters: Sequence[tuple[str, list[str] | OnShards,
                                                       Support | None, Rephrase]],
                              workers: Sequence[Any], *, tokens: int,
                              clip: float, temperature: float, max_doc_tokens: int,
                              shortcut: Shortcut, timeout_s: float | None = None,
                              rows: int = STEPPER_ROWS) -> list[tuple[Prediction, int]]:
    """:func:`private_predict_clusters` with the public-token shortcut: per step, this process
    runs each cluster's public stepper and sends the clipped public row out, the workers return
    (z, q) of the cluster's documents, and :class:`ShortcutText` releases the token here, in
    cluster order. Returns (prediction, private tokens drawn) per cluster."""

    parts = [prompt.parts(gen) for _, _, _, prompt in clusters]
    jobs: list[_Job] = []
    texts: list[ShortcutText] = []
    try:
        for key, documents, support, prompt in clusters:
            jobs.append(_Job(key, _source(documents), []))
            texts.append(ShortcutText(session, key, gen, instruction=prompt,
                                      tokens=tokens, clip=clip, temperature=temperature,
                                      shortcut=shortcut, support=support))
        while True:
            active = [i for i, t in enumerate(texts) if not t.done]
            if not active:
                break
            pubs = {i: texts[i].public_clip() for i in active}
            refs = {i: workers[i % len(workers)].step_shortcut.remote(
                        jobs[i].key, jobs[i].docs, *parts[i], max_doc_tokens,
                        list(texts[i].out), clip, pubs[i], texts[i].ids, rows)
                    for i in active if jobs[i].docs is not None}
            stats = {}
            answers = ray_get(list(refs.values()), timeout_s, "a shortcut token step")
            for i, (z, q, cut) in zip(refs, answers, strict=True):
                stats[i], jobs[i].cut = (z, q), cut
            for i in active:  # releases in cluster order, through the one session
                z, q = stats.get(i, (np.zeros_like(pubs[i]), 0.0))
                texts[i].release(z, q)
    finally:
        for t in texts:
            t.close()
        for i, job in enumerate(jobs):
            if job.docs is not None:
                workers[i % len(workers)].close.remote(job.key)
    return [(t.prediction(job.cut), t.private) for t, job in zip(texts, jobs, strict=True)]


def logit_workers(generator_factory: Any, count: int) -> list[Any]:
    """``count`` LogitWorker actors, spread over the nodes and restarted by Ray if they die.
    They reserve no CPU: the run's shard actors hold theirs for the run, and during private
    prediction they only hand S_r's texts to these workers."""
    import ray

    remote = ray.remote(LogitWorker).options(num_cpus=0, max_restarts=MAX_RESTARTS,
                                             max_task_retries=MAX_RESTARTS,
                                             scheduling_strategy="SPREAD")
    return [remote.remote(generator_factory) for _ in range(count)]


@dataclass(frozen=True)
class GeneratorSpec:
    """Loads the configured local generator on a worker (``dpsynth.llm.load_generator`` of
    ``GeneratorConfig.load_spec``)."""

    spec: Any
    logits_dtype: str = "float32"  # resolved on the driver, so every worker steps alike
    stepper: str = "transformers"  # likewise (synrag.stepper)
    #: likewise the stepper's threads (:func:`dpsynth.llm.runtime.stepper_threads`): logits
    #: follow the thread count; a worker with fewer cores runs on fewer (the generator's cap)
    threads: int | None = None

    def __call__(self) -> Any:
        from ...llm import load_generator

        gen = load_generator(self.spec)
        if self.threads is not None:
            gen.configured_threads = self.threads
        gen.set_logits_dtype(self.logits_dtype)
        gen.set_stepper_engine(self.stepper)
        return gen


def generator_factory(config: Any, gen: Any) -> Any:
    """How a Ray worker gets the run's generator: the configured local model loads itself
    there; any other generator object (e.g. a test fake) is shipped as is."""
    from ...llm.local import LocalGenerator

    g = config.generators[0]
    return (GeneratorSpec(g.load_spec(), getattr(gen, "logits_dtype", "float32"),
                          getattr(gen, "stepper_engine", "transformers"), stepper_threads(gen))
            if isinstance(gen, LocalGenerator)
            else GivenGenerator(gen))


def cluster_predictions(config: Any, session: Any, gen: Any,
                        jobs: Sequence[tuple[int, str, list[str] | OnShards, Support | None,
                                             Rephrase]],
                        *,
                        tokens: int, clip: float, temperature: float,
                        max_doc_tokens: int, shortcut: Shortcut | None = None,
                        rows: int = STEPPER_ROWS) -> dict[int, tuple[Prediction, int]]:
    """DP-SynRAG's private prediction of every pending cluster (index, key, documents or
    :class:`OnShards`, public candidate set or None, :class:`Rephrase`) on
    ``config.compute`` (engine ray): ``compute.shards`` LogitWorker actors, releases through
    ``session`` here, with the public-token ``shortcut`` if given. Returns (prediction,
    private tokens drawn) per cluster index."""
    import ray

    if not jobs:
        return {}
    factory = generator_factory(config, gen)
    owned = not ray.is_initialized()
    if owned:
        address = config.compute.address
        if address == "local":
            ray.init(num_cpus=config.compute.shards, include_dashboard=False,
                     log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    workers = logit_workers(factory, min(config.compute.shards, len(jobs)))
    try:
        opts: dict[str, Any] = {"tokens": tokens, "clip": clip,
                                "temperature": temperature, "max_doc_tokens": max_doc_tokens,
                                "timeout_s": config.compute.timeout_s, "rows": rows}
        todo = [(key, docs, support, prompt) for _, key, docs, support, prompt in jobs]
        preds = (shortcut_predict_clusters(session, gen, todo, workers, shortcut=shortcut,
                                           **opts) if shortcut is not None else
                 [(p, p.steps) for p in private_predict_clusters(session, gen, todo, workers,
                                                                 **opts)])
    finally:
        for w in workers:
            ray.kill(w)
        if owned:
            ray.shutdown()
    return {job[0]: p for job, p in zip(jobs, preds, strict=True)}
