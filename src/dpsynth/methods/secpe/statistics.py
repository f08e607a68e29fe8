"""SecPE's private statistics over any engine (docs/methods.md §3, docs/architecture.md): the
driver's side of :mod:`dpsynth.methods.secpe.kernels`, through the engine's generic map.

The driver gets exact counts and the public rows of the secret scan, the SecretNoise plan's
summary, per-centre sums and counts, and the public rows' embeddings and labels; the record x
secret membership and the rates never reach it with ``compute.engine: ray`` (kept parts and a
task's results stay in Ray's object store), and the local engine runs the same calls here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...compute import PrivateCompute
from ...compute.kernels import fixed_point_limit, gather_rows, sum_counts
from . import kernels


def _secret_specs(engine: PrivateCompute, specs: Sequence[Any]
                  ) -> tuple[list[Any], dict[int, list[int]]]:
    """Parsed definitions and, for random-word ones, the word ids drawn from the summed
    document frequencies (by word id: the words stay on the shards)."""
    from ...secrets import SecretSpec, choose_random_word_ids

    parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s) for s in specs]
    chosen: dict[int, list[int]] = {}
    if any(s.kind == "random_words" for s in parsed):
        df = sum_counts(engine.map(kernels.word_df_partial))
        chosen = {j: choose_random_word_ids(df, s) for j, s in enumerate(parsed)
                  if s.kind == "random_words"}
    return parsed, chosen


def secret_hits(engine: PrivateCompute, specs: Sequence[Any]
                ) -> tuple[list[Any], list[list[dict[tuple[str, str], np.ndarray]]]]:
    """(parsed definitions, every shard's membership) gathered here: for the tests' cross
    checks only, never SecPE's own path (:func:`secret_split` keeps the membership off the
    driver)."""
    parsed, chosen = _secret_specs(engine, specs)
    return parsed, engine.map(kernels.secret_hits, parsed, chosen)


def secret_split(engine: PrivateCompute, specs: Sequence[Any], *, strict: bool = False) -> Any:
    """The secret scan (docs/methods.md §3): each shard finds its records' secrets (by secret
    id) and keeps that membership; this process gets a :class:`dpsynth.secrets.SecretSplit`,
    the public rows and exact counts, summed. Its ``parts`` are the engine's handles to the
    shards' membership, for :func:`plan_secret_rates` only."""
    from ...secrets import split_from_facts

    parsed, chosen = _secret_specs(engine, specs)
    facts, parts = engine.map_keeping(kernels.secret_scan_partial, parsed, chosen)
    split = split_from_facts(facts, parsed, engine.n_records(), strict=strict)
    split.parts, split.specs = parts, parsed
    return split


def plan_secret_rates(engine: PrivateCompute, split: Any, p: float, r: float, T: int,
                      digest: str, discretization: float | None = None) -> dict[str, Any]:
    """SecretNoise over the shards' membership (:func:`kernels.secret_plan_task`, off the
    driver); the rates go to the shards, which keep (and save, under ``digest``) their rows'
    rates. Returns the plan's summary (``sigma_star``, ``max_rate``, secrets per type);
    ``split.planned_in`` is the pid of the process that solved it. ``discretization``: the
    accountant's grid (``secpe.discretization``)."""
    from .theory import DEFAULT_DISCRETIZATION

    disc = DEFAULT_DISCRETIZATION if discretization is None else float(discretization)
    rates, summary = engine.off_driver(kernels.secret_plan_task, split.specs, split.n_records,
                                       p, r, T, disc, *split.parts, returns=2)
    got = dict(engine.fetch(summary))
    split.planned_in = int(got.pop("pid"))
    engine.map(kernels.keep_rates, digest, rates)
    split.parts = []  # planned: the handles (Ray: object refs) are let go
    return got


def rates_ready(engine: PrivateCompute, digest: str) -> bool:
    """Whether every shard holds (or reloads from its saved plan) the rates of ``digest``."""
    return all(engine.map(kernels.has_rates, digest))


def centre_sums(engine: PrivateCompute, centres: dict[int, np.ndarray], coins: np.ndarray,
                clip_R: float, n_records: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per label, exact per-centre sums (float64) and counts of the sampled rows clipped to R.
    ``coins``: one uniform per record in global row order, drawn by the driver's session and
    shipped as one shared object; each shard samples row i iff coins[i] < its rate."""
    fixed_point_limit(clip_R, n_records, "centre sums", "secpe.clip")
    parts = engine.map(kernels.centre_partial,
                       engine.shared(np.asarray(coins, dtype=np.float64)), centres, clip_R)
    return kernels.sum_centre_partials(parts)


def public_embeddings(engine: PrivateCompute, rows: np.ndarray) -> np.ndarray:
    """Embeddings of ``rows`` (records without a secret, which SecPE treats as public), in
    that order."""
    return gather_rows(engine.map(kernels.rows_embeddings, np.asarray(rows, np.int64)), rows)


def public_labels(engine: PrivateCompute, rows: np.ndarray) -> np.ndarray:
    """Joint label codes of ``rows`` (public rows only), in that order."""
    return gather_rows(engine.map(kernels.rows_labels, np.asarray(rows, np.int64)), rows)


def masked_label_counts(engine: PrivateCompute, take: np.ndarray, n_labels: int
                        ) -> np.ndarray:
    """Exact label histogram (int64) of the rows in ``take`` (a global boolean mask)."""
    parts = engine.map(kernels.masked_label_count_partial,
                       engine.shared(np.asarray(take, dtype=bool)), n_labels)
    return np.sum(parts, axis=0, dtype=np.int64)
