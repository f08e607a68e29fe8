"""The Yelp benchmark of Aug-PE (issue 4): private = the first 1000 reviews of yelp/dev.csv,
test = yelp/test.csv, epsilon in {1, 4, inf}, delta 1e-5, the offline SmolLM2 generator.

    .venv/bin/python benchmarks/bench_yelp.py [--samples 100] [--epsilons 1,4,inf]

Reports FID and category / rating accuracy (logistic regression on MiniLM embeddings) of each
run next to both references (trained on the private records; zero-shot, no private votes),
with wall time and LLM calls. Writes benchmarks/results/yelp.md.
"""

from __future__ import annotations

import argparse
import json

from harness import ROOT, SHARED, markdown, run_arm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=100)
    ap.add_argument("--epsilons", default="1,4,inf")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args()
    data = SHARED / "yelp"
    if not data.is_dir():
        raise SystemExit(f"{data} not found: the Yelp benchmark needs ../shared/data")
    out = ROOT / "runs" / "yelp"
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for eps in args.epsilons.split(","):
        overrides = {"privacy.epsilon": float(eps), "data.path": str(data / "dev.csv"),
                     "synthesis.samples": args.samples, "llm_cache": str(out / "llm-cache.sqlite"),
                     "generators": [{"model": "smollm2", "batch_size": 32,
                                     "max_new_tokens": args.max_new_tokens}]}
        row = run_arm(f"aug_pe-eps{eps}", ROOT.parent / "examples" / "yelp-augpe.yaml",
                      overrides, out, data / "test.csv", ["label1", "label2"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    intro = (f"Aug-PE, private = first 1000 of yelp/dev.csv, test = yelp/test.csv (5000), "
             f"delta = 1e-5, SmolLM2-135M-Instruct (Q4_1 GGUF, CPU), N = {args.samples} "
             "synthetic samples over the 50 (category, stars) classes, L = 3, T = 2, "
             f"max_new_tokens = {args.max_new_tokens}. Accuracy: logistic regression on MiniLM "
             "embeddings; `private` = trained on the 1000 private records, `zero_shot` = "
             "trained on the run's zero-shot generations (no private votes). Arms share one "
             "request cache (identical zero-shot requests are paid once).")
    (ROOT / "results").mkdir(exist_ok=True)
    (ROOT / "results" / "yelp.md").write_text(markdown("Yelp: Aug-PE", intro, rows))


if __name__ == "__main__":
    main()
