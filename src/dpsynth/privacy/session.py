"""PrivacySession: the one door through which private data leaves as noisy statistics.

Every release has a unique ``key`` naming the statistic (e.g. ``"iter3/votes"``). A release is
written durably (value and privacy event) BEFORE it is returned, and on construction the store is
replayed into the accountant. Asking again for a stored key returns the stored noisy value and
charges nothing: noise is never redrawn for a statistic that was released (METHODS.md section 0,
"Resume"). One process writes a store at a time.

Store layout: ``store_dir/releases.jsonl`` (one JSON line per release) and
``store_dir/releases/<sha256(key)>.npy`` for arrays of more than 4096 elements.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .accountant import Accountant
from .errors import BudgetExceededError, PrivacyConfigError
from .events import Event, ExponentialEvent, GaussianEvent, ZCDPEvent, event_from_dict
from .noise import NoiseSource

log = logging.getLogger("dpsynth.privacy")

INLINE_MAX = 4096
STORE_FILE = "releases.jsonl"
UNITS = ("record", "user")


# ----------------------------------------------------------------------------- pure helpers


def clip_logits(logits: np.ndarray, c: float) -> np.ndarray:
    """DP-SynRAG clip_c (METHODS.md section 4), row-wise (rows = documents):
    l = exp(logits - max) - 1 (in [-1, 0]); centre by (max + min) / 2; scale by
    min(1, c / ||l||_inf). Each returned row has sup-norm <= c, so the sum over documents has
    per-coordinate sensitivity c (one document added or removed)."""
    if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
        raise PrivacyConfigError(f"clip c must be a finite number > 0, got {c!r}")
    x = np.asarray(logits, dtype=np.float64)
    one_d = x.ndim == 1
    x = np.atleast_2d(x)
    if x.ndim != 2 or x.shape[1] == 0:
        raise PrivacyConfigError(f"logits must be 1-D or 2-D (docs x vocab), got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise PrivacyConfigError("logits contain NaN or +inf")
    m = x.max(axis=1, keepdims=True)
    if not np.isfinite(m).all():
        raise PrivacyConfigError("a row of logits is entirely -inf")
    lv = np.expm1(x - m)
    lv = lv - (lv.max(axis=1, keepdims=True) + lv.min(axis=1, keepdims=True)) / 2.0
    norm = np.abs(lv).max(axis=1, keepdims=True)
    scale = np.minimum(1.0, c / np.where(norm > 0, norm, np.inf))
    out = lv * scale
    return out[0] if one_d else out


def _gumbel_argmax(noise: NoiseSource, log_weights: np.ndarray) -> int:
    """argmax(log_weights + Gumbel): a sample with probability proportional to exp(log_weights)."""
    g = np.asarray(noise.gumbel(log_weights.shape), dtype=np.float64)
    return int(np.argmax(np.where(np.isneginf(log_weights), -np.inf, log_weights + g)))


def _as_finite_array(name: str, x: Any, *, allow_neg_inf: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    bad = np.isnan(a) | np.isposinf(a)
    if not allow_neg_inf:
        bad |= np.isneginf(a)
    if bad.any():
        raise PrivacyConfigError(f"{name} contains non-finite entries")
    return a


def threshold_log_weights(
    values: np.ndarray, target: int, candidates: np.ndarray, epsilon: float, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Log-weights of the threshold exponential mechanism and the grid (see
    :meth:`PrivacySession.exponential_threshold`). Returns (log_weights, points): in "grid" mode
    points are the candidates; in "interval" mode they are the interval end points
    (len(points) = len(log_weights) + 1)."""
    v = _as_finite_array("values", values).ravel()
    cand = _as_finite_array("candidates", candidates).ravel()
    if cand.size == 0:
        raise PrivacyConfigError("candidates must not be empty")
    if mode == "grid":
        counts = (v[None, :] > cand[:, None]).sum(axis=1)
        util = -np.abs(counts - target).astype(np.float64)
        return epsilon * util / 2.0, cand
    if mode == "interval":
        lo, hi = float(cand.min()), float(cand.max())
        s = np.sort(np.clip(v, lo, hi))
        points = np.concatenate([[lo], s, [hi]])
        lengths = np.diff(points)
        # theta in [points[j], points[j+1]) has exactly n - j values above it (ties: length 0).
        counts = v.size - np.arange(lengths.size)
        util = -np.abs(counts - target).astype(np.float64)
        with np.errstate(divide="ignore"):
            logw = np.log(lengths) + epsilon * util / 2.0
        return logw, points
    raise PrivacyConfigError(f"threshold mode must be 'grid' or 'interval', got {mode!r}")


