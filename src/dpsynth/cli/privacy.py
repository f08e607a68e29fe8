"""CLI commands: ``dpsynth privacy calibrate`` and ``dpsynth privacy epsilon``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import ConfigError

privacy_app = typer.Typer(
    name="privacy",
    help="Noise calibration and privacy accounting for Gaussian releases.",
    no_args_is_help=True,
)

_ACCOUNTANTS = ("pld", "rdp", "zcdp", "gdp")

# the options both commands take
Delta = Annotated[float, typer.Option("--delta", help="Target delta, in (0, 1).")]
Steps = Annotated[int, typer.Option("--steps", help="Number of Gaussian releases T.")]
Sensitivity = Annotated[float, typer.Option("--sensitivity", help="L2 sensitivity.")]
AccountantKind = Annotated[str, typer.Option("--accountant", help="pld|rdp|zcdp|gdp")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON only.")]


def _check_accountant(kind: str) -> None:
    if kind not in _ACCOUNTANTS:
        raise ConfigError(f"--accountant must be one of {', '.join(_ACCOUNTANTS)}, got {kind!r}")


def _answer(as_json: bool, key: str, value: float, line: str) -> None:
    """``{key: value}`` as JSON, or the line for a person."""
    typer.echo(json.dumps({key: value}) if as_json else line)


@privacy_app.command("calibrate")
def calibrate(
    epsilon: Annotated[float | None, typer.Option("--epsilon", help="Target epsilon (> 0).")]
    = None,
    delta: Annotated[float | None, typer.Option("--delta", help="Target delta, in (0, 1).")]
    = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Number of Gaussian releases T.")]
    = None,
    sensitivity: Sensitivity = 1.0, accountant: AccountantKind = "pld",
    config: Annotated[Path | None, typer.Option(
        "--config", help="A run config: the noise multiplier its run draws, the one `dpsynth "
        "plan` shows (one calibration for both)")] = None,
    labels: Annotated[int | None, typer.Option(
        "--labels", help="with --config: label classes, for a domain the run discovers")] = None,
    as_json: AsJson = False,
) -> None:
    """Smallest Gaussian sigma so that STEPS releases meet (EPSILON, DELTA); with --config,
    the noise multiplier of that run's planned releases (its discrete Gaussians, label counts
    included), as `dpsynth plan` shows it."""
    from dpsynth.privacy import calibrate_steps

    if config is not None:
        from .plan import run_noise_multiplier

        sigma = run_noise_multiplier(config, labels)
        _answer(as_json, "sigma", sigma, f"noise multiplier {sigma:.4g} (the run of {config}, "
                                         "as `dpsynth plan` shows it)")
        return
    if epsilon is None or delta is None or steps is None:
        raise ConfigError("give --epsilon, --delta and --steps (or --config FILE for a run's "
                          "own noise multiplier)")
    _check_accountant(accountant)
    sigma = calibrate_steps(epsilon, delta, steps, sensitivity=sensitivity, kind=accountant)
    _answer(as_json, "sigma", sigma,
            f"sigma = {sigma:.4g}  ({steps} continuous Gaussian releases, sensitivity "
            f"{sensitivity:g}, epsilon {epsilon:g}, delta {delta:g}, accountant {accountant}; "
            "a run's own noise, discrete and with its label counts: --config FILE)")


@privacy_app.command("epsilon")
def epsilon_cmd(
    sigma: Annotated[float, typer.Option("--sigma", help="Gaussian noise std (> 0).")],
    delta: Delta, steps: Steps, sensitivity: Sensitivity = 1.0,
    accountant: AccountantKind = "pld", as_json: AsJson = False,
) -> None:
    """epsilon at DELTA of STEPS Gaussian releases with noise SIGMA."""
    from dpsynth.privacy import steps_epsilon

    _check_accountant(accountant)
    eps = steps_epsilon(sigma, delta, steps, sensitivity=sensitivity, kind=accountant)
    _answer(as_json, "epsilon", eps,
            f"epsilon = {eps:.4f} at delta {delta:g}  ({steps} Gaussian releases, sigma "
            f"{sigma:g}, sensitivity {sensitivity:g}, accountant {accountant})")


def register(root: typer.Typer) -> None:
    """Add the ``privacy`` command group to the root app."""
    root.add_typer(privacy_app, name="privacy")
