"""The release checker (issue 11): release/ is a function of released noisy values and public
inputs only, and holds no exact private count, size or text (docs/methods.md §0, §6).

For every method, D and its neighbour D' (one record, one user, or one secret added) are run
with the deterministic fakes (tests/fakes.py) and the same seeded noise, then:

1. structure: both runs release under the same keys with the same privacy events;
2. substitution (the heart): a copy of each run's folder holding only config.yaml, run.json and
   D's release stores is resumed, so every release is replayed from D's stores. The two replays
   must request exactly the keys of D's stores, draw nothing new, and write byte-identical
   release/ (and stats.jsonl): whatever still differs was not explained by a noisy value;
3. exact values: no release file or stats.jsonl holds an exact private record count,
   per-label count or user count as a JSON number, and none of them nor log.txt holds a private
   text substring of >= 20 characters. Counts get integer (discrete Gaussian) noise, so a noisy
   count can equal an exact one by chance: a number that is itself a released noisy value of
   the run's stores is explained by it and not reported.

Step 2 is the authoritative structural check (the replays ask for exactly D's keys); step 1 is
strict for the PE methods, whose release keys are fixed by the config. For DP-SynRAG the number
of clusters is post-processing of the noisy histogram, so there only the shared keys of step 1
are compared.

The checker itself is tested on crafted run folders, so each check can fail.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dpsynth.errors import PrivacyError
from dpsynth.methods import REGISTRY
from dpsynth.privacy.session import PrivacySession
from fakes import WORDS, FakeEmbedder, FakeGenerator

pytestmark = pytest.mark.release_check

#: Timing fields are not functions of the data in the DP sense we can check; they are
#: normalised away (none should be in release/ any more; listed so a reappearance is visible).
VOLATILE_KEYS = frozenset({"wall_seconds", "time", "created", "started", "finished", "ended"})
#: Private folders that hold released values outside a release store: federated rounds keep
#: their unmasked sums there (their charge is in the store, dpsynth.federated.rounds); DP-SGD's
#: checkpoint holds the adapter, post-processing of the T noisy gradients (all T steps charged
#: in the store before step 0, dpsynth.methods.dpfinetune), so a replay samples from D's.
RESULT_DIRS = ("federated", "dp-finetune")
LABELS = ["billing", "clinical", "scheduling"]  # public domain; D has no "scheduling" record
MIN_TEXT = 20
#: a wall-clock time (ISO date and time): wall time depends on the data, nothing shareable has it
TIME_LIKE = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}")

# ----------------------------------------------------------------------------- the checker


def store_dirs(run: Path) -> dict[str, Path]:
    """The run's release stores: every folder under private/ that holds a releases.jsonl."""
    return {p.parent.relative_to(run / "private").as_posix(): p.parent
            for p in sorted((run / "private").rglob("releases.jsonl"))}


def store_records(run: Path) -> dict[str, list[dict[str, Any]]]:
    """store name -> its release records (key, events, value), in release order."""
    out = {}
    for name, folder in store_dirs(run).items():
        lines = (folder / "releases.jsonl").read_text(encoding="utf-8").splitlines()
        out[name] = [json.loads(line) for line in lines if line.strip()]
    return out


