"""prompts.writer and WASP's contrastive layout (issue 24, point 6): a public 'You are
{writer}.' opens every prompt when set (a chat model's system message, a plain model's first
sentence) and nothing changes when it is not; the contrastive prompt leads with the request;
benchmarks/voice.py's own-voice rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dpsynth.config import parse_config
from dpsynth.evolution.prompts import (
    ANSWER_CUE,
    contrastive_instruction,
    render,
    with_writer,
    zero_shot_instruction,
)
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from voice import own_voice, own_voice_share  # noqa: E402  (benchmark code, outside the package)


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def test_with_writer_opens_the_instruction_only_when_set() -> None:
    instr = zero_shot_instruction("a short question you ask your bank", "It is about fees.")
    assert with_writer(instr, "") == instr
    assert with_writer(instr, " a customer of an online bank. ") == (
        "You are a customer of an online bank. Write a short question you ask your bank. "
        "It is about fees. Reply with the text only.")


def test_a_chat_model_gets_the_writer_as_its_system_message() -> None:
    instr = zero_shot_instruction("a short question you ask your bank", "It is about fees.")
    user = {"role": "user", "content": instr}
    assert render(instr, True, " a customer of an online bank. ") == (
        {"role": "system", "content": "You are a customer of an online bank."}, user)
    assert render(instr, True, "") == (user,)  # the model's own default system prompt
    assert render(instr, False, "a customer") == with_writer(instr, "a customer") + ANSWER_CUE
    assert render(instr, False, "") == instr + ANSWER_CUE


def test_contrastive_prompt_leads_with_the_request_and_lists_both_sets() -> None:
    got = contrastive_instruction("a short review", "Its stars is 5.", ["Great tacos."],
                                  ["Buy now!!", "asdf"])
    assert got.startswith("Write a short review. Its stars is 5.\n\n")
    bad, good = got.index("Not like these"), got.index("Like these")
    assert bad < got.index("- Buy now!!") < got.index("- asdf") < good < got.index(
        "- Great tacos.")
    assert "example" not in got.lower() and got.endswith("Reply with your new text only.")


@pytest.mark.parametrize("method", ["aug_pe", "wasp"])
@pytest.mark.parametrize("writer", ["", "a patient of the clinic"])
def test_every_prompt_of_a_run_opens_with_the_writer(tmp_path: Path, method: str,
                                                     writer: str) -> None:
    from dpsynth.api import run_generation

    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"prompts.writer": writer, "synthesis.variation": "mixed"})
    gens = [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                   embedder=FakeEmbedder())
    prompts = [p for g in gens for p in g.prompts]
    assert prompts
    opened = ["You are a patient of the clinic. " in p for p in prompts]
    assert all(opened) if writer else not any(opened)


@pytest.mark.parametrize("method", ["aug_pe", "wasp"])
def test_every_chat_prompt_of_a_run_has_the_writer_as_system(tmp_path: Path,
                                                             method: str) -> None:
    from dpsynth.api import run_generation

    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"prompts.writer": "a patient of the clinic",
                       "synthesis.variation": "mixed", "synthesis.strip_echoes": True})
    for g in cfg["generators"]:
        g["chat"] = True
    gens = [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    run_generation(parse_config(cfg), tmp_path / "run", progress=False, generators=gens,
                   embedder=FakeEmbedder())
    prompts = [p for g in gens for p in g.prompts]  # the fakes render chat as System: / User:
    assert prompts and all(p.startswith("System: You are a patient of the clinic.\n\nUser: ")
                           for p in prompts)
    assert not any("You are a patient" in p.split("User: ", 1)[1] for p in prompts)


@pytest.mark.parametrize(("text", "own"), [
    ("I am still waiting on my card?", True),
    ("How long does a transfer take?", True),            # a question, no pronoun
    ("Can you refund the fee you charged me?", True),
    ("This customer wants to withdraw $21.", False),      # about a customer
    ("A customer wants you to verify my identity.", False),
    ("The user is asking about a refund.", False),
    ("Here are better examples of questions: 1. ...", False),  # comments on the prompt
    ("The customer's intent is card arrival.", False),
    ("Here's a rewritten version with clearer grammar: my card is late.", False),
    ("Welcome to your bank! How can I assist you today?", False),  # the bank's voice
    ("Dear [Customer Name], your card is on its way.", False),
    ("Card arrival tracking number.", False),              # neither person nor question
    ("", False),
])
def test_own_voice(text: str, own: bool) -> None:
    assert own_voice(text) is own


def test_own_voice_share() -> None:
    assert own_voice_share([]) == 0.0
    assert own_voice_share(["Where is my card?", "This customer wants a card."]) == 0.5
