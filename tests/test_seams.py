"""The structure that runs (docs/architecture.md), exactly and in seconds, with the fakes of
tests/fakes.py: no import cycles, every method's release keys and files, the loop resumed at
every iteration, quotas from the released label counts, selection, and WASP's weights and
demonstrations from its near / far histograms."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dpsynth.api import run_generation
from dpsynth.config import RunConfig, parse_config
from dpsynth.evolution.lengths import N_BINS
from dpsynth.evolution.pool import Pool
from dpsynth.evolution.selection import allocate, top_indices
from dpsynth.evolution.strategy import VoteResult
from dpsynth.hooks import RunHooks
from fakes import FakeEmbedder, FakeGenerator
from faults import stop_at
from test_release_check import pe_config, private_rows, shared_files, write_csv

SRC = Path(__file__).resolve().parents[1] / "src"

SECRETS = [{"kind": "regex", "name": "n", "pattern": r"(Zorvath|Quellmir)\d+"}]
METHODS: dict[str, dict[str, Any]] = {
    "aug_pe": {},
    "wasp": {"wasp.top_q": 3, "wasp.demonstrations": 2},
    "secpe": {"secpe.secrets": SECRETS, "secpe.clusters": 4, "secpe.discretization": 1e-2},
    "zero_shot": {},
}
KEYS = {
    "aug_pe": ["label_counts", "iter0/votes", "iter1/votes"],
    "wasp": ["label_counts", "iter0/topq", "iter1/topq"],
    "secpe": ["iter0/representatives", "iter1/representatives"],
    "zero_shot": [],
}
PE_FILES = ["iterations/iter1.jsonl", "iterations/iter2.jsonl", "privacy.json", "summary.json",
            "synthetic.jsonl", "zero_shot.jsonl"]


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def _config(tmp_path: Path, method: str, ledger: str = "ledger.json") -> dict[str, Any]:
    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(40)), **METHODS[method])
    cfg["privacy"]["ledger"] = str(tmp_path / ledger)
    return cfg


def _run(cfg: dict[str, Any] | Path, out: Path, resume: bool = False,
         hooks: RunHooks | None = None) -> Path:
    config: Any = cfg if resume else parse_config(cfg)  # type: ignore[arg-type]
    return Path(run_generation(config, out, resume=resume, progress=False,
                               generators=[FakeGenerator("fake-g0")],
                               embedder=FakeEmbedder(), hooks=hooks))


def _keys(run: Path) -> list[str]:
    store = run / "private" / "releases" / "releases.jsonl"
    if not store.is_file():
        return []
    return [json.loads(line)["key"] for line in store.read_text().splitlines() if line]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


# ---------------------------------------------------------------------------- import structure


def _module_graph() -> dict[str, set[str]]:
    """dpsynth module -> dpsynth modules it imports anywhere: at module level, under
    TYPE_CHECKING and inside functions (an import deferred to a function still closes a
    cycle, it only moves the failure to run time)."""
    mods: dict[str, tuple[Path, bool]] = {}
    for p in (SRC / "dpsynth").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if pkg else parts)] = (p, pkg)
    graph: dict[str, set[str]] = {}
    for mod, (path, pkg) in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = mod.split(".") if pkg else mod.split(".")[:-1]
                if node.level:
                    base = base[:len(base) - node.level + 1] + (
                        node.module.split(".") if node.module else [])
                else:
                    base = (node.module or "").split(".")
                target = ".".join(base)
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[mod] = {d for d in deps if d in mods and d != mod}
    return graph


def test_no_import_cycle_hidden_or_not() -> None:
    graph = _module_graph()
    assert "dpsynth.runner" in graph and "dpsynth.methods.synrag" in graph
    # imports inside functions are edges too (compute's engine is built by run_dataset, which
    # compute never imports)
    assert "dpsynth.compute.ray_engine" in graph["dpsynth.run_dataset"]
    assert not {d for d in graph["dpsynth.compute.ray_engine"] if "run_dataset" in d}
    done: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycles.append(path[path.index(node):] + [node])
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, path + [node])
        done.add(node)

    for mod in sorted(graph):
        visit(mod, [])
    assert cycles == []


def test_each_module_imports_alone() -> None:
    """A fresh import of each module of the run's structure works on its own (a cycle that
    only bites in one import order fails here)."""
    mods = ["dpsynth.context", "dpsynth.runner", "dpsynth.api", "dpsynth.evolution.strategy",
            "dpsynth.methods.loop",
            "dpsynth.evolution.operators", "dpsynth.evolution.parts", "dpsynth.evolution.pool",
            "dpsynth.evolution.textgen", "dpsynth.methods", "dpsynth.methods.base",
            "dpsynth.methods.pe", "dpsynth.methods.aug_pe", "dpsynth.methods.wasp",
            "dpsynth.methods.secpe", "dpsynth.methods.zero_shot", "dpsynth.methods.synrag",
            "dpsynth.methods.synrag.pipeline", "dpsynth.voting", "dpsynth.methods.synrag.config",
            "dpsynth.compute", "dpsynth.compute.ray_engine", "dpsynth.run_dataset",
            "dpsynth.methods.secpe.kernels", "dpsynth.methods.secpe.method",
            "dpsynth.llm.local", "dpsynth.llm.ct2", "dpsynth.llm.stepper"]
    script = ("import importlib, sys\n"
              f"for m in {mods!r}:\n"
              "    for k in [k for k in sys.modules if k.startswith('dpsynth')]:\n"
              "        del sys.modules[k]\n"
              "    importlib.import_module(m)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_strategies_do_not_inherit_or_borrow_from_each_other() -> None:
    graph = _module_graph()
    for name in ("wasp", "secpe", "zero_shot"):
        assert "dpsynth.methods.aug_pe" not in graph[f"dpsynth.methods.{name}"]
    from dpsynth.methods.aug_pe import AugPEStrategy
    from dpsynth.methods.secpe import SecPEStrategy

    assert not issubclass(SecPEStrategy, AugPEStrategy)


# ----------------------------------------------------------------------------- whole runs


@pytest.mark.parametrize("method", sorted(METHODS))
def test_release_keys_and_files_of_every_method(tmp_path: Path, method: str) -> None:
    run = _run(_config(tmp_path, method), tmp_path / "run")
    assert _keys(run) == KEYS[method]
    files = sorted(p.relative_to(run / "release").as_posix()
                   for p in (run / "release").rglob("*") if p.is_file())
    assert files == (["privacy.json", "summary.json", "synthetic.jsonl"]
                     if method == "zero_shot" else PE_FILES)
    meta = json.loads((run / "run.json").read_text())
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert meta["method"] == privacy["method"] == method
    assert meta["status"] == "finished"


@pytest.mark.parametrize("method", ["aug_pe", "wasp", "secpe"])
def test_resumed_at_every_iteration_gives_the_uninterrupted_release(
        tmp_path: Path, method: str) -> None:
    whole = _run(_config(tmp_path, method, "whole.json"), tmp_path / "whole")
    expected = shared_files(whole)
    expected.pop("release/summary.json")  # attempts and call counts differ by design
    for stop in range(3):  # after the initial pool, after vote 1, after vote 2
        out = tmp_path / f"stop{stop}"
        with pytest.raises(KeyboardInterrupt):  # stopped as a kill would, after a checkpoint
            _run(_config(tmp_path, method, f"l{stop}.json"), out, hooks=stop_at(stop + 1))
        assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
        before = _keys(out)
        done = _run(out, out, resume=True)
        got = shared_files(done)
        got.pop("release/summary.json")
        assert got == expected, f"stopped after checkpoint {stop}"
        assert _keys(done)[:len(before)] == before and _keys(done) == KEYS[method]


def test_quota_is_the_allocation_of_the_released_label_counts(tmp_path: Path) -> None:
    run = _run(_config(tmp_path, "aug_pe"), tmp_path / "run")
    from dpsynth.privacy.store import ReleaseStore

    store = ReleaseStore(run / "private" / "releases")
    try:
        noisy = np.asarray(store.value("label_counts"), dtype=np.float64)
    finally:
        store.close()
    quota = allocate(9, noisy.reshape(3, N_BINS).sum(axis=1))  # (label x length) histogram
    classes = ["billing", "clinical", "scheduling"]
    for name in ("synthetic.jsonl", "zero_shot.jsonl", "iterations/iter2.jsonl"):
        rows = _jsonl(run / "release" / name)
        got = [sum(r["labels"]["label"] == c for r in rows) for c in classes]
        assert got == quota.tolist(), name


@pytest.mark.parametrize("method", ["aug_pe", "wasp", "secpe"])
def test_a_uniform_label_split_releases_every_label_alike(tmp_path: Path, method: str) -> None:
    """synthesis.label_split uniform: 3 texts a label although the records hold no
    scheduling row (the noisy counts, or SecPE's public counts, would give it about none);
    the counts are still released (Aug-PE and WASP size their votes from them)."""
    cfg = _config(tmp_path, method)
    cfg["synthesis"]["label_split"] = "uniform"
    run = _run(cfg, tmp_path / "run")
    assert _keys(run) == KEYS[method]
    for name in ("synthetic.jsonl", "zero_shot.jsonl"):
        rows = _jsonl(run / "release" / name)
        got = [sum(r["labels"]["label"] == c for r in rows)
               for c in ("billing", "clinical", "scheduling")]
        # WASP's zero-shot set is its first round's share of the release
        assert got == ([3, 3, 3] if name == "synthetic.jsonl" or method != "wasp"
                       else [got[0]] * 3), name
    counted = _run(_config(tmp_path, method, "counted.json"), tmp_path / "counted")
    rows = _jsonl(counted / "release" / "synthetic.jsonl")
    assert sum(r["labels"]["label"] == "scheduling" for r in rows) < 3  # the default differs


# ----------------------------------------------------------------------------- strategy parts


class _Gen:
    """The parts of evolution.operators.Generation that the strategies call, recorded."""

    names = ["g0", "g1"]

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def variations(self, pool: Pool, n_each: int, tag: str) -> tuple[Pool, np.ndarray]:
        self.calls.append(("variations", (len(pool), n_each, tag)))
        out = Pool([f"{t} v{j}" for t in pool.texts for j in range(n_each)],
                   np.repeat(pool.labels, n_each), np.repeat(pool.sources, n_each))
        return out, np.repeat(np.arange(len(pool)), n_each)

    def contrastive(self, per_label: np.ndarray, weights: np.ndarray, good: dict,
                    bad: dict, n_demos: int, tag: str) -> Pool:
        self.calls.append(("contrastive", (per_label.tolist(), weights.tolist(), good, bad,
                                           tag)))
        return Pool()

    def zero_shot(self, per_label: np.ndarray, tag: str, weights: Any = None) -> Pool:
        self.calls.append(("zero_shot", (per_label.tolist(), tag)))
        return Pool()


def _pool() -> Pool:
    return Pool([f"t{i}" for i in range(8)], np.array([0, 0, 0, 0, 1, 1, 1, 1]),
                np.array([0, 1, 0, 1, 0, 1, 1, 1]))


def test_selection_keeps_the_top_quota_per_label_then_varies() -> None:
    from dpsynth.context import Rngs
    from dpsynth.evolution.parts import select_and_vary

    cfg = RunConfig.model_validate({"synthesis": {"pool_multiplier": 3}})
    gen = _Gen()
    scores = np.array([0.0, 5.0, 2.0, 1.0, 3.0, 0.0, 9.0, 4.0])
    out = select_and_vary(gen, Rngs(0), cfg.synthesis, 0, _pool(), scores, np.array([2, 1]),
                          last=False)
    assert out.texts[:3] == ["t1", "t2", "t6"]
    assert len(out) == 3 * 3 and gen.calls == [("variations", (3, 2, "var0"))]
    last = select_and_vary(gen, Rngs(0), cfg.synthesis, 1, _pool(), scores, np.array([2, 1]),
                           last=True)
    assert last.texts == ["t1", "t2", "t6"] and len(gen.calls) == 1


def test_wasp_next_weights_and_demonstrations_come_from_near_and_far() -> None:
    from dpsynth.context import Rngs
    from dpsynth.methods.wasp import WaspState, WaspStrategy, generator_weights

    cfg = RunConfig.model_validate({
        "method": "wasp", "generators": [{"model": "a"}, {"model": "b"}],
        "synthesis": {"iterations": 1},
        "wasp": {"demonstrations": 2, "weight_temperature": 0.5}})
    gen = _Gen()
    strategy = WaspStrategy(cfg, SimpleNamespace(), SimpleNamespace(sigma=1.0), gen, Rngs(0))
    strategy.state = WaspState(quota=np.array([4, 4]), sizes=np.array([[2, 2], [2, 2]]),
                               weights=np.array([0.5, 0.5]))
    pool = _pool()
    near = np.array([3.0, 0.0, 1.0, 2.0, -1.0, 4.0, 0.5, 0.0])
    far = np.array([0.0, 6.0, 0.0, 1.0, 2.0, 0.0, 0.0, 3.0])
    strategy.next(0, pool, VoteResult(near, {"near": near, "far": far}), last=True)
    weights = generator_weights(near, pool.sources, 2, 0.5)
    np.testing.assert_array_equal(strategy.state.weights, weights)
    assert strategy.state.history == [weights.tolist()]
    ((kind, (per_label, used, good, bad, tag)),) = gen.calls
    assert kind == "contrastive" and tag == "round1" and per_label == [2, 2]
    assert used == weights.tolist()
    top_near, top_far = top_indices(near, pool.labels, 2), top_indices(far, pool.labels, 2)
    assert good == {y: [pool.texts[i] for i in idx] for y, idx in top_near.items()}
    assert bad == {y: [pool.texts[i] for i in idx] for y, idx in top_far.items()}
    assert good[0] == ["t0", "t3"] and bad[0] == ["t1", "t3"]


# ----------------------------------------------------------------------------- the registry


def test_registry_one_spelling_and_what_each_method_releases() -> None:
    from dpsynth.config import ConfigError
    from dpsynth.methods import REGISTRY, get_method, method_class

    for name in REGISTRY:
        assert method_class(name).name == name
    assert method_class("synrag").releases == "knowledge_base"
    assert {method_class(n).releases for n in METHODS} == {"text"}
    with pytest.warns(DeprecationWarning, match="dp_synrag"):
        assert get_method("dp_synrag").name == "synrag"  # old run folders still read
    with pytest.raises(ConfigError, match="dpsynth rag build"):
        get_method("synrag", releases="text")
    with pytest.raises(ConfigError, match="unknown method 'nope'"):
        get_method("nope")


def test_method_sections_are_validated_by_their_config_model(tmp_path: Path) -> None:
    """A method section is validated by its own method's model, through the registry: a bad
    value or a typo fails when the config is read, naming the field, before any folder is
    written (RunConfig has no method-specific section of its own)."""
    import yaml

    from dpsynth.api import build_kb
    from dpsynth.config import ConfigError, RunConfig
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.wasp import WaspConfig

    assert not {"wasp", "secpe", "synrag"} & set(RunConfig.model_fields)
    good = _config(tmp_path, "aug_pe")
    for name, section, field in (("synrag", {"clusters": 0}, "synrag.clusters"),
                                 ("wasp", {"top_qq": 3}, "wasp.top_qq"),
                                 ("secpe", {"clip": -1}, "secpe.clip"),
                                 ("nosuchmethod", {}, "nosuchmethod")):
        bad = {**good, "method": "synrag" if name == "synrag" else "aug_pe", name: section}
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            parse_config(bad)
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(bad), encoding="utf-8")
        run = build_kb if name == "synrag" else run_generation
        with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
            run(path, tmp_path / "run")  # refused before anything is written
        assert not (tmp_path / "run").exists()
    # the run's own method's section is filled with its defaults (dumped, digested)
    wasp = parse_config({**good, "method": "wasp"})
    assert isinstance(wasp.wasp, WaspConfig) and wasp.model_dump()["wasp"]["top_q"] == 8
    rag = parse_config({**good, "method": "synrag"})
    assert isinstance(rag.synrag, SynRAGConfig) and "wasp" not in rag.model_dump()
    with pytest.raises(ConfigError, match="dpsynth rag build"):
        run_generation(rag, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_ray_worker_modules_do_not_import_the_accountant() -> None:
    """What a shard actor, a logit worker or a Flower party imports stays clear of
    dp_accounting (with scipy.signal/stats about 0.7 s of CPU per worker process); the
    driver's modules still reach it through ``dpsynth.privacy``'s names."""
    worker_side = ["dpsynth.compute.ray_engine", "dpsynth.methods.synrag.ray_prediction",
                   "dpsynth.federated.core", "dpsynth.federated.app",
                   "dpsynth.methods.synrag.shard", "dpsynth.methods.secpe.kernels",
                   "dpsynth.privacy.noise", "dpsynth.privacy.mechanisms"]
    script = ("import importlib, sys\n"
              f"for m in {worker_side!r}:\n"
              "    importlib.import_module(m)\n"
              "print('dp_accounting' in sys.modules)\n"
              "from dpsynth.privacy import Accountant\n"
              "print('dp_accounting' in sys.modules, Accountant.__module__)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "dpsynth.privacy.accountant"]