def _normalise(obj: Any, drop: frozenset[str]) -> Any:
    if isinstance(obj, dict):
        return {k: _normalise(v, drop) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [_normalise(v, drop) for v in obj]
    return obj


def shared_files(run: Path, ignore: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """Every file of release/ plus stats.jsonl, JSON timing fields (and ``ignore``d keys, for
    a known finding) normalised away."""
    drop = VOLATILE_KEYS | ignore
    paths = sorted(p for p in (run / "release").rglob("*") if p.is_file())
    if (run / "stats.jsonl").is_file():
        paths.append(run / "stats.jsonl")
    out = {}
    for p in paths:
        raw = p.read_bytes()
        rel = p.relative_to(run).as_posix()
        if p.suffix == ".json":
            raw = json.dumps(_normalise(json.loads(raw), drop), sort_keys=True).encode()
        elif p.suffix == ".jsonl":
            raw = b"\n".join(json.dumps(_normalise(json.loads(line), drop),
                                         sort_keys=True).encode()
                             for line in raw.splitlines() if line.strip())
        out[rel] = raw
    return out


def structure_problems(run_a: Path, run_b: Path, strict_keys: bool = True) -> list[str]:
    """Differences in what is released (stores, keys, event parameters, value shapes) between
    two runs; ``strict_keys=False`` compares only the keys both runs released."""
    a, b = store_records(run_a), store_records(run_b)
    problems = []
    if set(a) != set(b):
        problems.append(f"release stores differ: {sorted(a)} vs {sorted(b)}")
    for name in sorted(set(a) & set(b)):
        ka = [r["key"] for r in a[name]]
        kb = [r["key"] for r in b[name]]
        if strict_keys and ka != kb:
            only = sorted(set(ka) ^ set(kb))[:5]
            problems.append(f"{name}: release keys differ (e.g. {only}; {len(ka)} vs {len(kb)})")
        rb = {r["key"]: r for r in b[name]}
        for r in a[name]:
            other = rb.get(r["key"])
            if other is None:
                continue
            if r["events"] != other["events"]:
                problems.append(f"{name}: key {r['key']!r} released with other events: "
                                f"{r['events']} vs {other['events']}")
            if _shape(r["value"]) != _shape(other["value"]):
                problems.append(f"{name}: key {r['key']!r} released with another shape: "
                                f"{_shape(r['value'])} vs {_shape(other['value'])}")
    return problems


def _shape(value: dict[str, Any]) -> Any:
    """What a stored value looks like without its numbers (kind, dtype, shape, JSON keys)."""
    if value.get("kind") == "json" and isinstance(value.get("data"), dict):
        return ("json", sorted(value["data"]))
    return (value.get("kind"), value.get("dtype"), value.get("shape"))


def file_differences(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    """Shared files that differ, or exist on one side only."""
    out = [f"{name}: only in one run" for name in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        if a[name] != b[name]:
            out.append(f"{name}: {_first_difference(a[name], b[name])}")
    return out


def _first_difference(x: bytes, y: bytes) -> str:
    i = next((k for k, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
    return f"differs at byte {i}: {x[max(0, i - 40):i + 40]!r} vs {y[max(0, i - 40):i + 40]!r}"


def replay_skeleton(run: Path, stores_from: Path, meta_from: Path, dest: Path) -> Path:
    """A copy of ``run`` holding only its config.yaml, ``meta_from``'s run.json and the release
    stores of ``stores_from``: resuming it replays every release from those stores."""
    from dpsynth.resume import config_digest, locked_fields

    dest.mkdir(parents=True)
    # a resume of another run's stores on this run's data is exactly what production refuses
    # (a changed file, another config): the skeleton is a consistent run of its own, with a
    # ledger of its own, whose stores happen to be ``stores_from``'s
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["privacy"]["ledger"] = str(dest / "ledger.json")
    (dest / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    meta = json.loads((meta_from / "run.json").read_text())
    meta.pop("dataset_fingerprint", None)
    meta.update(status="failed", attempts=1, config_digest=config_digest(raw))
    (dest / "run.json").write_text(json.dumps(meta))
    (dest / "private").mkdir(mode=0o700)
    (dest / "private" / "run-lock.json").write_text(json.dumps(
        {"config_digest": meta["config_digest"], "locked": locked_fields(raw)}))
    (dest / "release").mkdir()
    for name, folder in store_dirs(stores_from).items():
        shutil.copytree(folder, dest / "private" / name)
    for name in RESULT_DIRS:
        if (stores_from / "private" / name).is_dir():
            shutil.copytree(stores_from / "private" / name, dest / "private" / name)
    return dest


class KeySpy:
    """Records every release key a session is asked for (production code, observed only)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: list[str] = []
        stored, has = PrivacySession._stored, PrivacySession.has

        def spy_stored(session: PrivacySession, key: str, events: Any) -> Any:
            self.keys.append(key)
            return stored(session, key, events)

        def spy_has(session: PrivacySession, key: str) -> bool:
            found = has(session, key)
            if found:  # a stored release read back (e.g. a federated round's charge)
                self.keys.append(key)
            return found

        monkeypatch.setattr(PrivacySession, "_stored", spy_stored)
        monkeypatch.setattr(PrivacySession, "has", spy_has)

    def take(self) -> list[str]:
        keys, self.keys = self.keys, []
        return keys


def substitution_problems(run_d: Path, run_dp: Path, resume: Callable[[Path], Any],
                          tmp: Path, spy: KeySpy, ignore: frozenset[str] = frozenset()
                          ) -> list[str]:
    """Replay D and D' with D's noise; any remaining difference in release/ is unexplained."""
    base = store_records(run_d)
    replays = {}
    for tag, run in (("D", run_d), ("D'", run_dp)):
        dest = replay_skeleton(run, run_d, run_d, tmp / f"replay-{tag.replace(chr(39), 'p')}")
        spy.take()
        resume(dest)
        requested = spy.take()
        problems = []
        after = store_records(dest)
        for name, records in after.items():
            drawn = [r["key"] for r in records[len(base.get(name, [])):]]
            if drawn:
                problems.append(f"{tag} replay drew new releases in {name}: {drawn[:5]}")
        stored = [r["key"] for recs in base.values() for r in recs]
        if sorted(set(requested)) != sorted(stored):
            missing = sorted(set(stored) - set(requested))[:5]
            extra = sorted(set(requested) - set(stored))[:5]
            problems.append(f"{tag} replay asked for other keys: missing {missing}, new {extra}")
        if problems:
            return problems
        replays[tag] = shared_files(dest, ignore)
    return [f"not explained by a released value: {d}"
            for d in file_differences(replays["D"], replays["D'"])]


def private_facts(rows: list[dict[str, str]], label: str | None, user: str | None
                  ) -> tuple[dict[str, int], list[str]]:
    """Exact counts (named) and texts of a private dataset."""
    counts = {"records": len(rows)}
    if label:
        for value, n in Counter(r[label] for r in rows).items():
            counts[f"label {value}"] = n
    if user:
        users = Counter(r[user] for r in rows)
        counts["users"] = len(users)
        counts["largest user"] = max(users.values())
    return counts, [r["text"] for r in rows]


def _leaves(obj: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{path}[{i}]")
    else:
        yield path, obj


def released_numbers(run: Path) -> set[float]:
    """Every number released through the run's stores (the noisy values themselves)."""
    import numpy as np

    out: set[float] = set()
    for name, records in store_records(run).items():
        for rec in records:
            enc = rec["value"]
            if enc.get("kind") == "npy":
                data = np.load(store_dirs(run)[name] / enc["file"]).ravel().tolist()
            else:
                data = [v for _, v in _leaves(enc.get("data"))]
            out.update(float(v) for v in data
                       if isinstance(v, int | float) and not isinstance(v, bool))
    return out


def exact_value_problems(run: Path, counts: dict[str, int], texts: list[str],
                         allowed: frozenset[int] = frozenset()) -> list[str]:
    """Exact private counts (as whole-number JSON values) or private text (>= 20-character
    substrings) in release/, stats.jsonl or log.txt. ``allowed``: numbers that are public
    config values of this run (a count that equals one cannot be told apart); a number that
    is a released noisy value of the run's stores is explained by that release."""
    problems = []
    released = released_numbers(run)
    files = [p for p in (run / "release").rglob("*") if p.is_file()]
    files += [p for p in (run / "stats.jsonl", run / "log.txt", run / "eval" / "eval.json",
                          run / "eval" / "report.html") if p.is_file()]
    wanted = {n: name for name, n in counts.items() if n not in allowed}
    for path in files:
        rel = path.relative_to(run).as_posix()
        raw = path.read_bytes()
        text = raw.decode("utf-8", errors="replace")
        if rel != "log.txt":  # the operator's log is stamped; nothing shareable is
            stamp = TIME_LIKE.search(text)
            if stamp:
                problems.append(f"{rel}: a time stamp {stamp.group(0)!r}")
        for t in texts:
            for s in range(max(1, len(t) - MIN_TEXT + 1)):
                piece = t[s:s + MIN_TEXT]
                if len(piece) == MIN_TEXT and piece in text:
                    problems.append(f"{rel}: private text {piece!r}")
                    break
        docs: list[Any] = []
        if path.suffix == ".json":
            docs = [json.loads(raw)]
        elif path.suffix == ".jsonl" or path.name == "stats.jsonl":
            docs = [json.loads(line) for line in raw.splitlines() if line.strip()]
        for i, doc in enumerate(docs):
            for where, value in _leaves(doc):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    continue
                if (float(value).is_integer() and int(value) in wanted
                        and float(value) not in released):
                    problems.append(f"{rel}[{i}]{where} = {value}: exact private "
                                    f"{wanted[int(value)]}")
    return problems


# ----------------------------------------------------------------------------- data and runs

_NAMES = ["Zorvath", "Quellmir", "Brastino", "Velkaris", "Trundhelm", "Osprevan", "Mirkadel",
          "Feldrosk", "Hanvilet", "Cortaxin", "Drumbelle", "Ystravon"]


def private_rows(n: int, *, users: int = 0, extra: str = "") -> list[dict[str, str]]:
    """n records: labels billing/clinical only (23 : rest), shared words + a unique name."""
    rows = []
    for i in range(n):
        label = "billing" if i % 7 < 4 else "clinical"
        topic = ("bill insurance form refill pharmacy" if label == "billing"
                 else "doctor pain headache fever blood test")
        name = f"{_NAMES[i % len(_NAMES)]}{i:03d}"
        rows.append({"text": f"patient {name} asks about {topic} {extra}".strip(),
                     "label": label, "user": f"user{i % users}" if users else f"u{i}"})
    return rows


def write_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["text", "label", "user"])
        w.writeheader()
        w.writerows(rows)
    return path


def pe_config(method: str, data: Path, **over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "method": method,
        "data": {"path": str(data), "text": "text", "labels": ["label"],
                 "label_values": {"label": LABELS}},
        # seeded noise, one seed on both sides (research mode); RDP calibrates fast
        "privacy": {"epsilon": 4.0, "delta": 1e-5, "noise": "seeded", "seed": 4242,
                    "accountant": "rdp"},
        "generators": [{"model": "fake-g0", "max_new_tokens": 24}],
        "embedder": {"model": "fake"},
        "prompts": {"task": "a short patient message", "label_template": "about {label}"},
        "synthesis": {"samples": 9, "iterations": 2, "pool_multiplier": 2, "retries": 1,
                      "population": 9},  # sized votes: test_aug_pe_sized_votes_neighbours
    }
    for dotted, value in over.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def own_ledger(cfg: dict[str, Any], out: Path) -> dict[str, Any]:
    """``cfg`` with a ledger of the run's own: the neighbouring runs here use one seed on
    purpose (the same noise on D and D'), which one shared ledger refuses."""
    privacy = {"ledger": str(out.parent / f"{out.name}.ledger.json"), **cfg["privacy"]}
    return {**cfg, "privacy": privacy}


def run_pe(cfg: dict[str, Any], out: Path, *, resume: bool = False) -> Path:
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config

    gens = [FakeGenerator(g["model"], seed=i) for i, g in enumerate(cfg["generators"])]
    config: Any = out if resume else parse_config(own_ledger(cfg, out))
    return Path(run_generation(config, out, resume=resume, progress=False, generators=gens,
                               embedder=FakeEmbedder()))


@pytest.fixture(autouse=True)
def _ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))


def check_neighbours(tmp: Path, spy: KeySpy, make_cfg: Callable[[Path], dict[str, Any]],
                     rows_d: list[dict[str, str]], rows_dp: list[dict[str, str]],
                     run: Callable[[dict[str, Any], Path], Path],
                     resume: Callable[[Path], Any], *, user: bool = False,
                     allowed: frozenset[int] = frozenset(),
                     ignore: frozenset[str] = frozenset(), strict_keys: bool = True,
                     allowed_shape: frozenset[str] = frozenset()) -> list[str]:
    """All four checks for one method on D and D'; returns the problems found.
    ``allowed_shape``: keys whose shape is post-processing of an earlier release (Aug-PE's
    votes, on a population sized from the released record count): they may differ in shape
    between D and D' (the substitution check, on D's noise, still needs them equal)."""
    runs = {}
    for tag, rows in (("d", rows_d), ("dp", rows_dp)):
        cfg = make_cfg(write_csv(tmp / f"{tag}.csv", rows))
        runs[tag] = run(cfg, tmp / f"run-{tag}")
    problems = [p for p in structure_problems(runs["d"], runs["dp"], strict_keys)
                if not any(f"key {k!r} released with another shape" in p for k in allowed_shape)]
    problems += substitution_problems(runs["d"], runs["dp"], resume, tmp, spy, ignore)
    problems += fresh_plan_problems(tmp, make_cfg, rows_d, rows_dp, run, strict_keys,
                                    allowed_shape, user=user, allowed=allowed)
    for tag, rows in (("d", rows_d), ("dp", rows_dp)):
        counts, texts = private_facts(rows, "label", "user" if user else None)
        problems += exact_value_problems(runs[tag], counts, texts, allowed)
    return problems


class PlanSpy:
    """Records the public parameters the production code computes for a run beside its noise
    events (the SecAgg+ clipping range, grid and modulus), observed only."""

    def __init__(self) -> None:
        self.plans: list[Any] = []

    def __enter__(self) -> PlanSpy:
        import dpsynth.federated.simulation as sim

        self._sim, self._real = sim, sim.plan_quantisation

        def spy(*args: Any, **kwargs: Any) -> Any:
            plan = self._real(*args, **kwargs)
            self.plans.append(plan)
            return plan

        sim.plan_quantisation = spy
        return self

    def __exit__(self, *exc: Any) -> None:
        self._sim.plan_quantisation = self._real

    def take(self) -> list[Any]:
        plans, self.plans = self.plans, []
        return plans


#: the JSON values compared across fresh plans: privacy.json whole; elsewhere the fields that
#: hold parameters (noise scales, pool and quota sizes, the iteration), not released choices
PARAMETER_KEYS = frozenset({"method", "epsilon", "delta", "clip", "samples", "requested",
                            "iteration", "stage", "noise_sigma", "sigma_h", "noise_floor",
                            "candidates", "kept", "representatives"})


def _flat(run: Path) -> dict[str, Any]:
    """The parameter leaves of a run's shareable JSON (privacy.json: every leaf)."""
    out: dict[str, Any] = {}
    for rel in ("release/privacy.json", "release/summary.json", "stats.jsonl",
                "eval/eval.json"):
        path = run / rel
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines() if rel.endswith(".jsonl") \
            else [path.read_text(encoding="utf-8")]
        for i, line in enumerate(x for x in lines if x.strip()):
            doc = _normalise(json.loads(line), VOLATILE_KEYS)
            for where, value in _leaves(doc):
                last = where.rsplit(".", 1)[-1].split("[")[0]
                if rel == "release/privacy.json" or last in PARAMETER_KEYS:
                    out[f"{rel}[{i}]{where}"] = value
    return out


def _with_seed(cfg: dict[str, Any], seed: int, ledger: Path) -> dict[str, Any]:
    # three runs on one source knowingly go past the default cap (10): the seed check needs
    # them on one ledger, and privacy.no_cap is how an operator says so
    privacy = {**cfg["privacy"], "seed": seed, "ledger": str(ledger), "no_cap": True}
    return {**cfg, "privacy": privacy}


def fresh_plan_problems(tmp: Path, make_cfg: Callable[[Path], dict[str, Any]],
                        rows_d: list[dict[str, str]], rows_dp: list[dict[str, str]],
                        run: Callable[[dict[str, Any], Path], Path], strict_keys: bool = True,
                        allowed_shape: frozenset[str] = frozenset(), user: bool = False,
                        allowed: frozenset[int] = frozenset()) -> list[str]:
    """D twice and D' once, each with a fresh plan and fresh noise (no value replayed), all
    charged to one ledger: whatever is equal in D's two runs is not drawn noise, and must be
    equal in D''s (noise scales and events, the SecAgg+ grid and modulus, clip norms, pool and
    quota parameters, the number and names of releases, privacy.json, eval.json). And the
    seed of D's run is refused on D' (one ledger: a seed is never reused, on any data)."""
    from dpsynth.privacy import BudgetLedger, BudgetRefusedError

    ledger = tmp / "fresh.ledger.json"
    paths = {tag: write_csv(tmp / f"fresh-{tag}.csv", rows)
             for tag, rows in (("d", rows_d), ("dp", rows_dp))}
    runs, plans, problems = {}, {}, []
    with PlanSpy() as plan_spy:
        for tag, data, seed in (("a", "d", 1001), ("b", "d", 1002), ("p", "dp", 1003)):
            runs[tag] = run(_with_seed(make_cfg(paths[data]), seed, ledger), tmp / f"fresh-{tag}")
            plans[tag] = plan_spy.take()
            if tag == "a" and BudgetLedger(ledger).entries():  # noise was drawn: a seed
                try:
                    run(_with_seed(make_cfg(paths["dp"]), 1001, ledger), tmp / "fresh-reuse")
                    problems.append("the seed of a run on D was accepted on D' (finding 4)")
                except BudgetRefusedError as err:
                    if "identical noise" not in str(err):
                        raise
    for tag in runs:
        if (runs[tag] / "release" / "synthetic.jsonl").is_file():
            _evaluate(runs[tag])  # the three eval.json are compared (_flat)
            if tag != "b":  # the reports of a and p are searched below; b's is never read
                _report(runs[tag])
    for tag, rows in (("a", rows_d), ("p", rows_dp)):  # the report and eval.json too
        counts, texts = private_facts(rows, "label", "user" if user else None)
        problems += [f"fresh plans: {p}" for p in
                     exact_value_problems(runs[tag], counts, texts, allowed)]
    if [vars(p) for p in plans["a"]] != [vars(p) for p in plans["p"]]:
        problems.append(f"public plans (grid, modulus) differ: {plans['a']} vs {plans['p']}")
    # keys that differ between D's own two runs (a text's length in tokens) are noise too
    strict = strict_keys and not any("release keys differ" in q for q in
                                     structure_problems(runs["a"], runs["b"]))
    problems += [f"fresh plans: {p}" for p in structure_problems(runs["a"], runs["p"], strict)
                 if not any(f"key {k!r} released with another shape" in p
                            for k in allowed_shape)]
    a, b, dp = (_flat(runs[t]) for t in ("a", "b", "p"))
    for where, value in a.items():
        if b.get(where, _MISSING) != value:
            continue  # drawn noise (or post-processing of it): differs between D's runs too
        if dp.get(where, _MISSING) != value:
            problems.append(f"fresh plans: {where} = {value!r} on D (both noise draws) but "
                            f"{dp.get(where, '(absent)')!r} on D': not a function of noise")
    return problems


_MISSING = object()


def _report(run: Path) -> None:
    """The shareable eval/report.html of a run (rendered, never opened in a browser here)."""
    from dpsynth.eval.report import write_report

    write_report(run)


def _evaluate(run: Path) -> None:
    """eval/eval.json of a run, with the fake embedder against a public test file of every
    declared label (a small run's release may hold one label only, the one no record has)."""
    from dpsynth.eval.suite import EvalOptions, evaluate_run

    data = yaml.safe_load((run / "config.yaml").read_text())["data"]
    labels = (data.get("label_values") or {}).get("label") or LABELS[:2]
    test = write_csv(run / "public-test.csv", [
        {"text": f"public test message {i} about {labels[i % len(labels)]}",
         "label": labels[i % len(labels)], "user": "t"} for i in range(12)])
    evaluate_run(run, test, EvalOptions(with_mauve=False, with_audits=False,
                                        classifier="logreg"), embedder=FakeEmbedder())


# ----------------------------------------------------------------------------- the checker, tested


def _fake_run(root: Path, release: dict[str, Any], keys: list[str], value: float = 1.0) -> Path:
    (root / "private" / "releases").mkdir(parents=True)
    (root / "release").mkdir()
    lines = [json.dumps({"key": k, "events": [{"type": "gaussian", "sigma": 2.0}],
                         "value": {"kind": "float", "data": value}}) for k in keys]
    (root / "private" / "releases" / "releases.jsonl").write_text("\n".join(lines) + "\n")
    for name, obj in release.items():
        (root / "release" / name).write_text(json.dumps(obj))
    return root


def test_checker_flags_data_dependent_structure_and_exact_values(tmp_path):
    a = _fake_run(tmp_path / "a", {"summary.json": {"documents": 61, "wall_seconds": 3.2}},
                  ["hist", "cluster/0000"])
    b = _fake_run(tmp_path / "b", {"summary.json": {"documents": 62, "wall_seconds": 9.9}},
                  ["hist", "cluster/0000", "cluster/0001"])
    assert any("release keys differ" in p for p in structure_problems(a, b))
    assert structure_problems(a, a) == []
    diff = file_differences(shared_files(a), shared_files(b))
    assert len(diff) == 1 and "documents" in diff[0]  # wall_seconds is normalised away
    rows = private_rows(61)
    counts, texts = private_facts(rows, "label", None)
    found = exact_value_problems(a, counts, texts)
    assert any("exact private records" in p for p in found), found
    (a / "release" / "kb.jsonl").write_text(json.dumps({"text": "x " + rows[3]["text"]}) + "\n")
    assert any("private text" in p for p in exact_value_problems(a, counts, texts))
    clean = _fake_run(tmp_path / "c", {"summary.json": {"clusters": 3}}, ["hist"])
    assert exact_value_problems(clean, counts, texts) == []
    # an integer noisy count that happens to equal an exact one is explained by its release
    noisy = _fake_run(tmp_path / "n", {"summary.json": {"top": 61}}, ["hist"], value=61.0)
    assert exact_value_problems(noisy, counts, texts) == []


def test_fakes_are_deterministic_and_meaningful():
    from dpsynth.llm import GenerationRequest, SamplingParams

    gen = FakeGenerator("x", fail_every=3)
    reqs = [GenerationRequest("write about a fever", SamplingParams(seed=s)) for s in (1, 2, 1)]
    out = gen.generate(reqs)
    assert out[0] and out[1] and out[0] != out[1] and out[2] == ""
    assert FakeGenerator("x").generate(reqs[:1]) == out[:1]
    # words come from the public list only, never from the prompt
    assert set(out[0].lower().rstrip(".").split()) <= set(WORDS)
    secret = FakeGenerator("x").generate([GenerationRequest("Zorvath123 Quellmir says hi")])[0]
    assert "zorvath" not in secret.lower() and "quellmir" not in secret.lower()
    emb = FakeEmbedder().embed(["fever and cough today", "cough and fever", "bill insurance"])
    assert abs(float((emb ** 2).sum(axis=1).max()) - 1) < 1e-5
    assert emb[0] @ emb[1] > emb[0] @ emb[2]
    with gen.open_stepper(["doc one", "doc two"], shared_prefix="Rephrase:\n") as st:
        first = st.logits()
        st.advance(3)
        assert first.shape == (2, gen.vocab_size) and not (st.logits() == first).all()


# ----------------------------------------------------------------------------- per method


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> KeySpy:
    return KeySpy(monkeypatch)


def _resume_pe(path: Path) -> Path:
    return run_pe({"generators": _generators_of(path)}, path, resume=True)


def _generators_of(path: Path) -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load((path / "config.yaml").read_text())["generators"]


# Public config values a count may coincide with (they are not leaks).
PE_PUBLIC = frozenset({0, 1, 2, 3, 4, 8, 9, 12, 18, 24})


def test_aug_pe_record_neighbours(tmp_path, spy):
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks to schedule a new visit tomorrow morning",
             "label": "scheduling", "user": "u-new"}  # the only 'scheduling' record
    problems = check_neighbours(tmp_path, spy, lambda p: pe_config("aug_pe", p), rows,
                                rows + [extra], run_pe, _resume_pe, allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)


def test_aug_pe_sized_votes_neighbours(tmp_path, spy):
    """Aug-PE's defaults: the voting population and the texts' length come from the released
    (label x length) histogram, so the votes' shape may differ between D and D' (never on D's
    noise) and nothing else does."""
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks to schedule a new visit tomorrow morning",
             "label": "scheduling", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("aug_pe", p, **{"synthesis.population": None,
                                         "synthesis.samples": 30})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC | {30, 60},
                                allowed_shape=frozenset({"iter0/votes", "iter1/votes"}))
    assert problems == [], "\n".join(problems)


def test_wasp_sized_votes_neighbours(tmp_path, spy):
    """WASP's default: each vote is on a sample of the pool sized from the released label
    counts (30 samples over 3 rounds against 61 records: fewer than the pool), so the votes'
    shape may differ between D and D' (never on D's noise) and nothing else does."""
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash since last week",
             "label": "clinical", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}, {"model": "fake-g1"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2,
                            "synthesis.population": None, "synthesis.samples": 30})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC | {30},
                                allowed_shape=frozenset({"iter0/topq",
                                                         "iter1/topq"}))
    assert problems == [], "\n".join(problems)


