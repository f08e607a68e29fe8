"""``data.limit`` is charged as a two-record change (issue 43, finding 6; dpsynth.neighbours).

Under add/remove neighbours, removing one of the first N rows brings row N + 1 in: the subsets
of neighbouring files differ by two records. The run calibrates its mechanisms to the subset
target whose group privacy for two records is the user's (epsilon, delta), and states and
charges the guarantee over the file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

from dpsynth.data import load_dataset
from dpsynth.neighbours import group_guarantee, subset_target
from test_budget_bypass import cli, env, generate, sources  # noqa: F401  (the fixture)


@pytest.mark.parametrize(("eps", "delta"), [(4.0, 1e-5), (1.0, 1e-6), (0.3, 1e-4)])
def test_the_subset_target_is_the_inverse_of_group_privacy(eps: float, delta: float) -> None:
    sub = subset_target(eps, delta)
    assert sub[0] == pytest.approx(eps / 2)
    assert sub[1] == pytest.approx(delta / (1 + math.exp(eps / 2)))  # closed form
    back = group_guarantee(*sub)
    assert back == pytest.approx((eps, delta), rel=1e-12)


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_group_privacy_is_sound_for_the_gaussian_against_dp_accounting(sigma: float) -> None:
    """The Gaussian mechanism over files two records apart is the Gaussian with twice the
    sensitivity (noise multiplier sigma / 2); dp_accounting's exact epsilon for it at the
    group delta may not exceed the group bound (else group_guarantee would overstate)."""
    delta = 1e-5
    one = pld_privacy_accountant.PLDAccountant()
    one.compose(dp_event.GaussianDpEvent(sigma))
    eps1 = one.get_epsilon(delta)
    eps2, delta2 = group_guarantee(eps1, delta)
    two = pld_privacy_accountant.PLDAccountant()
    two.compose(dp_event.GaussianDpEvent(sigma / 2))
    assert two.get_epsilon(delta2) <= eps2 + 1e-6


def test_first_n_rows_of_neighbouring_files_differ_by_two_records(tmp_path: Path) -> None:
    """Why the group is 2: the claim the accounting rests on, on the real loader."""
    rows = [f"record number {i} about something" for i in range(12)]
    full, minus = tmp_path / "full.csv", tmp_path / "minus.csv"
    full.write_text("text\n" + "\n".join(rows) + "\n")
    minus.write_text("text\n" + "\n".join(rows[:3] + rows[4:]) + "\n")  # row 3 removed
    a = set(load_dataset(full, "text", limit=8).texts)
    b = set(load_dataset(minus, "text", limit=8).texts)
    assert len(a ^ b) == 2  # one out (row 3), one in (row 8)


def test_a_limited_run_is_charged_and_stated_over_the_file(env: dict[str, Any]) -> None:  # noqa: F811
    res = generate(env, "limited", "data.limit=40")
    assert res.exit_code == 0, res.output
    privacy = json.loads((env["tmp"] / "limited" / "release" / "privacy.json").read_text())
    assert privacy["subset"]["limit"] == 40
    assert privacy["subset"]["epsilon"] <= 1.0 + 1e-9  # calibrated to epsilon / 2 = 1
    assert privacy["epsilon"] == pytest.approx(2 * privacy["subset"]["epsilon"])
    assert privacy["delta"] == pytest.approx(
        (1 + math.exp(privacy["subset"]["epsilon"])) * privacy["subset"]["delta"])
    assert privacy["epsilon"] <= 2.0 + 1e-9 and privacy["delta"] <= 1e-5 * (1 + 1e-9)
    spent = sources(env)[0]
    assert spent["epsilon"] == pytest.approx(privacy["epsilon"])  # the file's budget


def test_a_limit_with_the_user_unit_is_refused_before_any_charge(env: dict[str, Any]) -> None:  # noqa: F811
    res = generate(env, "byuser", "data.limit=40", "privacy.unit=user",
                   "data.user=customer_id")
    assert res.exit_code != 0
    assert "data.limit" in res.output and "user" in res.output
    assert not (env["tmp"] / "byuser").exists()
    assert env["ledger"].exists() is False or sources(env) == [] or all(
        not s["runs"] for s in sources(env))


def test_plan_shows_the_noise_a_limited_run_draws(env: dict[str, Any]) -> None:  # noqa: F811
    """`dpsynth plan` calibrates as the run does: with data.limit, for the subset's share."""
    def sigma(*sets: str) -> float:
        args = ["plan", env["cfg"], "--json"]
        for s in sets:
            args += ["--set", s]
        res = cli(*args)
        assert res.exit_code == 0, res.output
        return float(json.loads(res.stdout)["noise_multiplier"])

    whole, limited = sigma(), sigma("data.limit=40")
    assert limited > whole * 1.5  # epsilon / 2 over the subset: clearly more noise
    res = generate(env, "limited", "data.limit=40")
    assert res.exit_code == 0, res.output
    meta = json.loads((env["tmp"] / "limited" / "run.json").read_text())
    assert meta["sigma"] == pytest.approx(limited, rel=1e-6)
