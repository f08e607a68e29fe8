"""compute.engine: ray (dpsynth.compute): private rows sharded by user on Ray actors, the same
release as one process (docs/methods.md §0).

The fast tests check the shard kernels and the exact sums in this process. The cluster tests
start a real Ray cluster on 127.0.0.1 (a head node and one more node, separate `ray start`
processes, one CPU each), run Aug-PE, WASP and SecPE with the deterministic fakes on both
engines and compare release/ byte for byte, kill a worker mid-vote, resume a crashed driver,
and run DP-SynRAG's per-cluster private prediction on worker actors (same tokens, same
release). Every process the fixture starts is stopped by pid at the end.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.compute import LocalCompute
from dpsynth.config import ConfigError, parse_config
from dpsynth.hooks import RunHooks
from dpsynth.llm import GenerationError
from dpsynth.methods.secpe import kernels as secpe_kernels
from dpsynth.methods.secpe import statistics as secpe_statistics
from dpsynth.voting import knn_vote, topq_vote
from fakes import FakeEmbedder, FakeGenerator
from faults import FAULTS, Arming, stop_at
from shards import InProcessShards, array_shards
from test_release_check import pe_config, private_rows, shared_files, write_csv

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


# -- fast: config, kernels, exact sums -------------------------------------------------------
def test_compute_config_defaults_to_local_and_checks_its_fields():
    cfg = parse_config({})
    assert cfg.compute.engine == "local"
    cfg = parse_config({"compute": {"engine": "ray", "address": "ray://10.0.0.1:10001",
                                    "shards": 4}})
    assert (cfg.compute.engine, cfg.compute.shards) == ("ray", 4)
    for bad in ({"engine": "spark"}, {"shards": 0}, {"shards": 65}, {"address": "cluster"}):
        with pytest.raises(ConfigError, match="compute"):
            parse_config({"compute": bad})


def _toy(n: int, users: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray, Any]:
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((n, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    labels = rng.integers(0, 3, size=n)
    ids = None if users is None else [f"user{i % users}" for i in range(n)]
    return emb, labels, ids


def _shards(emb: np.ndarray, labels: np.ndarray, users: list[str] | None,
            shards: int) -> InProcessShards:
    """The production partition and engine sums over shards built in this process."""
    return InProcessShards(array_shards(emb, labels, users, shards))


@pytest.mark.parametrize("users", [None, 7])
@pytest.mark.parametrize("shards", [2, 5])
def test_sharded_sums_are_bitwise_the_one_process_sums(users, shards):
    emb, labels, ids = _toy(300, users)
    cand, cand_labels, _ = _toy(40, None, seed=1)
    one = LocalCompute(lambda: emb, labels, ids)
    many = _shards(emb, labels, ids, shards)
    for k in (1, 3):
        a, b = one.knn_histogram(cand, cand_labels, k), many.knn_histogram(cand, cand_labels, k)
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, knn_vote(emb, labels, cand, cand_labels, k,
                                               None if ids is None else
                                               np.unique(ids, return_inverse=True)[1]),
                                   rtol=1e-12, atol=1e-12)
    a, b = one.topq_histograms(cand, cand_labels, 4), many.topq_histograms(cand, cand_labels, 4)
    assert a.tobytes() == b.tobytes()
    if users is None:
        assert a.tobytes() == topq_vote(emb, labels, cand, cand_labels, 4).tobytes()
    assert one.label_counts(3).tobytes() == many.label_counts(3).tobytes()
    centres = {y: cand[cand_labels == y][:3] for y in range(3)}
    coins = np.random.default_rng(5).random(len(emb))  # one per record; rate 0.5 for all
    rates = (np.arange(len(emb)), np.full(len(emb), 0.5))
    take = coins < 0.5
    for engine in (one, many):  # SecPE's kernels run through the generic engine
        engine.map(secpe_kernels.keep_rates, "test", rates)
    sa, sb = (secpe_statistics.centre_sums(e, centres, coins, 0.8, len(emb))
              for e in (one, many))
    for y in centres:
        assert sa[y][0].tobytes() == sb[y][0].tobytes() and np.array_equal(sa[y][1], sb[y][1])
        assert sa[y][1].sum() == (take & (labels == y)).sum()


@pytest.mark.parametrize("index", ["ivf", "hnsw"])
def test_approximate_voting_sums_the_same_when_sharded(index):
    """ANN voting (an index trained on the candidates only, rebuilt on every shard) gives the
    one-process histogram bitwise too."""
    emb, labels, _ = _toy(1500, None)
    cand, cand_labels, _ = _toy(2400, None, seed=3)
    labels[:] = 0
    cand_labels[:] = 0  # one label, above the index's exact-search cut-off
    one = LocalCompute(lambda: emb, labels, None).knn_histogram(cand, cand_labels, 2,
                                                                index=index)
    many = _shards(emb, labels, None, 3).knn_histogram(cand, cand_labels, 2, index=index)
    assert one.tobytes() == many.tobytes() and one.sum() > 0


def test_a_user_split_by_rows_is_bounded_once_when_sharded_by_user():
    """User u0 has 6 records; sharded by row they would land on two shards and be bounded
    twice (norm up to 2). Sharded by user hash, the whole user sits on one shard."""
    emb, labels, _ = _toy(12, None)
    labels[:] = 0
    ids = ["u0"] * 6 + [f"v{i}" for i in range(6)]
    cand, cand_labels, _ = _toy(5, None, seed=2)
    cand_labels[:] = 0
    codes = np.unique(ids, return_inverse=True)[1]
    whole = knn_vote(emb, labels, cand, cand_labels, 1, users=codes)
    one = LocalCompute(lambda: emb, labels, ids).knn_histogram(cand, cand_labels, 1)
    sharded = _shards(emb, labels, ids, 2).knn_histogram(cand, cand_labels, 1)
    assert one.tobytes() == sharded.tobytes()
    np.testing.assert_allclose(sharded, whole, rtol=1e-12)
    # the naive row split (records 0-2 and 3-5 of u0 apart) bounds u0 twice: more mass
    naive = sum(knn_vote(emb[part], labels[part], cand, cand_labels, 1,
                         users=np.unique(np.asarray(ids)[part], return_inverse=True)[1])
                for part in (np.arange(0, 3).tolist() + list(range(6, 9)),
                             list(range(3, 6)) + list(range(9, 12))))
    assert naive.sum() > whole.sum() + 0.5
    # and the partition really keeps each user on one shard
    parts = _shards(emb, labels, ids, 2).shards
    assert sum("u0" in set(p.users) for p in parts) == 1


def test_wasp_federated_refuses_the_ray_engine(tmp_path):
    from dpsynth.methods import get_method

    cfg = parse_config(pe_config("wasp", tmp_path / "d.csv", **{
        "wasp.federated.parties": 2, "compute.engine": "ray"}))
    with pytest.raises(ConfigError, match="compute.engine"):
        get_method("wasp").validate(cfg, 40, 2)


# the real local Ray cluster (`ray_cluster`) is a session fixture in conftest.py


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _run(cfg: dict[str, Any], out: Path, gens: list[FakeGenerator] | None = None, *,
         resume: bool = False, hooks: RunHooks | None = None) -> Path:
    from dpsynth.api import run_generation

    gens = gens or [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    config: Any = out if resume else parse_config(cfg)
    return Path(run_generation(config, out, resume=resume, progress=False, generators=gens,
                               embedder=FakeEmbedder(), hooks=hooks))


@contextlib.contextmanager
def driver_never_reads(path: Path) -> Iterator[None]:
    """Inside: this process (the Ray driver) may not load a data file (``data.readers.read_chunks``,
    ``pd.read_csv``) nor open ``path`` (``open``, ``io.open``: pathlib's too); the shard
    actors, other processes, are not affected."""
    import builtins
    import io

    import pandas as pd

    import dpsynth.data.readers as readers

    opened: list[str] = []
    real_open, real_io_open = builtins.open, io.open

    def spy(real: Any) -> Any:
        def wrapped(file: Any, *args: Any, **kwargs: Any) -> Any:
            opened.append(str(file))
            return real(file, *args, **kwargs)
        return wrapped

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver read a data file")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "open", spy(real_open))
        mp.setattr(io, "open", spy(real_io_open))
        mp.setattr(readers, "read_chunks", refuse)
        mp.setattr(pd, "read_csv", refuse)
        yield
    assert opened  # the spy saw the run's own files
    assert not [p for p in opened if Path(p).resolve() == path.resolve()]


def _both(tmp_path: Path, cfg: dict[str, Any], address: str, name: str) -> tuple[Path, Path]:
    """The same config on engine local and engine ray (separate ledgers: one seed each); the
    ray run's driver never reads the private file (the shards do)."""
    local = {**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / f"{name}-l.json")}}
    ray_cfg = {**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / f"{name}-r.json")},
               "compute": {"engine": "ray", "address": address, "shards": 2}}
    local_run = _run(local, tmp_path / f"{name}-local")
    with driver_never_reads(Path(cfg["data"]["path"])):
        ray_run = _run(ray_cfg, tmp_path / f"{name}-ray")
    return local_run, ray_run