def test_aug_pe_user_neighbours(tmp_path, spy):
    rows = private_rows(69, users=23)  # 3 records per user
    new_user = [{"text": f"patient Quorrin{j} asks about the bill and the insurance form",
                 "label": "billing", "user": "user-new"} for j in range(3)]
    problems = check_neighbours(
        tmp_path, spy, lambda p: pe_config("aug_pe", p, **{"privacy.unit": "user",
                                                          "data.user": "user"}),
        rows, rows + new_user, run_pe, _resume_pe, user=True, allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)


def test_wasp_record_neighbours(tmp_path, spy):
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash since last week",
             "label": "clinical", "user": "u-new"}

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("wasp", p, generators=[{"model": "fake-g0"}, {"model": "fake-g1"}],
                         **{"wasp.top_q": 3, "wasp.demonstrations": 2})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)


def test_federated_round_is_charged_before_parties_are_contacted(tmp_path, monkeypatch):
    """Bug 5: a federated round is a release the moment the server sees the sum, so a budget
    that cannot take it must refuse it before any party is contacted. The run resumes with a
    store whose budget is already spent elsewhere; no Flower round may start."""
    import dpsynth.federated as federated
    from dpsynth.config import dump_config, parse_config
    from dpsynth.privacy import BudgetExceededError, GaussianEvent

    contacted: list[int] = []

    def no_round(*args: Any, **kwargs: Any) -> Any:
        contacted.append(1)
        raise AssertionError("a federated round started although the budget cannot take it")

    monkeypatch.setattr(federated, "federated_noisy_histogram", no_round)
    cfg = pe_config("wasp", write_csv(tmp_path / "d.csv", private_rows(61)),
                    generators=[{"model": "fake-g0"}],
                    **{"wasp.top_q": 3, "wasp.demonstrations": 2, "wasp.federated.parties": 3,
                       "synthesis.iterations": 1, "data.labels": [], "data.label_values": {},
                       "prompts.label_template": ""})
    run = tmp_path / "run"
    (run / "private" / "releases").mkdir(parents=True)
    (run / "release").mkdir()
    (run / "config.yaml").write_text(dump_config(parse_config(cfg)))
    (run / "run.json").write_text(json.dumps({"run_id": "spent", "method": "wasp",
                                              "status": "failed", "attempts": 1}))
    spent = {"key": "elsewhere", "events": [GaussianEvent(0.3, 1.0).to_dict()],
             "value": {"kind": "none"}, "noise": "seeded", "format": 2}
    (run / "private" / "releases" / "releases.jsonl").write_text(json.dumps(spent) + "\n")
    with pytest.raises(BudgetExceededError):
        run_pe({"generators": cfg["generators"]}, run, resume=True)
    assert contacted == []


