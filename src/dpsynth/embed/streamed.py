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
    key = {"model": str(getattr(embedder, "cache_key", getattr(embedder, "name", "?"))),
           "n": int(n), "dim": dim}
    state = json.loads(state_path.read_text("utf-8")) if state_path.is_file() else None
    done = 0
    if path.is_file():
        if state is None:  # written whole by np.save (earlier format) or another tool
            try:
                old = np.load(path, mmap_mode="r")
                if old.shape == (n, dim) and old.dtype == np.float32:
                    return np.load(path, mmap_mode="c")
            except ValueError:
                pass
        elif {k: state.get(k) for k in key} == key:
            done = min(int(state.get("rows", 0)), n)
    if done == n and path.is_file():
        return np.load(path, mmap_mode="c")
    path.parent.mkdir(parents=True, exist_ok=True)

    def save_state(rows: int) -> None:
        atomic_write_bytes(state_path, json.dumps({**key, "rows": rows}).encode())
        os.chmod(state_path, 0o600)

    if done == 0:
        save_state(0)  # first: a data file without a state file counts as finished
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
        os.chmod(path, 0o600)
        out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, dim))
    else:
        try:
            out = np.lib.format.open_memmap(path, mode="r+")
            usable = out.shape == (n, dim) and out.dtype == np.float32
        except ValueError:  # not a readable .npy (e.g. cut short): start again
            usable = False
        if not usable:
            out = None
            path.unlink()
            return embed_to_file(embedder, texts, n, path, chunk=chunk, log=log)
    if log is not None:
        # no counts: log.txt sits outside private/ and the number of records is private
        log("embedding the private records" + (" (resuming)" if done else ""))
    encode = getattr(embedder, "encode_uncached", None) or embedder.embed
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
    del out
    return np.load(path, mmap_mode="c")