# calibration is the slow part: one iteration, and the coarsest accounting grid the config
# allows (0.05: pessimistic at any grid, about 3x faster to calibrate than 1e-2; the default
# grid runs in test_a_resumed_secpe_run_reuses_the_saved_plan and test_secpe_privacy)
SECPE = {"secpe.secrets": [{"kind": "regex", "pattern": r"ACCT-\d{4}"}],
         "secpe.clusters": 4, "secpe.clip": 0.5, "synthesis.iterations": 1,
         "secpe.discretization": 5e-2}


@pytest.mark.parametrize("method,unit", [("aug_pe", "record"), ("aug_pe", "user"),
                                         ("wasp", "record"), ("wasp", "user"),
                                         ("secpe", "record")])
def test_ray_release_is_byte_identical_to_local(ray_cluster, tmp_path, method, unit):
    over: dict[str, Any] = {"privacy.unit": unit, "wasp.top_q": 3, "wasp.demonstrations": 2,
                            "synthesis.k": 2}
    if unit == "user":
        over["data.user"] = "user"
    if method == "secpe":
        over.update(SECPE)
    rows = private_rows(48, users=9 if unit == "user" else 0)
    for i in (2, 9, 16, 30, 41):  # SecPE's secrets (an account number)
        rows[i]["text"] += f" account ACCT-{7100 + i}"
    cfg = pe_config(method, write_csv(tmp_path / "d.csv", rows), **over)
    local, ray_run = _both(tmp_path, cfg, ray_cluster, method)
    a, b = shared_files(local), shared_files(ray_run)
    assert a == b
    stats = (ray_run / "stats.jsonl").read_text()
    assert stats.count("\n") == (1 if method == "secpe" else 2)
    shards = sorted(p.name for p in (ray_run / "private" / "compute").glob("shard-*.npz"))
    assert shards == ["shard-0-of-2.npz", "shard-1-of-2.npz"]
    assert not (ray_run / "private" / "private-embeddings.npy").exists()  # never on the driver
    if method == "secpe":  # each shard kept its rows' Poisson rates; the driver kept none
        rates = sorted(p.name for p in (ray_run / "private" / "compute").glob("secpe-rates-*"))
        assert rates == ["secpe-rates-shard-0-of-2.npz", "secpe-rates-shard-1-of-2.npz"]
        assert not (ray_run / "private" / "secpe-rates.npz").exists()
        assert (local / "private" / "secpe-rates.npz").exists()
    log = (ray_run / "log.txt").read_text()
    assert "compute: ray, 2 shards" in log and "ACCT-" not in log


