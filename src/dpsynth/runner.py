"""The one runner: the life of every run, for every registered method (docs/architecture.md,
"The run lifecycle").

open or resume the folder -> load and validate the data -> the method's privacy plan (no model
loaded yet) -> reserve the ledger (or record a run without an (epsilon, delta) guarantee) ->
open the privacy session -> the method's work -> its own privacy statement -> summary.json ->
settle the ledger -> status finished. A refusal before any work removes a new folder again; a
stop after work began keeps it for ``--resume``, with a true status in run.json (failed with
the error's class, or interrupted by SIGINT / SIGTERM).
"""

from __future__ import annotations

import calendar
import copy
import json
import math
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .config import ConfigError, RunConfig, apply_overrides, dump_config, load_config, parse_config
from .errors import DpsynthError
from .files import SHARED_MODE, atomic_write_json, atomic_write_text
from .hooks import RunHooks
from .methods import get_method
from .methods.base import Job, Method, Outcome, PrivacyPlan
from .neighbours import check_limit, mechanism_config, over_file
from .on_shards import engine_of
from .preflight import check_output_writable, check_run
from .privacy.ledger import DEFAULT_TOTAL_EPSILON, OtherFolderError, check_folder
from .privacy.session import StoreOpener
from .progress import warn as operator_warning
from .resume import (
    changed_fields,
    config_digest,
    diff_locked,
    locked_fields,
    refuse_changes,
    resumable,
)
from .run_dataset import load_run_data
from .run_folder import RunDir, interruption_reason, stop_signals, this_process

if TYPE_CHECKING:
    from .identity import DataIdentity
    from .privacy import BudgetLedger, PrivacySession


def _load(config: RunConfig | str | Path, overrides: dict[str, Any] | None) -> RunConfig:
    if isinstance(config, RunConfig):
        if overrides:
            raw = config.model_dump(mode="json")
            apply_overrides(raw, overrides)
            return parse_config(raw)
        return config
    return load_config(config, overrides)


def open_run(config: RunConfig | str | Path | None, output_dir: str | Path, *, resume: bool,
             overrides: dict[str, Any] | None = None, method: str | None = None,
             check: Callable[[RunConfig], Any] | None = None,
             on_checkpoint: Callable[[str], None] | None = None
             ) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """Create a run folder, or reopen one to resume it (with its stored config).

    ``check(config)`` runs before anything is written, so a bad config leaves no folder behind;
    ``method`` names the run in run.json (default: config.method). A resume refuses a stored
    config whose locked fields were edited, a ``config`` that differs from the stored one and
    a ``--set`` of a locked field (:mod:`dpsynth.resume`); ``on_checkpoint``: the run folder's
    checkpoint hook (:class:`dpsynth.hooks.RunHooks`). Returns (run, config, meta)."""
    run = RunDir(output_dir, on_checkpoint)
    if resume:
        return _reopen(run, config, overrides)
    assert config is not None
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
    check_output_writable(run.root)
    raw = cfg.model_dump(mode="json")
    run.create(dump_config(cfg), method or cfg.method)
    lock = {"config_digest": config_digest(raw), "locked": locked_fields(raw)}
    atomic_write_json(run.private / "run-lock.json", lock, mode=0o600)
    return run, cfg, run.update_meta(config_digest=lock["config_digest"])


