"""One table from several runs folders of ``bench_side_by_side.py`` that hold the same arms:
each folder's zero-shot set and its private arms' scores beside it, and per arm the mean of
its difference to its own folder's zero-shot set (paired replicates of one configuration).

Usage: .venv/bin/python benchmarks/side_by_side_replicates.py --runs DIR [DIR ...]
       [--arms zero_shot,aug_pe,aug_pe_uniform] [--title T] [--intro FILE] [--out FILE]
Each DIR is a ``--runs`` folder (its ``state.json`` and ``by_eye_ARM.txt`` are read; the
on-task counts are the ones given to the bench with ``--by-eye``).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def scores(state: dict, arm: str) -> dict | None:
    rec = state["arms"].get(arm) or {}
    return rec.get("scores") and {"accuracy": rec["scores"]["synthetic"]["accuracy"],
                                  "macro_f1": rec["scores"]["synthetic"]["macro_f1"],
                                  "fid": rec["scores"].get("fid"),
                                  "wall_s": rec.get("wall_s"),
                                  "peak_mb": rec.get("peak_mb"),
                                  "load": rec.get("load_before"),
                                  "by_eye": state.get("by_eye", {}).get(arm, "not read")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, nargs="+", required=True)
    ap.add_argument("--arms", default="zero_shot,aug_pe,aug_pe_uniform")
    ap.add_argument("--title", default="Paired replicates of the side by side")
    ap.add_argument("--intro", type=Path, help="markdown placed under the title")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    arms = args.arms.split(",")
    lines = [f"# {args.title}", ""]
    if args.intro:
        lines += [args.intro.read_text(encoding="utf-8").strip(), ""]
    lines += ["| runs folder | epsilon | arm | accuracy | macro-F1 | vs this folder's zero-shot "
              "(points) | FID | on task by eye | wall (s) | peak RSS (MB) | load before |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    diffs: dict[tuple[float, str], list[float]] = {}
    for runs in args.runs:
        state = json.loads((runs / "state.json").read_text())
        zero = scores(state, "zero_shot")
        for arm in arms:
            s = scores(state, arm)
            if s is None:
                continue
            diff = ""
            if zero and arm != "zero_shot":
                d = 100 * (s["accuracy"] - zero["accuracy"])
                diffs.setdefault((state["epsilon"], arm), []).append(d)
                diff = f"{d:+.1f}"
            lines.append(f"| {runs} | {state['epsilon']:g} | {arm} | {s['accuracy']:.3f} | "
                         f"{s['macro_f1']:.3f} | {diff} | {s['fid']:.3f} | {s['by_eye']} | "
                         f"{s['wall_s']} | {s['peak_mb'] or 'not measured'} | {s['load']} |")
    lines += ["", "Per epsilon and arm, the difference to the folder's own zero-shot set:", "",
              "| epsilon | arm | runs | mean (points) | each |", "|---|---|---|---|---|"]
    for (eps, arm), ds in sorted(diffs.items()):
        lines.append(f"| {eps:g} | {arm} | {len(ds)} | {statistics.mean(ds):+.1f} | "
                     f"{', '.join(f'{d:+.1f}' for d in ds)} |")
    args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