def test_label_domain_discovery_on_ray_is_the_local_release(ray_cluster, tmp_path):
    """data.label_domain: discover with engine ray: the value counts are summed from the
    shards, the kept domain is applied on the shards, and release/ (with the discovered
    domain in privacy.json) is byte for byte the local run's; the driver never reads the
    file."""
    rows = private_rows(60)
    rows[7]["label"] = "misc"  # a one-record value: below the threshold, dropped
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", rows), **{
        "data.label_domain": "discover", "data.label_domain_sigma": 2.0,
        "synthesis.iterations": 1})
    del cfg["data"]["label_values"]
    local, ray_run = _both(tmp_path, cfg, ray_cluster, "discover")
    assert shared_files(local) == shared_files(ray_run)
    domain = json.loads((ray_run / "release" / "privacy.json").read_text())["label_domain"]
    assert domain["mode"] == "discover" and domain["values"] == {"label": ["billing",
                                                                           "clinical"]}
    markers = sorted((ray_run / "private" / "compute").glob("domain-shard*.json"))
    assert len(markers) == 2  # the kept domain was applied on both shards


def test_a_worker_killed_mid_vote_is_retried_to_the_same_release(ray_cluster, tmp_path):
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(40)))
    local = _run({**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "l.json")}},
                 tmp_path / "local")
    out = tmp_path / "ray"
    compute = out / "private" / "compute"
    ray_cfg = {**cfg, "compute": {"engine": "ray", "address": ray_cluster, "shards": 2}}

    # the kill of shard 1 in the first vote
    done = _run(ray_cfg, out, [Arming("fake-g0", compute, "fault-knn_partial-shard1")],
                hooks=FAULTS)
    assert (compute / "armed").exists() and not (compute / "fault-knn_partial-shard1").exists()
    assert shared_files(local) == shared_files(done)


