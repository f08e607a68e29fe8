"""Markdown of a `dpsynth bench all` result: the rates, the bound accounts, the ratio table."""

from __future__ import annotations

from typing import Any

from dpsynth.bench.machine import describe


def _fmt(x: Any) -> str:
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def summary_table(res: dict[str, Any]) -> list[str]:
    """One row per section: ratio, goal, met, where."""
    out = ["| section | ratio | goal | met | load avg start/end | other load | quiet |",
           "|---|---:|---|---|---|---:|---|"]
    for name, sec in res["sections"].items():
        if name == "bounds":
            continue
        m = sec.get("machine", {})
        la = m.get("load_average_1m", {})
        ratio = (f"ERROR {sec['error']}" if "error" in sec
                 else f"{_fmt(sec['ratio'])} ({sec['ratio_name']})")
        out.append(f"| {name} | {ratio} | {sec.get('goal', '')} | {sec.get('meets_goal')} | "
                   f"{la.get('start')} / {la.get('end')} | {m.get('other_load')} | "
                   f"{m.get('quiet')} |")
    return out


def rates_lines(rates: dict[str, Any]) -> list[str]:
    """GEMM and bandwidth table."""
    g, b = rates["gemm_gflops"], rates["bandwidth_gbs"]
    out = [f"GEMM, {g['size']}^3, best of repeats (GFLOP/s; int8: GOP/s), torch threads "
           f"{g['torch_threads']}:", "",
           "| kernel | rate |", "|---|---:|"]
    for k in ("torch_float32", "numpy_float32", "torch_bfloat16", "torch_int8"):
        out.append(f"| {k} | {g.get(k)} |")
    for name, sh in g.get("shapes", {}).items():
        out.append(f"| {name} ({sh['m']}x{sh['k']} @ {sh['k']}x{sh['n']}), float32 | torch "
                   f"{sh['torch_float32']}, numpy {sh.get('numpy_float32')} |")
    out += ["", f"Memory bandwidth ({b['array_mb']} MB arrays, GB/s; copy counts read + write): "
            f"numpy copy {b['numpy_copy']}, torch copy {b['torch_copy']}, numpy read "
            f"{b['numpy_read']}; used: **{b['best']}**."]
    d = rates.get("dgauss_per_second")
    if d:
        out += ["", f"Exact discrete Gaussian sampler ({d['draws']:,} draws at variance "
                f"{d['variance']:g}, best of repeats): seeded source {d['seeded']:,} draws/s, "
                f"secure source (OS entropy, the default) {d['secure']:,} draws/s."]
    return out


