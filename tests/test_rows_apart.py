"""Rows apart, on the real models (issue 43): every model pass over private records gives each
record an output that is bit-identical whatever other records exist or share its batch.

For each pass a method may make (:data:`dpsynth.methods.base.PRIVATE_PASSES`) a corpus is run
through the production function, then the same corpus with one record added at the FRONT (it
shifts every row's position, batch and chunk), and every other record's output must be
byte-equal. The release checker's rows-apart step checks that every registered method declares
its passes (:attr:`Method.private_passes`; a method that declares none fails) and runs every
declared pass, so a new method's pass cannot be skipped silently.

Which passes a method makes is also observed, not only declared: :class:`Recording` wraps a
model (real or fake) and notes every call over private records of its boundary methods
(:data:`BOUNDARY`) with the production functions on the stack. The release checker
(tests/test_release_check.py::test_every_methods_private_passes_are_declared_and_checked) runs
every registered method's default configuration on recorded fakes and requires each such call
to be of a declared pass and to come through one of :data:`ENTRY_POINTS`, the production
functions the checks here run on the real models (each check asserts that it ran all of its
pass's entry points).

The DP argument each pass carries: the keyword histogram's sensitivity sqrt(K), the vote's one
vote per record, the private prediction's clip c per document and SecPE's per-secret counts all
assume "one record changes only its own contribution" (docs/methods.md, "Rows apart").
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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
#: the records of the checks whose every record costs model passes (the LLM keywords, the
#: private prediction, DP-SGD): few, yet with EXTRA at the front every one of them moves to
#: another position, and another batch or chunk where a chunk holds two
FEW = DOCS[:3]
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


# ------------------------------------------------------------------- which passes are made
#: the model boundary methods over which a record can enter a model, and the pass each makes
BOUNDARY: dict[str, str] = {
    "generate": "keywords", "open_stepper": "logits", "open_rows_apart": "logits",
    "next_token_logits": "logits", "next_token_logits_ids": "logits",
    "embed": "embed", "iter_embed": "embed", "encode_uncached": "embed",
}
#: per pass, the production functions its rows-apart check below runs on the real models: a
#: call over private records is covered only when one of its pass's entries is on the stack
ENTRY_POINTS: dict[str, frozenset[str]] = {
    "keywords": frozenset({"dpsynth.methods.synrag.shard:DocumentShard.keyword_counts"}),
    "embed": frozenset({"dpsynth.embed.streamed:embed_to_file",
                        "dpsynth.methods.synrag.shard:DocumentShard.embed",
                        "dpsynth.compute.ray_engine:embed_rows"}),
    "logits": frozenset({"dpsynth.methods.synrag.private_prediction:open_documents"}),
    "secrets": frozenset({"dpsynth.secrets:find_in_texts"}),
    "train": frozenset({"dpsynth.methods.dpfinetune.train:DPSGD.clipped_sum"}),
}


def production_frames() -> frozenset[str]:
    """``module:qualname`` of every dpsynth function on the caller's stack."""
    out: set[str] = set()
    frame = inspect.currentframe()
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module == "dpsynth" or module.startswith("dpsynth."):
            out.add(f"{module}:{frame.f_code.co_qualname}")
        frame = frame.f_back
    return frozenset(out)


@dataclass(frozen=True)
class PassCall:
    """One call of a model boundary over private records."""

    kind: str  # the pass (one of PRIVATE_PASSES)
    boundary: str  # the method called
    frames: frozenset[str]  # production_frames() at the call

    def where(self) -> str:
        """The innermost-looking production callers, for a failure message."""
        return ", ".join(sorted(self.frames)[:6]) or "no dpsynth function"


def texts_in(value: Any) -> Iterator[str]:
    """Every string inside a call's arguments (requests' prompts, lists, dicts)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from texts_in(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from texts_in(v)
    elif hasattr(value, "prompt"):  # a GenerationRequest
        yield from texts_in(value.prompt)


class Recording:
    """``model`` with its :data:`BOUNDARY` methods recorded into ``calls`` whenever
    ``private(args, kwargs)`` says the call carries a private record (every call, by
    default); everything else is the model's own."""

    def __init__(self, model: Any, calls: list[PassCall],
                 private: Callable[[tuple[Any, ...], dict[str, Any]], bool] = lambda a, k: True
                 ) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_calls", calls)
        object.__setattr__(self, "_private", private)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._model, name)
        if name not in BOUNDARY or not callable(attr):
            return attr

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._private(args, kwargs):
                self._calls.append(PassCall(BOUNDARY[name], name, production_frames()))
            return attr(*args, **kwargs)

        return recorded

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._model, name, value)


