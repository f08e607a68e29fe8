"""How long a PE-family run will take on this machine (``dpsynth plan``): a short calibration
of the configured models, multiplied by the counts the plan already knows.

* The calibration loads each configured local generator and the embedder (or the models a
  caller passes in, e.g. a test's fakes), generates a few public prompts (:data:`PROMPTS`, at
  most the generator's batch) for :data:`TOKENS` new tokens and embeds :data:`TEXTS` public
  texts, timing each. The rates are cached in the user's cache directory
  (``$XDG_CACHE_HOME/dpsynth/calibration.json``, else ``~/.cache/dpsynth/``), keyed by the
  model, its engine settings and this machine's CPU, so a second ``plan`` is instant.
* A remote (OpenAI-compatible) generator is never timed: its stage says "not estimated:
  remote generator" instead of a number.
* The estimate (:func:`estimate_stages`) multiplies the rates by the run's work
  (:func:`pe_work`): texts generated x their max tokens, texts embedded (the private records
  once, each iteration's candidates); the private vote is a nearest-neighbour search and the
  noise: negligible.

Everything here is public: the calibration reads only built-in public texts, the rates are
facts about this machine and the models, and the work is computed from the plan's counts (its
record count is the one ``plan`` already prints, a stated one with ``--no-data``).
"""

from __future__ import annotations

import json
import os
import platform
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .embed import Embedder
from .files import atomic_write_json
from .llm import GenerationRequest, SamplingParams, load_generator
from .llm.base import Completer
from .llm.runtime import available_cores, resolve_device
from .progress import step

if TYPE_CHECKING:
    from .config import EmbedderConfig, GeneratorConfig, RunConfig

__all__ = ["PROMPTS", "TEXTS", "TOKENS", "Estimate", "Rate", "RateCache", "Stage", "Work",
           "calibrate_embedder", "calibrate_generator", "estimate_run", "estimate_stages",
           "pe_work"]

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
    return "|".join(map(str, (gcfg.model, gcfg.engine, _installed("ctranslate2"), gcfg.device,
                               gcfg.batch_size, gcfg.threads, machine())))


def embedder_key(ecfg: EmbedderConfig) -> str:
    """The cache key of the embedder's rate (model, engine settings, CPU)."""
    return "|".join(map(str, (ecfg.model, ecfg.engine, _installed("openvino", "onnxruntime"),
                               ecfg.device, ecfg.batch_size, ecfg.threads, machine())))


def cache_path() -> Path:
    """``$XDG_CACHE_HOME/dpsynth/calibration.json``, else ``~/.cache/dpsynth/...``."""
    root = os.environ.get("XDG_CACHE_HOME")
    base = Path(root).expanduser() if root else Path.home() / ".cache"
    return base / "dpsynth" / "calibration.json"


class RateCache:
    """The measured rates on disk (public facts about this machine), by kind
    (``generator`` / ``embedder``) and key."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else cache_path()

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) and data.get("version") == CACHE_VERSION else {}

    def get(self, kind: str, key: str) -> Rate | None:
        entry = self._read().get(kind, {}).get(key)
        try:
            return Rate(float(entry["per_s"]), float(entry["load_s"]), float(entry["seconds"]),
                        cached=True)
        except (TypeError, KeyError, ValueError):
            return None

    def put(self, kind: str, key: str, rate: Rate) -> None:
        """Store ``rate`` (a cache that cannot be written only costs a later calibration)."""
        data = self._read() or {"version": CACHE_VERSION}
        data.setdefault(kind, {})[key] = rate.to_json()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, data)
        except OSError:
            pass


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
                    given: Sequence[Any] | None = None) -> list[Measured]:
    """Per configured generator: its rate (cached, measured now, or of the given model), or
    why there is none."""
    out: list[Measured] = []
    for g, gcfg in enumerate(cfg.generators):
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
@dataclass(frozen=True)
class Work:
    """What a PE-family run does, from its plan: texts generated, private records embedded
    (once), synthetic texts embedded (each iteration's candidates), voting rounds."""

    generations: int
    private_records: int
    synthetic_embeds: int
    iterations: int


def pe_work(records: int, samples: int, candidates: int, population: int, iterations: int,
            lookahead: int = 0) -> Work:
    """Aug-PE's arithmetic (the other PE methods are close to it): the initial pool
    (``max(samples, candidates)``, the zero-shot reference drawn from it), then each round
    but the last the ``candidates - population`` variations of the kept samples, and after
    the last the release's top-up to ``samples``; ``lookahead`` variations of every
    candidate a round (generated and embedded). Each round embeds its candidates; the
    private records are embedded once when there is a vote."""
    generations = max(samples, candidates)
    if iterations:
        generations += (iterations - 1) * max(candidates - population, 0)
        generations += max(samples - population, 0) + iterations * candidates * lookahead
    return Work(generations, records if iterations else 0,
                iterations * candidates * (1 + lookahead), iterations)


@dataclass(frozen=True)
class Stage:
    """One row of the estimate: its ``stage``, the ``work`` it does, its ``seconds`` (None:
    not estimated, ``note`` says why; 0 with ``note`` "negligible")."""

    stage: str
    work: str
    seconds: float | None
    note: str = ""

    @property
    def time_text(self) -> str:
        if self.seconds is None:
            return f"not estimated: {self.note}"
        return self.note if self.note else duration(self.seconds)


def duration(seconds: float) -> str:
    """``about 40 s``, ``about 3 min``, ``about 1 h 20 min``."""
    if seconds < 1:
        return "under 1 s"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60:02d} min"


