"""The canary audit loop: plant a secret in n private records, run the method, count hits.

Layout of the output folder::

    OUTPUT/
      private/            mode 0700: the private data with canaries inserted (file mode 0600)
      run/                the generation run on that data (its own release/ and privacy.json)
      audit_canary.json   counts only (also copied to run/private/eval/)

The canary string is the auditor's own secret, not private data, so it is recorded in the
JSON; the indices of the records that carry it are not.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..files import atomic_write_json
from .audits import DEFAULT_CANARY, count_canary_hits, insert_canaries
from .common import EvalInputError


def write_canary_data(
    source: Path, text_column: str, out_dir: Path, canary: str, copies: int, seed: int,
    limit: int | None = None,
) -> tuple[Path, int]:
    """Copy ``source`` into ``out_dir`` (0700) with the canary appended to ``copies`` rows.

    Returns the new file (mode 0600, same format as the source) and the row count.
    """
    import pandas as pd

    suffix = source.suffix.lower()
    if suffix == ".csv":
        df = pd.read_csv(source, dtype=str, keep_default_na=False)
    elif suffix == ".parquet":
        df = pd.read_parquet(source)
    elif suffix in (".jsonl", ".json"):
        array = source.read_text(encoding="utf-8").lstrip().startswith("[")
        df = pd.read_json(source, lines=not array, dtype=False)
    else:
        raise EvalInputError(f"{source}: unsupported data format {suffix!r}")
    if text_column not in df.columns:
        raise EvalInputError(
            f"{source}: no text column {text_column!r} (columns: {', '.join(map(str, df.columns))})"
        )
    if limit is not None:
        df = df.head(limit)
    if copies > len(df):
        raise EvalInputError(
            f"--copies {copies} exceeds the number of private records ({len(df)})"
        )
    texts, _ = insert_canaries(df[text_column].astype(str).tolist(), canary, copies, seed)
    df[text_column] = texts
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(out_dir, 0o700)
    target = out_dir / f"canary_data{suffix if suffix != '.json' else '.jsonl'}"
    if target.suffix == ".csv":
        df.to_csv(target, index=False)
    elif target.suffix == ".parquet":
        df.to_parquet(target, index=False)
    else:
        df.to_json(target, orient="records", lines=True, force_ascii=False)
    os.chmod(target, 0o600)
    return target, len(df)


def canary_report(
    run_dir: Path, canary: str, copies: int, threshold: float = 0.8
) -> dict[str, Any]:
    """Count canary hits in a finished run's release (and in its zero-shot control)."""
    from .release import load_run

    release = load_run(run_dir)
    out: dict[str, Any] = {
        "canary": canary,
        "copies": copies,
        "run_dir": str(run_dir),
        "method": release.method,
        "epsilon": (release.privacy or {}).get("epsilon"),
        "synthetic": count_canary_hits(release.synthetic.texts, canary, threshold),
        "zero_shot": (count_canary_hits(release.zero_shot.texts, canary, threshold)
                      if release.zero_shot is not None else None),
        "note": "exact = the canary's words appear contiguously (case and punctuation "
        "ignored); near = not exact but normalised edit similarity >= threshold. "
        "Zero hits is evidence, not proof, of no memorisation.",
    }
    return out


def run_canary_audit(
    config: str | Path,
    output_dir: str | Path,
    *,
    generate: Callable[..., str | Path],
    canary: str = DEFAULT_CANARY,
    copies: int = 10,
    seed: int = 0,
    threshold: float = 0.8,
    overrides: dict[str, Any] | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Insert the canary into ``copies`` private records, run the configured method, count.

    ``generate(config, run_dir, overrides=..., progress=...)`` runs the method and returns its
    folder (the CLI passes :func:`dpsynth.api.run_generation`). The modified data goes to
    ``OUTPUT/private/`` (0700); the run to ``OUTPUT/run``.
    """
    from ..config import load_config

    out = Path(output_dir)
    cfg = load_config(config, overrides)
    out.mkdir(parents=True, exist_ok=True)
    private_dir = out / "private"
    private_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(private_dir, 0o700)
    source = cfg.data.path
    if source == "demo":
        from ..demo_corpus import write_demo_corpus

        demo_dir = private_dir / "demo-data"
        demo_dir.mkdir(mode=0o700, exist_ok=True)
        source = str(write_demo_corpus(demo_dir, n=cfg.data.demo_rows,
                                       seed=cfg.data.demo_seed)["private"])
    canary_file, n_rows = write_canary_data(
        Path(source), cfg.data.text, private_dir, canary, copies, seed, limit=cfg.data.limit
    )
    run_overrides = dict(overrides or {})
    # absolute: a relative data.path is read from the config file's folder, not from here
    run_overrides["data.path"] = str(Path(canary_file).resolve())
    run_dir = generate(config, out / "run", overrides=run_overrides, progress=progress)
    report = canary_report(Path(run_dir), canary, copies, threshold)
    report["private_records"] = n_rows
    atomic_write_json(out / "audit_canary.json", report)
    audit_dir = Path(run_dir) / "private" / "eval"  # computed on private data: operator only
    audit_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_json(audit_dir / "audit_canary.json", report, mode=0o600)
    return report
