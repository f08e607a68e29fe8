"""The :class:`~dpsynth.llm.stepper.Stepper` on OpenVINO: DP-SynRAG's private prediction with
the KV cache inside OpenVINO's fused attention (docs/methods.md §4, "Speed").

The float32 transformers decoder is exported once, locally, to an OpenVINO graph whose KV
cache is state of the infer request (``ReadValue`` -> reorder by ``beam_idx`` -> ``Concat``
-> attention -> ``Assign``, the pattern OpenVINO's CPU plugin fuses into one attention node
with the cache in place). One forward pass per token then costs what the weights cost, not
a copy of the whole cache (transformers' ``DynamicCache`` concatenates every layer's cache
on every token: a third of a step here). The attention mask is passed as an additive 4-D
mask, so left padding and the shared prefix need no model-side logic.

Supported: decoders whose every layer attends to the whole context (Llama, SmolLM2; not
Gemma 3's sliding-window layers: :func:`unsupported` says why). The output layer stays in
torch on the float32 weights (:func:`~dpsynth.llm.stepper.output_logits`), so
:meth:`OpenVinoStepper.logits_at` computes only the candidate rows. Precision: ``bf16``
(inference and KV cache) where the CPU has it, else ``f32`` (its KV cache in f16:
:data:`KV_CACHE_PRECISION`); the KL to float32 is measured by
``dpsynth bench private-prediction`` and tested in tests/test_rag_models.py.

:class:`OpenVinoRowsApart` is what the private prediction runs: each row prefilled alone and
the decode at shapes fixed by public values, so no row's numbers depend on another row (a
batched pass's padding and batch size change every row's rounding; docs/methods.md §4, "Rows
apart").

The engine only computes logits: which token is released, and its accounting, are the
caller's (:mod:`dpsynth.methods.synrag.private_prediction`); any logits are clipped there.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..files import publish_dir
from ..progress import step
from . import ct2
from .base import GenerationError
from .models import quiet_transformers
from .runtime import import_openvino, stepper_threads
from .stepper import SharedTokenStepper, cache_keyword, output_logits

log = logging.getLogger("dpsynth.llm")

EXPORT_VERSION = 1
GRAPH = "decoder.xml"
MARKER = "dpsynth-openvino.json"
#: Added to the attention score of a masked key (exp underflows to 0 in f32 and bf16).
MASKED = -1.0e4
PRECISIONS = ("bf16", "f32")
#: KV cache precision by inference precision. In f32 the cache is kept in f16: a decode step
#: of many rows is bound by reading the cache (80 rows at the public width of 384 tokens: 1.6
#: GB of f32 keys and values a step), and f16 halves it (benchmarks/ov_kv_precision.py on an
#: AVX512 Xeon without bf16: 80 rows 1.69x faster a step, KL to the f32 cache 3e-7 a token;
#: each row's keys are converted alone, so rows stay apart). bf16 keeps its cache in bf16.
KV_CACHE_PRECISION = {"bf16": "bf16", "f32": "f16"}


def unsupported_config(config: dict[str, Any]) -> str | None:
    """Why a model of this ``config.json`` (its text config) cannot step on OpenVINO."""
    text = config.get("text_config") or config
    kind = text.get("model_type", "?")
    layers = text.get("layer_types") or []
    if text.get("sliding_window") or any(t != "full_attention" for t in layers):
        return f"model type {kind!r} has sliding-window layers"
    if text.get("attn_logit_softcapping"):
        return f"model type {kind!r} soft-caps attention scores"
    return None


def unsupported(gen: Any) -> str | None:
    """Why ``gen`` cannot step on OpenVINO (None: it can)."""
    try:
        import_openvino()
    except ImportError:
        return "openvino is not installed"
    if getattr(gen, "device", "cpu") != "cpu":
        return f"device {gen.device} (the OpenVINO stepper runs on the CPU)"
    return unsupported_config(gen.model.config.to_dict())


def export_dir(gen: Any) -> Path:
    """Where the OpenVINO export of ``gen``'s decoder is cached (beside its ctranslate2
    conversion: ``<model dir>-openvino``)."""
    model_dir = Path(gen.model_dir)
    return model_dir.parent / f"{model_dir.name}-openvino"


def _fingerprint(gen: Any) -> dict[str, Any]:
    ov = import_openvino()
    return {"version": EXPORT_VERSION, "openvino": ov.__version__,
            "source": ct2.source_fingerprint(Path(gen.model_dir))}


def _is_current(out: Path, want: dict[str, Any]) -> bool:
    try:
        return json.loads((out / MARKER).read_text("utf-8")) == want and (out / GRAPH).is_file()
    except (OSError, ValueError):
        return False


def ensure_exported(gen: Any) -> Path:
    """The cached graph of ``gen``'s decoder, exported now unless a current one exists.
    Written to a temporary sibling and renamed into place, so a concurrent process never reads
    a half-written graph; a stale export (the weights or OpenVINO changed) is replaced."""
    out = export_dir(gen)
    want = _fingerprint(gen)
    if _is_current(out, want):
        return out / GRAPH
    reason = unsupported(gen)
    if reason:
        raise GenerationError(f"{gen.name}: no OpenVINO stepper: {reason}")
    what = f"exporting {Path(gen.model_dir).name} to OpenVINO (first use only)"
    log.info(what)

    def build(tmp: Path) -> None:
        # the tracer's and transformers' warnings are about tracing, not the user's run
        with quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _export(gen, tmp / GRAPH)
        (tmp / MARKER).write_text(json.dumps(want, sort_keys=True), "utf-8")

    with step(what):  # half a minute on a small CPU: the terminal shows what it waits for
        publish_dir(out, build, lambda: _is_current(out, want))
    return out / GRAPH


def _export(gen: Any, path: Path) -> None:
    """Trace the decoder with explicit past keys / values, then make them the request's state
    with an initial value of batch = the input's batch and length 0."""
    import torch
    from transformers import DynamicCache

    ov = import_openvino()
    model = gen.model
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    kv_heads = cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    decoder = model.get_decoder()
    keyword = cache_keyword(decoder)  # ``cache`` in newer transformers

    class _Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.decoder = decoder  # a submodule: its weights are the graph's constants

        def forward(self, input_ids: Any, mask: Any, position_ids: Any, beam_idx: Any,
                    *past: Any) -> tuple[Any, ...]:
            cache = DynamicCache(config=cfg)
            for i, layer in enumerate(cache.layers):
                layer.device = past[2 * i].device
                layer.keys = past[2 * i].index_select(0, beam_idx)
                layer.values = past[2 * i + 1].index_select(0, beam_idx)
                layer.is_initialized = True
            out = self.decoder(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                               use_cache=True, **{keyword: cache})
            new = getattr(out, "cache", None) or out.past_key_values
            present = [t for layer in new.layers for t in (layer.keys, layer.values)]
            return (out.last_hidden_state[:, -1, :], *present)

    batch, past_len, new = 2, 3, 4
    example = (torch.ones(batch, new, dtype=torch.long),
               torch.zeros(batch, 1, new, past_len + new),
               torch.arange(past_len, past_len + new).repeat(batch, 1),
               torch.arange(batch, dtype=torch.int32),
               *(torch.zeros(batch, kv_heads, past_len, head_dim) for _ in range(2 * n_layers)))
    with torch.no_grad():
        graph = ov.convert_model(_Step().eval(), example_input=example)
    _make_stateful(graph, n_layers, kv_heads, head_dim)
    ov.save_model(graph, str(path), compress_to_fp16=False)


