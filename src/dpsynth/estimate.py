"""How long a run will take on this machine (``dpsynth plan``): a short calibration of the
configured models, multiplied by the counts the plan already knows.

* The calibration loads each configured local generator and the embedder (or the models a
  caller passes in, e.g. a test's fakes), generates a few public prompts (:data:`PROMPTS`, at
  most the generator's batch) for :data:`TOKENS` new tokens and embeds :data:`TEXTS` public
  texts, timing each. The rates are cached in the user's cache directory
  (``$XDG_CACHE_HOME/dpsynth/calibration.json``, else ``~/.cache/dpsynth/``), keyed by the
  model, its engine settings and this machine's CPU, so a second ``plan`` is instant.
* A remote (OpenAI-compatible) generator is never timed: its stage says "not estimated:
  remote generator" instead of a number.
* The work is counted per method, by pure functions of the plan's and the config's counts (the
  caller, ``dpsynth plan``, reads them; this module imports no method):

  - Aug-PE (:func:`pe_work`): texts generated x their max tokens, texts embedded (the private
    records once, each round's new candidates: the kept ones come from the embedding cache).
  - WASP (:func:`wasp_work`): ``samples`` texts written over T + 1 rounds, each round's split
    evenly over the generators (each at its own rate), rounds 1..T from contrastive prompts;
    each of the T votes embeds its round's new texts; the nearest and furthest Top-Q
    histograms are negligible; federated rounds (Flower, Ray) are not estimated.
  - SecPE (:func:`secpe_work`, :func:`secpe_stages`): Aug-PE's pool arithmetic at population
    ``samples``; the secret detection and SecretNoise calibration as timed by the plan itself
    (it runs them on the data); the public KMeans and the representative vote negligible.
  - DP-SynRAG (:func:`rag_work`, :func:`rag_stages`): the LLM's keywords of every document,
    the documents' (and the knowledge base's) embedding, the private prediction's token steps
    (passages x tokens, each step decoding every document row of the cluster and the public
    row: that many contexts at the generator's rate), the self-filter.
  - dp_finetune (:func:`finetune_stages`): the DP-SGD training at the per-record gradient rate
    the method measures on public records of the run's longest shape, on one thread, over its
    pass workers (records shorter than that train faster; hooks, ghost and user level are
    not estimated), the
    release's sampling at the generator's rate.

  A vote (nearest-neighbour search and noise) is negligible.

Everything here is public: the calibration reads only built-in public texts, the rates are
facts about this machine and the models, and the work is computed from the plan's counts (its
record count is the one ``plan`` already prints, a stated one with ``--no-data``).
"""

from __future__ import annotations

import math
import platform
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .embed import Embedder
from .files import read_cache_file, user_cache_dir, write_cache_file
from .llm import GenerationRequest, SamplingParams, load_generator
from .llm.base import Completer
from .llm.runtime import available_cores, resolve_device
from .progress import step
from .work import (
    Stage,
    TuneWork,
    Work,
    duration,
    pe_work,
    secpe_stages,
    secpe_work,
    split_evenly,
    wasp_stages,
    wasp_work,
)

if TYPE_CHECKING:
    from .config import EmbedderConfig, GeneratorConfig, RunConfig

__all__ = ["PROMPTS", "TEXTS", "TOKENS", "Estimate", "RagWork", "Rate", "RateCache", "Stage",
           "TuneWork", "Work", "calibrate_embedder", "calibrate_generator", "estimate_finetune",
           "estimate_rag", "estimate_run", "estimate_stages", "finetune_stages", "pe_work",
           "rag_stages", "rag_work", "secpe_stages", "secpe_work", "training_rate",
           "wasp_stages", "wasp_work"]

#: prompts generated at once by the calibration (at most the generator's batch size)
PROMPTS = 16
#: new tokens per calibration prompt
TOKENS = 16
#: public texts embedded by the calibration
TEXTS = 48
#: version of the cache file's layout (another version is ignored, then overwritten)
CACHE_VERSION = 1

