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


def test_help_of_every_command_fits_80_columns_uncut():
    """rich cuts a word longer than its help column with an ellipsis: no help text may."""
    import click
    import typer

    def walk(cmd, path):
        yield path
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])

    runner = CliRunner()
    paths = list(walk(typer.main.get_command(app), []))
    assert len(paths) > 20
    for path in paths:
        res = runner.invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
        assert res.exit_code == 0, (path, res.output)
        for line in res.output.splitlines():
            assert "…" not in line and len(line) <= 80, (path, line)


def test_stop_line_names_the_signal_and_compare_refuses_a_missing_folder(tmp_path):
    from dpsynth.statement import format_epsilon, stop_reason

    assert stop_reason(KeyboardInterrupt()) == "SIGINT"  # never "stopped ()"
    from dpsynth.run_folder import RunInterrupted

    assert stop_reason(RunInterrupted(15)) == "SIGTERM"
    assert [format_epsilon(e) for e in (3.999916556125589, 0.76861, 12.345, float("inf"))] \
        == ["4", "0.769", "12.3", "inf"]
    res = CliRunner().invoke(app, ["compare", str(tmp_path / "absent")])
    assert res.exit_code == 2 and "run folder not found" in res.stderr
    assert "Traceback" not in res.output


def test_resuming_a_finished_run_is_no_new_attempt(tmp_path, monkeypatch):
    import json

    import yaml

    from test_release_check import pe_config, private_rows, run_pe, write_csv

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20)))
    run = run_pe(cfg, tmp_path / "run")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    res = CliRunner().invoke(app, ["generate", str(path), "-o", str(run), "--resume"])
    assert res.exit_code == 0, res.output
    assert "already finished; nothing to resume" in _flat(res.stderr)
    assert json.loads((run / "run.json").read_text())["attempts"] == 1


def test_device_option_is_checked_before_any_model_loads():
    import pytest

    from dpsynth.config import ConfigError, GeneratorConfig, parse_config
    from dpsynth.llm.runtime import resolve_device

    assert resolve_device("cpu") == "cpu"
    torch = pytest.importorskip("torch")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert resolve_device("auto") == ("cuda" if gpus else "cpu")
    if not gpus:
        from dpsynth.preflight import check_devices

        with pytest.raises(ConfigError, match="torch sees no GPU"):
            resolve_device("cuda")
        with pytest.raises(ConfigError, match=r"generators.0.device: .*torch sees no GPU"):
            check_devices(parse_config({"generators": [{"device": "cuda"}]}))
        with pytest.raises(ConfigError, match=r"embedder.device: .*torch sees no GPU"):
            check_devices(parse_config({"embedder": {"device": "cuda:0"}}))
        check_devices(parse_config({"generators": [{"device": "auto"}]}))  # falls back: CPU
    with pytest.raises(ConfigError, match="use cpu, cuda, cuda:N or auto"):
        resolve_device("gpu")
    spec = GeneratorConfig(model="smollm2", device="cuda:1").spec()
    assert spec == {"backend": "local", "model": "smollm2", "engine": "auto",
                    "num_threads": None, "device": "cuda:1"}
    assert GeneratorConfig().spec() == "smollm2"  # the CPU default is unchanged
    with pytest.raises(ConfigError, match="generators.0.device"):
        parse_config({"generators": [{"device": "gpu"}]})
    with pytest.raises(ConfigError, match="engine 'onnx' runs on the CPU"):
        parse_config({"embedder": {"engine": "onnx", "device": "cuda"}})
    with pytest.raises(ConfigError, match="device is for backend 'local'"):
        parse_config({"generators": [{"backend": "openai", "base_url": "http://h/v1",
                                      "device": "cuda"}]})