def _split(n: int, parts: int) -> list[int]:
    """``n`` texts over ``parts`` generators, as even as can be."""
    return [n // parts + (1 if g < n % parts else 0) for g in range(parts)]


def _generation(work: Work, names: Sequence[str], max_tokens: Sequence[int],
                rates: Sequence[Measured]) -> Stage:
    tokens = (f"{max_tokens[0]}" if len(set(max_tokens)) == 1
              else "/".join(map(str, max_tokens)))
    text = f"{work.generations} texts x up to {tokens} tokens ({', '.join(names)})"
    missing = [r for r in rates if not isinstance(r, Rate)]
    if missing:
        return Stage("generation", text, None, str(missing[0]))
    seconds = sum(n * t / r.per_s for n, t, r in zip(
        _split(work.generations, len(rates)), max_tokens, rates, strict=True)
        if isinstance(r, Rate))
    return Stage("generation", text, seconds)


def _embedding(work: Work, name: str, rate: Measured) -> Stage:
    text = (f"{work.private_records} private records + {work.synthetic_embeds} synthetic "
            f"texts ({name})")
    if not isinstance(rate, Rate):
        return Stage("embedding", text, None, rate)
    return Stage("embedding", text, (work.private_records + work.synthetic_embeds) / rate.per_s)


def estimate_stages(work: Work, names: Sequence[str], max_tokens: Sequence[int],
                    gen_rates: Sequence[Measured], embedder: str, emb_rate: Measured | None,
                    preference: bool = False) -> list[Stage]:
    """The estimate's rows: loading the models, generation (the work's texts spread evenly
    over the generators, each taking its max tokens: an upper bound), embedding (none when
    ``emb_rate`` is None: the run embeds nothing), the vote (negligible) and, when on,
    preference training (not estimated)."""
    models = [*zip(names, gen_rates, strict=True),
              *([(embedder, emb_rate)] if emb_rate is not None else [])]
    loaded = [(n, r) for n, r in models if isinstance(r, Rate)]
    load = (Stage("loading models", ", ".join(n for n, _ in loaded),
                  sum(r.load_s for _, r in loaded)) if loaded
            else Stage("loading models", ", ".join(n for n, _ in models), None,
                       "no model calibrated"))
    stages = [load, _generation(work, names, max_tokens, gen_rates)]
    if emb_rate is not None:
        stages.append(_embedding(work, embedder, emb_rate))
    if work.iterations:
        stages.append(Stage("private vote and noise", f"{work.iterations} round(s)", 0.0,
                            "negligible"))
    if preference:
        stages.append(Stage("preference training", f"after each of {work.iterations} votes",
                            None, "not calibrated"))
    return stages


@dataclass
class Estimate:
    """The estimated wall time of a run, stage by stage, and what it rests on."""

    stages: list[Stage]
    rates: list[Measured] = field(default_factory=list)
    machine: str = ""
    calibration_s: float = 0.0  # the calibrations' wall time (cached ones: when measured)
    cached: bool = False  # every rate came from the cache
    cache: str = ""

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
        return (f"an estimate, not a promise: from a calibration of {self.calibration_s:.1f} s "
                f"on this machine ({how}) of up to {PROMPTS} prompts x {TOKENS} tokens and {TEXTS} "
                "texts embedded; the run's batches, text lengths and the machine's load "
                "change it")


def estimate_run(cfg: RunConfig, work: Work, max_tokens: Sequence[int], *,
                 calibrate: bool = True, cache: RateCache | None = None,
                 generators: Sequence[Any] | None = None, embedder: Any = None,
                 rates: tuple[Sequence[Measured], Measured] | None = None) -> Estimate:
    """The :class:`Estimate` of ``cfg``'s run doing ``work`` (``max_tokens``: per
    generator). The rates are ``rates`` (generators', embedder's) when given, else measured
    on ``generators`` / ``embedder`` when given, else the configured models' (cached, or
    calibrated now unless ``calibrate`` is False)."""
    cache = cache or RateCache()
    embeds = work.private_records + work.synthetic_embeds > 0
    if rates is None:
        rates = (generator_rates(cfg, cache, calibrate, generators),
                 embedder_rate(cfg, cache, calibrate, embedder) if embeds else "")
    gen_rates, emb_rate = list(rates[0]), rates[1] if embeds else None
    measured = [r for r in [*gen_rates, emb_rate] if isinstance(r, Rate)]
    stages = estimate_stages(work, [g.short_name for g in cfg.generators], max_tokens,
                             gen_rates, cfg.embedder.model, emb_rate,
                             cfg.synthesis.preference.enabled)
    return Estimate(stages, [*gen_rates, *([emb_rate] if emb_rate is not None else [])],
                    machine(),
                    sum(r.seconds for r in measured),
                    bool(measured) and all(r.cached for r in measured), str(cache.path))
