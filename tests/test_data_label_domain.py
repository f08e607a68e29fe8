"""The label domain is public input: declared in the config (or found privately, with its
delta charged), never derived from the records (docs/methods.md §0)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpsynth.config import ConfigError, load_config, parse_config
from dpsynth.data import DataError, check_dataset, load_dataset
from dpsynth.demo_corpus import DEPARTMENTS, URGENCIES
from dpsynth.label_domain import (
    discover_label_domain,
    discovery_events,
    discovery_threshold,
    singleton_pass_probability,
    value_counts,
)

REPO = Path(__file__).resolve().parents[1]


def _csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


ROWS = [
    {"text": "great tacos", "cat": "food", "stars": "5"},
    {"text": "loud music", "cat": "bar", "stars": "3"},
    {"text": "fresh salsa", "cat": "food", "stars": "4"},
]


# ------------------------------------------------------------------------- declared domain


def test_config_without_declared_values_is_refused_with_how_to(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("data:\n  path: data.csv\n  labels: [cat, stars]\n"
                   "  label_values: {cat: [food, bar]}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    msg = str(info.value)
    assert "'stars' without declared values" in msg and "'cat'" not in msg.split("e.g.")[0]
    assert "label_values:" in msg and "stars: [value1, value2, value3]" in msg  # YAML snippet
    assert "stars-values.txt" in msg and "one value per line" in msg
    assert "dpsynth data check FILE" in msg and "label_domain: discover" in msg


def test_declared_values_from_list_file_and_demo(tmp_path: Path) -> None:
    (tmp_path / "vals").mkdir()
    (tmp_path / "vals" / "stars.txt").write_text("\ufeff1\n2\n\n3\n4\n5\n", encoding="utf-8")
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"data": {
        "path": "data.csv", "labels": ["cat", "stars", "department", "urgency"],
        "label_values": {"cat": ["food", "bar"], "stars": "vals/stars.txt",
                         "department": "demo", "urgency": "demo"}}}))
    config = load_config(cfg)
    assert Path(config.data.label_values["stars"]).is_absolute()  # relative to the config
    values = config.data.declared_label_values()
    assert values == {"cat": ["food", "bar"], "stars": ["1", "2", "3", "4", "5"],
                      "department": [d[0] for d in DEPARTMENTS], "urgency": list(URGENCIES)}
    # YAML numbers read as the loader reads label cells
    raw = {"data": {"labels": ["stars"], "label_values": {"stars": [1, 2.0, 2.5]}}}
    assert parse_config(raw).data.declared_label_values() == {"stars": ["1", "2", "2.5"]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], "declare at least one value"),
        (["a", "a"], "declared twice"),
        ([True, "b"], "quote it"),
        ("demo", "'demo' declares the demo corpus's public values"),
    ],
)
def test_bad_declared_values(values, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"data": {"labels": ["cat"], "label_values": {"cat": values}}})


def test_values_file_problems_name_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "v.txt").write_text("a\nb\na\n", encoding="utf-8")
    raw = {"data": {"labels": ["cat"], "label_values": {"cat": str(tmp_path / "v.txt")}}}
    with pytest.raises(ConfigError, match=r"v\.txt\), line 3: value 'a' repeats line 1"):
        parse_config(raw).data.declared_label_values()
    raw["data"]["label_values"]["cat"] = str(tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match="missing.txt.*file not found"):
        parse_config(raw).data.declared_label_values()


def test_record_with_undeclared_value_names_file_row_and_field(tmp_path: Path) -> None:
    secret = "Dr Quentin Marlowe-Fitzgerald, ward 7, bed 12, diagnosed yesterday"
    rows = [*ROWS, {"text": "odd one", "cat": secret, "stars": "9"}]
    path = _csv(tmp_path / "reviews.csv", rows)
    with pytest.raises(DataError) as info:
        load_dataset(path, "text", ["cat", "stars"],
                     label_values={"cat": ["food", "bar"], "stars": ["3", "4", "5"]})
    problems = info.value.problems
    assert [(p.file, p.row, p.field) for p in problems] == [
        ("reviews.csv", 4, "cat"), ("reviews.csv", 4, "stars")]
    assert "(1 characters) is not among the 3 declared values of 'stars'" in problems[1].message
    msg = str(info.value)
    assert "reviews.csv, row 4, field 'cat'" in msg
    assert "Quentin" not in msg and "(66 characters)" in msg  # the length only
    # check_dataset reports the same problem without raising
    report = check_dataset(path, "text", ["cat", "stars"],
                           label_values={"cat": ["food", "bar"], "stars": ["3", "4", "5"]})
    assert not report.ok and {(p.row, p.field) for p in report.problems} == {
        (4, "cat"), (4, "stars")}


def test_joint_classes_are_the_declared_product_even_for_values_nobody_holds(
    tmp_path: Path,
) -> None:
    path = _csv(tmp_path / "r.csv", ROWS)
    values = {"cat": ["food", "bar", "spa"], "stars": ["1", "2", "3", "4", "5"]}
    ds = load_dataset(path, "text", ["cat", "stars"], label_values=values)
    codes, classes = ds.joint_label_codes()
    assert len(classes) == 15
    assert classes[:5] == [("food", s) for s in values["stars"]]  # declared order
    assert ("spa", "1") in classes  # no record holds "spa" or stars 1 or 2
    assert [classes[c] for c in codes] == [("food", "5"), ("bar", "3"), ("food", "4")]
    # one more record with a new value adds no class: the domain is not read from the records
    more = load_dataset(_csv(tmp_path / "r2.csv", [*ROWS, {"text": "x", "cat": "spa",
                                                           "stars": "1"}]),
                        "text", ["cat", "stars"], label_values=values)
    assert more.joint_label_codes()[1] == classes
    # single column: the declared values, in declared order
    assert ds.label_codes("cat") == (pytest.approx([0, 1, 0]), ["food", "bar", "spa"])


def test_no_domain_is_refused(tmp_path: Path) -> None:
    ds = load_dataset(_csv(tmp_path / "r.csv", ROWS), "text", ["cat"])
    with pytest.raises(ValueError, match="public label domain for 'cat'"):
        ds.joint_label_codes()
    with pytest.raises(ValueError, match="public label domain"):
        ds.label_codes("cat")
    codes, classes = ds.joint_label_codes({"cat": ["bar", "food"]})
    assert classes == [("bar",), ("food",)] and codes.tolist() == [1, 0, 1]
    with pytest.raises(ValueError,
                       match=r"record 2: its cat value \(3 characters\) is not in the declared"):
        ds.joint_label_codes({"cat": ["food"]})
    kept = ds.with_label_domain({"cat": ["food"]})
    assert kept.texts == ["great tacos", "fresh salsa"] and kept.joint_label_codes()[1] == [
        ("food",)]


def test_run_uses_the_declared_domain(tmp_path: Path, monkeypatch) -> None:
    """The production path (run_dataset.load_run_data) passes the config's domain to the loader."""
    from dpsynth.run_dataset import load_run_data
    from dpsynth.run_folder import RunDir

    path = _csv(tmp_path / "r.csv", ROWS)
    cfg = parse_config({"data": {"path": str(path), "labels": ["cat"],
                                 "label_values": {"cat": ["food", "bar", "spa"]}}})
    ds = load_run_data(cfg, RunDir(tmp_path / "run"))
    assert ds.joint_label_codes()[1] == [("food",), ("bar",), ("spa",)]
    cfg.data.label_values["cat"] = ["food"]
    with pytest.raises(DataError, match="row 2, field 'cat'"):
        load_run_data(cfg, RunDir(tmp_path / "run"))


