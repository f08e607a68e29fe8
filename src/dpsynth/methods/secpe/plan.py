"""SecPE's secret split and its calibrated noise (docs/methods.md §3), computed once before
any model loads and saved in the run's private area, so a resumed run does not solve the
SecretNoise LP again."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...compute import dataset_engine
from ...config import ConfigError, RunConfig
from ...files import atomic_write_bytes
from ..base import read_section
from . import statistics
from .config import SecPEConfig
from .representatives import JOINT_SENSITIVITY

if TYPE_CHECKING:
    from ...compute.sharded import ShardedDataset
    from ...data import Dataset
    from ...secrets import SecretSplit


def secpe_settings(config: RunConfig) -> SecPEConfig:
    """The run's ``secpe:`` section (its defaults when the config has none)."""
    return read_section(config, "secpe", SecPEConfig)


def plan_digest(config: RunConfig, fingerprint: str) -> str:
    """The key of a saved SecretNoise plan: the secret definitions, p, r, T, the data's
    fingerprint and the calibration's fixed settings."""
    from .theory import DEFAULT_TAIL_MASS

    cfg = secpe_settings(config)
    key = {"secrets": [dict(s) for s in cfg.secrets], "p": cfg.p,
           "r": cfg.r, "T": config.synthesis.iterations,
           "fingerprint": fingerprint, "rule": "paper",
           "discretization": cfg.discretization, "tail_mass": DEFAULT_TAIL_MASS}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def _plan_file(folder: Path) -> Path:
    return folder / "secpe-plan.npz"


def _save_plan(folder: Path, digest: str, split: SecretSplit, summary: dict[str, Any]) -> None:
    """The driver's part of a plan (public rows, counts, summary), 0600 in the run's private
    area; the rates are saved by the engine (the shards' own folders on Ray)."""
    facts = {"digest": digest, "n_records": split.n_records, "no_secrets": split.no_secrets,
             "records_with": split.records_with, "messages": split.messages,
             "summary": summary}
    buf = io.BytesIO()
    np.savez(buf, public=split.public_idx, facts=np.array(json.dumps(facts)))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_write_bytes(_plan_file(folder), buf.getvalue(), mode=0o600)


def _load_plan(folder: Path, digest: str) -> tuple[SecretSplit, dict[str, Any]] | None:
    from ...secrets import SecretSplit

    path = _plan_file(folder)
    if not path.is_file():
        return None
    with np.load(path) as saved:
        facts = json.loads(str(saved["facts"]))
        if facts["digest"] != digest:
            return None
        split = SecretSplit(int(facts["n_records"]), saved["public"].copy(),
                            bool(facts["no_secrets"]), dict(facts["records_with"]),
                            list(facts["messages"]))
    return split, dict(facts["summary"])


class SecretPlan:
    """The secret split and its calibrated noise, computed once before any model loads (and
    reused on resume): the engine scans the records (:func:`statistics.secret_split`; on Ray
    each shard scans and keeps its own records' secret membership), SecretNoise runs where the
    membership is (a Ray task with engine ray) and the shards keep their rows' Poisson rates.
    This object holds only the public rows, counts and the noise scale (docs/methods.md §3)."""

    def __init__(self, config: RunConfig, split: SecretSplit, summary: dict[str, Any],
                 digest: str = "") -> None:
        cfg = secpe_settings(config)
        self.split = split
        self.public_idx = split.public_idx
        self.digest = digest
        self.p = cfg.p
        self.r = cfg.r
        self.sigma_star = float(summary["sigma_star"])
        self.max_rate = float(summary["max_rate"])
        self.secrets_per_type = dict(summary["secrets_per_type"])
        self.sigma = JOINT_SENSITIVITY * self.sigma_star

    @classmethod
    def build(cls, config: RunConfig, dataset: Dataset | ShardedDataset,
              folder: Path | None = None) -> SecretPlan:
        """Scan and calibrate through the dataset's engine (``folder``, the run's private
        area, holds the local engine's rates), or reuse the plan saved in ``folder`` under the
        same :func:`plan_digest`; a bad definition is a ConfigError."""
        from ...secrets import SecretDefinitionError

        cfg = secpe_settings(config)
        engine = dataset_engine(dataset, False, folder)
        digest = plan_digest(config, dataset.fingerprint())
        saved = None if folder is None else _load_plan(folder, digest)
        if saved is not None and statistics.rates_ready(engine, digest):
            return cls(config, *saved, digest)
        try:
            split = statistics.secret_split(engine, cfg.secrets)
        except (SecretDefinitionError, ValueError) as err:
            raise ConfigError(f"secpe.secrets: {err}") from None
        if len(split.public_idx) == 0:
            raise ConfigError("secpe.secrets match every record: no public records remain for "
                              "the public clustering; narrow the secret definitions")
        summary = statistics.plan_secret_rates(engine, split, cfg.p, cfg.r,
                                               config.synthesis.iterations, digest,
                                               cfg.discretization)
        if folder is not None:
            _save_plan(folder, digest, split, summary)
        return cls(config, split, summary, digest)

    @property
    def protects(self) -> bool:
        return self.sigma > 0

    def report(self) -> dict[str, Any]:
        """Exact counts of the split: derived from the private data, so for
        private/diagnostics.jsonl only (never release/ or the log)."""
        return self.split.report(self.secrets_per_type)

    def summary(self) -> str:
        """What protection the run gives, for privacy.json: from public parameters only (that
        no record holds a secret is a fact about the private data: diagnostics only)."""
        if self.r < 1:
            return f"(p={self.p:g}, r={self.r:g}) per secret"
        return (f"no protection asked (r = min(1, p * r_over_p) = {self.r:g}): records holding "
                "secrets enter the representatives without noise")

    def noise_report(self) -> dict[str, Any]:
        """The calibrated noise, for private/diagnostics.jsonl only: SecretNoise calibrates it
        from the secrets found in the private data, so it is not released."""
        return {"noise_sigma": self.sigma, "calibrated_sigma_per_unit_shift": self.sigma_star,
                "no_secret_found": bool(self.split.no_secrets)}
