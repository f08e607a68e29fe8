"""Rows apart, on the real models (issue 43): every model pass over private records gives each
record an output that is bit-identical whatever other records exist or share its batch.

For each pass a method may make (:data:`dpsynth.methods.base.PRIVATE_PASSES`) a corpus is run
through the production function, then the same corpus with one record added at the FRONT (it
shifts every row's position, batch and chunk), and every other record's output must be
byte-equal. The release checker's rows-apart step checks that every registered method declares
its passes (:attr:`Method.private_passes`; a method that declares none fails) and runs every
declared pass, so a new method's pass cannot be skipped silently.

The DP argument each pass carries: the keyword histogram's sensitivity sqrt(K), the vote's one
vote per record, the private prediction's clip c per document and SecPE's per-secret counts all
assume "one record changes only its own contribution" (docs/methods.md, "Rows apart").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.methods import REGISTRY, method_class
from dpsynth.methods.base import PRIVATE_PASSES

DOCS = [
    "I have had a dry cough and a fever for three days, and now a rash on my arms.",
    "My knee is swollen after running; climbing stairs hurts.",
    "Short of breath at night, and my ankles swell by the evening.",
    "Headache behind the eyes every morning, worse with bright light.",
    "The pharmacy gave me the wrong dose of my blood pressure tablets.",
    "Itchy red patches on both elbows that flake; the cream did not help.",
]
#: the record added at the front: another topic, another length, a name and a phone number
EXTRA = ("Please call Maria Gonzalez at 555-201-7788 about the results of her thyroid test, "
         "she has felt tired and cold for months and lost weight.")
PII_DOCS = [
    "Call John Smith on 555-123-4567 about his appointment.",
    "My email is anna.berg@example.com, write to me about the refund.",
    "No names here, just a sore throat.",
    "Dr. Peter Novak said I should rest; his number is 555-987-6543.",
]


def same_for_others(run: Callable[[list[str]], list[Any]], docs: list[str]) -> None:
    """``run(docs)[i]`` equals ``run([EXTRA] + docs)[i + 1]`` for every i, byte for byte."""
    alone = run(docs)
    with_extra = run([EXTRA, *docs])
    assert len(alone) == len(docs) and len(with_extra) == len(docs) + 1
    for i, (a, b) in enumerate(zip(alone, with_extra[1:], strict=True)):
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, f"record {i}"
            assert a.tobytes() == b.tobytes(), f"record {i}: its output moved with another's"
        else:
            assert a == b, f"record {i}: its output moved with another's"


# ------------------------------------------------------------------------- one pass each
def keywords_pass(smollm: Any, docs: list[str]) -> list[Any]:
    """DP-SynRAG step 1 as a shard runs it (DocumentShard.keyword_counts), default settings:
    the LLM extractor, the generator's tokenizer vocabulary, K = 10."""
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.keywords import load_vocabulary
    from dpsynth.methods.synrag.shard import DocumentShard, ShardFiles

    scfg = SynRAGConfig()
    assert scfg.keyword_extractor == "llm"  # the default this test is about
    vocab = load_vocabulary(scfg.vocabulary, tokenizer=smollm.tokenizer)
    shard = DocumentShard.of_records(docs, np.arange(len(docs)), None, ShardFiles())
    shard.keyword_counts(vocab, scfg.keywords_per_doc, scfg.keyword_fill, "tag",
                         lambda: smollm, scfg.keyword_max_new_tokens)
    assert shard.keywords is not None
    return [list(k) for k in shard.keywords]


def embed_pass(embedder: Any, docs: list[str], tmp: Path, chunk: int = 4096) -> list[Any]:
    """The private embeddings as every PE method computes them (run_dataset's embed_to_file),
    streamed in ``chunk`` texts (a record added at the front moves the chunk boundaries)."""
    from dpsynth.embed import embed_to_file

    path = tmp / f"emb-{len(docs)}-{chunk}.npy"
    out = np.array(embed_to_file(embedder, docs, len(docs), path, chunk=chunk))
    return list(out)


def logits_pass(smollm: Any, docs: list[str], rows: int | None = None) -> list[Any]:
    """DP-SynRAG's private prediction stepper (open_documents) on the default engine and
    logits dtype: each document's logits at the first step and after three shared tokens."""
    from dpsynth.methods.synrag.config import (
        STEPPER_ROWS,
        SynRAGConfig,
        choose_stepper,
        resolve_logits_dtype,
    )
    from dpsynth.methods.synrag.private_prediction import open_documents

    scfg = SynRAGConfig()
    before = (getattr(smollm, "logits_dtype", "float32"),
              getattr(smollm, "stepper_engine", "transformers"))
    smollm.set_logits_dtype(resolve_logits_dtype(scfg.logits_dtype))
    choose_stepper(smollm, scfg.stepper)
    try:
        stepper, _ = open_documents(smollm, docs, "Rephrase the document.", " Rephrased:",
                                    scfg.max_doc_tokens, rows or STEPPER_ROWS)
        assert stepper is not None
        try:
            first = np.asarray(stepper.logits(), dtype=np.float32)
            token = int(np.argmax(first.sum(axis=0)))
            stepper.advance(token)
            ids = [token, 13, 42, 1000]
            second = np.asarray(stepper.logits_at(ids), dtype=np.float32)
        finally:
            stepper.close()
    finally:
        smollm.set_logits_dtype(before[0])
        smollm.set_stepper_engine(before[1])
    return [np.concatenate([first[i], second[i]]) for i in range(len(docs))]


