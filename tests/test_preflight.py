"""What can fail without the private data fails before the budget is touched (issue 23): a
misspelled model, a model directory that is not one, a server that is down or serves another
model, an output folder that cannot be written. Each is one clear error, the ledger holds
nothing, no noise is drawn and no run folder is left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.cli import app
from dpsynth.errors import GenerationError
from dpsynth.loopback import free_port
from dpsynth.preflight import check_servers
from test_release_check import pe_config, private_rows, write_csv


def _config(tmp_path: Path, **over: object) -> Path:
    data = write_csv(tmp_path / "d.csv", private_rows(20))
    cfg = pe_config("aug_pe", data, **{"embedder.model": "minilm",
                                       "generators": [{"model": "smollm2"}], **over})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _refused_before_the_budget(tmp_path: Path, *argv: str) -> str:
    ledger = Path(os.environ["DPSYNTH_LEDGER"])
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["generate", str(_config(tmp_path)), "-o", str(out),
                                   "--quiet", *argv])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert not out.exists()  # nothing computed, nothing to keep
    assert not ledger.exists() or json.loads(ledger.read_text())["entries"] == []
    return " ".join(res.output.split())


def test_a_misspelled_model_fails_before_the_ledger(tmp_path: Path) -> None:
    msg = _refused_before_the_budget(tmp_path, "--set", "generators.0.model=smolm2")
    assert "generators.0.model 'smolm2': not a known model" in msg and "smollm2" in msg
    msg = _refused_before_the_budget(tmp_path, "--set", "embedder.model=minilmm")
    assert "embedder.model 'minilmm'" in msg
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    msg = _refused_before_the_budget(tmp_path, "--set", f"generators.0.model={empty}")
    assert "config.json" in msg


def test_a_down_server_is_named_with_its_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    msg = _refused_before_the_budget(
        tmp_path, "--set", "generators.0.backend=openai", "--set",
        f"generators.0.base_url={url}")
    assert f"the server at {url} does not answer" in msg


def test_a_server_that_serves_another_model_is_named(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi import FastAPI

    from fault_proxy import running

    api = FastAPI()

    @api.get("/v1/models")
    def models() -> dict:  # type: ignore[type-arg]
        return {"object": "list", "data": [{"id": "llama3", "object": "model"}]}

    with running(api) as url:
        with pytest.raises(GenerationError, match="does not serve model 'smollm2'"):
            check_servers([url], "smollm2", None, "generators.0")
        down = f"http://127.0.0.1:{free_port()}/v1"
        # one replica down of two is left to the fan-out; all down is an error
        assert check_servers([url, down], "llama3", None, "generators.0") == [down]
        with pytest.raises(GenerationError, match="none of its 2 servers answers"):
            check_servers([down, f"http://127.0.0.1:{free_port()}/v1"], "x", None, "g")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_one_line(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        res = CliRunner().invoke(app, ["generate", str(_config(tmp_path)), "-o",
                                       str(ro / "run")])
    finally:
        ro.chmod(0o700)
    assert res.exit_code == 2 and "is not writable" in res.output
    assert "Traceback" not in res.output


def test_the_output_check_names_a_file_in_the_way(tmp_path: Path) -> None:
    from dpsynth.errors import OutputFolderError
    from dpsynth.preflight import check_output_writable

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputFolderError, match="is a file"):
        check_output_writable(blocker / "run")
    check_output_writable(tmp_path / "new" / "deeper")  # creatable: fine


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_folder_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    """Even for root: /proc takes no new folders (the old code ended in a traceback)."""
    res = CliRunner().invoke(app, ["generate", str(_config(tmp_path)), "-o",
                                   "/proc/dpsynth-run"])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert "/proc/dpsynth-run" in res.output and "--output" in res.output
