"""WASP, SecPE and zero-shot runs on the real offline models, and the methods' pure parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpsynth.api import run_generation
from dpsynth.config import ConfigError
from dpsynth.methods.wasp import generator_weights, round_sizes

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _config(tmp_path: Path, name: str, **changes) -> Path:
    raw = yaml.safe_load((REPO / "examples" / name).read_text())
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    path = tmp_path / f"cfg-{name}"
    path.write_text(yaml.safe_dump(raw))
    return path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_generator_weights_follow_votes():
    near = np.array([5.0, 4.0, 0.0, -1.0, 0.0, 0.0])
    sources = np.array([0, 0, 1, 1, 1, 1])
    w = generator_weights(near, sources, 2, temperature=1.0)
    assert w.sum() == pytest.approx(1.0) and w[0] > 0.9
    flat = generator_weights(np.ones(6), sources, 2, temperature=1.0)
    np.testing.assert_allclose(flat, [0.5, 0.5])  # equal quality per sample -> equal weights
    # a generator with no samples gets no weight
    assert generator_weights(np.ones(4), np.zeros(4, dtype=int), 2, 1.0)[1] == 0


def test_round_sizes():
    sizes = round_sizes(np.array([7, 3]), 3)
    assert sizes.shape == (3, 2) and sizes.sum(axis=0).tolist() == [7, 3]


def _fakes(n: int = 1):
    from fakes import FakeEmbedder, FakeGenerator  # tests/ is on sys.path

    return {"generators": [FakeGenerator(f"g{i}", seed=i) for i in range(n)],
            "embedder": FakeEmbedder()}


def test_wasp_generates_its_last_round_and_releases_the_configured_samples(tmp_path):
    """Rounds 0..T are all written (round T after the last vote): synthesis.samples rows."""
    cfg = _config(tmp_path, "tiny-wasp.yaml", **{"synthesis.samples": 24,
                                                 "synthesis.iterations": 2})
    run = run_generation(cfg, tmp_path / "wasp", progress=False, **_fakes(2))
    rows = _jsonl(run / "release" / "synthetic.jsonl")
    assert len(rows) == 24
    assert len(_jsonl(run / "release" / "iterations" / "iter2.jsonl")) == 24
    assert len(_jsonl(run / "stats.jsonl")) == 2  # T = 2 private votes


def test_secpe_privacy_json_has_no_private_counts(tmp_path):
    """The exact split goes to private/diagnostics.jsonl (0600), not to release/privacy.json."""
    cfg = _config(tmp_path, "tiny-secpe.yaml", **{"secpe.discretization": 1e-2})  # faster
    run = run_generation(cfg, tmp_path / "secpe", progress=False, **_fakes())
    text = (run / "release" / "privacy.json").read_text()
    sp = json.loads(text)["secret_protection"]
    assert not {"split", "per_type"} & set(sp)
    assert "private_records" not in text and "public_records" not in text
    assert sp["summary"].startswith("(p=0.0001, r=0.001)")
    assert sp["secret_definitions"] == [{"kind": "random_words", "name": None}]
    diag = run / "private" / "diagnostics.jsonl"
    assert diag.stat().st_mode & 0o777 == 0o600
    (split,) = [d for d in _jsonl(diag) if d["kind"] == "secpe_split"]
    assert split["private_records"] > 0 and split["private_records"] + split[
        "public_records"] == 150
    assert "private_records" not in (run / "log.txt").read_text()


def test_secpe_no_protection_asked_says_so(tmp_path):
    """r = min(1, p r/p) = 1 with secrets present: 'no protection asked', not 'no secret'."""
    cfg = _config(tmp_path, "tiny-secpe.yaml", **{"secpe.r_over_p": 1e5,
                                                  "synthesis.iterations": 1})
    run = run_generation(cfg, tmp_path / "secpe", progress=False, **_fakes())
    sp = json.loads((run / "release" / "privacy.json").read_text())["secret_protection"]
    assert "noise_sigma" not in sp and sp["r"] == 1.0  # data-dependent: diagnostics only
    assert sp["summary"].startswith("no protection asked")
    assert "no secret found" not in sp["summary"]
    (noise,) = [d for d in _jsonl(run / "private" / "diagnostics.jsonl")
                if d["kind"] == "secpe_split"]
    assert noise["noise_sigma"] == 0


# The real-model runs below are the tiny examples with fewer samples and shorter texts: what
# they prove is the method's path on the real generators, not the texts' quality. With fewer
# tokens a text would fall under the length band's lower edge (16 words on the demo corpus,
# dpsynth.evolution.lengths) and be refused and generated again, so the band is declared (a
# public value, synthesis.min_words / max_words) where the method has one.
SHORT = {"synthesis.min_words": 4, "synthesis.max_words": 12}


def _short(*models: str) -> dict:
    return {"generators": [{"model": m, "max_new_tokens": 16} for m in models]}


@pytest.mark.models
def test_wasp_two_generators_end_to_end(tmp_path):
    cfg = _config(tmp_path, "tiny-wasp.yaml", **{"synthesis.samples": 12, **SHORT,
                                                 **_short("smollm2", "gemma3")})
    run = run_generation(cfg, tmp_path / "wasp", progress=False)
    rows = _jsonl(run / "release" / "synthetic.jsonl")
    assert 8 <= len(rows) <= 12  # accumulated over 3 rounds (failures dropped)
    assert {r["generator"] for r in rows} <= {"smollm2", "gemma3"}
    stats = _jsonl(run / "stats.jsonl")
    assert len(stats) == 2
    for s in stats:
        w = s["generator_weights"]
        assert set(w) == {"smollm2", "gemma3"} and sum(w.values()) == pytest.approx(1, abs=1e-3)
        assert set(s["generator_vote_share"]) == {"smollm2", "gemma3"}
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["topq_sensitivity"] == pytest.approx(np.sqrt(8 / 3 * (1 - 4.0 ** -4)))
    assert privacy["epsilon"] <= 4.0 + 1e-6
    names = {m.get("name") for m in privacy["mechanisms"]}
    assert "topq_votes" in names


@pytest.mark.models
def test_secpe_random_word_secrets_end_to_end(tmp_path):
    # discretization: a coarser grid of the (p, r) accountant, pessimistic at any grid
    cfg = _config(tmp_path, "tiny-secpe.yaml", **{"synthesis.samples": 6,
                                                  "secpe.discretization": 1e-2, **SHORT,
                                                  **_short("smollm2")})
    run = run_generation(cfg, tmp_path / "secpe", progress=False)
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    sp = privacy["secret_protection"]
    assert privacy["epsilon"] is None and privacy["classical_dp"]["holds"] is False
    assert sp["r"] == pytest.approx(1e-3) and "noise_sigma" not in sp
    assert privacy["noise_multiplier"] is None
    assert all(set(m) == {"name", "count"} for m in privacy["mechanisms"])
    (diag,) = [d for d in _jsonl(run / "private" / "diagnostics.jsonl")
               if d["kind"] == "secpe_split"]
    assert diag["noise_sigma"] > 0
    assert "split" not in sp  # exact counts live in private/diagnostics.jsonl only
    text = (run / "release" / "privacy.json").read_text()
    rows = _jsonl(run / "release" / "synthetic.jsonl")
    assert 1 <= len(rows) <= 6
    stats = _jsonl(run / "stats.jsonl")
    assert len(stats) == 2 and all(s["representatives"] >= 6 for s in stats)
    assert "iter1/representatives" in (run / "private" / "releases" / "releases.jsonl").read_text()
    assert text


def test_secpe_secret_matching_every_record_is_refused(tmp_path):
    cfg = _config(tmp_path, "tiny-secpe.yaml", **{"secpe.secrets": [
        {"kind": "regex", "name": "email", "pattern": r"[\w.+-]+@[\w-]+\.[\w.]+"}]})
    with pytest.raises(ConfigError, match="every"):
        run_generation(cfg, tmp_path / "run", progress=False)


@pytest.mark.models
def test_zero_shot_spends_nothing(tmp_path):
    cfg = _config(tmp_path, "tiny-aug-pe.yaml", method="zero_shot",
                  **{"privacy.epsilon": 0, "synthesis.samples": 6, **SHORT,
                     **_short("smollm2")})
    run = run_generation(cfg, tmp_path / "zs", progress=False)
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["epsilon"] == 0 and privacy["mechanisms"] == []
    assert not (run / "private" / "releases" / "releases.jsonl").exists() or \
        (run / "private" / "releases" / "releases.jsonl").read_text().strip() == ""
    assert len(_jsonl(run / "release" / "synthetic.jsonl")) >= 3


@pytest.mark.models
def test_aug_pe_lookahead_and_user_level(tmp_path):
    """Lookahead embeddings (mean of variations) and user-level votes in one small run."""
    cfg = _config(tmp_path, "tiny-aug-pe.yaml",
                  **{"synthesis.lookahead": 1, "synthesis.iterations": 1,
                     "synthesis.samples": 6, "data.labels": ["urgency"],
                     "prompts.label_template": "Its urgency is {urgency}.",
                     "data.user": "patient_id", "privacy.unit": "user", **SHORT,
                     **_short("smollm2")})
    run = run_generation(cfg, tmp_path / "look", progress=False)
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["unit"] == "user" and privacy["epsilon"] <= 4.0 + 1e-6
    summary = json.loads((run / "release" / "summary.json").read_text())
    # 6 x 2 initial generations, then one lookahead variation per surviving candidate (and no
    # variation step after the last iteration)
    assert 12 < summary["requested"] <= 24
    assert 1 <= len(_jsonl(run / "release" / "synthetic.jsonl")) <= 6
