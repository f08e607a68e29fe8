"""Account a federated round before it runs (docs/methods.md §2, federated variant).

The noise of a federated round is added by the parties and the sum is unmasked by SecAgg+ on
the server, outside the privacy session. So the session cannot draw, store and return the
value in one step as it does for central releases. ``accounted_round`` therefore:

1. returns the stored result if an earlier attempt of the round finished;
2. admits the round's (worst-case) privacy events against the budget and COMMITS them to the
   release store as a "round started" record (``<key>/started/<attempt>``) before any party
   is contacted: a budget that cannot take the round refuses it before the server can see a
   sum, and a crash after this point leaves the charge on record;
3. runs the round and stores its result durably in ``result_dir`` (the run's private area).

On resume, an attempt whose start was recorded but whose result is missing (a crash, or a round
refused for too few parties) is never re-run uncharged: the next attempt is a new key, admitted
against the budget like any release, and a budget that cannot take it raises
:class:`RoundBudgetSpentError` saying that the earlier attempt's budget was spent.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth.federated.core import FederatedRoundError
from dpsynth.files import atomic_write_bytes


class RoundBudgetSpentError(FederatedRoundError):
    """An earlier attempt of a round was charged but left no result, and the budget cannot
    take another attempt."""


def start_key(key: str, attempt: int) -> str:
    """Release-store key of the "round started" record of one attempt (1, 2, ...)."""
    return f"{key}/started/{attempt}"


def _result_path(result_dir: Path, key: str, attempt: int) -> Path:
    digest = hashlib.sha256(start_key(key, attempt).encode("utf-8")).hexdigest()[:32]
    return Path(result_dir) / f"round-{digest}.npy"


def _save(path: Path, value: np.ndarray) -> None:
    """Atomic, durable write (tmp file, fsync, rename, fsync of the folder); mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    buf = io.BytesIO()
    np.save(buf, np.asarray(value, dtype=np.float64), allow_pickle=False)
    atomic_write_bytes(path, buf.getvalue(), mode=0o600)


def started_attempts(session: Any, key: str) -> int:
    """How many attempts of round ``key`` were charged (their start records are stored)."""
    n = 0
    while session.has(start_key(key, n + 1)):
        n += 1
    return n


def accounted_round(session: Any, key: str, events: Any, run_round: Callable[[], np.ndarray],
                    result_dir: Path) -> np.ndarray:
    """Charge ``events`` for round ``key``, durably, then run it; see the module docstring.

    ``session``: a PrivacySession (``has`` / ``record``); ``run_round()`` returns the released
    sum. Raises the session's BudgetExceededError before ``run_round`` when the budget cannot
    take the first attempt, RoundBudgetSpentError when it cannot take a repeat attempt.
    """
    from dpsynth.privacy import BudgetExceededError

    if session.has(key):  # a run from before start records: its sum was stored and charged
        return np.asarray(session.get(key), dtype=np.float64)
    done = started_attempts(session, key)
    for attempt in range(1, done + 1):
        path = _result_path(result_dir, key, attempt)
        if path.is_file():
            return np.load(path, allow_pickle=False)
    attempt = done + 1
    try:
        session.record(start_key(key, attempt), events, {"attempt": attempt})
    except BudgetExceededError as err:
        if done == 0:
            raise
        raise RoundBudgetSpentError(
            f"federated round {key!r}: {done} earlier attempt(s) were charged to the budget "
            "but left no result (a crash, or too few parties); running it again is a new "
            f"release that the budget cannot take ({err}). The earlier attempts' budget is "
            "spent; start a new run with a fresh budget"
        ) from None
    result = np.asarray(run_round(), dtype=np.float64)
    _save(_result_path(result_dir, key, attempt), result)
    return result