_TOPICS = ("the weather this week", "a new bus line", "a visit to the library",
           "planting tomatoes", "a lost umbrella", "a football match", "a birthday cake",
           "the price of coffee", "a broken bicycle", "a morning walk", "a school trip",
           "a rainy holiday", "a noisy neighbour", "a new phone", "a music lesson",
           "a cat on the roof")
_WORDS = ("the", "morning", "train", "was", "late", "again", "and", "we", "waited", "on",
          "a", "cold", "platform", "for", "twenty", "minutes", "before", "it", "came",
          "slowly", "into", "station", "with", "its", "lights", "still", "off")


# -- what was measured ---------------------------------------------------------------------
@dataclass(frozen=True)
class Rate:
    """One model's measured speed: ``per_s`` items a second (new tokens for a generator,
    texts for an embedder), ``load_s`` its load time, ``seconds`` the calibration's wall
    time (load included); ``cached``: read from the cache, not measured now."""

    per_s: float
    load_s: float
    seconds: float
    cached: bool = False

    def to_json(self) -> dict[str, float]:
        return {"per_s": self.per_s, "load_s": self.load_s, "seconds": self.seconds}


#: a rate, or why there is none ("remote generator", ...)
Measured = Rate | str


def machine() -> str:
    """This machine's CPU model and the cores this process may use (e.g. ``AMD EPYC, 2
    cores``): part of every cache key."""
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name}, {available_cores()} cores"


def _installed(*modules: str) -> str:
    """Which of the optional engines are installed (``auto`` picks among them)."""
    return "+".join(m for m in modules if find_spec(m) is not None) or "none"


def generator_key(gcfg: GeneratorConfig) -> str:
    """The cache key of a local generator's rate (model, engine settings, CPU)."""
    return "|".join(map(str, (gcfg.model, gcfg.engine, _installed("ctranslate2", "openvino"),
                               gcfg.device, gcfg.batch_size, gcfg.threads, machine())))


def embedder_key(ecfg: EmbedderConfig) -> str:
    """The cache key of the embedder's rate (model, engine settings, CPU)."""
    return "|".join(map(str, (ecfg.model, ecfg.engine, _installed("openvino", "onnxruntime"),
                               ecfg.device, ecfg.batch_size, ecfg.threads, machine())))


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/dpsynth/calibration.json``, else ``~/.cache/dpsynth/...``."""
    return user_cache_dir() / "calibration.json"


class RateCache:
    """The measured rates on disk (public facts about this machine), by kind
    (``generator`` / ``embedder``) and key."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else cache_path()

    def get(self, kind: str, key: str) -> Rate | None:
        entry = read_cache_file(self.path, CACHE_VERSION).get(kind, {}).get(key)
        try:
            return Rate(float(entry["per_s"]), float(entry["load_s"]), float(entry["seconds"]),
                        cached=True)
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, kind: str, key: str, rate: Rate) -> None:
        """Store ``rate`` (a cache that cannot be written only costs a later calibration)."""
        data = read_cache_file(self.path, CACHE_VERSION)
        data.setdefault(kind, {})[key] = rate.to_json()
        write_cache_file(self.path, data, CACHE_VERSION)


# -- the calibration -----------------------------------------------------------------------
def _public_prompt(i: int, chat: bool) -> str | tuple[dict[str, str], ...]:
    text = f"Write a short message about {_TOPICS[i % len(_TOPICS)]}."
    return ({"role": "user", "content": text},) if chat else text


def calibrate_generator(gen: Any, prompts: int = PROMPTS, tokens: int = TOKENS) -> float:
    """New tokens a second of ``gen``: one untimed warm-up request, then ``prompts`` public
    prompts (at most its batch size) at once, ``tokens`` new tokens each, sampled at
    temperature 1 (the tokens it reports, else ``tokens`` each)."""
    n = max(1, min(prompts, int(getattr(gen, "batch_size", None) or prompts)))
    chat = bool(getattr(gen, "supports_chat", False))
    warm = SamplingParams(temperature=1.0, max_new_tokens=2, seed=0)
    gen.generate([GenerationRequest(_public_prompt(0, chat), warm, nonce="warm-up")],
                 progress=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=0)
    reqs = [GenerationRequest(_public_prompt(i, chat), params, nonce=i) for i in range(n)]
    started = time.perf_counter()
    if isinstance(gen, Completer):
        new = sum(c.completion_tokens or tokens for c in gen.complete(reqs, progress=False))
    else:
        gen.generate(reqs, progress=False)
        new = n * tokens
    return new / max(time.perf_counter() - started, 1e-6)