def secrets_pass(docs: list[str]) -> list[Any]:
    """SecPE's secret detection with its default secrets (Presidio PII on spaCy): the set of
    secret ids each record holds."""
    from dpsynth.methods.secpe.config import SecPEConfig
    from dpsynth.secrets import find_secrets

    index = find_secrets(docs, SecPEConfig().secrets)
    rows = index.membership.tocsr()
    return [sorted(index.values[j] for j in rows[i].indices) for i in range(len(docs))]


# ------------------------------------------------------------------------------ the tests
def check_keywords(request: pytest.FixtureRequest, tmp: Path) -> None:
    same_for_others(functools.partial(keywords_pass, request.getfixturevalue("smollm")), DOCS)


def check_embed(request: pytest.FixtureRequest, tmp: Path) -> None:
    embedder = request.getfixturevalue("embedder")
    same_for_others(lambda d: embed_pass(embedder, d, tmp), DOCS)
    same_for_others(lambda d: embed_pass(embedder, d, tmp, chunk=3), DOCS)


def check_logits(request: pytest.FixtureRequest, tmp: Path) -> None:
    smollm = request.getfixturevalue("smollm")
    same_for_others(functools.partial(logits_pass, smollm), DOCS)
    same_for_others(functools.partial(logits_pass, smollm, rows=4), DOCS)


def check_secrets(request: pytest.FixtureRequest, tmp: Path) -> None:
    pytest.importorskip("presidio_analyzer")
    found = secrets_pass(PII_DOCS)
    assert any(found), "the detector found no secret: the check would pass vacuously"
    same_for_others(secrets_pass, PII_DOCS)


#: the check of each pass a method may declare
CHECKS: dict[str, Callable[[pytest.FixtureRequest, Path], None]] = {
    "keywords": check_keywords, "embed": check_embed, "logits": check_logits,
    "secrets": check_secrets,
}


def test_every_method_declares_its_passes() -> None:
    """The release checker's rows-apart step, part 1: every registered method declares the
    passes its default configuration makes over private records, each a pass with a check
    (part 2, :func:`test_each_pass_is_rows_apart_on_the_real_models`, runs every check)."""
    assert set(CHECKS) == set(PRIVATE_PASSES)
    for name in REGISTRY:
        passes = method_class(name).private_passes
        assert passes is not None, f"method {name!r} does not declare its private passes"
        assert set(passes) <= set(PRIVATE_PASSES), f"{name}: unknown pass in {passes}"
    assert {p for n in REGISTRY for p in method_class(n).private_passes} == set(PRIVATE_PASSES)


@pytest.mark.models
@pytest.mark.parametrize("name", PRIVATE_PASSES)
def test_each_pass_is_rows_apart_on_the_real_models(name: str, request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    CHECKS[name](request, tmp_path)


def test_keyword_extraction_asks_the_model_one_document_a_pass() -> None:
    """The exact guard on our boundary (fast, no model): every ``generate`` call the keyword
    step makes holds one request, so no batch, padding or sort order can couple documents."""
    from dpsynth.methods.synrag.keywords import Vocabulary
    from dpsynth.methods.synrag.shard import DocumentShard, ShardFiles
    from fakes import FakeGenerator

    calls: list[int] = []

    class Recording(FakeGenerator):
        def generate(self, requests: Any, **kw: Any) -> Any:
            calls.append(len(requests))
            return super().generate(requests, **kw)

    shard = DocumentShard.of_records(DOCS, np.arange(len(DOCS)), None, ShardFiles())
    shard.keyword_counts(Vocabulary(["cough", "fever", "rash", "knee"], "t"), 3,
                         "appearance", "tag", lambda: Recording("fake-g0"), 16)
    assert calls == [1] * len(DOCS)


def test_llm_keywords_on_ray_shards_need_a_local_generator() -> None:
    """Shards asking one remote server at once could land in one server-side batch: refused
    before anything is written (a local generator on each shard is one document a pass)."""
    from dpsynth.config import ConfigError, parse_config
    from dpsynth.methods.synrag.method import SynRAG

    raw = {"method": "synrag", "compute": {"engine": "ray"},
           "synrag": {"vocabulary": ["fever", "cough"]},
           "generators": [{"backend": "openai", "model": "m", "base_url": "http://127.0.0.1:9"}]}
    with pytest.raises(ConfigError, match="needs a local generator"):
        SynRAG().check(parse_config(raw))
    raw["synrag"]["keyword_extractor"] = "vocabulary"
    SynRAG().check(parse_config(raw))
    raw["synrag"]["keyword_extractor"], raw["compute"]["engine"] = "llm", "local"
    SynRAG().check(parse_config(raw))
