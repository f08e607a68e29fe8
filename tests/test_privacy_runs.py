"""The privacy core on the production run path (api.run_generation with the fast fake models):
secure noise by default, a private per-run seed, the keyed dataset fingerprint, the ledger's
refusal of a reused (dataset, seed) pair, the sticky dataset budget and non-DP runs recorded."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from dpsynth.api import run_generation
from dpsynth.config import load_config
from dpsynth.privacy import BudgetLedger, BudgetRefusedError
from dpsynth.run_dataset import load_run_data
from dpsynth.run_folder import RunDir
from fakes import fake_models  # tests/ is on sys.path (rootdir conftest)

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "examples" / "tiny-aug-pe.yaml"


def _config(tmp_path: Path, name: str = "config.yaml", **changes: object) -> Path:
    raw = yaml.safe_load(TINY.read_text())
    raw.setdefault("privacy", {})
    raw["privacy"].pop("noise", None)
    raw["privacy"].pop("seed", None)
    raw["synthesis"]["iterations"] = 1
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _run(config: Path, out: Path) -> Path:
    gens, emb = fake_models(1)
    return run_generation(config, out, progress=False, generators=gens, embedder=emb)


@pytest.fixture()
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger" / "ledger.json"
    monkeypatch.setenv("DPSYNTH_LEDGER", str(path))
    return path


def _raw_digest(config: Path, run: Path) -> str:
    return load_run_data(load_config(config), RunDir(run)).fingerprint()


def test_default_run_uses_secure_noise_and_a_private_seed(tmp_path: Path, ledger: Path) -> None:
    run = _run(_config(tmp_path), tmp_path / "run")
    statement = json.loads((run / "release" / "privacy.json").read_text())
    assert statement["noise"] == "secure"
    assert "cannot be recomputed" in statement["noise_note"]
    seed_file = run / "private" / "seed"
    assert stat.S_IMODE(seed_file.stat().st_mode) == 0o600
    seed = seed_file.read_text().strip()
    assert int(seed) >= 0
    # the drawn seed is private: not in the stored config, run.json, the log or release/
    assert yaml.safe_load((run / "config.yaml").read_text())["privacy"]["seed"] is None
    public = [run / "config.yaml", run / "run.json", run / "log.txt", run / "stats.jsonl"]
    public += list((run / "release").iterdir())
    for path in public:
        if path.is_file():
            assert seed not in path.read_text(), path


def test_seeded_statement_says_the_seed_must_stay_secret(tmp_path: Path, ledger: Path) -> None:
    run = _run(_config(tmp_path, **{"privacy.noise": "seeded"}), tmp_path / "run")
    statement = json.loads((run / "release" / "privacy.json").read_text())
    assert statement["noise"] == "seeded"
    assert "only while the seed stays secret" in statement["noise_note"]
    assert (run / "private" / "seed").is_file()


def test_dataset_fingerprint_is_keyed(tmp_path: Path, ledger: Path) -> None:
    config = _config(tmp_path)
    run = _run(config, tmp_path / "run")
    stored = json.loads((run / "run.json").read_text())["dataset_fingerprint"]
    raw = _raw_digest(config, run)
    # nobody can test a guessed dataset against run.json: it is not the plain digest
    assert stored != raw and stored != hashlib.sha256(raw.encode()).hexdigest()
    assert raw not in (run / "run.json").read_text() and raw not in ledger.read_text()
    assert stored == BudgetLedger(ledger).dataset_id(raw)  # same data -> same ledger entry
    key = ledger.with_name(ledger.name + ".key")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    other = BudgetLedger(tmp_path / "other" / "ledger.json")
    assert other.dataset_id(raw) != stored  # another key, another name
    (entry,) = BudgetLedger(ledger).entries()
    assert entry["records"] == stored
    assert json.loads((run / "run.json").read_text())["sources"] == [entry["source"]]


def test_ledger_refuses_a_reused_seed_on_the_same_dataset(tmp_path: Path, ledger: Path) -> None:
    config = _config(tmp_path, **{"privacy.noise": "seeded", "privacy.seed": 7,
                                  "privacy.epsilon": 1.0})
    _run(config, tmp_path / "run1")
    with pytest.raises(BudgetRefusedError, match="identical noise"):
        _run(config, tmp_path / "run2")
    # without a configured seed a fresh random one is drawn: accepted
    _run(_config(tmp_path, "c2.yaml", **{"privacy.noise": "seeded", "privacy.epsilon": 1.0}),
         tmp_path / "run3")
    assert len(BudgetLedger(ledger).entries()) == 2


def test_dataset_budget_sticks_until_budget_set(tmp_path: Path, ledger: Path) -> None:
    from dpsynth.cli import app

    capped = _config(tmp_path, "capped.yaml", **{"privacy.total_epsilon": 6.0})
    uncapped = _config(tmp_path, "uncapped.yaml")
    first = _run(capped, tmp_path / "run1")
    # the cap is not repeated in the second config: it still applies (old code reached 8)
    with pytest.raises(BudgetRefusedError, match="the source's total is epsilon=6"):
        _run(uncapped, tmp_path / "run2")
    # a config cannot loosen the stored cap either
    with pytest.raises(BudgetRefusedError):
        _run(_config(tmp_path, "loose.yaml", **{"privacy.total_epsilon": 100.0}),
             tmp_path / "run3")
    (source,) = json.loads((first / "run.json").read_text())["sources"]
    res = CliRunner().invoke(
        app, ["budget", "set", "--source", source, "--total-epsilon", "10", "--ledger",
              str(ledger), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sources"][0]["total_epsilon"] == 10.0
    _run(uncapped, tmp_path / "run4")
    eps, _ = BudgetLedger(ledger).spent(source)
    assert 7.9 < eps <= 8.0 + 1e-9


def test_epsilon_inf_run_is_recorded_without_guarantee(tmp_path: Path, ledger: Path) -> None:
    run = _run(_config(tmp_path, **{"privacy.epsilon": float("inf"), "privacy.noise": "seeded"}),
               tmp_path / "run")
    (entry,) = BudgetLedger(ledger).entries()
    assert entry["guarantee"] == "none" and entry["status"] == "recorded"
    assert entry["records"] == json.loads((run / "run.json").read_text())["dataset_fingerprint"]
    statement = json.loads((run / "release" / "privacy.json").read_text())
    assert statement["noise"] == "none" and "no differential-privacy" in statement["noise_note"]
