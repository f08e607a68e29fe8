"""`dpsynth bench all` and the machine / bound helpers: shape of the results (never speed)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpsynth.bench.bounds import generation_bound, secpe_account
from dpsynth.bench.machine import (
    CAPACITY_REFERENCE,
    Where,
    describe,
    parse_cpuinfo,
    probe_capacity,
)
from dpsynth.bench.report import render
from dpsynth.cli import app

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni
processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512_bf16 avx512_vnni
"""


def test_parse_cpuinfo_x86():
    info = parse_cpuinfo(CPUINFO)
    assert info["cpu_model"] == "AMD EPYC 9R14 96-Core Processor"
    assert info["logical_cpus"] == 2
    assert info["isa"] == ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni"]
    assert info["amx"] is False


def test_parse_cpuinfo_amx_and_empty():
    info = parse_cpuinfo("processor: 0\nmodel name: Xeon\nflags: avx2 amx_tile amx_bf16\n")
    assert info["isa"] == ["avx2", "amx_tile", "amx_bf16"] and info["amx"] is True
    assert parse_cpuinfo("") == {"cpu_model": "unknown", "logical_cpus": 0, "isa": [],
                                 "amx": False}


def test_where_result_fields():
    with Where(sample_every=0.01, probe=lambda: probe_capacity(size=64, mb=1, repeats=1)) \
            as where:
        sum(range(1000))
    res = where.result({"cpu_model": "x"})
    assert res["cpu_model"] == "x"
    assert set(res["load_average_1m"]) == {"start", "end", "max"}
    assert isinstance(res["quiet"], bool) and res["other_load"] >= 0
    cap = res["capacity"]  # probed before and after; no reference for a CPU named "x"
    assert len(where.probes) == 2 and cap["gemm_gflops"] > 0 and cap["copy_gbs"] > 0
    assert cap["reference"] is None and cap["slowed"] is None
    # probes at other sizes than the reference's are not compared with it
    assert where.result({"cpu_model": "AMD EPYC", "cores": 2, "isa": list(AVX512)}
                        )["capacity"]["slowed"] is None


AVX512 = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni")
HEALTHY = CAPACITY_REFERENCE[("AMD EPYC", 2, AVX512)]


