"""prompts.label_descriptions: public descriptions of label values that are codes, shown to
the generator in every prompt in place of the code (issue 14, point 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dpsynth.config import ConfigError, PromptConfig, parse_config
from dpsynth.evolution.prompts import describe_labels
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv

DESCRIBED = {"billing": "a question about a bill or a payment",
             "clinical": "a question about symptoms or a treatment",
             "scheduling": "a request to book or move a visit"}


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def test_a_described_value_is_shown_as_its_description() -> None:
    prompts = PromptConfig(label_template="It is {label1}; {label2}.",
                           label_descriptions={"label1": {"ENTY": "a question about an entity"}})
    assert describe_labels({"label1": "ENTY", "label2": "3"}, prompts) == (
        "It is a question about an entity; 3.")  # no description for label2: the value
    default = PromptConfig(label_descriptions={"topic": {"LOC": "a question about a place"}})
    assert describe_labels({"topic": "LOC"}, default) == "Its topic is a question about a place."


@pytest.mark.parametrize("method", ["aug_pe", "wasp"])
def test_every_prompt_of_a_run_carries_the_description_not_the_code(tmp_path: Path,
                                                                    method: str) -> None:
    from dpsynth.api import run_generation

    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"prompts.label_descriptions": {"label": DESCRIBED},
                       "synthesis.variation": "mixed"})
    gens = [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                   embedder=FakeEmbedder())
    prompts = [p for g in gens for p in g.prompts]
    assert prompts
    for prompt in prompts:
        assert "about a " in prompt and any(d in prompt for d in DESCRIBED.values())
        assert not any(f"about {code}" in prompt for code in DESCRIBED), prompt


@pytest.mark.parametrize(("descriptions", "message"), [
    ({"topic": {"x": "y"}}, r"label_descriptions\.topic: 'topic' is not among data\.labels"),
    ({"label": {"billnig": "a bill"}}, r"'billnig' is not a declared value of label"),
    ({"label": {"billing": "  "}}, r"the description of 'billing' is empty"),
])
def test_a_bad_description_is_refused_before_anything_runs(tmp_path: Path, descriptions: Any,
                                                           message: str) -> None:
    from dpsynth.api import run_generation

    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20)),
                    **{"prompts.label_descriptions": descriptions})
    with pytest.raises(ConfigError, match=message):
        run_generation(parse_config(cfg), tmp_path / "run", progress=False,
                       generators=[FakeGenerator("fake-g0")], embedder=FakeEmbedder())
    assert not (tmp_path / "run" / "release").exists()


def test_a_descriptions_file_beside_the_config_is_read_and_kept_inline(tmp_path: Path) -> None:
    import yaml

    from dpsynth.config import load_config

    (tmp_path / "descriptions.yaml").write_text(yaml.safe_dump({"label": DESCRIBED}))
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20)),
                    **{"prompts.label_descriptions": "descriptions.yaml"})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    loaded = load_config(tmp_path / "run.yaml")
    assert loaded.prompts.label_descriptions == {"label": DESCRIBED}  # inline from now on
    assert describe_labels({"label": "billing"}, loaded.prompts) == (
        "about a question about a bill or a payment")


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot be read"),
    (b"label: [a, b]\n", r"expected a mapping \{column: \{value: description\}\}"),
    (b"label:\n  billing: \xff\n", "not valid UTF-8 YAML/JSON"),
])
def test_a_bad_descriptions_file_is_named(tmp_path: Path, content: bytes | None,
                                          message: str) -> None:
    import yaml

    from dpsynth.config import load_config

    if content is not None:
        (tmp_path / "descriptions.yaml").write_bytes(content)
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20)),
                    **{"prompts.label_descriptions": "descriptions.yaml"})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=rf"descriptions\.yaml: {message}"):
        load_config(tmp_path / "run.yaml")


@pytest.mark.parametrize("strip", [True, False])
def test_strip_echoes_removes_the_repeated_request_from_every_kept_text(tmp_path: Path,
                                                                       strip: bool) -> None:
    """synthesis.strip_echoes: a generation that repeats its instruction's request line has
    those sentences removed before it is kept (the lever of issue 14, point 5)."""
    import json

    from dpsynth.api import run_generation

    echo = "Keep it friendly."  # a sentence of every instruction's request line
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"synthesis.strip_echoes": strip,
                       "prompts.label_template": f"It is about {{label}}. {echo}"})
    gens = [FakeGenerator("fake-g0", transform=lambda text: f"{echo} {text}")]
    run = run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                         embedder=FakeEmbedder())
    rows = [json.loads(line) for line in
            (Path(run) / "release" / "synthetic.jsonl").read_text().splitlines()]
    assert rows
    assert all((echo in r["text"]) is not strip for r in rows)


@pytest.mark.parametrize("drop", [True, False])
def test_drop_off_task_retries_commentary_on_the_prompt(tmp_path: Path, drop: bool) -> None:
    """synthesis.drop_off_task: a generation that comments on the prompt ("the good examples
    ...") is dropped and asked again, so none reaches the release; off, they are kept."""
    import json

    from dpsynth.api import run_generation

    remark = "The good examples are more specific than the bad ones."
    cfg = pe_config("wasp", write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"synthesis.drop_off_task": drop, "synthesis.retries": 6})
    gens = [FakeGenerator("fake-g0", transform=lambda text: remark if len(text) % 3 == 0
                          else text)]
    run = run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                         embedder=FakeEmbedder())
    rows = [json.loads(line) for line in
            (Path(run) / "release" / "synthetic.jsonl").read_text().splitlines()]
    summary = json.loads((Path(run) / "release" / "summary.json").read_text())
    assert rows
    assert any(r["text"] == remark for r in rows) is not drop
    # kept, the remark is still retried where it repeats within one call (duplicates are
    # refused either way); WASP's rounds are separate calls
    assert summary["retried"] > 0
