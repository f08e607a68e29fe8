"""CLI command: ``dpsynth plan CONFIG``: the configured method's plan, before a run. A PE
method's: what the noise will do to the votes (:mod:`dpsynth.planning`; it reads the private
data only to count its records and label classes, or takes ``--records`` without the data),
and the run's estimated wall time per stage on this machine (:mod:`dpsynth.estimate`: a short
calibration of the configured models, cached in the user's cache folder; ``--no-calibrate``
uses only a cached one); DP-SynRAG's: its calibrated clip and every planned release (from the
config alone), and the build's estimated wall time (its document count from the data, or
``--records``); any other method's: its privacy plan object, field by field (dp_finetune's
with each step's noise-to-signal ratio and its estimated wall time). It spends no budget and
writes nothing but the calibration cache."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import progress
from ..errors import ConfigError
from ..estimate import (
    Estimate,
    estimate_finetune,
    estimate_rag,
    estimate_run,
    rag_work,
)
from ..work import TuningMethod


def plan(
    config: Annotated[Path, typer.Argument(help="run configuration (YAML)")],
    records: Annotated[int | None, typer.Option(
        "--records", help="the number of private records (with --no-data)")] = None,
    no_data: Annotated[bool, typer.Option(
        "--no-data", help="plan from --records without reading the data")] = False,
    labels: Annotated[int | None, typer.Option(
        "--labels", help="label classes, for a domain the run discovers")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override KEY=VALUE")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan as JSON")] = False,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate/--no-calibrate", help="time the configured models on this machine for "
        "the wall-time estimate (a few seconds, cached per model and CPU); --no-calibrate: "
        "only a cached calibration")] = True,
) -> None:
    """Show every planned release's noise and whether it will swamp the votes, and the run's
    estimated wall time per stage on this machine (spends no budget; for the operator, who
    may see the record count)."""
    from ..config import load_config
    from ..methods import canonical_name, get_method
    from ..methods.pe import PEMethod
    from ..planning import WARN_VERDICTS
    from .generate import parse_sets

    cfg = load_config(config, parse_sets(set_ or []))
    name = canonical_name(cfg.method)
    if name == "synrag":  # its vocabulary file is relative to the config's folder
        from ..methods.synrag.method import SynRAG

        method = SynRAG(config)
    else:
        method = get_method(name)
    method.check(cfg)  # as the run checks it, before anything is written
    if name == "synrag":  # DP-SynRAG's own plan, not a PE one
        _plan_synrag(cfg, as_json, _documents(cfg, records, no_data), calibrate)
        return
    if not isinstance(method, PEMethod):  # no plan printer of its own: what its plan holds
        _plan_held(cfg, method, as_json, no_data or records is not None, calibrate)
        return
    result, detection_s = _plan_pe(cfg, method, records, no_data, labels)
    if as_json:
        with progress.session(enabled=False):
            estimate = _estimate(cfg, method, result, calibrate, detection_s)
        typer.echo(json.dumps({**result.to_dict(), "estimate": estimate.to_dict()}))
        return
    swamped = result.verdict in WARN_VERDICTS
    for line in result.lines()[:-1] if swamped else result.lines():
        typer.echo(line)
    if swamped:
        typer.echo(f"warning: {result.message}", err=True)
    with progress.session():  # a spinner while the models are timed
        estimate = _estimate(cfg, method, result, calibrate, detection_s)
    for line in estimate.lines():
        typer.echo(line)


def _plan_pe(cfg: Any, method: Any, records: int | None, no_data: bool,
             labels: int | None) -> tuple[Any, float | None]:
    """A PE method's :class:`~dpsynth.planning.RunPlan`, made by the run's own planner
    (:func:`~dpsynth.methods.pe.plan_pe`) from the facts of the data (``plan_inputs``, as the
    run reads them) or from the stated ``records`` (and ``labels``) with ``no_data``; and
    the seconds reading those facts took (SecPE's secret detection and calibration, which
    its run repeats; None without the data). With data.limit the plan is the subset's
    (dpsynth.neighbours), as the run's."""
    from ..methods.pe import plan_pe
    from ..neighbours import mechanism_config
    from ..planning import PlanInputs, declared_labels

    mcfg = mechanism_config(cfg)
    seconds = None
    if no_data or records is not None:
        if records is None or records < 1:
            raise ConfigError("--no-data needs --records N (N >= 1), the number of records")
        n_labels = labels or declared_labels(cfg)
        if n_labels is None:
            raise ConfigError("the label domain is discovered from the data: give --labels N "
                              "(the label classes you expect) with --no-data")
        if cfg.method == "secpe":
            raise ConfigError("SecPE's noise follows from the secrets found in the data: run "
                              "`dpsynth plan` with the data (without --no-data)")
        inputs = PlanInputs(records, n_labels)
    else:
        inputs, seconds = _from_data(mcfg, method, labels)
    return plan_pe(method, mcfg, inputs).votes, seconds


