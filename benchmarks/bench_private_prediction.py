"""Private prediction at speed (DP-SynRAG step 4): today's path (float32, whole vocabulary)
against the default (bf16 where native, public candidate set), side by side, for a few cluster
sizes; writes benchmarks/results/private_prediction.md. Each size is one call of
``dpsynth bench private-prediction`` (:mod:`dpsynth.bench.private_prediction`).

    PYTHONPATH=src .venv/bin/python benchmarks/bench_private_prediction.py --docs 16,48
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

OUT = Path(__file__).parent / "results" / "private_prediction.md"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default="16,48")
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top", type=int, default=64)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()

    from dpsynth.bench.private_prediction import bench_private_prediction

    results = [bench_private_prediction("smollm2", int(d), args.tokens, 0.3, args.rounds,
                                        args.top) for d in args.docs.split(",")]
    for r in results:
        print(json.dumps(r), flush=True)
    r0 = results[0]
    lines = [
        "# Private prediction: float32 over the whole vocabulary vs the default", "",
        f"SmolLM2-135M-Instruct on CPU ({os.cpu_count()} cores visible, "
        f"{platform.processor() or platform.machine()}, shared with other jobs: ratios "
        f"matter, absolute times do not); one cluster of demo documents, T = {args.tokens} "
        f"private tokens, c = 0.3, the same token sequence for both paths; {args.rounds} "
        "rounds alternating which path runs first, the fastest of each kept. Baseline: "
        "today's path (float32 stepper, z over all "
        f"{r0['vocab_size']} tokens). Default: the stepper in {r0['dtype']}, z over the public "
        f"candidate set (the public model's top {args.top} from a one-row stepper without "
        "documents + the demo vocabulary's tokens + end-of-text; output rows for those only).",
        "",
        "| documents | baseline tokens/s | default tokens/s | speed-up | prefill s (base / "
        "default) | decode s (base / default) | KL mean / max per token | candidates |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['documents']} | {r['baseline_tokens_per_second']:.2f} | "
            f"{r['tokens_per_second']:.2f} | {r['speedup']:.2f}x | "
            f"{r['baseline_prefill_s']:.2f} / {r['prefill_s']:.2f} | "
            f"{r['baseline_decode_s']:.2f} / {r['decode_s']:.2f} | "
            f"{r['kl']:.4f} / {r['kl_max']:.4f} | {r['support_size_mean']:.0f} |")
    lines += [
        "",
        f"Disease-name tokens (demo messages that name their disease, tokenised in the text) "
        f"in the candidate set's fixed part: {100 * r0['disease_token_share']:.0f} %; among "
        f"the public model's top {args.top} at their position alone (the message so far as "
        f"the released prefix): {100 * r0['disease_token_share_top_only']:.0f} % -- why the "
        "public vocabulary's tokens are in the set.", "",
        "    dpsynth bench private-prediction --json --docs N --tokens "
        f"{args.tokens} --rounds {args.rounds}", "",
    ]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
