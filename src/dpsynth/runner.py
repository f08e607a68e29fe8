"""The one runner: the life of every run, for every registered method (docs/architecture.md,
"Run lifecycle").

open or resume the folder -> load and validate the data -> the method's privacy plan (no model
loaded yet) -> reserve the ledger (or record a run without an (epsilon, delta) guarantee) ->
open the privacy session -> the method's work -> its own privacy statement -> summary.json ->
settle the ledger -> status finished. A refusal before any work removes a new folder again; a
stop after work began keeps it for ``--resume``, with a true status in run.json (failed with
the error's class, or interrupted by SIGINT / SIGTERM).
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .config import ConfigError, RunConfig, apply_overrides, dump_config, load_config, parse_config
from .errors import DpsynthError
from .io import SHARED_MODE, atomic_write_json
from .methods import get_method
from .methods.base import Job, Method, PrivacyPlan
from .preflight import check_run
from .progress import warn as operator_warning
from .run_data import load_run_data
from .runs import RunDir, interruption_reason, stop_signals

if TYPE_CHECKING:
    from .privacy import BudgetLedger, PrivacySession


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
             check: Callable[[RunConfig], Any] | None = None
             ) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """Create a run folder, or reopen one to resume it (with its stored config).

    ``check(config)`` runs before anything is written, so a bad config leaves no folder behind;
    ``method`` names the run in run.json (default: config.method). Returns (run, config, meta).
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


def ledger(config: RunConfig) -> BudgetLedger:
    """The budget ledger of ``privacy.ledger`` (None: $DPSYNTH_LEDGER or ~/.dpsynth/)."""
    from .privacy import BudgetLedger

    return BudgetLedger(config.privacy.ledger)


def noise_seed(config: RunConfig, run: RunDir) -> int | None:
    """Seeded noise (research mode): the run's private seed (private/seed); secure: None."""
    from .privacy import run_seed

    return run_seed(run.private, config.privacy.seed) if config.privacy.noise == "seeded" \
        else None


def open_session(config: RunConfig, run: RunDir, plan: PrivacyPlan,
                 folder: str = "releases", target: bool = True) -> PrivacySession:
    """A privacy session over the run's store ``private/<folder>`` with the plan's accountant
    and (when ``target``) its (epsilon, delta) cap; noise as ``privacy.noise`` says."""
    from .privacy import Accountant, PrivacySession, make_noise_source

    return PrivacySession(run.private / folder, Accountant(plan.accountant),
                          make_noise_source(config.privacy.noise, noise_seed(config, run)),
                          target=plan.target if target else None)


def _account(config: RunConfig, run: RunDir, meta: dict[str, Any], plan: PrivacyPlan,
             fingerprint: str, resume: bool) -> None:
    """Reserve the plan's (epsilon, delta), or record a run without one, once per run: a
    resumed run whose first attempt was killed before its ledger entry was written reserves
    now (nothing was released before the reservation)."""
    book = ledger(config)
    if resume and any(e.get("run_id") == meta["run_id"] for e in book.entries()):
        return
    run.update_meta(dataset_fingerprint=fingerprint, sigma=plan.sigma, **plan.meta)
    p = config.privacy
    if plan.guarantee == "dp":
        book.reserve(fingerprint, meta["run_id"], p.epsilon, p.delta, p.total_epsilon,
                     p.total_delta, noise_seed=noise_seed(config, run))
    elif plan.guarantee in ("none", "secret-protection"):
        book.record_run(fingerprint, meta["run_id"], plan.guarantee, **plan.ledger)


