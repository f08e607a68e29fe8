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
        [--job-intents 0 --job-records 2000]

The job: Banking77's 10 most frequent intents, 500 private records (bench_side_by_side.job;
``--job-intents 0 --job-records 2000``: all 77 intents, 2000 records, the issue-45 job),
epsilon 4, delta 1e-5, the embedded SmolLM2-135M-Instruct (the float weights dpsynth makes
from its GGUF; the same model every dpsynth arm uses). InvisibleInk has no labels: it runs
once per intent on that intent's records (disjoint partitions), with the public description
of the side-by-side prompts ("Short questions that customers of an online bank ask. It is
about <intent>.").

Settings: invink's documented defaults (``batch_size`` 8: 7 private references and the public
prompt a token; top-k 100; temperature 1), except three that would read the private data
outside its guarantee or cannot run here:

* ``num``: given, ``--per-intent`` texts per intent (invink's ``auto`` is the private record
  count // 7). ``--per-intent auto`` runs invink's ``auto`` for comparison: every record used
  once (255 texts on the 2000-record job, against the N = 500 of dpsynth's arms), but the
  number of texts per intent then discloses each intent's record count to within 7, outside
  the guarantee (dpsynth's arms release noisy counts or none);
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
the classifiers compare at equal training sizes. The texts and facts go to OUT with a
``.json`` suffix too; ``--from-json`` rescores them without running invink again.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_side_by_side as side_by_side  # noqa: E402
from bench_side_by_side import DELTA, EPSILON, PROMPTS, load, machine  # noqa: E402
from dpsynth.llm.local import LocalGenerator  # noqa: E402

#: the side-by-side job's Banking77 prompts (the only dataset this baseline runs on)
BANKING = PROMPTS["banking77"]
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
    out.append({"label": part["label"], "texts": list(res.texts), "lens": list(res.lens),
                "epsilon_spent": list(res.epsilon_spent), "wall_s": time.time() - t0})
print("INVINK-JSON " + json.dumps(out))
"""


#: ``--prompts side_by_side``: dpsynth's zero-shot request of the side-by-side job (its
#: system line, task and label sentence), with one private reference on the private side;
#: invink fills the first {} with the description (the label sentence), the second with the
#: reference. ``--prompts invink``: invink's own (the default).
SIDE_BY_SIDE_PROMPTS = {
    "system_prompt": f"You are {BANKING['writer']}.",
    "pub_prompt": f"Write {BANKING['task']}. {{}} Reply with the text only.",
    "prv_prompt": (f"Write {BANKING['task']}. {{}} Here is one such question: \"{{}}\" Write "
                   "another one like it. Reply with the text only."),
}


def description(intent: str, prompts: str) -> str:
    """The public description of one intent's records: invink's prompts get the dataset and
    the intent, the side-by-side prompts the label sentence alone."""
    label = BANKING["label_template"].format(category=intent.replace("_", " "))
    if prompts == "side_by_side":
        return label
    return "Short questions that customers of an online bank ask. " + label


def run_invink(python: str, spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The driver in invink's environment; (its results, its process's cost)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.run([python, "-c", DRIVER], input=json.dumps(spec), text=True,
                          capture_output=True, check=False)
    wall = time.time() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        sys.exit(f"invink's process failed (exit {proc.returncode}):\n{tail}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("INVINK-JSON "))
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
    """The test texts, embedded once: their vectors, labels and Gaussian statistics (FID)."""

    x: Any
    y: list[str]
    stats: tuple[Any, Any]


def embed_test(test: Any) -> EmbeddedTest:
    from dpsynth.eval.fidelity import gaussian_stats

    x = _embedded(test["text"].astype(str).tolist())
    return EmbeddedTest(x, test["category"].astype(str).tolist(), gaussian_stats(x))


def _fid(x: Any, test: EmbeddedTest) -> float:
    """FID of a set of embeddings to the test texts' (below 384 texts the covariance is rank
    deficient and FID biased upward: compare it only at equal sizes, as :func:`compare` does;
    hence the distance itself rather than ``dpsynth.eval.fidelity.fid``, which refuses them)."""
    from dpsynth.eval.fidelity import frechet_distance, gaussian_stats

    return frechet_distance(*gaussian_stats(x), *test.stats)


def evaluate(results: list[dict[str, Any]], test: EmbeddedTest) -> dict[str, Any]:
    """Accuracy and macro-F1 of logistic regression on MiniLM embeddings of the texts, and
    their FID to the test texts."""
    from dpsynth.eval.utility import logreg_scores

    texts = [t for r in results for t in r["texts"]]
    labels = [r["label"] for r in results for _ in r["texts"]]
    train_x = _embedded(texts)
    scores = logreg_scores(train_x, labels, test.x, test.y)
    return {**scores, "fid_test": _fid(train_x, test)}


def _release_by_label(runs: Path, arm: str) -> dict[str, list[str]]:
    """One side-by-side arm's released texts by intent."""
    path = runs / arm / "release" / "synthetic.jsonl"
    if not path.is_file():
        sys.exit(f"--compare-runs: {path} not found (is {arm} a finished arm of that folder?)")
    by_label: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        by_label.setdefault(row["labels"]["category"], []).append(row["text"])
    return by_label


def compare(results: list[dict[str, Any]], test: EmbeddedTest, runs: Path, arms: list[str],
            draws: int) -> dict[str, dict[str, float]]:
    """Each side-by-side arm's release (``runs/ARM/release/synthetic.jsonl``) cut to invink's
    number of texts per intent, ``draws`` random cuts (seeds 0..draws-1), each scored as
    :func:`evaluate` scores invink's: the classifier and FID at equal training sizes (an intent
    with fewer texts than invink's gives all it has). Mean and standard deviation of accuracy
    and macro-F1, and the mean FID, per arm."""
    import numpy as np

    from dpsynth.eval.utility import logreg_scores

    want = {r["label"]: len(r["texts"]) for r in results}
    out = {}
    for arm in arms:
        by_label = _release_by_label(runs, arm)
        every = [t for ts in by_label.values() for t in ts]
        vec = dict(zip(every, _embedded(every), strict=True))
        sizes = {lab: min(n, len(by_label.get(lab, []))) for lab, n in want.items()}
        acc, f1, fids = [], [], []
        for seed in range(draws):
            rng = random.Random(seed)
            picked = [(t, lab) for lab, n in sizes.items()
                      for t in rng.sample(by_label.get(lab, []), n)]
            train_x = np.stack([vec[t] for t, _ in picked])
            sc = logreg_scores(train_x, [lab for _, lab in picked], test.x, test.y)
            acc.append(sc["accuracy"])
            f1.append(sc["macro_f1"])
            fids.append(_fid(train_x, test))
        out[arm] = {"accuracy": float(np.mean(acc)), "accuracy_sd": float(np.std(acc)),
                    "macro_f1": float(np.mean(f1)), "macro_f1_sd": float(np.std(f1)),
                    "fid_test": float(np.mean(fids)), "texts": sum(sizes.values())}
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
        f"{facts['max_tokens']}, {facts['per_intent']} text(s) per intent over "
        f"{len(results)} intents; prompts: {facts['prompts']}.", "",
        "| texts | tokens | wall s / text | CPU s / text | CPU s / token | peak RSS MiB | "
        "invink's epsilon_spent (min-max) |",
        "|---|---|---|---|---|---|---|",
        f"| {n} | {tokens} | {cost['wall_s'] / max(1, n):.1f} | {cost['cpu_s'] / max(1, n):.1f} "
        f"| {cost['cpu_s'] / max(1, tokens):.2f} | {cost['peak_rss_mib']:.0f} | "
        f"{min(eps):.2f}-{max(eps):.2f} |", "",
        "The wall and CPU seconds include loading the model once per intent (invink.generate "
        "loads it on every call).", ""]
    if facts.get("scores"):
        s = facts["scores"]
        lines += [f"Classifier trained on the {n} texts: accuracy {s['accuracy']:.3f}, "
                  f"macro-F1 {s['macro_f1']:.3f} on {s['n_test']} test records"
                  + (f"; FID to the test texts {s['fid_test']:.3f}" if "fid_test" in s else "")
                  + ".", ""]
    if facts.get("compare"):
        lines += [f"The side-by-side arms of `{facts['compare_runs']}` at invink's training size: "
                  "each arm's release cut to invink's number of texts per intent, "
                  f"{facts['draws']} random cuts, the same classifier and test records "
                  "(mean, standard deviation):", "",
                  "| arm | texts | accuracy | macro-F1 | FID to the test texts (equal sizes) |",
                  "|---|---|---|---|---|",
                  f"| InvisibleInk | {n} | {facts['scores']['accuracy']:.3f} | "
                  f"{facts['scores']['macro_f1']:.3f} | {facts['scores']['fid_test']:.3f} |",
                  *[f"| `{arm}` | {c['texts']} | {c['accuracy']:.3f} ({c['accuracy_sd']:.3f}) | "
                    f"{c['macro_f1']:.3f} ({c['macro_f1_sd']:.3f}) | {c['fid_test']:.3f} |"
                    for arm, c in facts["compare"].items()], ""]
    lines += ["## Every text", "", "| intent | tokens | text |", "|---|---|---|"]
    for r in results:
        for text, length in zip(r["texts"], r["lens"], strict=True):
            flat = " ".join(text.split()).replace("|", "\\|")
            lines.append(f"| {r['label']} | {length} | {flat} |")
    return "\n".join(lines) + "\n"


def parts_of(args: argparse.Namespace, private: Any, intents: list[str]) -> list[dict[str, Any]]:
    """invink's calls: one an intent, on that intent's records (disjoint partitions)."""
    parts = []
    for intent in intents:
        texts = private.loc[private["category"] == intent, "text"].astype(str).tolist()
        num = len(texts) // (args.batch - 1) if args.per_intent == "auto" else args.per_intent
        if num * (args.batch - 1) > len(texts):
            sys.exit(f"{intent}: {num} texts need {num} x {args.batch - 1} records")
        parts.append({"label": intent, "texts": texts, "num": num,
                      "description": description(intent, args.prompts)})
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
                    help="texts per intent, or 'auto': invink's default, records // (B - 1)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="invink's batch_size (B)")
    ap.add_argument("--epsilon", type=float, default=EPSILON)
    ap.add_argument("--intents", type=int, default=0, help="only the first K intents (0: all)")
    ap.add_argument("--job-intents", type=int, default=side_by_side.INTENTS,
                    help="the side-by-side job's intents (its --intents; 0: all 77)")
    ap.add_argument("--job-records", type=int, default=side_by_side.RECORDS,
                    help="the side-by-side job's private records (its --records)")
    ap.add_argument("--prompts", choices=("invink", "side_by_side"), default="invink")
    ap.add_argument("--evaluate", action="store_true")
    ap.add_argument("--compare-runs", type=Path,
                    help="a bench_side_by_side.py --runs folder of the same job: score its "
                         "arms' releases cut to invink's texts per intent (with --evaluate)")
    ap.add_argument("--compare-arms", default="zero_shot,aug_pe_uniform")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--from-json", type=Path,
                    help="an earlier run's OUT.json: rescore and rewrite, invink not run")
    ap.add_argument("--out", type=Path, default=OUT)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    side_by_side.INTENTS, side_by_side.RECORDS = args.job_intents, args.job_records
    domain, private, test, _ = side_by_side.job()
    intents = domain["category"]
    if args.intents:
        intents = intents[:args.intents]
        test = test[test["category"].isin(intents)]
    if args.from_json:
        saved = json.loads(args.from_json.read_text())
        facts, results = saved["facts"], saved["results"]
        facts["rescored"] = ("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python "
                             "benchmarks/bench_invisibleink.py " + " ".join(sys.argv[1:]))
    else:
        facts, results = run(args, private, intents)
    if args.evaluate:
        embedded_test = embed_test(test)
        facts["scores"] = evaluate(results, embedded_test)
        if args.compare_runs:
            facts["compare_runs"], facts["draws"] = str(args.compare_runs), args.draws
            facts["compare"] = compare(results, embedded_test, args.compare_runs,
                                       args.compare_arms.split(","), args.draws)
    args.out.with_suffix(".json").write_text(json.dumps({"facts": facts, "results": results}))
    text = markdown(facts, results)
    args.out.write_text(text, encoding="utf-8")
    print(text)


