"""RAG over a knowledge base: retrieve k passages, let the generator answer from them.

Over DP-SynRAG's synthetic KB this is post-processing of a DP release: any number of
questions costs no privacy budget. Only ``release/`` of a run is ever opened.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import MissingFileError
from ..llm import GenerationRequest, SamplingParams
from ..progress import step
from .grounding import unsupported_terms
from .index import KnowledgeBase

SYSTEM = "You answer questions using the given documents. Answer briefly."


def release_dir(path: str | Path) -> Path:
    """The release/ folder of a run folder (or the folder itself when it holds kb.jsonl)."""
    p = Path(path)
    if (p / "release" / "kb.jsonl").is_file():
        return p / "release"
    if (p / "kb.jsonl").is_file() and p.name == "release":
        return p
    raise MissingFileError(f"{p}: no release/kb.jsonl (build one with `dpsynth rag build`)")


def answer_prompt(question: str, passages: Sequence[str]) -> tuple[dict[str, str], ...]:
    """Chat prompt: the retrieved passages, then the question (no passages: the question
    alone, the 'no RAG' baseline)."""
    if passages:
        docs = "\n\n".join(f"Document {i + 1}: {p}" for i, p in enumerate(passages))
        user = f"{docs}\n\nQuestion: {question}"
    else:
        user = f"Question: {question}"
    return ({"role": "system", "content": SYSTEM}, {"role": "user", "content": user})


class Answerer:
    """Question answering over one knowledge base (or none: k = 0); ``k`` passages per
    question, ``default_k`` (the build's ``synrag.retrieve``) unless a call says."""

    def __init__(self, kb: KnowledgeBase | None, generator: Any, embedder: Any, *,
                 max_new_tokens: int = 48, default_k: int = 3) -> None:
        self.kb = kb
        self.generator = generator
        self.embedder = embedder
        self.max_new_tokens = max_new_tokens
        self.default_k = default_k

    def ask_many(self, questions: Sequence[str], k: int | None = None) -> list[dict[str, Any]]:
        """Answers and retrieved passages for several questions (greedy decoding)."""
        k = self.default_k if k is None else k
        hits: list[list[tuple[int, float]]] = [[] for _ in questions]
        if self.kb is not None and k > 0 and len(self.kb):
            hits = self.kb.search(self.embedder.embed(list(questions)), k)
        params = SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)
        passages = [[self.kb.passages[i] for i, _ in h] if self.kb else [] for h in hits]
        reqs = [GenerationRequest(answer_prompt(q, [p["text"] for p in ps]), params)
                for q, ps in zip(questions, passages, strict=True)]
        texts = self.generator.generate(reqs, progress=False) if reqs else []
        return [_result(q, t.strip(), ps, h)
                for q, t, ps, h in zip(questions, texts, passages, hits, strict=True)]

    def ask(self, question: str, k: int | None = None) -> dict[str, Any]:
        return self.ask_many([question], k)[0]


def _result(question: str, text: str, passages: Sequence[dict[str, Any]],
            hits: Sequence[tuple[int, float]]) -> dict[str, Any]:
    """One answer with its sources (the passages used, with their ids) and whether it stays
    within them: ``unsupported`` lists what it names that no source contains (None without
    sources, the no-RAG baseline)."""
    unsupported = (unsupported_terms(text, [p["text"] for p in passages], question)
                   if passages else None)
    return {"question": question, "answer": text,
            "passages": [{"id": p.get("id"), "text": p["text"], "score": round(s, 4)}
                         for p, (_, s) in zip(passages, hits, strict=True)],
            "supported": None if unsupported is None else not unsupported,
            "unsupported": unsupported or []}


def open_answerer(kb_dir: str | Path, *, generator: Any = None, embedder: Any = None,
                  max_new_tokens: int | None = None) -> Answerer:
    """An :class:`Answerer` over a built KB; models from the run's config unless given. Reads
    only the run's release/ folder (index.json names the models)."""
    rel = release_dir(kb_dir)
    kb = KnowledgeBase.open(rel)
    meta = kb.meta or {}
    gen_spec: Any = meta.get("generator", "smollm2")
    tokens = int(meta.get("answer_max_new_tokens", 48))
    if generator is None:
        from ..llm import load_generator

        with step(f"loading generator {model_name(gen_spec)}"):
            generator = load_generator(gen_spec)
    if embedder is None:
        from ..embed import Embedder

        with step(f"loading embedder {kb.embedder_name}"):
            embedder = Embedder(kb.embedder_name)
    return Answerer(kb, generator, embedder, max_new_tokens=max_new_tokens or tokens,
                    default_k=int(meta.get("retrieve", 3)))


def model_name(spec: Any) -> str:
    """A generator spec's model name (for a progress line; a spec holds no secret, only the
    name of the variable that holds a key)."""
    return str(spec.get("model", "")) if isinstance(spec, dict) else Path(str(spec)).name


def answer(question: str, kb_dir: str | Path, k: int | None = None, *, generator: Any = None,
           embedder: Any = None) -> dict[str, Any]:
    """Answer ``question`` from the synthetic KB of run ``kb_dir``: answer + passages (``k``
    passages; None: the build's ``synrag.retrieve``)."""
    return open_answerer(kb_dir, generator=generator, embedder=embedder).ask(question, k)


def privacy_of(kb_dir: str | Path) -> dict[str, Any]:
    """The run's release/privacy.json (empty dict if absent)."""
    p = release_dir(kb_dir) / "privacy.json"
    return json.loads(p.read_text()) if p.is_file() else {}