def test_a_shard_that_stops_answering_fails_the_run_and_resume_finishes_it(ray_cluster,
                                                                          tmp_path):
    """compute.timeout_s: a shard that hangs mid-vote fails the run with a ComputeError that
    names the setting (not a wait without end), its actors are killed (the resumed run gets
    the cluster's CPUs back), and --resume finishes with the noise already drawn and the
    release of an uninterrupted run."""
    from dpsynth.errors import ComputeError

    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(40)))
    local = _run({**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "l.json")}},
                 tmp_path / "local")
    out = tmp_path / "ray"
    compute = out / "private" / "compute"
    ray_cfg = {**cfg, "compute": {"engine": "ray", "address": ray_cluster, "shards": 2,
                                  "timeout_s": 8}}

    with pytest.raises(ComputeError, match="compute.timeout_s") as failed:  # shard 1 hangs
        _run(ray_cfg, out, [Arming("fake-g0", compute, "hang-knn_partial-shard1")],
             hooks=FAULTS)
    assert "knn_partial" in str(failed.value) and "--resume" in str(failed.value)
    assert not (compute / "hang-knn_partial-shard1").exists()  # the shard did hang
    assert json.loads((out / "run.json").read_text())["status"] == "failed"
    before = (out / "private" / "releases" / "releases.jsonl").read_text()
    done = _run(ray_cfg, out, resume=True)
    assert (done / "private" / "releases" / "releases.jsonl").read_text().startswith(before)
    a, b = shared_files(local), shared_files(done)
    a.pop("release/summary.json")  # attempts and LLM-call counts differ, by design
    b.pop("release/summary.json")
    assert a == b
    assert json.loads((done / "run.json").read_text())["status"] == "finished"


def test_a_crashed_ray_driver_resumes_to_the_same_release(ray_cluster, tmp_path):
    cfg = pe_config("wasp", write_csv(tmp_path / "d.csv", private_rows(40)),
                    **{"wasp.top_q": 3, "wasp.demonstrations": 2})
    whole = _run({**cfg, "privacy": {**cfg["privacy"], "ledger": str(tmp_path / "l.json")}},
                 tmp_path / "whole")
    ray_cfg = {**cfg, "compute": {"engine": "ray", "address": ray_cluster, "shards": 2}}
    out = tmp_path / "crash"
    with pytest.raises(GenerationError):
        _run(ray_cfg, out, [FakeGenerator("fake-g0", raise_after=4)])
    before = (out / "private" / "releases" / "releases.jsonl").read_text()
    assert before.count("\n") >= 2  # label counts and a vote were released before the crash
    shard_files = sorted((out / "private" / "compute").glob("shard-*.npz"))
    stamps = [p.stat().st_mtime_ns for p in shard_files]
    done = _run(ray_cfg, out, resume=True)
    assert [p.stat().st_mtime_ns for p in shard_files] == stamps  # not embedded again
    after = (done / "private" / "releases" / "releases.jsonl").read_text()
    assert after.startswith(before)  # replayed, not redrawn
    a, b = shared_files(whole), shared_files(done)
    a.pop("release/summary.json")  # attempts and LLM-call counts differ, by design
    b.pop("release/summary.json")
    assert a == b
    assert json.loads((done / "run.json").read_text())["status"] == "finished"


