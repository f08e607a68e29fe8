"""Every command the docs show runs (issue 46: "every docs page's commands run in a test").

:func:`documented_commands` reads each ``dpsynth ...`` line of an indented or fenced code block
of README.md and docs/*.md. The walkthrough test runs them through the real CLI, page by page
in the order a reader meets them (docs/own-data.md first: its `run.yaml` is the config of the
other pages' `run.yaml` and `my-run.yaml`), in a scratch folder that holds what the commands
name: the repository's examples/, the demo corpus as `data.csv`, a customer file written here
as `messages.csv`, real test splits. Only the models are fakes (tests/fakes.py), passed in at
the seams the API gives (``run_generation``, ``build_kb``, ``evaluate_run``, the answerer and
the estimate's loaders), and the two servers are started with their socket replaced by an
in-process client (binding a socket is tests/test_server_auth.py's). A command that needs what
this test cannot give (a Ray cluster) is named in :data:`ELSEWHERE` with the test that runs
it; a new documented command that is neither run here nor named there fails the test.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import dpsynth.api
import dpsynth.estimate
import dpsynth.llm
import dpsynth.llm.server
import dpsynth.rag.answer
import dpsynth.rag.service
from dpsynth.cli import app
from dpsynth.demo_corpus import write_demo_corpus
from dpsynth.eval import suite
from fakes import FakeEmbedder, FakeGenerator

ROOT = Path(__file__).resolve().parents[1]
#: the pages in the order the walkthrough runs them
PAGES = ("docs/own-data.md", "docs/choosing-epsilon.md", "README.md")
#: what a placeholder of the docs stands for in the scratch folder
PLACEHOLDERS = {"RUN_DIR": "runs/demo", "RUN_DIR1": "runs/demo",
                "RUN_DIR2": "runs/messages-eps4"}
#: documented commands this test does not run, and the test that runs them
ELSEWHERE = {
    "dpsynth generate run.yaml --output runs/r1 --set compute.engine=ray "
    "--set compute.address=HEAD_IP:6379 --set compute.shards=16":
        "tests/test_compute_ray.py::test_ray_release_is_byte_identical_to_local "
        "(a Ray cluster; this test has none)",
    "dpsynth bench voting --private 100000 --synthetic 10000 --json":
        "tests/test_secpe_bench.py::test_bench_voting_json_small (the same command at toy "
        "sizes; the documented size is a one-minute benchmark)",
}
DEPARTMENTS = ("billing", "delivery", "returns", "technical")


@dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str

    @property
    def argv(self) -> list[str]:
        words = shlex.split(self.text, comments=True)
        return [PLACEHOLDERS.get(w, w) for w in words[1:]]


def documented_commands(pages: tuple[str, ...] = PAGES, root: Path = ROOT) -> list[Command]:
    """Each ``dpsynth`` command line of a code block (4-space indented or fenced; a trailing
    backslash joins the next line), in page order."""
    found = []
    for page in pages:
        lines = (root / page).read_text(encoding="utf-8").splitlines()
        fenced, i = False, 0
        while i < len(lines):
            line = lines[i]
            if line.strip().startswith("```"):
                fenced = not fenced
            elif re.match(r"( {4,}|\t)dpsynth ", line) or (fenced and re.match(r"\s*dpsynth ",
                                                                                 line)):
                start, text = i, line.strip()
                while text.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    text = text[:-1].rstrip() + " " + lines[i].strip()
                found.append(Command(page, start + 1, text))
            i += 1
    return found


def all_pages() -> tuple[str, ...]:
    """README.md and every page of docs/."""
    return ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))


def _customers(path: Path, n: int, offset: int = 0) -> None:
    """A public, made-up customer file in own-data.md's shape (message, department)."""
    things = ("parcel", "invoice", "refund", "password", "jacket", "charger", "order", "app")
    rows = ["message,department"]
    for i in range(offset, offset + n):
        dept = DEPARTMENTS[i % len(DEPARTMENTS)]
        rows.append(f"Hello, my {things[i % len(things)]} number {i} needs help from {dept}. "
                    f"Could you look at it today?,{dept}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


def _own_data_config() -> dict[str, Any]:
    """The `run.yaml` of docs/own-data.md, as written there."""
    text = (ROOT / "docs" / "own-data.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "# run.yaml" in b)
    return yaml.safe_load(block)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reader's folder: examples/, data.csv and the test splits, the customer file and
    own-data.md's run.yaml; models as fakes at the seams; a ledger and a cache of its own."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    # small files: the eval's PII audit and embeddings scale with the private and test rows
    # (what the pages show does not depend on their size)
    demo = write_demo_corpus(tmp_path / "demo-files", n=60, test_n=30)
    shutil.copy(demo["private"], tmp_path / "data.csv")
    shutil.copy(demo["test"], tmp_path / "real_test.csv")
    _customers(tmp_path / "messages.csv", 60)
    _customers(tmp_path / "messages-test.csv", 30, offset=1000)
    cfg = _own_data_config()
    for name in ("run.yaml", "my-run.yaml"):
        (tmp_path / name).write_text(yaml.safe_dump(cfg), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger" / "ledger.json"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _fake_models(monkeypatch)
    return tmp_path


def _fake_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every seam a documented command loads a model through, given fakes."""
    gen, emb = FakeGenerator("fake-g0"), FakeEmbedder()
    monkeypatch.setattr(dpsynth.api, "run_generation", functools.partial(
        dpsynth.api.run_generation, generators=[gen], embedder=emb))
    monkeypatch.setattr(dpsynth.api, "build_kb", functools.partial(
        dpsynth.api.build_kb, generator=gen, embedder=emb))
    monkeypatch.setattr(suite, "evaluate_run", functools.partial(suite.evaluate_run,
                                                                 embedder=emb))
    monkeypatch.setattr(dpsynth.rag.answer, "open_answerer", functools.partial(
        dpsynth.rag.answer.open_answerer, generator=gen, embedder=emb))
    monkeypatch.setattr(dpsynth.rag.service, "kb_app", functools.partial(
        dpsynth.rag.service.kb_app, generator=gen, embedder=emb))
    monkeypatch.setattr(dpsynth.estimate, "load_generator", lambda spec, **kw: gen)
    monkeypatch.setattr(dpsynth.estimate, "_load_embedder", lambda ecfg: emb)
    monkeypatch.setattr(dpsynth.llm, "load_generator", lambda spec, **kw: gen)


def _served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The servers' last step (uvicorn on a socket) replaced by one request each through an
    in-process client to the app the command built; what they answered is kept."""
    seen: dict[str, Any] = {}

    def llm_serve(gen: Any, **kw: Any) -> None:
        app_ = dpsynth.llm.server.create_app(gen, model_id=kw.get("model_id"))
        with TestClient(app_) as client:
            seen["llm"] = client.get("/v1/models").json()

    def rag_serve(kb: Any, host: str, port: int, *, app: Any, api_key: Any) -> None:
        with TestClient(app) as client:
            seen["rag"] = client.post("/ask", json={"question": "Which disease causes a rash?"}
                                      ).json()
            seen["rag_port"] = port

    monkeypatch.setattr(dpsynth.llm.server, "serve", llm_serve)
    monkeypatch.setattr(dpsynth.rag.service, "serve", rag_serve)
    return seen


def test_the_parser_reads_indented_fenced_and_continued_commands(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text(
        "Text about dpsynth plan, not a command.\n\n    dpsynth plan a.yaml   # note\n\n"
        "```sh\ndpsynth generate a.yaml \\\n    --output runs/x\n```\n\n"
        "```yaml\nmethod: aug_pe\n```\n", encoding="utf-8")
    got = documented_commands(("p.md",), tmp_path)
    assert [(c.line, c.argv) for c in got] == [
        (3, ["plan", "a.yaml"]), (6, ["generate", "a.yaml", "--output", "runs/x"])]


def test_every_documented_command_is_run_here_or_named_elsewhere() -> None:
    """A page this walkthrough does not read holds no command, and each ELSEWHERE entry is
    still documented (a stale one fails)."""
    others = tuple(p for p in all_pages() if p not in PAGES)
    assert documented_commands(others) == [], "add the page to PAGES"
    texts = {" ".join(c.text.split("#")[0].split()) for c in documented_commands()}
    assert set(ELSEWHERE) <= texts
    for where in ELSEWHERE.values():  # the test named runs: its file defines it
        path, name = where.split()[0].split("::")
        assert f"def {name}(" in (ROOT / path).read_text(encoding="utf-8"), where


def test_every_documented_command_runs(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    served = _served(monkeypatch)
    ran = []
    for cmd in documented_commands():
        if " ".join(cmd.text.split("#")[0].split()) in ELSEWHERE:
            continue
        res = CliRunner().invoke(app, cmd.argv, env={"COLUMNS": "200"})
        where = f"{cmd.page}:{cmd.line} `{cmd.text}`"
        assert res.exit_code == 0, f"{where} exited {res.exit_code}:\n{res.output[-3000:]}"
        assert "Traceback" not in res.output, where
        ran.append(cmd.argv[0])
    assert {"generate", "eval", "report", "rag", "budget", "plan", "audit"} <= set(ran)
    assert (scratch / "runs" / "messages-eps4" / "release" / "synthetic.jsonl").is_file()
    assert (scratch / "runs" / "messages-eps4" / "eval" / "report.html").is_file()
    assert (scratch / "runs" / "kb" / "release" / "kb.jsonl").is_file()
    assert served["llm"]["data"] and "answer" in served["rag"]
    assert json.loads((scratch / "runs" / "canary" / "audit_canary.json").read_text())
