"""The user's view of utility: synthetic vs zero-shot vs real-trained vs chance, per label column.

Fast: the real evaluation suite on a small demo corpus with the hash embedder of
tests/fakes.py (no model is loaded); the table, the chart, the verdict and the files must carry
exactly the suite's numbers, and the real-trained reference stays in the operator's part.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.eval.report import utility_figure, write_report
from dpsynth.eval.suite import REFERENCE_FILE, EvalOptions, evaluate_run
from dpsynth.eval.view import ScoreRow, UtilityTable, utility_tables, verdict, versus_zero_shot
from fakes import FakeEmbedder

LABEL = "department"


def _write_jsonl(path: Path, df: pd.DataFrame) -> None:
    path.write_text("".join(json.dumps({"text": t, "labels": {LABEL: str(y)}}) + "\n"
                            for t, y in zip(df["text"], df[LABEL], strict=True)),
                    encoding="utf-8")


def _run(root: Path, name: str, method: str, private_csv: Path, synthetic: pd.DataFrame) -> Path:
    run = root / name
    (run / "release").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "method": method, "data": {"path": str(private_csv), "text": "text", "labels": [LABEL]},
    }))
    (run / "run.json").write_text(json.dumps({"run_id": name, "method": method,
                                              "status": "finished"}))
    _write_jsonl(run / "release" / "synthetic.jsonl", synthetic)
    (run / "release" / "privacy.json").write_text(json.dumps(
        {"epsilon": 4.0, "delta": 1e-5, "unit": "record", "noise": "secure"}))
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from dpsynth.demo_corpus import write_demo_corpus

    root = tmp_path_factory.mktemp("view")
    real = write_demo_corpus(root / "real", n=120, seed=0, test_n=80)
    other = pd.read_csv(write_demo_corpus(root / "other", n=120, seed=1, test_n=10)["private"])
    synthetic = other.iloc[:60].reset_index(drop=True)
    synthetic.loc[0, "text"] = "<script>alert('x')</script> " + synthetic.loc[0, "text"]
    zero_shot = other.iloc[60:].reset_index(drop=True)
    # a poor zero-shot reference: its labels are shuffled
    zero_shot[LABEL] = np.random.default_rng(0).permutation(zero_shot[LABEL].to_numpy())
    run = _run(root, "run", "aug_pe", real["private"], synthetic)
    zs_run = _run(root, "zs", "zero_shot", real["private"], zero_shot)
    return {"run": run, "zs": zs_run, "test": Path(real["test"])}


@pytest.fixture(scope="module")
def evaluated(runs):
    ev, _ = evaluate_run(runs["run"], runs["test"],
                         EvalOptions(with_mauve=False, with_audits=False,
                                     zero_shot_run=runs["zs"]),
                         embedder=FakeEmbedder(dim=64))
    return ev


def _chance(test_csv: Path) -> tuple[float, float]:
    """Majority share and the majority predictor's macro-F1 = (2p / (1 + p)) / C."""
    shares = pd.read_csv(test_csv)[LABEL].astype(str).value_counts(normalize=True)
    p = float(shares.iloc[0])
    return p, 2 * p / (1 + p) / len(shares)


def test_table_rows_are_the_suites_numbers(runs, evaluated):
    row = evaluated["utility"]["logreg"][LABEL]
    (table,) = utility_tables(evaluated["utility"], operator=True)
    got = {r.key: r for r in table.rows}
    assert [r.name for r in table.rows] == ["synthetic", "zero-shot reference", "real-trained",
                                            "real-trained, as many records as synthetic texts",
                                            "chance (majority class)"]
    for key in ("synthetic", "zero_shot", "private", "private_at_size"):
        assert got[key].accuracy == row[key]["accuracy"]
        assert got[key].macro_f1 == row[key]["macro_f1"]
    acc, f1 = _chance(runs["test"])
    assert got["chance"].accuracy == pytest.approx(acc) == row["chance"]
    assert got["chance"].macro_f1 == pytest.approx(f1) == row["chance_macro_f1"]
    # the at-size reference: a draw of as many private records as the synthetic set has
    assert row["private"]["n_train"] == 120
    assert row["private_at_size"]["n_train"] == row["synthetic"]["n_train"] == 60
    shareable = utility_tables(evaluated["utility"], operator=False)[0]
    assert not {"private", "private_at_size"} & {r.key for r in shareable.rows}
    # the comparison and the one-line verdict
    cmp = evaluated["versus_zero_shot"]["logreg"][LABEL]
    points = round(100 * (row["synthetic"]["accuracy"] - row["zero_shot"]["accuracy"]), 1)
    assert cmp["accuracy_points"] == points
    assert cmp["beats_zero_shot"] == (points > 0)
    assert points > 0  # same-distribution text vs shuffled labels
    assert evaluated["verdict"] == verdict(versus_zero_shot(evaluated["utility"]))
    assert evaluated["verdict"].startswith("The synthetic data beat the zero-shot reference")
    assert f"{LABEL} (logreg) {points:+.1f} accuracy points" in evaluated["verdict"]
    assert "\n" not in evaluated["verdict"]