def run_method(config: RunConfig | str | Path, output_dir: str | Path, *,
               resume: bool = False, overrides: dict[str, Any] | None = None,
               method: Method | None = None, progress: bool = True,
               generators: Sequence[Any] | None = None, embedder: Any | None = None,
               echo: Callable[[str], None] | None = None,
               options: dict[str, Any] | None = None, releases: str | None = None) -> Path:
    """Run a registered method end to end, or resume it; returns the run folder.

    ``method``: the method object (default: the registry's entry for ``config.method``).
    ``generators`` / ``embedder`` replace the configured models with ready objects (e.g. the
    deterministic fakes of the fast tests); ``echo`` receives operator messages; ``options``
    are method-specific call options (e.g. test hooks); ``releases`` ("text" or
    "knowledge_base") refuses a method that releases something else, before anything is
    written."""
    had_folder = Path(output_dir).is_dir()
    chosen: dict[str, Method] = {}

    def check(cfg: RunConfig) -> None:  # an unknown method or bad section: nothing written
        chosen["m"] = method if method is not None else get_method(cfg.method, releases)
        chosen["m"].check(cfg)

    run, cfg, meta = open_run(config, output_dir, resume=resume, overrides=overrides,
                              method=method.name if method is not None else None, check=check)
    m = chosen.get("m") or (method if method is not None
                            else get_method(cfg.method, releases))
    working = resume  # a resumed run has already worked: its folder always stays
    job: Job | None = None
    session: PrivacySession | None = None
    dataset: Any = None
    with stop_signals():
        try:
            # compute.engine ray: the shards read the file, this process never opens it
            # (unless the method reads per-record fields here: ``sharded_data`` False)
            dataset = load_run_data(cfg, run, sharded=m.sharded_data)
            plan = m.plan(cfg, dataset, run)
            # keyed (HMAC) fingerprint: the raw digest never leaves this process
            fingerprint = ledger(cfg).dataset_id(dataset.fingerprint())
            check_run(cfg, generators=generators, embedder=embedder, warn=operator_warning)
            _account(cfg, run, meta, plan, fingerprint, resume)
            working = True  # from here on a reservation exists: the folder is kept
            session = open_session(cfg, run, plan)
            job = Job(cfg, run, meta, dataset, session, plan, fingerprint=fingerprint,
                      resume=resume, progress=progress,
                      generators=generators, embedder=embedder, echo=echo,
                      options=dict(options or {}))
            outcome = m.execute(job)
            statement = m.statement(job, outcome)
            atomic_write_json(run.release / "privacy.json", statement, mode=SHARED_MODE)
            summary = {"method": m.name, **outcome.summary}
            for key in ("epsilon", "delta"):
                if key in summary and summary[key] is None:
                    summary[key] = statement.get(key)
            atomic_write_json(run.release / "summary.json", summary, mode=SHARED_MODE)
            if plan.guarantee == "dp":
                ledger(cfg).settle(meta["run_id"], float(statement["epsilon"]),
                                   float(statement["delta"]))
            run.end_attempt("finished", llm_calls=job.paid_calls(),
                            wall_seconds=round(time.time() - _started(meta), 1))
            run.log(f"finished: {outcome.message}" if outcome.message else "finished")
            return run.root
        except Exception as err:
            if not working:
                run.discard(keep_root=had_folder)
                raise
            _end(run, job, "failed", type(err).__name__, None)
            if isinstance(err, DpsynthError) and err.hint is None:
                err.hint = (f"nothing computed is lost: fix the cause, then continue with "
                            f"--resume (run folder {run.root})")
            raise
        except KeyboardInterrupt as err:
            _end(run, job, "interrupted", type(err).__name__, interruption_reason(err))
            raise
        finally:
            if job is not None:
                job.cleanup.close()
            if session is not None:  # release the store's lock now, not when the traceback dies
                session.close()
            _close_engine(dataset)


def _close_engine(dataset: Any) -> None:
    """Stop the shards of a sharded dataset (closing twice is harmless)."""
    engine = getattr(dataset, "compute", None)
    if engine is not None:
        engine.close()


def _end(run: RunDir, job: Job | None, status: str, error: str, reason: str | None) -> None:
    paid = job.paid_calls() if job is not None else 0
    run.end_attempt(status, error=error, reason=reason, llm_calls=paid)


def _started(meta: dict[str, Any]) -> float:
    try:
        return calendar.timegm(time.strptime(meta["started"], "%Y-%m-%dT%H:%M:%SZ"))
    except (KeyError, ValueError):
        return time.time()
