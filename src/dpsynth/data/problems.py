"""Problems found in a private data file: each names the file, the 1-based data row (see
:mod:`dpsynth.data`) and the field, never the cell's text; :class:`DataError` lists every
one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InputError

MAX_LISTED = 20
MAX_PER_KIND = 1000  # problems of one kind kept per file (the rest are counted)


@dataclass
class DataProblem:
    """One problem in a data file; ``row`` is a 1-based data row (see the module docstring)."""

    file: str
    row: int | None
    field: str | None
    message: str
    severity: str = "error"  # "error" | "warning"

    def __str__(self) -> str:
        parts = [self.file]
        if self.row is not None:
            parts.append(f"row {self.row}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        return ", ".join(parts) + f": {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "file": self.file,
            "row": self.row,
            "field": self.field,
            "message": self.message,
            "severity": self.severity,
        }


def format_problems(problems: Sequence[DataProblem], limit: int = MAX_LISTED) -> str:
    lines = [f"  - {p}" for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"  ... and {len(problems) - limit} more")
    return "\n".join(lines)


class DataError(InputError):
    """Invalid input data; ``problems`` lists every problem found (errors first)."""

    def __init__(self, problems: Sequence[DataProblem]):
        self.problems: list[DataProblem] = list(problems)
        n_err = sum(p.severity == "error" for p in self.problems)
        files = sorted({p.file for p in self.problems})
        where = files[0] if len(files) == 1 else ", ".join(files)
        head = f"{n_err} problem{'s' if n_err != 1 else ''} in {where}"
        super().__init__(head + ":\n" + format_problems(self.problems))


class ProblemsByKind:
    """Problems by kind, at most ``MAX_PER_KIND`` kept per kind (the rest are counted)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kept: dict[str, list[DataProblem]] = {}
        self.extra: dict[str, int] = {}

    def add(self, kind: str, problems: Iterable[DataProblem]) -> None:
        kept = self.kept.setdefault(kind, [])
        for p in problems:
            if len(kept) < MAX_PER_KIND:
                kept.append(p)
            else:
                self.extra[kind] = self.extra.get(kind, 0) + 1

    def room(self, kind: str) -> int:
        """How many more problems of ``kind`` are kept (0: only count them)."""
        return MAX_PER_KIND - len(self.kept.get(kind, []))

    def all(self) -> list[DataProblem]:
        out: list[DataProblem] = []
        for kind, kept in self.kept.items():
            out += kept
            if self.extra.get(kind):
                out.append(DataProblem(self.name, None, None,
                                       f"... and {self.extra[kind]} more rows with {kind}"))
        return out
