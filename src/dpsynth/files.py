"""The one place dpsynth writes and reads files.

* Atomic writes (``atomic_write_bytes/text/json``, ``write_jsonl``): write a temp file beside
  the target, fsync it, rename it over the target, fsync the folder. A crash leaves the old
  file or the complete new one, never half of one. A ``mode`` (e.g. ``0o600`` for private/)
  is given to ``os.open`` when the temp file is created (default 0o600), so no byte is ever
  readable by others.
* JSON Lines reads (``iter_jsonl`` streams, ``read_jsonl`` lists): a bad line raises
  :class:`~dpsynth.errors.InputError` naming the file and the line number (never its text).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from .errors import InputError

__all__ = [
    "SHARED_MODE",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "iter_jsonl",
    "read_jsonl",
    "write_jsonl",
]

#: Mode of the files meant to be shared (release/, the shareable report): readable by others.
#: Everything else keeps the default 0o600.
SHARED_MODE = 0o644


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic(path: str | Path, mode: int | None) -> Iterator[IO[bytes]]:
    """Yield a binary handle on a fresh temp file; on success fsync and rename it to ``path``.

    The temp file is created by ``os.open`` with ``mode`` (default 0o600: owner only, the safe
    choice for a tool that handles private data), then set to exactly ``mode`` before anything
    is written."""
    mode = 0o600 if mode is None else mode
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), mode)  # exact, whatever the umask
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, mode: int | None = None) -> None:
    """Write ``data`` to ``path`` atomically (``mode``: the file's permissions, e.g. 0o600)."""
    with _atomic(path, mode) as handle:
        handle.write(data)


def publish_dir(out: Path, build: Callable[[Path], None], current: Callable[[], bool]) -> None:
    """Make the folder ``out`` by ``build(tmp)`` on a temporary sibling renamed into place, so a
    concurrent process never reads a half-written folder. A stale ``out`` (``current()`` false)
    is replaced; if another process renamed a current one into place first, that one stays."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.mkdir()
        build(tmp)
        if out.exists() and not current():
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:  # another process finished first
            if not current():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str, mode: int | None = None) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def user_cache_dir() -> Path:
    """dpsynth's cache of public facts for this user: ``$XDG_CACHE_HOME/dpsynth``, else
    ``~/.cache/dpsynth``."""
    root = os.environ.get("XDG_CACHE_HOME")
    base = Path(root).expanduser() if root else Path.home() / ".cache"
    return base / "dpsynth"


def read_cache_file(path: Path, version: int) -> dict[str, Any]:
    """A cache file of public facts (:func:`write_cache_file`): its contents, or ``{}`` when
    it is missing, unreadable or of another ``version`` (a cache only saves recomputing)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("version") == version else {}


def write_cache_file(path: Path, data: dict[str, Any], version: int,
                     mode: int | None = None) -> None:
    """Write ``data`` with its ``version`` atomically; a cache that cannot be written is
    skipped (it only costs recomputing later)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {**data, "version": version}, mode)
    except OSError:
        pass


def atomic_write_json(path: str | Path, obj: Any, mode: int | None = None) -> None:
    """Write ``obj`` as indented JSON atomically (numpy values and paths are converted)."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=_jsonable) + "\n", mode)


def write_jsonl(path: str | Path, rows: Iterable[dict[str, Any]], *,
                mode: int | None = None) -> int:
    """Write ``rows`` (dicts) as JSON Lines atomically; returns the number of rows."""
    n = 0
    with _atomic(path, mode) as handle:
        for row in rows:
            if not isinstance(row, dict):
                raise TypeError(f"row {n + 1}: expected a dict, got {type(row).__name__}")
            line = json.dumps(row, ensure_ascii=False, default=_jsonable) + "\n"
            handle.write(line.encode("utf-8"))
            n += 1
    return n


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Stream the JSON objects of a JSON Lines file (blank lines skipped).

    Raises :class:`InputError` naming the file and line of the first line that is not valid
    UTF-8, not valid JSON or not an object (the message never quotes the line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: file not found")
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"{path}, line {lineno}: not valid UTF-8 "
                                 f"(column {err.start + 1})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"{path}, line {lineno}: invalid JSON ({err.msg}, "
                                 f"column {err.colno})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{path}, line {lineno}: expected a JSON object, got "
                                 f"{type(obj).__name__}")
            yield obj


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All objects of a JSON Lines file (see :func:`iter_jsonl`)."""
    return list(iter_jsonl(path))
