"""What this CPU allows: GEMM rates, memory bandwidth, and the bounds they put on hot paths.

:func:`measure_rates` times matrix products (float32 and bf16 through torch; float32 through
numpy's BLAS; int8 through ``torch._int_mm`` where it runs) and a large array copy. Each rate is
the best of a few repeats (a bound is what the machine can do, not what it does on average).

:func:`secpe_account` says, for SecPE's vote at M private x N candidates, the floating-point
operations and the bytes each side must move (per-point: every private row against every
candidate; representatives: one pass over the private rows, then K representatives against the
candidates), the time those take at the measured rates, and -- given the measured times -- how
far each side, and each phase of the representatives, is from its bound. Their noise phase is
exact discrete Gaussian sampling, bound by the sampler's rate on this machine
(:func:`sampler_rate`, measured in the same run), not by FLOPs or bytes.

:func:`generation_bound` does the same for decoding with a llama-style model: per generated
token, the weights (read once per step, shared by the batch) and the KV cache (read for every
row) against the bandwidth, and the FLOPs against the GEMM rate; tokens/s bound = the slower
of the two.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..privacy import dgauss
from ..privacy.noise import SecureNoise, SeededNoise

GB = 1e9


def _sig(x: float, digits: int = 4) -> float:
    """``x`` to ``digits`` significant figures (for the report; sums use the raw values)."""
    return float(f"{x:.{digits}g}")


def _best(fn: Callable[[], object], repeats: int, budget: float = 3.0) -> float:
    """Fastest of ``repeats`` timed calls (after one warm-up); stops early past ``budget`` s."""
    fn()
    best = math.inf
    start = time.perf_counter()
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > budget:
            break
    return best


def gemm_rates(size: int = 2048, threads: int | None = None, repeats: int = 5,
               shapes: dict[str, tuple[int, int, int]] | None = None) -> dict[str, Any]:
    """GFLOP/s of ``size``-square matrix products: torch float32 / bf16 / int8, numpy float32;
    plus float32 (torch) at the named ``shapes`` (m, k, n) of the hot paths."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    out: dict[str, Any] = {"size": size, "torch_threads": torch.get_num_threads()}
    flops = 2.0 * size**3
    gen = torch.Generator().manual_seed(0)
    for name, dtype in (("torch_float32", torch.float32), ("torch_bfloat16", torch.bfloat16)):
        a = torch.randn(size, size, generator=gen).to(dtype)
        b = torch.randn(size, size, generator=gen).to(dtype)
        out[name] = _sig(flops / _best(lambda a=a, b=b: a @ b, repeats) / GB)
    try:  # int8 x int8 -> int32 (the arithmetic of int8 inference engines)
        a8 = torch.randint(-128, 127, (size, size), dtype=torch.int8, generator=gen)
        b8 = torch.randint(-128, 127, (size, size), dtype=torch.int8, generator=gen)
        out["torch_int8"] = _sig(flops / _best(lambda: torch._int_mm(a8, b8), repeats) / GB)
    except (AttributeError, RuntimeError):
        out["torch_int8"] = None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((size, size), dtype=np.float32)
    y = rng.standard_normal((size, size), dtype=np.float32)
    out["numpy_float32"] = _sig(flops / _best(lambda: x @ y, repeats) / GB)
    out["shapes"] = {}
    for name, (m, k, n) in (shapes or {}).items():
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        an, bn = a.numpy(), b.numpy()
        f = 2.0 * m * k * n
        out["shapes"][name] = {
            "m": m, "k": k, "n": n,
            "torch_float32": _sig(f / _best(lambda a=a, b=b: a @ b, repeats) / GB),
            "numpy_float32": _sig(f / _best(lambda an=an, bn=bn: an @ bn, repeats) / GB)}
    return out