def _reopen(run: RunDir, config: RunConfig | str | Path | None,
            overrides: dict[str, Any] | None) -> tuple[RunDir, RunConfig, dict[str, Any]]:
    """Reopen a run to resume it: the same run, or a ConfigError naming what changed."""
    if not run.exists():
        raise ConfigError(f"{run.root}: nothing to resume (no run.json there)")
    from .privacy.store import held_by_another_process

    if held_by_another_process(run.private / "releases"):
        raise ConfigError(f"{run.root}: this run is still running in another process; "
                          "wait for it to end (or stop it) before --resume")
    meta = run.meta()
    if isinstance(config, str | Path) and Path(config).is_dir() and \
            Path(config).resolve() == run.root.resolve():
        config = None  # the run folder itself: its own config
    stored_raw = yaml.safe_load(run.config_path.read_text()) or {}
    stored = parse_config(stored_raw, str(run.config_path)).model_dump(mode="json")
    lock_path = run.private / "run-lock.json"
    expected = meta.get("config_digest")
    if lock_path.is_file():
        lock = json.loads(lock_path.read_text(encoding="utf-8"))
        if expected is not None and lock.get("config_digest") != expected:
            raise ConfigError(f"{run.root}: the run's lock (private/run-lock.json) does not match "
                              "run.json: it was edited; this run cannot be resumed")
        refuse_changes(diff_locked(lock["locked"], locked_fields(stored)),
                       f"{run.config_path} (edited since the run started)")
    elif expected is not None and config_digest(stored) != expected:
        refuse_changes(["(locked fields; private/run-lock.json is missing)"],
                       f"{run.config_path} (edited since the run started)")
    sets = dict(overrides or {})
    if sets and meta.get("status") == "finished":
        raise ConfigError(f"{run.root}: this run already finished, so --set "
                          f"{', '.join(sorted(sets))} changes nothing (release/ is complete); "
                          "to run with other settings, start a new run with another --output")
    if config is not None or sets:
        if config is not None:
            given = _load(config, sets or None).model_dump(mode="json")
            what = f"{_name(config)}{' with --set' if sets else ''} (the CONFIG argument)"
        else:
            given = copy.deepcopy(stored)
            apply_overrides(given, sets)
            given, what = parse_config(given).model_dump(mode="json"), "--set"
        refuse_changes(changed_fields(stored, given), what)
    resumable_sets = {k: v for k, v in sets.items() if resumable(k)}
    if resumable_sets:  # where the servers are, timeouts, concurrency: kept for later resumes
        apply_overrides(stored, resumable_sets)
        atomic_write_text(run.config_path, dump_config(parse_config(stored)))
    cfg = parse_config(stored, str(run.config_path))
    if meta.get("status") != "finished":
        meta = run.update_meta(status="running", attempts=meta.get("attempts", 1) + 1,
                               process=this_process())
    return run, cfg, meta


def _name(config: RunConfig | str | Path) -> str:
    return "the given config" if isinstance(config, RunConfig) else str(config)


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


def data_identity(config: RunConfig, dataset: Any, book: BudgetLedger) -> DataIdentity:
    """What the ledger charges the run to (:mod:`dpsynth.identity`): the source name
    (``data.source``, else the file's resolved path, ``demo`` for the built-in corpus), the
    file's content digest, the records' fingerprint and the texts' keyed sketch."""
    from .identity import DataIdentity

    name = config.data.source or ("demo" if config.data.path == "demo"
                                  else str(Path(config.data.path).resolve()))
    key = book.sketch_key()
    return DataIdentity(name=name, content=dataset.content_digest(),
                        records=dataset.fingerprint(), sketch=dataset.text_sketch(key),
                        normalised=dataset.text_sketch(key, normalised=True))


