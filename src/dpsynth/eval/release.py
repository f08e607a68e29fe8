"""Read what evaluation needs from a run folder, with clear errors for the wrong folder.

Only ``config.yaml``, ``run.json``, ``stats.jsonl`` and ``release/`` are read; the run's
``private/`` area never is. The private data itself, when an evaluation needs it for the
real-data reference and the audits, is read from the path in ``config.yaml`` (the evaluator's
own use, outside the release).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..files import read_jsonl
from ..methods import canonical_name
from ..run_folder import observed_meta
from .common import EvalInputError

#: Methods whose release is ``release/synthetic.jsonl`` (text + labels).
TEXT_METHODS = ("aug_pe", "wasp", "secpe", "zero_shot", "dp_finetune")


@dataclass
class LabeledTexts:
    """Texts with label columns (values as strings)."""

    texts: list[str]
    labels: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class RunRelease:
    """The shareable side of a run folder."""

    root: Path
    meta: dict[str, Any]
    config: dict[str, Any]
    synthetic: LabeledTexts
    zero_shot: LabeledTexts | None
    privacy: dict[str, Any] | None
    summary: dict[str, Any] | None
    stats: list[dict[str, Any]]

    @property
    def method(self) -> str:
        return str(self.meta.get("method") or self.config.get("method") or "unknown")

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.root.name)

    @property
    def data_config(self) -> dict[str, Any]:
        data = self.config.get("data") or {}
        return data if isinstance(data, dict) else {}

    @property
    def label_columns(self) -> list[str]:
        cols = self.data_config.get("labels")
        if cols:
            return [str(c) for c in cols]
        return list(self.synthetic.labels)

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def audit_dir(self) -> Path:
        """Where audits computed on the private data go (operator only, docs/methods.md §6)."""
        return self.root / "private" / "eval"


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise EvalInputError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None
    if not isinstance(obj, dict):
        raise EvalInputError(f"{path}: expected a JSON object")
    return obj


def read_release_texts(path: Path) -> LabeledTexts:
    """Read ``{"text": ..., "labels": {...}}`` lines (synthetic.jsonl / zero_shot.jsonl)."""
    texts: list[str] = []
    labels: dict[str, list[str]] = {}
    for lineno, row in enumerate(read_jsonl(path), 1):
        text = row.get("text")
        if not isinstance(text, str):
            raise EvalInputError(f"{path}, record {lineno}: field 'text' missing or not a string")
        row_labels = row.get("labels") or {}
        if not isinstance(row_labels, dict):
            raise EvalInputError(f"{path}, record {lineno}: field 'labels' is not an object")
        if texts and set(row_labels) != set(labels):
            raise EvalInputError(
                f"{path}, record {lineno}: label columns {sorted(row_labels)} differ from the "
                f"first record's {sorted(labels)}"
            )
        if not texts:
            labels = {str(k): [] for k in row_labels}
        for key, value in row_labels.items():
            labels[str(key)].append(str(value))
        texts.append(text)
    return LabeledTexts(texts, labels)


def load_run(run_dir: str | Path) -> RunRelease:
    """Open a finished PE-family run folder, refusing clearly when it is something else."""
    root = Path(run_dir)
    if not root.is_dir():
        raise EvalInputError(f"{root}: run folder not found")
    meta = _read_json(root / "run.json")
    if meta is None:
        raise EvalInputError(
            f"{root}: not a dpsynth run folder (no run.json); pass the folder that "
            "`dpsynth generate` wrote"
        )
    meta = observed_meta(meta)  # a killed run reads "interrupted", not "running"
    config: dict[str, Any] = {}
    if (root / "config.yaml").is_file():
        try:
            config = yaml.safe_load((root / "config.yaml").read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise EvalInputError(f"{root / 'config.yaml'}: not valid YAML ({err})") from None
    # the registered spelling: old run folders say e.g. `dp_synrag` (methods.ALIASES)
    method = canonical_name(str(meta.get("method") or config.get("method") or ""))
    if method:
        meta = {**meta, "method": method}
    release = root / "release"
    if not release.is_dir():
        status = meta.get("status", "unknown")
        raise EvalInputError(
            f"{root}: no release/ folder (run status: {status}); evaluate a run that "
            "`dpsynth generate` finished"
        )
    synthetic_path = release / "synthetic.jsonl"
    if not synthetic_path.is_file():
        if method == "synrag" or (release / "kb.jsonl").is_file():
            raise EvalInputError(
                f"{root}: a DP-SynRAG run (method {method or 'synrag'}) releases a knowledge "
                "base (release/kb.jsonl), not synthetic.jsonl; `dpsynth eval` evaluates "
                f"synthetic-text runs of the methods {', '.join(TEXT_METHODS)}"
            )
        raise EvalInputError(
            f"{root}: release/synthetic.jsonl is missing (method {method or 'unknown'}, "
            f"status {meta.get('status', 'unknown')})"
        )
    if method and method not in TEXT_METHODS:
        raise EvalInputError(
            f"{root}: run method {method!r} is not one `dpsynth eval` evaluates; "
            f"expected one of {', '.join(TEXT_METHODS)}"
        )
    synthetic = read_release_texts(synthetic_path)
    zs_path = release / "zero_shot.jsonl"
    zero_shot = read_release_texts(zs_path) if zs_path.is_file() else None
    stats: list[dict[str, Any]] = []
    if (root / "stats.jsonl").is_file():
        stats = read_jsonl(root / "stats.jsonl")
    return RunRelease(
        root=root,
        meta=meta,
        config=config if isinstance(config, dict) else {},
        synthetic=synthetic,
        zero_shot=zero_shot,
        privacy=_read_json(release / "privacy.json"),
        summary=_read_json(release / "summary.json"),
        stats=stats,
    )


def file_columns(path: Path) -> list[str]:
    """Column names of a CSV / JSONL / Parquet file (JSONL: keys of the first record)."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".csv":
        return [str(c) for c in pd.read_csv(path, nrows=0).columns]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    with path.open(encoding="utf-8") as fh:
        head = fh.read(1 << 16).lstrip()
    if head.startswith("["):  # a .json file holding one array of objects
        rows = json.loads(path.read_text(encoding="utf-8"))
        return [str(k) for k in rows[0]] if rows and isinstance(rows[0], dict) else []
    for line in head.splitlines():
        if line.strip():
            obj = json.loads(line)
            return [str(k) for k in obj] if isinstance(obj, dict) else []
    return []


