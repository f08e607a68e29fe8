"""Local generation on CPU (or a GPU): :class:`LocalGenerator`, the embedded GGUF models or any
HF model directory (:mod:`dpsynth.llm.models`).

Sampling runs on OpenVINO bf16 where the CPU multiplies bf16 natively and the model's decoder
exports (:mod:`dpsynth.llm.ov_generate`), else on CTranslate2 int8 when it is installed
(:mod:`dpsynth.llm.ct2`, converted once from the float32 directory and cached beside it), else
on transformers; threads follow :func:`dpsynth.llm.runtime.default_threads` (never more than
the idle cores; OpenVINO: :func:`~dpsynth.llm.runtime.stepper_threads`, fixed, since its numbers
follow the thread count); batches and their seeds follow :mod:`dpsynth.llm.batching` (OpenVINO
draws from a generator per request seed); DP-SynRAG's KV-cached :class:`Stepper` is
:mod:`dpsynth.llm.stepper`.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from . import ct2, ov_generate, ov_stepper
from .base import (
    FALLBACK_STOPS,
    Completion,
    GenerationError,
    GenerationRequest,
    ResultCallback,
    SamplingParams,
    apply_stops,
    progress_bar,
    render_chat_fallback,
)
from .batching import batch_seed, plan_batches
from .models import (
    EMBEDDED_MODELS,
    MARKER,
    convert_gguf,
    default_model_cache,
    embedded_gguf_path,
    generation_eos,
    quiet_transformers,
)
from .runtime import (
    AUTO_BATCH,
    available_cores,
    default_threads,
    idle_threads,
    import_openvino,
    resolve_device,
    resolve_engine,
    stepper_threads,
)
from .stepper import SharedTokenStepper, Stepper, rows_apart_of

if TYPE_CHECKING:
    import torch

__all__ = ["LocalGenerator", "Stepper"]

log = logging.getLogger(__name__)

#: dtypes of the Stepper's model (:meth:`LocalGenerator.set_logits_dtype`)
LOGITS_DTYPES = ("float32", "bfloat16")
#: engines of the Stepper (:meth:`LocalGenerator.set_stepper_engine`)
STEPPER_ENGINES = ("transformers", "openvino")


#: CPU flags (Linux ``/proc/cpuinfo``) of native bf16 matrix instructions.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def native_bf16(flags: set[str] | frozenset[str]) -> bool:
    """Whether a CPU with these feature ``flags`` runs bf16 matrix products natively
    (AVX512-BF16 or AMX-BF16). AVX512 alone is not enough: there oneDNN and OpenVINO emulate
    bf16 by conversions (measured on an AVX512-VNNI Xeon without AVX512-BF16: the OpenVINO bf16
    stepper 14x slower than float32; benchmarks/results/private_prediction.md)."""
    return bool(NATIVE_BF16_FLAGS & set(flags))


def cpu_flags() -> frozenset[str]:
    """This CPU's bf16 feature flags: torch's own checks (any OS; every CPU with AMX tiles so
    far has AMX-BF16), else every flag of ``/proc/cpuinfo``."""
    try:
        import torch

        cpu = torch.cpu
        return frozenset(flag for flag, check in (
            ("avx512_bf16", "_is_avx512_bf16_supported"), ("amx_bf16", "_is_amx_tile_supported"))
            if bool(getattr(cpu, check)()))
    except (ImportError, AttributeError, RuntimeError):
        pass
    try:
        text = Path("/proc/cpuinfo").read_text("utf-8", errors="replace")
    except OSError:
        return frozenset()
    return frozenset(w for line in text.splitlines() if line.startswith("flags")
                     for w in line.split(":", 1)[1].split())


def bf16_supported() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX), where bf16
    weights run faster than float32; elsewhere bf16 is emulated and slower. (oneDNN's own
    ``_is_mkldnn_bf16_supported`` says yes on any AVX512 core, emulated included.)"""
    return native_bf16(cpu_flags())