def _estimate(cfg: Any, method: Any, result: Any, calibrate: bool,
              detection_s: float | None = None) -> Estimate:
    """The run's wall time per stage on this machine (:mod:`dpsynth.estimate`) from the work
    the method counts from its plan (``planned_work``); each generator writes up to its
    ``max_new_tokens``, else the texts' planned length in tokens (64 where there is none, as
    the run)."""
    from ..evolution.lengths import tokens_for

    length = tokens_for(result.max_words) if result.max_words else 64
    work, extra = method.planned_work(cfg, result, detection_s)
    return estimate_run(cfg, work, [g.max_new_tokens or length for g in cfg.generators],
                        calibrate=calibrate, extra=extra,
                        preference=method.trains_on_votes(cfg))


def _documents(cfg: Any, records: int | None, no_data: bool) -> int | None:
    """DP-SynRAG's document count for its estimate: the stated ``records``, none with
    ``no_data``, else the data's (its users at ``privacy.unit: user``)."""
    from ..run_dataset import load_run_data
    from ..run_folder import RunDir

    if records is not None and records < 1:  # checked as a PE plan checks it
        raise ConfigError("--records N needs N >= 1, the number of records")
    if records is not None or no_data:
        return records
    with tempfile.TemporaryDirectory(prefix="dpsynth-plan-") as tmp:
        run = RunDir(tmp)
        run.private.mkdir(mode=0o700)
        return _units(cfg, load_run_data(cfg, run))


def _units(cfg: Any, dataset: Any) -> int:
    """The privacy units of ``dataset``: its records, or its users at ``privacy.unit: user``."""
    if cfg.privacy.unit == "user":
        return len({str(u) for u in dataset.users})
    return len(dataset)


def _synrag_estimate(cfg: Any, scfg: Any, documents: int | None, calibrate: bool,
                     show: bool = True) -> Estimate:
    """DP-SynRAG's build time per stage on this machine (:mod:`dpsynth.estimate`), from its
    config and ``documents``: a token step decodes the cluster's k documents in passes of
    ``stepper_rows`` (default k) and the public row when the public model runs (a public
    candidate set with top tokens, or the shortcut); the self-filter answers in 3 tokens
    (:func:`dpsynth.methods.synrag.filtering.self_filter`)."""
    work = rag_work(documents, clusters=scfg.clusters, tokens=scfg.tokens,
                    target_size=scfg.target_size, rows=scfg.stepper_rows or scfg.target_size,
                    public_row=scfg.public_shortcut or (scfg.support == "public"
                                                        and scfg.support_top > 0),
                    keyword_tokens=scfg.keyword_max_new_tokens
                    if scfg.keyword_extractor == "llm" else 0,
                    max_doc_tokens=scfg.max_doc_tokens, filter_tokens=3 if scfg.self_filter else 0)
    with progress.session(enabled=show):  # a spinner while the models are timed
        return estimate_rag(cfg, work, calibrate=calibrate)


