"""Operator diagnostics: exact facts about the private data (cluster sizes, "cluster is
empty", "fewer than k documents", truncations, record counts) go to the run's
``private/diagnostics.jsonl`` (mode 0600) and nowhere else (docs/methods.md §6): never to
release/, stats.jsonl or log.txt.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .files import read_jsonl

DIAGNOSTICS_FILE = "diagnostics.jsonl"


def diagnostics_path(run: Any) -> Path:
    """``private/diagnostics.jsonl`` of a run (a RunDir or a run folder)."""
    root = Path(run) if isinstance(run, str | Path) else Path(run.root)
    return root / "private" / DIAGNOSTICS_FILE


def append_diagnostic(run: Any, record: dict[str, Any]) -> Path:
    """Append one JSON object (with a UTC ``time`` stamp) to the run's private diagnostics;
    the file is created with mode 0600, the private/ folder with 0700."""
    path = diagnostics_path(run)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record},
                      ensure_ascii=False, default=str) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, line.encode("utf-8"))
    finally:
        os.close(fd)
    return path


def read_diagnostics(run: Any) -> list[dict[str, Any]]:
    """All diagnostics of a run (empty when there are none)."""
    path = diagnostics_path(run)
    if not path.is_file():
        return []
    return read_jsonl(path)
