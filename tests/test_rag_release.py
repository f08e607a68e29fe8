"""DP-SynRAG and DP-Synth releases with a deterministic fake generator and embedder (no model):
nothing exact about the private data in release/, stats.jsonl or log.txt (it goes to
private/diagnostics.jsonl); a public vocabulary only; the stated epsilon covers every token
that can actually be drawn (docs/methods.md §4, §6)."""

from __future__ import annotations

import hashlib
import json
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.config import ConfigError, load_config
from dpsynth.diagnostics import append_diagnostic, read_diagnostics
from dpsynth.privacy import Accountant, event_from_dict

EXAMPLE = Path(__file__).parents[1] / "examples" / "tiny-synrag.yaml"


def _seed(*parts: object) -> int:
    h = hashlib.sha256("\x00".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big")


class FakeStepper:
    """Next-token logits for a batch of prompts: a hash of prompt and tokens so far."""

    def __init__(self, gen: FakeGen, prompts: list[str], shared_prefix: str = "") -> None:
        self.gen = gen
        self.prompts = [shared_prefix + p for p in prompts]
        self.tokens: list[int] = []

    def logits(self) -> np.ndarray:
        return np.stack([self.gen.row(p, self.tokens) for p in self.prompts])

    def advance(self, token_id: int) -> None:
        self.tokens.append(int(token_id))

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeStepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FakeGen:
    """Implements what DP-SynRAG needs of a local generator (Generator protocol + steppers)."""

    name = "fake:gen"
    supports_chat = False
    vocab_size = 64
    eos_token_id = 0
    eos_token_ids = (0,)
    tokenizer = None

    def encode(self, text: str) -> list[int]:
        return [1 + _seed(w) % (self.vocab_size - 1) for w in text.split()]

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{int(i)}" for i in ids)

    def row(self, prompt: str, tokens: list[int]) -> np.ndarray:
        r = np.random.default_rng(_seed(prompt, tokens)).normal(0.0, 3.0, self.vocab_size)
        r[0] -= 6.0  # EOS is rare
        return r

    def open_stepper(self, prompts: list[str], shared_prefix: str = "") -> FakeStepper:
        return FakeStepper(self, list(prompts), shared_prefix)

    def generate(self, requests, *, progress: bool = True) -> list[str]:
        return ["YES" for _ in requests]


class FakeEmbedder:
    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def embed(self, texts, progress: bool = False) -> np.ndarray:
        out = np.stack([np.random.default_rng(_seed(t)).normal(size=self.dim) for t in texts]
                       ) if len(texts) else np.zeros((0, self.dim))
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def _overrides(**synrag) -> dict:
    return {
        "data.demo_rows": 40,
        "privacy.epsilon": 10.0,
        "privacy.delta": 1e-3,
        "synrag": {"vocabulary": "demo", "keyword_extractor": "vocabulary",
                   "keywords_per_doc": 4, "clusters": 3, "overlap": 2, "target_size": 6,
                   "tokens": 8, "max_doc_tokens": 96, "rho_hist": 0.5,
                   "min_noisy_count": 2.0, "self_filter": False, "eps_theta": 2.0, **synrag},
    }


@pytest.fixture(autouse=True)
def _ledger(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _store_events(path: Path) -> dict[str, list]:
    """The events of a keyed store, grouped by the first two parts of the key."""
    groups: dict[str, list] = {}
    for line in (path / "releases.jsonl").read_text().splitlines():
        rec = json.loads(line)
        unit = "/".join(rec["key"].split("/")[:2])
        groups.setdefault(unit, []).extend(event_from_dict(d) for d in rec["events"])
    return groups


def _epsilon(events: list, delta: float) -> float:
    acc = Accountant("zcdp")
    acc.extend(events)
    return acc.epsilon(delta)


def test_append_diagnostic_is_private(tmp_path) -> None:
    from dpsynth.run_folder import RunDir

    run = RunDir(tmp_path / "r")
    run.create("{}", "dp_synrag")
    path = append_diagnostic(run, {"cluster": 1, "members": 0})
    append_diagnostic(run, {"documents": 7})
    assert path == run.private / "diagnostics.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    rows = read_diagnostics(run)
    assert [r.get("members") for r in rows] == [0, None] and rows[1]["documents"] == 7


def test_release_holds_no_exact_fact(tmp_path) -> None:
    from dpsynth.api import build_kb

    # k = 50 > 40 documents: every cluster has fewer than k; seeds down to pure noise: many
    # clusters are empty. Both facts are exact facts about the private data.
    over = _overrides(clusters=30, target_size=50, min_noisy_count=-1e9)
    messages: list[str] = []
    out = build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                   embedder=FakeEmbedder(), echo=messages.append)
    summary = json.loads((out / "release" / "summary.json").read_text())
    assert "documents" not in summary and "wall_seconds" not in summary
    assert summary["clusters"] == 30 and summary["epsilon"] <= 10.0 + 1e-6
    assert not any("empty" in w or "fewer than" in w for w in summary["warnings"])
    shared = [p for p in (out / "release").iterdir() if p.suffix in (".json", ".jsonl")]
    shared += [out / "stats.jsonl", out / "log.txt"]
    for p in shared:
        text = p.read_text()
        assert "is empty" not in text and "fewer than k" not in text, p.name
        assert "private documents" not in text and '"members"' not in text, p.name
    diag = out / "private" / "diagnostics.jsonl"
    assert stat.S_IMODE(diag.stat().st_mode) == 0o600
    rows = read_diagnostics(out)
    assert any(r.get("documents") == 40 for r in rows)
    text = " ".join(str(r.get("message", "")) for r in rows)
    assert "is empty" in text and "fewer than k" in text
    assert any("members" in r for r in rows) and any("wall_seconds" in r for r in rows)
    assert any(m.startswith("[private]") for m in messages)  # the operator still sees them


def test_vocabulary_from_private_data_is_refused(tmp_path) -> None:
    from dpsynth.api import build_kb

    data = tmp_path / "private.csv"
    data.write_text("text\nI have a rash\n")
    over = _overrides(vocabulary=str(data))
    over["data.path"] = str(data)
    with pytest.raises(ConfigError, match="PUBLIC"):
        build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                 embedder=FakeEmbedder())
    assert not (tmp_path / "run").exists()  # refused before anything is written
    inside = tmp_path / "run2" / "private" / "terms.txt"
    with pytest.raises(ConfigError, match="private"):
        build_kb(EXAMPLE, tmp_path / "run2", overrides=_overrides(vocabulary=str(inside)),
                 generator=FakeGen(), embedder=FakeEmbedder())


