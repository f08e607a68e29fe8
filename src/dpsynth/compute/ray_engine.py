"""``compute.engine: ray``: the private rows stay sharded by user on Ray actors.

Each :class:`ShardActor` reads the private file itself, keeps the rows of its user buckets
(:mod:`dpsynth.compute.kernels`), embeds them with an embedder built from a picklable factory,
and keeps the embeddings in its memory (and in ``private/compute/shard-S-of-N.npz`` on its own
node, so a restarted actor or a resumed run does not embed again). The driver ships public
inputs out (candidate embeddings and labels, SecPE's public centres and the Poisson coins
drawn by its session) and receives only partial statistics (vote counts, bounded per-bucket
sums, per-centre sums and counts), which it adds exactly and noises once (docs/methods.md §0).
SecPE's secret membership stays on the shards; its SecretNoise LP runs in a Ray task
(:func:`secret_plan_task`) whose rates go to the shards, never to the driver.

Faults: actors are restarted by Ray (``max_restarts``) and the interrupted call is retried
(``max_task_retries``); a restarted actor reloads its shard file, so the retried partial is the
same and no noise is drawn twice (noise is drawn only by the driver's session).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..io import atomic_write_bytes
from . import PrivateCompute, kernels
from .kernels import ShardData

if TYPE_CHECKING:
    from ..context import PrivateView

#: The kernels a driver may run on a shard (nothing else is callable remotely).
KERNELS = frozenset({"label_count_partial", "knn_partial", "topq_partial", "centre_partial",
                     "masked_label_count_partial"})
TEXT_KERNELS = frozenset({"shard_size", "label_value_partial", "keyword_partial",
                          "word_df_partial", "secret_partial"})
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
    """Holds one shard of private rows; answers with partial statistics only.

    It reads and validates the whole private file (the texts go to a memory-mapped file in
    its node's private compute folder), fingerprints it, keeps its user buckets, and embeds
    them on the first vote (or reloads ``shard-S-of-N.npz``). A label domain or embedder set
    later is kept in that folder too, so an actor restarted by Ray comes back the same."""

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
        self._data: ShardData | None = None
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
        self._reload_secret_rates(None)  # a restarted actor: the run's last saved plan

    def _select(self, domain: dict[str, list[str]] | None) -> None:
        ds = self.full
        if domain is not None and ds.label_domain != domain:
            ds = ds.with_label_domain(domain)
        self.ds = ds
        self.domain = domain
        self.fingerprint = ds.fingerprint() if domain is not None else self.file_fingerprint
        users = ds.users if self.spec.user_level else None
        self.text = kernels.text_shard(ds, users, self.shard_index, self.shards)
        self._data = None
        self.secret_rates: np.ndarray | None = None  # SecPE's, per row of self.text

    def info(self) -> dict[str, Any]:
        """What the driver checks: the whole file's fingerprint (and the selected records'),
        the records in all and on this shard, the file's warnings (or its problems)."""
        if self.problems is not None:
            return {"problems": self.problems}
        return {"file_fingerprint": self.file_fingerprint, "fingerprint": self.fingerprint,
                "content": self.content, "n_records": len(self.ds), "rows": len(self.text),
                "warnings": [p.to_dict() for p in self.full.warnings]}

    def text_sketch(self, key: bytes) -> tuple[int, ...]:
        """The keyed sketch of the texts read (every shard reads the whole file), for the
        budget ledger (:func:`dpsynth.identity.text_sketch`)."""
        return self.full.text_sketch(key)

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
            self._data = None

    @property
    def data(self) -> ShardData:
        """The shard's embeddings and codes (embedded on first use, or reloaded)."""
        if self._data is None:
            self._data = self._embed()
        return self._data

    def _embed(self) -> ShardData:
        if self.embedder_factory is None:
            raise RuntimeError("no embedder was set on this shard")
        codes, _ = self.ds.joint_label_codes()
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
        users = self.text.users
        return ShardData(emb=emb, labels=np.asarray(codes, dtype=np.int64)[rows], rows=rows,
                         buckets=self.text.buckets, rates=self.secret_rates,
                         users=None if users is None or not self.spec.user_level
                         else np.asarray(list(users), dtype=object))

    def ready(self) -> int:
        """Rows held (embeds them if not yet done)."""
        return len(self.data)

    def pid(self) -> int:
        return os.getpid()

    def _fault_point(self, kernel: str) -> None:
        """Fault injection for the tests: a file ``fault-<kernel>-shard<i>`` in the run's
        private compute folder makes this worker die once, mid-call; ``hang-<kernel>-shard<i>``
        makes it stop answering (until the driver kills it)."""
        marker = self.cache_dir / f"fault-{kernel}-shard{self.shard_index}"
        if marker.is_file():
            marker.unlink()
            os._exit(1)
        hang = self.cache_dir / f"hang-{kernel}-shard{self.shard_index}"
        if hang.is_file():
            hang.unlink()
            time.sleep(3600)

    def run(self, kernel: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """(the kernel's partial statistic, seconds the kernel took on this shard)."""
        if kernel not in KERNELS:
            raise ValueError(f"unknown shard kernel {kernel!r}")
        self._fault_point(kernel)
        data = self.data
        start = time.perf_counter()
        out = getattr(kernels, kernel)(data, *args, **kwargs)
        return out, time.perf_counter() - start

    def run_text(self, kernel: str, *args: Any, **kwargs: Any) -> Any:
        """A text and label statistic of the shard (no embeddings needed)."""
        if kernel not in TEXT_KERNELS:
            raise ValueError(f"unknown shard kernel {kernel!r}")
        self._fault_point(kernel)
        return getattr(kernels, kernel)(self.text, *args, **kwargs)

    def rows_embeddings(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, embeddings) of the requested rows this shard holds."""
        keep = np.isin(self.data.rows, rows)
        return self.data.rows[keep], self.data.emb[keep]

    # -- SecPE: this shard's secret membership and Poisson rates ------------------------
    def secret_scan(self, specs: list[Any], chosen: dict[int, list[int]]
                    ) -> tuple[dict[str, Any], list[dict[tuple[str, str], np.ndarray]]]:
        """(counts and public rows, for the driver; this shard's membership, kept here and
        returned as a second object that only the SecretNoise task reads)."""
        self._fault_point("secret_scan")
        facts, self.secret_hits = kernels.secret_scan_partial(self.text, specs, chosen)
        return facts, self.secret_hits

    def _rates_path(self) -> Path:
        return kernels.rates_file(self.cache_dir, self.shard_index, self.shards)

    def _set_rates(self, rates: np.ndarray) -> None:
        self.secret_rates = rates
        if self._data is not None:
            self._data.rates = rates

    def keep_secret_rates(self, digest: str, rates: tuple[np.ndarray, np.ndarray]) -> None:
        """Keep (and save, in this node's private compute folder) the rates of this shard's
        rows out of the plan's (private rows, rates)."""
        mine = kernels.rates_for_rows(rates, self.text.rows)
        kernels.save_rates(self._rates_path(), digest, self.text.rows, mine)
        self._set_rates(mine)

    def _reload_secret_rates(self, digest: str | None) -> bool:
        saved = kernels.load_rates(self._rates_path(), digest)
        if saved is None or not np.array_equal(saved[0], self.text.rows):
            return False
        self._set_rates(saved[1])
        return True

    def load_secret_rates(self, digest: str) -> bool:
        """Whether this shard holds (or reloads) the rates saved under ``digest``."""
        return self._reload_secret_rates(digest)

    def rows_labels(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(global rows, joint label codes) of the requested rows this shard holds."""
        keep = np.isin(self.data.rows, rows)
        return self.data.rows[keep], self.data.labels[keep]

    # -- DP-SynRAG: this shard's documents and what the build keeps about them -------------
    def synrag(self, op: str, *args: Any) -> Any:
        """A DP-SynRAG operation on this shard's documents
        (:class:`dpsynth.methods.synrag.shard.DocumentShard`; its state is saved in this
        node's private compute folder, so a restarted actor picks it up)."""
        from ..methods.synrag.shard import SHARD_OPS, DocumentShard, shard_files

        if op not in SHARD_OPS:
            raise ValueError(f"unknown DP-SynRAG shard operation {op!r}")
        self._fault_point(f"synrag_{op}")
        if getattr(self, "_synrag", None) is None:
            users = self.text.users if self.spec.user_level else None
            self._synrag = DocumentShard.of_records(
                self.text.texts, self.text.rows, users,
                shard_files(self.cache_dir, self.shard_index, self.shards))
        return getattr(self._synrag, op)(*args)


def secret_plan_task(specs: list[Any], n: int, p: float, r: float, T: int,
                     discretization: float, *parts: Any
                     ) -> tuple[tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """SecPE's SecretNoise plan as a Ray task (two returns): Ray resolves ``parts``, the
    shards' membership refs, here; the driver then reads only the summary."""
    from ..methods.secpe_theory import plan_from_hits

    rates, summary = plan_from_hits(list(parts), specs, n, p, r, T,
                                    discretization=discretization)
    return rates, {**summary, "pid": os.getpid()}


def data_spec(config: Any, run: Any, domain: dict[str, list[str]] | None = None,
              fingerprint: str | None = None, n_records: int | None = None) -> DataSpec:
    """The workers' reading of the run's private file (the demo corpus is written into the
    run's private area first)."""
    cfg = config
    path = cfg.data.path
    if path == "demo":
        from ..run_data import demo_data_paths

        path = str(demo_data_paths(run, cfg.data.demo_rows, cfg.data.demo_seed)["private"])
    user_level = cfg.privacy.unit == "user"
    user = cfg.data.user if user_level or cfg.data.user else None
    return DataSpec(path=str(path), text=cfg.data.text, labels=tuple(cfg.data.labels),
                    user=user, max_chars=cfg.data.max_chars, limit=cfg.data.limit,
                    label_values=cfg.data.declared_label_values(), domain=domain,
                    user_level=user_level, fingerprint=fingerprint, n_records=n_records)


def ray_get(refs: Any, timeout_s: float | None, what: str) -> Any:
    """``ray.get(refs)`` that gives up after ``timeout_s`` (``compute.timeout_s``; None: no
    limit) with a :class:`~dpsynth.errors.ComputeError`: a worker that stopped answering (a
    lost node, a hung model) fails the run, which ``--resume`` continues from its last
    checkpoint with the noise already drawn, instead of waiting forever."""
    import ray
    from ray.exceptions import GetTimeoutError

    from ..errors import ComputeError

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
    other than the one the driver validated) raise :class:`~dpsynth.errors.ComputeError`."""

    engine = "ray"

    def __init__(self, spec: DataSpec, embedder_factory: Any, cache_dir: Path, shards: int,
                 address: str, timeout_s: float | None = None) -> None:
        import ray

        super().__init__(user_level=spec.user_level)
        self._ray = ray
        self.timeout_s = timeout_s
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
        from ..errors import ComputeError

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

    @classmethod
    def for_context(cls, ctx: PrivateView) -> RayCompute:
        """The run's engine: the shards that loaded a :class:`ShardedDataset` (given the
        run's embedder now), else new shards checked against the driver's own dataset."""
        cfg = ctx.config
        ds = ctx.dataset
        given = ctx.given_embedder
        factory: Any = (GivenEmbedder(given) if given is not None else EmbedderSpec(
            cfg.embedder.model, str(ctx.run.private / "embed-cache"), cfg.embedder.batch_size))
        ctx.log(f"compute: ray, {cfg.compute.shards} shards at {cfg.compute.address}")
        engine = getattr(ds, "compute", None)
        if isinstance(engine, RayCompute):
            engine.set_embedder(factory)
            return engine
        spec = data_spec(cfg, ctx.run, None if ds.label_domain is None else dict(ds.label_domain),
                         ds.fingerprint(), len(ds))
        return cls(spec, factory, ctx.run.private / "compute", cfg.compute.shards,
                   cfg.compute.address)

    def set_embedder(self, factory: Any) -> None:
        """Give the shards the run's embedder; they embed their rows now (or reload them)."""
        self._get([a.set_embedder.remote(factory) for a in self.actors], "set_embedder")
        self._get([a.ready.remote() for a in self.actors], "the shards' embedding")

    def text_sketch(self, key: bytes) -> tuple[int, ...]:
        """The keyed sketch of the file's texts read (by the first shard: each holds the
        whole file) for the budget ledger."""
        return tuple(self._get(self.actors[0].text_sketch.remote(key), "the data sketch"))

    def set_domain(self, domain: dict[str, list[str]]) -> None:
        """Keep, on every shard, the records whose labels lie in ``domain``."""
        self._check(self._get([a.set_domain.remote(domain) for a in self.actors], "set_domain"))

    def _map_text(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self._get([a.run_text.remote(kernel, *args, **kwargs) for a in self.actors],
                         kernel)

    def n_records(self) -> int:
        return self.n

    def _map(self, kernel: str, *args: Any, **kwargs: Any) -> list[Any]:
        start = time.perf_counter()
        got = self._get([a.run.remote(kernel, *args, **kwargs) for a in self.actors], kernel)
        #: the last call's wall time and per-shard kernel times (for the benchmark)
        self.last_timing = {"kernel": kernel, "wall_s": time.perf_counter() - start,
                            "shard_kernel_s": [t for _, t in got]}
        return [part for part, _ in got]

    def _shared(self, array: np.ndarray) -> Any:
        start = time.perf_counter()
        ref = self._ray.put(array)
        self.last_put_s = time.perf_counter() - start
        return ref

    def _rows(self, method: str, rows: np.ndarray) -> np.ndarray:
        """Per-row values of ``rows`` gathered from the shards, in the order of ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        parts = self._get([getattr(a, method).remote(rows) for a in self.actors], method)
        got = np.concatenate([r for r, _ in parts])
        values = np.concatenate([v for _, v in parts if len(v)] or [parts[0][1]])
        order = np.argsort(got)
        pos = np.searchsorted(got[order], rows)
        return values[order][pos]

    def public_embeddings(self, rows: np.ndarray) -> np.ndarray:
        return self._rows("rows_embeddings", rows)

    def public_labels(self, rows: np.ndarray) -> np.ndarray:
        return self._rows("rows_labels", rows)

    # -- SecPE: the membership stays on the shards, the LP runs in a Ray task ---------------
    def _secret_scan(self, parsed: list[Any], chosen: dict[int, list[int]]
                     ) -> tuple[list[dict[str, Any]], list[Any]]:
        """The shards' counts and public rows; their membership stays as object refs."""
        pairs = [a.secret_scan.options(num_returns=2).remote(parsed, chosen)
                 for a in self.actors]
        return self._get([f for f, _ in pairs], "secret_scan"), [h for _, h in pairs]

    def _secret_plan(self, parts: list[Any], parsed: list[Any], n: int, p: float, r: float,
                     T: int, discretization: float) -> tuple[Any, dict[str, Any]]:
        """SecretNoise in a Ray task over the shards' membership refs (never fetched
        here); (the rates' ref, for the shards; the summary, which this process reads)."""
        task = self._ray.remote(secret_plan_task).options(num_returns=2, num_cpus=0)
        rates, summary = task.remote(parsed, n, p, r, T, discretization, *parts)
        got = self._get(summary, "the SecretNoise plan")
        #: the pid of the process that ran the plan (a Ray worker, not this driver)
        self.secret_plan_pid = int(got.pop("pid"))
        return rates, got

    def keep_secret_rates(self, rates: Any, digest: str, folder: Any = None) -> None:
        """Every shard keeps its rows' rates out of ``rates`` (a ref: resolved on the
        actors) and saves them in its node's private compute folder."""
        self._get([a.keep_secret_rates.remote(digest, rates) for a in self.actors],
                  "keep_secret_rates")

    def load_secret_rates(self, digest: str, folder: Any = None) -> bool:
        return all(self._get([a.load_secret_rates.remote(digest) for a in self.actors],
                             "load_secret_rates"))

    def synrag(self, op: str, *args: Any) -> list[Any]:
        """``ShardActor.synrag(op, *args)`` on every shard, in shard order (DP-SynRAG)."""
        return self._get([a.synrag.remote(op, *args) for a in self.actors], f"synrag {op}")

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