# SecPE's noise scale is calibrated from the secrets in the private data (SecretNoise, as in the
# paper; docs/methods.md §3), so its privacy EVENTS differ between neighbours. That scale is
# therefore never released: it must be absent from release/ and stats.jsonl, and the events
# (kept in private/) are the one allowed difference.


def test_secpe_secret_neighbours(tmp_path, spy):
    rows = private_rows(61)
    holders = (2, 9, 16, 30, 41, 57)  # records holding a secret (an account number)
    for i in holders:
        rows[i]["text"] += f" account ACCT-{7100 + i}"
    extra = {"text": "patient Wexhollow asks about the bill for account ACCT-9913",
             "label": "billing", "user": "u-new"}  # one new secret

    def cfg(p: Path) -> dict[str, Any]:
        return pe_config("secpe", p, **{"secpe.secrets": [{"kind": "regex",
                                                           "pattern": r"ACCT-\d{4}"}],
                                        "secpe.clusters": 4, "secpe.clip": 0.5,
                                        "synthesis.iterations": 1,  # calibration is slow
                                        "secpe.discretization": 1e-2})

    problems = check_neighbours(tmp_path, spy, cfg, rows, rows + [extra], run_pe, _resume_pe,
                                allowed=PE_PUBLIC)
    # the exact number of records (and secrets) with a secret is private too
    for tag, n in (("d", len(holders)), ("dp", len(holders) + 1)):
        problems += exact_value_problems(tmp_path / f"run-{tag}", {"secret holders": n}, [],
                                         PE_PUBLIC)
    # by design the events differ (data-dependent calibration); everything else must match
    problems = [p for p in problems if "/representatives' released with other events" not in p]
    assert problems == [], "\n".join(problems)
    for tag in ("d", "dp"):
        privacy = json.loads((tmp_path / f"run-{tag}" / "release" / "privacy.json").read_text())
        assert privacy["noise_multiplier"] is None
        assert "noise_sigma" not in privacy["secret_protection"]
        assert all(set(m) == {"name", "count"} for m in privacy["mechanisms"])
        stats = (tmp_path / f"run-{tag}" / "stats.jsonl").read_text()
        assert "noise_sigma" not in stats


