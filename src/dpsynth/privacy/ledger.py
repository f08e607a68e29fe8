"""Cross-run budget ledger: how much of each dataset's privacy budget runs have used.

Runs on the same data compose (docs/methods.md §0). The ledger sums them by basic composition
(epsilons add, deltas add), which is always sound. A run first *reserves* its planned (epsilon,
delta); the reservation counts until the run *settles* with what it actually spent, so a run that
crashes keeps counting. The file is JSON, replaced atomically, and guarded by an fcntl lock for
concurrent runs.

- Datasets are named by a KEYED fingerprint: HMAC-SHA256 of the data's digest under a secret key
  kept next to the ledger (``<ledger>.key``, mode 0600, created on first use). The same dataset
  maps to the same entry, but nobody without the key can test a guessed dataset against run.json
  or ``budget show``.
- A dataset's total budget, once stated (by a run's config or ``dpsynth budget set``), is stored
  and applies to every later run on it until ``budget set`` changes it; a config can tighten the
  cap for its own run but never loosen it.
- A seeded run (research mode) registers a keyed tag of its seed: the same (dataset, seed) pair is
  refused for any other run, since two runs with one seed draw identical noise.
- Runs that state no classical guarantee (epsilon = inf: ``guarantee: "none"``; SecPE:
  ``"secret-protection"``) are recorded too; they add nothing to the (epsilon, delta) sums, and
  ``budget show`` lists them beside the totals.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..io import atomic_write_text
from .errors import BudgetRefusedError, PrivacyConfigError

LEDGER_ENV = "DPSYNTH_LEDGER"


def default_ledger_path() -> Path:
    """``$DPSYNTH_LEDGER`` or ``~/.dpsynth/ledger.json``."""
    env = os.environ.get(LEDGER_ENV)
    return Path(env).expanduser() if env else Path.home() / ".dpsynth" / "ledger.json"


GUARANTEES = ("dp", "none", "secret-protection")
_KEY_BYTES = 32


def keyed_fingerprint(raw_digest: str, key: bytes) -> str:
    """HMAC-SHA256 of a raw dataset digest under the ledger's secret key (hex)."""
    if not isinstance(raw_digest, str) or not raw_digest:
        raise PrivacyConfigError("dataset digest must be a non-empty string")
    return hmac.new(key, b"dataset\x00" + raw_digest.encode("utf-8"), hashlib.sha256).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _check_amount(name: str, value: float, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PrivacyConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (upper is not None and value >= upper):
        rng = f"[0, {upper})" if upper is not None else ">= 0"
        raise PrivacyConfigError(f"{name} must be in {rng}, got {value!r}")
    return float(value)


class BudgetLedger:
    """A JSON ledger of reservations, settlements, recorded runs and dataset budgets."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_ledger_path()

    # -- file handling -------------------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        """The secret key file of the keyed fingerprints (mode 0600)."""
        return self.path.with_name(self.path.name + ".key")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path.is_dir():
            raise PrivacyConfigError(f"{self.path}: the budget ledger path is a directory")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock_path = self.path.with_name(self.path.name + ".lock")
            lock = open(lock_path, "a+")  # noqa: SIM115 (held for the with-block below)
        except OSError as err:
            raise PrivacyConfigError(
                f"{self.path}: cannot open the budget ledger ({err.strerror or type(err).__name__})"
            ) from None
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def _key(self) -> bytes:
        """The secret key, created (32 random bytes, mode 0600) on first use."""
        path = self.key_path
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                with os.fdopen(fd, "w", encoding="ascii") as fh:
                    fh.write(os.urandom(_KEY_BYTES).hex() + "\n")
                    fh.flush()
                    os.fsync(fh.fileno())
            text = path.read_text(encoding="ascii").strip()
        except OSError as err:
            raise PrivacyConfigError(
                f"{path}: cannot read the ledger key ({err.strerror or type(err).__name__})"
            ) from None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise PrivacyConfigError(f"{path}: the ledger key file is corrupt")
        return key

    def dataset_id(self, raw_digest: str) -> str:
        """The keyed fingerprint of a dataset (what run.json and the ledger store)."""
        with self._locked():
            return keyed_fingerprint(raw_digest, self._key())

    def _seed_tag(self, dataset: str, seed: int) -> str:
        msg = f"seed\x00{dataset}\x00{int(seed)}".encode()
        return hmac.new(self._key(), msg, hashlib.sha256).hexdigest()

    def _load(self) -> dict[str, Any]:
        if not self.path.exists():
            return {"version": 2, "entries": [], "budgets": {}}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except ValueError:
            raise PrivacyConfigError(f"{self.path}: the budget ledger is not valid JSON") from None
        except OSError as err:
            raise PrivacyConfigError(
                f"{self.path}: cannot read the budget ledger "
                f"({err.strerror or type(err).__name__})"
            ) from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise PrivacyConfigError(f"{self.path}: the budget ledger has no 'entries' list")
        for i, e in enumerate(data["entries"]):
            ok = isinstance(e, dict) and isinstance(e.get("dataset"), str)
            ok = ok and isinstance(e.get("run_id"), str)
            if ok:
                try:
                    self._counted(e)
                except (KeyError, TypeError, ValueError):
                    ok = False
            if not ok:
                raise PrivacyConfigError(f"{self.path}: entry {i} of the budget ledger is corrupt")
        budgets = data.setdefault("budgets", {})
        if not isinstance(budgets, dict) or not all(isinstance(b, dict) for b in budgets.values()):
            raise PrivacyConfigError(f"{self.path}: the budget ledger's 'budgets' is corrupt")
        return data

    def _save(self, data: dict[str, Any]) -> None:
        data["version"] = 2
        atomic_write_text(self.path, json.dumps(data, indent=1), mode=0o600)

    # -- accounting ----------------------------------------------------------------------------
    @staticmethod
    def _counted(entry: dict[str, Any]) -> tuple[float, float]:
        """What an entry counts: the actual spend once settled, else the reservation; entries
        without a classical guarantee count nothing here (see the module docstring)."""
        if entry.get("guarantee", "dp") != "dp":
            return 0.0, 0.0
        if entry.get("status") == "settled":
            return float(entry["epsilon"]), float(entry["delta"])
        return float(entry["reserved_epsilon"]), float(entry["reserved_delta"])

    @classmethod
    def _sum(
        cls, entries: list[dict[str, Any]], dataset: str, skip_run: str | None = None
    ) -> tuple[float, float]:
        eps = delta = 0.0
        for e in entries:
            if e["dataset"] == dataset and e["run_id"] != skip_run:
                de, dd = cls._counted(e)
                eps += de
                delta += dd
        return eps, delta

    @staticmethod
    def _effective_cap(
        stored: dict[str, Any] | None, name: str, configured: float | None
    ) -> float | None:
        values = [v for v in ((stored or {}).get(name), configured) if v is not None]
        return min(float(v) for v in values) if values else None

    def reserve(
        self,
        dataset: str,
        run_id: str,
        epsilon: float,
        delta: float,
        total_epsilon: float | None,
        total_delta: float | None,
        *,
        noise_seed: int | None = None,
    ) -> None:
        """Reserve (epsilon, delta) of ``dataset``'s total for ``run_id``, or raise
        BudgetRefusedError. Re-reserving the same run (a resume) replaces its reservation.

        ``total_*`` from the run's config are stored as the dataset's budget when none is stored
        yet; a stored budget always applies (the smaller cap wins). ``noise_seed`` (seeded noise
        only) is refused when another run used it on this dataset."""
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
            seed_tag = None if noise_seed is None else self._seed_tag(dataset, noise_seed)
            if seed_tag is not None:
                other = next(
                    (
                        e
                        for e in entries
                        if e["dataset"] == dataset
                        and e["run_id"] != run_id
                        and e.get("seed_tag") == seed_tag
                    ),
                    None,
                )
                if other is not None:
                    raise BudgetRefusedError(
                        f"seeded noise with this seed was already used on dataset {dataset[:12]} "
                        f"by run {other['run_id']!r}: both runs would draw identical noise. "
                        "Use privacy.noise: secure, or leave privacy.seed unset (a fresh random "
                        "seed is drawn)"
                    )
            stored = data["budgets"].get(dataset)
            cap_eps = self._effective_cap(stored, "total_epsilon", total_epsilon)
            cap_delta = self._effective_cap(stored, "total_delta", total_delta)
            s_eps, s_delta = self._sum(entries, dataset, skip_run=run_id)
            tol = 1e-12
            over_eps = cap_eps is not None and s_eps + epsilon > cap_eps + tol
            over_delta = cap_delta is not None and s_delta + delta > cap_delta + tol
            if over_eps or over_delta:
                raise BudgetRefusedError(
                    f"privacy budget of dataset {dataset[:12]} refused: spent so far "
                    f"epsilon={s_eps:.4g}, delta={s_delta:.3g}; requested epsilon={epsilon:.4g}, "
                    f"delta={delta:.3g}; total allowed epsilon={cap_eps}, delta={cap_delta}. "
                    "Lower this run's epsilon/delta, raise the dataset total with `dpsynth "
                    f"budget set`, or use a ledger without earlier runs (--ledger / {LEDGER_ENV})"
                )
            now = _now()
            new_budget = dict(stored or {})
            for name, value in (("total_epsilon", total_epsilon), ("total_delta", total_delta)):
                if value is not None and new_budget.get(name) is None:
                    new_budget[name] = value
            if new_budget != (stored or {}):
                new_budget.update(updated=now, source=f"run {run_id}")
                data["budgets"][dataset] = new_budget
            if existing is None:
                existing = {"dataset": dataset, "run_id": run_id, "created": now}
                entries.append(existing)
            existing.update(
                guarantee="dp",
                status="reserved",
                reserved_epsilon=epsilon,
                reserved_delta=delta,
                epsilon=None,
                delta=None,
                updated=now,
            )
            if seed_tag is not None:
                existing["seed_tag"] = seed_tag
            self._save(data)

    def record_run(self, dataset: str, run_id: str, guarantee: str, **details: Any) -> None:
        """Record a run that states no (epsilon, delta) guarantee on ``dataset``
        (``guarantee`` "none" for epsilon = inf, "secret-protection" for SecPE), with public
        ``details`` such as SecPE's (p, r). Recording the same run again updates it."""
        if not dataset or not run_id:
            raise PrivacyConfigError("dataset and run_id must be non-empty strings")
        if guarantee not in GUARANTEES or guarantee == "dp":
            raise PrivacyConfigError(
                f"guarantee must be 'none' or 'secret-protection', got {guarantee!r}"
            )
        with self._locked():
            data = self._load()
            entries = data["entries"]
            existing = next(
                (e for e in entries if e["dataset"] == dataset and e["run_id"] == run_id), None
            )
            now = _now()
            if existing is None:
                existing = {"dataset": dataset, "run_id": run_id, "created": now}
                entries.append(existing)
            elif existing.get("guarantee", "dp") == "dp":
                raise PrivacyConfigError(f"run {run_id!r} already holds a DP reservation")
            existing.update(
                guarantee=guarantee, status="recorded", epsilon=None, delta=None, updated=now
            )
            if details:
                existing["details"] = {k: v for k, v in details.items()}
            self._save(data)

    def set_budget(
        self, dataset: str, total_epsilon: float | None, total_delta: float | None
    ) -> dict[str, Any]:
        """Set (replace) ``dataset``'s total budget: the explicit way to change it. A field
        left None keeps its stored value. Returns the stored budget."""
        if not dataset:
            raise PrivacyConfigError("dataset must be a non-empty string")
        if total_epsilon is None and total_delta is None:
            raise PrivacyConfigError("give a total epsilon, a total delta, or both")
        if total_epsilon is not None:
            total_epsilon = _check_amount("total_epsilon", total_epsilon)
        if total_delta is not None:
            total_delta = _check_amount("total_delta", total_delta, 1.0)
        with self._locked():
            data = self._load()
            budget = dict(data["budgets"].get(dataset) or {})
            if total_epsilon is not None:
                budget["total_epsilon"] = total_epsilon
            if total_delta is not None:
                budget["total_delta"] = total_delta
            budget.update(updated=_now(), source="budget set")
            data["budgets"][dataset] = budget
            self._save(data)
        return budget

    def budget(self, dataset: str) -> dict[str, Any] | None:
        """The stored total budget of ``dataset`` (None when none was ever stated)."""
        with self._locked():
            data = self._load()
        b = data["budgets"].get(dataset)
        return dict(b) if b is not None else None

    def budgets(self) -> dict[str, dict[str, Any]]:
        """All stored dataset budgets."""
        with self._locked():
            data = self._load()
        return {k: dict(v) for k, v in data["budgets"].items()}

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
                if e["run_id"] == run_id
                and (dataset is None or e["dataset"] == dataset)
                and e.get("guarantee", "dp") == "dp"
            ]
            if not found:
                raise PrivacyConfigError(f"run {run_id!r} has no reservation in {self.path}")
            now = _now()
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