def _make_stateful(graph: Any, n_layers: int, kv_heads: int, head_dim: int) -> None:
    """Name the traced graph's ports, free its shapes and make the past keys / values the
    request's state, initially of batch = the input's batch and length 0."""
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    ov = import_openvino()
    kv = [f"{i}.{part}" for i in range(n_layers) for part in ("key", "value")]
    for port, name in zip(graph.inputs, ["input_ids", "mask", "position_ids", "beam_idx",
                                         *(f"past.{k}" for k in kv)], strict=True):
        port.get_tensor().set_names({name})
    for port, name in zip(graph.outputs, ["hidden", *(f"present.{k}" for k in kv)],
                          strict=True):
        port.get_tensor().set_names({name})
    shapes = {"input_ids": [-1, -1], "mask": [-1, 1, -1, -1], "position_ids": [-1, -1],
              "beam_idx": [-1]} | {f"past.{k}": [-1, kv_heads, -1, head_dim] for k in kv}
    graph.reshape({k: ov.PartialShape(v) for k, v in shapes.items()})
    apply_make_stateful_transformation(graph, {f"past.{k}": f"present.{k}" for k in kv})
    rows = ops.gather(ops.shape_of(graph.input("input_ids"), output_type="i64"),
                      ops.constant(np.array([0], np.int64)), ops.constant(np.int64(0)))
    empty = ops.concat([rows, ops.constant(np.array([kv_heads, 0, head_dim], np.int64))], 0)
    for op in graph.get_ops():
        if op.get_type_name() == "ReadValue":
            op.set_arguments([ops.broadcast(ops.constant(np.float32(0.0)), empty)])
    graph.validate_nodes_and_infer_types()