def test_dp_synth_shortcut_states_what_it_draws(tmp_path) -> None:
    """DP-Synth with public_shortcut: the per-subset cost actually recorded (subsets are
    disjoint: parallel composition, the worst subset counts) equals the stated epsilon."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from rag_baselines import build_dp_synth_kb  # research code, outside the package

    # threshold -1e9: the documents always "disagree", every step wants a private token
    cfg = load_config(EXAMPLE, _overrides(public_shortcut=True, svt_threshold=-1e9,
                                          svt_epsilon=0.2, tokens=12))
    out = build_dp_synth_kb(cfg, tmp_path / "ds", generator=FakeGen(), embedder=FakeEmbedder())
    stated = json.loads((out / "release" / "privacy.json").read_text())
    assert stated["epsilon"] <= 10.0 + 1e-6
    per_subset = _store_events(out / "private" / "subset-releases")
    assert len(per_subset) == 3
    actual = {k: _epsilon(v, 1e-3) for k, v in per_subset.items()}
    assert max(actual.values()) == pytest.approx(stated["epsilon"], rel=1e-6)
    assert all(e <= stated["epsilon"] * (1 + 1e-9) for e in actual.values())
    assert max(sum(1 for e in v if e.name == "private_prediction") for v in
               per_subset.values()) == 3  # m = T // 4 private tokens at most


def test_synrag_shortcut_clusters_within_theorem1(tmp_path) -> None:
    """Each cluster's recorded releases cost at most the per-cluster share charged by
    Theorem 1 (overlapping composition over L charges that share L times)."""
    from dpsynth.api import build_kb
    from dpsynth.methods.synrag.accounting import cluster_events
    from dpsynth.methods.synrag.config import parse_synrag

    over = _overrides(public_shortcut=True, svt_threshold=-1e9, svt_epsilon=0.2, tokens=12)
    out = build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                   embedder=FakeEmbedder())
    priv = json.loads((out / "release" / "privacy.json").read_text())
    scfg = parse_synrag(load_config(EXAMPLE, over))
    share = _epsilon(cluster_events(scfg, priv["clip"], 1), 1e-3)
    per_cluster = _store_events(out / "private" / "cluster-releases")
    assert per_cluster
    actual = [_epsilon(v, 1e-3) for v in per_cluster.values()]
    assert all(a <= share * (1 + 1e-9) for a in actual)
    assert max(actual) == pytest.approx(share, rel=1e-6)


def test_cluster_prompts_name_their_released_keyword(tmp_path) -> None:
    """``{keyword}`` in ``synrag.rephrase_instruction`` and ``synrag.lead`` is each cluster's
    released seed keyword: every released text opens with its cluster's lead."""
    from dpsynth.api import build_kb

    over = _overrides(rephrase_instruction="Rephrase this note about {keyword}.",
                      lead="About {keyword}:")
    out = build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                   embedder=FakeEmbedder())
    rows = [json.loads(x) for x in (out / "release" / "synthetic_all.jsonl")
            .read_text().splitlines() if x]
    stats = [json.loads(x) for x in (out / "stats.jsonl").read_text().splitlines() if x]
    keywords = [s["keyword"] for s in stats if s.get("stage") == "cluster"]
    assert len(rows) == len(keywords) == 3 and len(set(keywords)) == 3
    assert [r["text"].split(":")[0].lower() for r in rows] == [f"about {k}" for k in keywords]


