"""How fast could DP-SynRAG's private prediction be on this CPU in float32? The arithmetic and
memory floor of one cluster against the measured baseline and default, in one run (issue 24,
point 4: is 3x the baseline within reach without arithmetic coarser than float32?).

    env PYTHONPATH=src DPSYNTH_TORCH_THREADS=2 .venv/bin/python benchmarks/pp_floor.py
        [--docs 80] [--tokens 70] [--max-doc-tokens 384] [--rounds 2] [--json]

Measured here, side by side: the machine's float32 matrix-multiply rate (torch, the best of the
decoder's own shapes at a decode step's rows and a prefill's tokens, and a square product,
before and after), its memory rate (a large copy), and between them ``dpsynth bench
private-prediction`` (:mod:`dpsynth.bench.private_prediction`) on one cluster of ``--docs``
demo documents (``--docs`` rows a decode pass, as the default k; the fastest of ``--rounds``),
and the costs of the default's OpenVINO decoder (:func:`engine_costs`: a prefill token alone
after the shared prefix as the default runs it, without the prefix, in a batch of 8; a decode
step of ``--docs`` rows at the public width and at that of ``max_doc_tokens`` 128).

The floor is the least time any float32 engine needs for the private prediction's own work at
those rates: every prompt token through the decoder's linear layers once (the shared prefix
once, each document's tokens once), T - 1 decode steps of one row a document, attention over
each row's real keys only (no padding), the output layer over the candidate set only, the
public one-row stepper; a decode step costs at least the larger of its arithmetic and its
reading the float32 weights and the keys and values (at 2 bytes, the f16 cache). The floor
leaves out everything else (norms, activations, rounding of shapes, Python), so the real time
can only be longer and ``baseline / floor`` is an upper bound on any float32 speed-up.
``speedup_bound_at_own_shapes`` is the same bound with the prefill at torch's rate on 1024
token rows and every one-token step at its rate on ``--docs`` rows (the decoder's own shapes)
instead of the best rate of any shape.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def best_of(fn: Callable[[], object], rounds: int = 5) -> float:
    """The fastest of ``rounds`` timed calls of ``fn`` after one untimed."""
    fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def matmul_rate(shapes: list[tuple[int, int, int]]) -> dict[str, float]:
    """float32 GFLOP/s of torch's matrix product at each (M, K, N)."""
    import torch

    rates = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / best_of(lambda a=a, b=b: a @ b) / 1e9
    return rates


