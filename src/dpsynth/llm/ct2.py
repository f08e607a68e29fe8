"""CTranslate2 int8 engine for :class:`~dpsynth.llm.local.LocalGenerator` (sampling only).

On this project's 2-core CPU machines CTranslate2 with int8 weights generates about 2.5x as
many tokens per second as transformers in float32, at half the memory (benchmarks/results/
generation.md). It installs from PyPI as a wheel with no build step.

What it keeps and what it does not (docs/methods.md §1, §4):

* sampling (temperature, top-p -- within the :data:`TOPP_CANDIDATES` most likely tokens --,
  top-k, greedy), chat templates (the prompt is rendered and
  tokenised by the model's own HF tokenizer), EOS ids and stop strings -- everything the
  PE-family methods ask of a generator;
* int8 weights shift the next-token distribution a little (mean KL about 0.08 nats per token
  for SmolLM2, 0.03 for Gemma 3 270M, checked in tests/test_llm_engine.py); DP-SynRAG's
  next-token logits and KV-cached stepper stay on the float32 transformers model, which
  :class:`LocalGenerator` loads lazily only when they are used;
* seeds: CTranslate2 seeds a thread's random generator once, when the thread first draws. A
  batch therefore runs on a fresh ``ctranslate2.Generator`` (about 0.2 s to load from the page
  cache) created right after ``set_random_seed(batch seed)``, under a process-wide lock. The
  same requests in the same batches give the same texts run to run on one machine; the batch
  seed is :func:`~dpsynth.llm.batching.batch_seed` of the requests' seeds, as for transformers.

The converted model is written once, from the cached float32 HF directory (no download), to a
sibling directory ``<name>-ct2-int8`` and reused while its fingerprint of the source matches.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..files import publish_dir
from ..progress import step
from .base import GenerationError, SamplingParams
from .models import quiet_transformers
from .sampling import TOPP_CANDIDATES

log = logging.getLogger(__name__)

CT2_MARKER = "dpsynth-ct2.json"
COMPUTE_TYPE = "int8"
#: A batch whose rows share at least this many leading tokens runs them once as a static prompt.
MIN_STATIC_PREFIX = 8
# set_random_seed is process-wide: a batch holds this lock from seeding to its last token.
_SEED_LOCK = threading.Lock()


def available() -> bool:
    """Whether the ``ctranslate2`` package is importable (without importing it)."""
    return importlib.util.find_spec("ctranslate2") is not None


def source_fingerprint(model_dir: Path) -> dict[str, Any]:
    """Name, size and mtime of the files a conversion reads (config and weights)."""
    files = sorted(
        p
        for p in Path(model_dir).iterdir()
        if p.name in ("config.json", "generation_config.json")
        or p.suffix in (".safetensors", ".bin")
    )
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def converted_dir(model_dir: Path, cache_root: Path, model_id: str, embedded: bool) -> Path:
    """Where the int8 conversion of ``model_dir`` is cached.

    Embedded models: ``<cache>/<name>-ct2-int8`` beside their float32 directory. Other
    directories: ``<cache>/_ct2/<dirname>-<hash of its absolute path>-int8``.
    """
    if embedded:
        return cache_root / f"{model_id}-ct2-{COMPUTE_TYPE}"
    digest = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:10]
    return cache_root / "_ct2" / f"{model_id}-{digest}-{COMPUTE_TYPE}"


def is_current(out_dir: Path, model_dir: Path) -> bool:
    """Whether ``out_dir`` holds a finished conversion of ``model_dir`` as it is now."""
    marker = out_dir / CT2_MARKER
    if not marker.is_file() or not (out_dir / "model.bin").is_file():
        return False
    try:
        meta = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return bool(
        meta.get("source") == source_fingerprint(model_dir)
        and meta.get("quantization") == COMPUTE_TYPE
    )


def convert(model_dir: Path, out_dir: Path) -> None:
    """Convert a local HF causal-LM directory to CTranslate2 int8 at ``out_dir``.

    Reads only local files (no hub access). Writes to a temporary sibling and renames it into
    place, so a concurrent process never reads a half-written model; a stale conversion (the
    source changed) is replaced.
    """
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    what = f"converting {Path(model_dir).name} to CTranslate2 {COMPUTE_TYPE} (first use only)"
    log.info(what)

    def build(tmp: Path) -> None:
        with quiet_transformers():
            TransformersConverter(str(model_dir), low_cpu_mem_usage=True).convert(
                str(tmp), quantization=COMPUTE_TYPE, force=True
            )
        meta = {
            "source": source_fingerprint(model_dir),
            "quantization": COMPUTE_TYPE,
            "ctranslate2": ctranslate2.__version__,
        }
        (tmp / CT2_MARKER).write_text(json.dumps(meta))

    with step(what):  # minutes on a small CPU: the terminal shows what it waits for
        publish_dir(out_dir, build, lambda: is_current(out_dir, model_dir))


def ensure_converted(model_dir: Path, out_dir: Path) -> bool:
    """Convert unless a current conversion exists; True when it converted now."""
    if is_current(out_dir, model_dir):
        return False
    convert(model_dir, out_dir)
    return True


def _topk(params: SamplingParams) -> int:
    """CTranslate2's ``sampling_topk`` for sampled ``params`` (0 = the whole vocabulary)."""
    if params.top_k:
        return int(params.top_k)
    return TOPP_CANDIDATES if params.top_p < 1 else 0