def openvino_fits(gen: Any) -> bool:
    """Whether ``engine: auto`` runs ``gen`` on OpenVINO: the CPU multiplies bf16 natively
    (:func:`bf16_supported`), the decoder runs on at least two threads (OpenVINO compiles bf16
    for two or more, :func:`~dpsynth.llm.ov_stepper.runnable_precision`) and its config
    exports (:func:`~dpsynth.llm.ov_stepper.unsupported_config`). Read from ``config.json``:
    nothing is loaded to decide."""
    return (bf16_supported() and stepper_threads(gen) >= 2
            and openvino_refusal(Path(gen.model_dir)) is None)


def openvino_refusal(model_dir: Path) -> str | None:
    """Why the OpenVINO engine cannot run the model in ``model_dir`` (None: it can), from its
    ``config.json`` (:func:`~dpsynth.llm.ov_stepper.unsupported_config`), loading nothing."""
    try:
        import_openvino()
    except ImportError:
        return "openvino is not installed"
    return ov_stepper.unsupported_config(json.loads((model_dir / "config.json").read_text()))


class LocalGenerator:
    """A local causal LM (on the CPU, or a GPU with ``device``) behind the
    :class:`~dpsynth.llm.base.Generator` protocol.

    ``model`` is ``"smollm2"``, ``"gemma3"`` or a local HF model directory. ``engine``:
    ``"openvino"`` (bf16, :mod:`dpsynth.llm.ov_generate`), ``"ctranslate2"`` (int8, see
    :mod:`dpsynth.llm.ct2`), ``"transformers"`` (float32) or ``"auto"`` (openvino where
    :func:`openvino_fits`, else ctranslate2 when installed and the model converts, else
    transformers). Whatever the engine, prompts are rendered and tokenised by
    the model's HF tokenizer, and next-token logits / the KV-cached :class:`Stepper`
    (DP-SynRAG, docs/methods.md §4) run on the float32 transformers model, loaded lazily
    (at once on openvino, whose output layer is a bf16 copy of its weights).

    Requests are grouped by their sampling parameters without the seed (so mixed parameters
    do not shrink batches to one), cut into batches of ``batch_size`` (default
    :data:`AUTO_BATCH` of the engine) and decoded; the prompt is stripped from the output and
    stop strings applied. Seeds: see :func:`batch_seed` (openvino: each request's own, see
    :mod:`dpsynth.llm.sampling`). ``load_source`` says where the float
    weights came from: ``"gguf"`` (de-quantised now and cached), ``"cache"`` or
    ``"directory"``; ``ct2_converted`` whether the int8 conversion was written now.
    """

    def __init__(
        self,
        model: str | Path = "smollm2",
        *,
        cache_dir: Path | None = None,
        batch_size: int | None = None,
        num_threads: int | None = None,
        engine: str = "auto",
        device: str = "cpu",
    ) -> None:
        """Load ``model``; ``num_threads`` defaults to :func:`default_threads`. ``device``
        (:func:`resolve_device`): ``cpu``, ``cuda``, ``cuda:N`` or ``auto``; on a GPU the
        transformers engine runs there (``engine: auto`` picks it: ctranslate2 int8 is the
        CPU path)."""
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        requested = engine
        engine = self._place(engine, device)
        spec, embedded, root = self._locate(model, cache_dir)
        self._set_threads(num_threads)
        #: the threads the caller asked for (None: chosen from the idle cores per batch); a
        #: pass whose numbers follow the thread count runs on these or on every core
        self.configured_threads = num_threads
        self.load_source = self._float_weights(spec, embedded, root)
        self._read_tokenizer()
        self.last_batch_sizes: list[int] = []
        self.generated_tokens = 0
        self.ct2_converted = False
        self._ct2: Any = None
        self._ov: Any = None
        if requested == "auto" and self.device == "cpu" and openvino_fits(self):
            engine = self._open_openvino_or(engine)
        elif engine == "openvino":
            why = openvino_refusal(Path(self.model_dir))
            if why:
                raise ConfigError(f"{self.name}: engine 'openvino' cannot run it ({why}); use "
                                  "engine 'auto' or 'ctranslate2'")
            self._open_openvino()
        if engine == "ctranslate2":
            engine = self._open_ct2(requested, root, embedded, num_threads)
        self.engine: str = engine
        self.batch_size: int = batch_size or AUTO_BATCH[engine]
        if engine == "transformers":
            self._load_model()

    @property
    def sampling_engine(self) -> Any:
        """The sampling engine object (openvino or ctranslate2), None on transformers."""
        return self._ov if self._ov is not None else self._ct2

    # ---------------------------------------------------------------- construction
    def _place(self, engine: str, device: str) -> str:
        """Set :attr:`device`; the engine to run (a GPU runs transformers)."""
        self.device = resolve_device(device)
        if self.device != "cpu":
            if engine in ("ctranslate2", "openvino"):
                raise ConfigError(f"engine {engine!r} runs on the CPU in dpsynth; with "
                                  f"device {device!r} use engine 'transformers' (or 'auto')")
            engine = "transformers"
        return resolve_engine(engine)

    def _locate(self, model: str | Path, cache_dir: Path | None) -> tuple[str, bool, Path]:
        """Set :attr:`model_dir`, :attr:`model_id` and :attr:`name`; (spec, whether it is an
        embedded model, the model cache root)."""
        spec = str(model)
        if spec.startswith("local:"):
            spec = spec[len("local:") :]
        embedded = spec in EMBEDDED_MODELS
        root = Path(cache_dir) if cache_dir is not None else default_model_cache()
        if embedded:
            model_dir = root / spec
            self.model_id = spec
        else:
            model_dir = Path(spec).expanduser()
            if not (model_dir / "config.json").is_file():
                raise ValueError(
                    f"model {spec!r}: expected one of {EMBEDDED_MODELS} or a local "
                    "transformers model directory (with config.json)"
                )
            self.model_id = model_dir.resolve().name
        self.model_dir = model_dir
        self.name = f"local:{self.model_id}"
        return spec, embedded, root

    def _set_threads(self, num_threads: int | None) -> None:
        """Set :attr:`num_threads` (never more than the cores) and torch's threads to it."""
        import torch

        threads = min(num_threads or default_threads(), available_cores())
        self.num_threads = threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def _float_weights(self, spec: str, embedded: bool, root: Path) -> str:
        """Make sure the float weights are in :attr:`model_dir`; where they came from:
        ``"directory"``, ``"cache"`` or ``"gguf"`` (de-quantised now)."""
        if not embedded:
            return "directory"
        if (self.model_dir / MARKER).is_file():
            return "cache"
        gguf = embedded_gguf_path(spec, root)
        convert_gguf(gguf, self.model_dir)
        if gguf.parent == root / "_gguf":  # assembled by us from chunks: not needed now
            gguf.unlink(missing_ok=True)
        return "gguf"

    def _read_tokenizer(self) -> None:
        """Load the tokenizer; set the end-of-sequence and padding ids, chat support, the
        context length and the vocabulary size."""
        from transformers import AutoConfig, AutoTokenizer

        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
            config = AutoConfig.from_pretrained(str(self.model_dir))
        self._model: Any = None
        tok = self.tokenizer
        tok.padding_side = "left"
        eos: list[int] = []
        for e in (tok.eos_token_id, *generation_eos(self.model_dir)):
            if e is not None and e not in eos:
                eos.append(int(e))
        if not eos:
            raise GenerationError(f"{self.name}: the tokenizer has no end-of-sequence token")
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        self.eos_token_id: int = eos[0]
        pad = tok.pad_token_id
        self.pad_token_id: int = int(pad) if pad is not None else self.eos_token_id
        self.supports_chat: bool = bool(getattr(tok, "chat_template", None))
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.max_context: int = int(
            getattr(text_config, "max_position_embeddings", None) or 2048
        )
        self.vocab_size: int = int(text_config.vocab_size)

    def _open_openvino(self) -> None:
        """Export (once) and compile the OpenVINO engine: bf16 where the CPU has it natively
        (emulated bf16 is many times slower), else f32."""
        try:
            self._ov = ov_generate.OpenVinoEngine(self, "bf16" if bf16_supported() else "f32")
        except Exception as exc:
            raise GenerationError(f"{self.name}: the OpenVINO engine cannot open "
                                  f"({type(exc).__name__}: {exc})") from exc

    def _open_openvino_or(self, fallback: str) -> str:
        """``engine: auto``'s OpenVINO engine, or ``fallback`` (what ``auto`` picks without it)
        with a warning when its export or compile fails (e.g. a read-only model directory,
        beside which the export is written)."""
        try:
            self._open_openvino()
        except GenerationError as exc:
            log.warning("%s: the OpenVINO engine cannot open (%s); using %s", self.name,
                        type(exc.__cause__).__name__, fallback)
            self._ov = None
            return fallback
        return "openvino"

    def _open_ct2(self, requested: str, root: Path, embedded: bool,
                  num_threads: int | None) -> str:
        """Convert to ctranslate2 int8 (once) and open its engine; the engine then run:
        ``"ctranslate2"``, or ``"transformers"`` when ``auto`` picked it and it cannot convert."""
        out_dir = ct2.converted_dir(self.model_dir, root, self.model_id, embedded)
        try:
            self.ct2_converted = ct2.ensure_converted(self.model_dir, out_dir)
        except Exception as exc:
            if requested == "ctranslate2":
                raise GenerationError(
                    f"{self.name}: conversion to ctranslate2 failed ({type(exc).__name__}: "
                    f"{exc})"
                ) from exc
            log.warning(
                "%s: ctranslate2 cannot convert this model (%s); using transformers",
                self.name,
                type(exc).__name__,
            )
            return "transformers"
        # Without num_threads each batch re-reads the idle cores (a fresh engine per
        # sampled batch anyway), so a run never oversubscribes when the load rises.
        self._ct2 = ct2.Ct2Engine(
            out_dir,
            self.tokenizer,
            threads=self.num_threads if num_threads else idle_threads,
            eos_token_ids=self.eos_token_ids,
        )
        self.ct2_dir = out_dir
        return "ctranslate2"

    # ------------------------------------------------------------------ model
    @property
    def model(self) -> Any:
        """The float32 transformers model (loaded on first use with the ctranslate2 engine)."""
        if self._model is None:
            self._load_model()
        return self._model

    def _load_model(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), dtype=torch.float32
            )
        model.to(self.device)
        model.eval()
        fwd = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in fwd else "past_key_values"
        self._last_only = "logits_to_keep" in fwd
        self._model = model

    def forward_last(self, cache: Any = None, **inputs: Any) -> tuple[torch.Tensor, Any]:
        """One forward pass: (last-position logits ``[B, V]``, KV cache or None)."""
        model = self.model  # loads it first if needed (sets the keyword names below)
        kw: dict[str, Any] = {k: v.to(self.device) if hasattr(v, "to") else v
                              for k, v in inputs.items()}
        if cache is not None:
            kw[self._cache_kw] = cache
        if self._last_only:
            kw["logits_to_keep"] = 1
        out = model(**kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = getattr(out, "past_key_values", None)
        return out.logits[:, -1, :], new_cache

    # ------------------------------------------------------------------ tokens
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special tokens dropped."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a whole prompt, with the tokenizer's usual special tokens (e.g. BOS)."""
        bos = self.tokenizer.bos_token
        add = not (bos and text.startswith(bos))
        return list(self.tokenizer.encode(text, add_special_tokens=add))

    def render(self, request: GenerationRequest) -> tuple[str, tuple[str, ...], bool]:
        """Prompt text, effective stop strings and whether it is a chat prompt."""
        if isinstance(request.prompt, str):
            return request.prompt, request.params.stop, False
        if self.supports_chat:
            text = self.tokenizer.apply_chat_template(
                list(request.prompt), tokenize=False, add_generation_prompt=True
            )
            return str(text), request.params.stop, True
        return render_chat_fallback(request.prompt), request.params.stop + FALLBACK_STOPS, True

    def pad_left(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token rows left-padded to the longest: (ids, attention mask), int64 [B, width]
        (the steppers open their rows with it too)."""
        import torch

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            if r:
                ids[i, width - len(r) :] = torch.tensor(list(r), dtype=torch.long)
                mask[i, width - len(r) :] = 1
        return ids, mask

    # -------------------------------------------------------------- generation
    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[str]:
        """Generate one text per request, same order (see the class docstring)."""
        return [c.text for c in self.complete(requests, progress=progress, on_result=on_result)]

    def complete(
        self,
        requests: Sequence[GenerationRequest],
        *,
        progress: bool = True,
        on_result: ResultCallback | None = None,
    ) -> list[Completion]:
        """:meth:`generate` with how each text ended and its token counts."""
        rendered = [self.render(r) for r in requests]
        encoded = [self.encode_prompt(text) for text, _, _ in rendered]
        for i, (ids, req) in enumerate(zip(encoded, requests, strict=True)):
            if len(ids) + req.params.max_new_tokens > self.max_context:
                raise GenerationError(
                    f"{self.name}: request {i} needs {len(ids)} prompt + "
                    f"{req.params.max_new_tokens} new tokens, over the context of "
                    f"{self.max_context}",
                    completed=0,
                    total=len(requests),
                )
        batches = self.plan_batches(requests, [len(ids) for ids in encoded])
        self.last_batch_sizes = [len(b) for b in batches]
        out: list[Completion | None] = [None] * len(requests)
        with progress_bar(progress, len(requests), f"{self.name} generating (texts)") as advance:
            for batch in batches:
                params = requests[batch[0]].params.without_seed()
                done = self._generate_batch(
                    [encoded[i] for i in batch],
                    params,
                    [requests[i].params.seed for i in batch],
                    [rendered[i][1] for i in batch],
                    [rendered[i][2] for i in batch],
                )
                for i, c in zip(batch, done, strict=True):
                    out[i] = c
                    if on_result is not None:
                        on_result(i, c.text)
                advance(len(batch))
        return [c if c is not None else Completion("", "stop") for c in out]

    def plan_batches(
        self, requests: Sequence[GenerationRequest], lengths: Sequence[int] | None = None
    ) -> list[list[int]]:
        """Request indices in batches (see :func:`plan_batches`).

        On ctranslate2 batches are sorted by prompt length: it feeds a batch's prompts at once
        only up to the shortest one and the rest a token per decoding step; on openvino too,
        where a batch's prompts are left-padded to the longest.
        """
        return plan_batches(requests, self.batch_size,
                            lengths if self.sampling_engine is not None else None)

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int | None],
        stops: Sequence[tuple[str, ...]],
        chat: Sequence[bool],
    ) -> list[Completion]:
        """One batch on the engine: texts, how they ended, token counts (EOS included)."""
        if self._ov is not None:
            rows = self._ov.generate(prompts, params, seeds, stops, self.decode)
            return self._finish_rows(prompts, rows, stops, chat)
        if self._ct2 is not None:
            return self._generate_batch_ct2(prompts, params, seeds, stops, chat)
        import torch
        from transformers import GenerationConfig

        ids, mask = self.pad_left(prompts)
        sample = params.temperature > 0
        cfg = GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=sample,
            temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None,
            top_k=params.top_k if sample else None,
            pad_token_id=self.pad_token_id,
            eos_token_id=list(self.eos_token_ids),
        )
        kwargs: dict[str, Any] = {}
        if len(set(stops)) == 1 and stops[0]:
            cfg.stop_strings = list(stops[0])
            kwargs["tokenizer"] = self.tokenizer
        seed = batch_seed(seeds)
        with torch.inference_mode(), torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            try:
                out = self.model.generate(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                    generation_config=cfg, **kwargs
                )
            except Exception as exc:  # the message of a torch error holds no prompt text
                raise GenerationError(
                    f"{self.name}: model.generate failed ({type(exc).__name__})"
                ) from exc
        eos = set(self.eos_token_ids)
        kept, counts, ended = [], [], []
        for row in out[:, ids.shape[1] :].tolist():
            n = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
            kept.append(row[:n])
            counts.append(n)
            ended.append(n > 0 and row[n - 1] in eos)
        return self._finish(prompts, kept, counts, ended, stops, chat)

    def _generate_batch_ct2(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int | None],
        stops: Sequence[tuple[str, ...]],
        chat: Sequence[bool],
    ) -> list[Completion]:
        rows = self._ct2.generate(prompts, params, batch_seed(seeds), stops, self.decode)
        return self._finish_rows(prompts, rows, stops, chat)

    def _finish_rows(self, prompts: Sequence[Sequence[int]], rows: list[tuple[list[int], bool]],
                     stops: Sequence[tuple[str, ...]], chat: Sequence[bool]) -> list[Completion]:
        """:meth:`_finish` of an engine's rows: (ids without EOS, whether EOS ended it)."""
        return self._finish(prompts, [ids for ids, _ in rows],
                            [len(ids) + int(ended) for ids, ended in rows],
                            [ended for _, ended in rows], stops, chat)

    def _finish(self, prompts: Sequence[Sequence[int]], rows: Sequence[Sequence[int]],
                counts: list[int], ended: Sequence[bool], stops: Sequence[tuple[str, ...]],
                chat: Sequence[bool]) -> list[Completion]:
        """Decode generated ids (either engine), cut at stop strings, strip chat replies.

        ``ended``: the row ended with an end-of-sequence token; a row that did not and holds
        no stop string was cut by ``max_new_tokens`` (finish reason ``"length"``).
        """
        out = []
        for prompt, ids, n, eos, row_stops, is_chat in zip(prompts, rows, counts, ended, stops,
                                                            chat, strict=True):
            raw = self.decode(ids)
            text = apply_stops(raw, row_stops)
            stopped = eos or any(s in raw for s in row_stops)
            out.append(Completion(text.strip() if is_chat else text,
                                  "stop" if stopped else "length", len(prompt), n))
        self.generated_tokens += sum(counts)
        return out

    # ------------------------------------------------------------------ logits
    def next_token_logits(self, prompts: Sequence[str]) -> np.ndarray:
        """Next-token logits ``[B, vocab]`` (float32) of plain-text prompts, left-padded batch."""
        return self.next_token_logits_ids([self.encode_prompt(p) for p in prompts])

    def next_token_logits_ids(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Next-token logits ``[B, vocab]`` (float32) of token-id rows, left-padded batch."""
        import torch

        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("next_token_logits: every prompt must have at least one token")
        ids, mask = self.pad_left(rows)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits, _ = self.forward_last(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False
            )
        return logits.float().cpu().numpy().astype(np.float32, copy=False)

    def set_logits_dtype(self, dtype: str) -> None:
        """Run the :class:`Stepper` (DP-SynRAG's private prediction) in ``dtype``:
        ``"float32"`` (the float weights as loaded) or ``"bfloat16"`` (a converted copy, made
        on first use; :meth:`next_token_logits` keeps float32). The bf16 copy is measured
        against float32 in ``dpsynth bench private-prediction`` (KL per token)."""
        if dtype not in LOGITS_DTYPES:
            raise ConfigError(f"logits dtype must be one of {LOGITS_DTYPES}, got {dtype!r}")
        self.logits_dtype = dtype

    def stepper_model(self) -> Any:
        """The model the :class:`Stepper` runs: float32, or its bf16 copy (see
        :meth:`set_logits_dtype`)."""
        dtype = getattr(self, "logits_dtype", "float32")
        if dtype == "float32":
            return self.model
        if getattr(self, "_bf16_model", None) is None:
            import copy

            import torch

            self._bf16_model = copy.deepcopy(self.model).to(torch.bfloat16).eval()
        return self._bf16_model

    def set_stepper_engine(self, engine: str) -> None:
        """Run the :class:`Stepper` on ``"transformers"`` (torch, in :attr:`logits_dtype`) or
        ``"openvino"`` (:mod:`dpsynth.llm.ov_stepper`: exported and compiled now, so a model it
        cannot run fails here, before any private document is read; bf16 when
        :attr:`logits_dtype` is bfloat16, else f32). Either runs on
        :func:`~dpsynth.llm.runtime.stepper_threads` from here on, not on the idle cores:
        logits follow the thread count (torch's float32 too, by up to 6e-5 between one thread
        and two), and a seeded build releases the same text whatever the machine's load."""
        if engine not in STEPPER_ENGINES:
            raise ConfigError(f"stepper engine must be one of {STEPPER_ENGINES}, got {engine!r}")
        self._set_threads(stepper_threads(self))
        if engine == "openvino":
            ov_stepper.compiled(self, self._ov_precision())
        self.stepper_engine = engine

    @contextlib.contextmanager
    def stepper_settings_kept(self) -> Iterator[None]:
        """Whatever the block sets on the stepper (:meth:`set_logits_dtype`,
        :meth:`set_stepper_engine` and the threads it sets) is put back after it: a generator
        a caller passes to a build (a notebook's) comes back running as it did."""
        saved = (getattr(self, "logits_dtype", "float32"),
                 getattr(self, "stepper_engine", "transformers"), self.num_threads)
        try:
            yield
        finally:
            self.logits_dtype, self.stepper_engine = saved[0], saved[1]
            self._set_threads(saved[2])

    def _ov_precision(self) -> str:
        return "bf16" if getattr(self, "logits_dtype", "float32") == "bfloat16" else "f32"

    def open_rows_apart(self, prompts: Sequence[str], shared_prefix: str = "",
                        width: int | None = None, rows: int = 16) -> Any:
        """A stepper over ``prompts`` in which each row's logits are a function of its own
        prompt alone (:class:`~dpsynth.llm.stepper.RowsApart`): on OpenVINO, with ``width``
        (the public bound on a prompt's tokens), the rows prefilled one by one and decoded
        ``rows`` at a time at fixed shapes
        (:class:`~dpsynth.llm.ov_stepper.OpenVinoRowsApart`); else one stepper a row."""
        if getattr(self, "stepper_engine", "transformers") == "openvino" and width is not None:
            return ov_stepper.OpenVinoRowsApart(self, prompts, shared_prefix, self._ov_precision(),
                                     width, rows)
        return rows_apart_of(lambda p: self.open_stepper([p], shared_prefix), prompts)

    def open_stepper(self, prompts: Sequence[str], shared_prefix: str = "") -> SharedTokenStepper:
        """A KV-cached stepper over ``prompts`` (see :class:`Stepper`; on OpenVINO
        :class:`~dpsynth.llm.ov_stepper.OpenVinoStepper`, see :meth:`set_stepper_engine`).

        With ``shared_prefix`` the prefix is run once and its KV cache copied to every row;
        row ``i`` then reads ``encode_prompt(shared_prefix) + encode(prompts[i])``
        (tokenised separately: end the prefix at a whitespace or newline boundary).
        """
        if getattr(self, "stepper_engine", "transformers") == "openvino":
            return ov_stepper.OpenVinoStepper(self, prompts, shared_prefix, self._ov_precision())
        return Stepper(self, prompts, shared_prefix)
