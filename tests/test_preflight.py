"""Preflight: what can fail without the private data fails before the budget is touched (issue
23, 25): a misspelled model, a model directory that is not one, a `backend: openai` server that
is down (named with its URL), an output folder that cannot be written. Each is one clear error,
the ledger holds nothing and no run folder is left."""

from __future__ import annotations

import functools
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.cli import ERROR_EXIT, app
from dpsynth.config import GeneratorConfig
from dpsynth.errors import GenerationError, OutputFolderError
from dpsynth.preflight import (
    Probe,
    check_generator,
    check_output_writable,
    probe_endpoint,
)
from test_release_check import pe_config, private_rows, write_csv


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    sock.close()


def test_a_refused_connection_is_named_with_its_url() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    gen = GeneratorConfig(backend="openai", model="smollm2", base_url=url)
    with pytest.raises(GenerationError) as err:
        check_generator(0, gen)
    assert url in str(err.value) and "connection refused" in str(err.value)
    assert "generators.0" in str(err.value)


def test_a_server_that_never_answers_times_out(silent_server: str) -> None:
    gen = GeneratorConfig(backend="openai", model="smollm2", base_url=silent_server)
    quick = functools.partial(probe_endpoint, connect_s=0.5, answer_s=0.5)
    with pytest.raises(GenerationError, match="no answer within 0.5 s"):
        check_generator(0, gen, probe=quick)


def test_one_endpoint_down_among_several_is_a_warning_and_a_refused_key_an_error() -> None:
    urls = ["http://a/v1", "http://b/v1"]
    answers = {"http://a/v1": Probe("http://a/v1", "connection refused"),
               "http://b/v1": Probe("http://b/v1", None, 200, ("smollm2",))}
    heard: list[str] = []
    gen = GeneratorConfig(backend="openai", model="smollm2", base_urls=urls)
    check_generator(0, gen, warn=heard.append, probe=lambda url, key: answers[url])
    assert len(heard) == 1 and "http://a/v1" in heard[0]
    # a server that lists other models: said, not refused (servers may take aliases)
    heard.clear()
    answers["http://b/v1"] = Probe("http://b/v1", None, 200, ("llama-3-8b",))
    check_generator(0, gen, warn=heard.append, probe=lambda url, key: answers[url])
    assert any("lists 'llama-3-8b', not 'smollm2'" in h for h in heard)
    answers["http://b/v1"] = Probe("http://b/v1", None, 401)
    keyed = GeneratorConfig(backend="openai", model="smollm2", base_urls=urls,
                            api_key_env="DPSYNTH_TEST_UNSET_KEY")
    with pytest.raises(GenerationError, match=r"HTTP 401.*DPSYNTH_TEST_UNSET_KEY is not set"):
        check_generator(0, keyed, probe=lambda url, key: answers[url])


def test_generate_against_a_down_server_stops_within_seconds_and_spends_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = tmp_path / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(ledger))
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    data = write_csv(tmp_path / "d.csv", private_rows(12))
    cfg = pe_config("aug_pe", data)
    cfg["generators"] = [{"backend": "openai", "model": "smollm2", "base_url": url}]
    cfg["embedder"] = {"model": "minilm"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    result = CliRunner().invoke(app, ["generate", str(path), "-o", str(tmp_path / "r")])
    assert result.exit_code == ERROR_EXIT, result.output
    assert result.stderr.startswith("error: generators.0: no OpenAI-compatible server")
    assert url in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()  # refused before any work: no folder
    assert not ledger.exists() or '"entries": []' in ledger.read_text().replace("\n", "")


def test_output_under_a_file_or_unwritable_is_one_error(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("mine", encoding="utf-8")
    with pytest.raises(OutputFolderError, match="is a file, not a folder"):
        check_output_writable(blocker / "run")
    check_output_writable(tmp_path / "new" / "deeper")  # creatable: fine
    assert not (tmp_path / "new").exists()  # the check writes nothing that stays

    def denied(*_args: object, **_kw: object) -> None:
        raise PermissionError(13, "Permission denied")

    # a read-only folder (as root, chmod does not stop writes: the refusal is simulated)
    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(OutputFolderError, match="cannot write there.*Permission denied"):
        check_output_writable(tmp_path / "ro" / "run")
    data = write_csv(tmp_path / "d.csv", private_rows(12))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(pe_config("aug_pe", data)), encoding="utf-8")
    result = CliRunner().invoke(app, ["generate", str(path), "-o", str(tmp_path / "ro")])
    assert result.exit_code == ERROR_EXIT and "Traceback" not in result.output
    assert [ln for ln in result.stderr.splitlines() if ln.strip()] == [
        f"error: {tmp_path / 'ro'}: cannot write there (it would be created in {tmp_path}): "
        "Permission denied; choose a folder you can write, e.g. --output runs/NAME"]


def test_an_os_permission_error_anywhere_in_a_command_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsynth.cli.data as data_cli

    def denied(*_args: object, **_kw: object) -> None:
        raise PermissionError(13, "Permission denied", str(tmp_path / "demo"))

    monkeypatch.setattr(data_cli, "write_demo_corpus", denied, raising=False)
    import dpsynth.demo_corpus as demo

    monkeypatch.setattr(demo, "write_demo_corpus", denied)
    result = CliRunner().invoke(app, ["data", "demo", "--out", str(tmp_path / "demo")])
    assert result.exit_code == ERROR_EXIT, result.output
    assert result.stderr.startswith(f"error: {tmp_path / 'demo'}: permission denied")
    assert "Traceback" not in result.output


def _refused_before_the_budget(tmp_path: Path, *argv: str) -> str:
    import json
    import os

    ledger = Path(os.environ["DPSYNTH_LEDGER"])
    data = write_csv(tmp_path / "d.csv", private_rows(20))
    cfg = pe_config("aug_pe", data, **{"embedder.model": "minilm",
                                       "generators": [{"model": "smollm2"}]})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["generate", str(path), "-o", str(out), "--quiet", *argv])
    assert res.exit_code == ERROR_EXIT, res.output
    assert "Traceback" not in res.output
    assert not out.exists()  # nothing computed, nothing to keep
    assert not ledger.exists() or json.loads(ledger.read_text())["entries"] == []
    return " ".join(res.output.split())


def test_a_misspelled_model_fails_before_the_ledger(tmp_path: Path) -> None:
    """The old code failed with a traceback after the label counts were released."""
    msg = _refused_before_the_budget(tmp_path, "--set", "generators.0.model=smolm2")
    assert "generators.0.model 'smolm2': not a known model" in msg and "smollm2" in msg
    msg = _refused_before_the_budget(tmp_path, "--set", "embedder.model=minilmm")
    assert "embedder.model 'minilmm'" in msg
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    msg = _refused_before_the_budget(tmp_path, "--set", f"generators.0.model={empty}")
    assert "config.json" in msg


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
def test_an_output_folder_that_cannot_be_created_is_one_line(tmp_path: Path) -> None:
    """Even for root: /proc takes no new folders (the old code ended in a traceback)."""
    data = write_csv(tmp_path / "d.csv", private_rows(12))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(pe_config("aug_pe", data)))
    res = CliRunner().invoke(app, ["generate", str(path), "-o", "/proc/dpsynth-run"])
    assert res.exit_code == ERROR_EXIT and "Traceback" not in res.output, res.output
    assert "/proc/dpsynth-run" in res.output