def public_texts(n: int = TEXTS) -> list[str]:
    """``n`` public texts of 8 to 64 words (built-in words, no data)."""
    out = []
    for i in range(n):
        length = 8 + (i * 7) % 57
        out.append(" ".join(_WORDS[(i + j) % len(_WORDS)] for j in range(length)))
    return out


def calibrate_embedder(embedder: Any, texts: int = TEXTS) -> float:
    """Texts a second of ``embedder`` on ``texts`` public texts (after an untimed warm-up)."""
    sample = public_texts(texts)
    embedder.embed(sample[:2])
    started = time.perf_counter()
    embedder.embed(sample)
    return len(sample) / max(time.perf_counter() - started, 1e-6)


def _timed(load: Callable[[], Any], measure: Callable[[Any], float]) -> Rate:
    """Load a model and measure it: its :class:`Rate`."""
    started = time.perf_counter()
    model = load()
    loaded = time.perf_counter()
    per_s = measure(model)
    close = getattr(model, "close", None)
    if callable(close):
        close()
    return Rate(per_s, loaded - started, time.perf_counter() - started)


def _measured(cache: RateCache, kind: str, key: str, calibrate: bool, what: str,
              load: Callable[[], Any], measure: Callable[[Any], float]) -> Measured:
    """The cached rate of ``key``, else (with ``calibrate``) one measured now and cached; a
    model that cannot be loaded or run here gives the reason instead."""
    cached = cache.get(kind, key)
    if cached is not None:
        return cached
    if not calibrate:
        return f"no calibration of {what} cached (run `dpsynth plan` without --no-calibrate)"
    try:
        with step(f"calibrating {what} on this machine"):
            rate = _timed(load, measure)
    except Exception as exc:  # a model that does not load here: say so, plan on
        return f"{what} could not be loaded or run here ({type(exc).__name__})"
    cache.put(kind, key, rate)
    return rate


def _given(model: Any, measure: Callable[[Any], float]) -> Rate:
    """The rate of a model the caller passed in (not cached: it is not the configured one)."""
    return _timed(lambda: model, measure)


def generator_rates(cfg: RunConfig, cache: RateCache, calibrate: bool,
                    given: Sequence[Any] | None = None,
                    first: int | None = None) -> list[Measured]:
    """Per configured generator (the ``first`` ones only, when given: a method that runs
    only those): its rate (cached, measured now, or of the given model), or why none."""
    out: list[Measured] = []
    for g, gcfg in enumerate(cfg.generators[:first]):
        if given is not None:
            out.append(_given(given[g], calibrate_generator))
        elif gcfg.backend != "local":
            out.append("remote generator")
        else:
            out.append(_measured(cache, "generator", generator_key(gcfg), calibrate,
                                 f"generator {gcfg.short_name}",
                                 lambda c=gcfg: load_generator(c.load_spec()),
                                 calibrate_generator))
    return out


def _load_embedder(ecfg: EmbedderConfig) -> Any:
    device = "cpu" if ecfg.device == "cpu" else resolve_device(ecfg.device)
    return Embedder(ecfg.model, batch_size=ecfg.batch_size, engine=ecfg.engine,
                    threads=ecfg.threads, device=device)


def embedder_rate(cfg: RunConfig, cache: RateCache, calibrate: bool,
                  given: Any = None) -> Measured:
    """The embedder's rate (cached, measured now, or of the given model), or why none."""
    if given is not None:
        return _given(given, calibrate_embedder)
    ecfg = cfg.embedder
    return _measured(cache, "embedder", embedder_key(ecfg), calibrate,
                     f"embedder {ecfg.model}", lambda: _load_embedder(ecfg), calibrate_embedder)


