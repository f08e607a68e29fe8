"""Text and label statistics through PrivateCompute's map of shard kernels (label-domain
discovery's value counts, SecPE's secret scan, DP-SynRAG's keyword counts): per-shard partials
sum to exactly the one-shard values; on a real local Ray cluster the driver never opens the
private file and gets the local engine's values exactly (docs/methods.md §0)."""

from __future__ import annotations

import builtins
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dpsynth.compute import LocalCompute
from dpsynth.compute.shard import text_shard
from dpsynth.compute.sharded import ShardedDataError
from dpsynth.config import parse_config
from dpsynth.data import DataError, load_dataset
from dpsynth.label_domain import value_counts
from dpsynth.methods.secpe import statistics as secpe_statistics
from dpsynth.methods.synrag.keywords import Vocabulary, extract_keywords
from dpsynth.methods.synrag.shard import on_documents
from dpsynth.run_folder import RunDir
from dpsynth.secrets import SecretSpec, find_secrets
from shards import InProcessShards, dataset_shards

SPECS = [SecretSpec(kind="regex", pattern=r"ACCT-\d{4}"),
         SecretSpec(kind="strings", values=["Dr Brown", "tacos"]),
         SecretSpec(kind="random_words", count=3, percentile=30, min_df=2, seed=4)]
VOCAB = Vocabulary(["tacos", "salsa", "service", "staff", "noodles", "cold", "account"],
                   "test")
WORDS = ["tacos", "salsa", "service", "staff", "noodles", "cold", "rain", "coffee", "bread"]


def _rows(n: int = 90, seed: int = 0) -> list[dict[str, str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 9))))
        if i % 11 == 0:
            text += f" account ACCT-{7000 + i}"
        if i % 17 == 0:
            text += " saw Dr Brown"
        rows.append({"text": f"{i}: {text}", "cat": ["food", "drink", "rare"][min(i % 7, 2)
                                                                            if i != 5 else 2],
                     "user": f"u{int(rng.integers(0, 12))}"})
    return rows


def _in_process(dataset: Any, user_level: bool, shards: int) -> InProcessShards:
    """The kernels over ``shards`` shards built in this process (the production partition),
    summed by the production code."""
    return InProcessShards(dataset_shards(dataset, user_level, shards))


def engine_keyword_counts(engine: Any, vocab: Any, k: int, fill: str) -> np.ndarray:
    """DP-SynRAG's keyword counts summed over the engine's document shards (the build's
    ``Corpus.keyword_histogram``, with the vocabulary extractor)."""
    parts = engine.map(on_documents, "keyword_counts", vocab, k, fill, "tag")
    return np.sum(parts, axis=0, dtype=np.int64).astype(np.float64)


@pytest.fixture
def dataset(tmp_path: Path) -> Any:
    path = tmp_path / "d.csv"
    pd.DataFrame(_rows()).to_csv(path, index=False)
    return load_dataset(path, "text", ["cat"], "user")


def gathered_secret_index(compute: Any, specs: Any, *, strict: bool = False) -> Any:
    """The engine's secret scan gathered into one SecretIndex in this process (what SecPE
    never does: it keeps the membership with the engine), to compare with find_secrets."""
    from dpsynth.secrets import merge_secret_hits, secret_index_from_hits

    parsed, parts = secpe_statistics.secret_hits(compute, specs)
    return secret_index_from_hits(merge_secret_hits(parts, len(parsed)), parsed,
                                  compute.n_records(), strict=strict)


