"""SecPE on sharded data (docs/methods.md §3, docs/architecture.md): each shard keeps its own
records' secret membership, the SecretNoise LP runs where that membership is (a Ray task with
engine ray), the shards keep their rows' Poisson rates and sample with the session's coins,
and the plan is saved in the run's private area so a resumed run does not solve the LP again.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import test_compute_ray
from dpsynth.compute import Shard
from dpsynth.data import Dataset
from dpsynth.llm import GenerationError
from dpsynth.methods.secpe import kernels, statistics
from dpsynth.methods.secpe import theory as secpe_theory
from dpsynth.secrets import SecretSpec, find_secrets
from fakes import FakeGenerator
from faults import stop_at
from shards import InProcessShards, dataset_shards
from test_release_check import pe_config, private_rows, shared_files, write_csv

SPECS = [SecretSpec(kind="regex", pattern=r"ACCT-\d{4}"),
         SecretSpec(kind="strings", values=["Dr Brown"])]
SECPE = test_compute_ray.SECPE


def _dataset(n: int = 80) -> Dataset:
    texts = []
    for i in range(n):
        text = f"note {i} about the weather"
        if i % 9 == 0:
            text += f" account ACCT-{7000 + i % 4}"  # a secret shared by several records
        if i % 13 == 0:
            text += " saw Dr Brown"
        texts.append(text)
    return Dataset(texts, {"label": ["x"] * n}, None, "mem", "text", ["label"], None)


@pytest.mark.parametrize("shards", [1, 3])
def test_the_split_and_plan_without_the_membership_equal_the_gathered_ones(shards,
                                                                          monkeypatch):
    """secret_split + plan_secret_rates (membership kept per shard, merged only by the plan)
    give the counts and public rows of the one-process SecretIndex, hand SecretNoise the same
    private membership, and put its rates on the right rows (the calibration itself is
    tests/test_secpe_privacy.py's: a cheap stand-in here)."""
    seen: list[Any] = []

    def lp_only(membership: Any, p: float, r: float, T: int, **_: Any) -> Any:
        seen.append(membership)
        eta = np.full(membership.shape[1], secpe_theory.r_to_mu(p, r))
        rates = secpe_theory.sampling_rates(secpe_theory.secret_weights_lp(membership, eta))
        return SimpleNamespace(rates=rates, sigma=0.25 * T)

    monkeypatch.setattr(secpe_theory, "plan_secret_noise", lp_only)
    data = _dataset()
    ref = find_secrets(list(data.texts), SPECS)
    engine = InProcessShards(dataset_shards(data, False, shards))
    split = statistics.secret_split(engine, SPECS)
    assert not hasattr(split, "membership")
    summary = statistics.plan_secret_rates(engine, split, 1e-3, 1e-2, 2, "d")
    priv, pub = ref.split()
    assert split.public_idx.tolist() == pub.tolist()
    assert split.report(summary["secrets_per_type"]) == ref.split_report()
    (got,) = seen

    def columns(m: Any) -> list[tuple[int, ...]]:  # secret columns (ids vs values: any order)
        csc = m.tocsc()
        return sorted(tuple(csc[:, j].indices.tolist()) for j in range(csc.shape[1]))

    assert got.shape == (len(priv), 5) and columns(got) == columns(ref.private_membership())
    expected = lp_only(got, 1e-3, 1e-2, 2)
    assert summary["sigma_star"] == 0.5 and summary["max_rate"] == expected.rates.max()
    rates = np.zeros(len(data))
    for shard in engine.shards:  # each shard keeps its own rows' rates
        digest, mine = shard.state[kernels.RATES]
        assert digest == "d"
        rates[shard.rows] = mine
    assert rates[priv].tobytes() == expected.rates.tobytes() and not rates[pub].any()


def test_a_resumed_secpe_run_reuses_the_saved_plan(tmp_path, monkeypatch):
    """Stopped after its first checkpoint and resumed: the plan (public rows, sigma, rates) is
    read back from private/ (0600), the LP is not solved again, and the release is the
    uninterrupted run's."""
    calls: list[float] = []  # the accounting grid of each SecretNoise solve
    real = secpe_theory.plan_secret_noise

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["discretization"])
        return real(*args, **kwargs)

    monkeypatch.setattr(secpe_theory, "plan_secret_noise", counted)
    rows = private_rows(40)
    for i in (2, 9, 16, 30):
        rows[i]["text"] += f" account ACCT-{7100 + i}"
    default_grid = {**SECPE, "secpe.discretization": 3e-3}  # a whole run at the default
    cfg = pe_config("secpe", write_csv(tmp_path / "d.csv", rows), **default_grid)
    whole = test_compute_ray._run(
        {**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "w.json")}},
        tmp_path / "whole")
    assert calls == [3e-3]  # secpe.discretization reaches the calibration
    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):  # after the first checkpoint
        test_compute_ray._run(cfg, out, hooks=stop_at(1))
    assert len(calls) == 2
    for name in ("secpe-plan.npz", "secpe-rates.npz"):
        assert (out / "private" / name).stat().st_mode & 0o777 == 0o600
    done = test_compute_ray._run(cfg, out, resume=True)
    assert len(calls) == 2  # not solved again
    a, b = shared_files(whole), shared_files(done)
    a.pop("release/summary.json")  # attempts and call counts differ by design
    b.pop("release/summary.json")
    assert a == b