def test_real_trained_reference_is_written_to_private_only(runs, evaluated):
    on_disk = json.loads((runs["run"] / "eval" / "eval.json").read_text())
    assert not {"private", "private_at_size"} & set(on_disk["utility"]["logreg"][LABEL])
    assert "private" not in on_disk["n"]
    assert on_disk["verdict"] == evaluated["verdict"]
    assert on_disk["utility"]["logreg"][LABEL]["synthetic"] == \
        evaluated["utility"]["logreg"][LABEL]["synthetic"]
    ref_file = runs["run"] / "private" / "eval" / REFERENCE_FILE
    assert oct(ref_file.stat().st_mode)[-3:] == "600"
    ref = json.loads(ref_file.read_text())
    for key in ("private", "private_at_size"):
        assert ref["utility"]["logreg"][LABEL][key] == evaluated["utility"]["logreg"][LABEL][key]
    assert ref["n_private"] == evaluated["n"]["private"]


def test_report_shows_the_table_and_chart_shareable_without_real_trained(runs, evaluated):
    page = write_report(runs["run"]).read_text(encoding="utf-8")
    operator = (runs["run"] / "private" / "report-operator.html").read_text(encoding="utf-8")
    row = evaluated["utility"]["logreg"][LABEL]
    for html in (page, operator):
        assert f"<td>{row['synthetic']['accuracy']:.3f}</td>" in html
        assert f"<td>{row['zero_shot']['macro_f1']:.3f}</td>" in html
        assert f"<td>{row['chance']:.3f}</td>" in html
        assert 'alt="utility logreg department"' in html
        assert "<script>" not in html and "&lt;script&gt;" in html  # autoescaped
        assert "beat the zero-shot reference" in html
    assert "<td>real-trained</td>" not in page
    assert f"<td>real-trained</td><td>{row['private']['accuracy']:.3f}</td>" in operator


def test_zero_shot_not_given(runs, tmp_path):
    ev, _ = evaluate_run(runs["run"], runs["test"],
                         EvalOptions(with_mauve=False, with_audits=False),
                         embedder=FakeEmbedder(dim=64), write=False)
    cell = ev["utility"]["logreg"][LABEL]["zero_shot"]
    assert cell["unavailable"].startswith("not given") and "--zero-shot" in cell["unavailable"]
    (table,) = utility_tables(ev["utility"], operator=False)
    zs = next(r for r in table.rows if r.key == "zero_shot")
    assert zs.accuracy is None and zs.note == "not given"
    assert "unavailable" in ev["versus_zero_shot"]["logreg"][LABEL]
    assert ev["verdict"] == ("Synthetic vs zero-shot: no comparison: department (logreg): "
                             "zero-shot reference not given.")