def runnable_precision(precision: str, threads: int) -> str:
    """The precision OpenVINO can compile ``precision`` in on ``threads`` inference threads.

    OpenVINO's CPU plugin (2026.4; openvinotoolkit/openvino#33300) kills the process with a
    floating point exception when it compiles a bf16 decoder for one thread (measured here:
    ``INFERENCE_NUM_THREADS`` 1, or one core by ``taskset -c 0``; f32 compiles): one thread
    (:func:`~dpsynth.llm.runtime.stepper_threads`: a generator configured for one, or a
    process that may use one core) runs f32 (closer to float32, slower)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return "f32" if precision == "bf16" and threads < 2 else precision


def compiled(gen: Any, precision: str) -> Any:
    """The compiled decoder of ``gen`` in ``precision`` (compiled once per generator, on
    :func:`~dpsynth.llm.runtime.stepper_threads`; on one thread bf16 is compiled as f32, see
    :func:`runnable_precision`)."""
    wanted = precision
    threads = stepper_threads(gen)
    precision = runnable_precision(precision, threads)
    if precision != wanted:
        log.info("OpenVINO stepper in %s, not %s: one thread (OpenVINO cannot compile %s "
                 "for one)", precision, wanted, wanted)
    cache = gen.__dict__.setdefault("_ov_compiled", {})
    if precision not in cache:
        ov = import_openvino()
        core = ov.Core()
        cache[precision] = core.compile_model(core.read_model(str(ensure_exported(gen))), "CPU", {
            "INFERENCE_PRECISION_HINT": precision,
            "KV_CACHE_PRECISION": KV_CACHE_PRECISION[precision],
            "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
    return cache[precision]


def prefill_mask(keys_before: int, valid: np.ndarray) -> np.ndarray:
    """Additive mask ``[B, 1, S, keys_before + S]``: every row sees the ``keys_before``
    shared keys, then its own tokens causally, never a pad; a pad query sees itself (so no
    row of the softmax is empty)."""
    b, s = valid.shape
    own = np.tril(np.ones((s, s), dtype=bool))[None] & valid[:, None, :]
    own |= np.eye(s, dtype=bool)[None]
    seen = np.concatenate([np.ones((b, s, keys_before), dtype=bool), own], axis=2)
    return np.where(seen, 0.0, MASKED).astype(np.float32)[:, None]


def decode_mask(valid: np.ndarray) -> np.ndarray:
    """Additive mask ``[B, 1, 1, length]`` of a one-token step: each row sees its valid keys."""
    return np.where(valid, 0.0, MASKED).astype(np.float32)[:, None, None, :]


def prefill(compiled_model: Any, request: Any, pad_left: Any, prefix: Sequence[int],
            rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prefill ``rows`` (token ids) on ``request``, after ``prefix`` (when not empty) run once
    with batch size 1 and continued by every row; the rows left-padded by ``pad_left`` (the
    generator's), their pads masked. Returns (last hidden states ``[B, H]``, valid keys
    ``[B, length]``, next positions ``[B, 1]``)."""
    b, p = len(rows), len(prefix)
    if p:
        last_hidden(compiled_model, request, np.asarray([list(prefix)], dtype=np.int64),
                    prefill_mask(0, np.ones((1, p), dtype=bool)),
                    np.arange(p, dtype=np.int64)[None], np.zeros(1, np.int32))
        beams = np.zeros(b, np.int32)  # every row continues the one prefix row
    else:
        beams = np.arange(b, dtype=np.int32)
    ids, valid = pad_left(rows)
    valid = valid.numpy().astype(bool)
    pos = p + np.clip(valid.cumsum(-1) - 1, 0, None)
    hidden = last_hidden(compiled_model, request, ids.numpy(), prefill_mask(p, valid), pos, beams)
    return hidden, np.concatenate([np.ones((b, p), dtype=bool), valid], axis=1), pos[:, -1:] + 1