@pytest.mark.parametrize("user_level", [False, True])
@pytest.mark.parametrize("shards", [2, 5])
def test_sharded_text_statistics_equal_the_one_shard_values(dataset, user_level, shards):
    one = LocalCompute.for_dataset(dataset, user_level)
    many = _in_process(dataset, user_level, shards)
    for k in (1, 2, 3):  # at user level each user counts towards at most k values
        a, b = one.label_value_counts(["cat"], k), many.label_value_counts(["cat"], k)
        assert a["cat"][0] == b["cat"][0]
        assert a["cat"][1].tobytes() == b["cat"][1].tobytes()
        # the same counts as label_domain.value_counts (users: up to float summation order)
        names, counts = value_counts(list(dataset.labels["cat"]),
                                     list(dataset.users) if user_level else None, k)
        assert names == a["cat"][0] and np.allclose(counts, a["cat"][1], rtol=0, atol=1e-12)
    assert a["cat"][0] == ["drink", "food", "rare"]  # k = 3: every value present
    if user_level:  # the users here hold 2-3 values each: k changes the counts
        assert one.label_value_counts(["cat"], 1)["cat"][1].sum() == pytest.approx(12.0)
        assert not np.allclose(one.label_value_counts(["cat"], 2)["cat"][1],
                               one.label_value_counts(["cat"], 3)["cat"][1])
    h1 = engine_keyword_counts(one, VOCAB, 2, "appearance")
    assert h1.tobytes() == engine_keyword_counts(many, VOCAB, 2, "appearance").tobytes()
    if not user_level:
        kw = extract_keywords(list(dataset.texts), VOCAB, 2)
        assert h1.tolist() == np.bincount([j for ids in kw for j in ids],
                                          minlength=len(VOCAB)).tolist()
    s1, s2 = gathered_secret_index(one, SPECS), gathered_secret_index(many, SPECS)
    assert (s1.membership != s2.membership).nnz == 0
    assert (s1.values, s1.types, s1.messages) == (s2.values, s2.types, s2.messages)


def test_the_secret_scan_finds_what_find_secrets_finds_without_values(dataset):
    specs = SPECS[:2]
    got = gathered_secret_index(LocalCompute.for_dataset(dataset, False), specs)
    ref = find_secrets(list(dataset.texts), specs)

    def columns(index: Any) -> set[tuple[str, tuple[int, ...]]]:
        csc = index.membership.tocsc()
        return {(t, tuple(csc[:, j].indices.tolist())) for j, t in enumerate(index.types)}

    assert columns(got) == columns(ref)
    assert not set(got.values) & set(ref.values)  # ids, never the secret values
    assert got.split_report() == ref.split_report()


# -- a real local Ray cluster ---------------------------------------------------------------
def _config(tmp_path: Path, address: str, rows: list[dict[str, str]], **data: Any) -> Any:
    path = tmp_path / "private.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path, parse_config({
        "data": {"path": str(path), "text": "text", "labels": ["cat"], "user": "user",
                 "label_domain": "discover", **data},
        "privacy": {"unit": "user"},
        "compute": {"engine": "ray", "address": address, "shards": 2}})


def test_the_ray_driver_never_opens_the_private_file(ray_cluster, tmp_path, monkeypatch):
    import dpsynth.data.readers as readers
    from dpsynth.run_dataset import load_run_data

    path, cfg = _config(tmp_path, ray_cluster, _rows())
    local = load_dataset(path, "text", ["cat"], "user")
    expected = {
        "fingerprint": local.fingerprint(),
        "values": LocalCompute.for_dataset(local, True).label_value_counts(["cat"], 2),
        "keywords": engine_keyword_counts(LocalCompute.for_dataset(local, True), VOCAB, 2,
                                          "appearance"),
        "secrets": gathered_secret_index(LocalCompute.for_dataset(local, True), SPECS),
    }
    opened: list[str] = []
    real_open = builtins.open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the driver read the private file")

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(readers, "read_chunks", refuse)
    monkeypatch.setattr(pd, "read_csv", refuse)
    run = RunDir(tmp_path / "run")
    ds = load_run_data(cfg, run, sharded=True)
    try:
        assert ds.fingerprint() == expected["fingerprint"] and len(ds) == len(local)
        for name in ("texts", "users", "labels"):
            with pytest.raises(ShardedDataError, match="per-record"):
                getattr(ds, name)
        with pytest.raises(ShardedDataError):
            ds.joint_label_codes()
        got = ds.compute.label_value_counts(["cat"], 2)
        assert got["cat"][0] == expected["values"]["cat"][0]
        assert got["cat"][1].tobytes() == expected["values"]["cat"][1].tobytes()
        assert engine_keyword_counts(ds.compute, VOCAB, 2, "appearance").tobytes() == \
            expected["keywords"].tobytes()
        sec = gathered_secret_index(ds.compute, SPECS)
        assert (sec.membership != expected["secrets"].membership).nnz == 0
        assert sec.values == expected["secrets"].values
        with pytest.raises(ValueError, match="no public label domain"):
            ds.label_classes()
        # a privately discovered domain is applied on the shards
        kept = ds.with_label_domain({"cat": ["drink", "food"]})
        ref = local.with_label_domain({"cat": ["drink", "food"]})
        assert len(kept) == len(ref) and kept.fingerprint() == ref.fingerprint()
        assert kept.label_classes() == ref.label_classes() == ref.joint_label_codes()[1]
    finally:
        ds.compute.close()
    assert str(path) not in opened and path.name not in {Path(p).name for p in opened}