def _example_configs() -> list[str]:
    """The run configs among examples/*.yaml (not their side files, e.g. label descriptions)."""
    import yaml

    return sorted(p.name for p in (REPO / "examples").glob("*.yaml")
                  if "data" in (yaml.safe_load(p.read_text(encoding="utf-8")) or {}))


@pytest.mark.parametrize("name", _example_configs())
def test_every_example_declares_its_label_domain(name: str) -> None:
    config = load_config(REPO / "examples" / name)
    values = config.data.declared_label_values()
    assert set(values) == set(config.data.labels)
    assert config.data.label_domain == "declared"


def test_demo_is_user_level_over_patients() -> None:
    config = load_config(REPO / "examples" / "demo.yaml")
    assert config.privacy.unit == "user" and config.data.user == "patient_id"
    assert config.data.declared_label_values()["department"] == [d[0] for d in DEPARTMENTS]


# ------------------------------------------------------------------------ private discovery


@pytest.mark.parametrize(("sigma", "delta"), [(1.0, 1e-5), (5.0, 1e-7), (12.5, 1e-3)])
def test_discovery_threshold_closed_form(sigma: float, delta: float) -> None:
    tau = discovery_threshold(sigma, delta)
    # P[1 + N(0, sigma^2) > tau] = erfc((tau - 1) / (sigma sqrt 2)) / 2, by the closed form
    closed = 0.5 * math.erfc((tau - 1.0) / (sigma * math.sqrt(2.0)))
    assert closed == pytest.approx(delta, rel=1e-6)
    assert singleton_pass_probability(sigma, tau) == pytest.approx(closed, rel=1e-9)
    assert singleton_pass_probability(sigma, tau) <= delta * (1 + 1e-9)
    # a value held by many records passes almost surely
    assert singleton_pass_probability(sigma, tau, count=tau + 6 * sigma) > 1 - 1e-8


