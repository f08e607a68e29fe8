"""DP-SynRAG's private prediction for many clusters at once on Ray (docs/methods.md §4).

Clusters are disjoint work, but every token is a release that depends on the cluster's earlier
noisy tokens, and every release goes through the driver's one privacy session. So the work is
split as: a :class:`LogitWorker` actor holds a generator and, per cluster, a KV-cached stepper
over the cluster's documents; given the released prefix it returns the clipped logit sum z
(documents and logits never leave the worker, only z does); the driver releases token n of
every unfinished cluster through the session, in cluster order, then asks for step n + 1.
Each release key has its own noise stream (``PrivacySession.noise_for``), so the tokens are
those of :func:`dpsynth.methods.synrag.private_prediction.private_predict` run cluster after
cluster.

Parallelism: the forward passes of up to ``workers`` clusters run at once; the driver's share
per step is one sampling over the vocabulary per cluster and one round trip. A worker that dies
is restarted by Ray and rebuilds a cluster's stepper from the documents and the released
prefix it is sent with every step, so a retried step returns the same z.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..methods.synrag.private_prediction import (
    Prediction,
    clean_text,
    clipped_sum,
    prompt_parts,
    truncate_documents,
)

MAX_RESTARTS = 4


@dataclass(frozen=True)
class GivenGenerator:
    """A generator object given to the run (e.g. a test fake), shipped to workers by pickle."""

    generator: Any

    def __call__(self) -> Any:
        return self.generator


class LogitWorker:
    """Holds a generator and one stepper per open cluster; answers with clipped logit sums."""

    def __init__(self, generator_factory: Any) -> None:
        self.gen = generator_factory()
        self.steppers: dict[str, tuple[Any, int]] = {}  # key -> (stepper, tokens advanced)

    def step(self, key: str, prompts: list[str], prefix: str, released: list[int],
             clip: float) -> np.ndarray:
        """z for the next token of cluster ``key`` after the ``released`` tokens."""
        stepper, done = self.steppers.get(key, (None, 0))
        if stepper is None or done > len(released):
            if stepper is not None:
                stepper.close()
            stepper, done = self.gen.open_stepper(prompts, shared_prefix=prefix), 0
        for tok in released[done:]:
            stepper.advance(int(tok))
        self.steppers[key] = (stepper, len(released))
        return clipped_sum(stepper.logits(), clip)

    def close(self, key: str) -> None:
        stepper, _ = self.steppers.pop(key, (None, 0))
        if stepper is not None:
            stepper.close()


@dataclass
class _Job:
    key: str
    docs: list[str]
    cut: int
    out: list[int]
    steps: int = 0
    done: bool = False


def private_predict_clusters(session: Any, gen: Any, clusters: Sequence[tuple[str, list[str]]],
                             workers: Sequence[Any], *, instruction: str, tokens: int,
                             clip: float, temperature: float,
                             max_doc_tokens: int) -> list[Prediction]:
    """``private_predict`` for every (key, documents) in ``clusters``, the logit sums computed
    by the ``workers`` (Ray actor handles of :class:`LogitWorker`), every token released by
    ``session`` on this process. Returns the predictions in the order of ``clusters``."""
    import ray

    eos = set(getattr(gen, "eos_token_ids", (gen.eos_token_id,)))
    prefix, suffix = prompt_parts(gen, instruction)
    jobs, prompts = [], []
    for key, documents in clusters:
        docs, cut = truncate_documents(gen, documents, max_doc_tokens) if documents else ([], 0)
        jobs.append(_Job(key, docs, cut, []))
        prompts.append(ray.put([d + suffix for d in docs]) if docs else None)
    zero = np.zeros(int(gen.vocab_size))
    for n in range(tokens):
        active = [i for i, job in enumerate(jobs) if not job.done]
        if not active:
            break
        refs = {i: workers[i % len(workers)].step.remote(jobs[i].key, prompts[i], prefix,
                                                         list(jobs[i].out), clip)
                for i in active if jobs[i].docs}
        zs = dict(zip(refs, ray.get(list(refs.values())), strict=True))
        for i in active:  # releases in cluster order, through the one session
            job = jobs[i]
            tok = int(session.private_token(f"{job.key}/tok{n:04d}", zs.get(i, zero), clip,
                                            temperature))
            job.steps = n + 1
            if tok in eos:
                job.done = True
                continue
            job.out.append(tok)
            if n + 1 == tokens:
                job.done = True
    for i, job in enumerate(jobs):
        if job.docs:
            workers[i % len(workers)].close.remote(job.key)
    return [Prediction(clean_text(gen.decode(job.out)) if job.docs else gen.decode(job.out),
                       job.out, job.steps, job.cut) for job in jobs]


def logit_workers(generator_factory: Any, count: int) -> list[Any]:
    """``count`` LogitWorker actors (one CPU each), restarted by Ray if they die."""
    import ray

    remote = ray.remote(LogitWorker).options(num_cpus=1, max_restarts=MAX_RESTARTS,
                                             max_task_retries=MAX_RESTARTS,
                                             scheduling_strategy="SPREAD")
    return [remote.remote(generator_factory) for _ in range(count)]


@dataclass(frozen=True)
class GeneratorSpec:
    """Loads the configured local generator on a worker (``dpsynth.llm.load_generator``)."""

    spec: Any
    batch_size: int

    def __call__(self) -> Any:
        from ..llm import load_generator

        return load_generator(self.spec, batch_size=self.batch_size)


def cluster_predictions(config: Any, session: Any, gen: Any,
                        jobs: Sequence[tuple[int, str, list[str]]], *, instruction: str,
                        tokens: int, clip: float, temperature: float,
                        max_doc_tokens: int) -> dict[int, Prediction]:
    """DP-SynRAG's private prediction of every pending cluster (index, key, documents) on
    ``config.compute`` (engine ray): ``compute.shards`` LogitWorker actors, releases through
    ``session`` here. The caller's generator is shipped as is unless it is the configured local
    model, which each worker loads itself."""
    import ray

    from ..llm.local import LocalGenerator

    if not jobs:
        return {}
    g = config.generators[0]
    factory: Any = (GeneratorSpec(g.spec(), g.batch_size) if isinstance(gen, LocalGenerator)
                    else GivenGenerator(gen))
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
        preds = private_predict_clusters(session, gen, [(key, docs) for _, key, docs in jobs],
                                         workers, instruction=instruction, tokens=tokens,
                                         clip=clip, temperature=temperature,
                                         max_doc_tokens=max_doc_tokens)
    finally:
        for w in workers:
            ray.kill(w)
        if owned:
            ray.shutdown()
    return {r: p for (r, _, _), p in zip(jobs, preds, strict=True)}