def secpe_lines(acc: dict[str, Any]) -> list[str]:
    """The SecPE vote account."""
    out = [f"At M = {acc['private']:,} private x N = {acc['synthetic']:,} candidates, "
           f"K = {acc['clusters']}, d = {acc['dim']}; rates used: "
           f"{acc['rates']['gemm_gflops']} GFLOP/s (best float32), "
           f"{acc['rates']['bandwidth_gbs']} GB/s, exact discrete Gaussian draws "
           f"{acc['rates'].get('dgauss_per_second') or '-'} /s (the bench's seeded source).", "",
           "| side | phase | GFLOP | GB moved | compute s | memory s | sampler s | bound by | "
           "bound s | measured s | fraction of bound |",
           "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for side in ("per_point", "representative"):
        for ph, p in acc[side]["phases"].items():
            out.append(f"| {side} | {ph} | {p['gflop']} | {p['gbytes']} | "
                       f"{p['compute_seconds']} | {p['memory_seconds']} | "
                       f"{p.get('rate_seconds', '-')} | {p['bound_by']} | "
                       f"{p.get('bound_seconds', '-')} | {p.get('measured_seconds', '-')} | "
                       f"{p.get('fraction_of_bound', '-')} |")
    out += ["", "| side | bound s | measured s | fraction of bound |", "|---|---:|---:|---:|"]
    for side in ("per_point", "representative"):
        s = acc[side]
        out.append(f"| {side} | {s['bound_seconds']} | {s.get('measured_seconds', '-')} | "
                   f"{s.get('fraction_of_bound', '-')} |")
    out += ["", f"Speed-up at both bounds: **{acc['bound_speedup']}x**; measured: "
            f"**{acc.get('measured_speedup', '-')}x**."]
    if "reading" in acc:
        out += ["", acc["reading"] + "."]
    return out


def generation_lines(gen: dict[str, Any]) -> list[str]:
    """The decoding bound."""
    b, r = gen["bound"], gen["result"]
    f32 = gen.get("bound_at_float32_rate", {})
    own = gen.get("bound_at_engine_rate") or {}
    kv = "bf16" if r["engine"] == "openvino" else "float32"
    return [
        f"`{r['model']}`, engine {r['engine']}, batch {b['batch']}, mean context "
        f"{b['mean_context']} tokens (prompt + half the generated), engine threads "
        f"{r['threads']}.", "",
        "| per generated token | value |", "|---|---:|",
        f"| weights read per step / batch (MB) | {b['weight_mbytes']} / {b['batch']} |",
        f"| KV cache bytes per context token ({kv}) | {b['kv_bytes_per_context_token']} |",
        f"| MB moved per token | {b['mbytes_per_token']} |",
        f"| MFLOP per token | {b['mflop_per_token']} |",
        f"| memory-bound tokens/s (at {b['rates']['bandwidth_gbs']} GB/s) | "
        f"{b['memory_bound_tokens_per_second']} |",
        f"| tokens/s at the best square-GEMM rate ({b['rates']['gemm_gflops']} G(FL)OP/s) | "
        f"{b.get('square_gemm_tokens_per_second')} |",
        f"| tokens/s of the step's products alone at their shapes (below) | "
        f"{b.get('products_tokens_per_second')} |",
        f"| compute bound (the faster of the two) | {b['compute_bound_tokens_per_second']} |",
        f"| compute bound with float32 kernels only | "
        f"{f32.get('compute_bound_tokens_per_second', '-')} |",
        f"| compute bound at the engine's own arithmetic's square-GEMM rate | "
        f"{own.get('compute_bound_tokens_per_second', '-')} |",
        f"| **bound** ({b['bound_by']}) | **{b['bound_tokens_per_second']}** |",
        f"| default engine measured | {b.get('tokens_per_second')} |",
        f"| **fraction of bound** | **{b.get('fraction_of_bound')}** "
        f"(float32-rate bound: {f32.get('fraction_of_bound', '-')}; engine-rate bound: "
        f"{own.get('fraction_of_bound', '-')}) |",
        *(["", f"Note: {b['note']}."] if "note" in b else []),
        *_gemm_lines(b, r),
        "", f"Against transformers float32: {r['speedup']}x "
        f"({r['tokens_per_second']} vs {r['baseline_tokens_per_second']} tokens/s).",
        *([f"Against ctranslate2 int8: {r['speedup_vs_ctranslate2']}x "
           f"({r['ctranslate2_tokens_per_second']} tokens/s; per CPU-second "
           f"{r['speedup_vs_ctranslate2_cpu']}x)."] if "speedup_vs_ctranslate2" in r else []),
    ]


def _gemm_lines(b: dict[str, Any], r: dict[str, Any]) -> list[str]:
    g = b.get("decode_gemms")
    if not g:
        return []
    out = ["", f"The step's matrix products alone at their real shapes (m = {b['batch']}), torch "
           "kernels, best of repeats:", "",
           "| product | k x n | per step | float32 GFLOP/s | int8 GOP/s |",
           "|---|---|---:|---:|---:|"]
    for name, s in g["shapes"].items():
        out.append(f"| {name} | {s['k']} x {s['n']} | {s['count']} | {s['float32_gflops']} | "
                   f"{s['int8_gflops']} |")
    out += ["", f"Step time of the products alone: float32 {g['float32_step_seconds']} s "
            f"({g['float32_tokens_per_second']} tokens/s), int8 {g['int8_step_seconds']} s "
            f"({g['int8_tokens_per_second']} tokens/s)."]
    return out


def render(res: dict[str, Any], command: str) -> str:
    """The whole bounds.md."""
    lines = ["## Hot paths against this CPU's bounds (`dpsynth bench all`)", "",
             f"Command: `{command}`", "", f"Where: {describe(res['machine'])}; "
             f"{res['seconds']:.0f} s in all.", ""]
    lines += summary_table(res) + [""]
    secs = res["sections"]
    if "result" in secs.get("bounds", {}):
        lines += ["### Rates", ""] + rates_lines(secs["bounds"]["result"]) + [""]
    if "bound" in secs.get("voting", {}):
        lines += ["### SecPE vote: FLOPs and bytes each side must move", ""]
        lines += secpe_lines(secs["voting"]["bound"]) + [""]
    if "bound" in secs.get("generation", {}):
        lines += ["### Generation: tokens/s bound", ""]
        lines += generation_lines(secs["generation"]) + [""]
    return "\n".join(lines)