# -- the work and the estimate -------------------------------------------------------------
def _generation(work: Work, names: Sequence[str], max_tokens: Sequence[int],
                rates: Sequence[Measured]) -> Stage:
    tokens = (f"{max_tokens[0]}" if len(set(max_tokens)) == 1
              else "/".join(map(str, max_tokens)))
    shares = list(work.shares) or split_evenly(work.generations, len(rates))
    who = (", ".join(f"{n}: {k}" for n, k in zip(names, shares, strict=True)) if work.shares
           else ", ".join(names))
    text = f"{work.generations} texts x up to {tokens} tokens ({who}){work.prompts}"
    missing = [r for r in rates if not isinstance(r, Rate)]
    if missing:
        return Stage("generation", text, None, str(missing[0]))
    seconds = sum(n * t / r.per_s for n, t, r in zip(shares, max_tokens, rates, strict=True)
                  if isinstance(r, Rate))
    return Stage("generation", text, seconds)


def _at_rate(stage: str, work: str, items: int | None, rate: Measured,
           unknown: str = "") -> Stage:
    """A stage of ``items`` at ``rate`` (texts, or tokens a second); not estimated without
    a rate (its reason) or without a count (``unknown`` says why)."""
    if not isinstance(rate, Rate):
        return Stage(stage, work, None, rate)
    if items is None:
        return Stage(stage, work, None, unknown)
    return Stage(stage, work, items / rate.per_s)


def _embedding(work: Work, name: str, rate: Measured) -> Stage:
    text = (f"{work.private_records} private records + {work.synthetic_embeds} synthetic "
            f"texts ({name})")
    return _at_rate("embedding", text, work.private_records + work.synthetic_embeds, rate)


def _loading(models: Sequence[tuple[str, Measured]]) -> Stage:
    """Loading the models that were calibrated (their measured load times)."""
    loaded = [(n, r) for n, r in models if isinstance(r, Rate)]
    if loaded:
        return Stage("loading models", ", ".join(n for n, _ in loaded),
                     sum(r.load_s for _, r in loaded))
    return Stage("loading models", ", ".join(n for n, _ in models), None,
                 "no model calibrated")


def estimate_stages(work: Work, names: Sequence[str], max_tokens: Sequence[int],
                    gen_rates: Sequence[Measured], embedder: str, emb_rate: Measured | None,
                    preference: bool = False, extra: Sequence[Stage] = ()) -> list[Stage]:
    """A PE-family run's rows: loading the models, generation (the work's texts spread over
    the generators as its ``shares`` say, else evenly, each taking its max tokens: an upper
    bound), embedding (none when ``emb_rate`` is None: the run embeds nothing), the vote
    (negligible), the method's ``extra`` stages and, when on (Aug-PE), preference training
    (not estimated)."""
    models = [*zip(names, gen_rates, strict=True),
              *([(embedder, emb_rate)] if emb_rate is not None else [])]
    stages = [_loading(models), _generation(work, names, max_tokens, gen_rates)]
    if emb_rate is not None:
        stages.append(_embedding(work, embedder, emb_rate))
    if work.iterations:
        stages.append(Stage(work.vote, f"{work.iterations} round(s)", 0.0, "negligible"))
    stages += extra
    if preference:
        stages.append(Stage("preference training", f"after each of {work.iterations} votes",
                            None, "not calibrated"))
    return stages


@dataclass(frozen=True)
class RagWork:
    """What a DP-SynRAG build does (docs/methods.md §4), from its config: ``documents`` (None:
    unknown); the LLM's keywords of each, up to ``keyword_tokens`` new tokens (0: vocabulary
    matching only); ``passages`` texts (one per cluster: at most R, fewer when the noisy
    histogram seeds fewer) of up to ``tokens`` token steps, each step decoding ``contexts``
    rows (the cluster's document rows, ``document_tokens`` wide, and the public row); the
    self-filter's answer of ``filter_tokens`` tokens per passage (0: off)."""

    documents: int | None
    keyword_tokens: int
    passages: int
    tokens: int
    contexts: int
    document_tokens: int
    filter_tokens: int


