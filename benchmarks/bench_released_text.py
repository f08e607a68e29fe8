"""Released text worth reading (issue 44): Aug-PE on a labelled set of ../shared/data at
epsilon 4 with 2000 private records, arm by arm side by side in one invocation.

    .venv/bin/python benchmarks/bench_released_text.py --set banking --arms today,defaults

Each arm is one run of ``dpsynth generate`` scored against held-out real records (a
classifier trained on the release; the run's own zero-shot set and a classifier trained on
the private records beside it), with the share of the zero-shot -> real gap closed
(``gap_closed``), the majority-class rate, FID and wall time. Twenty random released samples of
each arm are written beside the table for a reading by eye. Writes
benchmarks/results/released_text_<set>.md (and .json).

The private sample (the first ``--records`` rows of a fixed shuffle) and the test slice are
written under benchmarks/runs/ (mode 0600, never committed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from harness import ROOT, SHARED, machine, run_arm

SETS: dict[str, dict[str, Any]] = {
    "banking": {
        "file": "banking77/train.csv", "test": "banking77/test.csv", "labels": ["category"],
        "config": {
            "data": {"text": "text", "labels": ["category"],
                     "label_values": {"category": str(ROOT.parent / "examples" /
                                                      "banking77-intents.txt")}},
            "prompts": {"writer": "a customer of an online bank",
                        "task": "a short question you ask your online bank",
                        "label_template": "It is about {category}."},
        },
    },
    "yelp": {
        "file": "yelp/dev.csv", "test": "yelp/test.csv", "labels": ["label1", "label2"],
        "config": {
            "data": {"text": "text", "labels": ["label1", "label2"]},
            "prompts": {"task": "a short Yelp review",
                        "label_template": "{label1}. {label2}.",
                        "label_descriptions": str(ROOT.parent / "examples" /
                                                  "yelp-label-descriptions.yaml")},
        },
    },
}

#: the arms: overrides on top of the set's config. "today" is the configuration the issue
#: measured (N = 500, L = 3, T = 2, 64 tokens, no filtering); the others switch levers.
_OFF = {"drop_off_task": False, "strip_echoes": False}
ARMS: dict[str, dict[str, Any]] = {
    # the configuration on the code before issue 44 (run from that commit)
    "today": {"synthesis": {"samples": 500, "pool_multiplier": 3, "iterations": 2}},
    # every lever on: the defaults
    "defaults": {"synthesis": {"samples": 500}},
    # one lever at a time, the others as before issue 44 (64 tokens, no filters)
    "population": {"synthesis": {"samples": 500, "max_words": 40, **_OFF},
                   "generators": [{"model": "smollm2", "batch_size": 32, "max_new_tokens": 64}]},
    "filters": {"synthesis": {"samples": 500, "population": 500, "max_words": 40},
                "generators": [{"model": "smollm2", "batch_size": 32, "max_new_tokens": 64}]},
    "length": {"synthesis": {"samples": 500, "population": 500, **_OFF}},
    # the defaults plus a generator that learns from the votes
    "preference": {"synthesis": {"samples": 500, "preference": {"enabled": True}}},
}


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def private_sample(spec: dict[str, Any], records: int, out: Path) -> tuple[Path, Path, list]:
    """The private records (a fixed shuffle's first ``records`` rows) and the test slice."""
    out.mkdir(parents=True, exist_ok=True)
    frame = pd.read_csv(SHARED / spec["file"])
    frame = frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    private = out / f"private-{records}.csv"
    frame.iloc[:records].to_csv(private, index=False)
    os.chmod(private, 0o600)
    test = pd.read_csv(SHARED / spec["test"]).sample(frac=1.0, random_state=1)
    test_path = out / "test-1000.csv"
    test.iloc[:1000].to_csv(test_path, index=False)
    os.chmod(test_path, 0o600)
    values = {c: sorted(frame[c].astype(str).unique()) for c in spec["labels"]}
    return private, test_path, [values]


def majority_rate(test: Path, labels: list[str]) -> dict[str, float]:
    frame = pd.read_csv(test)
    return {c: round(float(frame[c].astype(str).value_counts(normalize=True).iloc[0]), 4)
            for c in labels}


def samples_by_eye(run_dir: Path, n: int = 20) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "release" / "synthetic.jsonl").read_text()
            .splitlines() if x.strip()]
    return random.Random(0).sample(rows, min(n, len(rows)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=sorted(SETS), default="banking")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--arms", default="today,defaults")
    ap.add_argument("--samples", type=int, default=500, help="texts released per arm")
    ap.add_argument("--tag", default="", help="suffix of the runs folder and the result file")
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    spec = SETS[args.set]
    out = ROOT / "runs" / f"released_text_{args.set}{args.tag}"
    private, test, values = private_sample(spec, args.records, out)
    base = json.loads(json.dumps(spec["config"]))
    base["method"] = "aug_pe"
    base["data"]["path"] = str(private)
    if args.set == "yelp":
        base["data"]["label_values"] = values[0]
    base["privacy"] = {"epsilon": 4.0, "delta": 1e-5}
    base["generators"] = [{"model": "smollm2", "batch_size": 32}]
    config = out / "base.yaml"
    config.write_text(yaml.safe_dump(base))
    majority = majority_rate(test, spec["labels"])
    rows, reads = [], {}
    for arm in args.arms.split(","):
        start_load = load()
        t0 = time.time()
        over = json.loads(json.dumps(ARMS[arm]))
        over["synthesis"]["samples"] = args.samples
        row = run_arm(arm, config, over, out, test, spec["labels"], fresh=args.fresh)
        row["wall_this_call"] = round(time.time() - t0)
        row["load_at_start"] = start_load
        for c in spec["labels"]:
            syn, zs, real = (row.get(f"{c}:{r}") for r in ("synthetic", "zero_shot", "private"))
            row[f"{c}:majority"] = majority[c]
            if all(isinstance(v, float) for v in (syn, zs, real)) and real != zs:
                row[f"{c}:gap_closed"] = round((syn - zs) / (real - zs), 3)
        rows.append(row)
        reads[arm] = samples_by_eye(out / arm)
        print(json.dumps(row), flush=True)
    result = {"set": args.set, "records": args.records, "machine": machine(), "rows": rows,
              "samples": reads}
    (ROOT / "results" / f"released_text_{args.set}{args.tag}.json").write_text(
        json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