def test_discovery_keeps_common_values_drops_singletons_and_charges_delta() -> None:
    cat = ["food"] * 80 + ["bar"] * 60 + ["rare"]
    stars = ["5"] * 70 + ["4"] * 70 + ["1"]
    rng = np.random.default_rng(0)
    sigma, delta = 3.0, 1e-6
    seen: dict[str, np.ndarray] = {}

    def noisy(key: str, counts: np.ndarray) -> np.ndarray:
        seen[key] = counts
        return counts + rng.normal(0.0, sigma, counts.shape)

    found = discover_label_domain({"cat": cat, "stars": stars}, noisy, sigma=sigma,
                                  delta_discover=delta)
    assert found.values == {"cat": ["bar", "food"], "stars": ["4", "5"]}
    assert set(seen) == {"label_domain/cat", "label_domain/stars"}
    assert found.extra_delta == delta  # the run states (eps, delta + delta_discover)
    assert found.threshold == pytest.approx(discovery_threshold(sigma, delta / 2))
    assert found.events == discovery_events(2, sigma)
    assert found.events[0].count == 2 and found.events[0].sensitivity == 1.0
    # a one-record value passes with probability <= delta_discover / 2 per column
    assert singleton_pass_probability(sigma, found.threshold) <= delta / 2 * (1 + 1e-9)


def test_discovery_through_a_privacy_session_is_accounted(tmp_path: Path) -> None:
    from dpsynth.privacy import Accountant, PrivacySession, make_noise_source

    session = PrivacySession(tmp_path / "releases", Accountant("pld"),
                             make_noise_source("seeded", 0))
    found = discover_label_domain(
        {"cat": ["a"] * 200 + ["b"] * 150},
        lambda key, c: session.noisy_counts(key, c, 2.0, name="label_domain"),
        sigma=2.0, delta_discover=1e-6)
    assert found.values == {"cat": ["a", "b"]}
    expected = Accountant("pld")
    for event in found.events:
        expected.add(event)
    assert session.accountant.epsilon(1e-5) == pytest.approx(expected.epsilon(1e-5), rel=1e-9)


def test_discovery_refuses_when_nothing_passes() -> None:
    with pytest.raises(ValueError, match="declare data.label_values.cat"):
        discover_label_domain({"cat": ["a", "b"]}, lambda k, c: c, sigma=1.0,
                              delta_discover=1e-6)


def test_user_level_counts_bound_each_user() -> None:
    values = ["a", "b", "c", "d", "a", "a"]
    users = ["u1", "u1", "u1", "u1", "u2", "u2"]
    names, counts = value_counts(values, users, 4)
    assert names == ["a", "b", "c", "d"]
    np.testing.assert_allclose(counts, [0.5 + 1.0, 0.5, 0.5, 0.5])  # u1: 4 values, norm 1
    # k = 2: u1 (all values once) keeps its two smallest values, u2 its only one
    names, counts = value_counts(values, users, 2)
    assert names == ["a", "b"]
    np.testing.assert_allclose(counts, [2 ** -0.5 + 1.0, 2 ** -0.5])
    assert value_counts(values, users) == (["a"], pytest.approx([2.0]))  # default k = 1
    names, counts = value_counts(["x", "y", "x"])
    assert names == ["x", "y"] and counts.tolist() == [2.0, 1.0]