def _account(config: RunConfig, run: RunDir, meta: dict[str, Any], plan: PrivacyPlan,
             identity: DataIdentity, resume: bool, say: Callable[[str], None]) -> str:
    """Charge the run to its data sources once: reserve the plan's (epsilon, delta), or
    record a run without one; returns the keyed records fingerprint. A resumed run whose
    ledger entries exist must be the same run on the same records, in the run folder its
    entries are bound to, and not yet settled (else a refusal); one whose first attempt died
    before its entry was written reserves now (nothing was released), bound to this folder."""
    book = ledger(config)
    records = book.dataset_id(identity.records)
    digest = meta.get("config_digest") or config_digest(config.model_dump(mode="json"))
    stored = meta.get("dataset_fingerprint")
    if resume and stored is not None and stored != records:
        raise ConfigError(_CHANGED_DATA.format(run=run.root))
    entries = book.run_entries(meta["run_id"]) if resume else []
    folder = run.folder_identity()
    if entries:
        check_folder(entries, meta["run_id"], folder)
        if any(e.get("status") == "settled" for e in entries):
            raise OtherFolderError(_SETTLED.format(run=run.root))
        for e in entries:
            if e.get("records") not in (None, records):
                raise ConfigError(_CHANGED_DATA.format(run=run.root))
            if e.get("config_digest") not in (None, digest):
                raise ConfigError(f"{run.root}: the run's config differs from the one its budget "
                                  "was reserved with; this run cannot be resumed")
            if e.get("guarantee") == "dp" and (
                    abs(e["reserved_epsilon"] - config.privacy.epsilon) > 1e-12
                    or abs(e["reserved_delta"] - config.privacy.delta) > 1e-18):
                raise ConfigError(f"{run.root}: privacy.epsilon/delta differ from the run's "
                                  "reservation; this run cannot be resumed")
        return records
    run.update_meta(dataset_fingerprint=records, sigma=plan.sigma, **plan.meta)
    p = config.privacy
    details = {"config_digest": digest, "unit": p.unit, "method": meta.get("method")}
    if plan.guarantee == "dp":
        charge = book.reserve(identity, meta["run_id"], p.epsilon, p.delta, p.total_epsilon,
                              p.total_delta, noise_seed=noise_seed(config, run), details=details,
                              folder=folder, default_epsilon=default_cap(config))
    elif plan.guarantee in ("none", "secret-protection"):
        charge = book.record_run(identity, meta["run_id"], plan.guarantee,
                                 details={**details, **plan.ledger},
                                 noise_seed=noise_seed(config, run),
                                 total_epsilon=p.total_epsilon, total_delta=p.total_delta,
                                 folder=folder)
    elif plan.guarantee == "public":  # reads no private record: nothing to charge
        return records
    else:  # fail closed: a guarantee the ledger does not know is never run uncharged
        raise ConfigError(f"method {meta.get('method')!r} plans the guarantee "
                          f"{plan.guarantee!r}, which the budget ledger cannot charge")
    run.update_meta(sources=[m.source for m in charge.sources])
    say(f"budget: {charge.describe()}")
    sources = [m.source for m in charge.sources]
    default = default_cap(config) if plan.guarantee == "dp" else None
    for line in spending_lines(book, sources, "with this run", default):
        say(line)
    return records


def default_cap(config: RunConfig) -> float | None:
    """The epsilon cap a source without one of its own gets for this run: the ledger's
    default, unless the run says ``privacy.no_cap`` (``--no-cap``)."""
    return None if config.privacy.no_cap else DEFAULT_TOTAL_EPSILON


def spending_lines(book: BudgetLedger, sources: Sequence[str], when: str,
                   default: float | None = None) -> list[str]:
    """What each source has spent against its cap (``when``: "with this run" counts the
    reservation, "after this run" the settled spend), a warning past half the cap, and how
    to set a cap where there is none (``default``: the cap the run applied to a source with
    none of its own): no budget is spent without the operator seeing it."""
    lines = []
    for sid in sources:
        src = book.source(sid)
        name = src["names"][0] if src["names"] else sid
        eps, cap = src["epsilon"], src["total_epsilon"]
        set_one = f"`dpsynth budget set --source {shlex.quote(name)} --total-epsilon N`"
        if cap is None and default is None:
            lines.append(f"budget: {name!r} has spent epsilon {eps:.4g} {when}, and has no cap "
                         f"(--no-cap, or no epsilon guarantee): {set_one} sets one")
            continue
        kind = "its cap" if cap is not None else "the default cap"
        cap = cap if cap is not None else default
        assert cap is not None
        lines.append(f"budget: {name!r} has spent epsilon {eps:.4g} of {kind} {cap:.4g} "
                     f"{when} ({cap - eps:.4g} left)")
        if kind == "the default cap":
            lines.append(f"budget: {name!r} has no cap of its own; {set_one} sets one")
        if eps > cap / 2:
            lines.append(f"warning: {name!r} is past half of {kind} {when}")
    return lines


def research_only(config: RunConfig, method: Method) -> str | None:
    """Why the run is refused as a research setting outside research mode (None: it is not):
    ``privacy.epsilon: inf`` on a method that reads private records releases exact values,
    so it runs only with ``privacy.noise: seeded`` (the research mode, said wherever the
    guarantee is stated), and never on a capped source (the ledger refuses that)."""
    if math.isinf(config.privacy.epsilon) and config.privacy.noise != "seeded" \
            and method.private_passes != ():
        return ("privacy.epsilon: inf releases exact, noise-free values from the private "
                "records: it is a research setting and runs only in research mode "
                "(privacy.noise: seeded), never on a data source with a budget cap; give a "
                "finite privacy.epsilon")
    return None


_SETTLED = ("{run}: this run's budget is already settled in the ledger: the run released "
            "its results (in the folder that finished it), and this folder does not say "
            "finished (a copy or a backup taken before the end); one reservation gives one "
            "release, so it cannot be resumed")