def _dp_finetune_config(model_dir: Path, **section: Any) -> Callable[[Path], dict[str, Any]]:
    """dp_finetune on the tiny random Llama (SmolLM2's tokenizer) at user level: 16 users
    declared (public; D has 12, D' 13), 4 expected a step, at most 4 records each."""

    def make(p: Path) -> dict[str, Any]:
        return pe_config("dp_finetune", p, **{
            "privacy.unit": "user", "data.user": "user",
            "generators": [{"model": str(model_dir)}],
            "dp_finetune": {"secure_mode": False, "users": 16, "batch_size": 4,
                            "max_records_per_user": 4, "max_tokens": 16, "samples": 2,
                            "max_new_tokens": 4, **section}})

    return make


def test_dp_finetune_user_neighbours(tmp_path, spy):
    """User-level DP-SGD (issue 45): D' adds one user with 5 records (4 of them train, the
    first in file order). Both runs release the same events (the user-level label counts, T
    steps at q = 4 / 16 users); replayed on D's releases and D's checkpoint (the adapter,
    post-processing of the noisy gradients) release/ is byte-identical; fresh plans agree on
    everything but the noise; no exact count or private text reaches release/, stats, the log,
    eval/ or the shareable report; and the statement says user-level."""
    from test_dp_finetune import _tiny_model_dir

    make = _dp_finetune_config(_tiny_model_dir(tmp_path / "model"))
    rows = private_rows(40, users=10)  # 4 records per user
    new_user = [{"text": f"patient Quorrin{j} asks about the bill and the insurance form",
                 "label": "billing", "user": "user-new"} for j in range(5)]
    public = frozenset({0, 1, 2, 4, 16, 20})  # the config's numbers (20: label_count_sigma)
    problems = check_neighbours(tmp_path, spy, make, rows, rows + new_user, run_pe,
                                _resume_pe, user=True, allowed=public)
    assert problems == [], "\n".join(problems)
    privacy = json.loads((tmp_path / "run-dp" / "release" / "privacy.json").read_text())
    assert privacy["unit"] == "user" and privacy["training"]["privacy_unit"] == "user"
    assert [m["name"] for m in privacy["mechanisms"]] == ["label_counts", "dp_sgd"]
    assert privacy["mechanisms"][1]["sampling_rate"] == 0.25


