"""``compute.engine: ray``: the private rows stay sharded by user on Ray actors.

Each :class:`ShardActor` reads the private file itself, keeps the rows of its user buckets
(:mod:`dpsynth.compute.kernels`), embeds them with an embedder built from a picklable factory,
and keeps the embeddings in its memory (and in ``private/compute/shard-S-of-N.npz`` on its own
node, so a restarted actor or a resumed run does not embed again). The driver ships public
inputs out (candidate embeddings and labels, SecPE's public centres and the sampled-row mask
drawn by its session) and receives only partial statistics (vote counts, bounded per-bucket
sums, per-centre sums and counts), which it adds exactly and noises once (docs/methods.md §0).

Faults: actors are restarted by Ray (``max_restarts``) and the interrupted call is retried
(``max_task_retries``); a restarted actor reloads its shard file, so the retried partial is the
same and no noise is drawn twice (noise is drawn only by the driver's session).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import PrivateCompute, kernels
from .kernels import ShardData

if TYPE_CHECKING:
    from ..context import RunContext

#: The kernels a driver may run on a shard (nothing else is callable remotely).
KERNELS = frozenset({"label_count_partial", "knn_partial", "topq_partial", "centre_partial"})
MAX_RESTARTS = 4


@dataclass(frozen=True)
class DataSpec:
    """How a worker reads the private file: the loader's arguments, the (possibly privately
    discovered) label domain, and the driver's fingerprint of the whole file to check against."""

    path: str
    text: str
    labels: tuple[str, ...]
    user: str | None
    max_chars: int | None
    limit: int | None
    label_values: dict[str, list[str]] | None
    domain: dict[str, list[str]] | None
    user_level: bool
    fingerprint: str
    n_records: int


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


def load_shard(spec: DataSpec, shard: int, shards: int, embedder_factory: Any,
               cache_dir: Path) -> ShardData:
    """Read the private file, keep this shard's user buckets, embed them (or reuse the shard's
    cached embeddings). Raises if the file differs from the one the driver validated."""
    from ..data import load_dataset

    ds = load_dataset(spec.path, spec.text, list(spec.labels), spec.user,
                      max_chars=spec.max_chars, limit=spec.limit,
                      label_values=spec.label_values)
    if spec.domain is not None and ds.label_domain != spec.domain:
        ds = ds.with_label_domain(spec.domain)
    if ds.fingerprint() != spec.fingerprint:
        raise RuntimeError(f"shard {shard}: the private file {spec.path} on this node differs "
                           "from the one the driver validated")
    codes, _ = ds.joint_label_codes()
    users = ds.users if spec.user_level else None
    buckets = kernels.buckets_of(kernels.record_keys(len(ds), users))
    rows = np.flatnonzero(kernels.shard_of(buckets, shards) == shard).astype(np.int64)
    cache = cache_dir / f"shard-{shard}-of-{shards}.npz"
    emb = None
    if cache.is_file():
        with np.load(cache) as saved:
            if (str(saved["fingerprint"]) == spec.fingerprint
                    and np.array_equal(saved["rows"], rows)):
                emb = saved["emb"]
    if emb is None:
        texts = [ds.texts[i] for i in rows.tolist()]
        emb = (np.asarray(embedder_factory().embed(texts, progress=False), dtype=np.float32)
               if texts else np.zeros((0, 0), dtype=np.float32))
        cache_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
            np.savez(handle, emb=emb, rows=rows, fingerprint=np.array(spec.fingerprint))
        os.replace(tmp, cache)
    return ShardData(emb=emb, labels=np.asarray(codes, dtype=np.int64)[rows], rows=rows,
                     buckets=buckets[rows],
                     users=None if users is None else np.asarray([users[i] for i in rows],
                                                                 dtype=object))