_CHANGED_DATA = ("{run}: the private data differs from the records this run started on (its "
                 "fingerprint changed): a resumed run must read the same records; restore the "
                 "file, or start a new run")


@dataclass(frozen=True)
class RunOptions:
    """How one call of :func:`run_method` runs (none of it changes what the run computes or
    releases): ``progress`` shows the progress display; ``echo`` receives operator messages;
    ``generators`` / ``embedder`` replace the configured models with ready objects (one
    generator per configured entry; e.g. the deterministic fakes of the fast tests);
    ``hooks``: what the caller plugs into the run (:class:`dpsynth.hooks.RunHooks`)."""

    progress: bool = True
    echo: Callable[[str], None] | None = None
    generators: Sequence[Any] | None = None
    embedder: Any | None = None
    hooks: RunHooks = field(default_factory=RunHooks)


def run_method(config: RunConfig | str | Path, output_dir: str | Path, *,
               resume: bool = False, overrides: dict[str, Any] | None = None,
               method: Method | None = None, releases: str | None = None,
               options: RunOptions | None = None) -> Path:
    """Run a registered method end to end, or resume it; returns the run folder.

    ``method``: the method object (default: the registry's entry for ``config.method``);
    ``releases`` ("text" or "knowledge_base") refuses a method that releases something else,
    before anything is written; ``options``: how this call runs (:class:`RunOptions`)."""
    opts = options or RunOptions()
    echo, generators, embedder, hooks = opts.echo, opts.generators, opts.embedder, opts.hooks
    had_folder = Path(output_dir).is_dir()
    chosen: dict[str, Method] = {}
    run, cfg, meta = open_run(config, output_dir, resume=resume, overrides=overrides,
                              method=method.name if method is not None else None,
                              check=_checker(method, releases, chosen),
                              on_checkpoint=hooks.on_checkpoint)
    say = _sayer(run, echo)
    m = chosen.get("m") or (method if method is not None
                            else get_method(cfg.method, releases))
    if resume and meta.get("status") == "finished":
        say("this run already finished: nothing to resume (release/ is complete)")
        return run.root
    working = resume  # a resumed run has already worked: its folder always stays
    job: Job | None = None
    session: PrivacySession | None = None
    dataset: Any = None
    with stop_signals():
        try:
            # what can fail without the private data fails before the budget is touched
            check_run(cfg, generators=generators, embedder=embedder, warn=operator_warning)
            # compute.engine ray: the shards read the file, this process never opens it
            # (unless the method reads per-record fields here: ``sharded_data`` False)
            dataset = load_run_data(cfg, run, sharded=m.sharded_data,
                                    shard_actor=hooks.shard_actor)
            mcfg, plan = _plan(cfg, run, m, dataset)
            identity = data_identity(cfg, dataset, ledger(cfg))
            # keyed (HMAC) fingerprint: the raw digest never leaves this process
            fingerprint = _account(cfg, run, meta, plan, identity, resume, say)
            working = True  # from here on a reservation exists: the folder is kept
            session = open_session(cfg, run, plan)
            job = _job(opts, mcfg, run, meta, dataset, session, plan, fingerprint, resume)
            outcome = m.execute(job)
            statement = _write_statement(cfg, run, m, job, outcome)
            if plan.guarantee == "dp":
                _settle(cfg, meta, statement, say)
            _finish(run, meta, job, outcome)
            return run.root
        except Exception as err:
            if not working:
                run.discard(keep_root=had_folder)
                raise
            _failed(run, job, err)
            raise
        except KeyboardInterrupt as err:
            _end(run, job, "interrupted", type(err).__name__, interruption_reason(err))
            raise
        finally:
            _close(job, session, dataset)


def _checker(method: Method | None, releases: str | None,
             chosen: dict[str, Method]) -> Callable[[RunConfig], None]:
    """:func:`open_run`'s check of a new run: the method (kept in ``chosen["m"]``) and its
    section, ``data.limit`` and research settings; an unknown method or a bad section fails
    there, before anything is written."""
    def check(cfg: RunConfig) -> None:
        chosen["m"] = method if method is not None else get_method(cfg.method, releases)
        chosen["m"].check(cfg)
        if (why := check_limit(cfg, "dp") or research_only(cfg, chosen["m"])) is not None:
            raise ConfigError(why)
    return check