class OpenVinoStepper(SharedTokenStepper):
    """:class:`~dpsynth.llm.stepper.Stepper`'s contract on OpenVINO (same prompts, positions
    and padding; see the module docstring)."""

    def __init__(self, gen: Any, prompts: Sequence[str], shared_prefix: str,
                 precision: str) -> None:
        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        self._gen = gen
        self._compiled = compiled(gen, precision)
        self._request: Any = self._compiled.create_infer_request()
        self.batch_size = len(prompts)
        self.tokens: list[int] = []
        if shared_prefix:
            prefix = gen.encode_prompt(shared_prefix)
            rows = [gen.encode(p) for p in prompts]
            if any(not r for r in rows):
                raise ValueError("open_stepper: each prompt needs at least one token")
        else:
            prefix = []
            rows = [gen.encode_prompt(x) for x in prompts]
        hidden, self._valid, self._next_pos = prefill(self._compiled, self._request,
                                                      gen.pad_left, prefix, rows)
        self._hidden = torch_rows(hidden)
        self._length = self._valid.shape[1]
        self._logits = None

    def _infer(self, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray,
               beams: np.ndarray) -> None:
        self._hidden = torch_rows(last_hidden(self._compiled, self._request, ids, mask, pos,
                                              beams))

    def _is_open(self) -> bool:
        return self._request is not None

    def _head(self, ids: np.ndarray | None) -> np.ndarray:
        return output_logits(self._gen.model, self._hidden, ids)

    def _step(self, token_id: int) -> None:
        b = self.batch_size
        self._valid = np.concatenate([self._valid, np.ones((b, 1), dtype=bool)], axis=1)
        self._infer(np.full((b, 1), token_id, dtype=np.int64), decode_mask(self._valid),
                    self._next_pos, np.arange(b, dtype=np.int32))
        self._next_pos = self._next_pos + 1

    def _free(self) -> None:
        self._request = None
        self._hidden = None


