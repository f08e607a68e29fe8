"""Whole federated WASP runs (fake models) whose votes are summed by a real Flower SecAgg+
simulation on the session's real two-node Ray cluster (``wasp.federated.ray_address``); the
release checker's many-run tests sum each round in this process (:func:`in_process_round`)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpsynth.api import run_generation
from test_methods import _config, _fakes, _jsonl
from test_release_check import (
    LABELS,
    PE_PUBLIC,
    _resume_pe,
    check_neighbours,
    file_differences,
    pe_config,
    private_rows,
    run_pe,
    shared_files,
    write_csv,
)
from test_release_check import spy as spy  # noqa: F401 (the fixture)

pytest.importorskip("flwr")


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def test_wasp_federated_three_parties_through_secagg(tmp_path, ray_cluster):
    """The WASP loop (fake models) with its votes summed by a real Flower SecAgg+ simulation
    across 3 parties, min_parties 2: each round is charged, before it runs, at the worst-case
    noise of 2 of 3 noise shares, and the run still meets its epsilon."""
    cfg = _config(tmp_path, "tiny-wasp.yaml", generators=[{"model": "smollm2",
                                                           "max_new_tokens": 32}],
                  **{"synthesis.samples": 12, "synthesis.iterations": 1,
                     "wasp.federated": {"parties": 3, "dirichlet_alpha": 1.0,
                                        "min_parties": 2, "ray_address": ray_cluster}})
    run = run_generation(cfg, tmp_path / "fed", progress=False, **_fakes())
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["federated_parties"] == 3
    assert 0 < privacy["epsilon"] <= 4.0 + 1e-6
    votes = [m for m in privacy["mechanisms"] if m.get("name") == "topq_votes"]
    assert len(votes) == 1 and votes[0]["count"] == 1 and votes[0]["parties"] == 2
    # each of 3 parties adds a discrete Gaussian share of std sigma / sqrt(3); the round is
    # charged at 2 shares: sqrt(2 / 3) sigma in all
    assert votes[0]["sigma"] * np.sqrt(2) == pytest.approx(
        privacy["noise_multiplier"] * privacy["topq_sensitivity"] * np.sqrt(2 / 3), rel=1e-9)
    assert "iter0/topq/started/1" in (run / "private" / "releases" / "releases.jsonl").read_text()
    stats = _jsonl(run / "stats.jsonl")
    assert len(stats) == 1 and stats[0]["vote_mass"] != 0
    assert len(_jsonl(run / "release" / "synthetic.jsonl")) == 12


def in_process_round(parties, candidate_embeddings, candidate_labels, vote_fn, sigma, *,
                     vote_bound, seed, noise_mode="seeded", min_parties=None,
                     **plan_args: Any):  # type: ignore[no-untyped-def]
    """A federated round with the secure sum done in this process instead of by Flower: the
    production round's checks, plan (``simulation.plan_quantisation``, as the release
    checker's PlanSpy sees it), each party's production submission (``core.party_submission``)
    and result (``simulation._result``). Real SecAgg+ gives this sum
    (tests/test_federated_secagg.py::
    test_secure_sum_is_the_noisy_sum_and_server_sees_only_the_aggregate), and whole WASP runs
    through real Flower on the cluster are the other tests of this module."""
    import dpsynth.federated.simulation as sim
    from dpsynth.federated.core import party_submission

    plan_args.pop("ray_address", None)  # the cluster a real round would run on
    sim._check_round(parties, noise_mode, min_parties)
    cand, labels = sim._candidates(candidate_embeddings, candidate_labels)
    n = len(parties)
    plan = sim.plan_quantisation(vote_bound=vote_bound, sigma=sigma, num_parties=n,
                                 **plan_args)
    hist = sum(party_submission(p, cand, labels, vote_fn, sigma=sigma, num_parties=n,
                                vote_bound=vote_bound, clipping_range=plan.clipping_range,
                                quantization_range=plan.quantization_range,
                                noise_mode=noise_mode, seed=seed, party_index=i)
               for i, p in enumerate(parties))
    sink = SimpleNamespace(released=hist, parties_present=n)
    return sim._result(sink, plan, sigma, n)


def test_wasp_federated_record_neighbours(tmp_path, spy, monkeypatch):  # noqa: F811
    """Adding one record changes no exact count in what a federated run releases. The
    release check's runs (D, D', three fresh plans) sum each round in this process
    (:func:`in_process_round`: the same parties, plan and noise shares, without Flower's
    transport, five Flower rounds less);
    test_wasp_federated_largest_party_neighbours_release_the_same_bytes runs neighbouring
    data sets through real Flower SecAgg+ on the cluster."""
    import dpsynth.federated as federated

    monkeypatch.setattr(federated, "federated_noisy_histogram", in_process_round)
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash since last week",
             "label": "clinical", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2,
                            "wasp.federated.parties": 3, "synthesis.iterations": 1})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)


def _largest_party_neighbours(cfg: dict[str, Any]) -> tuple[list[dict[str, str]], dict[str, str],
                                                             int]:
    """D and one extra record for it such that the extra record joins D's largest party (the
    run's own split, methods.wasp.party_split) and takes it across a power of two of the old,
    count-derived clipping range C = next_pow2(largest + 10 sigma / sqrt(P)): D's largest party
    holds L = floor(2^k - margin) records. The extra record's label ('scheduling') has no
    record in D; it returns (D, extra, L)."""
    from dpsynth.config import parse_config
    from dpsynth.context import Rngs
    from dpsynth.methods.pe import calibrate_sigma
    from dpsynth.methods.wasp import Wasp, party_split
    from dpsynth.voting import topq_sensitivity

    config = parse_config(cfg)
    fed = config.wasp.federated
    sigma = calibrate_sigma(config, Wasp().release_plan(config, len(LABELS))) * topq_sensitivity(
        config.wasp.top_q)
    margin = 10 * sigma / np.sqrt(fed.parties)
    k = int(np.ceil(np.log2(margin + 16)))
    largest = int(np.floor(2**k - margin))
    assert largest + margin <= 2**k < largest + 1 + margin

    rngs = Rngs(int(config.privacy.seed))
    pool = private_rows(40 * largest)

    def owners(rows: list[dict[str, str]]) -> np.ndarray:
        codes = np.array([LABELS.index(r["label"]) for r in rows])
        split = party_split([r["text"] for r in rows], codes, fed, rngs)
        out = np.empty(len(rows), dtype=np.int64)
        for p, idx in enumerate(split):
            out[idx] = p
        return out

    pool_owner = owners(pool)
    top = int(np.bincount(pool_owner, minlength=fed.parties).argmax())
    caps = {p: (largest if p == top else min(10, largest - 1)) for p in range(fed.parties)}
    rows: list[dict[str, str]] = []
    for row, p in zip(pool, pool_owner, strict=True):
        if caps[int(p)] > 0:
            rows.append(row)
            caps[int(p)] -= 1
    assert caps[top] == 0, "the pool is too small for the largest party"
    for j in range(1000):
        extra = {"text": f"patient Wexhollow{j} asks to schedule a new visit tomorrow",
                 "label": "scheduling", "user": "u-new"}
        if owners(rows + [extra])[-1] == top:
            sizes = np.bincount(owners(rows + [extra]), minlength=fed.parties)
            assert sizes[top] == largest + 1 and sizes.max() == sizes[top]
            return rows, extra, largest
    raise AssertionError("no extra record joins the largest party")


def test_wasp_federated_largest_party_neighbours_release_the_same_bytes(tmp_path,
                                                                        ray_cluster):
    """Issue 23, finding 6: the SecAgg+ clipping range and grid come from the config
    (wasp.federated.max_records_per_party), not from the largest party's size. D' adds one
    record to D's largest party, taking it across a power of two of the old count-derived C;
    the record's label has no candidate, so it casts no vote. Both runs are run afresh (no
    replay of D's round) with the same seeded noise: stats.jsonl (vote_mass, weights) and
    release/ must be byte-identical, and so must the unmasked sums of the rounds."""
    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2,
                            "wasp.federated.parties": 3, "synthesis.iterations": 1,
                            "wasp.federated.ray_address": ray_cluster})

    rows, extra, largest = _largest_party_neighbours(cfg(tmp_path / "unused.csv"))
    runs = {}
    for tag, data in (("d", rows), ("dp", rows + [extra])):
        runs[tag] = run_pe(cfg(write_csv(tmp_path / f"{tag}.csv", data)), tmp_path / f"run-{tag}")
    # the premise: D' really grew the largest party, and its record cast no vote
    from dpsynth.diagnostics import read_diagnostics

    sizes = {tag: [d for d in read_diagnostics(run) if "party_sizes" in d][0]["party_sizes"]
             for tag, run in runs.items()}
    assert max(sizes["d"]) == largest and max(sizes["dp"]) == largest + 1
    for tag, run in runs.items():
        pool = _jsonl_rows(run / "release" / "iterations" / "iter1.jsonl")
        assert all(r["labels"]["label"] != "scheduling" for r in pool), tag  # no candidate
    assert file_differences(shared_files(runs["d"]), shared_files(runs["dp"])) == []
    sums = {tag: sorted((run / "private" / "federated").glob("round-*.npy"))
            for tag, run in runs.items()}
    assert len(sums["d"]) == len(sums["dp"]) == 1
    assert sums["d"][0].read_bytes() == sums["dp"][0].read_bytes()


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_fresh_plan_check_catches_a_modulus_from_party_sizes(tmp_path, monkeypatch):
    """Finding 6 restored (the SecAgg+ bound from the largest party's record count): the
    release checker's fresh-plan runs see D and D' plan other grids and moduli (the plan is
    made before any party is contacted: the rounds are summed in this process,
    :func:`in_process_round`)."""
    import dpsynth.federated as federated
    from test_release_check import fresh_plan_problems

    real = in_process_round

    def from_sizes(parties, *args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["vote_bound"] = float(max(p.size for p in parties))
        return real(parties, *args, **kwargs)

    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash since last week",
             "label": "clinical", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2,
                            "wasp.federated.parties": 3, "synthesis.iterations": 1})

    monkeypatch.setattr(federated, "federated_noisy_histogram", from_sizes)
    problems = fresh_plan_problems(tmp_path, cfg, rows, rows + [extra], run_pe)
    assert any("public plans (grid, modulus) differ" in p for p in problems), problems