def _plan_synrag(cfg: Any, as_json: bool, documents: int | None = None,
                 calibrate: bool = True) -> None:
    """DP-SynRAG's plan (docs/methods.md §4): the clip c that meets the target and every
    planned release with its noise, from the config alone (a build's releases do not depend
    on the record count), accounted as the build will account them (zCDP); then the build's
    estimated wall time on this machine (``documents``: their count, None: unknown)."""
    from ..methods.synrag.accounting import planned_events, resolve_clip
    from ..methods.synrag.method import SynRAG
    from ..neighbours import mechanism_config
    from ..privacy import Accountant

    mcfg = mechanism_config(cfg)
    scfg = SynRAG.settings(mcfg)
    eps, delta = mcfg.privacy.epsilon, mcfg.privacy.delta
    clip = resolve_clip(scfg, eps, delta)
    acc = Accountant("zcdp")
    acc.extend(planned_events(scfg, clip))
    rows = acc.summary()
    result = {"method": "synrag", "target_epsilon": cfg.privacy.epsilon,
              "target_delta": cfg.privacy.delta, "clip": clip,
              "planned_epsilon": acc.epsilon(delta), "accountant": "zcdp",
              "releases": [{k: v for k, v in r.items() if k != "shifts"} for r in rows]}
    if as_json:
        estimate = _synrag_estimate(cfg, scfg, documents, calibrate, show=False)
        typer.echo(json.dumps({**result, "estimate": estimate.to_dict()}))
        return
    typer.echo(f"DP-SynRAG build plan: ({cfg.privacy.epsilon:.4g}, {cfg.privacy.delta:.2g})-DP "
               f"per {cfg.privacy.unit}, accounted with zCDP (docs/methods.md §4)")
    typer.echo(f"  clip c = {clip:.4g} per document and private token (temperature "
               f"{scfg.temperature:.4g}): the larger, the more a document's tokens count")
    for r in rows:
        noise = (f"noise sigma {r['sigma']:.4g} for sensitivity {r['sensitivity']:.4g}"
                 if "sigma" in r else f"epsilon {r['epsilon']:.4g}" if "epsilon" in r
                 else f"rho {r['rho']:.3g} each")
        typer.echo(f"  {r['name']}: {r['count']} release(s), {noise}")
    typer.echo(f"  planned epsilon {acc.epsilon(delta):.4g} at delta {delta:.2g}; every later "
               "query of the knowledge base is free")
    for line in _synrag_estimate(cfg, scfg, documents, calibrate).lines():
        typer.echo(line)


def run_noise_multiplier(config: Path, labels: int | None) -> float:
    """The noise multiplier the run of ``config`` draws, calibrated as the run calibrates it
    (``dpsynth privacy calibrate --config`` and ``dpsynth plan`` show this one number): a PE
    method with an (epsilon, delta) guarantee and a declared label domain (or ``labels``)."""
    from ..config import load_config
    from ..methods import get_method
    from ..methods.pe import PEMethod, calibrate_sigma
    from ..neighbours import mechanism_config
    from ..planning import declared_labels

    cfg = load_config(config)
    method = get_method(cfg.method)
    method.check(cfg)
    if not isinstance(method, PEMethod) or method.guarantee(cfg) != "dp":
        raise ConfigError(f"method {method.name!r} does not calibrate one noise multiplier "
                          "from the config: run `dpsynth plan` for its plan")
    n_labels = labels or declared_labels(cfg)
    if n_labels is None:
        raise ConfigError("the label domain is discovered from the data: give --labels N")
    mcfg = mechanism_config(cfg)
    return calibrate_sigma(mcfg, method.release_plan(mcfg, n_labels))


