"""InvisibleInk (Vinod et al., NeurIPS 2025: private prediction at inference time, each token
an exponential mechanism over difference-clipped logits, top-k+ sampling) as an external
baseline for issue 45, on bench_side_by_side.py's job.

InvisibleInk is PyPI's ``invink`` (GPL-3). It runs in ITS OWN virtual environment: dpsynth
never imports it and never installs it; this script starts that environment's Python on a
JSON spec (the driver below is ours) and reads JSON back.

    python3.12 -m venv /tmp/invink-venv   # invink 0.1.0 needs Python 3.12 (its f-strings)
    /tmp/invink-venv/bin/pip install torch==2.13.0 invink==0.1.0
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/bench_invisibleink.py \
        --invink-python /tmp/invink-venv/bin/python [--per-intent 1] [--max-tokens 32] \
        [--prompts invink|side_by_side] [--evaluate [--compare-runs DIR]] \
        [--job-intents 0 --job-records 2000] [--dataset yelp]

The job: Banking77's 10 most frequent intents, 500 private records (bench_side_by_side.job;
``--job-intents 0 --job-records 2000``: all 77 intents, 2000 records, the issue-45 job;
``--dataset yelp --job-records 2000``: 2000 Yelp reviews labelled by business category and
stars), epsilon 4, delta 1e-5, the embedded SmolLM2-135M-Instruct (the float weights dpsynth
makes from its GGUF; the same model every dpsynth arm uses). InvisibleInk has no labels: it
runs once per class (a Banking77 intent; a Yelp category and stars pair) on that class's
records (disjoint partitions), with the public description of the side-by-side prompts
("Short questions that customers of an online bank ask. It is about <intent>."; Yelp: the
side-by-side label sentence, "Business Category: Bars. Review Stars: 4.0.").

Settings: invink's documented defaults (``batch_size`` 8: 7 private references and the public
prompt a token; top-k 100; temperature 1), except three that would read the private data
outside its guarantee or cannot run here:

* ``num``: given, ``--per-intent`` texts per class (invink's ``auto`` is the private record
  count // 7). ``--per-intent auto`` runs invink's ``auto`` for comparison: every record used
  once (255 texts on the 2000-record job, against the N = 500 of dpsynth's arms), but the
  number of texts per class then discloses each class's record count to within 7, outside
  the guarantee (dpsynth's arms release noisy counts or none). A class with fewer records
  than its texts need exits, unless ``--fewer-where-small`` gives it what its records allow
  (Yelp's 2000 reviews fall into 50 classes, 14 of them under 7 reviews): the same disclosure
  as ``auto``, for the small classes;
* ``max_toks``: given, ``--max-tokens`` (invink's ``auto`` is the mean + 2 std of the private
  records' token counts);
* ``dtype`` float32 on the CPU (``device_map`` -1; its default bfloat16 is emulated on a CPU
  without bf16), ``allow_download`` False (the offline model folder).

Accounting conventions, where they differ from dpsynth's (docs/which-method.md):

* a text's clip norm is calibrated so that ``max_toks`` tokens meet (epsilon, delta) through
  zCDP (rho a token = (C / ((B - 1) T))^2 / 2, composed over the tokens, converted to
  (epsilon, delta));
* texts are composed in parallel over disjoint batches of B - 1 records taken in file order:
  a guarantee for replacing one record. Adding or removing one shifts every later record to
  another batch, so under dpsynth's add/remove neighbours it is not a parallel composition;
* ``epsilon_spent`` a text is data-dependent (the tokens generated before the end token); the
  guarantee is the one at ``max_toks``.

Writes benchmarks/results/invisibleink.md: the machine and its load, wall and CPU seconds a
text (invink's process: ``RUSAGE_CHILDREN``), its peak memory, invink's epsilon and every text.
With ``--evaluate`` also a classifier's accuracy on the test slice, as bench_side_by_side.py
scores its arms (logistic regression on MiniLM embeddings); with ``--compare-runs DIR`` (a
bench_side_by_side.py ``--runs`` folder of the same job) also that folder's arms' releases cut
to invink's number of texts per intent and scored the same way (``--draws`` random cuts), so
the classifiers compare at equal training sizes (``real`` among ``--compare-arms``: the private
records cut the same way, a reference that is NOT private; with ``zero_shot`` it gives each
arm's gap closed at that size). The texts and facts go to OUT with a
``.json`` suffix too; ``--from-json`` rescores them without running invink again.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_side_by_side as side_by_side  # noqa: E402
from bench_side_by_side import DELTA, EPSILON, PROMPTS, load, machine  # noqa: E402
from dpsynth.llm.local import LocalGenerator  # noqa: E402

#: the side-by-side job's Banking77 prompts
BANKING = PROMPTS["banking77"]
#: what one record is called in the private-side prompt, per data set
RECORD_NOUN = {"banking77": "question", "yelp": "review"}
OUT = Path(__file__).resolve().parent / "results" / "invisibleink.md"

#: what runs in invink's own environment: read the spec, call invink.generate, print JSON
DRIVER = r"""
import json, sys, time
import invink
spec = json.load(sys.stdin)
out = []
for part in spec["parts"]:
    t0 = time.time()
    res = invink.generate(part["texts"], spec["model"], part["description"],
                          **spec["prompts"], epsilon=spec["epsilon"], delta=spec["delta"],
                          batch_size=spec["batch_size"], num=part["num"],
                          max_toks=spec["max_tokens"], dtype="float32", device_map=-1,
                          allow_download=False, trust_remote_code=False,
                          random_seed=spec["seed"])
    out.append({"label": part["label"], "labels": part["labels"], "texts": list(res.texts),
                "lens": list(res.lens),
                "epsilon_spent": list(res.epsilon_spent), "wall_s": time.time() - t0})
    print(f"invink: {part['label']}: {part['num']} text(s) in {time.time() - t0:.0f} s",
          file=sys.stderr, flush=True)
