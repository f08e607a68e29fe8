"""Cross-run budget ledger: how much of each dataset's privacy budget runs have used.

Runs on the same data compose. The ledger sums them by basic composition (epsilons add, deltas
add), which is always sound. A run first *reserves* its planned (epsilon, delta); the reservation
counts until the run *settles* with what it actually spent, so a run that crashes keeps counting.
The file is JSON, replaced atomically, and guarded by an fcntl lock for concurrent runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import BudgetRefusedError, PrivacyConfigError

LEDGER_ENV = "DPSYNTH_LEDGER"


def default_ledger_path() -> Path:
    """``$DPSYNTH_LEDGER`` or ``~/.dpsynth/ledger.json``."""
    env = os.environ.get(LEDGER_ENV)
    return Path(env).expanduser() if env else Path.home() / ".dpsynth" / "ledger.json"


def dataset_fingerprint(texts: Iterable[str], extra: str = "") -> str:
    """sha256 over the texts in order (each length-prefixed, so boundaries are unambiguous) and
    ``extra`` (e.g. the label column); identifies a private dataset without storing any of it."""
    h = hashlib.sha256()
    for t in texts:
        b = str(t).encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    h.update(b"\x00extra\x00")
    h.update(extra.encode("utf-8"))
    return h.hexdigest()


def _check_amount(name: str, value: float, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PrivacyConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (upper is not None and value >= upper):
        rng = f"[0, {upper})" if upper is not None else ">= 0"
        raise PrivacyConfigError(f"{name} must be in {rng}, got {value!r}")
    return float(value)


class BudgetLedger:
    """A JSON ledger of reservations and settlements per dataset fingerprint."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_ledger_path()

    # -- file handling -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"version": 1, "entries": []}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except ValueError:
            raise PrivacyConfigError(f"{self.path}: the budget ledger is not valid JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise PrivacyConfigError(f"{self.path}: the budget ledger has no 'entries' list")
        return data

    def _save(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- accounting ----------------------------------------------------------------------------
    @staticmethod
    def _counted(entry: dict[str, Any]) -> tuple[float, float]:
        """What an entry counts: the actual spend once settled, else the reservation."""
        if entry.get("status") == "settled":
            return float(entry["epsilon"]), float(entry["delta"])
        return float(entry["reserved_epsilon"]), float(entry["reserved_delta"])

    @classmethod
    def _sum(cls, entries: list[dict[str, Any]], dataset: str, skip_run: str | None = None):
        eps = delta = 0.0
        for e in entries:
            if e["dataset"] == dataset and e["run_id"] != skip_run:
                de, dd = cls._counted(e)
                eps += de
                delta += dd
        return eps, delta

    def reserve(
        self,
        dataset: str,
        run_id: str,
        epsilon: float,
        delta: float,
        total_epsilon: float | None,
        total_delta: float | None,
    ) -> None:
        """Reserve (epsilon, delta) of ``dataset``'s total for ``run_id``, or raise
        BudgetRefusedError. Re-reserving the same run (a resume) replaces its reservation."""
        if not dataset or not run_id:
            raise PrivacyConfigError("dataset and run_id must be non-empty strings")
        epsilon = _check_amount("epsilon", epsilon)
        delta = _check_amount("delta", delta, 1.0)
        if total_epsilon is not None:
            total_epsilon = _check_amount("total_epsilon", total_epsilon)
        if total_delta is not None:
            total_delta = _check_amount("total_delta", total_delta, 1.0)
        with self._locked():
            data = self._load()
            entries = data["entries"]
            existing = next(
                (e for e in entries if e["dataset"] == dataset and e["run_id"] == run_id), None
            )
            if existing is not None and existing.get("status") == "settled":
                raise BudgetRefusedError(
                    f"run {run_id!r} already settled on dataset {dataset[:12]}; use a new run id"
                )
            s_eps, s_delta = self._sum(entries, dataset, skip_run=run_id)
            tol = 1e-12
            over_eps = total_epsilon is not None and s_eps + epsilon > total_epsilon + tol
            over_delta = total_delta is not None and s_delta + delta > total_delta + tol
            if over_eps or over_delta:
                raise BudgetRefusedError(
                    f"privacy budget of dataset {dataset[:12]} refused: spent so far "
                    f"epsilon={s_eps:.4g}, delta={s_delta:.3g}; requested epsilon={epsilon:.4g}, "
                    f"delta={delta:.3g}; total allowed epsilon={total_epsilon}, "
                    f"delta={total_delta}. Lower this run's epsilon/delta, raise the dataset "
                    f"total, or use a ledger without earlier runs (--ledger / {LEDGER_ENV})"
                )
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            if existing is None:
                existing = {"dataset": dataset, "run_id": run_id, "created": now}
                entries.append(existing)
            existing.update(
                status="reserved",
                reserved_epsilon=epsilon,
                reserved_delta=delta,
                epsilon=None,
                delta=None,
                updated=now,
            )
            self._save(data)

    def settle(
        self, run_id: str, epsilon: float, delta: float, *, dataset: str | None = None
    ) -> None:
        """Record what ``run_id`` actually spent (replaces its reservation in the sums); with
        ``dataset`` only that dataset's entry of the run is settled."""
        epsilon = _check_amount("epsilon", epsilon)
        delta = _check_amount("delta", delta, 1.0)
        with self._locked():
            data = self._load()
            found = [
                e
                for e in data["entries"]
                if e["run_id"] == run_id and (dataset is None or e["dataset"] == dataset)
            ]
            if not found:
                raise PrivacyConfigError(f"run {run_id!r} has no reservation in {self.path}")
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for e in found:
                e.update(status="settled", epsilon=epsilon, delta=delta, updated=now)
            self._save(data)

    def entries(self, dataset: str | None = None) -> list[dict]:
        """All entries (or those of one dataset)."""
        with self._locked():
            data = self._load()
        return [dict(e) for e in data["entries"] if dataset is None or e["dataset"] == dataset]

    def spent(self, dataset: str) -> tuple[float, float]:
        """(epsilon, delta) counted against ``dataset`` by basic composition."""
        with self._locked():
            data = self._load()
        return self._sum(data["entries"], dataset)