def shared_prefix(rows: Sequence[Sequence[int]]) -> int:
    """Length of the rows' common token prefix, leaving every row at least one token."""
    if not rows:
        return 0
    limit = min(len(r) for r in rows) - 1
    first = rows[0]
    n = 0
    while n < limit and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def seed32(seed: int | None) -> int:
    """A 32-bit CTranslate2 seed: ``seed`` folded, or fresh OS randomness when None."""
    if seed is None:
        return secrets.randbits(32)
    return int(seed) % (2**32)


class Ct2Engine:
    """Batched sampling over a converted model directory (see the module docstring)."""

    def __init__(
        self,
        model_dir: Path,
        tokenizer: Any,
        *,
        threads: int | Callable[[], int],
        eos_token_ids: Sequence[int],
    ) -> None:
        """``threads``: a count, or a function called at each batch (e.g. the idle cores)."""
        import ctranslate2

        self._ct2 = ctranslate2
        self.model_dir = Path(model_dir)
        self.tokenizer = tokenizer
        self._threads = threads
        self.eos_token_ids = [int(e) for e in eos_token_ids]
        self._greedy: Any = None  # greedy decoding draws nothing: one generator is kept
        self.last_threads = 0

    @property
    def threads(self) -> int:
        """Threads of the next batch (the thread count does not change the sampled texts)."""
        t = self._threads() if callable(self._threads) else self._threads
        return max(1, int(t))

    def _load(self) -> Any:
        self.last_threads = self.threads
        return self._ct2.Generator(
            str(self.model_dir),
            device="cpu",
            compute_type=COMPUTE_TYPE,
            intra_threads=self.last_threads,
            inter_threads=1,
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seed: int | None,
        stops: Sequence[tuple[str, ...]],
        decode: Callable[[Sequence[int]], str],
    ) -> list[tuple[list[int], bool]]:
        """Generated token ids per prompt (EOS dropped) and whether the row ended by EOS.

        Rows with stop strings end as soon as their decoded text contains one (the caller
        still cuts the text at the stop).
        """
        tokens = [self.tokenizer.convert_ids_to_tokens(list(p)) for p in prompts]
        head = shared_prefix(prompts)
        sample = params.temperature > 0
        kw: dict[str, Any] = {
            "max_length": params.max_new_tokens,
            "include_prompt_in_result": False,
            "end_token": self.eos_token_ids,
            "sampling_topk": _topk(params) if sample else 1,
            "sampling_topp": params.top_p if sample else 1.0,
            "sampling_temperature": params.temperature if sample else 1.0,
        }
        if head >= MIN_STATIC_PREFIX:
            # The rows' common prefix (e.g. a chat template's system turn) runs once, with
            # batch size 1, and its state is copied to every row.
            kw["static_prompt"] = tokens[0][:head]
            kw["cache_static_prompt"] = False
            tokens = [t[head:] for t in tokens]
        seen: dict[int, list[int]] = {}
        if any(stops):

            def on_step(step: Any) -> bool:
                row = seen.setdefault(step.batch_id, [])
                row.append(int(step.token_id))
                return any(s in decode(row) for s in stops[step.batch_id])

            kw["callback"] = on_step
        results = self._generate_batch(tokens, kw, sample, seed)
        out: list[tuple[list[int], bool]] = []
        for i, r in enumerate(results):
            ids = [int(t) for t in r.sequences_ids[0]]
            stopped = i in seen and any(s in decode(ids) for s in stops[i])
            out.append((ids, len(ids) < params.max_new_tokens and not stopped))
        return out

    def continuation_log_probs(self, head: Sequence[int], cont: Sequence[int]) -> Any:
        """Log-probabilities ``[len(cont), V]`` (numpy float32) of the next token at each
        position that predicts a token of ``cont`` after the prompt ``head``."""
        import numpy as np

        ids = [*head, *cont]
        with _SEED_LOCK:
            ct = self._load()
        try:
            lp = np.asarray(ct.forward_batch([ids], return_log_probs=True))[0]
        finally:
            del ct
        return lp[len(head) - 1 : -1]

    def _generate_batch(self, tokens: list[list[str]], kw: dict[str, Any], sample: bool,
                        seed: int | None) -> Any:
        """One ``generate_batch``: greedy on the kept engine; sampled on a fresh engine seeded
        under the process-wide seed lock."""
        try:
            if not sample:
                with _SEED_LOCK:
                    if self._greedy is None:
                        self._greedy = self._load()
                    return self._greedy.generate_batch(tokens, **kw)
            with _SEED_LOCK:
                self._ct2.set_random_seed(seed32(seed))
                gen = self._load()
                try:
                    return gen.generate_batch(tokens, **kw)
                finally:
                    del gen
        except Exception as exc:  # the message of an engine error holds no prompt text
            raise GenerationError(
                f"ctranslate2 generate_batch failed ({type(exc).__name__})"
            ) from exc
