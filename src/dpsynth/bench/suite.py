"""`dpsynth bench all`: the hot-path set in one run, each ratio beside its goal.

Sections, in order (each through the project's own bench function, each with its own
``"machine"`` object from :class:`~dpsynth.bench.machine.Where`, so a section measured under load
says so):

* ``bounds``: GEMM rates and memory bandwidth (:mod:`dpsynth.bench.bounds`);
* ``voting``: SecPE representative vote vs per-point (:func:`~dpsynth.bench.voting.bench_voting`),
  with the FLOP/byte account of both sides at the measured rates;
* ``embedding``: default engine vs sentence-transformers torch;
* ``generation``: default engine vs transformers float32, and its tokens/s as a fraction of the
  machine's bound for the model at the batch it ran;
* ``knn``: exact vs approximate Aug-PE vote (:func:`~dpsynth.bench.voting.bench_knn`).

Defaults are the sizes of the issue's table (voting 1M x 10k, knn 200k x 10k) and run in well
under 15 minutes on a quiet 2-core machine; every size is a parameter so tests can run toy ones.
A section that fails is reported with its error and the others still run.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..llm import ct2
from ..llm.local import default_model_cache
from ..llm.models import EMBEDDED_MODELS
from .bounds import (
    decode_gemm_seconds,
    decode_gemms,
    generation_bound,
    measure_rates,
    model_shape,
    secpe_account,
)
from .embedding import bench_embedding, demo_texts
from .generation import bench_generation, prompts
from .machine import PROBE_MB, PROBE_SIZE, Where, machine_info, probe_capacity
from .voting import bench_knn, bench_voting

SECTIONS = ("bounds", "voting", "embedding", "generation", "knn")
GOALS = {
    "voting": ">= 100x per-point at 1M x 10k (or the bound account)",
    "embedding": ">= 3x torch",
    "generation": ">= 0.7 of the tokens/s bound",
    "knn": "as measured (agreement >= 0.99)",
}


@dataclass
class Sizes:
    """Sizes of every section (the defaults are the real ones)."""

    private: int = 1_000_000
    synthetic: int = 10_000
    clusters: int = 1000
    dim: int = 384
    threads: int = 2
    embed_texts: int = 1000
    embed_rounds: int = 2
    model: str = "smollm2"
    prompts: int = 64
    tokens: int = 64
    gen_rounds: int = 1
    baseline_batch: int = 16
    knn_private: int = 200_000
    knn_synthetic: int = 10_000
    gemm_size: int = 2048
    copy_mb: int = 512
    sections: tuple[str, ...] = field(default=SECTIONS)


#: The square-GEMM rate of each sampling engine's arithmetic (``bound_at_engine_rate``).
ENGINE_GEMM = {"openvino": "torch_bfloat16", "ctranslate2": "torch_int8"}


def _best_fp32(rates: dict[str, Any]) -> float:
    g = rates["gemm_gflops"]
    return float(max(g["torch_float32"], g["numpy_float32"]))


def _best_any(rates: dict[str, Any]) -> float:
    g = rates["gemm_gflops"]
    return float(max(v for k, v in g.items()
                     if k.startswith(("torch_", "numpy_")) and isinstance(v, float)))


def _bounds(s: Sizes) -> dict[str, Any]:
    return measure_rates(s.gemm_size, s.copy_mb, s.threads)


def _voting(s: Sizes, rates: dict[str, Any]) -> dict[str, Any]:
    res = bench_voting(s.private, s.synthetic, s.clusters, s.dim, threads=s.threads)
    account = secpe_account(
        s.private, s.synthetic, res["clusters"], s.dim, _best_fp32(rates),
        rates["bandwidth_gbs"]["best"], res["per_point_seconds"], res["representative_seconds"],
        dgauss_per_second=rates.get("dgauss_per_second", {}).get("seeded"),  # the job's source
        phase_seconds={"accumulate": res["representative_accumulate_seconds"],
                       "noise": res["representative_noise_seconds"],
                       "vote": res["representative_vote_seconds"]})
    at_size = s.private >= 1_000_000 and s.synthetic >= 10_000
    return {"ratio": round(res["speedup"], 2), "ratio_name": "speedup vs per-point",
            "goal": GOALS["voting"],
            "meets_goal": bool(res["speedup"] >= 100) if at_size else None,
            "at_goal_size": at_size, "result": res, "bound": account}


def _embedding(s: Sizes) -> dict[str, Any]:
    res = bench_embedding(demo_texts(s.embed_texts), rounds=s.embed_rounds, threads=s.threads)
    return {"ratio": res["speedup"], "ratio_name": "speedup vs torch", "goal": GOALS["embedding"],
            "meets_goal": bool(res["speedup"] >= 3), "min_cosine": res["min_cosine"],
            "result": res}


def prompt_tokens(model: str, n: int, tokens: int) -> float:
    """Mean chat-template token count of the generation bench's ``n`` prompts."""
    from transformers import AutoTokenizer

    path = default_model_cache() / model if model in EMBEDDED_MODELS else Path(model)
    tok = AutoTokenizer.from_pretrained(str(path))
    texts = [tok.apply_chat_template(list(r.prompt), tokenize=False, add_generation_prompt=True)
             for r in prompts(n, tokens)]
    lens = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return sum(lens) / len(lens)