def run(args: argparse.Namespace, private: Any,
        intents: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """invink in its own environment on the job; (the run's facts, its results)."""
    if not args.invink_python:
        sys.exit("give --invink-python (or $DPSYNTH_INVINK_PYTHON): invink's own environment")
    version = subprocess.run([args.invink_python, "-c", "import importlib.metadata as m; "
                              "print(m.version('invink'))"], capture_output=True, text=True,
                             check=False).stdout.strip() or "?"
    model_dir = str(LocalGenerator("smollm2", engine="transformers").model_dir)
    spec = {"model": model_dir, "epsilon": args.epsilon, "delta": DELTA,
            "batch_size": args.batch, "max_tokens": args.max_tokens, "seed": 0,
            "prompts": SIDE_BY_SIDE_PROMPTS if args.prompts == "side_by_side" else {},
            "parts": parts_of(args, private, intents)}
    facts: dict[str, Any] = {
        "command": "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python "
                   "benchmarks/bench_invisibleink.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "machine": machine(), "load_before": load(),
        "invink_version": version, "epsilon": args.epsilon, "delta": DELTA,
        "batch_size": args.batch, "max_tokens": args.max_tokens,
        "per_intent": args.per_intent, "prompts": args.prompts}
    results, facts["cost"] = run_invink(args.invink_python, spec)
    facts["load_after"] = load()
    return facts, results


if __name__ == "__main__":
    main()
