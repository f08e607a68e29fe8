"""Issue 45's speed goal as a user meets it: a full 2000-record, 1-epoch DP fine-tune of the
default generator with dp_finetune's defaults (loop clipping, batch 32, LoRA r = 8 on every
layer), then a small release, timed from the run's own log.

    env PYTHONPATH=src .venv/bin/python benchmarks/dp_finetune_epoch.py OUT_DIR \\
        [--records 2000] [--samples 20] [--epsilon 4] [--dataset banking77|yelp]

Banking77's training set (../shared/data, all 77 intents, ``--records`` rows drawn with seed 0)
or Yelp's dev set (``--records`` reviews drawn with seed 0, the category and stars columns, the
values of dev and test as the declared domain), the prompts of the side-by-side job. Prints
the training time (the log's budget line to "training 100% done"), the wall time of the whole
run, the machine and its load, and the released texts (synthetic, safe to read).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_side_by_side import PROMPTS, SHARED  # the side-by-side job's data and prompts
from dpsynth.bench.machine import Where, describe


def training_seconds(log: Path) -> float:
    """From the run's first log line to its "training 100% done" line."""
    stamps = [(datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S"), line[20:])
              for line in log.read_text(encoding="utf-8").splitlines() if line[:4].isdigit()]
    end = next(t for t, msg in stamps if "training 100% done" in msg)
    return (end - stamps[0][0]).total_seconds()


def private_set(dataset: str, records: int) -> tuple[Any, dict[str, list[str]]]:
    """(``records`` private rows drawn with seed 0, each label column's declared values)."""
    import pandas as pd

    if dataset == "yelp":
        dev = pd.read_csv(SHARED / "yelp" / "dev.csv")
        test = pd.read_csv(SHARED / "yelp" / "test.csv")
        cols = ["label1", "label2"]
        domain = {c: sorted(set(dev[c].astype(str)) | set(test[c].astype(str))) for c in cols}
        private = dev.sample(n=records, random_state=0).reset_index(drop=True)
        return private[["text", *cols]].astype({c: str for c in cols}), domain
    train = pd.read_csv(SHARED / "banking77" / "train.csv")
    private = train.sample(n=records, random_state=0).reset_index(drop=True)
    return private[["text", "category"]], {"category": sorted(train["category"].unique())}


def main() -> None:
    import dpsynth

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="a new folder for the run and its ledger")
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--dataset", choices=["banking77", "yelp"], default="banking77")
    args = ap.parse_args()
    private, domain = private_set(args.dataset, args.records)
    run = args.out / "run"
    with Where() as where:
        t = time.perf_counter()
        dpsynth.generate(private, text="text", labels=list(domain), label_values=domain,
                         epsilon=args.epsilon, delta=1e-5,
                         method="dp_finetune", output=run, progress=False,
                         config={"dp_finetune": {"records": args.records, "epochs": 1,
                                                 "samples": args.samples},
                                 "prompts": PROMPTS[args.dataset],
                                 "privacy": {"ledger": str(args.out / "ledger.json")}})
        wall = time.perf_counter() - t
    print(f"training {training_seconds(run / 'log.txt'):.0f} s, whole run {wall:.0f} s")
    print(describe(where.result()))
    for line in (run / "release" / "synthetic.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        print(f"{' / '.join(row['labels'].values())}: {row['text']}")


if __name__ == "__main__":
    main()