def test_chart_has_the_numbers_on_the_bars():
    rows = (ScoreRow("synthetic", "synthetic", 0.612, 0.41),
            ScoreRow("zero_shot", "zero-shot reference", None, None, "not given"),
            ScoreRow("chance", "chance (majority class)", 0.5, 0.333))
    fig = utility_figure(UtilityTable("logreg", LABEL, rows))
    (ax,) = fig.axes
    labels = sorted(t.get_text() for t in ax.texts if t.get_text())
    assert labels == ["0.333", "0.410", "0.500", "0.612"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["synthetic", "zero-shot reference (not given)", "chance (majority class)"]


def test_eval_cli_prints_the_table_and_ends_with_the_verdict(runs, monkeypatch):
    import dpsynth.embed
    from dpsynth.cli import app

    monkeypatch.setattr(dpsynth.embed, "Embedder", lambda *_a, **_k: FakeEmbedder(dim=64))
    res = CliRunner().invoke(app, ["eval", str(runs["run"]), "--test", str(runs["test"]),
                                   "--zero-shot", str(runs["zs"]), "--no-mauve",
                                   "--no-audits"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    on_disk = json.loads((runs["run"] / "eval" / "eval.json").read_text())
    assert res.stdout.strip().splitlines()[-1] == on_disk["verdict"]
    row = json.loads((runs["run"] / "private" / "eval" / REFERENCE_FILE).read_text())
    for name, value in (("real-trained", row["utility"]["logreg"][LABEL]["private"]["accuracy"]),
                        ("synthetic",
                         on_disk["utility"]["logreg"][LABEL]["synthetic"]["accuracy"]),
                        ("chance (majority class)", on_disk["utility"]["logreg"][LABEL]["chance"])):
        assert any(name in line and f"{value:.3f}" in line for line in res.stdout.splitlines())
    bad = CliRunner().invoke(app, ["eval", str(runs["run"]), "--test", str(runs["test"]),
                                   "--zero-shot", str(runs["test"].parent)])
    assert bad.exit_code == 2 and "not a dpsynth run folder" in bad.output


def test_audit_run_cli_writes_the_operator_audit(runs, monkeypatch, tmp_path):
    import dpsynth.embed
    from dpsynth.cli import app

    monkeypatch.setattr(dpsynth.embed, "Embedder", lambda *_a, **_k: FakeEmbedder(dim=64))
    res = CliRunner().invoke(app, ["audit", "run", str(runs["run"]), "--holdout",
                                   str(runs["test"]), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    audit_file = runs["run"] / "private" / "eval" / "audit.json"
    assert json.loads(audit_file.read_text()) == out
    assert oct(audit_file.stat().st_mode)[-3:] == "600"
    assert out["pii"]["n_outputs"] == 60 and out["pii"]["detector"].startswith("presidio")
    assert set(out["pii_columns"]) == {"patient_name", "phone", "email"}
    # a deliberate error is one line from the root group, exit 2, no traceback
    bad = CliRunner().invoke(app, ["audit", "run", str(tmp_path)])
    assert bad.exit_code == 2 and "not a dpsynth run folder" in bad.output
    assert "Traceback" not in bad.output


def test_old_method_spelling_is_normalised(tmp_path):
    """Run folders written before the rename say `dp_synrag`: read as the registered `synrag`."""
    from dpsynth.eval.common import EvalInputError
    from dpsynth.eval.release import load_run

    run = tmp_path / "old"
    (run / "release").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "old", "method": "dp_synrag",
                                              "status": "finished"}))
    with pytest.warns(DeprecationWarning, match="dp_synrag"), \
            pytest.raises(EvalInputError, match=r"DP-SynRAG run \(method synrag\)"):
        load_run(run)


def test_audit_run_shows_bars_of_its_texts_and_its_audits(runs):
    import io

    from rich.console import Console

    from dpsynth import progress
    from dpsynth.eval.suite import AUDITS_BAR, audit_run

    def shown(show: bool) -> str:
        out = io.StringIO()
        with progress.session(console=Console(file=out, force_terminal=False, width=120)):
            audit_run(runs["run"], runs["test"], embedder=FakeEmbedder(dim=64), write=False,
                      progress=show)
        return out.getvalue()

    text = shown(True)  # plain lines (not a terminal): a start and a done line per bar
    assert f"{AUDITS_BAR}: 0/3" in text and f"{AUDITS_BAR}: 3/3 in" in text, text
    assert "embedding synthetic (texts)" in text and "embedding holdout (texts)" in text
    assert AUDITS_BAR not in shown(False)


def test_the_release_sizes_ceiling_is_the_at_size_references_share_of_the_gap():
    """real records as many as the synthetic texts: the share of the zero-shot -> real gap
    they close, said to the operator with what raises it."""
    from dpsynth.eval.view import in_context

    cell = {"n_test": 1000}
    block = {"synthetic": {"accuracy": 0.45, **cell}, "zero_shot": {"accuracy": 0.40, **cell},
             "private": {"accuracy": 0.80, **cell}, "private_at_size": {"accuracy": 0.50, **cell},
             "chance": 0.1}
    (line,) = in_context({"logreg": {LABEL: block}}, operator=True)
    assert line.real_at_size == 0.50
    assert line.size_ceiling == pytest.approx(0.25)
    assert line.gap_closed == pytest.approx(0.125)
    assert "25 % of the gap" in line.size_sentence and "synthesis.samples" in line.size_sentence
    (shared,) = in_context({"logreg": {LABEL: block}}, operator=False)
    assert shared.real_at_size is None and shared.size_sentence == ""
    del block["private_at_size"]
    (line,) = in_context({"logreg": {LABEL: block}}, operator=True)
    assert line.size_ceiling is None and line.size_sentence == ""


def test_no_at_size_reference_where_the_private_data_is_no_larger():
    from dpsynth.eval.release import LabeledTexts
    from dpsynth.eval.suite import at_release_size

    data = LabeledTexts(["a", "b", "c"], {LABEL: ["x", "y", "x"]})
    emb = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert "no more records" in at_release_size(emb, data, 3, 0)
    got_emb, got = at_release_size(emb, data, 2, 0)
    assert len(got) == 2 and got_emb.shape == (2, 2)
    for vec, text, label in zip(got_emb, got.texts, got.labels[LABEL], strict=True):
        i = data.texts.index(text)
        assert (vec == emb[i]).all() and label == data.labels[LABEL][i]