def bandwidth(mb: int = 512, threads: int | None = None, repeats: int = 5) -> dict[str, Any]:
    """Memory bandwidth, GB/s: a copy of ``mb`` MB (bytes read + written, numpy on one core and
    torch on ``threads``) and a read (numpy sum)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    n = mb * 2**20 // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    moved = 2.0 * src.nbytes
    out: dict[str, Any] = {"array_mb": mb}
    out["numpy_copy"] = _sig(moved / _best(lambda: np.copyto(dst, src), repeats) / GB)
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    out["torch_copy"] = _sig(moved / _best(lambda: td.copy_(ts), repeats) / GB)
    out["numpy_read"] = _sig(src.nbytes / _best(lambda: src.sum(), repeats) / GB)
    out["best"] = max(out["numpy_copy"], out["torch_copy"], out["numpy_read"])
    return out


def measure_rates(size: int = 2048, mb: int = 512, threads: int | None = None,
                  repeats: int = 5) -> dict[str, Any]:
    """GEMM rates (with the voting and decoding shapes) and bandwidth of this machine."""
    shapes = {"voting_block": (4096, 384, 1024), "decode_mlp_b64": (64, 576, 1536)}
    t = time.perf_counter()
    out = {"gemm_gflops": gemm_rates(size, threads, repeats, shapes),
           "bandwidth_gbs": bandwidth(mb, threads, repeats),
           "dgauss_per_second": sampler_rate(draws=min(2**18, 64 * size))}
    out["seconds"] = round(time.perf_counter() - t, 2)
    return out


def _side(phases: dict[str, dict[str, float]], gflops: float, gbs: float) -> dict[str, Any]:
    """Bound of a path made of phases run one after another: each phase takes at least the
    longer of its compute time and its memory time."""
    out: dict[str, Any] = {"phases": {}}
    total = 0.0
    for name, p in phases.items():
        compute, memory = p["flops"] / (gflops * GB), p["bytes"] / (gbs * GB)
        rate = p.get("rate_seconds", 0.0)  # a phase bound by a measured rate, not FLOPs/bytes
        floor = {"compute": compute, "memory": memory, "sampler rate": rate}
        bound_by = max(floor, key=floor.__getitem__)
        total += floor[bound_by]
        out["phases"][name] = {"gflop": _sig(p["flops"] / GB),
                               "gbytes": _sig(p["bytes"] / GB),
                               "compute_seconds": _sig(compute),
                               "memory_seconds": _sig(memory),
                               "rate_seconds": _sig(rate),
                               "bound_seconds": _sig(floor[bound_by]),
                               "bound_by": bound_by}
    out["gflop"] = _sig(sum(p["flops"] for p in phases.values()) / GB)
    out["gbytes"] = _sig(sum(p["bytes"] for p in phases.values()) / GB)
    out["bound_seconds"] = _sig(total)
    out["_seconds"] = total
    return out


def sampler_rate(draws: int = 2**18, repeats: int = 3, variance: float = 1e6) -> dict[str, Any]:
    """Exact discrete Gaussian draws per second (:mod:`dpsynth.privacy.dgauss`) from the seeded
    (research) and the secure (default, OS entropy) sources: the rate that bounds SecPE's noise
    phase, which is integer rejection sampling (CKS 2020, Algorithm 3), not FLOPs or bytes."""
    out: dict[str, Any] = {"draws": draws, "variance": variance}
    for name, src in (("seeded", SeededNoise(0)), ("secure", SecureNoise())):
        out[name] = _sig(draws / _best(lambda s=src: dgauss.sample(s, variance, draws), repeats))
    return out


def secpe_account(m: int, n: int, k: int, d: int, gflops: float, gbs: float,
                  per_point_seconds: float | None = None,
                  representative_seconds: float | None = None,
                  dgauss_per_second: float | None = None,
                  phase_seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """FLOPs, bytes and bound of both sides of SecPE's vote (float32, rate 1: every record
    sampled, cached centre assignment); fraction of bound of the measured times if given.

    per-point: 2 M N d FLOPs; it must read the M x d private rows and the N x d candidates once
    (the M x N scores can stay in cache, block by block). representatives: per private row a
    coin flip (8-byte rate, 8-byte uniform), the 4-byte cached label, the d floats read, norm,
    clip and add (4 d FLOPs); then, with ``dgauss_per_second`` (:func:`sampler_rate`), the
    K (d + 1) exact discrete Gaussian draws of the release at that rate; then the K x N vote,
    2 K N d FLOPs. ``phase_seconds`` (the measured time of each representative phase) puts
    each phase beside its own bound.
    """
    f32 = 4
    per_point = _side({"nearest": {"flops": 2.0 * m * n * d,
                                   "bytes": float(f32 * (m + n) * d + 8 * n)}}, gflops, gbs)
    per_point["score_matrix_gbytes_if_spilled"] = _sig(f32 * m * n / GB)
    phases: dict[str, dict[str, float]] = {
        "accumulate": {"flops": 4.0 * m * d, "bytes": float(f32 * m * d + (8 + 8 + 4) * m)}}
    if dgauss_per_second:
        phases["noise"] = {"flops": 0.0, "bytes": 0.0,
                           "rate_seconds": k * (d + 1) / dgauss_per_second}
    phases["vote"] = {"flops": 2.0 * k * n * d, "bytes": float(f32 * (k + n) * d + 8 * n)}
    reps = _side(phases, gflops, gbs)
    for name, seconds in (phase_seconds or {}).items():
        if name in reps["phases"]:
            ph = reps["phases"][name]
            ph["measured_seconds"] = _sig(seconds)
            ph["fraction_of_bound"] = _sig(ph["bound_seconds"] / max(seconds, 1e-12), 3)
    out: dict[str, Any] = {
        "private": m, "synthetic": n, "clusters": k, "dim": d,
        "rates": {"gemm_gflops": gflops, "bandwidth_gbs": gbs,
                  "dgauss_per_second": dgauss_per_second},
        "per_point": per_point, "representative": reps,
        "bound_speedup": _sig(per_point["_seconds"] / reps["_seconds"], 3),
    }
    if per_point_seconds and representative_seconds:
        _measured(out, per_point_seconds, representative_seconds)
    for side in (per_point, reps):
        side.pop("_seconds")
    return out


def _measured(out: dict[str, Any], per_point_seconds: float,
              representative_seconds: float) -> None:
    """Each side's measured time against its bound, and the reading of the account."""
    per_point, reps = out["per_point"], out["representative"]
    pp = per_point["_seconds"] / per_point_seconds
    rp = reps["_seconds"] / representative_seconds
    per_point["measured_seconds"] = _sig(per_point_seconds)
    per_point["fraction_of_bound"] = _sig(pp, 3)
    reps["measured_seconds"] = _sig(representative_seconds)
    reps["fraction_of_bound"] = _sig(rp, 3)
    out["measured_speedup"] = _sig(per_point_seconds / representative_seconds, 3)
    off = "representative" if rp < pp else "per_point"
    out["off_bound"] = off
    out["off_bound_by"] = _sig(1 / min(pp, rp), 3)
    out["reading"] = (
        f"per-point at {pp:.0%} of its bound, representatives at {rp:.0%}; the "
        f"{off.replace('_', '-')} side is {1 / min(pp, rp):.1f}x off its bound; at both "
        f"bounds the speed-up would be {out['bound_speedup']}x")
    slow = [(name, ph) for name, ph in reps["phases"].items() if "measured_seconds" in ph]
    if slow:
        name, ph = min(slow, key=lambda x: x[1]["fraction_of_bound"])
        out["reading"] += (f"; the representatives' furthest phase is {name}, "
                           f"{ph['measured_seconds']} s against its bound {ph['bound_seconds']} s")


