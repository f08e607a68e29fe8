"""The Yelp benchmark of Aug-PE (issues 4 and 14): private = yelp/dev.csv (all 5000 reviews by
default), test = yelp/test.csv, epsilon in {4, inf, 1}, delta 1e-5, the offline SmolLM2
generator on the fast local engine (ctranslate2 int8).

    .venv/bin/python benchmarks/bench_yelp.py [--samples 1000] [--iterations 3] \
        [--pool-multiplier 2] [--epsilons 4,inf,1] [--temperature 1.0] \
        [--validation V] [--results yelp_n1000_table.md]

Reports FID, accuracy and macro-F1 per label column (logistic regression on MiniLM
embeddings) of each run next to both references (trained on the private records; trained on
the run's release/zero_shot.jsonl, N zero-shot generations with no private votes), with wall
time, LLM calls and the machine load. The arms share one request cache and one run seed
(``privacy.seed``: request seeds and post-processing only; the noise stays secure OS noise),
so their identical zero-shot requests are generated once. The table is rewritten after each
arm, so an interrupted benchmark leaves the finished arms' rows. ``--validation V`` holds out
the last V private records as the test set (settings are chosen there, never on test.csv).
Results and their reading: benchmarks/results/yelp_n1000.md.

Note: with ``--pool-multiplier 1`` Aug-PE keeps its whole zero-shot pool (no variations, the
vote selects nothing away), so the synthetic data equals the zero-shot reference; use >= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from harness import ROOT, SHARED, markdown, run_arm

MODEL_NAMES = {"smollm2": "SmolLM2-135M-Instruct", "gemma3": "Gemma 3 270M base"}


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def with_f1(row: dict[str, Any], eval_path: Any, labels: list[str]) -> dict[str, Any]:
    """Put macro-F1 beside each accuracy of the row (from the arm's eval.json)."""
    util = json.loads(eval_path.read_text()).get("utility", {}).get("logreg", {})
    out: dict[str, Any] = {}
    for key, value in row.items():
        out[key] = value
        col, _, ref = key.partition(":")
        if col in labels and ref in ("synthetic", "private", "zero_shot"):
            f1 = (util.get(col, {}).get(ref) or {}).get("macro_f1")
            out[f"{col}:{ref}:f1"] = round(f1, 4) if isinstance(f1, float) else "n/a"
    return out


def validation_split(dev: Path, rows: int, out: Path) -> tuple[Path, int]:
    """The last `rows` private records as a validation test file (private: mode 0600, in the
    benchmark's run folder) and the number of records before them (the private set)."""
    import pandas as pd

    df = pd.read_csv(dev, dtype=str, keep_default_na=False)
    if not 0 < rows < len(df):
        raise SystemExit("--validation must be between 0 and the private set's size")
    path = out / "private-validation.csv"
    path.touch(mode=0o600)
    df.tail(rows).to_csv(path, index=False)
    return path, len(df) - rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--pool-multiplier", type=int, default=2)
    ap.add_argument("--epsilons", default="4,inf,1")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--engine", default="ctranslate2")
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"],
                    help="the embedded generator: SmolLM2-135M-Instruct (chat prompts) or the "
                         "Gemma 3 270M base model (completion prompts)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=None,
                    help="use only the first N private records (default: all 5000)")
    ap.add_argument("--seed", type=int, default=0,
                    help="run seed shared by the arms (request seeds, post-processing)")
    ap.add_argument("--validation", type=int, default=0,
                    help="hold out the last V private records as the test set (settings are "
                         "chosen here, never on test.csv); private = the records before them")
    ap.add_argument("--task", default=None, help="prompts.task override (a lever)")
    ap.add_argument("--label-template", default=None, help="prompts.label_template override")
    ap.add_argument("--label-descriptions", default="none",
                    help="YAML file of prompts.label_descriptions ({column: {value: text}}); "
                         "'none' (default: the setting of the tables so far) for none")
    ap.add_argument("--strip-echoes", action="store_true",
                    help="synthesis.strip_echoes: remove repeated instruction sentences")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more config override, VALUE read as YAML (a lever such as "
                         "synthesis.variation=fill_in); repeatable")
    ap.add_argument("--tag", default="", help="suffix of the arm names (e.g. a lever's name)")
    ap.add_argument("--cache", default=None,
                    help="request cache (default: llm-cache.sqlite in the --out folder)")
    ap.add_argument("--out", default="yelp-n1000", help="folder under benchmarks/runs")
    ap.add_argument("--results", default="yelp_n1000_table.md",
                    help="file under benchmarks/results (the table only)")
    args = ap.parse_args()
    data = SHARED / "yelp"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the Yelp benchmark needs ../shared/data")
    labels = ["label1", "label2"]
    out = ROOT / "runs" / args.out
    out.mkdir(parents=True, exist_ok=True)
    test_path = data / "test.csv"
    if args.validation:
        test_path, args.limit = validation_split(data / "dev.csv", args.validation, out)
    size = f"first {args.limit} of" if args.limit else "all 5000 of"
    test_desc = (f"the last {args.validation} of yelp/dev.csv (validation split)"
                 if args.validation else "yelp/test.csv (5000)")
    task = args.task or "a short Yelp review"
    template = args.label_template or "{label1}. {label2}."
    intro = (
        f"Aug-PE, private = {size} yelp/dev.csv, test = {test_desc}, delta = 1e-5, "
        f"{MODEL_NAMES[args.model]} ({args.engine}, CPU, batch {args.batch_size}), "
        f"N = {args.samples} synthetic samples over the 50 joint (category, stars) classes, "
        f"L = {args.pool_multiplier}, T = {args.iterations}, max_new_tokens = "
        f"{args.max_new_tokens}, temperature {args.temperature}, prompts.task = {task!r}, "
        f"label_template = {template!r}, "
        + "".join(f"{item}, " for item in args.set)
        + (f"label descriptions from {args.label_descriptions}, "
           if args.label_descriptions != "none" else "") +
        f"run seed {args.seed} shared by the arms. Accuracy and `:f1` "
        "(macro-F1): logistic regression on MiniLM embeddings, per label column; `private` = "
        "trained on the private records, `zero_shot` = trained on the run's "
        "release/zero_shot.jsonl (N zero-shot generations, no private votes). Arms share one "
        "request cache (identical zero-shot requests are paid once; `llm_calls` counts the "
        "calls each arm sent). `load` = 1/5/15-minute load average at the arm's start and end "
        "(2 shared cores; this benchmark ran at nice 19).")
    rows = []
    for eps in args.epsilons.split(","):
        overrides = {"privacy.epsilon": float(eps), "privacy.seed": args.seed,
                     "data.path": str(data / "dev.csv"), "data.limit": args.limit,
                     "synthesis.samples": args.samples,
                     "synthesis.iterations": args.iterations,
                     "synthesis.pool_multiplier": args.pool_multiplier,
                     "llm_cache": args.cache or str(out / "llm-cache.sqlite"),
                     "generators": [{"model": args.model, "engine": args.engine,
                                     "batch_size": args.batch_size,
                                     "max_new_tokens": args.max_new_tokens,
                                     "temperature": args.temperature}]}
        if args.task:
            overrides["prompts.task"] = args.task
        if args.label_template:
            overrides["prompts.label_template"] = args.label_template
        if args.strip_echoes:
            overrides["synthesis.strip_echoes"] = True
        overrides["prompts.label_descriptions"] = {} if args.label_descriptions == "none" else (
            yaml.safe_load(Path(args.label_descriptions).read_text(encoding="utf-8")))
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
            overrides[key] = yaml.safe_load(value)
        start_load, start = load(), time.time()
        name = f"aug_pe-eps{eps}{args.tag}"
        row = run_arm(name, ROOT.parent / "examples" / "yelp-augpe.yaml", overrides, out,
                      test_path, labels)
        row = with_f1(row, out / name / "eval" / "eval.json", labels)
        row["load"] = f"{start_load} -> {load()}"
        row["bench_seconds"] = round(time.time() - start)
        rows.append(row)
        print(json.dumps(row), flush=True)
        (ROOT / "results").mkdir(exist_ok=True)
        (ROOT / "results" / args.results).write_text(
            markdown(f"Yelp: Aug-PE, N = {args.samples}", intro, rows))


if __name__ == "__main__":
    main()