def test_zero_shot_releases_nothing_private(tmp_path, spy):
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks to schedule a new visit tomorrow morning",
             "label": "scheduling", "user": "u-new"}
    problems = check_neighbours(tmp_path, spy, lambda p: pe_config("zero_shot", p), rows,
                                rows + [extra], run_pe, _resume_pe, allowed=PE_PUBLIC)
    assert problems == [], "\n".join(problems)


# ----------------------------------------------------------------------------- DP-SynRAG

RAG_VOCAB = ["bill", "insurance", "pharmacy", "doctor", "pain", "headache", "fever", "blood",
             "visit", "skin", "rash", "schedule"]


def rag_config(data: Path, **over: Any) -> dict[str, Any]:
    cfg = pe_config("synrag", data)
    cfg["privacy"]["accountant"] = "zcdp"
    cfg["synrag"] = {"vocabulary": RAG_VOCAB, "keyword_extractor": "vocabulary",
                     "keywords_per_doc": 2, "clusters": 3, "overlap": 2, "target_size": 3,
                     "tokens": 5, "max_doc_tokens": 32, **over}
    return cfg


def run_rag(cfg: dict[str, Any], out: Path, *, resume: bool = False) -> Path:
    from dpsynth.api import build_kb
    from dpsynth.config import parse_config

    config: Any = out if resume else parse_config(own_ledger(cfg, out))
    return Path(build_kb(config, out, resume=resume, generator=FakeGenerator("fake-g0"),
                         embedder=FakeEmbedder()))


RAG_PUBLIC = frozenset({0, 1, 2, 3, 4, 5, 9, 12, 24, 32})


def test_dp_synrag_user_neighbours(tmp_path, spy):
    """User level: each user's records are joined into one document; D' adds one user."""
    rows = private_rows(69, users=23)
    new_user = [{"text": f"patient Quorrin{j} asks about a skin rash and a fever this week",
                 "label": "clinical", "user": "user-new"} for j in range(3)]

    def cfg(p: Path) -> dict[str, Any]:
        c = rag_config(p)
        c["privacy"]["unit"] = "user"
        c["data"]["user"] = "user"
        return c

    problems = check_neighbours(
        tmp_path, spy, cfg, rows, rows + new_user, run_rag,
        lambda path: run_rag({}, path, resume=True), user=True, allowed=RAG_PUBLIC,
        strict_keys=False)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("shortcut", [False, True], ids=["tokens", "public-shortcut"])
def test_dp_synrag_record_neighbours(tmp_path, spy, shortcut):
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash and fever since last week",
             "label": "clinical", "user": "u-new"}
    problems = check_neighbours(
        tmp_path, spy, lambda p: rag_config(p, public_shortcut=shortcut), rows, rows + [extra],
        run_rag, lambda path: run_rag({}, path, resume=True), allowed=RAG_PUBLIC,
        strict_keys=False)
    assert problems == [], "\n".join(problems)


def test_dp_synth_baseline_neighbours_and_token_charge(tmp_path, spy):
    """DP-Synth (baseline) runs through the runner, so it resumes like every method: the same
    three checks on D and D'; and every private token drawn must be charged in the run's
    session (the shortcut option must not shrink the charge of a baseline that never uses
    the shortcut)."""
    from dpsynth.config import parse_config
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from rag_baselines import build_dp_synth_kb  # research code, outside the package

    def run(cfg: dict[str, Any], out: Path, resume: bool = False) -> Path:
        config: Any = out if resume else parse_config(own_ledger(cfg, out))
        return Path(build_dp_synth_kb(config, out, generator=FakeGenerator("fake-g0"),
                                      embedder=FakeEmbedder(), resume=resume))

    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks about a skin rash and fever since last week",
             "label": "clinical", "user": "u-new"}
    problems = check_neighbours(
        tmp_path, spy, lambda p: rag_config(p, public_shortcut=True), rows, rows + [extra],
        run, lambda path: run({}, path, resume=True), allowed=RAG_PUBLIC)
    assert problems == [], "\n".join(problems)
    runs = {"d": tmp_path / "run-d"}
    # every drawn private token is charged: tokens per subset <= charged token count
    stores = store_records(runs["d"])
    charged = [e for r in stores["releases"] for e in r["events"]
               if "token" in json.dumps(e)]
    assert charged, stores["releases"]
    per_subset = Counter(r["key"].split("/tok")[0] for r in stores["subset-releases"]
                         if "/tok" in r["key"])
    limit = max(int(e.get("count", 1)) * int((e.get("inner") or {}).get("count", 1))
                for e in charged)
    assert max(per_subset.values()) <= limit, (per_subset, charged)


# ----------------------------------------------------------------------------- default noise


def test_default_noise_is_secure_and_fresh(tmp_path):
    """Bug 1: with the default config the noise is 'secure' (privacy.json says so) and two
    runs of the same config on the same data release different noisy values."""
    rows = private_rows(61)
    data = write_csv(tmp_path / "d.csv", rows)
    cfg = pe_config("aug_pe", data, **{"synthesis.iterations": 1})
    cfg["privacy"] = {"epsilon": 4.0, "delta": 1e-5}  # defaults for noise and seed
    a = run_pe(cfg, tmp_path / "a")
    b = run_pe(cfg, tmp_path / "b")
    privacy = json.loads((a / "release" / "privacy.json").read_text())
    assert privacy["noise"] == "secure"
    va = [r["value"] for r in store_records(a)["releases"]]
    vb = [r["value"] for r in store_records(b)["releases"]]
    assert va and va != vb


# ----------------------------------------------------------------------------- label discovery
# data.label_domain: discover releases a noisy count of every value PRESENT (docs/methods.md
# §0), so a neighbour holding values nobody else holds changes the shape of that one release,
# kept in private/. The stability argument: apart from those values' own noisy counts, which
# pass the threshold with probability <= delta_discover, the output is a function of noisy
# counts of values present in both. The check below replays D' with D's noise for every
# release, D's noisy counts for the shared values and D' own for the extra ones, and asks for
# release/ byte for byte D's.

DISCOVERY_KEY = "label_domain/label"
RARE = "rare-diagnosis-code-"  # >= 20 characters: a leak of the value is a text finding


def _discovery_cfg(data: Path) -> dict[str, Any]:
    cfg = pe_config("aug_pe", data, **{
        "privacy.unit": "user", "data.user": "user", "data.label_domain": "discover",
        "data.label_domain_sigma": 2.5, "synthesis.iterations": 1})
    del cfg["data"]["label_values"]
    return cfg


def _present_values(rows: list[dict[str, str]], k: int) -> list[str]:
    """The values a run's discovery counts (sorted; at most k per user), as the engines do."""
    from dpsynth.label_domain import value_counts

    return value_counts([r["label"] for r in rows], [r["user"] for r in rows], k)[0]


