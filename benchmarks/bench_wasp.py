"""The WASP benchmark (issue 5): Banking77, M = 100 private queries (the few-sample regime),
epsilon 4, delta 1e-5, the same total number of generated samples for every arm.

Arms: WASP with both offline generators, WASP with each one alone, WASP without contrastive
prompts, WASP without generator weighting, and Aug-PE; then the federated run (10 parties,
300 records split by Dirichlet(1.0)) against the same 300 records in one place.

    .venv/bin/python benchmarks/bench_wasp.py [--samples 154] [--skip-federated]

Writes benchmarks/results/wasp.md.
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from harness import ROOT, SHARED, markdown, run_arm

SMOL = {"model": "smollm2", "max_new_tokens": 40, "batch_size": 32}
GEMMA = {"model": "gemma3", "max_new_tokens": 40, "batch_size": 32}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=154)
    ap.add_argument("--skip-federated", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    data = SHARED / "banking77"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the WASP benchmark needs ../shared/data")
    out = ROOT / "runs" / "banking"
    out.mkdir(parents=True, exist_ok=True)
    train = pd.read_csv(data / "train.csv")
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