def assert_entries_ran(kind: str, calls: list[PassCall]) -> None:
    """A check ran every production entry point of its pass (so :data:`ENTRY_POINTS` lists
    nothing the real-model check does not cover)."""
    seen = {e for c in calls if c.kind == kind for e in c.frames}
    missing = ENTRY_POINTS[kind] - seen
    assert not missing, f"the {kind} check did not run {sorted(missing)}"


# ------------------------------------------------------------------------- one pass each
def keywords_pass(smollm: Any, vocab: Any, docs: list[str]) -> list[Any]:
    """DP-SynRAG step 1 as a shard runs it (DocumentShard.keyword_counts), default settings:
    the LLM extractor, the generator's tokenizer vocabulary (``vocab``: public, the same for
    every corpus, so loaded once), K = 10."""
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.shard import DocumentShard, ShardFiles

    scfg = SynRAGConfig()
    assert scfg.keyword_extractor == "llm"  # the default this test is about
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


def shard_embed_pass(embedder: Any, docs: list[str]) -> list[Any]:
    """DP-SynRAG's embeddings of a shard's documents (DocumentShard.embed)."""
    from dpsynth.methods.synrag.shard import DocumentShard, ShardFiles

    shard = DocumentShard.of_records(docs, np.arange(len(docs)), None, ShardFiles())
    shard.embed(lambda: embedder)
    return list(shard.emb)


def ray_embed_pass(embedder: Any, docs: list[str], chunk: int) -> list[Any]:
    """A Ray shard actor's embeddings of its rows (compute.ray_engine.embed_rows), read
    ``chunk`` rows at a time."""
    from dpsynth.compute.ray_engine import embed_rows

    return list(embed_rows(embedder, docs, chunk=chunk))


#: the clip c the logits check clips at (a public constant; DP-SynRAG's default calibrates one)
CHECK_CLIP = 0.3


def logits_pass(smollm: Any, docs: list[str], rows: int | None = None) -> list[Any]:
    """DP-SynRAG's private prediction stepper (open_documents) on the default engine and
    logits dtype: each document's logits at the first step and, after one shared token, at
    a few candidate ids (support_logits, as private_predict reads them), and its clipped
    contribution clip_c of those (clip_logits on the whole block, as clipped_sum does)."""
    from dpsynth.methods.synrag.clipping import clip_logits
    from dpsynth.methods.synrag.config import (
        STEPPER_ROWS,
        SynRAGConfig,
        choose_stepper,
        resolve_logits_dtype,
    )
    from dpsynth.methods.synrag.private_prediction import open_documents
    from dpsynth.methods.synrag.support import support_logits

    scfg = SynRAGConfig()
    model = getattr(smollm, "_model", smollm)  # the real generator under a Recording
    before = (getattr(model, "logits_dtype", "float32"),
              getattr(model, "stepper_engine", "transformers"))
    model.set_logits_dtype(resolve_logits_dtype(scfg.logits_dtype))
    choose_stepper(model, scfg.stepper)
    try:
        stepper, _ = open_documents(smollm, docs, "Rephrase the document.", " Rephrased:",
                                    scfg.max_doc_tokens, rows or STEPPER_ROWS)
        assert stepper is not None
        try:
            first = np.asarray(stepper.logits(), dtype=np.float32)
            token = int(np.argmax(first.sum(axis=0)))
            stepper.advance(token)
            ids = np.array([token, 13, 42, 1000], dtype=np.int64)
            second = np.asarray(support_logits(stepper, ids), dtype=np.float32)
        finally:
            stepper.close()
    finally:
        model.set_logits_dtype(before[0])
        model.set_stepper_engine(before[1])
    clipped = clip_logits(np.asarray(second, dtype=np.float64), CHECK_CLIP)
    return [np.concatenate([first[i], second[i], clipped[i].astype(np.float32)])
            for i in range(len(docs))] + [clipped]


def secrets_pass(docs: list[str]) -> list[Any]:
    """SecPE's secret detection with its default secrets (Presidio PII on spaCy) as a shard
    scans its rows (methods.secpe.kernels.secret_hits calls find_in_texts per definition):
    the set of secret ids each record holds."""
    from dpsynth.methods.secpe.config import SecPEConfig
    from dpsynth.secrets import find_in_texts

    held: list[set[tuple[str, str]]] = [set() for _ in docs]
    for spec in SecPEConfig().secrets:
        for key, rows in find_in_texts(docs, spec).items():
            for i in rows:
                held[i].add(key)
    return [sorted(h) for h in held]