class OpenVinoRowsApart(SharedTokenStepper):
    """:class:`~dpsynth.llm.stepper.RowsApart`'s contract on OpenVINO, with a batched decode.

    Each row is prefilled alone (a batch of one, its own length, after the shared prefix's
    cache), so its cache is a function of its prompt only. The caches are then laid side by
    side, left-padded to the public ``width``, in decode batches of exactly ``rows`` rows
    (filler rows where fewer are left; their outputs are dropped): every decode pass has the
    shape (rows, prefix + width + tokens so far) whatever the prompts are, and at fixed shapes
    a row's numbers do not depend on the other rows (measured bitwise in
    tests/test_rag_models.py), so no row's logits depend on another's presence or length. The
    output layer, too, runs on ``rows`` rows at a time (a matrix product's kernel, and so its
    rounding, follows the number of rows)."""

    def __init__(self, gen: Any, prompts: Sequence[str], shared_prefix: str, precision: str,
                 width: int, rows: int) -> None:
        if not prompts:
            raise ValueError("open_stepper: prompts must not be empty")
        if rows < 1 or width < 1:
            raise ValueError("rows and width must be >= 1")
        ov = import_openvino()
        self._gen = gen
        self._compiled = compiled(gen, precision)
        self.batch_size = len(prompts)
        self.tokens: list[int] = []
        encode = gen.encode if shared_prefix else gen.encode_prompt
        ids = [encode(x) for x in prompts]
        if any(not r for r in ids):
            raise ValueError("open_stepper: each prompt needs at least one token")
        if max(len(r) for r in ids) > width:
            raise ValueError(f"open_stepper: a prompt is longer than the width ({width} tokens)")
        p, base, hidden, caches = self._prefill_rows(ov, ids, shared_prefix)
        total = p + width
        self._rows = rows
        #: per decode batch: [request, valid keys (rows, length), next positions, real rows]
        self._batches: list[list[Any]] = [
            self._decode_batch(ov, list(range(start, min(len(ids), start + rows))), ids,
                               p, base, caches, total)
            for start in range(0, len(ids), rows)]
        #: per decode batch, the last hidden states [rows, H] (filler rows zero)
        self._hidden = [self._padded(np.concatenate(hidden[i:i + rows]))
                        for i in range(0, len(ids), rows)]
        self._length = total
        self._logits = None

    def _prefill_rows(self, ov: Any, ids: list[list[int]], shared_prefix: str
                      ) -> tuple[int, dict[str, np.ndarray], list[np.ndarray],
                                 list[dict[str, np.ndarray]]]:
        """Each row prefilled alone (after the shared prefix's KV state, when there is one):
        (prefix length, the prefix's state, each row's last hidden state, each row's KV)."""
        prefill = self._compiled.create_infer_request()
        base: dict[str, np.ndarray] = {}
        p = 0
        if shared_prefix:
            prefix = self._gen.encode_prompt(shared_prefix)
            p = len(prefix)
            self._run(prefill, np.asarray([prefix], dtype=np.int64),
                      prefill_mask(0, np.ones((1, p), dtype=bool)),
                      np.arange(p, dtype=np.int64)[None], 1)
            base = {s.name: np.array(s.state.data, dtype=np.float32, copy=True)
                    for s in prefill.query_state()}
        hidden: list[np.ndarray] = []
        caches: list[dict[str, np.ndarray]] = []
        for row in ids:
            if base:
                for s in prefill.query_state():
                    s.state = ov.Tensor(base[s.name])
            else:
                prefill.reset_state()
            n = len(row)
            hidden.append(self._run(prefill, np.asarray([row], dtype=np.int64),
                                    prefill_mask(p, np.ones((1, n), dtype=bool)),
                                    p + np.arange(n, dtype=np.int64)[None], 1))
            caches.append({s.name: np.array(s.state.data, dtype=np.float32)[0, :, p:]
                           for s in prefill.query_state()})
        return p, base, hidden, caches

    def _decode_batch(self, ov: Any, part: list[int], ids: list[list[int]], p: int,
                      base: dict[str, np.ndarray], caches: list[dict[str, np.ndarray]],
                      total: int) -> list[Any]:
        """The rows ``part`` as one decode batch of ``self._rows`` rows at the fixed length
        ``total`` (filler rows zero): [request, valid keys, next positions, real rows]."""
        rows = self._rows
        valid = np.zeros((rows, total), dtype=bool)
        valid[:, :p] = True
        valid[len(part):, total - 1] = True  # a filler row attends to one (zero) key
        pos = np.full((rows, 1), p + 1, dtype=np.int64)
        request = self._compiled.create_infer_request()
        for s in request.query_state():
            some = caches[part[0]][s.name]
            state = np.zeros((rows, some.shape[0], total, some.shape[2]), dtype=np.float32)
            if base:
                state[:, :, :p] = base[s.name][0]
            for j, i in enumerate(part):
                n = len(ids[i])
                state[j, :, total - n:] = caches[i][s.name]
            s.state = ov.Tensor(state)
        for j, i in enumerate(part):
            valid[j, total - len(ids[i]):] = True
            pos[j, 0] = p + len(ids[i])
        return [request, valid, pos, len(part)]

    def _run(self, request: Any, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray,
             b: int) -> np.ndarray:
        return last_hidden(self._compiled, request, ids, mask, pos,
                           np.arange(b, dtype=np.int32))

    def _is_open(self) -> bool:
        return bool(self._batches)

    def _padded(self, hidden: np.ndarray) -> Any:
        full = np.zeros((self._rows, hidden.shape[1]), dtype=np.float32)
        full[:len(hidden)] = hidden
        return torch_rows(full)

    def _head(self, ids: np.ndarray | None) -> np.ndarray:
        return np.concatenate([output_logits(self._gen.model, h, ids)[:b[3]]
                               for h, b in zip(self._hidden, self._batches, strict=True)])

    def _step(self, token_id: int) -> None:
        out = []
        for batch in self._batches:
            request, valid, pos, _ = batch
            valid = np.concatenate([valid, np.ones((self._rows, 1), dtype=bool)], axis=1)
            hidden = self._run(request, np.full((self._rows, 1), token_id, dtype=np.int64),
                               decode_mask(valid), pos, self._rows)
            out.append(torch_rows(hidden))
            batch[1], batch[2] = valid, pos + 1
        self._hidden = out

    def _free(self) -> None:
        self._batches = []
        self._hidden = []


def last_hidden(compiled_model: Any, request: Any, ids: np.ndarray, mask: np.ndarray,
                pos: np.ndarray, beams: np.ndarray) -> np.ndarray:
    """One forward pass of ``request``: the last hidden state of every row, float32 (a copy:
    the request's output buffer is reused by its next pass)."""
    out = request.infer({"input_ids": ids, "mask": mask, "position_ids": pos,
                         "beam_idx": beams})
    return np.array(out[compiled_model.outputs[0]], dtype=np.float32, copy=True)


def torch_rows(hidden: np.ndarray) -> Any:
    """Last hidden states as the torch tensor the output layer takes."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
