"""What int8 MiniLM (VNNI) would cost the Aug-PE vote, against bf16 (issue 48).

    env PYTHONPATH=src .venv/bin/python benchmarks/embed_int8_votes.py \
        [--out benchmarks/results/embedding_int8_votes.json]

Embedding reaches 3x torch on this CPU only with int8 products (benchmarks/results/
embedding.md); the question is whether the votes notice. For Banking77 (train.csv) and Yelp
(dev.csv) in ../shared/data, 2500 texts drawn with a fixed seed: 2000 stand for the private
records and 500 for the candidates they vote on (real texts: a voted population's stand-in).
Each record votes for its nearest candidate under each embedding:

* ``torch``: the float32 reference (the torch engine's passes);
* ``bf16``: the default engine (``Embedder(engine="openvino")``, bf16 where the CPU has it);
* ``int8``: the same ONNX graph quantised by NNCF (post-training, transformer preset, static
  scales from 300 public demo texts, so a row's scales never depend on its pass), one model
  compiled per pass shape (its fastest form: 3.3-3.5x torch here); needs ``nncf``.

Reported per set and arm: the share of records whose vote moved from torch's, the histogram's
L1 distance to torch's and its largest change on one candidate, beside the Gaussian noise's
sigma an Aug-PE run adds to each count at epsilon 4 (about 1.9 for the side-by-side jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpsynth.bench.embedding import demo_texts, load_texts  # noqa: E402
from dpsynth.bench.machine import Where, describe  # noqa: E402
from dpsynth.embed import Embedder  # noqa: E402
from dpsynth.embed.engines import WIDTH_STEP, OpenVinoEngine  # noqa: E402
from dpsynth.embed.export import export_onnx  # noqa: E402
from dpsynth.llm.runtime import import_openvino  # noqa: E402
from embed_shapes import Arm, compiled_call, quantised  # noqa: E402
from harness import SHARED  # noqa: E402

SETS = {"banking77": SHARED / "banking77" / "train.csv", "yelp": SHARED / "yelp" / "dev.csv"}


def unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def votes(embed, private: list[str], candidates: list[str]) -> np.ndarray:
    """Each private text's nearest candidate (cosine) under ``embed``."""
    return (unit(embed(private)) @ unit(embed(candidates)).T).argmax(axis=1)


def compare(ref: np.ndarray, other: np.ndarray, m: int) -> dict[str, float]:
    """How far ``other``'s votes are from ``ref``'s: records moved, histogram L1 and max."""
    diff = np.bincount(other, minlength=m) - np.bincount(ref, minlength=m)
    return {"votes_moved": round(float(np.mean(other != ref)), 4),
            "histogram_l1": int(np.abs(diff).sum()), "max_change": int(np.abs(diff).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--private", type=int, default=2000)
    ap.add_argument("--candidates", type=int, default=500)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    start_load = os.getloadavg()[0]
    try:
        import nncf  # noqa: F401
    except ImportError:
        sys.exit("embed_int8_votes.py needs nncf (pip install nncf==3.4.0)")
    torch_emb = Embedder("minilm", engine="torch", batch_size=16)
    default = Embedder("minilm", engine="openvino", batch_size=16)
    export = export_onnx(torch_emb.model_dir)
    engine = OpenVinoEngine(torch_emb.model_dir, export, 16, default.threads)
    model = import_openvino().Core().read_model(str(export / "model.onnx"))
    calib = demo_texts(1300, seed=7)[-300:]  # public texts, not the timed or voted ones
    call, _ = compiled_call(quantised(model, engine, calib, keep_dense_out=False),
                            default.threads, static=True)
    arms = {"torch": torch_emb.encode_uncached, "bf16": default.encode_uncached,
            "int8": Arm(engine, call, 16, WIDTH_STEP)}
    results: dict[str, dict] = {}
    with Where(start_load=start_load) as where:
        for name, path in SETS.items():
            texts = load_texts(path)
            pick = np.random.default_rng(0).permutation(len(texts))
            chosen = [texts[i] for i in pick[: args.private + args.candidates]]
            private, candidates = chosen[: args.private], chosen[args.private:]
            vote = {arm: votes(f, private, candidates) for arm, f in arms.items()}
            results[name] = {arm: compare(vote["torch"], vote[arm], len(candidates))
                             for arm in ("bf16", "int8")}
            print(name, json.dumps(results[name]), flush=True)
    machine = where.result()
    print(describe(machine))
    out = {"private": args.private, "candidates": args.candidates, "default_engine":
           default.engine_tag, "sets": results, "machine": machine, "where": describe(machine)}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