@pytest.mark.parametrize("public_support", [False, True])
def test_private_prediction_of_clusters_on_ray_gives_the_sequential_tokens(ray_cluster,
                                                                           tmp_path,
                                                                           public_support):
    """DP-SynRAG (docs/methods.md §4): logit sums on two LogitWorker actors, every token
    released by the driver's session in cluster order; the same tokens as private_predict run
    cluster after cluster (each release key has its own noise stream), over the whole
    vocabulary or over the public candidate set the driver computes and sends."""
    import ray

    from dpsynth.methods.synrag.private_prediction import Rephrase, private_predict
    from dpsynth.methods.synrag.ray_prediction import (
        GivenGenerator,
        logit_workers,
        private_predict_clusters,
    )
    from dpsynth.methods.synrag.support import make_support, term_token_ids
    from dpsynth.privacy import Accountant, PrivacySession, make_noise_source

    gen = FakeGenerator("fake-g0")
    rows = private_rows(12)
    support = (make_support(gen, term_token_ids(gen, ["fever", "cough"]), "rash", 6)
               if public_support else None)
    prompt = Rephrase("Rephrase the document on {keyword}.", "About {keyword}:")
    clusters = [("cluster/0000", [r["text"] for r in rows[:5]], support,
                 prompt.for_keyword("fever")),
                # an empty cluster: noise tokens, still released
                ("cluster/0001", [], support, prompt.for_keyword("cough")),
                ("cluster/0002", [r["text"] for r in rows[5:]], support,
                 prompt.for_keyword("rash"))]
    opts = {"tokens": 8, "clip": 1.0, "temperature": 1.0, "max_doc_tokens": 64}

    def session(name: str) -> PrivacySession:
        return PrivacySession(tmp_path / name, Accountant("zcdp"),
                              make_noise_source("seeded", 7))

    with session("seq") as s:
        sequential = [private_predict(s, key, gen, docs, support=sup, instruction=pr, **opts)
                      for key, docs, sup, pr in clusters]
    assert ray.is_initialized()  # the ray_cluster fixture connected this process
    workers = logit_workers(GivenGenerator(FakeGenerator("fake-g0")), 2)
    try:
        with session("ray") as s:
            parallel = private_predict_clusters(s, gen, clusters, workers, **opts)
            spent = s.epsilon(1e-6)
    finally:
        for w in workers:
            ray.kill(w)
    assert parallel == sequential
    assert any(p.token_ids for p in parallel)
    assert [p.text.split(":")[0] for p in parallel] == ["About fever", "About cough",
                                                         "About rash"]
    with session("seq") as s:
        assert s.epsilon(1e-6) == pytest.approx(spent)  # the same releases, charged the same


