"""Readable defaults of the PE methods (issue 24, point 6): candidate sampling with a top-k
support on every engine, the same in every example, never reaching DP-SynRAG's private tokens;
label values that are codes shown to the generator in words."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpsynth.config import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    GeneratorConfig,
    parse_config,
)
from dpsynth.evolution.prompts import describe_labels, readable_label
from dpsynth.llm.base import GenerationRequest, SamplingParams
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv

EXAMPLES = Path(__file__).parents[1] / "examples"


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


class RecordingGenerator(FakeGenerator):
    """A fake that keeps the sampling parameters of every request it is sent."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.params: list[SamplingParams] = []

    def generate(self, requests: Any, **kw: Any) -> list[str]:
        self.params.extend(r.params for r in requests)
        return super().generate(requests, **kw)


def test_top_k_defaults_per_backend() -> None:
    local = GeneratorConfig()
    assert (local.temperature, local.top_p, local.sampling_top_k) == (
        DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEFAULT_TOP_K)
    assert DEFAULT_TOP_K > 0  # a truncated support by default on the local engines
    assert GeneratorConfig(top_k=0).sampling_top_k == 0  # the whole vocabulary, asked for
    served = GeneratorConfig(backend="openai", base_url="http://127.0.0.1:1/v1")
    assert served.sampling_top_k == 0  # unset: not sent (not an OpenAI field)
    assert GeneratorConfig(backend="openai", base_url="http://127.0.0.1:1/v1",
                           top_k=40).sampling_top_k == 40
    with pytest.raises(ValueError):
        GeneratorConfig(top_k=-1)


def test_openai_body_carries_top_k_only_when_set() -> None:
    from dpsynth.llm.openai_compat import OpenAIGenerator

    client = OpenAIGenerator(base_url="http://127.0.0.1:9/v1", model="m")
    for cfg, sent in [(GeneratorConfig(backend="openai", base_url="http://x/v1"), None),
                      (GeneratorConfig(backend="openai", base_url="http://x/v1", top_k=7), 7)]:
        params = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p,
                                top_k=cfg.sampling_top_k)
        _, body, _ = client._body(GenerationRequest("Hello", params))
        assert body.get("top_k") == sent


@pytest.mark.parametrize(("method", "over", "expect"), [
    ("aug_pe", {}, (DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEFAULT_TOP_K)),
    ("wasp", {}, (DEFAULT_TEMPERATURE, DEFAULT_TOP_P, DEFAULT_TOP_K)),
    ("aug_pe", {"temperature": 0.6, "top_p": 0.8, "top_k": 0}, (0.6, 0.8, 0)),
])
def test_every_request_of_a_run_carries_the_configured_sampling(
        tmp_path: Path, method: str, over: dict[str, Any], expect: tuple) -> None:
    from dpsynth.api import run_generation

    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)))
    cfg["generators"] = [{**g, **over} for g in cfg["generators"]]
    gens = [RecordingGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                   embedder=FakeEmbedder())
    params = [p for g in gens for p in g.params]
    assert params
    assert {(p.temperature, p.top_p, p.top_k) for p in params} == {expect}


def test_every_example_samples_with_the_defaults() -> None:
    """One setting everywhere: no example overrides the measured defaults."""
    examples = sorted(EXAMPLES.glob("*.yaml"))
    assert len(examples) >= 5
    for path in examples:
        cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(cfg, dict):
            continue
        for gen in cfg.get("generators") or []:
            for key in ("temperature", "top_p", "top_k"):
                assert key not in gen, f"{path.name}: generators sets {key}"


def test_synrag_private_tokens_never_see_the_candidate_sampling(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-SynRAG samples its private tokens from the full noisy softmax: the generator's
    temperature / top-p / top-k must change nothing in its release (same seeded noise)."""
    from dpsynth.api import build_kb
    from test_rag_release import EXAMPLE, FakeGen, _overrides
    from test_rag_release import FakeEmbedder as RagEmbedder

    class RecordingGen(FakeGen):
        def __init__(self) -> None:
            self.params: list[SamplingParams] = []

        def generate(self, requests: Any, *, progress: bool = True) -> list[str]:
            self.params.extend(r.params for r in requests)
            return super().generate(requests, progress=progress)

    texts = []
    for i, sampling in enumerate([{}, {"temperature": 0.2, "top_p": 0.3, "top_k": 2}]):
        over = {**_overrides(), "privacy.noise": "seeded", "privacy.seed": 11,
                "generators": [{"model": "smollm2", **sampling}]}
        gen = RecordingGen()
        # one ledger per run: the ledger refuses a second run with the same noise seed
        monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / f"ledger{i}.json"))
        out = build_kb(EXAMPLE, tmp_path / f"run{i}", overrides=over, generator=gen,
                       embedder=RagEmbedder(), echo=lambda _m: None)
        assert all(p.temperature == 0 and p.top_k == 0 and p.top_p == 1 for p in gen.params)
        texts.append(sorted(p.read_text() for p in (out / "release").glob("*.jsonl")))
    assert texts[0] and texts[0] == texts[1]
    assert "top_k" not in json.dumps(GeneratorConfig(top_k=3).spec())


@pytest.mark.parametrize(("value", "shown"), [
    ("card_arrival", "card arrival"),
    ("lost-or-stolen-card", "lost or stolen card"),
    ("topUpFailed", "top up failed"),
    ("sci.med", "sci med"),
    ("US_ZIP_code", "US ZIP code"),
    ("Refund_not_showing_up", "refund not showing up"),
    # kept: already words, numbers, versions and dates, all-capitals codes (need a description)
    ("Business Category: Arts & Entertainment", "Business Category: Arts & Entertainment"),
    ("Review Stars: 5.0", "Review Stars: 5.0"),
    ("3.0", "3.0"), ("v1.2", "v1.2"), ("2020-01", "2020-01"), ("ENTY", "ENTY"),
    ("billing", "billing"),
])
def test_readable_label(value: str, shown: str) -> None:
    assert readable_label(value) == shown


def test_a_description_still_wins_over_the_readable_form() -> None:
    from dpsynth.config import PromptConfig

    prompts = PromptConfig(label_template="{intent}.",
                           label_descriptions={"intent": {"card_arrival": "card delivery"}})
    assert describe_labels({"intent": "card_arrival"}, prompts) == "card delivery."
    assert describe_labels({"intent": "atm_support"}, prompts) == "atm support."


def test_every_prompt_of_a_wasp_run_shows_codes_in_words(tmp_path: Path) -> None:
    from dpsynth.api import run_generation

    codes = ["card_arrival", "lost_or_stolen_card"]
    path = tmp_path / "d.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["text", "label"])
        w.writeheader()
        for i in range(40):
            w.writerow({"text": f"customer {i:03d} asks where the card is {i % 7}",
                        "label": codes[i % 2]})
    cfg = pe_config("wasp", path)
    cfg["data"] = {"path": str(path), "text": "text", "labels": ["label"],
                   "label_values": {"label": codes}}
    gens = [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                   embedder=FakeEmbedder())
    prompts = [p for g in gens for p in g.prompts]
    assert prompts
    assert all("_" not in p.split("\n", 1)[0] for p in prompts)
    assert any("about card arrival" in p for p in prompts)
    assert any("about lost or stolen card" in p for p in prompts)