def test_on_ray_the_membership_and_the_lp_stay_off_the_driver(ray_cluster, tmp_path,
                                                               monkeypatch):
    """engine ray: the driver never merges the membership nor solves the LP (both raise here;
    the plan ran in a Ray worker's process), its plan holds object refs only, each shard
    saved its rates slice in its private folder; a crashed driver resumes with the saved plan
    (no second plan task, rates not rewritten) to the release of a local run."""
    import ray

    import dpsynth.secrets as secrets_module
    from dpsynth.compute.ray_engine import RayCompute
    from dpsynth.methods.secpe import SecretPlan

    rows = private_rows(40)
    for i in (2, 9, 16, 30):
        rows[i]["text"] += f" account ACCT-{7100 + i}"
    cfg = pe_config("secpe", write_csv(tmp_path / "d.csv", rows), **SECPE)
    local = test_compute_ray._run(
        {**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "l.json")}},
        tmp_path / "local")

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver touched the secret membership")

    for module, name in ((secrets_module, "secret_index_from_hits"),
                         (secrets_module, "merge_secret_hits"),
                         (secpe_theory, "plan_from_hits"),
                         (secpe_theory, "plan_secret_noise")):
        monkeypatch.setattr(module, name, refuse)
    parts: list[Any] = []
    plans: list[SecretPlan] = []
    real_off, real_build = RayCompute.off_driver, SecretPlan.build.__func__

    def spy_off(self: RayCompute, fn: Any, *args: Any, returns: int = 1) -> Any:
        assert fn is kernels.secret_plan_task
        parts.extend(args[6:])  # the shards' membership, as object refs
        return real_off(self, fn, *args, returns=returns)

    def spy_build(cls: Any, *args: Any, **kwargs: Any) -> Any:
        plans.append(real_build(cls, *args, **kwargs))
        return plans[-1]

    monkeypatch.setattr(RayCompute, "off_driver", spy_off)
    monkeypatch.setattr(SecretPlan, "build", classmethod(spy_build))
    ray_cfg = {**cfg, "compute": {"engine": "ray", "address": ray_cluster, "shards": 2}}
    out = tmp_path / "ray"
    with pytest.raises(GenerationError):
        test_compute_ray._run(ray_cfg, out, [FakeGenerator("fake-g0", raise_after=4)])
    split = plans[0].split
    assert len(parts) == 2 and split.planned_in not in (None, os.getpid())
    assert not hasattr(split, "membership") and not hasattr(plans[0], "index")
    assert all(isinstance(p, ray.ObjectRef) for p in parts)
    assert split.parts == []  # let go once planned
    compute = out / "private" / "compute"
    slices = sorted(compute.glob("secpe-rates-shard-*.npz"))
    assert [p.name for p in slices] == ["secpe-rates-shard-0-of-2.npz",
                                        "secpe-rates-shard-1-of-2.npz"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in slices)
    assert not (out / "private" / "secpe-rates.npz").exists()  # the driver saved no rates
    stamps = [p.stat().st_mtime_ns for p in slices]
    done = test_compute_ray._run(ray_cfg, out, resume=True)
    assert len(parts) == 2 and len(plans) == 2  # the saved plan, no second plan task
    assert [p.stat().st_mtime_ns for p in slices] == stamps
    a, b = shared_files(local), shared_files(done)
    a.pop("release/summary.json")
    b.pop("release/summary.json")
    assert a == b
    assert json.loads((done / "run.json").read_text())["status"] == "finished"
    assert "ACCT-" not in (done / "log.txt").read_text()


def test_no_rates_no_sample(tmp_path):
    """A shard without SecPE's rates refuses to sample (never a silent all-public vote)."""
    shard = Shard.of_arrays(np.zeros((2, 3), np.float32), np.zeros(2, np.int64),
                            np.arange(2), np.zeros(2, np.int64), index=0, shards=2)
    with pytest.raises(RuntimeError, match="rates"):
        kernels.centre_partial(shard, np.zeros(2), {0: np.zeros((1, 3))}, 1.0)
    shard.folder = tmp_path
    path = kernels.rates_file(shard)
    assert path == tmp_path / "secpe-rates-shard-0-of-2.npz"
    kernels.save_rates(path, "d1", np.arange(2), np.array([0.5, 0.0]))
    assert kernels.load_rates(path, "d2") is None
    rows, rates = kernels.load_rates(path, "d1")
    assert rows.tolist() == [0, 1] and rates.tolist() == [0.5, 0.0]


def test_the_saved_plan_is_keyed_by_the_accounting_grid(tmp_path):
    """A resume with another ``secpe.discretization`` calibrates again: the grid is part of
    the saved plan's digest (as p, r, T and the data are)."""
    from dpsynth.config import parse_config
    from dpsynth.methods.secpe import plan_digest

    cfg = pe_config("secpe", write_csv(tmp_path / "d.csv", private_rows(4)), **SECPE)
    coarse = parse_config(cfg)
    default = parse_config({**cfg, "secpe": {**cfg.get("secpe", {}), "discretization": 3e-3}})
    assert coarse.secpe.discretization == 5e-2 and default.secpe.discretization == 3e-3
    assert plan_digest(coarse, "same-data") != plan_digest(default, "same-data")
