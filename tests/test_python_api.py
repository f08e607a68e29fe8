"""The Python API (`dpsynth.generate`, `load_run`, `build_rag`, `evaluate`): data as a path, a
DataFrame or a list of dicts, through the same runner as the CLI; results as DataFrames;
errors that name the column and never echo a value."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import dpsynth
from dpsynth.errors import ConfigError, InputError, MissingFileError
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import LABELS, private_rows, write_csv

SMALL = {"synthesis": {"samples": 6, "iterations": 1, "pool_multiplier": 2, "retries": 1},
         "privacy": {"accountant": "rdp"},
         "generators": [{"model": "fake-g0", "max_new_tokens": 16}],
         "embedder": {"model": "fake"},
         "prompts": {"task": "a short patient message", "label_template": "about {label}"}}
SECRET = "Quillon Varkstrom"  # a private value that must never appear in an error


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _fakes() -> dict:
    return {"generators": [FakeGenerator("fake-g0")], "embedder": FakeEmbedder()}


def _generate(data: object, out: Path, **kw: object) -> dpsynth.Result:
    args = {"text": "text", "labels": ["label"], "label_values": {"label": LABELS},
            "epsilon": 3.0, "output": out, "config": SMALL, "progress": False, **_fakes(),
            **kw}
    return dpsynth.generate(data, **args)


def test_import_is_lazy_and_exports_the_api() -> None:
    code = ("import sys, dpsynth; assert 'dpsynth.api' not in sys.modules; "
            "assert 'torch' not in sys.modules; dpsynth.generate; "
            "assert 'dpsynth.api' in sys.modules; print(sorted(dpsynth.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    for name in ("generate", "load_run", "build_rag", "evaluate", "Result"):
        assert name in out


def test_generate_from_a_dataframe_gives_frames_and_the_statement(tmp_path: Path) -> None:
    frame = pd.DataFrame(private_rows(24))
    result = _generate(frame, tmp_path / "run")
    assert result.run_dir == tmp_path / "run"
    syn = result.synthetic
    assert list(syn.columns) == ["text", "label"] and len(syn) == 6
    assert set(syn["label"]) <= set(LABELS)
    assert result.privacy["epsilon"] <= 3.0 + 1e-9 and result.privacy["unit"] == "record"
    assert result.privacy == json.loads((result.run_dir / "release" / "privacy.json")
                                        .read_text())
    assert result.zero_shot is not None and list(result.zero_shot.columns) == ["text", "label"]
    # the records live in the run's private area, owner-only; config.yaml points there
    staged = result.run_dir / "private" / "input" / "records.parquet"
    assert stat.S_IMODE(staged.stat().st_mode) == 0o600
    cfg = yaml.safe_load((result.run_dir / "config.yaml").read_text())
    assert Path(cfg["data"]["path"]) == staged.resolve()
    assert cfg["synthesis"]["samples"] == 6 and cfg["privacy"]["epsilon"] == 3.0
    # load_run gives the same result for the finished folder
    again = dpsynth.load_run(result.run_dir)
    assert isinstance(again, dpsynth.Result)
    assert again.synthetic.equals(syn) and again.privacy == result.privacy
    assert "epsilon=" in repr(again)


def test_a_list_of_dicts_and_a_path_work_the_same(tmp_path: Path) -> None:
    rows = private_rows(24)
    from_list = _generate(rows, tmp_path / "a")
    path = write_csv(tmp_path / "d.csv", rows)
    from_path = _generate(str(path), tmp_path / "b")
    assert len(from_list.synthetic) == len(from_path.synthetic) == 6
    meta = [json.loads((r.run_dir / "run.json").read_text()) for r in (from_list, from_path)]
    # the same records, whatever their form: the ledger charges one source (a shared budget)
    assert meta[0]["sources"] == meta[1]["sources"]


def test_a_budget_set_on_the_file_binds_the_dataframe_of_it(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    rows = private_rows(24)
    path = write_csv(tmp_path / "d.csv", rows)
    ok = CliRunner().invoke(app, ["budget", "set", "--data", str(path), "--total-epsilon", "2"])
    assert ok.exit_code == 0, ok.output
    with pytest.raises(dpsynth.errors.PrivacyError, match="refused"):
        _generate(pd.read_csv(path), tmp_path / "run")  # epsilon 3 > the file's cap of 2
    assert not (tmp_path / "run").exists()


def test_bad_frames_are_named_by_column_never_echoed(tmp_path: Path) -> None:
    frame = pd.DataFrame(private_rows(12)).assign(text=lambda d: d["text"] + " " + SECRET)
    with pytest.raises(InputError) as err:
        _generate(frame.drop(columns=["label"]), tmp_path / "r1")
    assert "no column 'label'" in str(err.value) and SECRET not in str(err.value)
    mixed = frame.copy()
    mixed["text"] = mixed["text"].astype(object)
    mixed.loc[3, "text"] = [SECRET]  # a list in a text cell
    with pytest.raises(InputError) as err:
        _generate(mixed, tmp_path / "r2")
    assert "column 'text'" in str(err.value) and SECRET not in str(err.value)
    bad_label = frame.copy()
    bad_label.loc[4, "label"] = SECRET  # outside the declared domain: named by row
    with pytest.raises(dpsynth.errors.DpsynthError) as err:
        _generate(bad_label, tmp_path / "r3")
    assert re.search(r"row 5\b", str(err.value)) and "label" in str(err.value)
    # the API's words: the argument, not the run's internal copy or a config key
    assert "records.parquet" not in str(err.value) and "data.label_values" not in str(err.value)
    assert "label_values" in str(err.value)
    assert not (tmp_path / "r3").exists()
    with pytest.raises(InputError, match="item 2 is a str"):
        _generate([{"text": "a", "label": "billing"}, SECRET], tmp_path / "r4")
    with pytest.raises(ConfigError, match="give the method once"):
        _generate(frame, tmp_path / "r5", config={**SMALL, "method": "wasp"})
    with pytest.raises(ConfigError, match="synthesis.samples"):
        _generate(frame, tmp_path / "r6", config={"synthesis": {"samples": -1}})
    for folder in ("r1", "r2", "r4", "r5", "r6"):
        assert not (tmp_path / folder).exists()


def test_resume_and_unfinished_runs(tmp_path: Path) -> None:
    result = _generate(pd.DataFrame(private_rows(24)), tmp_path / "run")
    attempts = json.loads((result.run_dir / "run.json").read_text())["attempts"]
    again = dpsynth.generate(None, output=result.run_dir, resume=True, progress=False,
                             **_fakes())
    assert again.synthetic.equals(result.synthetic)  # a finished run is not run again
    assert json.loads((result.run_dir / "run.json").read_text())["attempts"] == attempts
    meta = json.loads((result.run_dir / "run.json").read_text())
    meta["status"] = "interrupted"
    (result.run_dir / "run.json").write_text(json.dumps(meta))
    with pytest.raises(MissingFileError, match="has not finished.*--resume"):
        dpsynth.load_run(result.run_dir)
    with pytest.raises(ConfigError, match="nothing to resume"):
        dpsynth.generate(None, output=tmp_path / "absent", resume=True)


def test_build_rag_and_ask(tmp_path: Path) -> None:
    from dpsynth.demo_corpus import write_demo_corpus

    docs = pd.read_csv(write_demo_corpus(tmp_path / "demo", n=40, seed=0)["private"])
    synrag = {"vocabulary": "demo", "keyword_extractor": "vocabulary", "keywords_per_doc": 4,
              "clusters": 3, "overlap": 2, "target_size": 6, "tokens": 8,
              "max_doc_tokens": 96, "rho_hist": 0.5, "min_noisy_count": 2.0,
              "self_filter": False, "eps_theta": 2.0}
    gen = FakeGenerator("fake-g0")
    kb = dpsynth.build_rag(docs, text="text", epsilon=10.0, delta=1e-3, output=tmp_path / "kb",
                           config={"synrag": synrag, "privacy": {"accountant": "zcdp"}},
                           progress=False, generator=gen, embedder=FakeEmbedder())
    assert isinstance(kb, dpsynth.RagResult)
    assert kb.privacy["epsilon"] <= 10.0 + 1e-6
    assert "text" in kb.knowledge_base.columns
    answer = kb.ask("Which disease causes a rash?", generator=gen, embedder=FakeEmbedder())
    assert set(answer) >= {"answer", "passages"}
    assert isinstance(dpsynth.load_run(tmp_path / "kb"), dpsynth.RagResult)
    with pytest.raises(ConfigError, match="blank"):
        kb.ask("  ")


def test_evaluate_writes_and_returns_the_shareable_evaluation(tmp_path: Path) -> None:
    from dpsynth.demo_corpus import write_demo_corpus

    paths = write_demo_corpus(tmp_path / "demo", n=60, seed=0, test_n=40)
    values = {"department": "demo"}
    result = dpsynth.generate(str(paths["private"]), labels=["department"],
                              label_values=values, epsilon=4.0, output=tmp_path / "run",
                              config={**SMALL, "synthesis": {**SMALL["synthesis"],
                                                             "samples": 12},
                                      "prompts": {"label_template": "for {department}"}},
                              progress=False, **_fakes())
    ev = result.evaluate(paths["test"], mauve=False, audits=False, embedder=FakeEmbedder())
    assert ev == result.evaluation
    assert "verdict" in ev and "created" not in ev
    assert (result.run_dir / "eval" / "report.html").is_file()
    # the verdict is worded from the interval of the accuracy difference, on paired counts
    cell = ev["versus_zero_shot"]["logreg"]["department"]
    low, high = cell["interval_points"]
    assert low <= cell["accuracy_points"] <= high and cell["interval"] == "paired"
    assert "95 % interval" in ev["verdict"]

    # the test set as a DataFrame, a list of dicts: the same evaluation as from its file
    test = pd.read_csv(paths["test"])
    for given, kind in ((test, "DataFrame"), (test.to_dict("records"), "list")):
        again = dpsynth.evaluate(result.run_dir, given, mauve=False, audits=False,
                                 report=False, embedder=FakeEmbedder())
        assert again["utility"] == ev["utility"]
        assert again["test_file"] == f"(a {kind} of {len(test)} rows given to evaluate())"
    # errors name the Python argument, not a CLI flag
    with pytest.raises(dpsynth.errors.DpsynthError) as err:
        result.evaluate(test.drop(columns=["department"]), audits=False,
                        embedder=FakeEmbedder())
    assert "labels" in str(err.value) and "--" not in str(err.value)
    with pytest.raises(dpsynth.errors.DpsynthError) as err:
        result.evaluate(test, text="body", audits=False, embedder=FakeEmbedder())
    assert "no text column 'body'" in str(err.value) and "--" not in str(err.value)
    page = dpsynth.api.report(result, tmp_path / "again.html")
    assert page == tmp_path / "again.html" and "synthetic" in page.read_text(encoding="utf-8")
