"""Cross-run budget ledger: the privacy budget of each *data source*, across runs.

Runs on the same people's data compose (docs/methods.md §0), so the budget belongs to the data,
not to one run or to the bytes a run happened to read. The ledger's unit is a **source**: a
name (``data.source``, by default the private file's resolved path) with the content
*versions* seen under it. Every run is charged to each source its data matches
(:meth:`BudgetLedger.resolve`):

- by name: the same ``data.source`` or path, whatever subset, limit, columns, privacy unit or
  version it reads (a new file content there is a new version of the source);
- by content: a file whose bytes equal a known version, at any path (a copy);
- by records: the records fingerprint of an earlier run (also how a version-2 ledger's
  datasets carry over);
- by overlap: a file whose records lie mostly in a known version's (bottom-k sketches of keyed
  hashes of the exact texts and of the normalised records, :mod:`dpsynth.identity`): one
  record added or removed, a subset, another format or row order at another path, or a copy
  with trailing spaces, an appended ".", or another letter case.

Amounts add by basic composition (epsilons add, deltas add), which is always sound. A run
first *reserves* its planned (epsilon, delta) on every matched source (all or none); the
reservation counts until the run *settles* with what it spent, so a crashed run keeps
counting. One reservation gives one release: each entry is bound to the run folder that made
it (:func:`check_folder`), so a copied, moved or restored folder can neither resume nor
re-reserve it, and a settled entry is never reserved again. A source's total, once stated
(a config's ``privacy.total_*`` or ``dpsynth budget set``), applies to every later run charged
to it; a config can tighten it for its own run but never loosen it.

Fail closed. Everything keyed (content and records digests, sketches, seed tags) is an HMAC
under a secret key beside the ledger (``<ledger>.key``, 0600), checked against the ledger's
``key_check``. A key is created only with a new, empty ledger: a ledger with sources or runs
but no key, a key that is not the ledger's, an unreadable key or a corrupt ledger refuses every
run and every ``budget`` command with the way out (restore the file, or ``dpsynth budget
rekey``, which keeps every source's spending by name). Each change first copies the previous
ledger to ``<ledger>.bak``.

A seeded run (research mode) registers a keyed tag of its seed; a seed seen before, on any
source, is refused (two runs with one seed draw identical noise, on D and on D plus one record
too). Runs that state no classical guarantee (epsilon = inf: ``"none"``; SecPE:
``"secret-protection"``) are recorded on their sources without an amount. The file is JSON,
replaced atomically under an fcntl lock, and holds no raw digest of the data.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from ..identity import DataIdentity, merge_sketches, sketch_matches
from .errors import BudgetRefusedError, PrivacyConfigError

LEDGER_ENV = "DPSYNTH_LEDGER"
LEDGER_VERSION = 3
GUARANTEES = ("dp", "none", "secret-protection")
_KEY_BYTES = 32
_TOL = 1e-12
#: The epsilon cap of a source that has none of its own (docs/budget.md): a (epsilon, delta)
#: run on such a source is refused past it unless the run says ``privacy.no_cap`` (``--no-cap``).
#: It is not stored on the source, so ``dpsynth budget set`` or ``--no-cap`` override it.
DEFAULT_TOTAL_EPSILON = 10.0


def default_ledger_path() -> Path:
    """``$DPSYNTH_LEDGER`` or ``~/.dpsynth/ledger.json``."""
    env = os.environ.get(LEDGER_ENV)
    return Path(env).expanduser() if env else Path.home() / ".dpsynth" / "ledger.json"


def keyed_fingerprint(raw_digest: str, key: bytes) -> str:
    """HMAC-SHA256 of a raw records digest under the ledger's key (hex): the run's
    ``dataset_fingerprint`` in run.json (the same construction as ledger version 2)."""
    if not isinstance(raw_digest, str) or not raw_digest:
        raise PrivacyConfigError("dataset digest must be a non-empty string")
    return hmac.new(key, b"dataset\x00" + raw_digest.encode("utf-8"), hashlib.sha256).hexdigest()


def _keyed(key: bytes, kind: str, value: str) -> str:
    return hmac.new(key, f"{kind}\x00{value}".encode(), hashlib.sha256).hexdigest()


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _check_amount(name: str, value: float, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PrivacyConfigError(f"{name} must be a finite number, got {value!r}")
    if value < 0 or (upper is not None and value >= upper):
        rng = f"[0, {upper})" if upper is not None else ">= 0"
        raise PrivacyConfigError(f"{name} must be in {rng}, got {value!r}")
    return float(value)


class OtherFolderError(BudgetRefusedError):
    """A run folder that is not the one a run's reservation is bound to (a copy, a move, a
    restored backup) tried to resume or reserve it: one reservation gives one release."""

    hint = ("start a new run (the same command with a new --output folder); it is charged to "
            "the budget like any other run")


class LedgerUnusableError(BudgetRefusedError):
    """The ledger or its key is missing, corrupt or mismatched: nothing runs until it is
    restored or explicitly re-keyed (the message says how)."""


@dataclass
class SourceMatch:
    """One source a run is charged to, and why (``how``: name, content, records, overlap;
    empty for a source this run creates)."""

    source: str
    names: list[str]
    how: list[str] = field(default_factory=list)
    new_version: bool = False

    def describe(self) -> str:
        label = self.names[0] if self.names else f"(unnamed source {self.source})"
        if not self.how:
            return f"new data source {label!r}"
        version = ", a new version" if self.new_version else ""
        return f"data source {label!r} (matched by {', '.join(self.how)}{version})"


@dataclass
class Charge:
    """What a run is charged to: its sources and its keyed records fingerprint."""

    sources: list[SourceMatch]
    records: str

    def describe(self) -> str:
        return "charged to " + "; ".join(s.describe() for s in self.sources)


class BudgetLedger:
    """The JSON ledger of data sources, their budgets and the runs charged to them."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_ledger_path()

    # -- files ---------------------------------------------------------------------------
    @property
    def key_path(self) -> Path:
        """The secret key of the keyed digests (mode 0600)."""
        return self.path.with_name(self.path.name + ".key")

    @property
    def backup_path(self) -> Path:
        """The ledger as it was before its last change."""
        return self.path.with_name(self.path.name + ".bak")

    def _restore_hint(self) -> str:
        return (f"restore {self.path.name} and {self.key_path.name} from your backup (the ledger "
                f"before its last change is {self.backup_path}); if the key is lost for good, "
                f"`dpsynth budget rekey --ledger {self.path}` makes a new one and keeps every "
                "source's spending by name")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path.is_dir():
            raise PrivacyConfigError(f"{self.path}: the budget ledger path is a directory")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(self.path.with_name(self.path.name + ".lock"), "a+")  # noqa: SIM115
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

    def _read_key(self) -> bytes:
        try:
            text = self.key_path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not ASCII"
            raise LedgerUnusableError(
                f"{self.key_path}: cannot read the ledger key ({reason or type(err).__name__}); "
                + self._restore_hint()) from None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) < 16:
            raise LedgerUnusableError(f"{self.key_path}: the ledger key is corrupt; "
                                      + self._restore_hint())
        return key

    def _read(self) -> dict[str, Any] | None:
        """The ledger as stored (migrated to this version in memory); None when absent."""
        if not self.path.exists():
            return None
        corrupt = (f"{self.path}: the budget ledger is corrupt ({{}}); nothing runs on a ledger "
                   f"that cannot be read: restore it from {self.backup_path} or your backup")
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise LedgerUnusableError(corrupt.format("not valid JSON")) from None
        except OSError as err:
            raise LedgerUnusableError(
                f"{self.path}: cannot read the budget ledger "
                f"({err.strerror or type(err).__name__})") from None
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise LedgerUnusableError(corrupt.format("no 'entries' list"))
        if data.get("version", 2) < LEDGER_VERSION or "sources" not in data:
            data = _migrate_v2(data, corrupt)
        if not isinstance(data.get("sources"), dict) or not all(
                isinstance(s, dict) and isinstance(s.get("versions"), list)
                and isinstance(s.get("names"), list) for s in data["sources"].values()):
            raise LedgerUnusableError(corrupt.format("its 'sources' are corrupt"))
        for i, e in enumerate(data["entries"]):
            ok = isinstance(e, dict) and e.get("source") in data["sources"]
            ok = ok and isinstance(e.get("run_id"), str)
            if ok:
                try:
                    _counted(e)
                except (KeyError, TypeError, ValueError):
                    ok = False
            if not ok:
                raise LedgerUnusableError(corrupt.format(f"entry {i} is corrupt"))
        return data

    def _open(self, create: bool) -> tuple[dict[str, Any], bytes | None]:
        """(ledger, key) under the lock, failing closed (see the module docstring). ``create``:
        a missing ledger is started (with a new key); else an absent ledger reads as empty."""
        data = self._read()
        has_key = self.key_path.exists()
        if data is None:
            if has_key:
                raise LedgerUnusableError(
                    f"{self.path}: the budget ledger is missing but its key "
                    f"{self.key_path.name} exists; nothing runs until it is back: "
                    f"restore it from {self.backup_path} or your backup (to start a new, empty "
                    "ledger on purpose, remove the key file too)")
            data = _empty()
            return (data, self._new_key(data)) if create else (data, None)
        if not has_key:
            if data["sources"] or data["entries"]:
                raise LedgerUnusableError(
                    f"{self.key_path}: the ledger key is missing, so no run can be matched to "
                    "its data sources (their spending would read 0); " + self._restore_hint())
            return (data, self._new_key(data)) if create else (data, None)
        key = self._read_key()
        check = data.get("key_check")
        if check is not None and not hmac.compare_digest(check, _key_check(key)):
            raise LedgerUnusableError(
                f"{self.key_path} is not the key of {self.path} (its check value differs); "
                + self._restore_hint())
        data["key_check"] = _key_check(key)
        return data, key

    def _new_key(self, data: dict[str, Any]) -> bytes:
        """A new key for an empty ledger: the ledger (with its check value) is written first,
        so a crash in between leaves an empty ledger without key, which gets a new one."""
        key = os.urandom(_KEY_BYTES)
        self._save(data, key)
        self.key_path.unlink(missing_ok=True)
        fd = os.open(self.key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key.hex() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return key

    def _save(self, data: dict[str, Any], key: bytes | None) -> None:
        data["version"] = LEDGER_VERSION
        if key is not None:
            data["key_check"] = _key_check(key)
        if self.path.exists():
            shutil.copyfile(self.path, self.backup_path)
            os.chmod(self.backup_path, 0o600)
        atomic_write_text(self.path, json.dumps(data, indent=1), mode=0o600)

    # -- identity ------------------------------------------------------------------------
    def sketch_key(self) -> bytes:
        """The key of the text sketches (:func:`dpsynth.identity.text_sketch`), derived from
        the ledger's key (created with a new ledger)."""
        with self._locked():
            _, key = self._open(create=True)
        assert key is not None
        return hmac.new(key, b"text-sketch", hashlib.sha256).digest()[:32]

    def dataset_id(self, raw_digest: str) -> str:
        """The keyed fingerprint of a run's records (run.json's ``dataset_fingerprint``)."""
        with self._locked():
            _, key = self._open(create=True)
        assert key is not None
        return keyed_fingerprint(raw_digest, key)

    def resolve(self, identity: DataIdentity) -> Charge:
        """The sources ``identity`` matches (nothing is written; see the module docstring)."""
        with self._locked():
            data, key = self._open(create=True)
        assert key is not None
        return _resolve(data, key, identity)

    # -- charging ------------------------------------------------------------------------
    def reserve(self, identity: DataIdentity, run_id: str, epsilon: float, delta: float,
                total_epsilon: float | None = None, total_delta: float | None = None, *,
                noise_seed: int | None = None, details: dict[str, Any] | None = None,
                folder: dict[str, Any] | None = None,
                default_epsilon: float | None = None) -> Charge:
        """Reserve (epsilon, delta) for ``run_id`` on every source ``identity`` matches, or
        raise BudgetRefusedError (nothing written). Re-reserving the same run (a resume)
        replaces its reservation, from the same run folder only. ``total_*`` from the run's
        config become a source's budget when it has none; a stored budget always applies (the
        smaller cap wins). ``default_epsilon`` (:data:`DEFAULT_TOTAL_EPSILON` unless the run
        says ``no_cap``) caps a source that has no epsilon cap of its own and none from the
        config, without being stored on it. ``noise_seed`` (seeded noise only) is refused
        when any other run used it. ``details``: public facts kept with the entry (the config
        digest, the unit); ``folder``: the run folder's identity
        (:meth:`dpsynth.run_folder.RunDir.folder_identity`) the entry is bound to
        (:func:`check_folder`)."""
        if not run_id:
            raise PrivacyConfigError("run_id must be a non-empty string")
        epsilon = _check_amount("epsilon", epsilon)
        delta = _check_amount("delta", delta, 1.0)
        if total_epsilon is not None:
            total_epsilon = _check_amount("total_epsilon", total_epsilon)
        if total_delta is not None:
            total_delta = _check_amount("total_delta", total_delta, 1.0)
        with self._locked():
            data, key = self._open(create=True)
            assert key is not None
            charge = _resolve(data, key, identity)
            check_folder(_run_entries(data, run_id), run_id, folder)
            for e in _run_entries(data, run_id):
                if e.get("status") == "settled":
                    raise BudgetRefusedError(f"run {run_id!r} is already settled in {self.path}")
            seed_tag = _seed_tag(data, key, run_id, noise_seed)
            _refuse_over_cap(data, charge, run_id, epsilon, delta, total_epsilon, total_delta,
                             default_epsilon)
            now = _now()
            for m in charge.sources:
                src = _register(data, m, identity, key, run_id, now)
                _adopt_totals(src, total_epsilon, total_delta, run_id, now)
                entry = _entry(data, m.source, run_id, now)
                entry.update(guarantee="dp", status="reserved", reserved_epsilon=epsilon,
                             reserved_delta=delta, epsilon=None, delta=None,
                             records=charge.records, updated=now, **(details or {}))
                if folder is not None:
                    entry["folder"] = folder
                if seed_tag is not None:
                    entry["seed_tag"] = seed_tag
            self._save(data, key)
        return charge

    def record_run(self, identity: DataIdentity, run_id: str, guarantee: str,
                   details: dict[str, Any] | None = None, *, noise_seed: int | None = None,
                   total_epsilon: float | None = None, total_delta: float | None = None,
                   folder: dict[str, Any] | None = None) -> Charge:
        """Record a run that states no (epsilon, delta) guarantee (``"none"`` for epsilon =
        inf, ``"secret-protection"`` for SecPE) on its sources, with public ``details``;
        ``noise_seed`` and ``folder`` as for :meth:`reserve` (SecPE's noise is seeded too). Refused
        (BudgetRefusedError, nothing written) on a source with a budget cap, stored or given
        here (``total_*``): such a run's loss is not bounded by any epsilon, so no amount of
        a capped budget can pay for it."""
        if not run_id:
            raise PrivacyConfigError("run_id must be a non-empty string")
        if guarantee not in GUARANTEES or guarantee == "dp":
            raise PrivacyConfigError(
                f"guarantee must be 'none' or 'secret-protection', got {guarantee!r}")
        with self._locked():
            data, key = self._open(create=True)
            assert key is not None
            check_folder(_run_entries(data, run_id), run_id, folder)
            if any(e.get("guarantee", "dp") == "dp" for e in _run_entries(data, run_id)):
                raise PrivacyConfigError(f"run {run_id!r} already holds a DP reservation")
            charge = _resolve(data, key, identity)
            for m in charge.sources:
                stored = data["sources"].get(m.source, {})
                caps = (_cap(stored.get("total_epsilon"), total_epsilon),
                        _cap(stored.get("total_delta"), total_delta))
                if caps != (None, None):
                    what = ("epsilon = inf releases exact, noise-free values" if guarantee ==
                            "none" else "SecPE's secret protection uses the records without "
                            "secrets as they are")
                    raise BudgetRefusedError(
                        f"{m.describe()} has a budget cap (epsilon={_fmt(caps[0])}, delta="
                        f"{_fmt(caps[1])}), and this run states no (epsilon, delta) guarantee "
                        f"({what}), so no part of the cap can pay for it. Run a method with an "
                        "(epsilon, delta) guarantee on this source (aug_pe, wasp, synrag)")
            seed_tag = _seed_tag(data, key, run_id, noise_seed)
            now = _now()
            for m in charge.sources:
                _register(data, m, identity, key, run_id, now)
                entry = _entry(data, m.source, run_id, now)
                entry.update(guarantee=guarantee, status="recorded", epsilon=None, delta=None,
                             records=charge.records, updated=now, **(details or {}))
                if folder is not None:
                    entry["folder"] = folder
                if seed_tag is not None:
                    entry["seed_tag"] = seed_tag
            self._save(data, key)
        return charge

    def settle(self, run_id: str, epsilon: float, delta: float) -> None:
        """Record what ``run_id`` spent on each of its sources (replaces the reservation in
        the sums). A spend above the reservation is recorded as it is (the truth) and raised
        as a BudgetRefusedError after the write."""
        epsilon = _check_amount("epsilon", epsilon)
        delta = _check_amount("delta", delta, 1.0)
        with self._locked():
            data, key = self._open(create=False)
            found = [e for e in _run_entries(data, run_id) if e.get("guarantee", "dp") == "dp"]
            if not found:
                raise PrivacyConfigError(f"run {run_id!r} has no reservation in {self.path}")
            now = _now()
            over = [e for e in found if epsilon > e["reserved_epsilon"] + 1e-9
                    or delta > e["reserved_delta"] + 1e-15]
            for e in found:
                e.update(status="settled", epsilon=epsilon, delta=delta, updated=now)
            self._save(data, key)
        if over:
            raise BudgetRefusedError(
                f"run {run_id!r} spent epsilon={epsilon:.6g}, delta={delta:.3g}, more than it "
                f"reserved (epsilon={over[0]['reserved_epsilon']:.6g}); the ledger records the "
                "spend as it is")

    # -- budgets -------------------------------------------------------------------------
    def set_budget(self, target: DataIdentity | str, total_epsilon: float | None,
                   total_delta: float | None) -> list[dict[str, Any]]:
        """Set (replace) the total budget of the sources ``target`` names: a data identity
        (``budget set --data FILE``: the sources it matches, a new source when none) or a
        source's id or name (``--source``). A field left None keeps its stored value. Returns
        the summaries of the sources set."""
        if total_epsilon is None and total_delta is None:
            raise PrivacyConfigError("give a total epsilon, a total delta, or both")
        if total_epsilon is not None:
            total_epsilon = _check_amount("total_epsilon", total_epsilon)
        if total_delta is not None:
            total_delta = _check_amount("total_delta", total_delta, 1.0)
        with self._locked():
            data, key = self._open(create=isinstance(target, DataIdentity))
            now = _now()
            if isinstance(target, DataIdentity):
                assert key is not None
                charge = _resolve(data, key, target)
                ids = []
                for m in charge.sources:
                    _register(data, m, target, key, None, now)
                    ids.append(m.source)
            else:
                ids = [_find_source(data, target, self.path)]
            for sid in ids:
                src = data["sources"][sid]
                if total_epsilon is not None:
                    src["total_epsilon"] = total_epsilon
                if total_delta is not None:
                    src["total_delta"] = total_delta
                src["budget_set"] = {"at": now, "by": "budget set"}
            self._save(data, key)
            return [_summary(data, sid) for sid in ids]

    # -- reading -------------------------------------------------------------------------
    def sources(self) -> list[dict[str, Any]]:
        """Every source: names, versions, caps, spent (epsilon, delta) and its runs."""
        with self._locked():
            data, _ = self._open(create=False)
        return [_summary(data, sid) for sid in sorted(data["sources"])]

    def source(self, ref: str) -> dict[str, Any]:
        """One source's summary, by id or name."""
        with self._locked():
            data, _ = self._open(create=False)
            return _summary(data, _find_source(data, ref, self.path))

    def entries(self, source: str | None = None) -> list[dict[str, Any]]:
        """All entries (or those of one source id)."""
        with self._locked():
            data, _ = self._open(create=False)
        return [dict(e) for e in data["entries"] if source is None or e["source"] == source]

    def run_entries(self, run_id: str) -> list[dict[str, Any]]:
        """The entries of one run (one per source it is charged to)."""
        with self._locked():
            data, _ = self._open(create=False)
        return [dict(e) for e in _run_entries(data, run_id)]

    def spent(self, source: str) -> tuple[float, float]:
        """(epsilon, delta) counted against a source (id) by basic composition."""
        with self._locked():
            data, _ = self._open(create=False)
        return _sum(data["entries"], source)

    # -- recovery ------------------------------------------------------------------------
    def rekey(self) -> dict[str, int]:
        """Make a new key for a ledger whose key is lost or wrong, keeping every source, name,
        budget and amount; what was keyed under the old key (content versions, records
        fingerprints, sketches, seed tags) cannot be checked any more and is dropped. Refuses
        a ledger whose key is present and right (nothing to recover)."""
        with self._locked():
            data = self._read()
            if data is None:
                raise PrivacyConfigError(f"{self.path}: no budget ledger to re-key")
            if self.key_path.exists():
                try:
                    key = self._read_key()
                except LedgerUnusableError:
                    key = None
                check = data.get("key_check")
                if key is not None and (check is None or hmac.compare_digest(
                        check, _key_check(key))):
                    raise PrivacyConfigError(
                        f"{self.key_path} is this ledger's key: nothing to re-key")
            dropped = 0
            for src in data["sources"].values():
                dropped += len(src["versions"])
                src["versions"] = []
            for e in data["entries"]:
                for k in ("records", "seed_tag"):
                    e.pop(k, None)
            self._new_key(data)
        return {"sources": len(data["sources"]), "versions_dropped": dropped}


# -- the ledger's data (pure functions over the loaded dict) -----------------------------------
def _empty() -> dict[str, Any]:
    return {"version": LEDGER_VERSION, "sources": {}, "entries": []}


def _key_check(key: bytes) -> str:
    return _keyed(key, "key-check", "dpsynth ledger")


def _migrate_v2(data: dict[str, Any], corrupt: str) -> dict[str, Any]:
    """A version-2 ledger (one entry per keyed records fingerprint) as version 3: each dataset
    becomes an unnamed source whose one version knows that fingerprint, so a run on the same
    records is still charged to it; its budget carries over."""
    budgets = data.get("budgets", {})
    if not isinstance(budgets, dict):
        raise LedgerUnusableError(corrupt.format("its 'budgets' are corrupt"))
    sources: dict[str, Any] = {}
    entries = []
    for e in data["entries"]:
        if not isinstance(e, dict) or not isinstance(e.get("dataset"), str):
            raise LedgerUnusableError(corrupt.format("an entry is corrupt"))
    datasets = sorted({e["dataset"] for e in data["entries"]} | set(budgets))
    for d in datasets:
        sid = "v2-" + d[:12]
        b = budgets.get(d) or {}
        sources[sid] = {"names": [], "versions": [{"content": None, "records": [d],
                                                   "sketch": [], "added": None}],
                        "total_epsilon": b.get("total_epsilon"),
                        "total_delta": b.get("total_delta"), "created": None}
    for e in data["entries"]:
        e = dict(e)
        d = e.pop("dataset")
        e["source"] = "v2-" + d[:12]
        e["records"] = d
        entries.append(e)
    return {"version": LEDGER_VERSION, "sources": sources, "entries": entries,
            **({"key_check": data["key_check"]} if "key_check" in data else {})}


def _counted(entry: dict[str, Any]) -> tuple[float, float]:
    """What an entry counts: the spend once settled, else the reservation; entries without a
    classical guarantee count nothing here."""
    if entry.get("guarantee", "dp") != "dp":
        return 0.0, 0.0
    if entry.get("status") == "settled":
        return float(entry["epsilon"]), float(entry["delta"])
    return float(entry["reserved_epsilon"]), float(entry["reserved_delta"])


def _sum(entries: list[dict[str, Any]], source: str, skip_run: str | None = None
         ) -> tuple[float, float]:
    eps = delta = 0.0
    for e in entries:
        if e["source"] == source and e["run_id"] != skip_run:
            de, dd = _counted(e)
            eps += de
            delta += dd
    return eps, delta


def _cap(stored: float | None, configured: float | None) -> float | None:
    values = [float(v) for v in (stored, configured) if v is not None]
    return min(values) if values else None


def _fmt(x: float | None) -> str:
    return "unset" if x is None else f"{x:g}"


def _seed_tag(data: dict[str, Any], key: bytes, run_id: str, seed: int | None) -> str | None:
    """The keyed tag of a run's noise seed, refused when another run used it (on any
    source); None for secure noise."""
    if seed is None:
        return None
    tag = _keyed(key, "seed", str(int(seed)))
    other = next((e for e in data["entries"]
                  if e["run_id"] != run_id and e.get("seed_tag") == tag), None)
    if other is not None:
        raise BudgetRefusedError(
            f"seeded noise with this seed was already used by run {other['run_id']!r}: two "
            "runs with one seed draw identical noise (on any data). Use privacy.noise: "
            "secure, or leave privacy.seed unset (a fresh random seed is drawn)")
    return tag


def check_folder(entries: list[dict[str, Any]], run_id: str,
                 folder: dict[str, Any] | None) -> None:
    """Raise :class:`OtherFolderError` when ``run_id``'s ledger ``entries`` are bound to a
    run folder that ``folder`` (its identity now) is not: every field the entry recorded must
    be equal (an entry from before the anchor file was recorded compares path and inode
    only). An entry that is bound refuses a caller that gives no folder (fail closed)."""
    for e in entries:
        bound = e.get("folder")
        if bound is None:
            continue
        same = isinstance(bound, dict) and isinstance(folder, dict) and all(
            folder.get(k) == v for k, v in bound.items())
        if not same:
            where = bound.get("path") if isinstance(bound, dict) else None
            here = folder.get("path") if isinstance(folder, dict) else "this caller"
            raise OtherFolderError(
                f"{here}: run {run_id!r}'s budget was reserved by the run folder "
                f"{where or '(unknown)'}, and this folder is not that one (a copy, a move or a "
                "restored backup has another identity, even at the same path): one "
                "reservation gives one release, so it cannot be resumed or released here; "
                "resume the original folder where it was")


def _run_entries(data: dict[str, Any], run_id: str) -> list[dict[str, Any]]:
    return [e for e in data["entries"] if e["run_id"] == run_id]


def _keyed_identity(key: bytes, identity: DataIdentity) -> tuple[str, str]:
    return _keyed(key, "content", identity.content), keyed_fingerprint(identity.records, key)


def _resolve(data: dict[str, Any], key: bytes, identity: DataIdentity) -> Charge:
    content, records = _keyed_identity(key, identity)
    matches = []
    for sid in sorted(data["sources"]):
        src = data["sources"][sid]
        how = []
        if identity.name in src["names"]:
            how.append("name")
        versions = src["versions"]
        if any(v.get("content") == content for v in versions):
            how.append("content")
        if any(records in v.get("records", []) for v in versions):
            how.append("records")
        if any(sketch_matches(identity.sketch, [int(h, 16) for h in v.get("sketch", [])])
               or sketch_matches(identity.normalised,
                                 [int(h, 16) for h in v.get("normalised_sketch", [])])
               for v in versions):
            how.append("overlap")
        if how:
            new_version = not any(v.get("content") == content for v in versions)
            matches.append(SourceMatch(sid, list(src["names"]), how, new_version))
    if not matches:
        matches = [SourceMatch("src-" + uuid.uuid4().hex[:10], [identity.name])]
    return Charge(matches, records)


def _register(data: dict[str, Any], match: SourceMatch, identity: DataIdentity, key: bytes,
              run_id: str | None, now: str) -> dict[str, Any]:
    """Add what the run shows of a source: its name (a copy elsewhere names it too), its
    content version, the records read and the texts' sketch."""
    content, records = _keyed_identity(key, identity)
    src = data["sources"].setdefault(match.source, {
        "names": [], "versions": [], "total_epsilon": None, "total_delta": None,
        "created": now})
    if identity.name not in src["names"]:
        src["names"].append(identity.name)
    version = next((v for v in src["versions"] if v.get("content") == content), None)
    if version is None:
        version = {"content": content, "records": [], "sketch": [], "added": now,
                   "first_run": run_id}
        src["versions"].append(version)
    if records not in version["records"]:
        version["records"].append(records)
    for field_name, sketch in (("sketch", identity.sketch),
                               ("normalised_sketch", identity.normalised)):
        known = [int(h, 16) for h in version.get(field_name, [])]
        version[field_name] = [f"{h:016x}" for h in merge_sketches(known, sketch)]
    match.names = list(src["names"])
    return src


def _entry(data: dict[str, Any], source: str, run_id: str, now: str) -> dict[str, Any]:
    entry = next((e for e in data["entries"] if e["source"] == source and e["run_id"] == run_id),
                 None)
    if entry is None:
        entry = {"source": source, "run_id": run_id, "created": now}
        data["entries"].append(entry)
    return entry


def _find_source(data: dict[str, Any], ref: str, path: Path) -> str:
    if ref in data["sources"]:
        return ref
    by_name = [sid for sid, s in data["sources"].items() if ref in s["names"]]
    by_records = [e["source"] for e in data["entries"] if e.get("records") == ref]
    found = sorted(set(by_name or by_records))
    if len(found) == 1:
        return found[0]
    if not found:
        known = ", ".join(sorted(data["sources"])) or "none"
        raise PrivacyConfigError(f"{path}: no data source {ref!r} (known sources: {known}); "
                                 "`dpsynth budget show` lists them, or use --data FILE")
    raise PrivacyConfigError(f"{ref!r} names several sources ({', '.join(found)}): use an id")


def _summary(data: dict[str, Any], sid: str) -> dict[str, Any]:
    src = data["sources"][sid]
    runs = [dict(e) for e in data["entries"] if e["source"] == sid]
    eps, delta = _sum(data["entries"], sid)
    return {
        "source": sid,
        "names": list(src["names"]),
        "versions": [{"content": (v.get("content") or "")[:12] or None,
                      "added": v.get("added"), "first_run": v.get("first_run"),
                      "runs_read": len(v.get("records", []))} for v in src["versions"]],
        "total_epsilon": src.get("total_epsilon"),
        "total_delta": src.get("total_delta"),
        "epsilon": eps,
        "delta": delta,
        "runs_without_dp_guarantee": sum(1 for e in runs if e.get("guarantee", "dp") != "dp"),
        "runs": runs,
    }


def counted(entry: dict[str, Any]) -> tuple[float | None, float | None]:
    """What an entry counts, for display (None for a run without a classical guarantee)."""
    if entry.get("guarantee", "dp") != "dp":
        return None, None
    return _counted(entry)


def _refuse_over_cap(data: dict[str, Any], charge: Charge, run_id: str, epsilon: float,
                     delta: float, total_epsilon: float | None, total_delta: float | None,
                     default_epsilon: float | None = None) -> None:
    """Raise BudgetRefusedError when (epsilon, delta) for ``run_id`` (its earlier reservation
    replaced) would take any source of ``charge`` past its cap: the stored one, else the
    run's ``total_*`` (the smaller wins), else ``default_epsilon`` for epsilon."""
    for m in charge.sources:
        stored = data["sources"].get(m.source, {})
        cap_eps = _cap(stored.get("total_epsilon"), total_epsilon)
        default = cap_eps is None and default_epsilon is not None
        if default:
            cap_eps = default_epsilon
        cap_delta = _cap(stored.get("total_delta"), total_delta)
        s_eps, s_delta = _sum(data["entries"], m.source, skip_run=run_id)
        if (cap_eps is not None and s_eps + epsilon > cap_eps + _TOL) or (
                cap_delta is not None and s_delta + delta > cap_delta + _TOL):
            how = ("give the source a cap of its own with `dpsynth budget set` (it has none, "
                   "so the default holds), or run with --no-cap (privacy.no_cap: true) to go "
                   "past the default knowingly" if default else "raise the source's total "
                   "with `dpsynth budget set`")
            raise BudgetRefusedError(
                f"privacy budget of {m.describe()} refused: spent so far "
                f"epsilon={s_eps:.4g}, delta={s_delta:.3g}; this run asks epsilon="
                f"{epsilon:.4g}, delta={delta:.3g}; the source's total is epsilon="
                f"{_fmt(cap_eps)}{' (default)' if default else ''}, delta={_fmt(cap_delta)}. "
                f"Lower this run's epsilon/delta, or {how} (every subset, column choice, "
                "unit and version of a source shares its budget)")


def _adopt_totals(src: dict[str, Any], total_epsilon: float | None, total_delta: float | None,
                  run_id: str, now: str) -> None:
    """A source without a budget takes the run's config ``total_*`` as its own."""
    for name, value in (("total_epsilon", total_epsilon), ("total_delta", total_delta)):
        if value is not None and src.get(name) is None:
            src[name] = value
            src["budget_set"] = {"at": now, "by": f"run {run_id}"}


__all__ = ["DEFAULT_TOTAL_EPSILON", "BudgetLedger", "Charge", "LedgerUnusableError",
           "OtherFolderError", "SourceMatch",
           "check_folder", "counted", "default_ledger_path", "keyed_fingerprint"]