def sample_threshold(noise: NoiseSource, logw: np.ndarray, points: np.ndarray, mode: str) -> float:
    """Draw theta from :func:`threshold_log_weights` output: a grid point, or an interval then a
    uniform point inside it."""
    if mode == "grid":
        return float(points[_gumbel_argmax(noise, logw)])
    if np.isneginf(logw).all():  # empty range (min == max): nothing to choose
        return float(points[0])
    j = _gumbel_argmax(noise, logw)
    u = float(np.asarray(noise.uniform(1)).ravel()[0])
    return float(points[j] + u * (points[j + 1] - points[j]))


# ----------------------------------------------------------------------------- value codec


def _key_file(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40] + ".npy"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PrivacySession:
    """Persistent, resume-safe releases with budget enforcement.

    ``target`` = (epsilon, delta): a release that would take epsilon at the target delta above
    the target epsilon raises :class:`BudgetExceededError` before any noise is drawn.
    When the noise source has ``spawn(key)`` (both built-in sources do), each release draws from
    a per-key stream: with seeded noise a resumed run can never reuse another key's noise.
    """

    def __init__(
        self,
        store_dir: Path,
        accountant: Accountant,
        noise: NoiseSource,
        target: tuple[float, float] | None = None,
    ) -> None:
        self.store_dir = Path(store_dir)
        self.accountant = accountant
        self.noise = noise
        if target is not None:
            t_eps, t_delta = target
            if not (isinstance(t_eps, int | float) and math.isfinite(t_eps) and t_eps > 0):
                raise PrivacyConfigError(f"target epsilon must be > 0, got {t_eps!r}")
            if not (isinstance(t_delta, int | float) and 0 < t_delta < 1):
                raise PrivacyConfigError(f"target delta must be in (0, 1), got {t_delta!r}")
            target = (float(t_eps), float(t_delta))
        self.target = target
        self._records: dict[str, dict[str, Any]] = {}
        self.store_dir.mkdir(parents=True, exist_ok=True)
        (self.store_dir / "releases").mkdir(exist_ok=True)
        self._path = self.store_dir / STORE_FILE
        self._replay()

    # -- persistence ---------------------------------------------------------------------------
    def _replay(self) -> None:
        if not self._path.exists():
            return
        raw = self._path.read_bytes()
        good_end = 0
        pos = 0
        lineno = 0
        while pos < len(raw):
            nl = raw.find(b"\n", pos)
            lineno += 1
            if nl < 0:
                # A line without its newline is a write interrupted by a crash: that release was
                # never returned to the caller, so it is dropped (and cut off the file).
                log.warning("%s: dropping an incomplete last line (interrupted write)", self._path)
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
            except (ValueError, KeyError, TypeError) as err:
                raise PrivacyConfigError(
                    f"{self._path}, line {lineno}: corrupt release record ({type(err).__name__})"
                ) from None
            if key in self._records:
                raise PrivacyConfigError(f"{self._path}, line {lineno}: duplicate key {key!r}")
            rec["_events"] = events
            self._records[key] = rec
            for ev in events:
                self.accountant.add(ev)
            good_end = pos
        if good_end < len(raw):
            with open(self._path, "r+b") as fh:
                fh.truncate(good_end)
                fh.flush()
                os.fsync(fh.fileno())

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
                tmp = final.with_suffix(".tmp")
                with open(tmp, "wb") as fh:
                    np.save(fh, value, allow_pickle=False)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, final)
                _fsync_dir(final.parent)
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

    def _decode(self, enc: dict[str, Any]) -> Any:
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

    def _write(self, key: str, events: list[Event], value: Any) -> None:
        rec = {
            "key": key,
            "events": [e.to_dict() for e in events],
            "value": self._encode(key, value),
            "noise": self.noise.mode,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        line = json.dumps(rec, allow_nan=True, separators=(",", ":")) + "\n"
        created = not self._path.exists()
        with open(self._path, "ab") as fh:
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        if created:
            _fsync_dir(self.store_dir)
        rec["_events"] = events
        self._records[key] = rec

    # -- release protocol ----------------------------------------------------------------------
    def _check_key(self, key: str) -> None:
        if not isinstance(key, str) or not key:
            raise PrivacyConfigError(f"release key must be a non-empty string, got {key!r}")

    def _stored(self, key: str, events: list[Event]) -> tuple[bool, Any]:
        """(True, value) when ``key`` was released before (nothing is charged again)."""
        self._check_key(key)
        rec = self._records.get(key)
        if rec is None:
            return False, None
        if [e.to_dict() for e in events] != [e.to_dict() for e in rec["_events"]]:
            log.warning(
                "release %r was stored with different privacy parameters; the stored value is "
                "reused and accounted with its original parameters",
                key,
            )
        return True, self._decode(rec["value"])

    def _admit(self, events: list[Event]) -> None:
        """Check the events can be accounted and fit in the target, before any noise is drawn."""
        for ev in events:
            self.accountant.check(ev)
        if self.target is None:
            return
        t_eps, t_delta = self.target
        if not self.accountant.fits_if_added(events, t_eps * (1.0 + 1e-9), t_delta):
            new_eps = self.accountant.epsilon_if_added(events, t_delta)
            names = ", ".join(sorted({e.name for e in events}))
            raise BudgetExceededError(
                f"release of {names} would take epsilon to {new_eps:.4f} at delta={t_delta:g}, "
                f"above the target epsilon={t_eps:g} (spent so far: "
                f"{self.accountant.epsilon(t_delta):.4f}); raise the target or add more noise"
            )

    def _commit(self, key: str, events: list[Event], value: Any) -> None:
        self._write(key, events, value)
        for ev in events:
            self.accountant.add(ev)

    def noise_for(self, key: str) -> NoiseSource:
        """The noise stream of one release key (independent per key; same on resume when
        seeded). Also for a mechanism's own randomness, e.g. Poisson sampling coins."""
        return self._noise_for(key)

    def _noise_for(self, key: str) -> NoiseSource:
        spawn = getattr(self.noise, "spawn", None)
        return spawn(key) if callable(spawn) else self.noise

    # -- mechanisms ----------------------------------------------------------------------------
    def gaussian(
        self,
        key: str,
        value: np.ndarray,
        sensitivity: float,
        sigma: float,
        *,
        name: str = "gaussian",
        sampling_rate: float = 1.0,
    ) -> np.ndarray:
        """Gaussian mechanism: value + N(0, sigma^2 I); the caller guarantees that ``value`` has
        L2 sensitivity <= ``sensitivity`` (and, with sampling_rate < 1, that it was computed on a
        Poisson sample of rate ``sampling_rate``). mu = sensitivity / sigma (METHODS.md 0)."""
        events: list[Event] = [GaussianEvent(sigma, sensitivity, 1, sampling_rate, name)]
        found, stored = self._stored(key, events)
        if found:
            return stored
        v = _as_finite_array("value", value)
        self._admit(events)
        noisy = v + np.asarray(self._noise_for(key).normal(v.shape, sigma), dtype=np.float64)
        noisy = noisy.reshape(v.shape)
        self._commit(key, events, noisy)
        return noisy

    def noisy_counts(
        self, key: str, counts: np.ndarray, sigma: float, *, name: str = "noisy_counts"
    ) -> np.ndarray:
        """Counts (each record adds 1 to one cell: L2 sensitivity 1) + N(0, sigma^2 I)."""
        return self.gaussian(key, counts, 1.0, sigma, name=name)

    def exponential(
        self,
        key: str,
        utilities: np.ndarray,
        sensitivity: float,
        epsilon: float,
        *,
        name: str = "exponential",
    ) -> int:
        """Exponential mechanism (McSherry & Talwar 2007): index i with probability proportional
        to exp(eps u_i / (2 Delta_u)), sampled by Gumbel-max; eps-DP. Entries equal to -inf are
        excluded candidates (that exclusion must not depend on private data)."""
        events: list[Event] = [ExponentialEvent(epsilon, 1, name)]
        found, stored = self._stored(key, events)
        if found:
            return stored
        ok = isinstance(sensitivity, int | float) and math.isfinite(sensitivity)
        if not ok or sensitivity <= 0:
            raise PrivacyConfigError(f"sensitivity must be finite and > 0, got {sensitivity!r}")
        u = _as_finite_array("utilities", utilities, allow_neg_inf=True).ravel()
        if u.size == 0 or np.isneginf(u).all():
            raise PrivacyConfigError("utilities must contain at least one finite entry")
        self._admit(events)
        idx = _gumbel_argmax(self._noise_for(key), epsilon * u / (2.0 * sensitivity))
        self._commit(key, events, idx)
        return idx

    def exponential_threshold(
        self,
        key: str,
        values: np.ndarray,
        target: int,
        candidates: np.ndarray,
        epsilon: float,
        *,
        mode: str = "grid",
        name: str = "threshold",
    ) -> float:
        """Choose a threshold theta with about ``target`` values above it (DP-SynRAG retrieval,
        METHODS.md section 4): utility -|#{v > theta} - target|, sensitivity 1, eps-DP.

        mode="grid": theta among ``candidates`` with probability proportional to
        exp(eps u(theta) / 2).
        mode="interval": theta anywhere in [min(candidates), max(candidates)] (a public range,
        e.g. [-1, 1] for cosine similarity): the range is cut at the sorted values, an interval
        is drawn with probability proportional to length * exp(eps u / 2) and theta uniformly
        inside it. This is the exponential mechanism over the continuous range (uniform base
        measure), so it is not limited to a coarse grid.
        """
        events: list[Event] = [ExponentialEvent(epsilon, 1, name)]
        found, stored = self._stored(key, events)
        if found:
            return stored
        if isinstance(target, bool) or not isinstance(target, int | np.integer) or target < 0:
            raise PrivacyConfigError(f"target must be an integer >= 0, got {target!r}")
        logw, points = threshold_log_weights(values, int(target), candidates, epsilon, mode)
        self._admit(events)
        theta = sample_threshold(self._noise_for(key), logw, points, mode)
        self._commit(key, events, theta)
        return theta

    def private_token(
        self,
        key: str,
        clipped_logit_sum: np.ndarray,
        clip: float,
        temperature: float,
        *,
        name: str = "private_prediction",
    ) -> int:
        """One private token of DP-SynRAG (METHODS.md section 4): y ~ softmax(z / tau) over the
        FULL vocabulary (no top-k / top-p), z = sum of clip_logits(.., c) rows. An exponential
        mechanism with per-coordinate sensitivity c: rho = (1/2) (c / tau)^2 per token."""
        for pname, p in (("clip", clip), ("temperature", temperature)):
            if not (isinstance(p, int | float) and math.isfinite(p) and p > 0):
                raise PrivacyConfigError(f"{pname} must be a finite number > 0, got {p!r}")
        events: list[Event] = [ZCDPEvent(0.5 * (clip / temperature) ** 2, 1, name)]
        found, stored = self._stored(key, events)
        if found:
            return stored
        z = _as_finite_array("clipped_logit_sum", clipped_logit_sum).ravel()
        if z.size == 0:
            raise PrivacyConfigError("clipped_logit_sum must not be empty")
        self._admit(events)
        idx = _gumbel_argmax(self._noise_for(key), z / temperature)
        self._commit(key, events, idx)
        return idx

    def record(self, key: str, event: Event | Iterable[Event], value: Any = None) -> Any:
        """Account a release computed elsewhere (e.g. a secure sum whose noise the parties
        added). Same semantics: a stored key returns its stored value and charges nothing."""
        events = (
            [event]
            if isinstance(event, GaussianEvent | ExponentialEvent | ZCDPEvent)
            else (list(event))
        )
        if not events:
            raise PrivacyConfigError(f"record {key!r}: at least one event is required")
        found, stored = self._stored(key, events)
        if found:
            return stored
        self._admit(events)
        self._commit(key, events, value)
        return value

    # -- queries -------------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        """Whether ``key`` has been released."""
        return key in self._records

    def get(self, key: str) -> Any:
        """The stored noisy value of ``key`` (KeyError if it was never released)."""
        if key not in self._records:
            raise KeyError(f"no release stored under key {key!r}")
        return self._decode(self._records[key]["value"])

    def keys(self) -> list[str]:
        """Keys of all releases, in release order."""
        return list(self._records)

    def _delta_or_target(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.target is None:
            raise PrivacyConfigError("delta is required when the session has no target")
        return self.target[1]

    def epsilon(self, delta: float | None = None) -> float:
        """epsilon spent so far at ``delta`` (default: the target delta)."""
        return self.accountant.epsilon(self._delta_or_target(delta))

    def _noise_label(self) -> str:
        modes = {rec.get("noise", "seeded") for rec in self._records.values()} | {self.noise.mode}
        return "secure" if modes == {"secure"} else "seeded"

    def spent(self) -> dict[str, Any]:
        """Spending so far: epsilon at the target delta (when there is a target) and counts."""
        out: dict[str, Any] = {
            "releases": len(self._records),
            "accountant": self.accountant.kind,
            "noise": self._noise_label(),
        }
        if self.target is not None:
            out.update(
                epsilon=self.accountant.epsilon(self.target[1]),
                delta=self.target[1],
                target_epsilon=self.target[0],
                target_delta=self.target[1],
            )
        return out

    def statement(self, unit: str, target: tuple[float, float]) -> dict[str, Any]:
        """The privacy statement written to release/privacy.json."""
        if unit not in UNITS:
            raise PrivacyConfigError(f"unit must be one of {UNITS}, got {unit!r}")
        t_eps, t_delta = target
        return {
            "epsilon": self.accountant.epsilon(t_delta),
            "delta": t_delta,
            "target_epsilon": t_eps,
            "target_delta": t_delta,
            "unit": unit,
            "accountant": self.accountant.kind,
            "noise": self._noise_label(),
            "releases": len(self._records),
            "mechanisms": self.accountant.summary(),
        }
