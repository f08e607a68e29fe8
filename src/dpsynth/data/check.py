"""`dpsynth data check`: every problem of a data file and a summary of it, without raising
(:func:`check_dataset`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .dataset import check_label_values
from .loading import read_validated
from .problems import DataProblem


@dataclass
class CheckReport:
    """What :func:`check_dataset` found: errors, warnings and a summary."""

    problems: list[DataProblem]
    warnings: list[DataProblem]
    summary: dict[str, Any]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings allowed)."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "ok": self.ok,
            "summary": self.summary,
            "problems": [p.to_dict() for p in self.problems],
            "warnings": [p.to_dict() for p in self.warnings],
        }


def _stats(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"min": 0, "median": 0.0, "mean": 0.0, "max": 0}
    return {
        "min": int(values.min()),
        "median": float(np.median(values)),
        "mean": round(float(values.mean()), 2),
        "max": int(values.max()),
    }


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def check_dataset(
    path: str | Path,
    text: str,
    labels: Sequence[str] = (),
    user: str | None = None,
    *,
    max_chars: int | None = 20000,
    label_values: Mapping[str, Sequence[str]] | None = None,
    chunk_rows: int | None = None,
) -> CheckReport:
    """Validate ``path`` like :func:`load_dataset` but return every problem and a summary.

    ``summary``: ``file``, ``rows``, ``columns`` (all columns in the file), ``labels`` (per
    label column: class -> count, most frequent first), ``text_chars`` and ``text_words``
    (min / median / mean / max), ``users`` (distinct user ids, or None), ``duplicates``.
    With ``label_values``, values outside the declared domain are errors. Never raises on
    data problems; reads the file in chunks like :func:`load_dataset`.
    """
    if isinstance(labels, str):
        labels = [labels]
    labels = list(labels)
    domain = None if label_values is None else check_label_values(label_values, labels)
    collector, texts, errors, warnings, dup, info = read_validated(
        path, text, labels, user, max_chars, "warn", None, domain, words=True,
        chunk_rows=chunk_rows)
    summary: dict[str, Any] = {"file": str(path), "rows": 0, "columns": [], "labels": {}}
    if collector is not None:
        summary["rows"] = len(texts)
        summary["columns"] = info.available
        for c in labels:
            codes, values = collector.column_codes(c)
            counts = np.bincount(codes[codes >= 0], minlength=len(values))
            order = np.argsort(-counts, kind="stable")
            summary["labels"][c] = {values[i]: int(counts[i]) for i in order if counts[i]}
        summary["text_chars"] = _stats(_concat(collector.lengths))
        summary["text_words"] = _stats(_concat(collector.words or []))
        if user:
            codes, _ = collector.column_codes(user)
            summary["users"] = int(np.unique(codes[codes >= 0]).size)
        else:
            summary["users"] = None
        summary["duplicates"] = int(dup.sum())
    summary["errors"] = len(errors)
    summary["warnings"] = len(warnings)
    return CheckReport(problems=errors, warnings=warnings, summary=summary)
