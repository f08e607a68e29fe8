"""The Python API behind `dpsynth generate`: one function runs (or resumes) a PE-family run.

    from dpsynth.api import run_generation
    run_dir = run_generation("examples/demo.yaml", "runs/demo")

Order of work: config -> method -> data -> validation (all before any model loads) -> noise
calibration -> ledger reservation -> the evolution loop -> release/.
"""

from __future__ import annotations

import calendar
import math
import time
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, RunConfig, apply_overrides, dump_config, load_config, parse_config
from .context import RunContext, demo_data_paths
from .methods import get_method
from .runs import RunDir, atomic_write_json, write_jsonl


def _load(config: RunConfig | str | Path, overrides: dict[str, Any] | None) -> RunConfig:
    if isinstance(config, RunConfig):
        if overrides:
            raw = config.model_dump(mode="json")
            apply_overrides(raw, overrides)
            return parse_config(raw)
        return config
    return load_config(config, overrides)


def open_run(config: RunConfig | str | Path, output_dir: str | Path, *, resume: bool,
             overrides: dict[str, Any] | None = None, method: str | None = None,
             check: Any = None) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """Create a run folder, or reopen one to resume it (with its stored config).

    `check(config)` runs before anything is written, so a bad config leaves no folder behind;
    `method` names the run in run.json (default: config.method). Returns (run, config, meta).
    """
    run = RunDir(output_dir)
    if resume:
        if not run.exists():
            raise ConfigError(f"{run.root}: nothing to resume (no run.json there)")
        cfg = parse_config(yaml.safe_load(run.config_path.read_text()), str(run.config_path))
        meta = run.update_meta(status="running", attempts=run.meta().get("attempts", 1) + 1)
        return run, cfg, meta
    cfg = _load(config, overrides)
    if check is not None:
        check(cfg)
    if run.exists():
        raise ConfigError(f"{run.root} already holds a run: pass --resume to continue it, "
                          "or choose another --output")
    return run, cfg, run.create(dump_config(cfg), method or cfg.method)


def load_run_data(config: RunConfig, run: RunDir) -> Any:
    """The private dataset of a run (the demo corpus is written into the private area)."""
    from .data import load_dataset

    path = config.data.path
    if path == "demo":
        path = str(demo_data_paths(run, config.data.demo_rows, config.data.demo_seed)["private"])
    user = config.data.user if config.privacy.unit == "user" or config.data.user else None
    if config.privacy.unit == "user" and not config.data.user:
        raise ConfigError("privacy.unit is 'user' but data.user names no user column")
    return load_dataset(path, config.data.text, config.data.labels, user,
                        max_chars=config.data.max_chars, limit=config.data.limit)


def calibrate_sigma(config: RunConfig, method: Any, n_labels: int) -> float:
    """The noise multiplier that meets the target (epsilon, delta) over all planned releases."""
    if math.isinf(config.privacy.epsilon):
        return 0.0
    if method.vote_releases(config, n_labels) == 0:
        return 0.0
    from .privacy import calibrate_gaussian_sigma

    return float(calibrate_gaussian_sigma(
        config.privacy.epsilon, config.privacy.delta,
        lambda s: method.planned_events(config, n_labels, s), kind=config.privacy.accountant,
    ))


def _ledger(config: RunConfig) -> Any:
    from .privacy import BudgetLedger

    return BudgetLedger(config.privacy.ledger)  # None: $DPSYNTH_LEDGER or ~/.dpsynth/