def rag_work(documents: int | None, *, clusters: int, tokens: int, target_size: int,
             rows: int, public_row: bool, keyword_tokens: int, max_doc_tokens: int,
             filter_tokens: int) -> RagWork:
    """A build's :class:`RagWork`: a cluster holds about ``target_size`` (k) documents by
    design, decoded ``rows`` at a time in passes of that fixed shape (filler rows fill the
    last), so a token step decodes ``ceil(k / rows) x rows`` document rows, plus one public
    row when the public model runs (a public candidate set with top tokens, or the
    shortcut)."""
    contexts = math.ceil(target_size / rows) * rows + (1 if public_row else 0)
    return RagWork(documents, keyword_tokens, clusters, tokens, contexts, max_doc_tokens,
                   filter_tokens)


def rag_stages(work: RagWork, generator: str, embedder: str, gen_rate: Measured,
               emb_rate: Measured) -> list[Stage]:
    """A DP-SynRAG build's rows: loading, the LLM's keywords (one document a pass: the
    calibration's batched rate makes it a lower bound), the histogram, clusters and
    retrieval (negligible), the documents' and the passages' embedding, the private
    prediction (token steps x the rows each step decodes, at the generator's rate; the
    documents' prefill is not timed) and the self-filter when on."""
    docs = "?" if work.documents is None else str(work.documents)
    unknown = "the document count is unknown (plan with the data, or give --records N)"
    stages = [_loading([(generator, gen_rate), (embedder, emb_rate)])]
    if work.keyword_tokens:
        stages.append(_at_rate(
            "keyword extraction", f"{docs} documents x up to {work.keyword_tokens} tokens, one "
            "a pass (a lower bound)",
            None if work.documents is None else work.documents * work.keyword_tokens,
            gen_rate, unknown))
    else:
        stages.append(Stage("keyword extraction", f"{docs} documents, vocabulary matching",
                            0.0, "negligible"))
    stages.append(Stage("histogram, clusters and retrieval", f"up to {work.passages} "
                        "clusters", 0.0, "negligible"))
    stages.append(_at_rate("embedding", f"{docs} documents + {work.passages} passages "
                         f"({embedder})", None if work.documents is None
                         else work.documents + work.passages, emb_rate, unknown))
    stages.append(_at_rate(
        "private prediction", f"{work.passages} passages x {work.tokens} steps x "
        f"{work.contexts} rows (documents + public; their prefill of up to "
        f"{work.document_tokens} tokens not timed)",
        work.passages * work.tokens * work.contexts, gen_rate))
    if work.filter_tokens:
        stages.append(_at_rate("self-filter", f"{work.passages} passages x up to "
                             f"{work.filter_tokens} tokens", work.passages * work.filter_tokens,
                             gen_rate))
    return stages


#: why dp_finetune's training has no estimate (where it is not calibrated)
FINETUNE_REASON = ("per-sample gradients are not calibrated (benchmarks/results/dp_finetune.md "
                   "has measured ones)")
#: why a user-level training has none
USER_REASON = "a user's gradient takes a pass per record of theirs (their count is private)"


def training_rate(cache: RateCache, key: str, calibrate: bool, what: str,
                  load: Callable[[], Any], measure: Callable[[Any], float]) -> Measured:
    """The cached DP-SGD rate of ``key`` on this machine (per-record gradients a second on
    one thread), else (with ``calibrate``) ``measure(load())``'s, cached; else why none."""
    return _measured(cache, "dp_sgd", f"{key}|{machine()}", calibrate, what, load, measure)