# "user" also takes the public-token shortcut: one build pair pays for both (the user-level
# documents are joined on the shards before any prediction; the shortcut runs on the workers)
@pytest.mark.parametrize("case", ["record", "user"])
def test_dp_synrag_build_on_ray_writes_the_local_release(ray_cluster, tmp_path, case):
    """rag build with compute.engine ray: the documents stay on the shard actors (keywords,
    clusters, embeddings and S_r there; the driver never opens the private file), the
    clusters' private predictions run on LogitWorker actors that fetch S_r from the shards
    (with the public-token shortcut too), and release/ is byte for byte the one-process
    build's."""
    from dpsynth.api import build_kb
    from dpsynth.demo_corpus import write_demo_corpus

    example = TESTS.parent / "examples" / "tiny-synrag.yaml"
    data = write_demo_corpus(tmp_path / "data", n=40, seed=0)["private"]
    over: dict[str, Any] = {
        "data.path": str(data), "privacy.epsilon": 10.0, "privacy.delta": 1e-3,
        "privacy.noise": "seeded", "privacy.seed": 11,
        "synrag": {"vocabulary": "demo", "keyword_extractor": "llm",
                   "keywords_per_doc": 4, "clusters": 3, "overlap": 2, "target_size": 6,
                   "tokens": 8, "max_doc_tokens": 12, "rho_hist": 0.5,
                   "min_noisy_count": 2.0, "self_filter": False, "eps_theta": 2.0}}
    if case == "user":
        over.update({"privacy.unit": "user", "data.user": "patient_id"})
        over["privacy.epsilon"] = 20.0  # past the default cap (10): said, as an operator would
        over["privacy.no_cap"] = True
        over["synrag"].update(public_shortcut=True, svt_epsilon=0.5, eps_theta=1.0)
    compute = tmp_path / "ray" / "private" / "compute"

    interrupt = case == "record"  # also: a shard killed mid-retrieval, a killed build resumed
    runs = []
    for name, extra in (("local", {}), ("ray", {"compute.engine": "ray",
                                                "compute.address": ray_cluster,
                                                "compute.shards": 2})):
        gen = (Arming("fake-g0", compute, "fault-synrag_select-shard1") if extra and interrupt
               else FakeGenerator("fake-g0"))
        with driver_never_reads(data) if extra else contextlib.nullcontext():
            with pytest.raises(KeyboardInterrupt) if extra and interrupt else \
                    contextlib.nullcontext():
                hooks = (stop_at(1, "cluster-", faults=True) if extra and interrupt
                         else FAULTS if extra else None)  # killed after its first cluster
                runs.append(Path(build_kb(
                    example, tmp_path / name, generator=gen, embedder=FakeEmbedder(),
                    hooks=hooks, overrides={
                        **over, **extra,
                        "privacy.ledger": str(tmp_path / f"{name}-ledger.json")})))
            if extra and interrupt:
                assert (compute / "armed").exists()
                assert not (compute / "fault-synrag_select-shard1").exists()  # it died once
                kw = sorted(compute.glob("*-keywords.json"))
                stamps = [p.stat().st_mtime_ns for p in kw]
                runs.append(Path(build_kb(None, tmp_path / name, resume=True,
                                          generator=FakeGenerator("fake-g0"),
                                          embedder=FakeEmbedder())))
                assert [p.stat().st_mtime_ns for p in kw] == stamps  # not extracted again
    local, ray_run = runs
    assert shared_files(local) == shared_files(ray_run)
    assert (ray_run / "release" / "kb.jsonl").read_text().strip()  # clusters were formed
    assert "clusters on Ray (2 workers)" in (ray_run / "log.txt").read_text()
    assert "on Ray" not in (local / "log.txt").read_text()
    # the documents' state lives on the shards, not in the driver's private area
    kept = sorted(p.name for p in (ray_run / "private" / "compute").glob("synrag-shard-*"))
    assert kept == [f"synrag-shard-{s}-of-2-{f}" for s in (0, 1)
                    for f in ("embeddings.npy", "keywords.json", "state.json")]
    for name in ("keywords.json", "private-embeddings.npy"):
        assert (local / "private" / name).is_file() and not (ray_run / "private" / name).exists()
    # the exact per-cluster facts (sizes, truncations) are diagnostics of both, and the same
    def facts(run: Path) -> dict[int, dict[str, Any]]:
        rows = [json.loads(x) for x in (run / "private" / "diagnostics.jsonl").read_text()
                .splitlines()]
        return {r["cluster"]: {k: v for k, v in r.items() if k != "time"} for r in rows
                if "members" in r}
    assert facts(local) == facts(ray_run) and len(facts(local)) == 3
    assert any(r["truncated"] for r in facts(ray_run).values())  # truncated on the workers
