"""The SecPE utility benchmark (issues 6 and 14): Yelp, SecPE against Aug-PE at the matching
mu-GDP budget, p = 1e-4 and r/p in {1.5, 2, 10, inf}, one SecPE arm per secret kind, number
of public centres K and r/p.

For a given (p, r), any mu-GDP mechanism with mu = Phi^-1(1 - p) - Phi^-1(1 - r) gives
(p, r)-secret protection, so Aug-PE's arm is calibrated to that mu (as (epsilon, delta) at
delta = 1e-5 through the GDP curve); r/p = inf means no protection (Aug-PE without noise).
Aug-PE's arm depends only on mu, so it runs once per r/p; SecPE runs once per secret kind:
``random_words`` (50 words at the 20th document-frequency percentile) and ``pii`` (Presidio
PERSON, LOCATION, PHONE_NUMBER, EMAIL_ADDRESS).

    .venv/bin/python benchmarks/bench_secpe.py [--records 5000] [--clusters 20,200] \
        [--secrets random_words,pii] [--samples 200] [--iterations 2] \
        [--ratios 1.5,2,10,inf] [--methods aug_pe,secpe] [--out secpe-yelp5000] \
        [--results secpe_yelp5000.md]

Issue 6's first run (1000 records, 100 centres, random words, N = 50, SmolLM2 on
transformers) is benchmarks/results/secpe.md. The table is rewritten after each arm, so an
interrupted benchmark leaves the finished arms' rows; finished arms are reused on a rerun.
SecPE rows carry the secret split of the run (private/diagnostics.jsonl: a benchmark on
public data, so exact counts are reported) and the mean public records per centre; every
row carries the candidates that got a vote. Results and their reading:
benchmarks/results/secpe_yelp5000.md.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from bench_yelp import load, with_f1
from dpsynth.methods.secpe.theory import r_to_mu
from dpsynth.privacy import gdp_epsilon
from harness import ROOT, SHARED, markdown, run_arm

P = 1e-4
DELTA = 1e-5
DEFAULT_CLUSTERS = 20
#: text of the results file from this line on (the reading) is kept when the table is rewritten
KEEP = "<!-- reading below: kept when bench_secpe.py rewrites the table -->"
SECRETS: dict[str, dict[str, Any]] = {
    "random_words": {"kind": "random_words", "count": 50, "percentile": 20, "seed": 0},
    "pii": {"kind": "pii",
            "entities": ["PERSON", "LOCATION", "PHONE_NUMBER", "EMAIL_ADDRESS"]},
}


def split_columns(run_dir: Path) -> dict[str, Any]:
    """The SecPE run's secret split and noise (its private diagnostics; public benchmark
    data), the centres it released (K split over the labels, at least one each) and the
    mean public records per centre."""
    path = run_dir / "private" / "diagnostics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    split = next((r for r in rows if r.get("kind") == "secpe_split"), None)
    if split is None:
        return {}
    stats = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()
             if line.strip()]
    centres = max(int(s.get("representatives", 0)) for s in stats) if stats else 0
    return {"private_records": split["private_records"],
            "public_records": split["public_records"], "secrets": split["secrets"],
            "centres": centres,
            "mean_n_k": round(split["public_records"] / centres) if centres else "n/a",
            "sigma": round(float(split["noise_sigma"]), 4)}


def voted(run_dir: Path) -> str:
    """Candidates that received a (noisy) vote above zero, per iteration (the run's stats)."""
    stats = [json.loads(line) for line in (run_dir / "stats.jsonl").read_text().splitlines()
             if line.strip()]
    return "/".join(str(s.get("candidates_with_votes", "?")) for s in stats)


def with_reference(row: dict[str, Any], run_dir: Path, labels: list[str]) -> dict[str, Any]:
    """Fill the real-data reference columns from the run's private/eval/reference.json (the
    evaluator keeps it out of eval.json, so a reused arm's row lacks it)."""
    path = run_dir / "private" / "eval" / "reference.json"
    if not path.is_file():
        return row
    util = json.loads(path.read_text()).get("utility", {}).get("logreg", {})
    for col in labels:
        ref = (util.get(col) or {}).get("private") or {}
        for key, field in ((f"{col}:private", "accuracy"), (f"{col}:private:f1", "macro_f1")):
            if isinstance(ref.get(field), float) and key in row:
                row[key] = round(ref[field], 4)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=5000,
                    help="the first N of yelp/dev.csv (5000: all, no data.limit)")
    ap.add_argument("--clusters", default=str(DEFAULT_CLUSTERS),
                    help="SecPE's public centres K, one SecPE arm per K (comma-separated; arm "
                         "names carry K when it is not the default)")
    ap.add_argument("--secrets", default="random_words,pii",
                    help=f"secret kinds, one SecPE arm each per r/p: {','.join(SECRETS)}")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--ratios", default="2,10,inf")
    ap.add_argument("--methods", default="aug_pe,secpe",
                    help="arms to run (e.g. secpe alone for a sweep over --clusters)")
    ap.add_argument("--engine", default="ctranslate2")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0,
                    help="run seed shared by the arms (request seeds, post-processing)")
    ap.add_argument("--out", default="secpe-yelp5000", help="folder under benchmarks/runs")
    ap.add_argument("--results", default="secpe_yelp5000.md",
                    help="file under benchmarks/results")
    args = ap.parse_args()
    kinds = args.secrets.split(",")
    methods = args.methods.split(",")
    ks = [int(k) for k in args.clusters.split(",")]
    if unknown := [k for k in kinds if k not in SECRETS]:
        raise SystemExit(f"--secrets: unknown kind(s) {unknown}; use {list(SECRETS)}")
    data = SHARED / "yelp"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the SecPE benchmark needs ../shared/data")
    out = ROOT / "runs" / args.out
    out.mkdir(parents=True, exist_ok=True)
    labels = ["label1"]
    limit = args.records if args.records < 5000 else None
    common = {
        "data.path": str(data / "dev.csv"), "data.labels": labels, "data.limit": limit,
        "privacy.seed": args.seed, "synthesis.samples": args.samples,
        "synthesis.iterations": args.iterations, "synthesis.pool_multiplier": 2,
        "llm_cache": str(out / "llm-cache.sqlite"),
        "generators": [{"model": "smollm2", "engine": args.engine,
                        "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens}],
        "prompts.label_template": "{label1}.",
        "prompts.label_descriptions": {},  # the setting measured (the example now has them)
    }
    intro = (
        f"Yelp, private = {'all 5000' if limit is None else f'first {limit}'} of "
        f"yelp/dev.csv, test = yelp/test.csv, category label (label1, 10 classes) only, "
        f"p = 1e-4, N = {args.samples}, L = 2, T = {args.iterations}, SmolLM2-135M-Instruct "
        f"({args.engine}, batch {args.batch_size}, max_new_tokens {args.max_new_tokens}), "
        f"run seed {args.seed} shared by the arms. SecPE: K in {{{args.clusters}}} public centres "
        f"(arm suffix -kK, none for K = {DEFAULT_CLUSTERS}; split over the labels by public "
        "counts, at least one per label), clip R = 1; "
        "secrets `rw` = 50 random words at the 20th document-frequency percentile (seed 0), "
        "`pii` = Presidio PERSON, LOCATION, PHONE_NUMBER, EMAIL_ADDRESS (score >= 0.4). "
        "Aug-PE arms are calibrated to the mu-GDP budget that gives the same (p, r) "
        "protection (mu = Phi^-1(1-p) - Phi^-1(1-r), epsilon at delta 1e-5 via the GDP "
        "curve) and run once per r/p (they do not depend on the secrets); SecPE's epsilon "
        "column is empty because it gives no record-level DP. SecPE columns from the run's "
        "private diagnostics (public benchmark data): records holding a secret / not, "
        "distinct secrets, centres = public centres over all labels (K split over the "
        "labels, at least one each: the representatives released per iteration), "
        "mean_n_k = public records / centres, "
        "sigma = the calibrated noise std per released coordinate in units of the centre's "
        "sensitivity. voted_candidates = pool candidates with a positive vote, per "
        "iteration (of 2N). Accuracy and `:f1` "
        "(macro-F1): logistic regression on MiniLM embeddings; `private` = trained on the "
        "private records, `zero_shot` = on the run's zero-shot generations. `load` = "
        "load average at the arm's start and end (2 shared cores, nice 19).")
    rows: list[dict[str, Any]] = []
    for ratio in args.ratios.split(","):
        rp = float(ratio)
        mu = math.inf if math.isinf(rp) else float(r_to_mu(P, P * rp))
        eps = math.inf if math.isinf(mu) else float(gdp_epsilon(mu, DELTA))
        arms: list[tuple[str, dict[str, Any]]] = []
        if "aug_pe" in methods:
            arms.append((f"aug_pe-r{ratio}p", {**common, "method": "aug_pe",
                                               "privacy.epsilon": eps, "privacy.delta": DELTA}))
        for kind in kinds if "secpe" in methods else []:
            short = "rw" if kind == "random_words" else kind
            for k in ks:
                k_tag = "" if k == DEFAULT_CLUSTERS else f"-k{k}"
                arms.append((f"secpe-{short}-r{ratio}p{k_tag}", {
                    **common, "method": "secpe", "secpe.secrets": [SECRETS[kind]],
                    "secpe.p": P, "secpe.r_over_p": rp, "secpe.clusters": k}))
        for name, overrides in arms:
            start_load, start = load(), time.time()
            timing = out / name / "bench.json"  # this benchmark's timing of the arm's first run
            row = run_arm(name, ROOT.parent / "examples" / "yelp-augpe.yaml", overrides, out,
                          data / "test.csv", labels)
            row = with_reference(with_f1(row, out / name / "eval" / "eval.json", labels),
                                 out / name, labels)
            row["mu"] = round(mu, 4) if math.isfinite(mu) else "inf"
            row["voted_candidates"] = voted(out / name)
            if overrides["method"] == "secpe":
                row.update(split_columns(out / name))
            if not timing.is_file():
                timing.write_text(json.dumps({"load": f"{start_load} -> {load()}",
                                              "bench_seconds": round(time.time() - start)}))
            row.update(json.loads(timing.read_text()))
            rows.append(row)
            print(json.dumps(row), flush=True)
            (ROOT / "results").mkdir(exist_ok=True)
            path = ROOT / "results" / args.results
            old = path.read_text() if path.is_file() else ""
            kept = "\n" + old[old.index(KEEP):] if KEEP in old else ""
            path.write_text(markdown(f"SecPE vs Aug-PE on Yelp ({args.records} records, "
                                     f"K = {args.clusters}, N = {args.samples})", intro,
                                     rows) + kept)


if __name__ == "__main__":
    main()
