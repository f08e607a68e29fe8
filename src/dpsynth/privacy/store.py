"""The release store: durable noisy releases of one run, replayed on resume (docs/methods.md §0).

Layout: ``store_dir/releases.jsonl`` (one JSON line per release: key, privacy events, value, noise
mode, time, and the store ``format``: 2 since Gaussian releases are discrete; a line without it
was written by the floating-point sampler and marks the store :attr:`ReleaseStore.legacy`),
``store_dir/releases/<sha256(key)>.npy`` for arrays of more than 4096 elements, and
``store_dir/.lock``. A store is written by one process at a time: opening it takes an exclusive
``fcntl.flock`` on the lock file, which fails at once with :class:`StoreLockedError` when another
process holds it, and is released on :meth:`ReleaseStore.close` or when the process exits. Within
one process a newer store object on the same folder takes the lock over and the older one can no
longer write (a stale handle never appends behind a newer one's back).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..files import atomic_write_bytes
from .errors import PrivacyConfigError
from .events import Event, event_from_dict

log = logging.getLogger("dpsynth.privacy")

INLINE_MAX = 4096
#: Format of the records written (2: Gaussian releases are exact discrete Gaussians).
STORE_FORMAT = 2
STORE_FILE = "releases.jsonl"
LOCK_FILE = ".lock"


class StoreLockedError(PrivacyConfigError):
    """Another process has the release store open for writing."""


def _key_file(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + ".npy"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _HeldLock:
    """One flock on a store's lock file, held by this process on behalf of one store object."""

    def __init__(self, fd: int, owner: ReleaseStore) -> None:
        self.fd = fd
        self.owner: weakref.ref[ReleaseStore] = weakref.ref(owner)


_HELD: dict[str, _HeldLock] = {}
_HELD_GUARD = threading.Lock()


def _acquire(store: ReleaseStore) -> None:
    """Take the store's lock for ``store`` (see the module docstring)."""
    lock_path = store.store_dir / LOCK_FILE
    ident = os.path.realpath(lock_path)
    with _HELD_GUARD:
        held = _HELD.get(ident)
        if held is not None:
            old = held.owner()
            if old is not None and old is not store:
                old._writable = False
            held.owner = weakref.ref(store)
            return
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise StoreLockedError(
                f"release store {store.store_dir} is open for writing in another process; "
                "wait for that run to finish (or stop it) before resuming this one"
            ) from None
        _HELD[ident] = _HeldLock(fd, store)


def held_by_another_process(store_dir: Path | str) -> bool:
    """Whether another process holds the store's lock (a run still writing it); a probe that
    takes and drops the lock at once, for refusing a ``--resume`` before anything is touched."""
    lock_path = Path(store_dir) / LOCK_FILE
    if not lock_path.exists():
        return False
    with _HELD_GUARD:
        if os.path.realpath(lock_path) in _HELD:
            return False
        fd = os.open(lock_path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)  # closing the descriptor drops a lock taken through it
    return False