def test_a_user_counts_towards_their_k_most_frequent_values() -> None:
    from dpsynth.compute.kernels import user_value_weights

    held = ["d", "c", "b", "c", "a", "b", "e", "c"]  # c x3, b x2, then a, d, e once each
    assert [v for v, _ in user_value_weights(held, 1)] == ["c"]
    assert [v for v, _ in user_value_weights(held, 2)] == ["b", "c"]
    assert [v for v, _ in user_value_weights(held, 3)] == ["a", "b", "c"]  # a: tie, smallest
    assert [v for v, _ in user_value_weights(held, 4)] == ["a", "b", "c", "d"]
    for k in (1, 2, 3, 4, 5, 50):
        weights = user_value_weights(held, k)
        assert len(weights) == min(k, 5)
        assert sum(w * w for _, w in weights) == pytest.approx(1.0, rel=1e-8)  # L2 norm 1
        assert sum(w * w for _, w in weights) <= 1.0  # truncated onto the grid: never above
        assert max(w for _, w in weights) <= 1.0
    # the choice depends on the user's records only, not on their order
    assert user_value_weights(held[::-1], 3) == user_value_weights(held, 3)
    with pytest.raises(ValueError, match="max_values"):
        user_value_weights(held, 0)


def _pass_bound_closed_form(sigma: float, tau: float, k: int) -> float:
    """max_{k'<=k} k' PhiBar((tau - 1/sqrt(k')) / sigma) with PhiBar(x) = erfc(x/sqrt 2)/2."""
    return max(j * 0.5 * math.erfc((tau - j ** -0.5) / (sigma * math.sqrt(2.0)))
               for j in range(1, k + 1))


@pytest.mark.parametrize(("sigma", "delta"), [(1.0, 1e-2), (1.0, 1e-5), (5.0, 1e-7),
                                              (12.5, 1e-3), (0.3, 1e-9)])
@pytest.mark.parametrize("k", [1, 2, 4, 16, 300])
def test_user_level_threshold_is_the_union_bound_over_k_values(sigma: float, delta: float,
                                                               k: int) -> None:
    from dpsynth.label_domain import unit_pass_bound

    tau = discovery_threshold(sigma, delta, k)
    bound = _pass_bound_closed_form(sigma, tau, k)
    assert bound <= delta * (1 + 1e-9)
    assert unit_pass_bound(sigma, tau, k) == pytest.approx(bound, rel=1e-6)
    # the smallest such tau: a little lower and the bound is exceeded
    assert _pass_bound_closed_form(sigma, tau - 1e-6 * sigma, k) > delta
    # every k' <= k: even the exact chance that any of k' independent values passes
    for j in range(1, k + 1):
        p = singleton_pass_probability(sigma, tau, count=j ** -0.5)
        assert -math.expm1(j * math.log1p(-p)) <= j * p <= delta * (1 + 1e-9)
    # more values per user never lowers the threshold; k = 1 is the closed form
    assert discovery_threshold(sigma, delta, 1) == discovery_threshold(sigma, delta)
    assert tau >= discovery_threshold(sigma, delta, 1)


def test_the_old_threshold_is_too_low_for_a_user_with_many_values() -> None:
    """The finding (issue 23): at the defaults the one-value threshold lets a user with 300
    values through with probability above the run's whole delta; the union bound does not."""
    from dpsynth.label_domain import unit_pass_bound

    one_value = discovery_threshold(5.0, 1e-7)
    assert unit_pass_bound(5.0, one_value, 300) > 1e-5
    assert unit_pass_bound(5.0, discovery_threshold(5.0, 1e-7, 300), 300) <= 1e-7 * (1 + 1e-9)


def test_threshold_arguments_are_checked() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_values_per_user"):
            discovery_threshold(1.0, 1e-3, bad)
    with pytest.raises(ValueError, match="sigma"):
        discovery_threshold(0.0, 1e-3, 4)
    with pytest.raises(ValueError, match="delta_discover"):
        discovery_threshold(1.0, 1.0, 4)


def test_user_level_discovery_uses_k_for_counts_threshold_and_statement(tmp_path: Path
                                                                        ) -> None:
    """apply_discovery (the production entry) at user level: the config's k bounds each user's
    values, sets the threshold and is stated; record level states k = 1."""
    from dpsynth.label_domain import apply_discovery

    rows = ([{"text": f"t{i}", "cat": "food", "user": f"f{i}"} for i in range(40)]
            + [{"text": f"r{j}", "cat": f"rare{j:02d}", "user": "many"} for j in range(12)])
    ds = load_dataset(_csv(tmp_path / "d.csv", rows), "text", ["cat"], "user")
    cfg = parse_config({"data": {"labels": ["cat"], "label_domain": "discover", "user": "user",
                                 "label_domain_max_values_per_user": 3},
                        "privacy": {"unit": "user"}})
    seen: dict[str, np.ndarray] = {}
    kept, found = apply_discovery(ds, cfg.data, lambda k, c: seen.setdefault(k, c),
                                  user_level=True)
    # 'many' counts towards its 3 smallest values (all held once), 1/sqrt(3) each
    np.testing.assert_allclose(seen["label_domain/cat"], [40.0] + [3 ** -0.5] * 3)
    assert found.values == {"cat": ["food"]} and len(kept) == 40
    assert found.threshold == discovery_threshold(5.0, 1e-7, 3)
    assert found.threshold > discovery_threshold(5.0, 1e-7)
    assert found.statement()["max_values_per_user"] == 3
    _, at_record_level = apply_discovery(ds, cfg.data, lambda k, c: c)
    assert at_record_level.threshold == discovery_threshold(5.0, 1e-7)
    assert at_record_level.statement()["max_values_per_user"] == 1