# ------------------------------------------------------------------------------ the tests
def check_keywords(request: pytest.FixtureRequest, tmp: Path) -> None:
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.keywords import load_vocabulary

    calls: list[PassCall] = []
    smollm = Recording(request.getfixturevalue("smollm"), calls)
    vocab = load_vocabulary(SynRAGConfig().vocabulary, tokenizer=smollm.tokenizer)
    same_for_others(functools.partial(keywords_pass, smollm, vocab), FEW)
    assert_entries_ran("keywords", calls)


def check_embed(request: pytest.FixtureRequest, tmp: Path) -> None:
    calls: list[PassCall] = []
    embedder = Recording(request.getfixturevalue("embedder"), calls)
    same_for_others(lambda d: embed_pass(embedder, d, tmp), DOCS)
    same_for_others(lambda d: embed_pass(embedder, d, tmp, chunk=3), DOCS)
    same_for_others(lambda d: shard_embed_pass(embedder, d), DOCS)
    same_for_others(lambda d: ray_embed_pass(embedder, d, chunk=4), DOCS)
    assert_entries_ran("embed", calls)


def logits_rows(smollm: Any, rows: int | None, clipped: dict[int, np.ndarray],
                docs: list[str]) -> list[Any]:
    """:func:`logits_pass`'s per-document outputs; its clipped block kept in ``clipped``."""
    *per_doc, block = logits_pass(smollm, docs, rows)
    clipped[len(docs)] = block
    return per_doc


def check_logits(request: pytest.FixtureRequest, tmp: Path) -> None:
    calls: list[PassCall] = []
    smollm = Recording(request.getfixturevalue("smollm"), calls)
    for rows in (None, 2):  # all in one pass; two a pass (EXTRA moves the pass boundaries)
        clipped: dict[int, np.ndarray] = {}
        same_for_others(functools.partial(logits_rows, smollm, rows, clipped), FEW)
        alone, added = clipped[len(FEW)], clipped[len(FEW) + 1]
        assert np.abs(added).max() <= CHECK_CLIP  # each row's sup-norm is at most c
        # so the clipped sum moves by the added row alone: at most c a coordinate
        moved = added.sum(axis=0) - alone.sum(axis=0) - added[0]
        assert np.abs(moved).max() <= 1e-12
    assert_entries_ran("logits", calls)


def check_secrets(request: pytest.FixtureRequest, tmp: Path) -> None:
    pytest.importorskip("presidio_analyzer")
    found = secrets_pass(PII_DOCS)
    assert any(found), "the detector found no secret: the check would pass vacuously"
    same_for_others(secrets_pass, PII_DOCS)


def lora_model(smollm: Any, last_layers: int | None = None) -> Any:
    """A fresh float32 copy of the real generator with the dp_finetune default LoRA adapter
    (on the last ``last_layers`` layers only when given), its B a public, fixed non-zero value
    (the adapter after some training; B = 0 would make every gradient of A zero)."""
    import torch
    from transformers import AutoModelForCausalLM

    from dpsynth.methods.dpfinetune.config import DPFineTuneConfig
    from dpsynth.methods.dpfinetune.train import attach_lora

    s = DPFineTuneConfig()
    torch.manual_seed(0)  # the adapter's A is initialised at random
    model = attach_lora(AutoModelForCausalLM.from_pretrained(str(smollm.model_dir),
                                                             dtype=torch.float32),
                        s.lora_rank, s.lora_alpha, s.target_modules, last_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.full_like(p, 1e-3))
    return model