def _release(store: ReleaseStore) -> None:
    ident = os.path.realpath(store.store_dir / LOCK_FILE)
    with _HELD_GUARD:
        held = _HELD.get(ident)
        if held is None or held.owner() not in (store, None):
            return
        del _HELD[ident]
        with contextlib.suppress(OSError):
            fcntl.flock(held.fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(held.fd)


class ReleaseStore:
    """Persistence of releases: replay, value codec, append-only durable writes, the lock."""

    def __init__(self, store_dir: Path) -> None:
        self.store_dir = Path(store_dir)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        (self.store_dir / "releases").mkdir(exist_ok=True)
        self.path = self.store_dir / STORE_FILE
        self._writable = False
        _acquire(self)
        self._writable = True
        self.records: dict[str, dict[str, Any]] = {}
        #: a record of this store predates the discrete Gaussian sampler (format < 2)
        self.legacy = False
        self._replay()

    # -- lifecycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the lock (idempotent); the store can no longer write."""
        if self._writable:
            self._writable = False
            _release(self)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # -- replay --------------------------------------------------------------------------------
    def _replay(self) -> None:
        if not self.path.exists():
            return
        raw = self.path.read_bytes()
        good_end = 0
        pos = 0
        lineno = 0
        while pos < len(raw):
            nl = raw.find(b"\n", pos)
            lineno += 1
            if nl < 0:
                # A line without its newline is a write interrupted by a crash: that release was
                # never returned to the caller, so it is dropped (and cut off the file).
                log.warning("%s: dropping an incomplete last line (interrupted write)", self.path)
                break
            line = raw[pos:nl]
            pos = nl + 1
            if not line.strip():
                good_end = pos
                continue
            try:
                rec = json.loads(line)
                events = [event_from_dict(d) for d in rec["events"]]
                key = rec["key"]
                fmt = int(rec.get("format", 1))
            except (ValueError, KeyError, TypeError) as err:
                raise PrivacyConfigError(
                    f"{self.path}, line {lineno}: corrupt release record ({type(err).__name__})"
                ) from None
            if key in self.records:
                raise PrivacyConfigError(f"{self.path}, line {lineno}: duplicate key {key!r}")
            rec["_events"] = events
            self.records[key] = rec
            if fmt < STORE_FORMAT:
                self.legacy = True
            good_end = pos
        if good_end < len(raw):
            with open(self.path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

    # -- codec ---------------------------------------------------------------------------------
    def _encode(self, key: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {"kind": "none"}
        if isinstance(value, bool | np.bool_):
            return {"kind": "bool", "data": bool(value)}
        if isinstance(value, int | np.integer):
            return {"kind": "int", "data": int(value)}
        if isinstance(value, float | np.floating):
            return {"kind": "float", "data": float(value)}
        if isinstance(value, np.ndarray):
            if value.dtype == object:
                raise PrivacyConfigError(f"release {key!r}: object arrays cannot be stored")
            if value.size > INLINE_MAX:
                rel = f"releases/{_key_file(key)}"
                final = self.store_dir / rel
                buf = io.BytesIO()
                np.save(buf, value, allow_pickle=False)
                atomic_write_bytes(final, buf.getvalue(), mode=0o600)
                return {"kind": "npy", "file": rel, "dtype": str(value.dtype)}
            return {
                "kind": "array",
                "dtype": str(value.dtype),
                "shape": list(value.shape),
                "data": value.ravel().tolist(),
            }
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise PrivacyConfigError(
                f"release {key!r}: value of type {type(value).__name__} cannot be stored"
            ) from None
        return {"kind": "json", "data": value}

    def decode(self, enc: dict[str, Any]) -> Any:
        """The value of a stored record's ``value`` field."""
        kind = enc["kind"]
        if kind == "none":
            return None
        if kind in ("bool", "int", "float", "json"):
            return enc["data"]
        if kind == "array":
            return np.asarray(enc["data"], dtype=np.dtype(enc["dtype"])).reshape(enc["shape"])
        if kind == "npy":
            return np.load(self.store_dir / enc["file"], allow_pickle=False)
        raise PrivacyConfigError(f"unknown stored value kind {kind!r}")

    # -- access --------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether ``key`` was released."""
        return key in self.records

    def value(self, key: str) -> Any:
        """The stored value of ``key`` (KeyError when it was never released)."""
        if key not in self.records:
            raise KeyError(f"no release stored under key {key!r}")
        return self.decode(self.records[key]["value"])

    def events(self, key: str) -> list[Event]:
        """The privacy events ``key`` was released with."""
        return list(self.records[key]["_events"])

    def write(self, key: str, events: list[Event], value: Any, noise_mode: str) -> None:
        """Append one release durably (fsync) before it is returned to anyone."""
        if not self._writable:
            raise PrivacyConfigError(
                f"release store {self.store_dir}: this handle is closed or was superseded by a "
                "newer one in this process; it cannot write"
            )
        if key in self.records:
            raise PrivacyConfigError(f"release {key!r} is already stored")
        rec = {
            "key": key,
            "events": [e.to_dict() for e in events],
            "value": self._encode(key, value),
            "noise": noise_mode,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "format": STORE_FORMAT,
        }
        line = json.dumps(rec, allow_nan=True, separators=(",", ":")) + "\n"
        created = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # owner only
        with os.fdopen(fd, "ab") as fh:
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            _fsync_dir(self.store_dir)
        rec["_events"] = events
        self.records[key] = rec
