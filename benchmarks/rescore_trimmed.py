"""The same released texts scored before and after trimming each one back to its last full
sentence (:func:`dpsynth.evolution.prompts.trim_to_sentence`, what ``dp_finetune`` now does to
its samples): how much of a release ends mid-sentence, and what the trim does to accuracy,
macro-F1 and FID on the side-by-side job.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DPSYNTH_SHARED_DATA=../shared/data \
        .venv/bin/python benchmarks/rescore_trimmed.py --runs DIR --arm dp_finetune_default \
        [--dataset yelp] [--records 2000] [--intents 0] [--samples 500]

``--runs`` is a ``bench_side_by_side.py`` runs folder (its ``state.json`` names the job); the
arm's run folder is copied to a temporary folder, its release rewritten trimmed, and both are
scored by the side-by-side bench's own ``evaluate_arm`` against the folder's zero-shot arm.
Prints one JSON line per column: the share of texts that end a sentence, and the scores
before and after. Post-processing of released texts only: nothing private is read beyond
what the bench's evaluation reads.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_side_by_side as bench  # noqa: E402
from dpsynth.evolution.prompts import cut_share, trim_to_sentence  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--arm", required=True)
    args = ap.parse_args()
    state = json.loads((args.runs / "state.json").read_text())
    bench.DATASET, bench.RECORDS = state["dataset"], state["records"]
    bench.INTENTS, bench.SAMPLES = state["top_intents"], state["samples"]
    _, _, test, _ = bench.job()
    from dpsynth.embed import Embedder

    embedder = Embedder("minilm")
    zero_shot = args.runs / "zero_shot"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / args.arm
        shutil.copytree(args.runs / args.arm, copy)
        path = copy / "release" / "synthetic.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        before_texts = [r["text"] for r in rows]
        before = bench.evaluate_arm(copy, test, zero_shot, embedder)
        for r in rows:
            r["text"] = trim_to_sentence(r["text"])
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        after = bench.evaluate_arm(copy, test, zero_shot, embedder)
    after_texts = [r["text"] for r in rows]
    for col in before:
        print(json.dumps({
            "arm": args.arm, "runs": str(args.runs), "column": col,
            "ends_a_sentence": [round(1 - cut_share(before_texts), 3),
                                round(1 - cut_share(after_texts), 3)],
            "trimmed": sum(a != b for a, b in zip(before_texts, after_texts, strict=True)),
            "words_median": [sorted(len(t.split()) for t in x)[len(x) // 2]
                             for x in (before_texts, after_texts)],
            "accuracy": [before[col]["synthetic"]["accuracy"],
                         after[col]["synthetic"]["accuracy"]],
            "macro_f1": [before[col]["synthetic"]["macro_f1"],
                         after[col]["synthetic"]["macro_f1"]],
            "fid": [before[col]["fid"], after[col]["fid"]]}))


if __name__ == "__main__":
    main()