def train_pass(smollm: Any, model: Any, docs: list[str], clipping: str | None = None,
               micro_batch: int | None = None, frozen: bool | None = None,
               workers: int = 1) -> list[Any]:
    """DP-SGD's exact sum of clipped per-sample gradients (DPSGD.clipped_sum) with the
    dp_finetune defaults (per-sample gradients of one record per pass; or ``clipping`` and
    ``micro_batch`` as given) on ``model``
    (:func:`lora_model`; a sum leaves its weights as they are, so both corpora share it):
    per record its own contribution (the sum over it alone), then the sum over all of them.
    ``frozen``: whether the passes must have run the top layers from the stored lower-layer
    states (None: not checked); ``workers``: the loop path's pass workers."""
    from dpsynth.config import PromptConfig
    from dpsynth.methods.dpfinetune.config import DPFineTuneConfig
    from dpsynth.methods.dpfinetune.prompts import label_heads
    from dpsynth.methods.dpfinetune.train import DPSGD, StepSettings, make_examples
    from dpsynth.privacy import SeededNoise

    s = DPFineTuneConfig()
    head = label_heads(smollm, ["About the clinic."], PromptConfig(), s.prompt)[0]
    examples = make_examples(smollm.tokenizer, [head] * len(docs), docs, s.max_tokens,
                             smollm.eos_token_id)
    settings = StepSettings(1.0, 1.0, 1, float(len(docs)), s.max_grad_norm, s.learning_rate,
                            clipping=clipping or s.clipping,
                            micro_batch=micro_batch or s.micro_batch, secure=False)
    trainer = DPSGD(model, examples, settings, Path("/nonexistent"), SeededNoise(0).spawn,
                    smollm.pad_token_id, first_target=len(head), workers=workers)
    own = [np.concatenate([t.numpy().ravel() for t in trainer.clipped_sum(np.array([i]))[0]])
           for i in range(len(docs))]
    total = np.concatenate([t.numpy().ravel()
                            for t in trainer.clipped_sum(np.arange(len(docs)))[0]])
    if frozen is not None:
        assert (trainer._frozen is not None) is frozen
    trainer.close()
    return [*own, total]


def check_train(request: pytest.FixtureRequest, tmp: Path, clipping: str | None = None,
                micro_batch: int | None = None, last_layers: int | None = None,
                frozen: bool | None = None, workers: int = 1) -> None:
    """Each record's clipped gradient is the same whatever else is in the batch, and adding a
    record moves the exact (integer fixed-point) clipped sum by that record's own clipped
    gradient, bit for bit: the sensitivity C that DP-SGD's accounting assumes. (Every record
    costs two forward and backward passes on each side, the slowest pass of all: two records
    besides EXTRA show it.) ``last_layers``: the adapter on the last layers only."""
    smollm = request.getfixturevalue("smollm")
    model = lora_model(smollm, last_layers)
    alone = train_pass(smollm, model, FEW[:2], clipping, micro_batch, frozen)
    added = train_pass(smollm, model, [EXTRA, *FEW[:2]], clipping, micro_batch, frozen,
                       workers)
    for i, (a, b) in enumerate(zip(alone[:-1], added[1:-1], strict=True)):
        assert a.tobytes() == b.tobytes(), f"record {i}: its clipped gradient moved"
    assert (added[-1] - alone[-1]).tobytes() == added[0].tobytes()
    assert np.abs(added[0]).max() > 0


#: the check of each pass a method may declare
CHECKS: dict[str, Callable[[pytest.FixtureRequest, Path], None]] = {
    "keywords": check_keywords, "embed": check_embed, "logits": check_logits,
    "secrets": check_secrets, "train": check_train,
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


@pytest.mark.models
def test_dp_sgd_hooks_path_is_rows_apart_on_the_real_model(request: pytest.FixtureRequest,
                                                          tmp_path: Path) -> None:
    """The opt-in ``clipping: hooks`` (Opacus's per-sample gradients on fixed-shape passes)
    meets the train pass's check on SmolLM2 too: with 2 rows a pass, the added record moves
    the others to other rows and passes, and each clipped gradient stays the same bit for
    bit. The adapter on the last 2 layers (``lora_layers: 2``): the whole forward pass runs at
    the fixed shape, the backward pass stops below them (the check at full depth is the tiny
    Llama's, tests/test_dp_finetune.py)."""
    check_train(request, tmp_path, clipping="hooks", micro_batch=2, last_layers=2)


@pytest.mark.models
def test_dp_sgd_stored_lower_layers_are_rows_apart_on_the_real_model(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The default loop path with the adapter on the last 2 layers runs the top layers from
    each record's stored lower-layer state (SmolLM2 passes the probe) and meets the train
    pass's check: each clipped gradient the same bit for bit whatever else is in the batch."""
    check_train(request, tmp_path, last_layers=2, frozen=True)


@pytest.mark.models
def test_dp_sgd_pass_workers_are_rows_apart_on_the_real_model(
        request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """The loop path's passes split between this process and a worker (the default on two
    cores and more): with the added record the others' passes move to the other process,
    and each clipped gradient and the sum stay those of one process, bit for bit."""
    check_train(request, tmp_path, last_layers=2, workers=2)


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
    raw["synrag"]["keyword_extractor"] = "vocabulary"  # a server gives no logits either
    with pytest.raises(ConfigError, match="needs a local generator"):
        SynRAG().check(parse_config(raw))
    raw["generators"], raw["synrag"]["keyword_extractor"] = [{"model": "smollm2"}], "llm"
    SynRAG().check(parse_config(raw))
