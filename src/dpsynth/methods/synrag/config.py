"""The ``synrag:`` section of a run config (DP-SynRAG, docs/methods.md §4); validated through
the method registry (``dpsynth.methods.section_model``).

Defaults follow the paper (K = 10, R = 500, L = 5, k = 80, T = 70, tau = 1, rho_hist = 0.1,
eps_theta = 0.4). The clip ``c`` is calibrated so that Theorem 1's total meets the run's
(epsilon, delta) target unless it is given.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...config import ConfigError, RunConfig

log = logging.getLogger("dpsynth.rag")

DEFAULT_REPHRASE = (
    "Rephrase the following document without altering the important information "
    "contained within it."
)
DEFAULT_FILTER = "Does the following document contain any specific diagnosis names?"


#: Documents per decode pass of the private prediction where no config says (the API's
#: default; a synrag section's is its target_size, :func:`stepper_rows`).
STEPPER_ROWS = 16


class SynRAGConfig(BaseModel):
    """DP-SynRAG parameters; every field is public (never derived from the private data)."""

    model_config = ConfigDict(extra="forbid")

    # 1. keywords and histogram
    keywords_per_doc: int = Field(10, ge=1, le=100, description="K")
    vocabulary: str | list[str] = Field(
        "tokenizer",
        description=(
            "PUBLIC keyword vocabulary: a list of terms, a file path (one term a line, or a "
            "JSON list), 'demo' (terms of dpsynth.demo_corpus.demo_knowledge), 'demo-diseases' "
            "(its disease names only) or 'tokenizer' "
            "(whole-word tokens of the generator's tokenizer, minus stop words)"
        ),
    )
    keyword_extractor: Literal["llm", "vocabulary"] = Field(
        "llm",
        description="'llm' (the paper): the LLM proposes keywords, restricted to the "
        "vocabulary, topped up with vocabulary terms found in the text; 'vocabulary': only "
        "the deterministic text match (no LLM; faster)",
    )
    keyword_fill: Literal["appearance", "vocabulary_order"] = Field(
        "appearance",
        description="order of the vocabulary terms found in the text that top up the LLM's "
        "keywords: first occurrence, or the (public) order of the vocabulary list, e.g. a "
        "list that puts disease names before symptom words")
    keyword_max_new_tokens: int = Field(48, ge=4, le=512)
    rho_hist: float = Field(0.1, gt=0, description="zCDP of the keyword histogram")
    min_noisy_count: float | None = Field(
        None, description="keywords below this noisy count are never cluster seeds "
        "(default: sigma_h * sqrt(2 ln |vocabulary|), the noise floor)")
    # 2. soft clustering
    clusters: int = Field(500, ge=1, description="R: top keywords that seed clusters")
    overlap: int = Field(5, ge=1, description="L: clusters a document may join")
    # 3. retrieval inside each cluster
    target_size: int = Field(80, ge=1, description="k: documents aimed for per cluster")
    eps_theta: float = Field(0.4, gt=0, description="epsilon of the threshold mechanism")
    rho_centre: float = Field(0.009, gt=0, description="zCDP of one noisy cluster centre")
    # 4. private prediction
    tokens: int = Field(70, ge=1, le=2048, description="T: tokens per synthetic document")
    temperature: float = Field(1.0, gt=0, description="tau")
    clip: float | None = Field(None, gt=0, description="c; None = calibrate to the target")
    max_doc_tokens: int = Field(384, ge=8, description="longer documents are truncated; "
                                "also the public width of every document's row in the "
                                "private prediction (lower: cheaper tokens)")
    rephrase_instruction: str = Field(
        DEFAULT_REPHRASE, description="the public instruction before each document; "
        "'{keyword}' in it is the cluster's released keyword (post-processing of a release)")
    lead: str = Field(
        "", description="public opening of every released text, which the private tokens "
        "continue (e.g. 'Typical symptoms of {keyword} are'); '{keyword}' is the cluster's "
        "released keyword. Every document's prompt and the public model's end with it")
    closing: str = Field(
        "", description="public text after the private tokens of every released text (e.g. "
        "'Diagnosis: {keyword}.'); '{keyword}' is the cluster's released keyword. No model "
        "sees it and it costs nothing (post-processing of a release); it puts the cluster's "
        "keyword where a reader (or a RAG answerer) looks for it")
    support: Literal["public", "full"] = Field(
        "public", description="where each private token is drawn: 'public' = a candidate set "
        "built from public inputs and released values only (the public model's top tokens "
        "given the instruction and the released prefix, the public vocabulary's tokens, the "
        "cluster's released keyword, end-of-text; docs/methods.md §4), 'full' = the whole "
        "vocabulary. Same charge either way")
    support_top: int = Field(64, ge=0, le=4096, description="top tokens of the public model "
                             "(no private document) in the candidate set")
    support_vocabulary: bool = Field(True, description="the public vocabulary's tokens in the "
                                     "candidate set (they carry names no public model knows)")
    logits_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="dtype of the private prediction's model: 'auto' = bfloat16 on a "
        "CPU with native bf16 (KL to float32 measured by `dpsynth bench private-prediction`), "
        "else float32")
    stepper: Literal["auto", "openvino", "transformers"] = Field(
        "auto", description="engine of the private prediction's forward passes: 'openvino' = "
        "the decoder exported to OpenVINO with the KV cache in its fused attention (bf16 or "
        "f32 per logits_dtype; `dpsynth bench private-prediction`), 'transformers' = torch, "
        "'auto' = openvino where it is installed and runs the model (every layer full "
        "attention: SmolLM2 yes, Gemma 3 no), else transformers")
    stepper_rows: int | None = Field(
        None, ge=1, le=1024, description="documents per decode pass of the private "
        "prediction (None: target_size k, what a cluster holds by design): a public constant, "
        "so every pass has the same shape (filler rows where a cluster has fewer) and no "
        "document's logits depend on the others (docs/methods.md §4, 'Rows apart')")
    public_shortcut: bool = Field(
        False, description="sparse-vector public-token shortcut (Amin et al. 2024): public "
        "tokens when the documents agree with the public model; only private tokens charged")
    svt_epsilon: float = Field(0.1, gt=0, description="epsilon of one AboveThreshold instance")
    svt_max_private: int | None = Field(
        None, ge=1, description="m: most private tokens per text (default T // 4)")
    svt_threshold: float | None = Field(
        None, description="AboveThreshold threshold on q (sum of clipped-logit differences); "
        "default k c (about half of k documents disagreeing with the public token)")
    # 5. self-filtering
    self_filter: bool = Field(
        False, description="ask the LLM the filter question about each synthetic text and keep "
        "the YES (post-processing). Off by default: measured unreliable at 135M parameters "
        "(BENCHMARKS.md: on Medical Synth run 3 it dropped all 5 texts naming a disease and "
        "kept 7 noise texts; on the tiny example it kept 6 of 16 texts, none naming one)")
    filter_question: str = DEFAULT_FILTER
    drop_garbled: bool = Field(
        True, description="drop passages that are not text (a loop of repeated words, mostly "
        "non-words, under five words; dpsynth.rag.grounding.garbled_reason): post-processing "
        "of the released texts; the build says how many it dropped and why")
    # RAG over the KB
    retrieve: int = Field(3, ge=1, le=50, description="passages retrieved per question")
    answer_max_new_tokens: int = Field(48, ge=1, le=512)


def stepper_rows(cfg: SynRAGConfig) -> int:
    """Documents per decode pass: ``synrag.stepper_rows``, else k (``target_size``)."""
    return int(cfg.stepper_rows or cfg.target_size)


def max_private_tokens(cfg: SynRAGConfig) -> int:
    """m: private tokens per text with the shortcut (T without it)."""
    if not cfg.public_shortcut:
        return cfg.tokens
    return min(cfg.tokens, cfg.svt_max_private or max(1, cfg.tokens // 4))


def resolve_logits_dtype(setting: str) -> str:
    """``synrag.logits_dtype`` made concrete on the driver: 'auto' is bfloat16 where the CPU
    has native bf16 instructions, else float32. An explicit bfloat16 on a CPU without them
    runs, emulated, and says it is slow."""
    from ...llm.local import bf16_supported

    native = bf16_supported()
    if setting == "bfloat16" and not native:
        log.warning("synrag.logits_dtype bfloat16: this CPU has no native bf16 (AVX512-BF16 or "
                    "AMX), so bf16 is emulated and slower than float32 (14x measured); "
                    "'auto' picks float32 here")
    if setting != "auto":
        return setting
    return "bfloat16" if native else "float32"


def choose_stepper(gen: Any, setting: str) -> str:
    """Put ``gen``'s stepper on the engine ``synrag.stepper`` names ('auto': OpenVINO where
    it runs the model, else transformers, saying why); returns the engine's name. An explicit
    'openvino' that cannot run fails here, before any private document is read."""
    from ...llm.ov_stepper import unsupported

    engine = setting
    if setting == "auto":
        reason = unsupported(gen)
        engine = "transformers" if reason else "openvino"
        if reason:
            log.info("synrag.stepper auto: transformers (%s)", reason)
    try:
        gen.set_stepper_engine(engine)
    except Exception as exc:
        if setting != "auto":
            raise
        log.warning("synrag.stepper auto: the OpenVINO export failed (%s); using transformers",
                    type(exc).__name__)
        engine = "transformers"
        gen.set_stepper_engine(engine)
    return engine


def check_stepper(setting: str, model: str) -> None:
    """Fail before any budget is spent when ``synrag.stepper: openvino`` cannot run: OpenVINO
    missing, or a model with sliding-window layers (Gemma 3)."""
    if setting != "openvino":
        return
    from ...llm.ov_stepper import import_openvino, unsupported_config

    try:
        import_openvino()
    except ImportError as exc:
        raise ConfigError("synrag.stepper: 'openvino' needs the openvino package "
                          "(pip install openvino), or use 'auto'") from exc
    spec = model.removeprefix("local:")
    if spec == "gemma3":
        reason: str | None = "model type 'gemma3' has sliding-window layers"
    else:
        path = Path(spec).expanduser() / "config.json"
        try:
            reason = unsupported_config(json.loads(path.read_text("utf-8"))) \
                if path.is_file() else None
        except (OSError, ValueError):
            reason = None  # the model check reports an unreadable model
    if reason:
        raise ConfigError(f"synrag.stepper: 'openvino' cannot run {model}: {reason}; "
                          "use 'transformers' or 'auto'")


def check_vocabulary(spec: str | list[str], demo_seed: int = 0) -> None:
    """``synrag.vocabulary`` loads and holds a usable term (all but 'tokenizer', which needs
    the model): a missing, unreadable or non-UTF-8 file, or a list without a usable term, is a
    ConfigError naming the file, raised before any budget is reserved."""
    from .keywords import load_vocabulary

    try:
        load_vocabulary(spec, demo_seed=demo_seed)
    except UnicodeDecodeError:
        raise ConfigError(f"synrag.vocabulary: {spec!r} is not UTF-8 text") from None
    except OSError as err:
        raise ConfigError(f"synrag.vocabulary: {spec!r} cannot be read "
                          f"({err.strerror or type(err).__name__})") from None


def parse_synrag(config: RunConfig) -> SynRAGConfig:
    """The run's ``synrag:`` section (its defaults when the config has none); errors name the
    field (``synrag.<field>``)."""
    from ..base import read_section

    return read_section(config, "synrag", SynRAGConfig)


def synrag_dict(cfg: SynRAGConfig) -> dict[str, Any]:
    """Plain dict of the section (for privacy.json / summaries)."""
    return cfg.model_dump(mode="json")
