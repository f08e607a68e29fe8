"""The SecPE utility benchmark (issue 6): Yelp, random-word secrets, p = 1e-4 and
r/p in {2, 10, 50, inf}; SecPE against Aug-PE at the matching mu-GDP budget.

For a given (p, r), any mu-GDP mechanism with mu = Phi^-1(1 - p) - Phi^-1(1 - r) gives
(p, r)-secret protection, so Aug-PE's arm is calibrated to that mu (as (epsilon, delta) at
delta = 1e-5 through the GDP curve); r/p = inf means no protection (Aug-PE without noise).

    .venv/bin/python benchmarks/bench_secpe.py [--samples 50] [--ratios 2,10,50,inf]

Writes benchmarks/results/secpe.md.
"""

from __future__ import annotations

import argparse
import json
import math

from dpsynth.methods.secpe_theory import r_to_mu
from dpsynth.privacy import gdp_epsilon
from harness import ROOT, SHARED, markdown, run_arm

P = 1e-4
DELTA = 1e-5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--ratios", default="2,10,50,inf")
    ap.add_argument("--records", type=int, default=1000)
    args = ap.parse_args()
    data = SHARED / "yelp"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the SecPE benchmark needs ../shared/data")
    out = ROOT / "runs" / "secpe"
    out.mkdir(parents=True, exist_ok=True)
    common = {
        "data.path": str(data / "dev.csv"), "data.labels": ["label1"],
        "data.limit": args.records, "synthesis.samples": args.samples,
        "synthesis.iterations": 2, "synthesis.pool_multiplier": 2,
        "llm_cache": str(out / "llm-cache.sqlite"),
        "generators": [{"model": "smollm2", "batch_size": 32, "max_new_tokens": 48}],
        "prompts.label_template": "{label1}.",
    }
    secrets = [{"kind": "random_words", "count": 50, "percentile": 20, "seed": 0}]
    rows = []
    for ratio in args.ratios.split(","):
        rp = float(ratio)
        mu = math.inf if math.isinf(rp) else float(r_to_mu(P, P * rp))
        eps = math.inf if math.isinf(mu) else float(gdp_epsilon(mu, DELTA))
        secpe = {**common, "method": "secpe", "secpe.secrets": secrets, "secpe.p": P,
                 "secpe.r_over_p": rp, "secpe.clusters": 100}
        augpe = {**common, "method": "aug_pe", "privacy.epsilon": eps, "privacy.delta": DELTA}
        for name, overrides in ((f"secpe-r{ratio}p", secpe), (f"aug_pe-r{ratio}p", augpe)):
            row = run_arm(name, ROOT.parent / "examples" / "yelp-augpe.yaml", overrides, out,
                          data / "test.csv", ["label1"])
            row["mu"] = round(mu, 4) if math.isfinite(mu) else "inf"
            rows.append(row)
            print(json.dumps(row), flush=True)
    intro = (f"Yelp, private = first {args.records} of dev.csv, test = test.csv, category "
             f"label only, 50 random words at the 20th document-frequency percentile as "
             f"secrets, p = 1e-4, N = {args.samples}, L = 2, T = 2, SmolLM2. Aug-PE arms are "
             "calibrated to the mu-GDP budget that gives the same (p, r) protection "
             "(mu = Phi^-1(1-p) - Phi^-1(1-r), epsilon at delta 1e-5 via the GDP curve); "
             "SecPE's epsilon column is empty because it gives no record-level DP.")
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "secpe.md").write_text(markdown("SecPE vs Aug-PE on Yelp", intro, rows))


if __name__ == "__main__":
    main()