def finetune_stages(work: TuneWork, generator: str, gen_rate: Measured,
                    train_rate: Measured = FINETUNE_REASON) -> list[Stage]:
    """A dp_finetune run's rows: loading the model in torch, the DP-SGD training at
    ``train_rate`` (per-record gradients a second on one thread, public records of the
    longest shape; shorter records train faster) over the work's pass workers, and the
    release's sampling
    at the configured generator's calibrated rate (the tuned model, its adapter merged,
    samples on the generator's own engine; its export or conversion is not counted)."""
    grads = math.ceil(work.steps * work.batch)
    text = (f"{work.steps} steps x {work.batch:.4g} expected {work.unit}s = about {grads} "
            f"per-{work.unit} gradients of up to {work.max_tokens} tokens")
    if work.unit != "record":
        training = Stage("DP-SGD training", text, None, USER_REASON)
    elif isinstance(train_rate, Rate):
        training = Stage("DP-SGD training", f"{text}, in {work.workers} process(es)",
                         grads / (train_rate.per_s * work.workers))
    else:
        training = Stage("DP-SGD training", text, None, train_rate)
    loading = (Stage("loading models", f"{generator} in torch with a LoRA adapter",
                     train_rate.load_s) if isinstance(train_rate, Rate) else
               Stage("loading models", f"{generator} in torch with a LoRA adapter", None,
                     "the torch load is not calibrated"))
    return [loading, training,
            _at_rate("release sampling", f"{work.samples} texts x up to {work.sample_tokens} "
                     f"tokens (the tuned model on {generator}'s engine, at its calibrated "
                     "rate)", work.samples * work.sample_tokens, gen_rate)]


@dataclass
class Estimate:
    """The estimated wall time of a run, stage by stage, and what it rests on."""

    stages: list[Stage]
    rates: list[Measured] = field(default_factory=list)
    machine: str = ""
    calibration_s: float = 0.0  # the calibrations' wall time (cached ones: when measured)
    cached: bool = False  # every rate came from the cache
    cache: str = ""
    #: the calibration also timed DP-SGD's per-record gradients (public records)
    gradients: bool = False

    @property
    def total_s(self) -> float:
        return sum(s.seconds or 0.0 for s in self.stages)

    @property
    def complete(self) -> bool:
        return all(s.seconds is not None for s in self.stages)

    def to_dict(self) -> dict[str, Any]:
        return {"stages": [asdict(s) for s in self.stages], "total_seconds": self.total_s,
                "complete": self.complete, "machine": self.machine,
                "calibration_seconds": self.calibration_s, "cached": self.cached,
                "cache": self.cache}

    def lines(self) -> list[str]:
        """The estimate as ``dpsynth plan`` prints it: a small table and its caveat."""
        rows = [(s.stage, s.work, s.time_text) for s in self.stages]
        total = duration(self.total_s)
        some = any(s.seconds is not None and not s.note for s in self.stages)
        rows.append(("total", "", total if self.complete else f"at least {total}" if some
                     else "not estimated"))
        wide = [max(len(r[i]) for r in [("stage", "work", ""), *rows]) for i in (0, 1)]
        out = [f"estimated wall time on this machine ({self.machine}):",
               f"  {'stage':<{wide[0]}}  {'work':<{wide[1]}}  estimated time"]
        out += [f"  {a:<{wide[0]}}  {b:<{wide[1]}}  {c}" for a, b, c in rows]
        out += textwrap.wrap(self.caveat(), 98, initial_indent="  ", subsequent_indent="  ")
        return out

    def caveat(self) -> str:
        if not any(isinstance(r, Rate) for r in self.rates):
            return "nothing was calibrated: no time estimated"
        how = (f"cached in {self.cache}; delete it to measure again" if self.cached
               else "measured now, cached for the next plan")
        grads = (", and DP-SGD's gradients of public records as long as the run's longest "
                 "(shorter records train faster; the steps' own work is not counted)"
                 if self.gradients else "")
        return (f"an estimate, not a promise: from a calibration of {self.calibration_s:.1f} s "
                f"on this machine ({how}) of up to {PROMPTS} prompts x {TOKENS} tokens and {TEXTS} "
                f"texts embedded{grads}; the run's batches, text lengths and the machine's load "
                "change it")


def _rates(cfg: RunConfig, cache: RateCache, calibrate: bool, generators: Sequence[Any] | None,
           embedder: Any, rates: tuple[Sequence[Measured], Measured] | None, embeds: bool,
           first: int | None = None) -> tuple[list[Measured], Measured | None]:
    """(the generators' rates, the embedder's or None when the run embeds nothing): ``rates``
    when given, else measured on the given models, else the configured ones'."""
    if rates is None:
        rates = (generator_rates(cfg, cache, calibrate, generators, first),
                 embedder_rate(cfg, cache, calibrate, embedder) if embeds else "")
    return list(rates[0]), rates[1] if embeds else None