def _sayer(run: RunDir, echo: Callable[[str], None] | None) -> Callable[[str], None]:
    """An operator message: to the run's log.txt and the caller's ``echo``."""
    def say(message: str) -> None:
        run.log(message)
        if echo is not None:
            echo(message)
    return say


def _plan(cfg: RunConfig, run: RunDir, m: Method, dataset: Any) -> tuple[RunConfig, PrivacyPlan]:
    """(the config the mechanisms run with, the method's privacy plan): with data.limit the
    method plans and runs for the subset's share of the budget (dpsynth.neighbours); the ledger
    and the statement speak of the file. Nothing is charged here."""
    mcfg = mechanism_config(cfg)
    plan = m.plan(mcfg, dataset, run)
    if (why := check_limit(cfg, plan.guarantee)) is not None:
        raise ConfigError(why)
    return mcfg, plan


def _job(opts: RunOptions, mcfg: RunConfig, run: RunDir, meta: dict[str, Any], dataset: Any,
         session: PrivacySession, plan: PrivacyPlan, fingerprint: str, resume: bool) -> Job:
    """The job handed to the method: the run, its data, session and plan, and what the caller
    plugged in (``opts``)."""
    return Job(mcfg, run, meta, dataset, session, plan, fingerprint=fingerprint,
               resume=resume, progress=opts.progress, generators=opts.generators,
               embedder=opts.embedder, echo=opts.echo, hooks=opts.hooks,
               open_store=StoreOpener(run.private, plan.accountant, mcfg.privacy.noise,
                                      noise_seed(mcfg, run)))


def _write_statement(cfg: RunConfig, run: RunDir, m: Method, job: Job,
                     outcome: Outcome) -> dict[str, Any]:
    """Write release/privacy.json (the method's statement, over the file) and summary.json
    (a None epsilon / delta of the summary taken from the statement); returns the statement."""
    statement = over_file(m.statement(job, outcome), cfg)
    atomic_write_json(run.release / "privacy.json", statement, mode=SHARED_MODE)
    summary = {"method": m.name, **outcome.summary}
    for key in ("epsilon", "delta"):
        if key in summary and summary[key] is None:
            summary[key] = statement.get(key)
    atomic_write_json(run.release / "summary.json", summary, mode=SHARED_MODE)
    return statement


def _settle(cfg: RunConfig, meta: dict[str, Any], statement: dict[str, Any],
            say: Callable[[str], None]) -> None:
    """Settle the run's reservation at the stated (epsilon, delta) and tell the operator what
    each charged source has spent."""
    book = ledger(cfg)
    book.settle(meta["run_id"], float(statement["epsilon"]), float(statement["delta"]))
    charged = sorted({e["source"] for e in book.run_entries(meta["run_id"])})
    for line in spending_lines(book, charged, "after this run", default_cap(cfg)):
        say(line)


def _failed(run: RunDir, job: Job | None, err: Exception) -> None:
    """End the attempt as failed (the folder stays for --resume); a dpsynth error without a
    hint of its own says how to continue the run."""
    _end(run, job, "failed", type(err).__name__, None)
    if isinstance(err, DpsynthError) and err.hint is None:
        err.hint = (f"nothing computed is lost: fix the cause, then continue with "
                    f"--resume (run folder {run.root})")


def _finish(run: RunDir, meta: dict[str, Any], job: Job, outcome: Outcome) -> None:
    """Mark the run finished (its paid LLM calls and wall time) and log it."""
    run.end_attempt("finished", llm_calls=job.paid_calls(),
                    wall_seconds=round(time.time() - _started(meta), 1))
    run.log(f"finished: {outcome.message}" if outcome.message else "finished")


def _close(job: Job | None, session: PrivacySession | None, dataset: Any) -> None:
    """After the run, however it ended: the job's cleanups, the privacy session (its store's
    lock is released now, not when the traceback dies) and the shards."""
    if job is not None:
        job.cleanup.close()
    if session is not None:
        session.close()
    _close_engine(dataset)


def _close_engine(dataset: Any) -> None:
    """Stop the shards of a sharded dataset (closing twice is harmless)."""
    engine = engine_of(dataset)
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
