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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, RunConfig, apply_overrides, dump_config, load_config, parse_config
from .context import RunContext, demo_data_paths
from .diagnostics import append_diagnostic
from .methods import get_method
from .runs import RunDir, atomic_write_json, interruption_reason, stop_signals, write_jsonl


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
        if overrides:  # a resumed run keeps its config; --set may only repeat it
            stored = yaml.safe_load(run.config_path.read_text()) or {}
            wanted = yaml.safe_load(run.config_path.read_text()) or {}
            apply_overrides(wanted, overrides)
            if parse_config(wanted) != parse_config(stored):
                raise ConfigError("--set cannot change a run being resumed: it continues with "
                                  f"its stored {run.config_path} (its privacy parameters are "
                                  "fixed)")
        from .privacy.store import held_by_another_process

        if held_by_another_process(run.private / "releases"):
            raise ConfigError(f"{run.root}: this run is still running in another process; "
                              "wait for it to end (or stop it) before --resume")
        cfg = parse_config(yaml.safe_load(run.config_path.read_text()), str(run.config_path))
        meta = run.update_meta(status="running", attempts=run.meta().get("attempts", 1) + 1)
        return run, cfg, meta
    cfg = _load(config, overrides)
    if check is not None:
        check(cfg)
    if run.exists():
        raise ConfigError(f"{run.root} already holds a run: pass --resume to continue it, "
                          "or choose another --output")
    try:
        run.check_new_output()
    except FileExistsError as err:
        raise ConfigError(str(err)) from None
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
                        max_chars=config.data.max_chars, limit=config.data.limit,
                        label_values=config.data.declared_label_values())


def calibrate_sigma(config: RunConfig, method: Any, n_labels: int,
                    spent: Sequence[Any] = (), delta_used: float = 0.0) -> float:
    """The noise multiplier that meets the target (epsilon, delta) over all planned releases.

    ``spent``: events already released (label-domain discovery), composed with the plan;
    ``delta_used``: delta already taken outside the accountant (discovery's threshold)."""
    if math.isinf(config.privacy.epsilon):
        return 0.0
    if method.vote_releases(config, n_labels) == 0:
        return 0.0
    from .privacy import calibrate_gaussian_sigma

    return float(calibrate_gaussian_sigma(
        config.privacy.epsilon, config.privacy.delta - delta_used,
        lambda s: [*spent, *method.planned_events(config, n_labels, s)],
        kind=config.privacy.accountant,
    ))


def _ledger(config: RunConfig) -> Any:
    from .privacy import BudgetLedger

    return BudgetLedger(config.privacy.ledger)  # None: $DPSYNTH_LEDGER or ~/.dpsynth/