def test_discover_mode_config() -> None:
    cfg = parse_config({"data": {"labels": ["cat"], "label_domain": "discover"}})
    assert cfg.data.declared_label_values() == {}
    assert cfg.data.label_domain_max_values_per_user == 4
    with pytest.raises(ConfigError, match="label_domain_max_values_per_user"):
        parse_config({"data": {"labels": ["cat"], "label_domain": "discover",
                               "label_domain_max_values_per_user": 0}})
    with pytest.raises(ConfigError, match="must be below privacy.delta"):
        parse_config({"data": {"labels": ["cat"], "label_domain": "discover",
                               "label_domain_delta": 1e-4}, "privacy": {"delta": 1e-5}})
    assert json.loads(json.dumps(cfg.model_dump(mode="json")))["data"]["label_domain"] == \
        "discover"


def test_demo_runs_end_to_end_at_user_level(tmp_path: Path, monkeypatch) -> None:
    """examples/demo.yaml as shipped (fewer rows), with the fake model seams: the statement
    says user level and the run's classes are the demo's six public departments."""
    import dpsynth.embed
    import dpsynth.llm
    from dpsynth.api import run_generation
    from fakes import FakeEmbedder, FakeGenerator  # tests/ is on sys.path (rootdir conftest)

    monkeypatch.setattr(dpsynth.llm, "load_generator", lambda spec, **kw: FakeGenerator("g"))
    monkeypatch.setattr(dpsynth.embed, "Embedder", lambda *a, **kw: FakeEmbedder())
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    raw = yaml.safe_load((REPO / "examples" / "demo.yaml").read_text())
    raw["data"]["demo_rows"] = 80
    raw["synthesis"]["samples"] = 12
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    run = run_generation(cfg, tmp_path / "run", progress=False)
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["unit"] == "user" and 0 < privacy["epsilon"] <= 4.0 + 1e-6
    rows = [json.loads(line) for line in
            (run / "release" / "synthetic.jsonl").read_text().splitlines()]
    departments = {d[0] for d in DEPARTMENTS}
    assert rows and all(r["labels"]["department"] in departments for r in rows)


def test_apply_discovery_keeps_declared_columns_and_drops_unkept_records(tmp_path: Path) -> None:
    from dpsynth.label_domain import apply_discovery, undeclared_columns

    rows = ([{"text": f"t{i}", "cat": "food", "stars": "5"} for i in range(40)]
            + [{"text": f"u{i}", "cat": "bar", "stars": "4"} for i in range(30)]
            + [{"text": "lonely", "cat": "rare", "stars": "4"}])
    cfg = parse_config({"data": {"labels": ["cat", "stars"], "label_domain": "discover",
                                 "label_values": {"stars": ["1", "2", "3", "4", "5"]}}})
    ds = load_dataset(_csv(tmp_path / "d.csv", rows), "text", ["cat", "stars"],
                      label_values=cfg.data.declared_label_values())
    assert undeclared_columns(ds) == ["cat"]
    keys: list[str] = []
    kept, found = apply_discovery(ds, cfg.data, lambda k, c: keys.append(k) or c)
    assert keys == ["label_domain/cat"]
    assert found.values == {"cat": ["bar", "food"]} and found.extra_delta == 1e-7
    assert "lonely" not in kept.texts and len(kept) == 70
    codes, classes = kept.joint_label_codes()
    assert len(classes) == 10 and classes[0] == ("bar", "1")
    st = found.statement()
    assert st["mode"] == "discover" and st["delta_discover"] == 1e-7
    assert st["noise_sigma"] == cfg.data.label_domain_sigma
    assert st["threshold"] == pytest.approx(discovery_threshold(5.0, 1e-7))
    assert st["max_values_per_user"] == 1  # record level
