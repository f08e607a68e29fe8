"""``compute.engine: ray``: the private rows stay sharded by user on Ray actors.

Each :class:`ShardActor` reads the private file itself, keeps the rows of its user buckets
(:mod:`dpsynth.compute.partition`) as a :class:`~dpsynth.compute.shard.Shard`, embeds them
with an embedder built from a picklable factory, and keeps the embeddings in its memory (and
in ``private/compute/shard-S-of-N.npz`` on its own node, so a restarted actor or a resumed run
does not embed again). The driver ships shard kernels and public inputs out (candidate
embeddings and labels, a method's public parameters) and receives only what the kernels
return: partial statistics, which it adds exactly and noises once (docs/methods.md §0). A
kernel's *kept* results (:meth:`RayCompute.map_keeping`) stay in the object store as refs the
driver never fetches, for a Ray task (:meth:`RayCompute.off_driver`) and later kernels.

Faults: actors are restarted by Ray (``max_restarts``) and the interrupted call is retried
(``max_task_retries``); a restarted actor reloads its shard file (and the kernels their own
files), so the retried partial is the same and no noise is drawn twice (noise is drawn only by
the driver's session).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ComputeError, ConfigError
from ..files import atomic_write_bytes
from .engine import PrivateCompute
from .shard import Shard, check_kernel, kernel_reads_embeddings, text_shard

MAX_RESTARTS = 4


@dataclass(frozen=True)
class DataSpec:
    """How a worker reads the private file: the loader's arguments, the (possibly privately
    discovered) label domain and, when the driver loaded the file itself, its fingerprint and
    record count to check against (``None``: the driver never read the file; the shards'
    values are compared with each other)."""

    path: str
    text: str
    labels: tuple[str, ...]
    user: str | None
    max_chars: int | None
    limit: int | None
    label_values: dict[str, list[str]] | None
    domain: dict[str, list[str]] | None
    user_level: bool
    fingerprint: str | None = None
    n_records: int | None = None


@dataclass(frozen=True)
class EmbedderSpec:
    """Builds the configured embedder on a worker (``dpsynth.embed.Embedder``)."""

    model: str
    cache_dir: str
    batch_size: int

    def __call__(self) -> Any:
        from ..embed import Embedder

        return Embedder(self.model, cache_dir=Path(self.cache_dir), batch_size=self.batch_size)


@dataclass(frozen=True)
class GivenEmbedder:
    """An embedder object given to the run (e.g. a test fake), shipped to workers by pickle."""

    embedder: Any

    def __call__(self) -> Any:
        return self.embedder


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, data, mode=0o600)


def embed_rows(embedder: Any, texts: Any, chunk: int = 4096) -> np.ndarray:
    """Embeddings of a shard's texts, read ``chunk`` at a time (never all as Python text)."""
    from ..columns import chunks_of

    parts = [np.asarray(embedder.embed(c, progress=False), dtype=np.float32)
             for c in chunks_of(texts, chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)


class ShardActor:
    """Holds one shard of private rows; answers with what shard kernels return only.

    It reads and validates the whole private file (the texts go to a memory-mapped file in
    its node's private compute folder), fingerprints it, keeps its user buckets, and embeds
    them when the driver asks (or reloads ``shard-S-of-N.npz``). A label domain or embedder
    set later is kept in that folder too, so an actor restarted by Ray comes back the same.
    Subclasses (e.g. the tests' fault injection) are passed to :class:`RayCompute`."""

    def __init__(self, spec: DataSpec, shard: int, shards: int, embedder_factory: Any,
                 cache_dir: str) -> None:
        import pickle

        from ..data import DataError, load_dataset

        self.shard_index, self.shards, self.spec = shard, shards, spec
        self.cache_dir = Path(cache_dir)
        self.problems: list[dict[str, Any]] | None = None
        self.embedder_factory = embedder_factory
        saved = self.cache_dir / f"embedder-shard{shard}.pkl"
        if embedder_factory is None and saved.is_file():
            self.embedder_factory = pickle.loads(saved.read_bytes())
        try:
            self.full = load_dataset(spec.path, spec.text, list(spec.labels), spec.user,
                                     max_chars=spec.max_chars, limit=spec.limit,
                                     label_values=spec.label_values,
                                     text_dir=self.cache_dir / "texts")
        except DataError as err:
            self.problems = [p.to_dict() for p in err.problems]
            return
        self.file_fingerprint = self.full.fingerprint()
        self.content = self.full.content_digest()  # the file's bytes: its ledger version
        domain = spec.domain
        marker = self.cache_dir / f"domain-shard{shard}.json"
        if marker.is_file():
            domain = json.loads(marker.read_text("utf-8"))
        self._select(domain)

    def _select(self, domain: dict[str, list[str]] | None) -> None:
        """The shard of the records whose labels lie in ``domain`` (a fresh :class:`Shard`:
        the kernels' state of the previous records is dropped)."""
        ds = self.full
        if domain is not None and ds.label_domain != domain:
            ds = ds.with_label_domain(domain)
        self.ds = ds
        self.domain = domain
        self.fingerprint = ds.fingerprint() if domain is not None else self.file_fingerprint
        users = ds.users if self.spec.user_level else None
        self.text = text_shard(ds, users, self.shard_index, self.shards)
        rows = self.text.rows
        self.shard = Shard(
            self.shard_index, self.shards, rows=rows, buckets=self.text.buckets,
            users=None if users is None else np.asarray(list(self.text.users or ()),
                                                        dtype=object),
            labels=lambda: np.asarray(ds.joint_label_codes()[0], dtype=np.int64)[rows],
            embeddings=self._embed, text=lambda: self.text, folder=self.cache_dir)

    def info(self) -> dict[str, Any]:
        """What the driver checks: the whole file's fingerprint (and the selected records'),
        the records in all and on this shard, the file's warnings (or its problems)."""
        if self.problems is not None:
            return {"problems": self.problems}
        return {"file_fingerprint": self.file_fingerprint, "fingerprint": self.fingerprint,
                "content": self.content, "n_records": len(self.ds), "rows": len(self.text),
                "warnings": [p.to_dict() for p in self.full.warnings]}

    def text_sketch(self, key: bytes, normalised: bool = False) -> tuple[int, ...]:
        """The keyed sketch of the texts read (every shard reads the whole file), or of the
        normalised records, for the budget ledger (:func:`dpsynth.identity.text_sketch`)."""
        return self.full.text_sketch(key, normalised)

    def set_domain(self, domain: dict[str, list[str]]) -> dict[str, Any]:
        """Keep the records whose labels lie in ``domain`` (privately discovered)."""
        _write_private(self.cache_dir / f"domain-shard{self.shard_index}.json",
                       json.dumps(domain).encode())
        self._select(domain)
        return self.info()

    def set_embedder(self, factory: Any) -> None:
        import pickle

        _write_private(self.cache_dir / f"embedder-shard{self.shard_index}.pkl",
                       pickle.dumps(factory))
        if factory != self.embedder_factory:
            self.embedder_factory = factory
            self.shard.use_embeddings(self._embed)

    def _embed(self) -> np.ndarray:
        """The shard's embeddings: reloaded from ``shard-S-of-N.npz``, else computed."""
        if self.embedder_factory is None:
            raise RuntimeError("no embedder was set on this shard")
        rows = self.text.rows
        key = json.dumps([self.fingerprint, self.domain], sort_keys=True)
        cache = self.cache_dir / f"shard-{self.shard_index}-of-{self.shards}.npz"
        emb = None
        if cache.is_file():
            with np.load(cache) as saved:
                if str(saved["fingerprint"]) == key and np.array_equal(saved["rows"], rows):
                    emb = saved["emb"]
        if emb is None:
            emb = embed_rows(self.embedder_factory(), self.text.texts)
            buf = io.BytesIO()
            np.savez(buf, emb=emb, rows=rows, fingerprint=np.array(key))
            _write_private(cache, buf.getvalue())
        return emb

    def ready(self) -> int:
        """Rows held (embeds them if not yet done)."""
        return len(self.shard.emb)

    def pid(self) -> int:
        return os.getpid()

    def run(self, kernel: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """(what the shard kernel returns, seconds it took on this shard; for a kernel that
        reads embeddings, after they are loaded)."""
        check_kernel(kernel)
        if kernel_reads_embeddings(kernel):
            self.shard.emb  # noqa: B018 (embedded, or reloaded, outside the kernel's time)
        start = time.perf_counter()
        out = kernel(self.shard, *args, **kwargs)
        return out, time.perf_counter() - start

    def run_keeping(self, kernel: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """A kernel's (shown, kept) pair, as two returns (``num_returns=2``): the driver
        fetches only the first."""
        out, _ = self.run(kernel, *args, **kwargs)
        shown, kept = out
        return shown, kept


def ray_get(refs: Any, timeout_s: float | None, what: str) -> Any:
    """``ray.get(refs)`` that gives up after ``timeout_s`` (``compute.timeout_s``; None: no
    limit) with a :class:`~dpsynth.errors.ComputeError`: a worker that stopped answering (a
    lost node, a hung model) fails the run, which ``--resume`` continues from its last
    checkpoint with the noise already drawn, instead of waiting forever."""
    import ray
    from ray.exceptions import GetTimeoutError

    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        raise ComputeError(
            f"compute.timeout_s: the Ray workers did not answer {what} within {timeout_s:g} s; "
            "check the cluster (or raise compute.timeout_s), then run again with --resume"
        ) from None


class RayCompute(PrivateCompute):
    """Shards on Ray actors; the driver adds their partial statistics exactly.

    Starting it validates the file on every shard: a file with problems raises the loader's
    :class:`~dpsynth.data.DataError` here, and shards that read different files (or a file
    other than the one the driver validated) raise :class:`~dpsynth.errors.ComputeError`.
    ``actor``: the shard actors' class (:class:`ShardActor` or a subclass)."""

    engine = "ray"

    def __init__(self, spec: DataSpec, embedder_factory: Any, cache_dir: Path, shards: int,
                 address: str, timeout_s: float | None = None,
                 actor: type[ShardActor] = ShardActor) -> None:
        import ray

        super().__init__(user_level=spec.user_level)
        self._ray = ray
        self.timeout_s = timeout_s
        self._owned = False
        self._embedder: Any = None  # given by use_embedder, sent before the first vote
        if not ray.is_initialized():
            if address == "local":
                ray.init(num_cpus=shards, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as err:
                    raise ConfigError(
                        f"compute.address {address!r}: no Ray cluster answers there ({err}); "
                        "start one with `ray start --head` or set compute.address: local"
                    ) from None
            self._owned = True
        remote = ray.remote(actor).options(
            num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
            scheduling_strategy="SPREAD")
        self.spec = spec
        self.shards = shards
        self.last_timing: dict[str, Any] = {}
        self.last_put_s = 0.0
        self.actors = [remote.remote(spec, s, shards, embedder_factory, str(cache_dir))
                       for s in range(shards)]
        try:
            self._check(self._get([a.info.remote() for a in self.actors], "the shards' start"))
            if embedder_factory is not None:
                self._get([a.ready.remote() for a in self.actors], "the shards' embedding")
        except BaseException:
            self.close()
            raise

    def _check(self, infos: list[dict[str, Any]]) -> None:
        """Every shard read the same valid file (and the one the driver validated, if it
        did); sets the fingerprint, size and warnings the driver reports."""
        from ..data import DataError, DataProblem

        for info in infos:
            if "problems" in info:
                raise DataError([DataProblem(**p) for p in info["problems"]])
        if len({(i["file_fingerprint"], i["fingerprint"], i["content"], i["n_records"])
                for i in infos}) != 1:
            raise ComputeError(f"the private file {self.spec.path} differs between the nodes "
                               "of the Ray cluster: every node must hold the same file")
        first = infos[0]
        if self.spec.fingerprint is not None and first["fingerprint"] != self.spec.fingerprint:
            raise ComputeError(f"the private file {self.spec.path} on the Ray nodes differs "
                               "from the one the driver validated")
        if sum(i["rows"] for i in infos) != first["n_records"] or (
                self.spec.n_records is not None and first["n_records"] != self.spec.n_records):
            raise ComputeError("the shards do not hold every record exactly once")
        self.fingerprint: str = first["fingerprint"]
        self.file_fingerprint: str = first["file_fingerprint"]
        self.content: str = first["content"]
        self.n: int = first["n_records"]
        self.warnings: list[dict[str, Any]] = first["warnings"]

    def set_embedder(self, factory: Any) -> None:
        """Give the shards the run's embedder; they embed their rows now (or reload them)."""
        self._embedder = None
        self._get([a.set_embedder.remote(factory) for a in self.actors], "set_embedder")
        self._get([a.ready.remote() for a in self.actors], "the shards' embedding")

    def use_embedder(self, factory: Any) -> None:
        """The run's embedder, given to the shards (:meth:`set_embedder`) before the first
        kernel that reads embeddings: a run that votes on nothing embeds nothing."""
        self._embedder = factory

    def text_sketch(self, key: bytes, normalised: bool = False) -> tuple[int, ...]:
        """The keyed sketch of the file's texts read, or of its normalised records (by the
        first shard: each holds the whole file), for the budget ledger."""
        return tuple(self._get(self.actors[0].text_sketch.remote(key, normalised),
                               "the data sketch"))

    def set_domain(self, domain: dict[str, list[str]]) -> None:
        """Keep, on every shard, the records whose labels lie in ``domain``."""
        self._check(self._get([a.set_domain.remote(domain) for a in self.actors], "set_domain"))

    def _before(self, kernel: Any) -> None:
        check_kernel(kernel)
        if self._embedder is not None and kernel_reads_embeddings(kernel):
            self.set_embedder(self._embedder)

    def map(self, kernel: Any, *args: Any, **kwargs: Any) -> list[Any]:
        self._before(kernel)
        name = getattr(kernel, "__name__", "a kernel")
        start = time.perf_counter()
        got = self._get([a.run.remote(kernel, *args, **kwargs) for a in self.actors], name)
        #: the last call's wall time and per-shard kernel times (for the benchmark)
        self.last_timing = {"kernel": name, "wall_s": time.perf_counter() - start,
                            "shard_kernel_s": [t for _, t in got]}
        return [part for part, _ in got]

    def map_keeping(self, kernel: Any, *args: Any, **kwargs: Any
                    ) -> tuple[list[Any], list[Any]]:
        """The shown parts fetched; the kept parts as object refs, never fetched here."""
        self._before(kernel)
        pairs = [a.run_keeping.options(num_returns=2).remote(kernel, *args, **kwargs)
                 for a in self.actors]
        shown = self._get([p for p, _ in pairs], getattr(kernel, "__name__", "a kernel"))
        return shown, [k for _, k in pairs]

    def off_driver(self, fn: Any, *args: Any, returns: int = 1) -> Any:
        """A Ray task (no CPU reserved) that resolves the object refs among ``args``; its
        results as object refs."""
        return self._ray.remote(fn).options(num_returns=returns, num_cpus=0).remote(*args)

    def fetch(self, handle: Any) -> Any:
        return self._get(handle, "a task's result")

    def shared(self, array: np.ndarray) -> Any:
        start = time.perf_counter()
        ref = self._ray.put(array)
        self.last_put_s = time.perf_counter() - start
        return ref

    def n_records(self) -> int:
        return self.n

    def _get(self, refs: Any, what: str) -> Any:
        return ray_get(refs, self.timeout_s, what)

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(actor)
        self.actors = []
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
            self._owned = False