print("INVINK-JSON " + json.dumps(out))
"""


def side_by_side_prompts(dataset: str) -> dict[str, str]:
    """``--prompts side_by_side``: dpsynth's zero-shot request of the side-by-side job (its
    system line where the set has a writer, else invink's own; the task and label sentence),
    with one private reference on the private side; invink fills the first {} with the
    description (the label sentence), the second with the reference. ``--prompts invink``:
    invink's own (the default)."""
    cfg, noun = PROMPTS[dataset], RECORD_NOUN[dataset]
    system = {"system_prompt": f"You are {cfg['writer']}."} if cfg.get("writer") else {}
    return {**system,
            "pub_prompt": f"Write {cfg['task']}. {{}} Reply with the text only.",
            "prv_prompt": (f"Write {cfg['task']}. {{}} Here is one such {noun}: \"{{}}\" Write "
                           "another one like it. Reply with the text only.")}


def description(labels: dict[str, str], prompts: str, dataset: str) -> str:
    """The public description of one class's records: invink's prompts get the dataset and
    the class, the side-by-side prompts the label sentence alone."""
    if dataset == "yelp":
        label = PROMPTS["yelp"]["label_template"].format(**labels)
        return label if prompts == "side_by_side" else "Yelp reviews. " + label
    label = BANKING["label_template"].format(category=labels["category"].replace("_", " "))
    if prompts == "side_by_side":
        return label
    return "Short questions that customers of an online bank ask. " + label


def labels_of(result: dict[str, Any]) -> dict[str, str]:
    """One result's label values by column (the Banking77 JSONs written before Yelp ran hold
    the intent alone, under ``label``)."""
    return result.get("labels") or {"category": result["label"]}


def _relay(stream: Any, lines: list[str]) -> None:
    """Keep invink's stderr, showing the driver's progress lines as they come."""
    for line in stream:
        lines.append(line)
        if line.startswith("invink: "):
            print(line, end="", file=sys.stderr, flush=True)


