"""A run is a folder.

    RUN_DIR/
      config.yaml      the resolved configuration
      run.json         run id, method, status, dataset fingerprint, times
      stats.jsonl      one line of aggregate statistics per iteration (safe to share)
      log.txt          progress log; never holds private text
      private/         mode 0700: noise draws, checkpoints, caches of private embeddings and
                       prompts; nothing here may leave the machine
      release/         only what is safe to share: synthetic data, privacy.json, summary.json
                       (mode 0755, its files 0644: readable by others, unlike private/)

Every file is written atomically through :mod:`dpsynth.files` (temp file, fsync, rename), so a
crash leaves either the old or the new version, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import MissingFileError, OutputFolderError
from .files import atomic_write_json, atomic_write_text, read_jsonl, write_jsonl


class RunDir:
    """Paths and small persistent pieces of one run. ``on_checkpoint``: called with the name
    of each checkpoint once it is saved (a caller's hook, e.g. a test's stop)."""

    def __init__(self, root: str | Path,
                 on_checkpoint: Callable[[str], None] | None = None) -> None:
        self.root = Path(root)
        self.on_checkpoint = on_checkpoint

    @property
    def private(self) -> Path:
        return self.root / "private"

    @property
    def release(self) -> Path:
        return self.root / "release"

    @property
    def config_path(self) -> Path:
        return self.root / "config.yaml"

    @property
    def meta_path(self) -> Path:
        return self.root / "run.json"

    @property
    def stats_path(self) -> Path:
        return self.root / "stats.jsonl"

    @property
    def log_path(self) -> Path:
        return self.root / "log.txt"

    @property
    def anchor_path(self) -> Path:
        """The folder's anchor (:data:`ANCHOR`)."""
        return self.private / ANCHOR

    def folder_identity(self) -> dict[str, Any]:
        """What names this folder and no copy of it: its resolved path, its directory's
        (device, inode), and its anchor file's inode, inode change time (ns) and random nonce
        (:data:`ANCHOR`; made here for a folder from before anchors). A ledger reservation is
        bound to it (:mod:`dpsynth.runner`), so a copied, moved or restored folder cannot
        resume or release a reservation made here, even where the file system gives a
        restored copy the freed inode numbers of the original."""
        make_anchor(self.anchor_path)
        st, anchor = self.root.stat(), self.anchor_path.stat()
        return {"path": str(self.root.resolve()), "device": int(st.st_dev),
                "inode": int(st.st_ino),
                "anchor": {"inode": int(anchor.st_ino), "ctime_ns": int(anchor.st_ctime_ns),
                           "nonce": self.anchor_path.read_text(encoding="ascii").strip()}}

    def exists(self) -> bool:
        return self.meta_path.is_file()

    def check_new_output(self) -> None:
        """Refuse to lay a run into a folder that holds something else (a file, or a non-empty
        folder that is not a run): the run's files would land beside the user's."""
        if self.root.exists() and not self.root.is_dir():
            raise OutputFolderError(f"{self.root} is a file, not a folder: choose another --output")
        if self.root.is_dir() and not self.exists() and any(self.root.iterdir()):
            raise OutputFolderError(
                f"{self.root} exists, is not empty and is not a dpsynth run folder: choose a new "
                "or empty --output folder")

    def discard(self, keep_root: bool) -> None:
        """Remove a run folder that a refusal left before any work began (nothing in it is worth
        keeping: no noise was drawn, no model called). ``keep_root``: the folder itself existed
        (empty) before the run and stays."""
        for child in (self.private, self.release):
            shutil.rmtree(child, ignore_errors=True)
        for path in (self.config_path, self.meta_path, self.stats_path, self.log_path):
            path.unlink(missing_ok=True)
        if not keep_root:
            with contextlib.suppress(OSError):
                self.root.rmdir()

    def end_attempt(self, status: str, *, error: str | None = None, reason: str | None = None,
                    llm_calls: int = 0, **fields: Any) -> dict[str, Any]:
        """Record how this attempt ended, truthfully: the status (finished, failed,
        interrupted), the error class and a short reason (never private text), and the LLM calls
        this attempt paid; earlier attempts are kept in ``history``."""
        meta = self.meta()
        history = list(meta.get("history", []))
        history.append({"attempt": int(meta.get("attempts", 1)), "status": status,
                        "error": error, "reason": reason, "llm_calls": int(llm_calls)})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return self.update_meta(status=status, error=error, reason=reason, history=history,
                                llm_calls_paid=sum(h["llm_calls"] for h in history),
                                finished=now if status == "finished" else None,
                                ended=now, **fields)

    def create(self, config_yaml: str, method: str) -> dict[str, Any]:
        """Lay out a new run folder; refuses to overwrite an existing run."""
        if self.exists():
            raise OutputFolderError(
                f"{self.root} already holds a run: use --resume to continue it, "
                "or choose another --output"
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.private.mkdir(mode=0o700, exist_ok=True)
            os.chmod(self.private, 0o700)
            self.release.mkdir(mode=0o755, exist_ok=True)
            os.chmod(self.release, 0o755)  # the part meant to be shared: readable by others
            make_anchor(self.anchor_path)
            atomic_write_text(self.config_path, config_yaml)
        except OSError as err:
            raise OutputFolderError(f"{self.root}: cannot create the run folder "
                                    f"({err.strerror or type(err).__name__}); choose another "
                                    "--output") from None
        meta = {
            "run_id": uuid.uuid4().hex[:12],
            "method": method,
            "status": "running",
            "process": this_process(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "finished": None,
            "attempts": 1,
        }
        atomic_write_json(self.meta_path, meta)
        return meta

    def meta(self) -> dict[str, Any]:
        """run.json; a run whose status says "running" while the process that runs it is gone
        (killed: it could not record its end) is recorded and returned as "interrupted"."""
        stored = self._stored_meta()
        meta = observed_meta(stored)
        if meta != stored:
            with contextlib.suppress(OSError):
                atomic_write_json(self.meta_path, meta)
        return meta

    def _stored_meta(self) -> dict[str, Any]:
        if not self.exists():
            raise MissingFileError(f"{self.root}: not a dpsynth run folder (no run.json)")
        return json.loads(self.meta_path.read_text(encoding="utf-8"))

    def update_meta(self, **fields: Any) -> dict[str, Any]:
        meta = self._stored_meta()
        meta.update(fields)
        atomic_write_json(self.meta_path, meta)
        return meta

    # -- checkpoints (private) -------------------------------------------------------------
    def checkpoint_path(self, name: str) -> Path:
        return self.private / "checkpoints" / f"{name}.json"

    def save_checkpoint(self, name: str, state: dict[str, Any]) -> None:
        path = self.checkpoint_path(name)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        atomic_write_json(path, state, mode=0o600)
        if self.on_checkpoint is not None:
            self.on_checkpoint(name)

    def load_checkpoint(self, name: str) -> dict[str, Any] | None:
        path = self.checkpoint_path(name)
        if not path.is_file():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    # -- statistics (safe to share: aggregates only) -----------------------------------------
    def append_stats(self, row: dict[str, Any]) -> None:
        """Record one iteration's aggregates; a resumed iteration replaces its earlier line."""
        rows = [r for r in self.stats() if r.get("iteration") != row.get("iteration")]
        rows.append(row)
        rows.sort(key=lambda r: r.get("iteration", 0))
        write_jsonl(self.stats_path, rows)

    def stats(self) -> list[dict[str, Any]]:
        if not self.stats_path.is_file():
            return []
        return read_jsonl(self.stats_path)

    def log(self, message: str) -> None:
        """Append a progress line, also shown on the run's progress display (the terminal).
        Callers pass counts and names, never private text."""
        from .progress import note

        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(f"{stamp} {message}\n")
        note(message)


#: the anchor file of a run folder (under private/): made once, with a random nonce, when the
#: folder is created, and never written again. Its inode change time is set by the kernel when
#: it is made; a copy (cp, tar, rsync, a restored backup) can carry its bytes and its mtime but
#: never its inode and inode change time, so (inode, ctime, nonce) names this folder only
ANCHOR = "folder-id"


def make_anchor(path: Path) -> None:
    """Create the anchor file ``path`` (mode 0600) with a random nonce, unless it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(uuid.uuid4().hex + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def observed_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """run.json as it is now: a run whose status says "running" while the process that runs
    it is gone (killed: it could not record its end) reads as "interrupted" (a new dict)."""
    if meta.get("status") != "running" or not process_gone(meta.get("process")):
        return meta
    return {**meta, "status": "interrupted", "ended": None,
            "reason": "its process ended without recording its end (killed)"}


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, /proc; None where unknown)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_process() -> dict[str, Any]:
    """Who runs an attempt: host, pid and the pid's start time (so a reused pid is not it)."""
    return {"host": os.uname().nodename, "pid": os.getpid(), "start": _start_ticks(os.getpid())}


def process_gone(process: dict[str, Any] | None) -> bool:
    """Whether the process recorded by :func:`this_process` has ended (False where it cannot
    be told: another host, or nothing recorded)."""
    if not isinstance(process, dict) or process.get("host") != os.uname().nodename:
        return False
    pid = process.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # it exists, under another user
    start = process.get("start")
    return start is not None and _start_ticks(pid) not in (None, start)


class RunInterrupted(KeyboardInterrupt):
    """The run was asked to stop by a signal (SIGTERM); handled like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Turn SIGTERM into :class:`RunInterrupted` while a run works, so that a terminated run ends
    through the same path as Ctrl-C and records a true status (no effect off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: Any) -> None:
        raise RunInterrupted(signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def interruption_reason(err: BaseException) -> str:
    """SIGTERM / SIGINT for a stopped run."""
    return err.signal_name if isinstance(err, RunInterrupted) else "SIGINT"