def run_generation(config: RunConfig | str | Path, output_dir: str | Path, *,
                   resume: bool = False, overrides: dict[str, Any] | None = None,
                   progress: bool = True, generators: Sequence[Any] | None = None,
                   embedder: Any | None = None) -> Path:
    """Run a PE-family method end to end, or resume it; returns the run folder.

    ``generators`` / ``embedder`` replace the configured models with ready objects (one
    generator per configured entry), e.g. the deterministic fakes of the fast tests.

    A refusal before any work (bad data, a config the method cannot run, a ledger refusal)
    removes the new run folder again; a stop after work began keeps it for ``--resume``, with a
    true status in run.json (failed with the error's class, or interrupted by SIGINT / SIGTERM).
    """
    had_folder = Path(output_dir).is_dir()
    # an unknown method fails before anything is written
    run, cfg, meta = open_run(config, output_dir, resume=resume, overrides=overrides,
                              check=lambda c: get_method(c.method))
    method = get_method(cfg.method)
    working = resume  # a resumed run has already worked: its folder always stays
    ctx: RunContext | None = None
    session: Any = None
    with stop_signals():
        try:
            dataset = load_run_data(cfg, run)
            private = (method.private_votes and method.dp_guarantee
                       and not math.isinf(cfg.privacy.epsilon))
            discover = _discovery_columns(cfg, dataset, private)
            sigma = None
            if not discover:  # a declared domain: validate and calibrate before any release
                n_labels = len(dataset.joint_label_codes()[1])
                method.validate(cfg, len(dataset), n_labels)
                sigma = method.prepare(cfg, dataset)
                if sigma is None:
                    sigma = calibrate_sigma(cfg, method, n_labels)
            # keyed (HMAC) fingerprint: the raw digest never leaves this process
            fingerprint = _ledger(cfg).dataset_id(dataset.fingerprint())
            # a resumed run whose first attempt was killed before its ledger entry was written
            # reserves now (nothing was released before the reservation)
            recorded = resume and any(e.get("run_id") == meta["run_id"]
                                      for e in _ledger(cfg).entries())
            if not recorded:
                run.update_meta(dataset_fingerprint=fingerprint, sigma=sigma)
                if private:
                    _ledger(cfg).reserve(fingerprint, meta["run_id"], cfg.privacy.epsilon,
                                         cfg.privacy.delta, cfg.privacy.total_epsilon,
                                         cfg.privacy.total_delta, noise_seed=_noise_seed(cfg, run))
                elif method.private_votes:  # epsilon = inf, or SecPE's (p, r): no (eps, delta)
                    if math.isinf(cfg.privacy.epsilon):
                        _ledger(cfg).record_run(fingerprint, meta["run_id"], "none",
                                                method=cfg.method)
                    else:
                        _ledger(cfg).record_run(fingerprint, meta["run_id"], "secret-protection",
                                                method=cfg.method, p=cfg.secpe.p,
                                                r=cfg.secpe.p * cfg.secpe.r_over_p)
            working = True  # from here on a reservation exists: the folder is kept
            delta_used = cfg.data.label_domain_delta if discover else 0.0
            session = _session(cfg, run, method.dp_guarantee and method.private_votes,
                               delta_used=delta_used)
            domain = None
            if discover:  # the label domain found privately, then the usual validation
                dataset, domain = _discover_domain(cfg, dataset, session)
                n_labels = len(dataset.joint_label_codes()[1])
                method.validate(cfg, len(dataset), n_labels)
                sigma = calibrate_sigma(cfg, method, n_labels, domain.events, delta_used)
                if not resume:
                    run.update_meta(sigma=sigma)
            assert sigma is not None
            ctx = RunContext(cfg, run, dataset, sigma, session, progress=progress,
                             generators=generators, embedder=embedder)
            # the exact record count is a fact about the private data: diagnostics only
            append_diagnostic(run, {"kind": "dataset", "records": len(dataset),
                                    "noise_multiplier": sigma})
            run.log(f"method {cfg.method}: {n_labels} label classes")
            from .evolution.loop import evolve

            final = evolve(ctx, method.strategy(ctx), method.iterations(cfg))
            statement = _statement(cfg, ctx, method, domain)
            write_jsonl(run.release / "synthetic.jsonl", ctx.rows(final))
            atomic_write_json(run.release / "privacy.json", statement)
            counts = ctx.llm_counts()
            summary = {
                "method": cfg.method,
                "samples": len(final),
                "epsilon": statement["epsilon"],
                "delta": statement["delta"],
                **counts,
                # calls paid by earlier attempts (a killed process cannot report its own;
                # its finished calls sit in the request cache and are not paid again)
                "llm_calls_earlier_attempts": int(meta.get("llm_calls_paid", 0)),
                "attempts": int(meta.get("attempts", 1)),
            }
            atomic_write_json(run.release / "summary.json", summary)
            if private:
                _ledger(cfg).settle(meta["run_id"], statement["epsilon"], statement["delta"])
            run.end_attempt("finished", llm_calls=counts.get("llm_calls", 0),
                            wall_seconds=round(time.time() - _started(meta), 1))
            run.log(f"finished: {len(final)} samples")
            return run.root
        except Exception as err:
            if not working:
                run.discard(keep_root=had_folder)
                raise
            _end_failed(run, ctx, "failed", type(err).__name__, None)
            raise
        except KeyboardInterrupt as err:
            _end_failed(run, ctx, "interrupted", type(err).__name__, interruption_reason(err))
            raise
        finally:
            if ctx is not None:
                ctx.close_compute()
            if session is not None:  # release the store's lock now, not when the traceback dies
                session.close()


