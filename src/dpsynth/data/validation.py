"""Validation of a data file's records as the chunks come (empty and over-long texts, missing
labels and users, undeclared label values, duplicates), writing the texts to a private
memory-mapped file and coding the label and user columns."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .problems import DataProblem, ProblemsByKind
from .readers import Table

#: characters refused in a text, label or user id: NUL and the other C0 controls but tab,
#: line feed and carriage return, DEL and the C1 controls (they break CSV and JSON tools
#: downstream and hide text from a reader; a NUL cuts a C string short)
CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"


def column_spec_problems(
    name: str, text: str, labels: Sequence[str], user: str | None
) -> list[DataProblem]:
    problems = []
    seen: dict[str, str] = {text: "text"}
    for col in labels:
        if col in seen:
            problems.append(
                DataProblem(name, None, col, f"column given twice (as {seen[col]} and as label)")
            )
        seen[col] = "label"
    if user is not None and user in seen:
        problems.append(
            DataProblem(name, None, user, f"column given twice (as {seen[user]} and as user)")
        )
    return problems


class Collector:
    """Validates the chunks as they come, writes the texts to a private memory-mapped file
    and codes the label and user columns (see :func:`load_dataset`)."""

    def __init__(self, name: str, text: str, labels: Sequence[str], user: str | None,
                 max_chars: int | None, label_values: Mapping[str, list[str]] | None,
                 text_dir: str | Path | None, words: bool, within_user: bool = False) -> None:
        from ..columns import TextWriter

        self.name, self.text, self.labels, self.user = name, text, list(labels), user
        # duplicates: same text and labels (and, with ``within_user``, the same user id)
        self.dup_columns = [*self.labels, *([user] if within_user and user else [])]
        self.max_chars = max_chars
        self.label_values = label_values or {}
        self.errors = ProblemsByKind(name)
        self.read_problems: list[DataProblem] = []
        self.writer = TextWriter(text_dir)
        self.coded = [*self.labels, *([user] if user else [])]
        self.codes: dict[str, list[np.ndarray]] = {c: [] for c in self.coded}
        self.values: dict[str, dict[str, int]] = {c: {} for c in self.coded}
        self.rows: list[np.ndarray] = []
        self.hashes: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []
        self.words: list[np.ndarray] | None = [] if words else None

    def add(self, table: Table) -> None:
        self.read_problems += table.problems
        n = len(table.rows)
        if n == 0:
            return
        rows = table.rows
        self.rows.append(np.asarray(rows, dtype=np.int64))
        self._add_texts(table, rows)
        kinds = [*((c, "label") for c in self.labels), *([(self.user, "user id")]
                                                          if self.user else [])]
        self._check_control(table, rows, [(self.text, "text"), *kinds])
        self._check_missing(table, rows, kinds)
        self._check_declared(table, rows)
        self._code(table)

    def _add_texts(self, table: Table, rows: Any) -> None:
        """Write the chunk's texts; record their lengths (and word counts); refuse empty and
        over-long ones."""
        name, text = self.name, self.text
        t = table.columns[text]
        t_missing = t.isna().to_numpy(dtype=bool)
        t_str = t.fillna("")
        self.writer.write(t_str)
        blank = t_str.str.strip().eq("").to_numpy(dtype=bool)
        self.errors.add("empty text", (
            DataProblem(name, int(rows[i]), text,
                        "missing text" if t_missing[i] else "empty or whitespace-only text")
            for i in np.flatnonzero(blank)))
        lengths = t_str.str.len().to_numpy(dtype=np.int64)
        self.lengths.append(lengths)
        if self.words is not None:
            self.words.append(
                t_str.str.split().str.len().fillna(0).to_numpy(dtype=np.int64))
        if self.max_chars is not None:
            mc = self.max_chars
            self.errors.add("over-long text", (
                DataProblem(
                    name,
                    int(rows[i]),
                    text,
                    f"text has {int(lengths[i]):,} characters, over the limit of {mc:,}; raise "
                    "data.max_chars or shorten it",
                )
                for i in np.flatnonzero(lengths > mc)))

    def _check_control(self, table: Table, rows: Any, kinds: list[tuple[str, str]]) -> None:
        """Refuse control characters in each (column, kind) of ``kinds``."""
        for col, kind in kinds:
            control = table.columns[col].fillna("").astype(str).str.contains(CONTROL, regex=True)
            self.errors.add(f"control characters in {col!r}", (
                DataProblem(self.name, int(rows[i]), col,
                            f"the {kind} holds a control character (NUL or another C0/C1 code "
                            "other than tab and line breaks); remove it from the file")
                for i in np.flatnonzero(control.to_numpy(dtype=bool))))

    def _check_missing(self, table: Table, rows: Any, kinds: list[tuple[str, str]]) -> None:
        """Refuse missing or empty labels and user ids."""
        for col, kind in kinds:
            s = table.columns[col]
            empty = (s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
            self.errors.add(f"missing {kind}", (
                DataProblem(self.name, int(rows[i]), col, f"missing or empty {kind}")
                for i in np.flatnonzero(empty)))

    def _check_declared(self, table: Table, rows: Any) -> None:
        """Refuse label values outside the declared domain (data.label_values)."""
        for col, values in self.label_values.items():
            s = table.columns[col]
            present = ~(s.isna() | s.fillna("").str.strip().eq("")).to_numpy(dtype=bool)
            outside = present & ~s.isin(values).to_numpy(dtype=bool)
            self.errors.add(f"undeclared {col!r} values", (
                DataProblem(
                    self.name,
                    int(rows[i]),
                    col,
                    f"label value ({len(str(s.iat[int(i)]))} characters) is not among the "
                    f"{len(values)} "
                    f"declared values of {col!r} (data.label_values)",
                )
                for i in np.flatnonzero(outside)))

    def _code(self, table: Table) -> None:
        """Code the label and user columns; hash each record's duplicate key."""
        for col in self.coded:
            codes, uniques = pd.factorize(table.columns[col])
            seen = self.values[col]
            remap = np.array([seen.setdefault(str(u), len(seen)) for u in uniques] + [-1],
                             dtype=np.int32)
            self.codes[col].append(remap[codes])
        key_cols = list(dict.fromkeys([self.text, *self.dup_columns]))
        frame = pd.DataFrame({c: table.columns[c].fillna("") for c in key_cols})
        self.hashes.append(pd.util.hash_pandas_object(frame, index=False).to_numpy(np.uint64))

    def finish(self, on_duplicate: str) -> tuple[Any, list[DataProblem], list[DataProblem],
                                                  np.ndarray]:
        """(text column, errors, warnings, duplicate mask) of the whole file."""
        texts = self.writer.finish()
        n = len(texts)
        warnings: list[DataProblem] = []
        if n == 0:
            self.errors.add("no records", [DataProblem(self.name, None, None,
                                                       "no valid records")])
            return texts, self.errors.all(), warnings, np.zeros(0, dtype=bool)
        rows = np.concatenate(self.rows)
        dup, first = self._duplicates(texts)
        if dup.any() and on_duplicate != "ignore":
            what = "same text" + (" and labels" if self.labels else "") + (
                " and user" if self.user in self.dup_columns else "")
            kinds = ProblemsByKind(self.name)
            kinds.add("duplicates", (
                DataProblem(
                    self.name,
                    int(rows[i]),
                    self.text,
                    f"duplicate record ({what} as row {int(rows[first[i]])})"
                    + ("; dropped" if on_duplicate == "drop" else ""),
                    severity="error" if on_duplicate == "error" else "warning",
                )
                for i in np.flatnonzero(dup)))
            if on_duplicate == "error":
                self.errors.add("duplicates", kinds.all())
            else:
                warnings += kinds.all()
        return texts, self.errors.all(), warnings, dup

    def column_codes(self, col: str) -> tuple[np.ndarray, list[str]]:
        """(codes, values in first-seen order) of a label or user column."""
        codes = np.concatenate(self.codes[col]) if self.codes[col] else np.zeros(0, np.int32)
        return codes, list(self.values[col])

    def _duplicates(self, texts: Any) -> tuple[np.ndarray, np.ndarray]:
        """(mask of rows repeating an earlier row's text and labels, that earlier row).

        Rows are matched by a 64-bit hash, then compared exactly (a collision is not a
        duplicate)."""
        h = np.concatenate(self.hashes)
        n = len(h)
        _, first_idx, inverse = np.unique(h, return_index=True, return_inverse=True)
        first = first_idx[inverse.reshape(-1)]
        dup = first != np.arange(n)
        label_codes = [self.column_codes(c)[0] for c in self.dup_columns]
        for i in np.flatnonzero(dup).tolist():
            f = int(first[i])
            if texts[i] != texts[f] or any(c[i] != c[f] for c in label_codes):
                dup[i] = False
        return dup, first
