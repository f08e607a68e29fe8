"""The public checks on RAG answers and synthetic passages (dpsynth.rag.grounding)."""

from __future__ import annotations

import pytest

from dpsynth.rag.answer import Answerer
from dpsynth.rag.grounding import content_words, garbled_reason, unsupported_terms

SOURCES = ["The patient reports fever, cough and tiredness. Diagnosis: common cold.",
           "Severe headache on one side with nausea. Diagnosis: migraine."]


def test_an_answer_naming_what_no_source_holds_is_unsupported() -> None:
    assert unsupported_terms("You likely have influenza.", SOURCES, "What do I have?") == [
        "influenza"]
    assert unsupported_terms("It is probably a common cold.", SOURCES) == []
    assert unsupported_terms("Migraines cause nausea.", SOURCES) == []  # 'migrai' stems
    assert content_words("It is likely the flu, a viral infection") == ["viral", "infection"]


@pytest.mark.parametrize(("text", "why"), [
    ("cold cold cold cold cold cold cold cold cold", "loop"),
    ("## 12 34 %% ** 55 -- ok", "non-words"),
    ("fever", "too short"),
    ("A patient with a migraine reports a severe headache and nausea.", None),
])
def test_garbled_passages_are_named_by_reason(text: str, why: str | None) -> None:
    assert garbled_reason(text) == why


class _Echo:
    """A generator that answers with a fixed text."""

    supports_chat = True
    name = "echo"

    def __init__(self, text: str) -> None:
        self.text = text

    def generate(self, requests, progress=False):  # noqa: ANN001, ANN201
        return [self.text for _ in requests]


class _KB:
    passages = [{"id": 7, "text": SOURCES[0]}, {"id": 9, "text": SOURCES[1]}]

    def __len__(self) -> int:
        return 2

    def search(self, emb, k):  # noqa: ANN001, ANN201
        return [[(0, 0.9), (1, 0.5)][:k] for _ in emb]


class _Emb:
    def embed(self, texts):  # noqa: ANN001, ANN201
        return [[0.0] for _ in texts]


def test_an_answer_carries_its_sources_and_the_flag() -> None:
    wrong = Answerer(_KB(), _Echo("You have influenza."), _Emb()).ask("What is it?", 2)  # type: ignore[arg-type]
    assert [p["id"] for p in wrong["passages"]] == [7, 9]
    assert wrong["supported"] is False and wrong["unsupported"] == ["influenza"]
    right = Answerer(_KB(), _Echo("A common cold."), _Emb()).ask("What is it?", 2)  # type: ignore[arg-type]
    assert right["supported"] is True and right["unsupported"] == []
    alone = Answerer(None, _Echo("Influenza."), _Emb()).ask("What is it?", 0)
    assert alone["supported"] is None and alone["passages"] == []