def _splice_discovery(dest: Path, run_dp: Path, names_d: list[str], names_dp: list[str]
                      ) -> None:
    """In ``dest`` (D's stores), the discovery release becomes D''s shape: D's noisy counts of
    the values present in D, ``run_dp``'s own noisy counts of the values only D' holds."""
    def noisy(run: Path) -> list[float]:
        rec = next(r for r in store_records(run)["releases"] if r["key"] == DISCOVERY_KEY)
        assert rec["value"]["kind"] == "array", rec["value"]["kind"]
        return rec["value"]["data"]

    of_d = dict(zip(names_d, noisy(dest), strict=True))
    of_dp = dict(zip(names_dp, noisy(run_dp), strict=True))
    spliced = [of_d.get(n, of_dp[n]) for n in names_dp]
    path = dest / "private" / "releases" / "releases.jsonl"
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if rec["key"] == DISCOVERY_KEY:
            rec["value"].update(data=spliced, shape=[len(spliced)])
        lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def discovery_problems(tmp: Path, spy: KeySpy, rows_d: list[dict[str, str]],
                       rows_dp: list[dict[str, str]], k: int) -> list[str]:
    """The three checks for discovery neighbours, with the one by-design difference (the
    shape of the discovery release) checked for exactly that and replayed by splicing."""
    runs = {tag: run_pe(_discovery_cfg(write_csv(tmp / f"{tag}.csv", rows)), tmp / f"run-{tag}")
            for tag, rows in (("d", rows_d), ("dp", rows_dp))}
    names = {"d": _present_values(rows_d, k), "dp": _present_values(rows_dp, k)}
    problems = [p for p in structure_problems(runs["d"], runs["dp"])
                if f"key {DISCOVERY_KEY!r} released with another shape" not in p]
    base = store_records(runs["d"])
    stored = sorted(r["key"] for recs in base.values() for r in recs)
    replays = {}
    for tag in ("d", "dp"):
        dest = replay_skeleton(runs[tag], runs["d"], runs["d"], tmp / f"replay-{tag}")
        if tag == "dp":
            _splice_discovery(dest, runs["dp"], names["d"], names["dp"])
        spy.take()
        try:
            _resume_pe(dest)
        except PrivacyError as err:  # D's releases do not fit D''s label classes
            problems.append(f"{tag} replay failed: {err}")
            continue
        requested = spy.take()
        if sorted(set(requested)) != stored:
            problems.append(f"{tag} replay asked for other keys: {sorted(set(requested))}")
        for name, records in store_records(dest).items():
            if len(records) != len(base.get(name, [])):
                problems.append(f"{tag} replay drew new releases in {name}")
        replays[tag] = shared_files(dest)
    if len(replays) == 2:
        problems += [f"not explained by a released value: {d}"
                     for d in file_differences(replays["d"], replays["dp"])]
    problems += fresh_plan_problems(tmp, _discovery_cfg, rows_d, rows_dp, run_pe, user=True,
                                    allowed_shape=frozenset({DISCOVERY_KEY}),
                                    allowed=PE_PUBLIC)
    for tag, rows in (("d", rows_d), ("dp", rows_dp)):
        counts, texts = private_facts(rows, "label", "user")
        counts["values present"] = len(names[tag])
        problems += exact_value_problems(runs[tag], counts, texts + [r["label"] for r in rows],
                                         PE_PUBLIC)
    return problems


def _rare_user_rows(m: int) -> list[dict[str, str]]:
    return [{"text": f"patient Quorrin{j} asks about the results of a very rare test",
             "label": f"{RARE}{j:04d}", "user": "user-rare"} for j in range(m)]


def test_discovery_user_with_many_rare_values_neighbours(tmp_path, spy):
    """D' adds one user holding 12 label values nobody else holds (user level, discovery):
    only the shape of the discovery release (private) differs, release/ is D's once those
    values' own noisy counts are left below the threshold, and no value of theirs, count of
    values present or other exact count reaches release/, stats.jsonl or the log."""
    rows = private_rows(120, users=40)  # 3 records per user
    k = 4  # data.label_domain_max_values_per_user, the default
    assert len(_present_values(rows + _rare_user_rows(12), k)) == 2 + k  # bounded to k values
    problems = discovery_problems(tmp_path, spy, rows, rows + _rare_user_rows(12), k)
    assert problems == [], "\n".join(problems)
    domains = [json.loads((tmp_path / f"run-{t}" / "release" / "privacy.json").read_text())[
        "label_domain"] for t in ("d", "dp")]
    assert domains[0] == domains[1]  # same kept values, threshold, noise and k
    assert domains[0]["values"] == {"label": ["billing", "clinical"]}
    assert domains[0]["max_values_per_user"] == k


def test_discovery_check_fails_when_a_users_own_values_pass(tmp_path, spy, monkeypatch):
    """The check can fail: with a threshold that one user's values pass (0), D' releases
    them."""
    import dpsynth.label_domain as label_domain

    monkeypatch.setattr(label_domain, "discovery_threshold", lambda *args: 0.0)
    rows = private_rows(120, users=40)  # 3 records per user
    assert discovery_problems(tmp_path, spy, rows, rows + _rare_user_rows(12), 4)


# ----------------------------------------------------------------------------- the checker fails


def _exact_count_in_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """Like DP-SynRAG's old summary.json `documents`: an exact size in release/."""
    from dpsynth.methods.pe import PEMethod

    original = PEMethod.statement

    def statement(self: Any, job: Any, outcome: Any) -> dict[str, Any]:
        return {**original(self, job, outcome), "records": len(job.dataset)}

    monkeypatch.setattr(PEMethod, "statement", statement)


def _label_domain_from_records(monkeypatch: pytest.MonkeyPatch) -> None:
    """The old behaviour of bug 3: the label classes are the values seen in the records."""
    import dpsynth.data as data

    original = data.load_dataset

    def load_dataset(path: Any, text: str, labels: Any = (), *args: Any, **kwargs: Any) -> Any:
        with open(path, newline="", encoding="utf-8") as fh:
            seen = list(csv.DictReader(fh))
        domain = {c: sorted({r[c] for r in seen}) for c in labels}
        return original(path, text, labels, *args, **{**kwargs, "label_values": domain})

    monkeypatch.setattr(data, "load_dataset", load_dataset)


def _seed_tag_per_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 4: the seed tag was keyed per dataset fingerprint, so D' (another fingerprint)
    never met D's tag and took the same seed."""
    import dpsynth.privacy.ledger as ledger

    def per_run(data: Any, key: bytes, run_id: str, seed: int | None) -> str | None:
        return None if seed is None else ledger._keyed(key, "seed", f"{seed}/{run_id}")

    monkeypatch.setattr(ledger, "_seed_tag", per_run)


@pytest.mark.parametrize("mutant", [_exact_count_in_summary, _label_domain_from_records,
                                    _seed_tag_per_dataset],
                         ids=["exact-count", "label-domain-from-records", "seed-per-dataset"])
def test_checker_fails_on_known_bugs(tmp_path, spy, monkeypatch, mutant):
    mutant(monkeypatch)
    rows = private_rows(61)
    extra = {"text": "patient Wexhollow asks to schedule a new visit tomorrow morning",
             "label": "scheduling", "user": "u-new"}
    try:
        problems = check_neighbours(
            tmp_path, spy, lambda p: pe_config("aug_pe", p, **{"synthesis.iterations": 1}),
            rows, rows + [extra], run_pe, _resume_pe, allowed=PE_PUBLIC)
    except Exception as err:  # noqa: BLE001  (a replay that cannot even run also fails)
        problems = [f"replay failed: {type(err).__name__}: {err}"]
    assert problems, "the checker missed a data-dependent release"
    if mutant is _seed_tag_per_dataset:
        assert any("finding 4" in p for p in problems), problems


