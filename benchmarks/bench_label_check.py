"""What the label check keeps (issue 44): SmolLM2's zero-shot candidates, unchecked, scored
before and after the check by a classifier trained on real records, and by the accuracy of a
classifier trained on them.

For each set (Banking77's 10 most frequent intents; Yelp's business category and stars, with
examples/yelp-label-descriptions.yaml) one pool of chat zero-shot candidates is written with
the production prompts and filters, the label check off. Then, offline, per label column:

* the gate's kappa on the candidates (:func:`dpsynth.evolution.label_check.kappa`);
* label fidelity: the share of candidates a logistic regression on real training records
  (MiniLM embeddings) gives their own label, before and after the check;
* downstream: a classifier trained on the kept candidates, scored on the real test records,
  beside one trained on as many candidates drawn at random (5 draws);
* the share of real records the check would keep (how strict it is on the real thing).

Real records are read here only to score; the check itself reads the candidates and the
label names. ``.venv/bin/python benchmarks/bench_label_check.py [--per-class 30]``

``--end-to-end SEEDS`` runs instead, on bench_side_by_side.py's job (Banking77, 10 intents,
500 private records, eps 4, N = 200), zero-shot and Aug-PE with the check on and off, each
pair on one seeded noise stream per seed, and appends their accuracy, macro-F1 and FID.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from sklearn.linear_model import LogisticRegression

from dpsynth.evolution import prompts as P
from dpsynth.evolution.label_check import kappa, own_ranks, top_k_for

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("DPSYNTH_SHARED_DATA", ROOT.parent.parent / "shared" / "data"))
OUT = ROOT / "results" / "label_check.md"


def banking() -> dict[str, Any]:
    train = pd.read_csv(SHARED / "banking77" / "train.csv")
    test = pd.read_csv(SHARED / "banking77" / "test.csv")
    counts = train["category"].value_counts()
    intents = sorted(sorted(counts.index, key=lambda c: (-counts[c], c))[:10])
    return {"name": "Banking77, 10 intents", "columns": {"category": intents},
            "describe": lambda col, v: P.readable_label(v),
            "template": "It is about {category}.", "task": "a short question you ask your "
            "online bank", "writer": "a customer of an online bank",
            "train": train[train.category.isin(intents)],
            "test": test[test.category.isin(intents)], "max_new_tokens": 64}


def yelp() -> dict[str, Any]:
    desc = yaml.safe_load((ROOT.parent / "examples" / "yelp-label-descriptions.yaml")
                          .read_text(encoding="utf-8"))
    dev = pd.read_csv(SHARED / "yelp" / "dev.csv")
    test = pd.read_csv(SHARED / "yelp" / "test.csv").sample(2000, random_state=0)
    return {"name": "Yelp, category x stars", "columns": {c: sorted(desc[c])
                                                          for c in ("label1", "label2")},
            "describe": lambda col, v: desc[col][v], "template": "{label1}. {label2}.",
            "task": "a short Yelp review", "writer": "", "train": dev, "test": test,
            "max_new_tokens": 96}


def candidates(job: dict[str, Any], per_class: int) -> pd.DataFrame:
    """One chat zero-shot candidate pool, the production prompts and filters, no label
    check."""
    from dpsynth.llm import GenerationRequest, SamplingParams, load_generator

    gen = load_generator({"backend": "local", "model": "smollm2", "batch_size": 32})
    cols = list(job["columns"])
    classes = list(itertools.product(*job["columns"].values()))
    requests, keys = [], []
    for cls in classes:
        described = {c: job["describe"](c, v) for c, v in zip(cols, cls, strict=True)}
        instruction = P.zero_shot_instruction(job["task"], job["template"].format(**described))
        for j in range(per_class):
            requests.append(GenerationRequest(
                P.render(instruction, True, job["writer"]),
                SamplingParams(temperature=1.0, top_k=50, max_new_tokens=job["max_new_tokens"],
                               seed=len(requests) * 7919 + j)))
            keys.append(cls)
    outs = gen.generate(requests, progress=False)
    rows = []
    for cls, raw in zip(keys, outs, strict=True):
        text = P.clean_generation(raw or "", 12, drop_off_task=True, writer=job["writer"],
                                  echoes=P.instruction_sentences(P.with_writer("",
                                                                               job["writer"])))
        if text is not None:
            rows.append({"text": text, **dict(zip(cols, cls, strict=True))})
    return pd.DataFrame(rows)


def passes(x: np.ndarray, labels: Sequence[str], values: list[str], value_x: np.ndarray
           ) -> np.ndarray:
    index = {v: j for j, v in enumerate(values)}
    own = np.array([index[v] for v in labels])
    return own_ranks(x, value_x, own) < top_k_for(len(values))


def fit_score(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    return float(LogisticRegression(max_iter=2000).fit(x, y).score(x_test, y_test))


def measure(job: dict[str, Any], per_class: int, embedder: Any) -> list[str]:
    pool = candidates(job, per_class)
    x = embedder.embed(list(pool.text), progress=False)
    x_train = embedder.embed(list(job["train"].text), progress=False)
    x_test = embedder.embed(list(job["test"].text), progress=False)
    lines = []
    for col, values in job["columns"].items():
        value_x = embedder.embed([job["describe"](col, v) for v in values], progress=False)
        kept = passes(x, list(pool[col]), values, value_x)
        real_kept = passes(x_train, list(job["train"][col]), values, value_x)
        judge = LogisticRegression(max_iter=2000).fit(x_train, job["train"][col])
        fidelity = judge.predict(x) == pool[col].to_numpy()
        y, y_test = pool[col].to_numpy(), job["test"][col].to_numpy()
        rng = np.random.default_rng(0)
        same_size = np.mean([fit_score(x[i], y[i], x_test, y_test) for i in
                             (rng.choice(len(y), int(kept.sum()), replace=False)
                              for _ in range(5))])
        k = kappa(float(kept.mean()), top_k_for(len(values)), len(values))
        lines.append(
            f"| {job['name']} | {col} ({len(values)} values, top {top_k_for(len(values))}) "
            f"| {k:.2f} | {int(kept.sum())} / {len(kept)} | {fidelity.mean():.2f} -> "
            f"{fidelity[kept].mean():.2f} | {fit_score(x, y, x_test, y_test):.3f} | "
            f"{fit_score(x[kept], y[kept], x_test, y_test):.3f} | {same_size:.3f} | "
            f"{real_kept.mean():.2f} |")
        print(lines[-1], flush=True)
    return lines


def _arms(seed: int) -> list[tuple[str, str, bool, str]]:
    """(run name, method, label check, lengths) of one seed: zero-shot and Aug-PE with the
    check on and off (every text up to max_words, as before drawn lengths), then Aug-PE with
    the check and drawn lengths (today's defaults)."""
    arms = [(f"{m}-s{seed}-{'on' if c else 'off'}", m, c, "longest")
            for m in ("zero_shot", "aug_pe") for c in (True, False)]
    return [*arms, (f"aug_pe-s{seed}-on-drawn", "aug_pe", True, "drawn")]


def end_to_end(seeds: list[int], runs: Path) -> list[str]:
    """:func:`_arms` on bench_side_by_side.py's job, one seeded noise stream per seed: one
    row per run (a finished run is evaluated again, not rerun)."""
    import time

    import bench_side_by_side as job
    import dpsynth
    from dpsynth.embed import Embedder

    intents, private, test, _ = job.job()
    embedder = Embedder("minilm")
    rows: list[str] = []
    reference: Path | None = None
    for seed in seeds:
        for name, method, check, lengths in _arms(seed):
            out, wall = runs / name, "earlier"
            if not (out / "release" / "synthetic.jsonl").is_file():
                cfg = job.config_of(method, job.SAMPLES, runs / f"{name}.ledger.json")
                cfg["synthesis"].update(label_check=check, lengths=lengths)
                cfg["privacy"].update({"noise": "seeded", "seed": seed})
                started = time.time()
                dpsynth.generate(private, text="text", labels=["category"],
                                 label_values={"category": intents}, epsilon=job.EPSILON,
                                 delta=job.DELTA, method=method, output=out, config=cfg,
                                 progress=False)
                wall = f"{time.time() - started:.0f}"
            reference = reference or out
            r = job.evaluate_arm(out, test, reference, embedder)
            words = [len(json.loads(x)["text"].split()) for x in
                     (out / "release" / "synthetic.jsonl").read_text().splitlines() if x]
            rows.append(f"| {method} | {seed} | {'on' if check else 'off'} | {lengths} | "
                        f"{r['synthetic']['accuracy']:.3f} | "
                        f"{r['synthetic']['macro_f1']:.3f} | {r['fid']:.3f} | "
                        f"{r['n_synthetic']} | {np.median(words):.0f} | {wall} |")
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=0,
                    help="candidates per label class (0: 30 for Banking77, 6 for Yelp)")
    ap.add_argument("--end-to-end", default="",
                    help="seeds (comma-separated): zero-shot and Aug-PE runs, check on and off")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "label-check")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    if args.end_to_end:
        rows = end_to_end([int(s) for s in args.end_to_end.split(",")], args.runs)
        with args.out.open("a", encoding="utf-8") as fh:
            fh.write(
                "\n## End to end (`--end-to-end " + args.end_to_end + "`)\n\n"
                "bench_side_by_side.py's job: Banking77's 10 most frequent intents, 500 "
                "private records, eps 4, N = 200, SmolLM2 and MiniLM, seeded noise (one seed "
                "per pair). Scored by `dpsynth.evaluate` (logistic regression) on the 400 test "
                "records of those intents. Wall: seconds of `dpsynth.generate` on a shared "
                "machine (load 1.5-3).\n\n| method | seed | label check | lengths | accuracy | "
                "macro-F1 | FID | texts | median words | wall (s) |\n"
                "|---|---|---|---|---|---|---|---|---|---|\n"
                + "\n".join(rows) + "\n")
        return
    from dpsynth.embed import Embedder

    embedder = Embedder("minilm", cache_dir=ROOT / "runs" / "embed-cache")
    rows = []
    for job, per_class in ((banking(), 30), (yelp(), 6)):
        rows += measure(job, args.per_class or per_class, embedder)
    header = ("| set | column | gate kappa | kept by the check | label fidelity, all -> kept "
              "| accuracy, all | accuracy, kept | accuracy, as many at random | real records "
              "kept |\n|---|---|---|---|---|---|---|---|---|")
    args.out.write_text(
        "# The label check on zero-shot candidates (issue 44)\n\n"
        "`HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_label_check.py`\n\n"
        "SmolLM2-135M-Instruct, chat zero-shot prompts and filters as in production, the "
        "label check off while writing; MiniLM embeddings. Label fidelity: the share of "
        "candidates a logistic regression on real training records gives their own label. "
        "Accuracy: a logistic regression trained on the candidates, scored on real test "
        "records. The check applies to a column only when its gate kappa is at least 0.3 "
        "(and significant).\n\n" + header + "\n" + "\n".join(rows) + "\n",
        encoding="utf-8")


if __name__ == "__main__":
    main()
