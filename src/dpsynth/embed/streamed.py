"""The streamed writer: texts embedded chunk by chunk into a memory-mapped ``.npy`` (mode 0600),
resumed where a stopped run left it."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_bytes
from .protocols import CachedEmbedder, TextEmbedder


def progress_path(path: Path) -> Path:
    """Where :func:`embed_to_file` records the rows of ``path`` written so far."""
    return path.with_name(path.name + ".progress.json")


def embed_to_file(
    embedder: Any,
    texts: Iterable[str],
    n: int,
    path: Path,
    *,
    chunk: int = 4096,
    log: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Embed ``n`` texts from an iterable into the memory-mapped ``.npy`` at ``path``.

    Only ``chunk`` texts are held at a time; the file is created with mode 0600 and
    ``<path>.progress.json`` records the rows written (after they are flushed), so a
    rerun after a crash skips those rows and continues. A finished file (or one written whole
    by ``np.save`` before this format) of the right shape is reused as is. Returns the file as
    a copy-on-write memmap ``[n, dim]`` float32. ``embedder`` needs ``dim`` and ``embed``
    (``encode_uncached`` is used when present, so the vectors skip the sqlite cache).
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    path = Path(path)
    state_path = progress_path(path)
    dim = int(embedder.dim)
    if n == 0:
        return np.empty((0, dim), dtype=np.float32)
    key = {"model": str(embedder.cache_key if isinstance(embedder, CachedEmbedder)
                        else embedder.name if isinstance(embedder, TextEmbedder) else "?"),
           "n": int(n), "dim": dim}
    done, finished = _resume_point(path, state_path, key, n, dim)
    if finished is not None:
        return finished
    path.parent.mkdir(parents=True, exist_ok=True)
    out = _open_output(path, state_path, key, done, n, dim)
    if out is None:  # not a usable .npy (e.g. cut short): start again
        path.unlink()
        return embed_to_file(embedder, texts, n, path, chunk=chunk, log=log)
    if log is not None:
        # no counts: log.txt sits outside private/ and the number of records is private
        log("embedding the private records" + (" (resuming)" if done else ""))
    encode = (embedder.encode_uncached if isinstance(embedder, CachedEmbedder)
              else embedder.embed)
    _write_rows(encode, texts, n, out, done, chunk, lambda rows: _save_state(state_path, key, rows))
    del out
    return np.load(path, mmap_mode="c")


def _resume_point(path: Path, state_path: Path, key: dict[str, Any], n: int,
                  dim: int) -> tuple[int, np.ndarray | None]:
    """(rows already written, the finished file as a copy-on-write memmap or None): a file
    written whole (no state file) of the right shape, or one whose state says all ``n`` rows,
    is finished; a state file of another model, count or dimension counts as 0 rows."""
    state = json.loads(state_path.read_text("utf-8")) if state_path.is_file() else None
    done = 0
    if path.is_file():
        if state is None:  # written whole by np.save (earlier format) or another tool
            try:
                old = np.load(path, mmap_mode="r")
                if old.shape == (n, dim) and old.dtype == np.float32:
                    return done, np.load(path, mmap_mode="c")
            except ValueError:
                pass
        elif {k: state.get(k) for k in key} == key:
            done = min(int(state.get("rows", 0)), n)
    if done == n and path.is_file():
        return done, np.load(path, mmap_mode="c")
    return done, None


def _save_state(state_path: Path, key: dict[str, Any], rows: int) -> None:
    atomic_write_bytes(state_path, json.dumps({**key, "rows": rows}).encode())
    os.chmod(state_path, 0o600)


def _open_output(path: Path, state_path: Path, key: dict[str, Any], done: int, n: int,
                 dim: int) -> np.memmap | None:
    """The ``[n, dim]`` float32 memmap to write: a new one (mode 0600, its state file first:
    a data file without one counts as finished) or the partial one; None when the partial
    file is not a readable ``.npy`` of that shape."""
    if done == 0:
        _save_state(state_path, key, 0)  # first: a data file without one counts as finished
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        os.chmod(path, 0o600)
        return np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    try:
        out = np.lib.format.open_memmap(path, mode="r+")
    except ValueError:  # not a readable .npy (e.g. cut short)
        return None
    return out if out.shape == (n, dim) and out.dtype == np.float32 else None


def _write_rows(encode: Callable[[list[str]], Any], texts: Iterable[str], n: int,
                out: np.memmap, done: int, chunk: int, save_state: Callable[[int], None]) -> None:
    """Embed rows ``done`` to ``n`` of ``texts`` into ``out``, ``chunk`` at a time, flushing
    and recording each chunk; a stream shorter or longer than ``n`` is a ValueError."""
    # a sequence (e.g. the loader's on-disk TextColumn) is read by slices from the first row
    # not yet written; any other iterable is streamed (the rows already written are skipped)
    sliced = isinstance(texts, Sequence) and not isinstance(texts, str)
    stream = iter(()) if sliced else iter(texts)
    if done and not sliced:
        next(itertools.islice(stream, done - 1, done), None)  # skip the rows already written
    row = done
    while row < n:
        take = min(chunk, n - row)
        buf = (list(texts[row : row + take]) if sliced  # type: ignore[index]
               else list(itertools.islice(stream, take)))
        if not buf:
            raise ValueError(f"embed_to_file: {n} texts expected, the stream ended at {row}")
        out[row : row + len(buf)] = encode(buf)
        out.flush()
        row += len(buf)
        save_state(row)
    if (len(texts) > n if sliced else next(stream, None) is not None):  # type: ignore[arg-type]
        raise ValueError(f"embed_to_file: the stream has more than the {n} texts expected")
