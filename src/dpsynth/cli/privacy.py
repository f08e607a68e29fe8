"""CLI commands: ``dpsynth privacy calibrate`` and ``dpsynth privacy epsilon``."""

from __future__ import annotations

import json
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
    epsilon: Annotated[float, typer.Option("--epsilon", help="Target epsilon (> 0).")],
    delta: Delta, steps: Steps, sensitivity: Sensitivity = 1.0,
    accountant: AccountantKind = "pld", as_json: AsJson = False,
) -> None:
    """Smallest Gaussian sigma so that STEPS releases meet (EPSILON, DELTA)."""
    from dpsynth.privacy import calibrate_steps

    _check_accountant(accountant)
    sigma = calibrate_steps(epsilon, delta, steps, sensitivity=sensitivity, kind=accountant)
    _answer(as_json, "sigma", sigma,
            f"sigma = {sigma:.4f}  ({steps} Gaussian releases, sensitivity {sensitivity:g}, "
            f"epsilon {epsilon:g}, delta {delta:g}, accountant {accountant})")


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