def test_the_build_drops_garbled_passages_and_says_why(tmp_path) -> None:
    """The fake's passages are token codes: the build drops them as garbled and says how many
    and why, in the summary and the warnings (post-processing of the released texts)."""
    from dpsynth.api import build_kb

    over = _overrides() | {"privacy.noise": "seeded", "privacy.seed": 11}
    out = build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                   embedder=FakeEmbedder())
    summary = json.loads((out / "release" / "summary.json").read_text())
    rows = [json.loads(x) for x in (out / "release" / "synthetic_all.jsonl").read_text()
            .splitlines() if x.strip()]
    assert summary["garbled_dropped"] == {"non-words": len(rows)} and rows
    assert all(r["garbled"] == "non-words" and not r["kept"] for r in rows)
    assert any("as garbled: " in w for w in summary["warnings"])


@pytest.mark.parametrize("retrieve", [1, 2])
def test_ask_retrieves_what_the_build_says(tmp_path, retrieve: int) -> None:
    """``synrag.retrieve`` is stored with the index: `rag ask` without -k (and the service
    and Python API, which share the answerer) retrieve that many passages; -k overrides."""
    from dpsynth.api import build_kb
    from dpsynth.rag.answer import answer

    # a seeded build: with fresh noise a cluster may fall below the threshold and the KB hold
    # fewer passages than asked for
    # (the fake's passages are token codes, not text: the garbled filter is off here)
    over = _overrides(retrieve=retrieve) | {"privacy.noise": "seeded", "privacy.seed": 11,
                                            "synrag.drop_garbled": False}
    out = build_kb(EXAMPLE, tmp_path / "run", overrides=over, generator=FakeGen(),
                   embedder=FakeEmbedder())
    models = {"generator": FakeGen(), "embedder": FakeEmbedder()}
    result = answer("fever?", out, **models)
    assert len(result["passages"]) == retrieve
    # the sources are returned with their ids; the fake's answer names none of their words
    assert all(isinstance(p["id"], int) for p in result["passages"])
    assert result["supported"] is (not result["unsupported"])
    assert len(answer("fever?", out, 3, **models)["passages"]) == 3
