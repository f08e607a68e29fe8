"""The WASP benchmark (issue 5): Banking77, M = 100 private queries (the few-sample regime),
epsilon 4, delta 1e-5, the same total number of generated samples for every arm.

Arms: WASP with both offline generators, WASP with each one alone, WASP without contrastive
prompts, WASP without generator weighting, and Aug-PE; then the federated run (10 parties,
300 records split by Dirichlet(1.0)) against the same 300 records in one place.

    .venv/bin/python benchmarks/bench_wasp.py [--samples 154] [--skip-federated]

Writes benchmarks/results/wasp.md. With ``--private-sizes 50,100,300`` it runs instead the
small-M comparison (issue 14): per M, WASP (SmolLM2 only) against Aug-PE at the same number of
generations, plus the ablation arms at the largest M (``--ablation``), and writes
benchmarks/results/wasp_small_m.md. ``--validation`` scores the small-M arms against 1000
records of train.csv outside the fixed 300-record sample (mode 0600 under benchmarks/runs)
instead of test.csv, for choosing settings; ``--config`` runs another config file. Each small-M
row also has ``english`` (share of texts whose words are >= 80 % frequent words of train.csv,
bench_sampling.english) and ``own_voice`` (share that read as the writer's own message,
voice.own_voice).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from bench_sampling import common_words, english
from harness import ROOT, SHARED, markdown, run_arm
from voice import own_voice_share

SMOL = {"model": "smollm2", "max_new_tokens": 40, "batch_size": 32}
GEMMA = {"model": "gemma3", "max_new_tokens": 40, "batch_size": 32}


def load() -> str:
    """The 1-, 5- and 15-minute load averages."""
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def with_f1(row: dict[str, Any], eval_path: Path) -> dict[str, Any]:
    """Put macro-F1 beside each accuracy of the row (from the arm's eval.json)."""
    util = json.loads(eval_path.read_text()).get("utility", {}).get("logreg", {})
    out: dict[str, Any] = {}
    for key, value in row.items():
        out[key] = value
        col, _, ref = key.partition(":")
        if col == "category" and ref in ("synthetic", "private", "zero_shot"):
            f1 = (util.get(col, {}).get(ref) or {}).get("macro_f1")
            out[f"{col}:{ref}:f1"] = round(f1, 4) if isinstance(f1, float) else "n/a"
    return out


def readability(run_dir: Path, words: set[str]) -> dict[str, float]:
    """english and own_voice shares of a run's released texts."""
    texts = [json.loads(line)["text"] for line in
             (run_dir / "release" / "synthetic.jsonl").read_text().splitlines()]
    share = sum(english(t, words) for t in texts) / max(len(texts), 1)
    return {"english": round(share, 3), "own_voice": round(own_voice_share(texts), 3)}


def small_m(args: argparse.Namespace, data: Path, out: Path, train: pd.DataFrame) -> None:
    """WASP vs Aug-PE per private size M, same generations; ablations at the largest M."""
    sizes = [int(m) for m in args.private_sizes.split(",")]
    sample = train.sample(n=max(300, *sizes), random_state=0)  # nested subsets, fixed seed
    config = Path(args.config).resolve() if args.config else (
        ROOT.parent / "examples" / "banking-wasp.yaml")
    test_path = data / "test.csv"
    if args.validation:  # train.csv outside the fixed sample: never test.csv
        test_path = out / "validation-test.csv"
        test_path.touch(mode=0o600)
        train.drop(index=sample.index).sample(n=1000, random_state=1).to_csv(test_path,
                                                                            index=False)
    words = common_words(train["text"].astype(str).tolist())
    n = args.samples
    seeds = [int(x) for x in str(args.seed).split(",")]
    common: dict[str, Any] = {"llm_cache": str(out / "llm-cache.sqlite"), "generators": [SMOL]}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        common[key] = yaml.safe_load(value)
    arms: dict[str, dict[str, Any]] = {}
    for i, seed in enumerate(seeds):
        # the first seed's arms keep their plain names
        tag = args.tag + ("" if i == 0 else f"-s{seed}")
        for m in sizes:
            path = out / f"private-{m}.csv"
            sample.iloc[:m].to_csv(path, index=False)
            arms[f"wasp-M{m}{tag}"] = {"data.path": str(path), "synthesis.samples": n,
                                       "privacy.seed": seed}
            arms[f"aug_pe-M{m}{tag}"] = {"data.path": str(path), "method": "aug_pe",
                                         "synthesis.pool_multiplier": 2,
                                         "synthesis.iterations": 1,
                                         "synthesis.samples": n // 2, "privacy.seed": seed}
        if args.ablation and i == 0:
            big = {"data.path": str(out / f"private-{max(sizes)}.csv"),
                   "synthesis.samples": n, "privacy.seed": seed}
            arms[f"wasp-top1-M{max(sizes)}{args.tag}"] = {**big, "wasp.top_q": 1}
            arms[f"wasp-no-contrastive-M{max(sizes)}{args.tag}"] = {**big,
                                                                    "wasp.contrastive": False}
    rows = []
    for name, extra in arms.items():
        if args.only and name not in args.only.split(","):
            continue
        start_load, start = load(), time.time()
        row = run_arm(name, config, {**common, **extra}, out, test_path, ["category"])
        row = with_f1(row, out / name / "eval" / "eval.json")
        row.update(readability(out / name, words))
        row["load"] = f"{start_load} -> {load()}"
        row["bench_seconds"] = round(time.time() - start)
        rows.append(row)
        print(json.dumps(row), flush=True)
        intro = (
            "Banking77 (77 intents), M private queries = the first M of one fixed sample of "
            "train.csv (seed 0; nested), test = "
            + ("1000 records of train.csv outside that sample (validation)" if args.validation
               else "test.csv (3080)") + f", config {config.name}, epsilon 4, delta 1e-5, "
            f"SmolLM2-135M-Instruct only (ctranslate2 int8, CPU; Gemma 3 is about 4x slower "
            f"here), max_new_tokens 40, run seed(s) {args.seed} (first seed: plain arm "
            f"names, others: `-s<seed>`; request seeds and post-processing; noise is secure OS "
            f"noise). " + "".join(f"{item}, " for item in args.set)
            + "WASP: Q = 8, T = 2 voting rounds "
            f"(3 generation rounds), N = {n}. Aug-PE: {n // 2} kept from a pool of 2x with "
            f"T = 1, i.e. the same number generated. Accuracy and `:f1` (macro-F1): logistic "
            f"regression on MiniLM over the 77 intents; `private` = trained on the M real "
            f"records; `zero_shot` = the run's round-0 zero-shot generations. `load` = 1/5/15-"
            f"minute load average at the arm's start and end (2 shared cores, nice 19).")
        (ROOT / "results").mkdir(exist_ok=True)
        (ROOT / "results" / args.results).write_text(
            markdown("WASP vs Aug-PE at small M: Banking77", intro, rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=154)
    ap.add_argument("--skip-federated", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("--private-sizes", default="",
                    help="e.g. 50,100,300: the small-M comparison instead (wasp_small_m.md)")
    ap.add_argument("--ablation", action="store_true",
                    help="small-M: Top-1 and no-contrastive WASP arms at the largest M")
    ap.add_argument("--seed", default="0",
                    help="small-M: run seed(s) shared by the arms, e.g. 0,1 (a repeat per seed)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="small-M: one more config override for every arm, VALUE read as YAML "
                         "(a lever such as synthesis.drop_off_task=true); repeatable")
    ap.add_argument("--tag", default="", help="small-M: suffix of the arm names")
    ap.add_argument("--validation", action="store_true",
                    help="small-M: score against 1000 held-out train.csv records, not test.csv")
    ap.add_argument("--config", default="", help="small-M: config file (default: "
                                                 "examples/banking-wasp.yaml)")
    ap.add_argument("--out", default="banking", help="small-M: folder under benchmarks/runs")
    ap.add_argument("--results", default="wasp_small_m.md",
                    help="small-M: file under benchmarks/results")
    args = ap.parse_args()
    data = SHARED / "banking77"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the WASP benchmark needs ../shared/data")
    out = ROOT / "runs" / (args.out if args.private_sizes else "banking")
    out.mkdir(parents=True, exist_ok=True)
    train = pd.read_csv(data / "train.csv")
    if args.private_sizes:
        small_m(args, data, out, train)
        return
    sample = train.sample(n=300, random_state=0)
    sample.iloc[:100].to_csv(out / "private-100.csv", index=False)
    sample.to_csv(out / "private-300.csv", index=False)
    config = ROOT.parent / "examples" / "banking-wasp.yaml"
    common = {"synthesis.samples": args.samples, "llm_cache": str(out / "llm-cache.sqlite"),
              "data.path": str(out / "private-100.csv")}
    arms = {
        "wasp-2-generators": {},
        "wasp-smollm2-only": {"generators": [SMOL]},
        "wasp-gemma3-only": {"generators": [GEMMA]},
        "wasp-no-contrastive": {"wasp.contrastive": False},
        "wasp-no-weighting": {"wasp.weighting": False},
        # N * L generated with T = 1 (the last iteration has no variation step)
        "aug_pe-smollm2": {"method": "aug_pe", "generators": [SMOL],
                           "synthesis.pool_multiplier": 2, "synthesis.iterations": 1,
                           "synthesis.samples": args.samples // 2},
    }
    if not args.skip_federated:
        arms["wasp-central-300"] = {"data.path": str(out / "private-300.csv")}
        arms["wasp-federated-10-parties-300"] = {
            "data.path": str(out / "private-300.csv"),
            "wasp.federated": {"parties": 10, "dirichlet_alpha": 1.0}}
    rows = []
    for name, extra in arms.items():
        if args.only and name not in args.only.split(","):
            continue
        row = run_arm(name, config, {**common, **extra}, out, data / "test.csv", ["category"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    intro = (f"Banking77, 100 private queries sampled from train.csv (seed 0), test = test.csv "
             f"(3080), epsilon 4, delta 1e-5, Q = 8, T = 2 voting rounds (3 generation rounds), "
             f"{args.samples} generated samples per arm (Aug-PE: {args.samples // 2} kept "
             "from a pool of 2x with T = 1, i.e. the same number generated). Accuracy: "
             "logistic regression on MiniLM embeddings over the 77 intents; `private` = "
             "trained on the private "
             "records; `zero_shot` = the run's round-0 zero-shot generations. Federated rows: "
             "300 records; 10 parties by Dirichlet(1.0), SecAgg+ in Flower's simulation engine.")
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "wasp.md").write_text(markdown("WASP: Banking77", intro, rows))


if __name__ == "__main__":
    main()