def read_columns(path: Path, columns: list[str], limit: int | None = None) -> dict[str, list[str]]:
    """Raw string values of some columns (for PII values); missing columns are skipped."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".csv":
        df = pd.read_csv(path, dtype=str, keep_default_na=False, nrows=limit)
    elif suffix == ".parquet":
        df = pd.read_parquet(path)
    else:
        array = path.read_text(encoding="utf-8").lstrip().startswith("[")
        df = pd.read_json(path, lines=not array, dtype=False)
    if limit is not None:
        df = df.head(limit)
    return {c: [str(v) for v in df[c].tolist()] for c in columns if c in df.columns}


def load_test_data(
    path: str | Path, text: str, labels: list[str], synthetic: LabeledTexts,
    domain: Mapping[str, list[str]] | None = None,
) -> tuple[LabeledTexts, list[str]]:
    """Load the real test file; its label columns must be the synthetic data's, and a value
    outside the run's label ``domain`` (:func:`run_label_domain`) is refused by row (it would
    be scored as a class the run could never produce).

    Returns the data and notes (e.g. label values seen in only one of the two sets).
    """
    from ..data import DataError, load_dataset

    p = Path(path)
    if not p.is_file():
        raise EvalInputError(f"test file not found: {p}")
    try:
        available = file_columns(p)
    except Exception as err:  # noqa: BLE001 - any reader error becomes a clear message
        raise EvalInputError(f"{p}: cannot read its columns ({type(err).__name__})") from None
    if text not in available:
        raise EvalInputError(
            f"{p}: no text column {text!r} (columns: {', '.join(available)}); pass --text"
        )
    missing = [c for c in labels if c not in available]
    if missing:
        raise EvalInputError(
            f"{p}: the test file's labels differ from the synthetic data's: it lacks "
            f"{', '.join(repr(c) for c in missing)} (synthetic labels: "
            f"{', '.join(labels) or 'none'}; test columns: {', '.join(available)}); "
            "pass --label to choose the label columns"
        )
    try:
        ds = load_dataset(p, text, labels=labels, on_duplicate="ignore", max_chars=None,
                          label_values={c: v for c, v in (domain or {}).items()
                                        if c in labels} or None)
    except DataError as err:
        raise EvalInputError(str(err)) from None
    notes: list[str] = []
    for col in labels:
        syn_vals = set(synthetic.labels.get(col, []))
        if not syn_vals:
            raise EvalInputError(
                f"label column {col!r} is in the test file but not in the synthetic data "
                f"(synthetic labels: {', '.join(synthetic.labels) or 'none'})"
            )
        test_vals = set(ds.labels[col])
        if not syn_vals & test_vals:
            raise EvalInputError(
                f"label column {col!r}: the test file's values ({_show(test_vals)}) share none "
                f"with the synthetic data's ({_show(syn_vals)})"
            )
        only_test = test_vals - syn_vals
        if only_test:
            notes.append(
                f"label {col!r}: {len(only_test)} test class(es) never appear in the synthetic "
                f"data ({_show(only_test)})"
            )
    return LabeledTexts(ds.texts, {c: ds.labels[c] for c in labels}), notes


def run_label_domain(release: RunRelease, columns: list[str]) -> dict[str, list[str]]:
    """The label domain of a run per column, where it is known: the declared values of its
    config, else the values a discovered domain released (privacy.json's ``label_domain``);
    a column with neither is left out (nothing to check against)."""
    from ..config import ConfigError, parse_config

    try:
        declared = parse_config(release.config).data.declared_label_values()
    except (ConfigError, ValueError, OSError):
        declared = {}
    found = ((release.privacy or {}).get("label_domain") or {}).get("values") or {}
    out: dict[str, list[str]] = {}
    for c in columns:
        values = declared.get(c) or found.get(c)
        if values:
            out[c] = [str(v) for v in values]
    return out


def _show(values: set[str], n: int = 8) -> str:
    items = sorted(values)
    shown = ", ".join(items[:n])
    return shown + (f", ... ({len(items)} in all)" if len(items) > n else "")


@dataclass
class PrivateData:
    """The private records, loaded for the evaluator's own use (references and audits)."""

    data: LabeledTexts
    path: Path
    pii_values: dict[str, list[str]]
    demo_test: Path | None = None
    _tmp: Any = None

    def close(self) -> None:
        """Remove the temporary folder the demo corpus was written to (if any)."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


PII_HINTS = ("name", "phone", "mail", "tel", "mobile", "ssn", "address")


def load_private_data(
    release: RunRelease, labels: list[str], pii_columns: list[str] | None = None
) -> PrivateData | None:
    """Load the private data named by the run config, or None when it is not reachable.

    ``path: demo`` regenerates the built-in demo corpus (deterministic in rows and seed) in a
    temporary folder of mode 0700 rather than reading the run's private area.
    """
    from ..data import DataError, load_dataset

    data_cfg = release.data_config
    raw_path = str(data_cfg.get("path") or "")
    text_col = str(data_cfg.get("text") or "text")
    user_col = data_cfg.get("user")
    limit = data_cfg.get("limit")
    tmp = None
    demo_test = None
    if raw_path == "demo":
        from ..demo_corpus import write_demo_corpus

        tmp = tempfile.TemporaryDirectory(prefix="dpsynth-eval-")
        Path(tmp.name).chmod(0o700)
        files = write_demo_corpus(
            Path(tmp.name),
            n=int(data_cfg.get("demo_rows", 600)),
            seed=int(data_cfg.get("demo_seed", 0)),
        )
        path = Path(files["private.csv"] if "private.csv" in files else files["private"])
        demo_test = Path(files["test.csv"] if "test.csv" in files else files["test"])
    else:
        path = Path(raw_path)
        if not path.is_absolute():
            path = (release.root / path) if (release.root / path).is_file() else path
        if not raw_path or not path.is_file():
            return None
    try:
        ds = load_dataset(
            path, text_col, labels=labels, user=user_col, on_duplicate="ignore",
            max_chars=None, limit=int(limit) if limit else None,
        )
    except DataError as err:
        raise EvalInputError(f"private data named in the run config: {err}") from None
    if pii_columns is None:
        keep = {text_col, *labels}
        pii_columns = [
            c for c in file_columns(path)
            if c not in keep and any(h in c.lower() for h in PII_HINTS)
        ]
    pii = read_columns(path, pii_columns, limit=int(limit) if limit else None)
    return PrivateData(
        data=LabeledTexts(ds.texts, {c: ds.labels[c] for c in labels}),
        path=path,
        pii_values=pii,
        demo_test=demo_test,
        _tmp=tmp,
    )