# ----------------------------------------------------------------------------- rows apart
#: Public sizes that keep each method's default configuration fast on the fakes (how many
#: clusters, tokens, iterations; a public vocabulary where the default reads a real tokenizer;
#: SecPE's regex secret where the default loads spaCy). None of them chooses which model
#: passes a method makes; a method without an entry runs its defaults as they are.
CENSUS_SIZES: dict[str, dict[str, Any]] = {
    "secpe": {"secpe.secrets": [{"kind": "regex", "pattern": r"ACCT-\d{4}"}],
              "secpe.clusters": 4, "secpe.clip": 0.5, "secpe.discretization": 1e-2,
              "synthesis.iterations": 1},
    "synrag": {"privacy.accountant": "zcdp", "synrag.vocabulary": RAG_VOCAB,
               "synrag.clusters": 3, "synrag.overlap": 2, "synrag.target_size": 3,
               "synrag.tokens": 5, "synrag.max_doc_tokens": 32},
}


def census_run(name: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The private-record passes ``name``'s default configuration makes: the run on fakes
    wrapped in :class:`test_rows_apart.Recording`, and SecPE's secret detection watched, noting
    every call that carries a private record (its unique name) with the production functions
    on the stack."""
    import dpsynth.secrets as secrets
    from dpsynth.config import parse_config
    from dpsynth.methods import method_class
    from test_rows_apart import PassCall, Recording, production_frames, texts_in

    rows = private_rows(21)
    for i in (2, 9, 16):
        rows[i]["text"] += f" account ACCT-{7100 + i}"
    names = [r["text"].split()[1] for r in rows]  # each record's unique name
    calls: list[PassCall] = []
    private_ids: list[tuple[int, ...]] = []

    def holds(text: str) -> bool:
        return any(n in text for n in names)

    def private(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if any(holds(t) for t in texts_in([args, kwargs])):
            return True
        id_rows = args[0] if args else kwargs.get("rows", ())  # next_token_logits_ids
        return any(isinstance(r, list | tuple) and _contains_ids(list(r), private_ids)
                   for r in (id_rows if isinstance(id_rows, list | tuple) else ()))

    def watched(fn: Callable[..., Any]) -> Callable[..., Any]:
        def detect(texts: Any, *args: Any, **kwargs: Any) -> Any:
            if any(holds(t) for t in texts_in(list(texts))):
                calls.append(PassCall("secrets", fn.__name__, production_frames()
                                      | {f"dpsynth.secrets:{fn.__name__}"}))
            return fn(texts, *args, **kwargs)
        return detect

    if name == "dp_finetune":  # DP-SGD's per-record gradients: the pass over the records
        from dpsynth.methods.dpfinetune.train import DPSGD
        from test_dp_finetune import _tiny_model_dir

        clipped_sum = DPSGD.clipped_sum

        def training(self: Any, rows: Any) -> Any:
            if len(rows):
                calls.append(PassCall("train", "DPSGD.clipped_sum", production_frames() | {
                    "dpsynth.methods.dpfinetune.train:DPSGD.clipped_sum"}))
            return clipped_sum(self, rows)

        monkeypatch.setattr(DPSGD, "clipped_sum", training)
        CENSUS_SIZES["dp_finetune"] = {
            "privacy.noise": "seeded", "generators": [{"model": str(_tiny_model_dir(tmp))}],
            "dp_finetune": {"secure_mode": False, "records": 21, "batch_size": 7,
                            "max_tokens": 16, "samples": 2, "max_new_tokens": 4}}
    monkeypatch.setattr(secrets, "find_in_texts", watched(secrets.find_in_texts))
    monkeypatch.setattr(secrets, "find_secrets", watched(secrets.find_secrets))
    fake = FakeGenerator("fake-g0")
    encode = fake.encode

    def noting_encode(text: str) -> list[int]:
        ids = encode(text)
        if holds(text) and ids:
            private_ids.append(tuple(ids))
        return ids

    fake.encode = noting_encode  # type: ignore[method-assign]
    gen = Recording(fake, calls, private)
    emb = Recording(FakeEmbedder(), calls, private)
    cfg = own_ledger(pe_config(name, write_csv(tmp / "d.csv", rows),
                               **CENSUS_SIZES.get(name, {})), tmp / "run")
    if method_class(name).releases == "knowledge_base":
        from dpsynth.api import build_kb

        build_kb(parse_config(cfg), tmp / "run", generator=gen, embedder=emb)
    else:
        from dpsynth.api import run_generation

        run_generation(parse_config(cfg), tmp / "run", progress=False, generators=[gen],
                       embedder=emb)
    return calls


def _contains_ids(row: list[int], needles: list[tuple[int, ...]]) -> bool:
    """Whether ``row`` holds one of ``needles`` as a contiguous run of token ids."""
    for needle in needles:
        n = len(needle)
        if any(tuple(row[i:i + n]) == needle for i in range(len(row) - n + 1)):
            return True
    return False


def census_problems(name: str, declared: tuple[str, ...] | None, calls: list[Any],
                    entry_points: dict[str, frozenset[str]]) -> list[str]:
    """What the census of ``name``'s run finds wrong: an undeclared pass, a call over private
    records by a function no rows-apart check runs, a declared pass never made."""
    if declared is None:
        return [f"method {name!r} does not declare its private passes"]
    problems = [f"{name}: {c.boundary} over private records ({c.kind}) is not declared"
                for c in calls if c.kind not in declared]
    problems += [f"{name}: {c.boundary} over private records from {c.where()}: no rows-apart "
                 f"check runs this path (test_rows_apart.ENTRY_POINTS[{c.kind!r}])"
                 for c in calls if not c.frames & entry_points.get(c.kind, frozenset())]
    made = {c.kind for c in calls}
    problems += [f"{name}: declares the pass {p!r} that its default run never makes"
                 for p in declared if p not in made]
    return sorted(set(problems))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_methods_private_passes_are_declared_and_checked(name, tmp_path, monkeypatch):
    """The release checker's rows-apart step (issue 43): each registered method's default
    configuration is run on recorded fakes, and every model call over private records it makes
    must be of a pass the method declares (``private_passes``) and come through a production
    function that tests/test_rows_apart.py runs with one record prepended on the real models
    (``ENTRY_POINTS``); a declared pass the run never makes is stale. A new method is in the
    registry and so in this test: undeclared, or with a pass made by an unchecked function, it
    fails here."""
    from dpsynth.methods import method_class
    from test_rows_apart import ENTRY_POINTS

    calls = census_run(name, tmp_path, monkeypatch)
    problems = census_problems(name, method_class(name).private_passes, calls, ENTRY_POINTS)
    assert problems == [], "\n".join(problems)


def test_the_census_fails_on_an_undeclared_or_unchecked_pass(tmp_path, monkeypatch):
    """The census can fail: Aug-PE's embedding of its records, undeclared, or made by a
    function no check runs, is reported; so is a declared pass that is never made."""
    from test_rows_apart import ENTRY_POINTS

    calls = census_run("aug_pe", tmp_path, monkeypatch)
    assert {c.kind for c in calls} == {"embed"}
    assert any("is not declared" in p for p in census_problems("aug_pe", (), calls,
                                                                ENTRY_POINTS))
    unchecked = {**ENTRY_POINTS, "embed": frozenset({"dpsynth.embed.streamed:elsewhere"})}
    assert any("no rows-apart check" in p
               for p in census_problems("aug_pe", ("embed",), calls, unchecked))
    assert any("never makes" in p
               for p in census_problems("aug_pe", ("embed", "logits"), calls, ENTRY_POINTS))
    assert census_problems("aug_pe", None, calls, ENTRY_POINTS)
