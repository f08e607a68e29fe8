"""`dpsynth generate` as a user meets it: clear one-line errors, exit code 2, no traceback,
and nothing private in the message."""

from __future__ import annotations

import pandas as pd
from typer.testing import CliRunner

from dpsynth.cli import app


def _flat(text: str) -> str:
    """The console wraps long lines; compare on single spaces."""
    return " ".join(text.split())


SECRET = "Ottoline Brackwater called about her lumbar results and the invoice number"


def test_bad_data_and_config_give_clear_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    data = tmp_path / "private.csv"
    pd.DataFrame({"text": [SECRET * 3, "   "], "dept": ["a", None]}).to_csv(data, index=False)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"method: aug_pe\ndata: {{path: {data}, labels: [dept], max_chars: 60, "
                   "label_values: {dept: [a]}}\n")
    runner = CliRunner()
    result = runner.invoke(app, ["generate", str(cfg), "--output", str(tmp_path / "r1")])
    assert result.exit_code == 2
    out = _flat(result.output)
    assert "private.csv" in out and "row 2" in out and "Traceback" not in out
    assert "row 1" in out  # the over-long text is reported
    assert SECRET not in out  # at most a short excerpt of private text

    cfg.write_text("method: aug_pe\nprivacy: {epsilon: -1}\n")
    result = runner.invoke(app, ["generate", str(cfg), "--output", str(tmp_path / "r2")])
    assert result.exit_code == 2 and "privacy.epsilon" in _flat(result.output)

    missing = runner.invoke(app, ["generate", str(tmp_path / "nope.yaml"), "-o",
                                  str(tmp_path / "r3")])
    assert missing.exit_code == 2 and "config file not found" in _flat(missing.output)

    nothing = runner.invoke(app, ["generate", str(cfg), "-o", str(tmp_path / "r4"),
                                  "--resume"])
    assert nothing.exit_code == 2 and "nothing to resume" in _flat(nothing.output)