def memory_rate(mib: int = 512) -> float:
    """GB/s of a large copy (bytes read + written)."""
    src = np.ones(mib * 2**18, dtype=np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_of(lambda: np.copyto(dst, src), 3) / 1e9


def engine_costs(gen: Any, precision: str, prefix: list[int], rows: int,
                 widths: list[int]) -> dict[str, float]:
    """Where the default's time goes, on its own compiled decoder: milliseconds a token-row of a
    prefill of 80 tokens (one row after the shared prefix, as the default runs it; one row with
    no prefix; 8 rows after the prefix, a batch the rows-apart rule forbids), and milliseconds
    a decode step of ``rows`` rows at each key length in ``widths``."""
    import openvino as ov

    from dpsynth.llm.ov_stepper import _prefill_mask, compiled

    model = compiled(gen, precision)
    req = model.create_infer_request()
    rng = np.random.default_rng(0)
    p = len(prefix)

    def infer(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, beams: np.ndarray) -> None:
        req.infer({"input_ids": ids, "mask": mask, "position_ids": pos, "beam_idx": beams})

    infer(np.asarray([prefix], np.int64), _prefill_mask(0, np.ones((1, p), bool)),
          np.arange(p, dtype=np.int64)[None], np.zeros(1, np.int32))
    base = {s.name: np.array(s.state.data, copy=True) for s in req.query_state()}

    def prefill(b: int, after_prefix: bool, n: int = 80) -> float:
        if after_prefix:
            for s in req.query_state():
                s.state = ov.Tensor(base[s.name])
        else:
            req.reset_state()
        k = p if after_prefix else 0
        ids = rng.integers(100, 5000, (b, n)).astype(np.int64)
        t = time.perf_counter()
        infer(ids, _prefill_mask(k, np.ones((b, n), bool)),
              np.tile(k + np.arange(n, dtype=np.int64), (b, 1)), np.zeros(b, np.int32))
        return (time.perf_counter() - t) * 1000 / (b * n)

    out = {}
    for name, b, after in (("prefill_alone_after_prefix", 1, True),
                           ("prefill_alone_no_prefix", 1, False),
                           ("prefill_8_rows_after_prefix", 8, True)):
        out[f"{name}_ms_token"] = min(prefill(b, after) for _ in range(4))
    _, heads, _, dim = next(iter(base.values())).shape
    for width in widths:
        step = model.create_infer_request()
        for s in step.query_state():
            s.state = ov.Tensor(rng.standard_normal((rows, heads, width, dim)).astype(
                np.float32) * 0.1)
        times = []
        for j in range(6):
            n = width + j + 1
            t = time.perf_counter()
            step.infer({"input_ids": np.full((rows, 1), 42, np.int64),
                        "mask": np.zeros((rows, 1, 1, n), np.float32),
                        "position_ids": np.full((rows, 1), n - 1, np.int64),
                        "beam_idx": np.arange(rows, dtype=np.int32)})
            times.append(time.perf_counter() - t)
        out[f"decode_step_{rows}_rows_{width}_keys_ms"] = 1000 * float(np.mean(times[1:]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=80)
    ap.add_argument("--tokens", type=int, default=70)
    ap.add_argument("--max-doc-tokens", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch

    from dpsynth.bench.private_prediction import bench_private_prediction
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator
    from dpsynth.llm.runtime import default_threads
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import document_width, prompt_parts

    torch.set_num_threads(int(os.environ.get("DPSYNTH_TORCH_THREADS") or default_threads()))
    gen = load_generator("smollm2", engine="transformers")
    cfg = gen.model.config
    h, inter, layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    vocab = int(gen.vocab_size)
    # weights of the decoder layers' linear maps (the norms' are 1-D), one multiply-add each
    linear = sum(w.numel() for w in gen.model.get_decoder().layers.parameters() if w.dim() == 2)

    texts = list(make_demo_corpus(max(args.docs, 60), seed=0)["text"])[:args.docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    p = len(gen.encode_prompt(prefix))
    lens = [min(len(gen.encode(t + suffix)), args.max_doc_tokens) for t in texts]
    pub_len = len(gen.encode_prompt(prefix + suffix))

    shapes = [(args.docs, h, inter), (args.docs, inter, h), (args.docs, h, h),
              (1024, h, inter), (1024, inter, h), (2048, 2048, 2048)]
    rates_before = matmul_rate(shapes)
    mem = memory_rate()
    got = bench_private_prediction(docs=args.docs, tokens=args.tokens, rounds=args.rounds,
                                   max_doc_tokens=args.max_doc_tokens, stepper_rows=args.docs)
    precision = "bf16" if got["dtype"] == "bfloat16" else "f32"
    costs = engine_costs(gen, precision, gen.encode_prompt(prefix), args.docs,
                         [p + document_width(gen, suffix, m) for m in (args.max_doc_tokens, 128)])
    rates_after = matmul_rate(shapes)
    peak = max(max(rates_before.values()), max(rates_after.values())) * 1e9  # FLOP/s
    t, s = args.tokens, got["support_size_mean"]

    # arithmetic (FLOP) and bytes the default's work needs at the least
    prefill = 2 * linear * (p + sum(lens)) + sum(
        4 * layers * heads * hd * (n * (n + 1) / 2 + n * p) for n in lens)
    step_flops = [2 * linear * args.docs + sum(4 * layers * heads * hd * (p + n + j)
                                               for n in lens) for j in range(t - 1)]
    step_bytes = [4 * linear + sum(2 * 2 * layers * kv * hd * (p + n + j) for n in lens)
                  for j in range(t - 1)]
    output = 2 * h * s * args.docs * t

    def floor_at(prefill_rate: float, step_rate: float) -> tuple[float, float]:
        """(floor, decode) seconds with prefill and one-token steps at these rates."""
        decode = sum(max(f / step_rate, b / (mem * 1e9))
                     for f, b in zip(step_flops, step_bytes, strict=True))
        public = ((2 * linear * pub_len) / prefill_rate + 2 * h * vocab * t / step_rate
                  + (t - 1) * max(2 * linear / step_rate, 4 * linear / (mem * 1e9)))
        return prefill / prefill_rate + output / step_rate + decode + public, decode

    floor, decode = floor_at(peak, peak)
    # the same work at the rates torch reaches at the decoder's own shapes: a prefill's 1024
    # token rows, a decode step's --docs rows (the best of before and after)
    own = {k: max(rates_before[k], rates_after[k]) * 1e9 for k in rates_before}
    rows_rate = max(v for k, v in own.items() if k.startswith(f"{args.docs}x"))
    tokens_rate = max(v for k, v in own.items() if k.startswith("1024x"))
    floor_own, _ = floor_at(tokens_rate, rows_rate)
    base = t / got["baseline_tokens_per_second"]
    default = t / got["tokens_per_second"]
    out = {
        "documents": args.docs, "tokens": t, "max_doc_tokens": args.max_doc_tokens,
        "prefix_tokens": p, "row_tokens_mean": float(np.mean(lens)),
        "row_tokens_max": int(max(lens)), "support_size_mean": s,
        "matmul_gflops_before": rates_before, "matmul_gflops_after": rates_after,
        "peak_gflops": peak / 1e9, "memory_gbs": mem,
        "floor_s": floor, "floor_prefill_s": prefill / peak, "floor_decode_s": decode,
        "floor_at_own_shapes_s": floor_own, "speedup_bound_at_own_shapes": base / floor_own,
        "baseline_s": base, "default_s": default,
        "baseline_prefill_s": got["baseline_prefill_s"], "baseline_decode_s":
            got["baseline_decode_s"], "prefill_s": got["prefill_s"], "decode_s": got["decode_s"],
        "speedup": got["speedup"], "speedup_bound": base / floor,
        "default_over_floor": default / floor, "kl": got["kl"], "kl_max": got["kl_max"],
        "floor_prefill_ms_token": 2 * linear / peak * 1000,
        "floor_decode_step_ms": decode / max(1, t - 1) * 1000, **costs,
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.docs} documents ({out['row_tokens_mean']:.0f} tokens a row on average, "
          f"prefix {p}), T = {t}, candidates {s:.0f}")
    print("float32 matmul GFLOP/s: " + ", ".join(f"{k} {v:.0f}/{rates_after[k]:.0f}"
                                                 for k, v in rates_before.items())
          + f" (before/after); memory {mem:.1f} GB/s")
    print(f"floor {floor:.1f} s (prefill {prefill / peak:.1f}, decode {decode:.1f}); baseline "
          f"{base:.1f} s, default {default:.1f} s ({got['speedup']:.2f}x)")
    print("engine (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items())
          + f"; floor: a prefill token {out['floor_prefill_ms_token']:.2f}, a decode step "
          f"{out['floor_decode_step_ms']:.0f}")
    print(f"at the rates of the decoder's own shapes the floor is {floor_own:.1f} s: a bound "
          f"of {base / floor_own:.2f}x")
    print(f"best float32 speed-up over the baseline: {base / floor:.2f}x; the default takes "
          f"{default / floor:.2f}x the floor; KL mean {got['kl']:.1e} max {got['kl_max']:.1e}")


if __name__ == "__main__":
    main()
