"""dpsynth eval / report / compare on a fake run folder; the report rendered in Chromium.

CI needs Debian's chromium (`apt-get install -y chromium`); only the browser part skips
when /usr/bin/chromium is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.eval.common import EvalInputError
from dpsynth.eval.release import load_run
from dpsynth.eval.report import compare_runs, write_report

SENTINEL = "PRIVATE-SENTINEL Quorbel Vantastrix swallowed the brass key at the lighthouse"


def _release_rows(df: pd.DataFrame, labels: list[str]) -> list[dict]:
    return [{"text": t, "labels": {c: str(df[c].iloc[i]) for c in labels}}
            for i, t in enumerate(df["text"])]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def make_run(root: Path, private_csv: Path, synthetic: pd.DataFrame, zero_shot: pd.DataFrame,
             method: str = "aug_pe") -> Path:
    """A finished run folder in the format `dpsynth generate` writes."""
    run = root / f"run-{method}"
    (run / "release").mkdir(parents=True)
    (run / "private").mkdir(mode=0o700)
    (run / "config.yaml").write_text(yaml.safe_dump({
        "method": method,
        "data": {"path": str(private_csv), "text": "text", "labels": ["department"],
                 "user": None},
        "privacy": {"epsilon": 4.0, "delta": 1e-5},
    }))
    (run / "run.json").write_text(json.dumps({
        "run_id": f"fake{method}", "method": method, "status": "finished",
        "dataset_fingerprint": "0" * 64, "started": "2026-01-01T00:00:00Z",
        "finished": "2026-01-01T00:10:00Z",
    }))
    stats = [{"iteration": t, "kept": 40, "candidates": 120, "vote_mass": 80.0 - 5 * t,
              "noise_sigma": 3.5, "generator_weights": {"smollm2": 0.5 + 0.1 * t,
                                                        "gemma3": 0.5 - 0.1 * t},
              "fid": 1.0 - 0.2 * t} for t in range(3)]
    _write_jsonl(run / "stats.jsonl", stats)
    _write_jsonl(run / "release" / "synthetic.jsonl", _release_rows(synthetic, ["department"]))
    _write_jsonl(run / "release" / "zero_shot.jsonl", _release_rows(zero_shot, ["department"]))
    (run / "release" / "privacy.json").write_text(json.dumps({
        "epsilon": 3.98, "delta": 1e-5, "target_epsilon": 4.0, "target_delta": 1e-5,
        "unit": "record", "accountant": "pld", "noise": "seeded",
        "mechanisms": [{"name": "gaussian", "count": 3, "sigma": 3.5}],
    }))
    (run / "release" / "summary.json").write_text(json.dumps(
        {"samples": len(synthetic), "method": method, "llm_calls": 321}))
    # a private file inside the run must never reach the report either
    (run / "private" / "checkpoint.json").write_text(json.dumps({"text": SENTINEL}))
    return run


# private, test and synthetic (and as many zero-shot) texts of the fake run: every one is
# embedded by the real embedder in `dpsynth eval`, so few
N_PRIVATE, N_TEST, N_SYN = 40, 30, 20


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    from dpsynth.demo_corpus import write_demo_corpus

    root = tmp_path_factory.mktemp("evalrun")
    base = write_demo_corpus(root / "real", n=N_PRIVATE, seed=0, test_n=N_TEST)
    private = pd.read_csv(base["private"])
    private.loc[5, "text"] = SENTINEL
    private.to_csv(base["private"], index=False)
    other = pd.read_csv(write_demo_corpus(root / "other", n=2 * N_SYN, seed=1,
                                          test_n=10)["private"])
    synthetic = other.iloc[:N_SYN].reset_index(drop=True)
    zero_shot = other.iloc[N_SYN:].copy()
    # the zero-shot reference is deliberately poor: labels shuffled
    zero_shot["department"] = np.random.default_rng(0).permutation(
        zero_shot["department"].to_numpy())
    run = make_run(root, base["private"], synthetic, zero_shot)
    return {"root": root, "run": run, "test": base["test"], "private": private}


@pytest.mark.models
def test_eval_then_compare_and_report_of_a_run(fake, tmp_path):
    """`dpsynth eval` on the run (real embedder, MAUVE, audits), then `compare` and `report`
    and the report page (in Chromium at the end) of that evaluated run. One test: the eval is
    the expensive part, and a module fixture would be paid again on every xdist worker that
    runs one of its users."""
    from dpsynth.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["eval", str(fake["run"]), "--test", str(fake["test"]), "--json"])
    assert res.exit_code == 0, res.output
    evaluated = json.loads(res.stdout)

    # -- eval: JSON and files
    ev, audit = evaluated["eval"], evaluated["audit"]
    on_disk = json.loads((fake["run"] / "eval" / "eval.json").read_text())
    assert on_disk["fidelity"] == ev["fidelity"]
    audit_file = fake["run"] / "private" / "eval" / "audit.json"  # operator only
    assert audit_file.is_file() and oct(audit_file.stat().st_mode)[-3:] == "600"
    assert not (fake["run"] / "eval" / "audit.json").exists()
    syn = ev["fidelity"]["synthetic"]
    assert ev["n"] == {"synthetic": N_SYN, "zero_shot": N_SYN, "private": N_PRIVATE,
                       "test": N_TEST}
    assert isinstance(syn["fid"], float) and syn["fid"] >= 0
    assert 0 <= syn["precision"] <= 1 and 0 <= syn["recall"] <= 1
    assert 0 < syn["mauve"] <= 1
    assert "fid_note" in syn  # fewer samples than 384 dimensions
    assert 0 <= syn["labels"]["department"]["tv"] <= 1
    row = ev["utility"]["logreg"]["department"]
    for name in ("synthetic", "private", "zero_shot"):
        assert 0 <= row[name]["accuracy"] <= 1 and "macro_f1" in row[name]
    # synthetic data from the same distribution beats the shuffled-label zero-shot set
    assert row["synthetic"]["accuracy"] > row["zero_shot"]["accuracy"]
    assert row["private"]["accuracy"] > row["chance"]
    assert any("outside the release" in n for n in ev["notes"])
    assert 0 <= audit["membership_inference"]["auc"] <= 1
    assert audit["dcr"]["n_synthetic"] == N_SYN
    assert audit["pii"]["n_outputs"] == N_SYN
    assert set(audit["pii_columns"]) == {"patient_name", "phone", "email"}
    for blob in (json.dumps(ev), json.dumps(audit)):
        assert SENTINEL not in blob

    # -- compare and report CLI
    not_a_run = tmp_path / "not-a-run"
    not_a_run.mkdir()
    res = runner.invoke(app, ["compare", str(fake["run"]), str(not_a_run), "--json"])
    assert res.exit_code == 2, res.output  # one folder is not a run: said, and exit 2
    rows = json.loads(res.stdout)
    assert rows[0]["method"] == "aug_pe" and rows[0]["samples"] == N_SYN
    assert rows[0]["fid"] == ev["fidelity"]["synthetic"]["fid"]
    assert "logreg:department" in rows[0]["accuracy"]
    assert "not a dpsynth run folder" in rows[1]["error"]
    res = runner.invoke(app, ["compare", str(fake["run"])])
    assert res.exit_code == 0 and "aug_pe" in res.stdout
    res = runner.invoke(app, ["report", str(fake["run"]), "--out", str(tmp_path / "r.html")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r.html").read_text().count("data:image/png;base64,") >= 5

    # -- the report page: plots, no private text
    out = write_report(fake["run"], tmp_path / "report.html")
    page = out.read_text(encoding="utf-8")
    assert page.count('<img src="data:image/png;base64,') >= 5  # 4 curves + labels
    assert "http://" not in page and "https://" not in page
    assert "(3.98, 1e-05)-differential privacy at the record level" in page
    assert "only while the seed stays secret" in page  # privacy.json says noise "seeded"
    # the shareable page holds nothing computed on the private data; the operator page does
    assert "Membership inference" not in page and "Distance to closest record" not in page
    assert "Fine-tuned" not in page and "Logistic regression" in page
    operator = (fake["run"] / "private" / "report-operator.html").read_text(encoding="utf-8")
    assert "Membership inference" in operator and "Distance to closest record" in operator
    assert "OPERATOR ONLY" in operator and "OPERATOR ONLY" not in page
    assert SENTINEL not in operator
    assert SENTINEL not in page and "Quorbel" not in page
    for text in fake["private"]["text"]:
        assert text not in page
    synthetic = load_run(fake["run"]).synthetic.texts
    from markupsafe import escape  # the template autoescapes

    assert any(str(escape(t)) in page for t in synthetic[:5])

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("chromium not installed (CI: apt-get install -y chromium)")
    profile = tmp_path / "profile"
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             f"--user-data-dir={profile}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=180, env=env, check=True).stdout
    assert dom.count('src="data:image/png;base64,') >= 5
    assert "Privacy guarantee" in dom and "privacy-statement" in dom
    assert SENTINEL not in dom
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1000,2400", out.as_uri()],
                   capture_output=True, timeout=180, env=env, check=True)
    from matplotlib.image import imread

    pixels = imread(str(shot))
    assert pixels.shape[0] >= 2000 and pixels.std() > 0.05  # text and plots drawn, not blank


def test_bad_run_folders_get_clear_messages(tmp_path, fake):
    with pytest.raises(EvalInputError, match="not a dpsynth run folder"):
        load_run(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"method": "aug_pe", "status": "failed"}))
    with pytest.raises(EvalInputError, match=r"no release/ folder \(run status: failed\)"):
        load_run(tmp_path)
    rag = tmp_path / "rag"
    (rag / "release").mkdir(parents=True)
    (rag / "run.json").write_text(json.dumps({"method": "synrag", "status": "finished"}))
    (rag / "release" / "kb.jsonl").write_text("{}\n")
    with pytest.raises(EvalInputError, match="DP-SynRAG run"):
        load_run(rag)
    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["eval", str(rag), "--test", str(fake["test"])])
    assert res.exit_code == 2 and "DP-SynRAG" in res.output


def test_test_file_with_other_labels_is_refused(fake, tmp_path):
    from dpsynth.eval.release import load_test_data

    release = load_run(fake["run"])
    test = pd.read_csv(fake["test"])
    test.drop(columns=["department"]).to_csv(tmp_path / "nolabel.csv", index=False)
    with pytest.raises(EvalInputError, match="labels differ.*lacks 'department'"):
        load_test_data(tmp_path / "nolabel.csv", "text", ["department"], release.synthetic)
    test.assign(department="Astrology").to_csv(tmp_path / "other.csv", index=False)
    with pytest.raises(EvalInputError, match="share none with the synthetic"):
        load_test_data(tmp_path / "other.csv", "text", ["department"], release.synthetic)
    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["eval", str(fake["run"]), "--test",
                                   str(tmp_path / "nolabel.csv")])
    assert res.exit_code == 2 and "department" in res.output
    res = CliRunner().invoke(app, ["eval", str(fake["run"]), "--test", str(fake["test"]),
                                   "--label", "urgency"])
    assert res.exit_code == 2 and "not in the synthetic data" in res.output


def test_compare_runs_reads_run_meta(fake):
    rows = compare_runs([fake["run"]])
    assert rows[0]["run_id"] == "fakeaug_pe"


def test_too_few_samples_say_unavailable_instead_of_a_number():
    from dpsynth.eval.release import LabeledTexts
    from dpsynth.eval.suite import fidelity_block, utility_block

    rng = np.random.default_rng(0)
    syn = LabeledTexts(["only one synthetic text"], {"department": ["Neurology"]})
    real = LabeledTexts([f"real text {i}" for i in range(30)],
                        {"department": ["Neurology", "Dermatology"] * 15})
    block = fidelity_block(rng.normal(size=(1, 8)), rng.normal(size=(30, 8)), syn, real)
    for key in ("fid", "precision", "recall", "mauve"):
        assert "unavailable" in block[key], key
    assert "at least 2 samples" in block["fid"]["unavailable"]
    util = utility_block({"synthetic": (rng.normal(size=(1, 8)), syn), "private": None},
                         rng.normal(size=(30, 8)), real)
    row = util["logreg"]["department"]
    assert "single class" in row["synthetic"]["unavailable"]
    assert row["private"] == {"unavailable": "no private data"}
    from dpsynth.cli.evaluate import print_eval  # renders unavailable cells without error

    print_eval({"method": "aug_pe", "epsilon": 1.0,
                "fidelity": {"synthetic": block, "zero_shot": {"unavailable": "none"}},
                "utility": util}, None)


@pytest.mark.models
def test_unlabeled_corpus_gets_next_token_accuracy(fake, tmp_path, embedder):
    from dpsynth.eval.suite import EvalOptions, evaluate_run

    rows = [json.loads(line) for line in
            (fake["run"] / "release" / "synthetic.jsonl").read_text().splitlines()]
    run = tmp_path / "unlabeled"
    shutil.copytree(fake["run"], run, ignore=shutil.ignore_patterns("eval"))
    (run / "release" / "synthetic.jsonl").write_text(
        "".join(json.dumps({"text": r["text"], "labels": {}}) + "\n" for r in rows[:20]))
    (run / "release" / "zero_shot.jsonl").write_text(
        "".join(json.dumps({"text": t, "labels": {}}) + "\n"
                for t in ["the weather is nice today", "I like green apples"] * 5))
    ev, audit = evaluate_run(run, fake["test"], EvalOptions(labels=[], with_mauve=False,
                                                            with_audits=False),
                             embedder=embedder)
    nt = ev["utility"]["next_token"]
    assert "logreg" not in ev["utility"] and audit is None
    assert nt["synthetic"]["accuracy"] > nt["zero_shot"]["accuracy"]
    assert nt["private"]["accuracy"] > nt["zero_shot"]["accuracy"]
    assert ev["fidelity"]["synthetic"]["mauve"] == {"unavailable": "skipped (--no-mauve)"}
    assert ev["fidelity"]["synthetic"]["labels"] == {}


# -- the shareable part and the operator-only part (fast: hand-written eval results) ----------

PRIVATE_ACC = 0.987654  # the private-trained reference: computed on private data
MIA_AUC = 0.876543  # membership inference: computed on private data
SYN_ACC = 0.612345  # synthetic-trained, scored on the public test set: shareable
AT_SIZE_ACC = 0.765432  # real-trained on as many private records as synthetic texts: private


def _evaluated_run(tmp_path: Path, privacy: dict) -> Path:
    run = tmp_path / "run"
    (run / "release").mkdir(parents=True)
    (run / "private").mkdir(mode=0o700)
    (run / "eval").mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({
        "method": "aug_pe", "data": {"path": "demo", "labels": ["department"]}}))
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "method": "aug_pe",
                                              "status": "finished"}))
    rows = [{"text": f"synthetic text number {i}", "labels": {"department": "A" if i % 2 else "B"}}
            for i in range(6)]
    _write_jsonl(run / "release" / "synthetic.jsonl", rows)
    (run / "release" / "privacy.json").write_text(json.dumps(privacy))
    from dpsynth.eval.suite import PRIVATE_USE_NOTE

    cell = lambda acc: {"accuracy": acc, "macro_f1": acc}  # noqa: E731
    (run / "eval" / "eval.json").write_text(json.dumps({
        "test_file": "test.csv", "embedder": "minilm", "created": "2026-01-01T00:00:00Z",
        "n": {"synthetic": 6, "zero_shot": 0, "private": 4321, "test": 10},
        "fidelity": {"synthetic": {"n": 6, "fid": 0.5}},
        "utility": {"logreg": {"department": {
            "synthetic": cell(SYN_ACC), "private": cell(PRIVATE_ACC),
            "private_at_size": cell(AT_SIZE_ACC),
            "zero_shot": {"unavailable": "none"}, "chance": 0.5}}},
        "notes": [PRIVATE_USE_NOTE],
    }))
    (run / "private" / "eval").mkdir(parents=True)
    (run / "private" / "eval" / "audit.json").write_text(json.dumps({
        "membership_inference": {"auc": MIA_AUC, "tpr_at_fpr": {"0.01": 0.02},
                                 "n_members": 4321, "n_non_members": 10},
        "dcr": {"unavailable": "skipped"},
    }))
    (run / "private" / "eval" / "audit_canary.json").write_text(json.dumps(
        {"copies": 3, "synthetic": {"exact": 0, "near": 1, "outputs": 6}}))
    return run


SEEDED = {"epsilon": 2.0, "delta": 1e-5, "unit": "record", "accountant": "pld",
          "noise": "seeded"}


def test_shareable_report_holds_no_private_derived_value(tmp_path):
    run = _evaluated_run(tmp_path, SEEDED)
    page = write_report(run).read_text(encoding="utf-8")
    assert f"{SYN_ACC:.3f}" in page  # the release's own test-set score is shareable
    for private_value in (f"{PRIVATE_ACC:.3f}", f"{AT_SIZE_ACC:.3f}", f"{MIA_AUC:.3f}",
                          "4321"):
        assert private_value not in page, private_value
    assert "Membership inference" not in page and "Canary audit" not in page
    assert "OPERATOR ONLY" not in page and "report-operator.html" in page
    from dpsynth.eval.suite import PRIVATE_USE_NOTE

    assert PRIVATE_USE_NOTE not in page

    operator = run / "private" / "report-operator.html"
    assert oct(operator.stat().st_mode)[-3:] == "600"
    op = operator.read_text(encoding="utf-8")
    assert "OPERATOR ONLY - DO NOT SHARE" in op
    assert f"{PRIVATE_ACC:.3f}" in op and f"{MIA_AUC:.3f}" in op and "Canary audit" in op


def test_privacy_sentence_reads_the_noise_mode(tmp_path):
    from dpsynth.eval.report import privacy_statement

    seeded = privacy_statement(SEEDED)
    assert "(2, 1e-05)-differential privacy" in seeded
    assert "only while the seed stays secret" in seeded
    secure = privacy_statement({**SEEDED, "noise": "secure"})
    assert "secure randomness" in secure and "seed" not in secure
    note = "seeded noise (research mode): DP holds only while the seed is secret"
    assert privacy_statement({**SEEDED, "noise_note": note}).endswith(note)
    secpe = privacy_statement({"epsilon": None, "noise": "secure",
                               "secret_protection": {"summary": "(p=0.0001, r=0.001) per secret"}})
    assert "secret protection" in secpe and "not differential privacy" in secpe
    run = _evaluated_run(tmp_path, SEEDED)
    assert "only while the seed stays secret" in write_report(run).read_text(encoding="utf-8")


def test_report_cli_names_both_reports(tmp_path):
    from dpsynth.cli import app

    run = _evaluated_run(tmp_path, SEEDED)
    res = CliRunner().invoke(app, ["report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert Path(out["report"]) == run / "eval" / "report.html"
    assert Path(out["operator_report"]) == run / "private" / "report-operator.html"
    assert "OPERATOR ONLY" in Path(out["operator_report"]).read_text(encoding="utf-8")


# -- a report to show: headline, mechanisms table, plots that fit, caveats, no times ----------


def _series(n_iter: int) -> list:
    xs = [float(i + 1) for i in range(n_iter)]
    return [("kept samples", xs, [40.0] * n_iter, "o-"),
            ("candidates", xs, [120.0] * n_iter, "s--")]


def test_one_iteration_is_bars_and_several_are_lines_with_a_tick_each():
    from dpsynth.eval.report import iteration_figure

    one = iteration_figure("Samples per iteration", _series(1)).axes[0]
    assert not one.lines and len(one.patches) == 2  # two bars, no line plot
    assert "the only one" in one.get_title()
    three = iteration_figure("Samples per iteration", _series(3)).axes[0]
    assert len(three.lines) == 2 and list(three.get_xticks()) == [1.0, 2.0, 3.0]
    assert [t.get_text() for t in three.get_xticklabels()] == ["1", "2", "3"]
    assert iteration_figure("nothing", [("x", [], [], "o-")]) is None


def test_label_axes_keep_every_name_readable():
    from matplotlib.figure import Figure

    import dpsynth.eval.report as rep

    names = {f"Very long department name number {i} of the clinic": 1 / 40 for i in range(40)}
    seen = {}
    orig = rep._png

    def keep(fig: Figure) -> str:
        seen["fig"] = fig
        return orig(fig)

    rep._png = keep
    try:
        rep.plot_labels("department", names, None)
    finally:
        rep._png = orig
    ax = seen["fig"].axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) == rep.MAX_LABEL_BARS and labels[-1].startswith("other (16 values)")
    assert all("\n" in lab or len(lab) <= 28 for lab in labels)  # wrapped, never cut mid-word


def test_headline_mechanisms_and_no_time_on_the_shareable_page(tmp_path):
    run = _evaluated_run(tmp_path, {**SEEDED, "epsilon": 3.999916556125589,
                                    "mechanisms": [{"mechanism": "gaussian", "name": "votes",
                                                    "sigma": 2.3456789, "sensitivity": 1.0,
                                                    "count": 2, "extra_key": 5}]})
    meta = json.loads((run / "run.json").read_text())
    meta.update(started="2026-01-01T00:00:00Z", finished="2026-01-01T00:10:00Z")
    (run / "run.json").write_text(json.dumps(meta))
    (run / "release" / "summary.json").write_text(json.dumps(
        {"method": "aug_pe", "samples": 6, "wall_seconds": 12.5, "epsilon": 3.999916556125589}))
    page = write_report(run).read_text(encoding="utf-8")
    head = page[page.index("id='headline'"):page.index("</header>")]
    assert "Aug-PE: 6 synthetic samples" in head
    assert "(4, 1e-05)-differential privacy for each record" in head  # 3 significant digits
    assert "3.9999" not in page
    assert "<th>noise sigma</th>" in page and "2.346" in page and "extra_key 5" in page
    assert "{&#34;" not in page and '{"mechanism"' not in page  # no raw JSON dump
    assert "2026-01-01" not in page and "wall_seconds" not in page
    assert "small-n-caveat" in page  # 6 synthetic, 10 test texts


def test_report_fits_1280_px_in_chromium(tmp_path, fake):
    """The shareable page of a 3-iteration run, screenshot at 1280 px wide: nothing runs off
    the right edge, the headline box is on top."""
    out = write_report(fake["run"], tmp_path / "report.html")
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(chromium).exists():
        pytest.skip("chromium not installed (CI: apt-get install -y chromium)")
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             f"--user-data-dir={tmp_path / 'profile'}"]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run([*flags, "--dump-dom", out.as_uri()], capture_output=True, text=True,
                         timeout=180, env=env, check=True).stdout
    assert dom.index('id="headline"') < dom.index('id="privacy-statement"')
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1280,2200", out.as_uri()],
                   capture_output=True, timeout=180, env=env, check=True)
    from matplotlib.image import imread

    pixels = imread(str(shot))[..., :3]
    assert pixels.shape[1] == 1280 and pixels.std() > 0.05
    right = pixels[:, -60:, :]  # the right margin: page background only
    assert right.min() > 0.95, "content runs past the right edge at 1280 px"
    headline = pixels[20:200, 100:1180, :]  # the green headline box near the top
    assert (abs(headline[..., 1] - headline[..., 0]) > 0.01).mean() > 0.5


# -- the headline: numbers in context, a verdict worded from the interval (issues 44, 46) ----

ZS_ACC = 0.598765  # zero-shot-trained, scored on the public test set: shareable


def _visible(page: str) -> str:
    """The text a reader sees: no style, no tags, no inlined images."""
    import html
    import re

    page = re.sub(r"<style.*?</style>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _with_zero_shot(tmp_path: Path, paired: dict | None, chance: float | None = 0.5) -> Path:
    """An evaluated run whose eval.json compares synthetic with zero-shot on 400 test texts."""
    run = _evaluated_run(tmp_path, {**SEEDED, "noise_multiplier": 1.879826556456524,
                                    "target_epsilon": 2.0})
    ev = json.loads((run / "eval" / "eval.json").read_text())
    row = ev["utility"]["logreg"]["department"]
    row["synthetic"].update(n_test=400)
    row["zero_shot"] = {"accuracy": ZS_ACC, "macro_f1": 0.5, "n_test": 400}
    if chance is None:
        del row["chance"]
    if paired:  # the accuracies those counts give
        row["synthetic_vs_zero_shot"] = paired
        row["synthetic"]["accuracy"] = (paired["both"] + paired["synthetic_only"]) / paired["n"]
        row["zero_shot"]["accuracy"] = (paired["both"] + paired["zero_shot_only"]) / paired["n"]
    ev["n"]["test"] = 400
    (run / "eval" / "eval.json").write_text(json.dumps(ev))
    return run


def test_headline_puts_the_score_beside_its_baselines_and_words_the_interval(tmp_path):
    # 0.612 vs 0.599 on 400 texts, independent: the interval covers zero
    run = _with_zero_shot(tmp_path, paired=None)
    page = write_report(run).read_text(encoding="utf-8")
    head = _visible(page[page.index("id='headline'"):page.index("</header>")])
    assert "0.612" in head and "0.599" in head and "0.500" in head  # synthetic, zero-shot, majority
    assert "the private votes added no measurable accuracy over zero-shot (+1.4 points, " \
           "95 % interval" in head
    low, high = re.search(r"95 % interval ([+-]\d+\.\d) to ([+-]\d+\.\d)", head).groups()
    assert float(low) < 0 < float(high)
    # the real-trained score and the gap closed are computed on the private data: operator only
    assert f"{PRIVATE_ACC:.3f}" not in page and "gap closed" not in head.replace(
        "gap closed are", "")
    operator = _visible((run / "private" / "report-operator.html").read_text(encoding="utf-8"))
    op_head = operator[:operator.index("Privacy guarantee")]
    gap = (SYN_ACC - ZS_ACC) / (PRIVATE_ACC - ZS_ACC)
    assert f"{PRIVATE_ACC:.3f}" in op_head and f"{100 * gap:.0f} %" in op_head
    # the ceiling the release's size sets: real records as many as the synthetic texts
    ceiling = (AT_SIZE_ACC - ZS_ACC) / (PRIVATE_ACC - ZS_ACC)
    assert f"score {AT_SIZE_ACC:.3f}, {100 * ceiling:.0f} % of the gap" in op_head
    assert f"{AT_SIZE_ACC:.3f}" not in page

    # paired on the same 400 texts, the same +1.5 points is measurable when the two sets'
    # classifiers agree but on 6 texts, all won by synthetic; not when they differ on 60
    for both, syn_only, zs_only, verdict in ((240, 6, 0, "added accuracy"),
                                             (213, 33, 27, "added no measurable accuracy")):
        paired = {"n": 400, "both": both, "synthetic_only": syn_only,
                  "zero_shot_only": zs_only, "neither": 400 - both - syn_only - zs_only}
        run = _with_zero_shot(tmp_path / f"paired{both}", paired=paired)
        head = _visible(write_report(run).read_text(encoding="utf-8"))
        assert f"the private votes {verdict} over zero-shot (+1.5 points, 95 % interval" in head


def test_majority_rate_from_the_test_file_when_eval_json_lacks_it(tmp_path):
    run = _with_zero_shot(tmp_path, paired=None, chance=None)
    test = tmp_path / "test.csv"
    pd.DataFrame({"text": list("abcdefghij"),
                  "department": ["A"] * 7 + ["B"] * 3}).to_csv(test, index=False)
    ev = json.loads((run / "eval" / "eval.json").read_text())
    ev["test_file"] = str(test)
    (run / "eval" / "eval.json").write_text(json.dumps(ev))
    page = write_report(run).read_text(encoding="utf-8")
    head = _visible(page[page.index("id='headline'"):page.index("</header>")])
    assert "majority class department 0.612 0.599 0.700 " in head, head


def test_shareable_page_has_four_significant_digits_and_no_code_names(tmp_path):
    run = _with_zero_shot(tmp_path, paired=None)
    (run / "release" / "summary.json").write_text(json.dumps(
        {"method": "aug_pe", "samples": 6, "llm_calls": 321, "epsilon": 1.999916556125589}))
    (run / "stats.jsonl").write_text("".join(json.dumps(
        {"iteration": t, "kept": 6, "candidates": 18, "vote_mass": 20.123456,
         "noise_sigma": 1.879826556456524}) + "\n" for t in (1, 2)))
    text = _visible(write_report(run).read_text(encoding="utf-8"))
    for number in re.findall(r"\d+\.\d+", text):
        digits = number.replace(".", "").lstrip("0")
        assert len(digits) <= 4, number
    assert "1.879826556456524" not in text and "1.88" in text
    # no code name: release/*.json file names and the run id aside
    words = set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", re.sub(r"\S+\.jsonl?\b", "", text)))
    assert not words, words
    assert "noise multiplier" in text and "language-model calls" in text


def test_sample_table_shows_every_label(tmp_path):
    run = _evaluated_run(tmp_path, SEEDED)
    rows = [{"text": f"sample {i} of {lab}", "labels": {"department": lab}}
            for i, lab in enumerate(["A"] * 8 + ["B"] * 8 + ["C"])]
    _write_jsonl(run / "release" / "synthetic.jsonl", rows)
    page = _visible(write_report(run).read_text(encoding="utf-8"))
    samples = page[page.index("Sample synthetic texts"):]
    for lab in ("A", "B", "C"):
        assert f"department = {lab}" in samples
    assert "sample 0 of A" in samples and "sample 1 of A" in samples
    assert "sample 2 of A" not in samples  # two per label


def test_a_release_cut_mid_sentence_is_said(tmp_path):
    run = _evaluated_run(tmp_path, SEEDED)
    rows = [{"text": f"Sample {i} ends here." if i % 2 else f"Sample {i} runs on and",
             "labels": {"department": "A"}} for i in range(10)]
    _write_jsonl(run / "release" / "synthetic.jsonl", rows)
    page = _visible(write_report(run).read_text(encoding="utf-8"))
    assert "50 % of the released texts stop mid-sentence" in page
    _write_jsonl(run / "release" / "synthetic.jsonl", rows[1::2] + rows[:1])
    assert "cut-caveat" not in write_report(run).read_text(encoding="utf-8")  # 1 in 6


def test_most_generations_filtered_is_said(tmp_path):
    run = _evaluated_run(tmp_path, SEEDED)
    stats = [{"iteration": t, "kept": 6, "candidates": 18, "generated": 60,
              "filtered_share": share} for t, share in ((1, 0.2), (2, 0.7))]
    (run / "stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stats))
    page = write_report(run).read_text(encoding="utf-8")
    assert 'alt="generated texts filtered out as off-task"' in page
    assert "the filter dropped 70 % of iteration 2's generations (1 of 2 iterations" in \
        _visible(page)
    (run / "stats.jsonl").write_text(json.dumps({**stats[0], "iteration": 2}) + "\n")
    assert "filtered-caveat" not in write_report(run).read_text(encoding="utf-8")


def test_both_pages_draw_each_curve_once_and_the_same(tmp_path, fake, monkeypatch):
    """write_report's shareable and operator pages show the same per-iteration curves: each is
    drawn once for both (the rows are the key), and a page drawn afresh holds the same bytes."""
    import dpsynth.eval.report as report

    drawn: list[str] = []
    kept = report.plot_kept

    def plot_kept(rows):
        drawn.append("kept")
        return kept(rows)

    monkeypatch.setattr(report, "plot_kept", plot_kept)
    monkeypatch.setattr(report, "_CURVES", {})
    shareable = write_report(fake["run"], tmp_path / "report.html").read_text(encoding="utf-8")
    assert drawn == ["kept"]  # one drawing for both pages
    report._CURVES.clear()
    again = write_report(fake["run"], tmp_path / "again.html").read_text(encoding="utf-8")
    assert drawn == ["kept", "kept"] and again == shareable  # the cache changes no byte