def _plan_held(cfg: Any, method: Any, as_json: bool, no_data: bool,
               calibrate: bool = True) -> None:
    """The plan of a method without a plan printer of its own: its
    :class:`~dpsynth.methods.base.PrivacyPlan` as its run makes it (from the data; spends
    nothing), field by field; then its estimated wall time (:func:`_held_estimate`)."""
    from ..neighbours import mechanism_config
    from ..run_dataset import load_run_data
    from ..run_folder import RunDir

    if no_data:
        raise ConfigError(f"method {method.name!r} plans from the data: run `dpsynth plan` with "
                          "the data (without --no-data or --records)")
    with tempfile.TemporaryDirectory(prefix="dpsynth-plan-") as tmp:
        run = RunDir(tmp)
        run.private.mkdir(mode=0o700)
        dataset = load_run_data(cfg, run)
        held = method.plan(mechanism_config(cfg), dataset, run)
        units = _units(cfg, dataset)
    result = {"method": method.name, "target_epsilon": cfg.privacy.epsilon,
              "target_delta": cfg.privacy.delta,
              **{f.name: getattr(held, f.name) for f in fields(held)}}
    ratios, warning = (method.plan_noisy_steps(cfg, held) if isinstance(method, TuningMethod)
                       else (None, None))
    if ratios is not None:
        result["noise_to_signal"] = ratios["noise_to_signal"]
        result["noise_over_run"] = ratios["noise_over_run"]
    with progress.session(enabled=not as_json):  # a spinner while the models are timed
        estimate = _held_estimate(cfg, method, held, units, calibrate)
    if as_json:
        extra = {} if estimate is None else {"estimate": estimate.to_dict()}
        typer.echo(json.dumps({**result, **extra}, default=str))
        return
    typer.echo(f"{method.name}: the plan its run makes, field by field (no plan printer for "
               f"this method yet), at ({cfg.privacy.epsilon:.4g}, {cfg.privacy.delta:.2g})")
    for key, value in result.items():
        if key not in ("method", "target_epsilon", "target_delta", "noise_to_signal",
                       "noise_over_run"):
            typer.echo(f"  {key}: {value}")
    if ratios is not None:
        typer.echo(f"  each step's gradient noise: {ratios['noise_to_signal']:.3g}x the largest "
                   "mean gradient the batch can give (noise multiplier x sqrt(adapter "
                   f"coordinates) / batch); {ratios['noise_over_run']:.3g}x over the run's "
                   f"{ratios['steps']:.0f} steps (/ "
                   f"sqrt(steps); above {ratios['warn_above']:g} the training loss may not "
                   "move, and a falling "
                   "loss is not a better release: compare it with a zero-shot set)")
    if warning is not None:
        typer.echo(f"warning: {warning}", err=True)
    lines = (estimate.lines() if estimate is not None else
             [f"estimated wall time: not estimated (no estimate for method {method.name!r})"])
    for line in lines:
        typer.echo(line)


def _held_estimate(cfg: Any, method: Any, held: Any, units: int,
                   calibrate: bool) -> Estimate | None:
    """The wall time per stage (:mod:`dpsynth.estimate`) of a method that counts its own
    training (:class:`~dpsynth.work.TuningMethod`, dp_finetune) from its plan and the data's
    ``units``; None for another method (no count is known)."""
    if not isinstance(method, TuningMethod):
        return None
    return estimate_finetune(cfg, method.tune_work(cfg, held, units), calibrate=calibrate,
                             method=method)


def _from_data(cfg: Any, method: Any, labels: int | None) -> tuple[Any, float]:
    """The :class:`~dpsynth.planning.PlanInputs` the run reads from the configured data
    (``labels`` in place of the label classes when given: required for a domain the run
    discovers) and the seconds reading them took."""
    from ..run_dataset import load_run_data
    from ..run_folder import RunDir

    with tempfile.TemporaryDirectory(prefix="dpsynth-plan-") as tmp:
        run = RunDir(tmp)
        run.private.mkdir(mode=0o700)
        dataset = load_run_data(cfg, run)
        started = time.perf_counter()
        inputs = method.plan_inputs(cfg, dataset, run)
        seconds = time.perf_counter() - started
    if labels:
        return replace(inputs, labels=labels, discover=()), seconds
    if inputs.labels is None:
        raise ConfigError("the label domain is discovered from the data: give --labels N "
                          "(the label classes you expect)")
    return inputs, seconds


def register(root: typer.Typer) -> None:
    """Add this module's command to the root app."""
    root.command("plan")(plan)