def test_data_problems_found_by_the_shards_are_the_loaders_errors(ray_cluster, tmp_path):
    from dpsynth.run_dataset import load_run_data

    rows = _rows(20)
    rows[3]["text"] = " "
    _, cfg = _config(tmp_path, ray_cluster, rows)
    with pytest.raises(DataError, match="row 4") as err:
        load_run_data(cfg, RunDir(tmp_path / "run"), sharded=True)
    assert [p.row for p in err.value.problems] == [4]


def test_shards_that_read_different_files_are_refused():
    from dpsynth.compute.ray_engine import DataSpec, RayCompute
    from dpsynth.errors import ComputeError

    engine = RayCompute.__new__(RayCompute)  # only the driver's check, no cluster
    engine.spec = DataSpec("p.csv", "text", (), None, None, None, None, None, False)
    info = {"file_fingerprint": "a", "fingerprint": "a", "content": "bytes", "n_records": 10,
            "rows": 5, "warnings": []}
    engine._check([info, info])
    assert (engine.fingerprint, engine.n, engine.content) == ("a", 10, "bytes")
    with pytest.raises(ComputeError, match="differs between the nodes"):
        engine._check([info, {**info, "file_fingerprint": "b", "fingerprint": "b"}])
    with pytest.raises(ComputeError, match="differs between the nodes"):  # other bytes
        engine._check([info, {**info, "content": "other"}])
    with pytest.raises(ComputeError, match="exactly once"):
        engine._check([info, {**info, "rows": 4}])
    engine.spec = DataSpec("p.csv", "text", (), None, None, None, None, None, False, "c")
    with pytest.raises(ComputeError, match="driver validated"):
        engine._check([info, info])


@pytest.mark.parametrize("unit", ["record", "user"])
def test_synrag_histogram_from_the_engine_is_the_count_of_its_keywords(dataset, unit):
    """DP-SynRAG's vocabulary extractor: the histogram the build sums from its document
    shards on any engine is the count of the keywords they keep for the clustering (one
    document per user at user level)."""
    from dpsynth.methods.synrag.clusters import keyword_counts
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.pipeline import documents
    from dpsynth.methods.synrag.shard import DocumentShard, ShardFiles

    cfg = parse_config({"privacy": {"unit": unit}, "data": {"user": "user"}})
    scfg = SynRAGConfig.model_validate({"keyword_extractor": "vocabulary",
                                        "keywords_per_doc": 2})
    kws = extract_keywords(documents(cfg, dataset), VOCAB, 2, fill=scfg.keyword_fill)
    users = dataset.users if unit == "user" else None
    shards = [text_shard(dataset, users, s, 3) for s in range(3)]
    build = sum(DocumentShard.of_records(t.texts, t.rows, t.users if unit == "user" else None,
                                         ShardFiles())
                .keyword_counts(VOCAB, 2, scfg.keyword_fill, "tag") for t in shards)
    engine = engine_keyword_counts(_in_process(dataset, unit == "user", 3), VOCAB, 2,
                                   scfg.keyword_fill)
    assert engine.tobytes() == keyword_counts(kws, len(VOCAB)).tobytes() and engine.sum() > 0
    assert build.astype(np.float64).tobytes() == engine.tobytes()