class ShardActor:
    """Holds one shard of private rows; answers with partial statistics only."""

    def __init__(self, spec: DataSpec, shard: int, shards: int, embedder_factory: Any,
                 cache_dir: str) -> None:
        self.shard_index = shard
        self.cache_dir = Path(cache_dir)
        self.data = load_shard(spec, shard, shards, embedder_factory, self.cache_dir)

    def ready(self) -> int:
        """Rows held (a count, which the driver knows anyway from its own copy)."""
        return len(self.data)

    def pid(self) -> int:
        return os.getpid()

    def _fault_point(self, kernel: str) -> None:
        """Fault injection for the tests: a file ``fault-<kernel>-shard<i>`` in the run's
        private compute folder makes this worker die once, mid-call."""
        marker = self.cache_dir / f"fault-{kernel}-shard{self.shard_index}"
        if marker.is_file():
            marker.unlink()
            os._exit(1)

    def run(self, kernel: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """(the kernel's partial statistic, seconds the kernel took on this shard)."""
        if kernel not in KERNELS:
            raise ValueError(f"unknown shard kernel {kernel!r}")
        self._fault_point(kernel)
        start = time.perf_counter()
        out = getattr(kernels, kernel)(self.data, *args, **kwargs)
        return out, time.perf_counter() - start

    def rows_embeddings(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, embeddings) of the requested rows this shard holds."""
        keep = np.isin(self.data.rows, rows)
        return self.data.rows[keep], self.data.emb[keep]


class RayCompute(PrivateCompute):
    """Shards on Ray actors; the driver adds their partial statistics exactly."""

    engine = "ray"

    def __init__(self, spec: DataSpec, embedder_factory: Any, cache_dir: Path, shards: int,
                 address: str) -> None:
        import ray

        super().__init__(user_level=spec.user_level)
        self._ray = ray
        self._owned = False
        if not ray.is_initialized():
            if address == "local":
                ray.init(num_cpus=shards, include_dashboard=False, log_to_driver=False)
            else:
                try:
                    ray.init(address=address, log_to_driver=False)
                except ConnectionError as err:
                    from ..config import ConfigError

                    raise ConfigError(
                        f"compute.address {address!r}: no Ray cluster answers there ({err}); "
                        "start one with `ray start --head` or set compute.address: local"
                    ) from None
            self._owned = True
        remote = ray.remote(ShardActor).options(
            num_cpus=1, max_restarts=MAX_RESTARTS, max_task_retries=MAX_RESTARTS,
            scheduling_strategy="SPREAD")
        self.shards = shards
        self.last_timing: dict[str, Any] = {}
        self.last_put_s = 0.0
        self.actors = [remote.remote(spec, s, shards, embedder_factory, str(cache_dir))
                       for s in range(shards)]
        try:
            held = ray.get([a.ready.remote() for a in self.actors])
        except Exception:
            self.close()
            raise
        if sum(held) != spec.n_records:
            self.close()
            raise RuntimeError(f"the shards hold {sum(held)} rows, the driver validated "
                               f"{spec.n_records}")

    @classmethod
    def for_context(cls, ctx: RunContext) -> RayCompute:
        cfg = ctx.config
        ds = ctx.dataset
        path = cfg.data.path
        if path == "demo":
            from ..context import demo_data_paths

            path = str(demo_data_paths(ctx.run, cfg.data.demo_rows,
                                       cfg.data.demo_seed)["private"])
        user_level = cfg.privacy.unit == "user"
        user = cfg.data.user if user_level or cfg.data.user else None
        spec = DataSpec(
            path=str(path), text=cfg.data.text, labels=tuple(cfg.data.labels), user=user,
            max_chars=cfg.data.max_chars, limit=cfg.data.limit,
            label_values=cfg.data.declared_label_values(),
            domain=None if ds.label_domain is None else dict(ds.label_domain),
            user_level=user_level, fingerprint=ds.fingerprint(), n_records=len(ds))
        given = getattr(ctx, "_given_embedder", None)
        factory: Any = (GivenEmbedder(given) if given is not None else EmbedderSpec(
            cfg.embedder.model, str(ctx.run.private / "embed-cache"), cfg.embedder.batch_size))
        ctx.log(f"compute: ray, {cfg.compute.shards} shards at {cfg.compute.address}")
        return cls(spec, factory, ctx.run.private / "compute", cfg.compute.shards,
                   cfg.compute.address)

    def _map(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        start = time.perf_counter()
        got = self._ray.get([a.run.remote(kernel, *args, **kwargs) for a in self.actors])
        #: the last call's wall time and per-shard kernel times (for the benchmark)
        self.last_timing = {"kernel": kernel, "wall_s": time.perf_counter() - start,
                            "shard_kernel_s": [t for _, t in got]}
        return [part for part, _ in got]

    def _shared(self, array: np.ndarray) -> Any:
        start = time.perf_counter()
        ref = self._ray.put(array)
        self.last_put_s = time.perf_counter() - start
        return ref

    def public_embeddings(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        parts = self._ray.get([a.rows_embeddings.remote(rows) for a in self.actors])
        got = np.concatenate([r for r, _ in parts])
        emb = np.concatenate([e for _, e in parts if len(e)])
        order = np.argsort(got)
        pos = np.searchsorted(got[order], rows)
        return emb[order][pos]

    def close(self) -> None:
        for actor in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(actor)
        self.actors = []
        if self._owned and self._ray.is_initialized():
            self._ray.shutdown()
            self._owned = False
