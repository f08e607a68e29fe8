"""A run's private data: where it is read from (the configured file, or the built-in demo
corpus written into the run's private area), how it is loaded and validated, its embeddings,
and the private-statistics engine over it (``compute.engine``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .config import ConfigError, RunConfig
from .on_shards import engine_of
from .run_folder import RunDir

if TYPE_CHECKING:
    from .compute import PrivateCompute
    from .compute.ray_engine import DataSpec, ShardActor


def demo_data_paths(run: RunDir, rows: int, seed: int) -> dict[str, Path]:
    """Write the built-in demo corpus into the run's private area (once) and return its paths."""
    from .demo_corpus import write_demo_corpus

    out = run.private / "demo-data"
    if not (out / "private.csv").is_file():
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        paths = write_demo_corpus(out, n=rows, seed=seed)
        for path in paths.values():  # owner only, as everything in private/
            path.chmod(0o600)
        return paths
    return {p.stem: p for p in out.iterdir() if p.suffix in {".csv", ".json"}}


def data_path(config: RunConfig, run: RunDir) -> str:
    """The private file the run reads (the demo corpus is written into its private area)."""
    path = config.data.path
    if path == "demo":
        path = str(demo_data_paths(run, config.data.demo_rows, config.data.demo_seed)["private"])
    return str(path)


def data_spec(config: RunConfig, run: RunDir, domain: dict[str, list[str]] | None = None,
              fingerprint: str | None = None, n_records: int | None = None) -> DataSpec:
    """How the Ray shards read the run's private file (``fingerprint`` / ``n_records``: the
    driver's own reading to check theirs against, if it read the file)."""
    from .compute.ray_engine import DataSpec

    user_level = config.privacy.unit == "user"
    user = config.data.user if user_level or config.data.user else None
    return DataSpec(path=data_path(config, run), text=config.data.text,
                    labels=tuple(config.data.labels), user=user,
                    max_chars=config.data.max_chars, limit=config.data.limit,
                    label_values=config.data.declared_label_values(), domain=domain,
                    user_level=user_level, fingerprint=fingerprint, n_records=n_records)


def write_staged_records(config: RunConfig) -> None:
    """Records given in memory (``dpsynth.generate`` with a DataFrame) are written to
    ``data.path`` in the run's private area (Parquet, mode 0600) once; a resumed run finds
    them there."""
    import io

    import pyarrow.parquet as pq

    from .files import atomic_write_bytes

    table = config.data.staged_records
    path = Path(config.data.path)
    if table is None or path.is_file():
        return
    buf = io.BytesIO()
    pq.write_table(table, buf)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue(), mode=0o600)


def load_run_data(config: RunConfig, run: RunDir, *, sharded: bool = False,
                  embedder_factory: Any = None,
                  shard_actor: type[ShardActor] | None = None) -> Any:
    """The private dataset of a run (the demo corpus is written into the private area).

    A :class:`dpsynth.data.Dataset` read in chunks, its texts kept in a memory-mapped file
    under ``private/data`` (removed when the dataset is released). With ``sharded`` and
    ``compute.engine: ray``: a :class:`dpsynth.compute.sharded.ShardedDataset`; the shard
    actors read, validate and fingerprint the file, this process never opens it (the demo
    corpus is written here first, into the run's private area). ``embedder_factory`` (e.g.
    ``ray_engine.EmbedderSpec``) lets the shards embed as soon as they start;
    ``shard_actor``: the shard actors' class (a ``ShardActor`` subclass, e.g. the tests'
    fault injection). The runner asks for ``sharded`` unless the method reads per-record
    fields in this process (``Method.sharded_data`` False)."""
    from .data import load_dataset

    write_staged_records(config)
    if config.privacy.unit == "user" and not config.data.user:
        raise ConfigError("privacy.unit is 'user' but data.user names no user column")
    if config.data.deduplicate and config.compute.engine == "ray" and sharded:
        raise ConfigError("data.deduplicate is not available with compute.engine: ray yet "
                          "(the shards would each see only their part of the file); drop the "
                          "duplicates from the file, or run with compute.engine: local")
    if sharded and config.compute.engine == "ray":
        from .compute.sharded import ShardedDataset

        spec = data_spec(config, run, config.data.declared_label_values())
        engine = _ray_engine(config, run, spec, embedder_factory, shard_actor)
        return ShardedDataset(engine, Path(spec.path).name, spec.text, spec.labels, spec.user,
                              spec.label_values)
    path = data_path(config, run)
    user = config.data.user if config.privacy.unit == "user" or config.data.user else None
    dedup = config.data.deduplicate
    dataset = load_dataset(path, config.data.text, config.data.labels, user,
                           max_chars=config.data.max_chars, limit=config.data.limit,
                           label_values=config.data.declared_label_values(),
                           text_dir=run.private / "data",
                           on_duplicate="drop" if dedup else "warn",
                           duplicates_within_user=config.privacy.unit == "user")
    report_duplicates(run, dataset.duplicates, dedup, dataset.source)
    return dataset