def _estimate(stages: list[Stage], rates: Sequence[Measured | None],
              cache: RateCache) -> Estimate:
    """The :class:`Estimate` of ``stages`` resting on ``rates`` (None: a model not used)."""
    used = [r for r in rates if r is not None]
    measured = [r for r in used if isinstance(r, Rate)]
    return Estimate(stages, used, machine(), sum(r.seconds for r in measured),
                    bool(measured) and all(r.cached for r in measured), str(cache.path))


def estimate_run(cfg: RunConfig, work: Work, max_tokens: Sequence[int], *,
                 calibrate: bool = True, cache: RateCache | None = None,
                 generators: Sequence[Any] | None = None, embedder: Any = None,
                 rates: tuple[Sequence[Measured], Measured] | None = None,
                 extra: Sequence[Stage] = (), preference: bool = False) -> Estimate:
    """The :class:`Estimate` of ``cfg``'s PE-family run doing ``work`` (``max_tokens``: per
    generator; ``extra``: the method's own stages; ``preference``: Aug-PE's preference
    training is on). The rates are ``rates`` (generators', embedder's) when given, else
    measured on ``generators`` / ``embedder`` when given, else the configured models'
    (cached, or calibrated now unless ``calibrate`` is False)."""
    cache = cache or RateCache()
    embeds = work.private_records + work.synthetic_embeds > 0
    gen_rates, emb_rate = _rates(cfg, cache, calibrate, generators, embedder, rates, embeds)
    stages = estimate_stages(work, [g.short_name for g in cfg.generators], max_tokens,
                             gen_rates, cfg.embedder.model, emb_rate, preference, extra)
    return _estimate(stages, [*gen_rates, emb_rate], cache)


def estimate_rag(cfg: RunConfig, work: RagWork, *, calibrate: bool = True,
                 cache: RateCache | None = None, generator: Any = None, embedder: Any = None,
                 rates: tuple[Sequence[Measured], Measured] | None = None) -> Estimate:
    """The :class:`Estimate` of ``cfg``'s DP-SynRAG build doing ``work``: its first generator
    (the one it runs) and the embedder, rated as :func:`estimate_run` rates them."""
    cache = cache or RateCache()
    given = None if generator is None else [generator]
    gen_rates, emb_rate = _rates(cfg, cache, calibrate, given, embedder, rates, True, first=1)
    assert emb_rate is not None
    stages = rag_stages(work, cfg.generators[0].short_name, cfg.embedder.model, gen_rates[0],
                        emb_rate)
    return _estimate(stages, [gen_rates[0], emb_rate], cache)


def estimate_finetune(cfg: RunConfig, work: TuneWork, *, calibrate: bool = True,
                      cache: RateCache | None = None, generator: Any = None,
                      rates: tuple[Sequence[Measured], Measured] | None = None,
                      method: Any = None, train_rate: Measured | None = None) -> Estimate:
    """The :class:`Estimate` of ``cfg``'s dp_finetune run doing ``work``: its first
    generator (the base model) rated as :func:`estimate_run` rates it; its training at
    ``train_rate`` when given, else at the rate ``method`` (a
    :class:`~dpsynth.work.TuningMethod`) measures or the cache holds; no embedder."""
    cache = cache or RateCache()
    given = None if generator is None else [generator]
    gen_rates, _ = _rates(cfg, cache, calibrate, given, None, rates, False, first=1)
    if train_rate is None:
        key = None if method is None else method.training_key(cfg)
        train_rate = (FINETUNE_REASON if key is None or work.unit != "record" else
                      training_rate(cache, key, calibrate, "DP-SGD's per-record gradients",
                                    lambda: method.training_probe(cfg),
                                    method.gradients_per_second))
    stages = finetune_stages(work, cfg.generators[0].short_name, gen_rates[0], train_rate)
    estimate = _estimate(stages, [gen_rates[0], train_rate], cache)
    estimate.gradients = isinstance(train_rate, Rate)
    return estimate
