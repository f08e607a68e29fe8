"""How fast MiniLM embeds on this CPU at each pass shape and precision, side by side (issue 48):
the choices behind the default engine's fixed-shape passes, and what int8 (VNNI) would cost.

    env PYTHONPATH=src .venv/bin/python benchmarks/embed_shapes.py [--texts 1000] [--rounds 4]
        [--csv FILE --column text] [--out benchmarks/results/embedding_shapes.json]

Arms (all but ``st-shipped`` rows apart: a fixed shape per pass, fillers where fewer are left):

* ``torch``: the torch engine, float32, 16 rows a pass at the embedders' widths
  (``engines.WIDTH_STEP``): the baseline of ``dpsynth bench embedding``;
* ``st-shipped``: sentence-transformers' own ``encode`` (batches of 32 padded to their
  longest: NOT rows apart, a reference of what torch does as shipped);
* ``ov-rowsR``: the OpenVINO engine (bf16, one model compiled for any shape) at R rows a pass,
  widths by :func:`dpsynth.fixed_shape.padded_width`'s default rule (multiples of 16 up to 64
  tokens, of 32 beyond: the embedders' rule before 2026-12-06);
* ``ov-static``: one model compiled per pass shape (compile time reported apart);
* ``...-w8``: widths rounded up to a multiple of 8 tokens (``ov-rows16-w8`` is the default
  engine since 2026-12-06);
* ``int8`` / ``int8-keep-dense-out``: the graph quantised to int8 by NNCF (static scales from
  300 public demo texts other than the timed ones, so a row's scale never depends on its pass;
  skipped without ``nncf``), all products or all but the attention / FFN output projections;
* ``int8-weights``: int8 weights only (NNCF ``compress_weights``, asymmetric), activations
  quantised per group of 64 at run time by OpenVINO (its dynamic quantisation).

Each arm: texts a second (the median of ``--rounds`` alternating rounds), the ratio to
``torch``, the cosine to the torch vectors (min and mean) and how often a text's nearest other
text is the same as with torch (near ties decide votes). The texts are public demo data.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from dpsynth.bench.embedding import demo_texts, load_texts  # noqa: E402
from dpsynth.bench.machine import Where, describe  # noqa: E402
from dpsynth.embed import Embedder  # noqa: E402
from dpsynth.embed.engines import OpenVinoEngine  # noqa: E402
from dpsynth.embed.export import export_onnx  # noqa: E402
from dpsynth.fixed_shape import (  # noqa: E402
    fixed_shape_arrays,
    fixed_shape_passes,
)
from dpsynth.llm.runtime import import_openvino  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class Arm:
    """One way to embed: a model call on (ids, mask) of a fixed shape, rows a pass and the
    width step (None: :func:`padded_width`'s default rule, 16 up to 64 tokens and 32 beyond)."""

    def __init__(self, engine: OpenVinoEngine, call: Callable[[np.ndarray, np.ndarray],
                 np.ndarray], rows: int, step: int | None = None):
        self.engine, self.call, self.rows, self.step = engine, call, rows, step

    def __call__(self, texts: list[str]) -> np.ndarray:
        e = self.engine
        tok = e._token_rows(texts)
        out = np.empty((len(texts), e.dim), dtype=np.float32)
        for w, idx in fixed_shape_passes([len(r) for r in tok], self.rows, e.max_len,
                                         self.step):
            ids, mask = fixed_shape_arrays([tok[i] for i in idx], w, self.rows, e._pad_id,
                                           e._filler)
            out[idx] = self.call(ids, mask)[:len(idx)]
        return out


def compiled_call(model, threads: int, static: bool, extra: dict | None = None
                  ) -> tuple[Callable, dict[str, float]]:
    """An OpenVINO call at bf16 on ``threads`` threads: one compiled model for every shape, or
    one per shape (``static``; compile seconds counted in the returned dict); ``extra``: more
    compile properties."""
    ov = import_openvino()
    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads,
             "PERFORMANCE_HINT": "LATENCY", **(extra or {})}
    cost = {"compile_seconds": 0.0, "shapes": 0}
    requests: dict[tuple[int, ...], object] = {}

    def request(shape: tuple[int, ...]):
        key = shape if static else ()
        if key not in requests:
            t = time.perf_counter()
            m = model.clone()
            if static:
                m.reshape({"input_ids": list(shape), "attention_mask": list(shape)})
            requests[key] = core.compile_model(m, "CPU", props).create_infer_request()
            cost["compile_seconds"] += time.perf_counter() - t
            cost["shapes"] += 1
        return requests[key]

    def call(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        res = request(ids.shape).infer({"input_ids": ids, "attention_mask": mask})
        return np.array(res[0], dtype=np.float32, copy=True)

    return call, cost


def quantised(model, engine: OpenVinoEngine, calib: list[str], keep_dense_out: bool):
    """The graph with int8 products (NNCF post-training quantisation, transformer preset,
    static scales from ``calib``'s fixed-shape passes)."""
    import nncf

    tok = engine._token_rows(calib)
    items = []
    for w, idx in fixed_shape_passes([len(r) for r in tok], 16, engine.max_len):
        ids, mask = fixed_shape_arrays([tok[i] for i in idx], w, 16, engine._pad_id,
                                       engine._filler)
        items.append({"input_ids": ids, "attention_mask": mask})
    ignored = nncf.IgnoredScope(patterns=[".*/output/dense/MatMul"]) if keep_dense_out \
        else nncf.IgnoredScope()
    return nncf.quantize(model.clone(), nncf.Dataset(items), subset_size=len(items),
                         model_type=nncf.ModelType.TRANSFORMER, ignored_scope=ignored)


def nearest_other(v: np.ndarray) -> np.ndarray:
    s = v @ v.T
    np.fill_diagonal(s, -np.inf)
    return s.argmax(axis=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--csv", type=Path, help="public texts instead of the demo corpus")
    ap.add_argument("--column", default="text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    start_load = os.getloadavg()[0]  # the quiet rule reads the load before this script's work
    texts = load_texts(args.csv, args.column, args.texts) if args.csv else demo_texts(args.texts)
    calib = demo_texts(args.texts + 300, seed=7)[-300:]
    ov = import_openvino()
    torch_emb = Embedder("minilm", engine="torch", batch_size=16)
    export = export_onnx(torch_emb.model_dir)
    engine = OpenVinoEngine(torch_emb.model_dir, export, 16, args.threads)
    model = ov.Core().read_model(str(export / "model.onnx"))

    from sentence_transformers import SentenceTransformer

    shipped = SentenceTransformer(str(torch_emb.model_dir), device="cpu", local_files_only=True)
    arms: dict[str, Callable[[list[str]], np.ndarray]] = {
        "torch": torch_emb.encode_uncached,
        "st-shipped": lambda t: shipped.encode(t, batch_size=32, normalize_embeddings=True,
                                               convert_to_numpy=True),
    }
    costs: dict[str, dict[str, float]] = {}
    for rows in (8, 16, 32):
        call, costs[f"ov-rows{rows}"] = compiled_call(model, args.threads, static=False)
        arms[f"ov-rows{rows}"] = Arm(engine, call, rows)
    for name, static, step in (("ov-rows16-w8", False, 8), ("ov-static", True, None),
                               ("ov-static-w8", True, 8)):
        call, costs[name] = compiled_call(model, args.threads, static)
        arms[name] = Arm(engine, call, 16, step)
    skipped = {}
    try:
        for name, keep in (("int8", False), ("int8-keep-dense-out", True)):
            t = time.perf_counter()
            q = quantised(model, engine, calib, keep)
            call, costs[name] = compiled_call(q, args.threads, static=False)
            costs[name]["quantise_seconds"] = time.perf_counter() - t
            arms[name] = Arm(engine, call, 16)
        # int8 weights only, activations quantised per token group at run time (OpenVINO's
        # dynamic quantisation: a row's scales are its own, so rows stay apart)
        t = time.perf_counter()
        import nncf

        weights = nncf.compress_weights(model.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM)
        call, costs["int8-weights"] = compiled_call(
            weights, args.threads, static=False, extra={"DYNAMIC_QUANTIZATION_GROUP_SIZE": 64})
        costs["int8-weights"]["quantise_seconds"] = time.perf_counter() - t
        arms["int8-weights"] = Arm(engine, call, 16)
    except ImportError:
        skipped["int8"] = "nncf is not installed (pip install nncf==3.4.0)"

    for arm in arms.values():  # warm: every shape compiled before the timing
        arm(texts)
    rates: dict[str, list[float]] = {name: [] for name in arms}
    vecs: dict[str, np.ndarray] = {}
    with Where(start_load=start_load) as where:
        for _ in range(args.rounds):
            for name, arm in arms.items():
                t = time.perf_counter()
                vecs[name] = np.asarray(arm(texts), dtype=np.float32)
                rates[name].append(len(texts) / (time.perf_counter() - t))
    ref = vecs["torch"]
    ref_nn = nearest_other(ref)
    base = statistics.median(rates["torch"])
    rows = {}
    for name in arms:
        cos = np.sum(vecs[name] * ref, axis=1)
        rate = statistics.median(rates[name])
        rows[name] = {"texts_per_second": round(rate, 1), "vs_torch": round(rate / base, 3),
                      "min_cosine": round(float(cos.min()), 6),
                      "mean_cosine": round(float(cos.mean()), 6),
                      "nearest_same_as_torch": round(float(np.mean(nearest_other(vecs[name])
                                                                   == ref_nn)), 3),
                      **{k: round(v, 2) for k, v in costs.get(name, {}).items()}}
        print(f"{name:22s} {rate:7.1f}/s  x{rate / base:5.2f}  min cos "
              f"{rows[name]['min_cosine']:.6f}  nearest same {rows[name]['nearest_same_as_torch']}",
              flush=True)
    machine = where.result()
    print(describe(machine))
    lengths = [len(r) for r in engine._token_rows(texts)]
    result = {"texts": len(texts), "mean_tokens": round(float(np.mean(lengths)), 1),
              "rounds": args.rounds, "threads": args.threads, "arms": rows,
              "skipped": skipped, "machine": machine, "where": describe(machine)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