def model_shape(model_dir: Path) -> dict[str, Any]:
    """Layer sizes of a llama-style HF ``config.json``: layers, hidden, heads, KV heads, head
    dim, MLP width, vocabulary, and the parameters every decode step multiplies by."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    h, layers = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv = int(cfg.get("num_key_value_heads", heads))
    hd = int(cfg.get("head_dim") or h // heads)
    inter, vocab = int(cfg["intermediate_size"]), int(cfg["vocab_size"])
    per_layer = h * heads * hd * 2 + h * kv * hd * 2 + 3 * h * inter
    return {"layers": layers, "hidden": h, "heads": heads, "kv_heads": kv, "head_dim": hd,
            "intermediate": inter, "vocab": vocab,
            "matmul_params": layers * per_layer + vocab * h}


def decode_gemms(shape: dict[str, Any], batch: int) -> dict[str, tuple[int, int, int, int]]:
    """The matrix products of one decode step at ``batch`` rows: name -> (m, k, n, count)."""
    h, layers = shape["hidden"], shape["layers"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    inter = shape["intermediate"]
    return {"q": (batch, h, q, layers), "o": (batch, q, h, layers),
            "k_v": (batch, h, kv, 2 * layers), "gate_up": (batch, h, inter, 2 * layers),
            "down": (batch, inter, h, layers), "lm_head": (batch, h, shape["vocab"], 1)}


def decode_gemm_seconds(gemms: dict[str, tuple[int, int, int, int]], threads: int | None = None,
                        repeats: int = 20) -> dict[str, Any]:
    """Seconds of one decode step's matrix products alone, through torch float32 and int8
    (``torch._int_mm``) kernels at their real shapes (small m: well below the square rates);
    each product on 1 thread and on ``threads``, the faster kept (a small product on two
    threads waits for both, and a busy core delays one)."""
    import torch

    before = torch.get_num_threads()
    counts = sorted({1, threads or before})

    def best(fn: Callable[[], object]) -> float:
        secs = math.inf
        for c in counts:
            torch.set_num_threads(c)
            secs = min(secs, _best(fn, repeats, budget=1.0))
        torch.set_num_threads(before)
        return secs

    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"threads_tried": counts, "shapes": {}}
    total = {"float32": 0.0, "int8": 0.0}
    for name, (m, k, n, count) in gemms.items():
        a, b = torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen)
        row: dict[str, Any] = {"m": m, "k": k, "n": n, "count": count}
        secs = {"float32": best(lambda a=a, b=b: a @ b)}
        try:
            a8 = torch.randint(-128, 127, (m, k), dtype=torch.int8, generator=gen)
            b8 = torch.randint(-128, 127, (k, n), dtype=torch.int8, generator=gen)
            secs["int8"] = best(lambda a8=a8, b8=b8: torch._int_mm(a8, b8))
        except (AttributeError, RuntimeError):
            secs["int8"] = math.nan
        for dt, s in secs.items():
            row[f"{dt}_gflops"] = _sig(2.0 * m * k * n / s / GB, 3)
            total[dt] += count * s
        out["shapes"][name] = row
    for dt, s in total.items():
        out[f"{dt}_step_seconds"] = _sig(s)
        out[f"{dt}_tokens_per_second"] = _sig(next(iter(gemms.values()))[0] / s)
    return out


def generation_bound(shape: dict[str, Any], batch: int, context: float, weight_bytes: float,
                     kv_bytes_per_value: int, gflops: float, gbs: float,
                     tokens_per_second: float | None = None,
                     products_tokens_per_second: float | None = None) -> dict[str, Any]:
    """Tokens/s bound of batched decoding at mean ``context`` tokens per row.

    Per step (``batch`` tokens): the weights are read once (``weight_bytes``, e.g. the int8
    file), every row reads its KV cache (2 layers kv_heads head_dim values per past token) and
    writes one more; FLOPs per token = 2 x matmul parameters + attention (2 x 2 x layers x heads
    x head_dim x context). ``products_tokens_per_second``: the step's products alone at their
    real shapes (:func:`decode_gemm_seconds`); the compute bound is the faster of the two."""
    kv_per_token = 2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] \
        * kv_bytes_per_value
    bytes_per_token = weight_bytes / batch + kv_per_token * (context + 1)
    flops_per_token = 2.0 * shape["matmul_params"] \
        + 4.0 * shape["layers"] * shape["heads"] * shape["head_dim"] * context
    memory_tps = gbs * GB / bytes_per_token
    square_tps = gflops * GB / flops_per_token
    compute_tps = max(square_tps, products_tokens_per_second or 0.0)
    bound = min(memory_tps, compute_tps)
    out: dict[str, Any] = {
        "batch": batch, "mean_context": round(context, 1),
        "weight_mbytes": round(weight_bytes / 2**20, 1),
        "kv_bytes_per_context_token": kv_per_token,
        "mbytes_per_token": round(bytes_per_token / 2**20, 3),
        "mflop_per_token": round(flops_per_token / 1e6, 1),
        "rates": {"gemm_gflops": gflops, "bandwidth_gbs": gbs},
        "memory_bound_tokens_per_second": round(memory_tps, 1),
        "square_gemm_tokens_per_second": round(square_tps, 1),
        "products_tokens_per_second": products_tokens_per_second,
        "compute_bound_tokens_per_second": round(compute_tps, 1),
        "bound_tokens_per_second": round(bound, 1),
        "bound_by": "memory" if memory_tps < compute_tps else "compute",
    }
    if tokens_per_second:
        out["tokens_per_second"] = round(tokens_per_second, 1)
        out["fraction_of_bound"] = _sig(tokens_per_second / bound, 3)
    return out