@pytest.mark.parametrize(("share", "slowed"), [(1.0, False), (0.25, True)])
def test_a_host_that_delivers_a_fraction_of_its_rate_is_not_quiet(monkeypatch, share, slowed):
    """The load average of a guest on a contended host reads low while its cores deliver a
    fraction of their rate: the capacity probe marks such a run slowed. A CPU of the same name
    with other instruction sets (AVX2 only, 2026-12-05 here) has no reference: reported, not
    judged."""
    import dpsynth.bench.machine as machine

    monkeypatch.setattr(machine.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    monkeypatch.setattr(machine, "_busy_seconds", lambda: 0.0)
    rates = {"gemm_gflops": HEALTHY["gemm_gflops"], "copy_gbs": HEALTHY["copy_gbs"] * share}
    with Where(sample_every=0.01, probe=lambda: rates) as where:
        pass
    info = {"cpu_model": "AMD EPYC", "cores": 2, "isa": list(AVX512)}
    res = where.result(info)
    assert res["capacity"]["slowed"] is slowed and res["capacity"]["share"] == share
    assert res["quiet"] is (not slowed)
    assert ("slowed" in describe(res)) is slowed
    for other in ({**info, "cores": 4}, {**info, "isa": ["avx2", "fma"]}):
        assert "no reference" in describe(where.result(other))
        assert where.result(other)["quiet"] is True  # not compared: the load decides


def test_a_suite_section_is_judged_by_the_suite_start_not_by_its_own(monkeypatch):
    """Inside `bench all` a section starts at the load the previous section left (about 2 on
    2 cores by itself): the quiet rule reads the suite's start and other processes' CPU."""
    import dpsynth.bench.machine as machine

    monkeypatch.setattr(machine.os, "getloadavg", lambda: (1.9, 1.9, 1.9))
    monkeypatch.setattr(machine, "_busy_seconds", lambda: 0.0)  # nothing else ran
    with Where(sample_every=0.01, probe=None) as own:
        pass
    with Where(sample_every=0.01, start_load=0.4, probe=None) as in_suite:
        pass
    with Where(sample_every=0.01, start_load=1.5, probe=None) as busy_suite:
        pass
    assert own.quiet({}) is False and in_suite.quiet({}) is True
    assert busy_suite.quiet({}) is False
    assert in_suite.result({})["load_average_1m"]["start"] == 1.9  # reported as measured


def test_secpe_account_counts():
    acc = secpe_account(1_000_000, 10_000, 1000, 384, gflops=100.0, gbs=10.0,
                        per_point_seconds=60.0, representative_seconds=1.0)
    assert acc["per_point"]["gflop"] == pytest.approx(2 * 1e6 * 1e4 * 384 / 1e9, rel=1e-3)
    assert acc["representative"]["phases"]["vote"]["gflop"] == pytest.approx(
        2 * 1000 * 1e4 * 384 / 1e9, rel=1e-3)
    assert acc["per_point"]["phases"]["nearest"]["bound_by"] == "compute"
    assert acc["representative"]["phases"]["accumulate"]["bound_by"] == "memory"
    assert acc["off_bound"] in ("per_point", "representative")
    assert acc["measured_speedup"] == pytest.approx(60.0)


def test_secpe_account_puts_the_sampler_and_each_phase_beside_its_bound():
    """The noise phase is bound by the sampler's measured rate (K (d + 1) draws); each
    measured phase gets its own fraction of bound, and the reading names the furthest."""
    acc = secpe_account(1_000_000, 10_000, 1000, 384, gflops=100.0, gbs=10.0,
                        per_point_seconds=60.0, representative_seconds=1.0,
                        dgauss_per_second=1e6,
                        phase_seconds={"accumulate": 0.4, "noise": 0.5, "vote": 0.1})
    noise = acc["representative"]["phases"]["noise"]
    assert noise["bound_by"] == "sampler rate"
    assert noise["bound_seconds"] == pytest.approx(1000 * 385 / 1e6, rel=1e-3)
    assert noise["fraction_of_bound"] == pytest.approx(0.385 / 0.5, rel=1e-2)
    accumulate = acc["representative"]["phases"]["accumulate"]
    assert accumulate["fraction_of_bound"] == pytest.approx(
        accumulate["memory_seconds"] / 0.4, rel=1e-2)
    bound = sum(p["bound_seconds"] for p in acc["representative"]["phases"].values())
    assert acc["representative"]["bound_seconds"] == pytest.approx(bound, rel=1e-3)
    assert "furthest phase is accumulate" in acc["reading"]
    without = secpe_account(1_000_000, 10_000, 1000, 384, gflops=100.0, gbs=10.0)
    assert "noise" not in without["representative"]["phases"]
    assert without["bound_speedup"] > acc["bound_speedup"]


def test_generation_bound_memory_vs_compute():
    shape = {"layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 8, "matmul_params": 1e6}
    out = generation_bound(shape, batch=4, context=10, weight_bytes=4e6, kv_bytes_per_value=4,
                           gflops=1e6, gbs=1.0, tokens_per_second=50.0)
    assert out["bound_by"] == "memory"
    assert out["fraction_of_bound"] == pytest.approx(50.0 / out["bound_tokens_per_second"],
                                                     rel=1e-2)


@pytest.mark.models
def test_bench_all_toy_sizes():
    # about the smallest sizes each section takes: the shape of the result is checked, not speed
    res = CliRunner().invoke(app, [
        "bench", "all", "--private", "100", "--synthetic", "10", "--clusters", "2",
        "--dim", "4", "--embed-texts", "1", "--embed-rounds", "1", "--prompts", "1",
        "--tokens", "1", "--baseline-batch", "1", "--knn-private", "100",
        "--knn-synthetic", "10", "--gemm-size", "16", "--copy-mb", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert set(out["sections"]) == {"bounds", "voting", "embedding", "generation", "knn"}
    for name, sec in out["sections"].items():
        assert "error" not in sec, (name, sec.get("error"), sec.get("traceback"))
        machine = sec["machine"]
        assert machine["cores"] >= 1 and isinstance(machine["isa"], list)
        assert isinstance(machine["quiet"], bool)
        assert set(machine["load_average_1m"]) == {"start", "end", "max"}
        if name != "bounds":
            assert isinstance(sec["ratio"], float) and sec["goal"]
    assert out["sections"]["voting"]["bound"]["off_bound"] in ("per_point", "representative")
    assert out["sections"]["generation"]["bound"]["bound_tokens_per_second"] > 0
    assert [row["section"] for row in out["summary"]] == ["voting", "embedding", "generation",
                                                          "knn"]
    assert "quiet" in out["machine"]
    text = render(out, "dpsynth bench all")
    assert "### SecPE vote" in text and "### Generation" in text and "| knn |" in text


def test_bench_all_unknown_section():
    res = CliRunner().invoke(app, ["bench", "all", "--only", "nope", "--json"])
    assert res.exit_code != 0


@pytest.mark.parametrize("rate", [1.0, 0.3])
def test_secpe_profile_folded_sums_equal(rate, small_probe):
    res = CliRunner().invoke(app, ["bench", "secpe-profile", "--private", "500", "--synthetic",
                                   "50", "--clusters", "10", "--dim", "8", "--rate", str(rate),
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["folded_bit_identical"] is True
    assert out["machine"]["cores"] >= 1
    for key in ("accumulate_seconds", "accumulate_folded_seconds", "release_seconds",
                "vote_seconds"):
        assert out[key] >= 0


def test_bench_bounds_toy(small_probe):
    res = CliRunner().invoke(app, ["bench", "bounds", "--gemm-size", "16", "--copy-mb", "1",
                                   "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["gemm_gflops"]["torch_float32"] > 0 and out["bandwidth_gbs"]["best"] > 0
    assert out["secpe_1m_x_10k"]["per_point"]["phases"]["nearest"]["bound_by"] == "compute"
    assert "quiet" in out["machine"]