def _end_failed(run: RunDir, ctx: RunContext | None, status: str, error: str,
                reason: str | None) -> None:
    paid = ctx.llm_counts().get("llm_calls", 0) if ctx is not None else 0
    run.end_attempt(status, error=error, reason=reason, llm_calls=paid)


def _started(meta: dict[str, Any]) -> float:
    try:
        return calendar.timegm(time.strptime(meta["started"], "%Y-%m-%dT%H:%M:%SZ"))
    except (KeyError, ValueError):
        return time.time()


def _discovery_columns(cfg: RunConfig, dataset: Any, private: bool) -> list[str]:
    """Label columns whose domain is to be found privately (``data.label_domain:
    discover``); refused for a run without an (epsilon, delta) budget to pay for it."""
    from .label_domain import undeclared_columns

    cols = undeclared_columns(dataset)
    if cols and not private:
        raise ConfigError(
            f"data.label_domain 'discover' needs a run with a finite (epsilon, delta) budget "
            f"(method {cfg.method!r}, epsilon {cfg.privacy.epsilon}): declare "
            f"data.label_values for {', '.join(cols)}")
    return cols


def _discover_domain(cfg: RunConfig, dataset: Any, session: Any) -> tuple[Any, Any]:
    """Release the noisy value counts of the undeclared label columns through the session
    (replayed on resume) and keep the records of the values that passed (docs/methods.md §0)."""
    from .label_domain import apply_discovery

    sigma_d = cfg.data.label_domain_sigma
    return apply_discovery(
        dataset, cfg.data,
        lambda key, counts: session.noisy_counts(key, counts, sigma_d, name="label_domain"),
        user_level=cfg.privacy.unit == "user")


def _session(cfg: RunConfig, run: RunDir, dp_target: bool, delta_used: float = 0.0) -> Any:
    """The run's privacy session; ``delta_used`` is delta spent outside the accountant (the
    label-domain discovery threshold), taken off the accountant's target delta."""
    from .privacy import Accountant, PrivacySession, make_noise_source

    target = None
    if dp_target and not math.isinf(cfg.privacy.epsilon):
        target = (cfg.privacy.epsilon, cfg.privacy.delta - delta_used)
    return PrivacySession(run.private / "releases", Accountant(cfg.privacy.accountant),
                          make_noise_source(cfg.privacy.noise, _noise_seed(cfg, run)),
                          target=target)


def _noise_seed(cfg: RunConfig, run: RunDir) -> int | None:
    """Seeded noise (research mode): the run's private seed (private/seed); secure: None."""
    from .privacy import run_seed

    return run_seed(run.private, cfg.privacy.seed) if cfg.privacy.noise == "seeded" else None


def _statement(cfg: RunConfig, ctx: RunContext, method: Any,
               domain: Any = None) -> dict[str, Any]:
    """release/privacy.json (schema in the README). ``domain``: a privately discovered label
    domain, whose threshold delta is part of the stated delta."""
    from .label_domain import declared_statement

    extra_delta = domain.extra_delta if domain is not None else 0.0
    target = (cfg.privacy.epsilon, cfg.privacy.delta - extra_delta)
    if not method.private_votes:
        statement = {"epsilon": 0.0, "delta": 0.0, "target_epsilon": cfg.privacy.epsilon,
                     "target_delta": cfg.privacy.delta, "unit": cfg.privacy.unit,
                     "accountant": cfg.privacy.accountant, "noise": cfg.privacy.noise,
                     "mechanisms": [],
                     "note": "no private record was read: label values are public input"}
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
        if extra_delta:  # (eps, delta_acc) from the accountant plus the discovery threshold
            statement["delta"] = statement["delta"] + extra_delta
            statement["target_delta"] = cfg.privacy.delta
    statement["label_domain"] = (domain.statement() if domain is not None
                                 else declared_statement(list(cfg.data.labels)))
    from .privacy import noise_note

    statement.setdefault("noise_note", noise_note(statement["noise"]))
    statement["method"] = cfg.method
    statement["noise_multiplier"] = ctx.sigma
    statement.update(method.statement_extras(ctx))
    return statement