def report_duplicates(run: RunDir, count: int, dropped: bool, source: str) -> None:
    """Tell the operator about rows that repeat an earlier row: the exact count goes to
    private/diagnostics.jsonl and to the terminal (the operator's), never to log.txt or
    release/ (docs/methods.md §6)."""
    if not count:
        return
    from .diagnostics import append_diagnostic
    from .progress import warn

    append_diagnostic(run, {"kind": "duplicates", "rows": int(count), "dropped": dropped})
    what = f"{count:,} row{'s' if count != 1 else ''} of {source} repeat{'s' if count == 1 else ''}"
    if dropped:
        warn(f"{what} an earlier row: dropped (data.deduplicate); the count is in "
             "private/diagnostics.jsonl")
    else:
        warn(f"{what} an earlier row (same text and labels) and count{'s' if count == 1 else ''}"
             " as separate records; set data.deduplicate: true to drop them (the count is in "
             "private/diagnostics.jsonl)")


def _ray_engine(config: RunConfig, run: RunDir, spec: DataSpec, embedder_factory: Any,
                shard_actor: type[ShardActor] | None) -> Any:
    from .compute.ray_engine import RayCompute, ShardActor

    c = config.compute
    return RayCompute(spec, embedder_factory, run.private / "compute", c.shards, c.address,
                      c.timeout_s, actor=shard_actor or ShardActor)


def run_engine(config: RunConfig, run: RunDir, dataset: Any, *,
               embeddings: Callable[[], np.ndarray], given_embedder: Any = None,
               shard_actor: type[ShardActor] | None = None) -> PrivateCompute:
    """The private-statistics engine of a run over its dataset (``compute.engine``): with
    ``ray`` the shards that loaded a sharded dataset (or new shards, checked against the
    dataset read here), given the run's embedder (``given_embedder``, a ready object shipped
    to the workers, or the configured model built on each); else this process, with the
    ``embeddings`` (:class:`~dpsynth.compute.embeddings.PrivateEmbeddings`)."""
    from .compute import LocalCompute

    if config.compute.engine == "ray":
        from .compute.ray_engine import EmbedderSpec, GivenEmbedder, RayCompute

        cfg = config.embedder
        factory: Any = (GivenEmbedder(given_embedder) if given_embedder is not None else
                        EmbedderSpec(cfg.model, str(run.private / "embed-cache"),
                                     cfg.batch_size))
        run.log(f"compute: ray, {config.compute.shards} shards at {config.compute.address}")
        engine = engine_of(dataset)
        if not isinstance(engine, RayCompute):
            domain = None if dataset.label_domain is None else dict(dataset.label_domain)
            engine = _ray_engine(config, run, data_spec(config, run, domain,
                                                        dataset.fingerprint(), len(dataset)),
                                 None, shard_actor)
        engine.use_embedder(factory)
        return engine
    return LocalCompute.for_dataset(dataset, config.privacy.unit == "user", run.private,
                                    embeddings)