def run_invink(python: str, spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The driver in invink's environment; (its results, its process's cost)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen([python, "-c", DRIVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines: list[str] = []
    reader = threading.Thread(target=_relay, args=(proc.stderr, err_lines), daemon=True)
    reader.start()
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec))  # the driver reads it whole before it writes
    proc.stdin.close()
    out = proc.stdout.read()
    proc.wait()
    reader.join()
    stderr = "".join(err_lines)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        sys.exit(f"invink's process failed (exit {proc.returncode}):\n{tail}")
    line = next(x for x in out.splitlines() if x.startswith("INVINK-JSON "))
    cost = {"wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "peak_rss_mib": after.ru_maxrss / 1024.0}
    return json.loads(line[len("INVINK-JSON "):]), cost


@functools.cache
def _embedder() -> Any:
    from dpsynth.embed import Embedder

    return Embedder("minilm")


def _embedded(texts: list[str]) -> Any:
    import numpy as np

    return np.asarray(_embedder().embed(texts), dtype=np.float32)


class EmbeddedTest(NamedTuple):
    """The test texts, embedded once: their vectors, labels by column and Gaussian statistics
    (FID)."""

    x: Any
    y: dict[str, list[str]]
    stats: tuple[Any, Any]


def embed_test(test: Any, columns: list[str]) -> EmbeddedTest:
    from dpsynth.eval.fidelity import gaussian_stats

    x = _embedded(test["text"].astype(str).tolist())
    return EmbeddedTest(x, {c: test[c].astype(str).tolist() for c in columns}, gaussian_stats(x))


def _fid(x: Any, test: EmbeddedTest) -> float:
    """FID of a set of embeddings to the test texts' (below 384 texts the covariance is rank
    deficient and FID biased upward: compare it only at equal sizes, as :func:`compare` does;
    hence the distance itself rather than ``dpsynth.eval.fidelity.fid``, which refuses them)."""
    from dpsynth.eval.fidelity import frechet_distance, gaussian_stats

    return frechet_distance(*gaussian_stats(x), *test.stats)


def _scores(train_x: Any, labels: list[dict[str, str]], test: EmbeddedTest
            ) -> dict[str, dict[str, Any]]:
    """A classifier per label column, trained on ``train_x`` and scored on the test texts."""
    from dpsynth.eval.utility import logreg_scores

    return {c: logreg_scores(train_x, [lab[c] for lab in labels], test.x, ys)
            for c, ys in test.y.items()}


def evaluate(results: list[dict[str, Any]], test: EmbeddedTest) -> dict[str, Any]:
    """Accuracy and macro-F1 of logistic regression on MiniLM embeddings of the texts, per
    label column, and their FID to the test texts."""
    texts = [t for r in results for t in r["texts"]]
    labels = [labels_of(r) for r in results for _ in r["texts"]]
    train_x = _embedded(texts)
    return {"columns": _scores(train_x, labels, test), "fid_test": _fid(train_x, test)}


def column_scores(scores: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """:func:`evaluate`'s scores by column (the Banking77 JSONs written before Yelp ran hold
    one column's, flat)."""
    return scores.get("columns") or {"category": scores}


def _class_key(labels: dict[str, str]) -> str:
    return " / ".join(labels.values())


def _class_keys(frame: Any, columns: list[str]) -> Any:
    """Each row's :func:`_class_key` (a pandas Series)."""
    return frame[columns].astype(str).apply(lambda row: _class_key(dict(row)), axis=1)


def _release_by_class(runs: Path, arm: str) -> dict[str, list[str]]:
    """One side-by-side arm's released texts by class (its label values joined)."""
    path = runs / arm / "release" / "synthetic.jsonl"
    if not path.is_file():
        sys.exit(f"--compare-runs: {path} not found (is {arm} a finished arm of that folder?)")
    by_class: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_class.setdefault(_class_key(row["labels"]), []).append(row["text"])
    return by_class


def _private_by_class(private: Any, columns: list[str]) -> dict[str, list[str]]:
    """The private records by class: the ``real`` reference (NOT private)."""
    return {key: group.astype(str).tolist()
            for key, group in private["text"].groupby(_class_keys(private, columns))}


def compare(results: list[dict[str, Any]], test: EmbeddedTest,
            sources: dict[str, dict[str, list[str]]], draws: int) -> dict[str, dict[str, Any]]:
    """Each source's texts by class (a side-by-side arm's release; ``real``: the private
    records) cut to invink's number of texts per class, ``draws`` random cuts (seeds
    0..draws-1), each scored as :func:`evaluate` scores invink's: the classifiers and FID at
    equal training sizes (a class with fewer texts than invink's gives all it has). Per arm:
    the mean FID and, per label column, the mean and standard deviation of accuracy and
    macro-F1."""
    import numpy as np

    want = {_class_key(labels_of(r)): (labels_of(r), len(r["texts"])) for r in results}
    out = {}
    for arm, by_class in sources.items():
        every = [t for ts in by_class.values() for t in ts]
        vec = dict(zip(every, _embedded(every), strict=True))
        sizes = {key: min(n, len(by_class.get(key, []))) for key, (_, n) in want.items()}
        runs_scores, fids = [], []
        for seed in range(draws):
            rng = random.Random(seed)
            picked = [(t, want[key][0]) for key, n in sizes.items()
                      for t in rng.sample(by_class.get(key, []), n)]
            train_x = np.stack([vec[t] for t, _ in picked])
            runs_scores.append(_scores(train_x, [lab for _, lab in picked], test))
            fids.append(_fid(train_x, test))
        columns = {}
        for c in test.y:
            acc = [sc[c]["accuracy"] for sc in runs_scores]
            f1 = [sc[c]["macro_f1"] for sc in runs_scores]
            columns[c] = {"accuracy": float(np.mean(acc)), "accuracy_sd": float(np.std(acc)),
                          "macro_f1": float(np.mean(f1)), "macro_f1_sd": float(np.std(f1))}
        out[arm] = {"columns": columns, "fid_test": float(np.mean(fids)),
                    "texts": sum(sizes.values())}
    return out


def markdown(facts: dict[str, Any], results: list[dict[str, Any]]) -> str:
    n = sum(len(r["texts"]) for r in results)
    tokens = sum(sum(r["lens"]) for r in results)
    cost = facts["cost"]
    eps = [e for r in results for e in r["epsilon_spent"]]
    lines = [
        "# InvisibleInk (invink) on the side-by-side job", "",
        f"`{facts['command']}`", "",
        *([f"Scored again from its JSON (invink not rerun): `{facts['rescored']}`", ""]
          if facts.get("rescored") else []),
        f"{facts['date']}; {facts['machine']}; load before / after: {facts['load_before']} "
        f"-> {facts['load_after']}. invink {facts['invink_version']} in its own virtual "
        f"environment; SmolLM2-135M-Instruct float32 on the CPU.", "",
        f"Epsilon {facts['epsilon']:g} a text (parallel over disjoint batches of "
        f"{facts['batch_size'] - 1} records), delta {facts['delta']:g}, max_toks "
        f"{facts['max_tokens']}, {facts['per_intent']} text(s) per class over "
        f"{len(results)} classes; prompts: {facts['prompts']}"
        + ("; a class with too few records for its texts gets what they allow "
           "(`--fewer-where-small`)" if facts.get("fewer_where_small") else "") + ".", "",
        "| texts | tokens | wall s / text | CPU s / text | CPU s / token | peak RSS MiB | "
        "invink's epsilon_spent (min-max) |",
        "|---|---|---|---|---|---|---|",
        f"| {n} | {tokens} | {cost['wall_s'] / max(1, n):.1f} | {cost['cpu_s'] / max(1, n):.1f} "
        f"| {cost['cpu_s'] / max(1, tokens):.2f} | {cost['peak_rss_mib']:.0f} | "
        f"{min(eps):.2f}-{max(eps):.2f} |", "",
        "The wall and CPU seconds include loading the model once per class (invink.generate "
        "loads it on every call).", ""]
    lines += score_lines(facts, n)
    lines += ["## Every text", "", "| class | tokens | text |", "|---|---|---|"]
    for r in results:
        for text, length in zip(r["texts"], r["lens"], strict=True):
            flat = " ".join(text.split()).replace("|", "\\|")
            lines.append(f"| {r['label']} | {length} | {flat} |")
    return "\n".join(lines) + "\n"


def score_lines(facts: dict[str, Any], n: int) -> list[str]:
    """The classifiers' scores of invink's texts and, with ``--compare-runs``, the arms' at
    invink's training size: one accuracy / macro-F1 pair per label column."""
    if not facts.get("scores"):
        return []
    ours = column_scores(facts["scores"])
    fid = facts["scores"].get("fid_test")
    lines = ["Classifiers trained on the " + str(n) + " texts: " + "; ".join(
        f"{c}: accuracy {sc['accuracy']:.3f}, macro-F1 {sc['macro_f1']:.3f}"
        for c, sc in ours.items()) + f" on {next(iter(ours.values()))['n_test']} test records"
        + (f"; FID to the test texts {fid:.3f}" if fid is not None else "") + ".", ""]
    if not facts.get("compare"):
        return lines
    head = " | ".join(f"{c} accuracy | {c} macro-F1" for c in ours)
    lines += [f"The side-by-side arms of `{facts['compare_runs']}` at invink's training size: "
              "each arm's release cut to invink's number of texts per class, "
              f"{facts['draws']} random cuts, the same classifiers and test records "
              "(mean, standard deviation):", "",
              f"| arm | texts | {head} | FID to the test texts (equal sizes) |",
              "|---|---|" + "---|---|" * len(ours) + "---|",
              f"| InvisibleInk | {n} | " + " | ".join(
                  f"{sc['accuracy']:.3f} | {sc['macro_f1']:.3f}" for sc in ours.values())
              + f" | {fid:.3f} |"]
    for arm, c in facts["compare"].items():
        cols = column_scores(c)
        lines.append(f"| `{arm}` | {c['texts']} | " + " | ".join(
            f"{sc['accuracy']:.3f} ({sc['accuracy_sd']:.3f}) | "
            f"{sc['macro_f1']:.3f} ({sc['macro_f1_sd']:.3f})" for sc in cols.values())
            + f" | {c['fid_test']:.3f} |")
    return [*lines, "", *gap_lines(facts["compare"], ours)]


def gap_lines(compare: dict[str, Any], ours: dict[str, dict[str, Any]]) -> list[str]:
    """With the ``zero_shot`` and ``real`` cuts among the arms: the share of the gap between
    them that InvisibleInk and each private arm close at this size, per column (accuracy)."""
    if "zero_shot" not in compare or "real" not in compare:
        return []
    zs, real = column_scores(compare["zero_shot"]), column_scores(compare["real"])
    arms = {"InvisibleInk": ours, **{f"`{a}`": column_scores(c) for a, c in compare.items()
                                     if a not in ("zero_shot", "real")}}
    parts = []
    for col in ours:
        base = zs[col]["accuracy"]
        gap = real[col]["accuracy"] - base
        if gap <= 0:  # a share of a gap that is not there means nothing
            parts.append(f"{col}: none, the real records score under zero-shot at this size")
            continue
        shares = ", ".join(f"{name} {100 * (sc[col]['accuracy'] - base) / gap:+.0f} %"
                           for name, sc in arms.items())
        parts.append(f"{col}: {shares}")
    return ["Gap closed in accuracy at this size, (arm - zero-shot) / (real - zero-shot), the "
            "real records cut the same way (a reference, NOT private): " + "; ".join(parts)
            + ".", ""]


def classes_of(domain: dict[str, list[str]]) -> list[dict[str, str]]:
    """The job's classes from its public label domain: each Banking77 intent; each Yelp
    category and stars pair."""
    columns = list(domain)
    return [dict(zip(columns, values, strict=True))
            for values in itertools.product(*(domain[c] for c in columns))]


def parts_of(args: argparse.Namespace, private: Any,
             classes: list[dict[str, str]]) -> list[dict[str, Any]]:
    """invink's calls: one a class, on that class's records (disjoint partitions). With
    ``--fewer-where-small`` a class whose records cannot fill its texts' batches gets the
    texts they can (none: no call)."""
    parts = []
    for labels in classes:
        mine = (private[list(labels)].astype(str) == list(labels.values())).all(axis=1)
        texts = private.loc[mine, "text"].astype(str).tolist()
        fits = len(texts) // (args.batch - 1)
        num = fits if args.per_intent == "auto" else args.per_intent
        if num > fits:
            if not args.fewer_where_small:
                sys.exit(f"{_class_key(labels)}: {num} texts need {num} x {args.batch - 1} "
                         "records (--fewer-where-small gives such a class what it allows)")
            num = fits
        if num:
            parts.append({"label": _class_key(labels), "labels": labels, "texts": texts,
                          "num": num, "description": description(labels, args.prompts,
                                                                 args.dataset)})
    return parts


def per_intent(value: str) -> int | str:
    """``--per-intent``: a positive count, or ``auto``."""
    if value == "auto" or (value.isdigit() and int(value) > 0):
        return value if value == "auto" else int(value)
    raise argparse.ArgumentTypeError(f"{value!r}: a positive whole number or 'auto'")


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--invink-python", default=os.environ.get("DPSYNTH_INVINK_PYTHON"),
                    help="the Python of invink's own virtual environment")
    ap.add_argument("--per-intent", default=1, type=per_intent,
                    help="texts per class, or 'auto': invink's default, records // (B - 1)")
    ap.add_argument("--fewer-where-small", action="store_true",
                    help="a class with too few records for --per-intent texts gets what its "
                         "records allow (discloses which classes are small)")
    ap.add_argument("--dataset", choices=sorted(side_by_side.LABELS), default="banking77",
                    help="the side-by-side job's data set (its --dataset)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="invink's batch_size (B)")
    ap.add_argument("--epsilon", type=float, default=EPSILON)
    ap.add_argument("--intents", type=int, default=0, help="only the first K classes (0: all)")
    ap.add_argument("--job-intents", type=int, default=side_by_side.INTENTS,
                    help="the side-by-side job's intents (its --intents; 0: all 77)")
    ap.add_argument("--job-records", type=int, default=side_by_side.RECORDS,
                    help="the side-by-side job's private records (its --records)")
    ap.add_argument("--prompts", choices=("invink", "side_by_side"), default="invink")
    ap.add_argument("--evaluate", action="store_true")
    ap.add_argument("--compare-runs", type=Path,
                    help="a bench_side_by_side.py --runs folder of the same job: score its "
                         "arms' releases cut to invink's texts per class (with --evaluate)")
    ap.add_argument("--compare-arms", default="zero_shot,aug_pe_uniform",
                    help="the arms to cut; 'real': the private records themselves (a "
                         "reference, NOT private: with zero_shot, the gap closed)")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--from-json", type=Path,
                    help="an earlier run's OUT.json: rescore and rewrite, invink not run")
    ap.add_argument("--out", type=Path, default=OUT)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    side_by_side.INTENTS, side_by_side.RECORDS = args.job_intents, args.job_records
    side_by_side.DATASET = args.dataset
    domain, private, test, _ = side_by_side.job()
    classes = classes_of(domain)
    if args.intents:
        classes = classes[:args.intents]
        keep = {_class_key(c) for c in classes}
        test = test[_class_keys(test, list(domain)).isin(keep)]
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        facts, results = saved["facts"], saved["results"]
        facts["rescored"] = ("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python "
                             "benchmarks/bench_invisibleink.py " + " ".join(sys.argv[1:]))
    else:
        facts, results = run(args, private, classes)
    if args.evaluate:
        embedded_test = embed_test(test, list(domain))
        facts["scores"] = evaluate(results, embedded_test)
        if args.compare_runs:
            facts["compare_runs"], facts["draws"] = str(args.compare_runs), args.draws
            sources = {arm: (_private_by_class(private, list(domain)) if arm == "real"
                             else _release_by_class(args.compare_runs, arm))
                       for arm in args.compare_arms.split(",")}
            facts["compare"] = compare(results, embedded_test, sources, args.draws)
    args.out.with_suffix(".json").write_text(json.dumps({"facts": facts, "results": results}))
    text = markdown(facts, results)
    args.out.write_text(text, encoding="utf-8")
    print(text)


def run(args: argparse.Namespace, private: Any,
        classes: list[dict[str, str]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """invink in its own environment on the job; (the run's facts, its results)."""
    if not args.invink_python:
        sys.exit("give --invink-python (or $DPSYNTH_INVINK_PYTHON): invink's own environment")
    version = subprocess.run([args.invink_python, "-c", "import importlib.metadata as m; "
                              "print(m.version('invink'))"], capture_output=True, text=True,
                             check=False).stdout.strip() or "?"
    model_dir = str(LocalGenerator("smollm2", engine="transformers").model_dir)
    spec = {"model": model_dir, "epsilon": args.epsilon, "delta": DELTA,
            "batch_size": args.batch, "max_tokens": args.max_tokens, "seed": 0,
            "prompts": (side_by_side_prompts(args.dataset) if args.prompts == "side_by_side"
                        else {}),
            "parts": parts_of(args, private, classes)}
    if not spec["parts"]:
        sys.exit("no class has the records for one text at this --batch: nothing to run")
    facts: dict[str, Any] = {
        "command": "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python "
                   "benchmarks/bench_invisibleink.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "machine": machine(), "load_before": load(),
        "invink_version": version, "epsilon": args.epsilon, "delta": DELTA,
        "batch_size": args.batch, "max_tokens": args.max_tokens,
        "per_intent": args.per_intent, "prompts": args.prompts, "dataset": args.dataset,
        "fewer_where_small": args.fewer_where_small}
    results, facts["cost"] = run_invink(args.invink_python, spec)
    facts["load_after"] = load()
    return facts, results


if __name__ == "__main__":
    main()