def _weights(model: str, engine: str) -> tuple[Path, float]:
    """Model directory and bytes of the weights the engine reads every step (openvino: the
    float32 files' bf16 half, as its CPU plugin compiles them)."""

    root = default_model_cache()
    model_dir = root / model if model in EMBEDDED_MODELS else Path(model)
    files: list[Path] = []
    if engine == "ctranslate2":
        out = ct2.converted_dir(model_dir, root, model_dir.name, model in EMBEDDED_MODELS)
        files = [out / "model.bin"]
    if not files or not files[0].is_file():
        files = sorted(model_dir.glob("*.safetensors"))
    share = 0.5 if engine == "openvino" else 1.0
    return model_dir, share * float(sum(f.stat().st_size for f in files))


def _generation(s: Sizes, rates: dict[str, Any]) -> dict[str, Any]:
    res = bench_generation(s.model, s.prompts, s.tokens, s.gen_rounds, s.baseline_batch)
    model_dir, weight_bytes = _weights(s.model, res["engine"])
    gen_mean = res["tokens"]["engine"] / (s.prompts * s.gen_rounds)
    context = prompt_tokens(s.model, s.prompts, s.tokens) + gen_mean / 2
    batch = min(res["batch_size"], s.prompts)
    shape = model_shape(model_dir)
    gemms = decode_gemm_seconds(decode_gemms(shape, batch), s.threads)
    products = max(gemms["float32_tokens_per_second"], gemms["int8_tokens_per_second"])
    # int8 engines keep float32 activations and KV cache, openvino a bf16 cache. Compute bound:
    # the faster of the FLOPs at the best square-GEMM rate (float32, bf16 or int8) and the
    # step's products alone at their real shapes (int8 or float32): what an engine could reach
    # with these kernels.
    kv = 2 if res["engine"] == "openvino" else 4
    bound = generation_bound(shape, batch, context, weight_bytes, kv, _best_any(rates),
                             rates["bandwidth_gbs"]["best"], res["tokens_per_second"], products)
    bound["decode_gemms"] = gemms
    bound_fp32 = generation_bound(shape, batch, context, weight_bytes, kv, _best_fp32(rates),
                                  rates["bandwidth_gbs"]["best"], res["tokens_per_second"],
                                  gemms["float32_tokens_per_second"])
    # the engine's own arithmetic: bf16 products (openvino) or int8 (ctranslate2)
    own = rates["gemm_gflops"].get(ENGINE_GEMM.get(res["engine"], ""))
    bound_own = generation_bound(shape, batch, context, weight_bytes, kv, float(own),
                                 rates["bandwidth_gbs"]["best"], res["tokens_per_second"]
                                 ) if isinstance(own, float) else None
    threads = res["threads"]
    if threads < s.threads:  # the engine follows the idle cores; the bound assumes all of them
        bound["note"] = (f"the engine ran on {threads} thread(s) of {s.threads} (it takes the "
                         "idle cores); the bound is for all of them")
    return {"ratio": bound["fraction_of_bound"], "ratio_name": "fraction of tokens/s bound",
            "goal": GOALS["generation"], "meets_goal": bool(bound["fraction_of_bound"] >= 0.7),
            "speedup_vs_transformers": res["speedup"], "result": res, "bound": bound,
            "bound_at_float32_rate": bound_fp32, "bound_at_engine_rate": bound_own}


def _knn(s: Sizes) -> dict[str, Any]:
    res = bench_knn(s.knn_private, s.knn_synthetic, dim=s.dim, reference=False, secpe=False,
                    threads=s.threads, clusters=min(s.clusters, s.knn_synthetic))
    return {"ratio": round(res["speedup"], 2), "ratio_name": "exact / best ANN time",
            "goal": GOALS["knn"], "meets_goal": None, "agreement": res["agreement"],
            "ann": res["ann"], "result": res}


def bench_all(sizes: Sizes | None = None,
              progress: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the chosen sections; ``progress(name, section)`` after each."""
    s = sizes or Sizes()
    unknown = set(s.sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    info = machine_info()
    out: dict[str, Any] = {"sizes": {k: v for k, v in asdict(s).items() if k != "sections"},
                           "sections": {}}
    rates: dict[str, Any] | None = None
    t0 = time.perf_counter()
    chosen = set(s.sections)
    if chosen & {"voting", "generation"}:
        chosen.add("bounds")  # their accounts need this run's rates
    def probe() -> dict[str, float]:  # the reference's sizes unless the suite's are smaller
        return probe_capacity(min(PROBE_SIZE, s.gemm_size), min(PROBE_MB, s.copy_mb))

    with Where(probe=probe) as whole:
        for name in (n for n in SECTIONS if n in chosen):
            with Where(start_load=whole.load_start, probe=probe) as where:
                try:
                    if name == "bounds":
                        rates = _bounds(s)
                        sec: dict[str, Any] = {"result": rates}
                    elif name == "voting":
                        sec = _voting(s, rates or {})
                    elif name == "embedding":
                        sec = _embedding(s)
                    elif name == "generation":
                        sec = _generation(s, rates or {})
                    else:
                        sec = _knn(s)
                except Exception as exc:  # noqa: BLE001 - one failed section must not hide the rest
                    sec = {"error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=5)}
            sec["machine"] = where.result(info)
            out["sections"][name] = sec
            if progress:
                progress(name, sec)
    out["machine"] = whole.result(info)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["quiet"] = all(sec["machine"]["quiet"] for sec in out["sections"].values()
                       if "machine" in sec)
    out["summary"] = [
        {"section": name, "ratio": sec.get("ratio"), "ratio_name": sec.get("ratio_name"),
         "goal": sec.get("goal"), "meets_goal": sec.get("meets_goal"),
         "quiet": sec.get("machine", {}).get("quiet"), "error": sec.get("error")}
        for name, sec in out["sections"].items() if name != "bounds"]
    return out