def run_generation(config: RunConfig | str | Path, output_dir: str | Path, *,
                   resume: bool = False, overrides: dict[str, Any] | None = None,
                   progress: bool = True) -> Path:
    """Run a PE-family method end to end, or resume it; returns the run folder."""
    # an unknown method fails before anything is written
    run, cfg, meta = open_run(config, output_dir, resume=resume, overrides=overrides,
                              check=lambda c: get_method(c.method))
    method = get_method(cfg.method)
    try:
        dataset = load_run_data(cfg, run)
        n_labels = len(dataset.joint_label_codes()[1])
        method.validate(cfg, len(dataset), n_labels)
        sigma = method.prepare(cfg, dataset)
        if sigma is None:
            sigma = calibrate_sigma(cfg, method, n_labels)
        fingerprint = dataset.fingerprint()
        private = (method.private_votes and method.dp_guarantee
                   and not math.isinf(cfg.privacy.epsilon))
        if not resume:
            run.update_meta(dataset_fingerprint=fingerprint, sigma=sigma)
            if private:
                _ledger(cfg).reserve(fingerprint, meta["run_id"], cfg.privacy.epsilon,
                                     cfg.privacy.delta, cfg.privacy.total_epsilon,
                                     cfg.privacy.total_delta)
        session = _session(cfg, run, method.dp_guarantee and method.private_votes)
        ctx = RunContext(cfg, run, dataset, sigma, session, progress=progress)
        run.log(f"method {cfg.method}: {len(dataset)} records, {n_labels} label classes, "
                f"noise multiplier {sigma:.4g}")
        from .evolution.loop import evolve

        final = evolve(ctx, method.strategy(ctx), method.iterations(cfg))
        statement = _statement(cfg, ctx, method)
        write_jsonl(run.release / "synthetic.jsonl", ctx.rows(final))
        atomic_write_json(run.release / "privacy.json", statement)
        summary = {
            "method": cfg.method,
            "samples": len(final),
            "epsilon": statement["epsilon"],
            "delta": statement["delta"],
            **ctx.llm_counts(),
            # calls paid by earlier attempts that stopped with an error (a killed process
            # cannot report its own; its finished calls sit in the request cache)
            "llm_calls_earlier_attempts": int(meta.get("llm_calls_paid", 0)),
            "wall_seconds": round(time.time() - _started(meta), 1),
        }
        atomic_write_json(run.release / "summary.json", summary)
        if private:
            _ledger(cfg).settle(meta["run_id"], statement["epsilon"], statement["delta"])
        run.update_meta(status="finished",
                        finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        run.log(f"finished: {len(final)} samples")
        return run.root
    except BaseException as err:
        paid = int(meta.get("llm_calls_paid", 0))
        if "ctx" in locals():
            paid += ctx.llm_counts().get("llm_calls", 0)
        run.update_meta(status="failed", error=type(err).__name__, llm_calls_paid=paid)
        raise


def _started(meta: dict[str, Any]) -> float:
    try:
        return calendar.timegm(time.strptime(meta["started"], "%Y-%m-%dT%H:%M:%SZ"))
    except (KeyError, ValueError):
        return time.time()


def _session(cfg: RunConfig, run: RunDir, dp_target: bool) -> Any:
    from .privacy import Accountant, PrivacySession, make_noise_source

    target = None
    if dp_target and not math.isinf(cfg.privacy.epsilon):
        target = (cfg.privacy.epsilon, cfg.privacy.delta)
    seed = cfg.privacy.seed if cfg.privacy.noise == "seeded" else None
    return PrivacySession(run.private / "releases", Accountant(cfg.privacy.accountant),
                          make_noise_source(cfg.privacy.noise, seed), target=target)


def _statement(cfg: RunConfig, ctx: RunContext, method: Any) -> dict[str, Any]:
    """release/privacy.json (schema in the README)."""
    target = (cfg.privacy.epsilon, cfg.privacy.delta)
    if not method.private_votes:
        statement = {"epsilon": 0.0, "delta": 0.0, "target_epsilon": cfg.privacy.epsilon,
                     "target_delta": cfg.privacy.delta, "unit": cfg.privacy.unit,
                     "accountant": cfg.privacy.accountant, "noise": cfg.privacy.noise,
                     "mechanisms": [],
                     "note": "no private record was read beyond the set of label values"}
    elif math.isinf(cfg.privacy.epsilon):
        statement = {"epsilon": "inf", "delta": 1.0, "target_epsilon": "inf",
                     "target_delta": cfg.privacy.delta, "unit": cfg.privacy.unit,
                     "accountant": cfg.privacy.accountant, "noise": "none", "mechanisms": [],
                     "note": "NOT PRIVATE: epsilon = inf releases noise-free votes"}
    elif not method.dp_guarantee:
        statement = {"target_epsilon": None, "target_delta": None, "unit": cfg.privacy.unit,
                     "accountant": "secret-protection", "noise": cfg.privacy.noise,
                     "mechanisms": ctx.session.accountant.summary()}
    else:
        statement = ctx.session.statement(cfg.privacy.unit, target)
    statement["method"] = cfg.method
    statement["noise_multiplier"] = ctx.sigma
    statement.update(method.statement_extras(ctx))
    return statement
