"""Side by side on the same job (issue 45, small version): zero-shot, Aug-PE (alone and with
its learn-from-the-votes lever, issue 44), WASP and DP fine-tuning on one private set at one
epsilon, beside the real records themselves as the ceiling.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/bench_side_by_side.py \
        [--arms zero_shot,aug_pe,aug_pe_preference,wasp,dp_finetune,dp_finetune_topk,real] \
        [--runs DIR] [--epsilon 4] [--fresh ARM,...] [--by-eye aug_pe=7,...] [--notes FILE]

The job: Banking77 (read in place from ../shared/data/banking77), restricted to its 10 most
frequent intents in the training file (ties by name), a fixed random subset of 500 of those
training records (seed 0) as the private set; epsilon 4 (``--epsilon``), delta 1e-5, N = 200
released texts.
Arms, each through ``dpsynth.generate`` with its own ledger file (``privacy.ledger``):

* ``zero_shot``: no private record read (epsilon 0), today's defaults;
* ``aug_pe``: today's defaults (``synthesis.samples`` = N only);
* ``aug_pe_uniform``: ``aug_pe`` with ``synthesis.label_split: uniform`` (the release and the
  votes split evenly over the labels; the label x length histogram is still released);
* ``aug_pe_uniform_t1`` / ``aug_pe_uniform_t3``: ``aug_pe_uniform`` with 1 / 3 voting rounds
  (``synthesis.iterations``; the default is 2);
* ``aug_pe_preference``: ``aug_pe`` plus the opt-in lever that learns from the released votes
  (``synthesis.preference.enabled``: DPO of a LoRA adapter on the generator after each vote,
  its default settings, up to 64 pairs a vote; post-processing, no budget; issue 44: one
  lever alone); ``aug_pe_preference_uniform`` the same with ``label_split: uniform`` (the
  lever on top of Banking77's best Aug-PE arm);
* ``wasp``: WASP's defaults (Q = 8, 8 demonstrations, contrastive, generator weighting) with
  both embedded generators, SmolLM2-135M-Instruct and Gemma 3 270M (the default is SmolLM2
  alone), ``synthesis.samples`` = N;
* ``dp_finetune``: record level, the default ``clipping: loop`` (``hooks`` before 2026-12-06;
  the two differ in float rounding only), 1 epoch, batch size 32, the declared
  ``dp_finetune.records`` = 500, the default LoRA (r = 8 on q_proj / v_proj);
* ``real``: the 500 private records themselves as the training set (the ceiling; no release).

Each arm is scored by ``dpsynth.evaluate`` (the project's default classifier: logistic
regression on MiniLM embeddings; no MAUVE, no audits) on the Banking77 test split restricted to
the same 10 intents, with the zero_shot arm's release as the zero-shot reference of every arm,
so ``gap closed`` = (arm - zero_shot) / (real - zero_shot) has one denominator. ``real`` is the
evaluation's real-trained reference (the operator's private/eval/reference.json); its FID is
that of 200 random private records (the FID of the other arms is at 200 texts too: FID is
biased upward below 384 samples, so only equal sizes compare).

The run folders (which hold the private subset, staged by ``dpsynth.generate``) go to
``--runs`` (default: a 0700 folder under the system temp dir, outside the repository); so does
a state file with each arm's wall time and the load average before and after it. A rerun
resumes an unfinished arm, skips a finished one (``--fresh ARM`` starts it again, with a new
ledger) and rewrites the table from the state file. Writes the markdown table, 10 random
released texts per arm and the by-eye counts (``--by-eye``, read from the 20-text samples in
``RUNS/by_eye_ARM.txt``) to benchmarks/results/side_by_side_small.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from dpsynth.bench.voting import PeakRSS  # noqa: E402

ROOT = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("DPSYNTH_SHARED_DATA", ROOT.parent.parent / "shared" / "data"))
OUT = ROOT / "results" / "side_by_side_small.md"

INTENTS = 10
RECORDS = 500
SAMPLES = 200
#: the private set: "banking77" (the default) or "yelp" (``--dataset``)
DATASET = "banking77"
#: each dataset's label columns; the table shows the first, a second table the others
LABELS = {"banking77": ["category"], "yelp": ["label1", "label2"]}
EPSILON, DELTA = 4.0, 1e-5
ARMS = ("zero_shot", "aug_pe", "aug_pe_uniform", "aug_pe_uniform_t1", "aug_pe_uniform_t3",
        "aug_pe_preference",
        "aug_pe_preference_uniform", "wasp", "wasp_one",
        "wasp_one_every", "wasp_one_uniform",
        "dp_finetune", "dp_finetune_topk", "dp_finetune_chat", "dp_finetune_chat_lr",
        "dp_finetune_full", "dp_finetune_top2", "dp_finetune_top2_long", "dp_finetune_nonprivate",
        "dp_finetune_default", "dp_finetune_layers2", "dp_finetune_uniform",
        "dp_finetune_uniform_half", "aug_pe_on_tuned", "real")
#: the method each generating arm runs
METHOD = {"zero_shot": "zero_shot", "aug_pe": "aug_pe", "aug_pe_uniform": "aug_pe",
          "aug_pe_uniform_t1": "aug_pe", "aug_pe_uniform_t3": "aug_pe",
          "aug_pe_preference": "aug_pe", "aug_pe_preference_uniform": "aug_pe",
          "wasp": "wasp", "wasp_one": "wasp", "wasp_one_every": "wasp",
          "wasp_one_uniform": "wasp",
          "dp_finetune": "dp_finetune", "dp_finetune_topk": "dp_finetune",
          "dp_finetune_chat": "dp_finetune", "dp_finetune_chat_lr": "dp_finetune",
          "dp_finetune_full": "dp_finetune", "dp_finetune_top2": "dp_finetune",
          "dp_finetune_top2_long": "dp_finetune",
          "dp_finetune_nonprivate": "dp_finetune", "dp_finetune_default": "dp_finetune",
          "dp_finetune_layers2": "dp_finetune", "dp_finetune_uniform": "dp_finetune",
          "dp_finetune_uniform_half": "dp_finetune", "aug_pe_on_tuned": "aug_pe"}

#: aug_pe_on_tuned, a two-stage arm on one ledger: dp_finetune_uniform at half the epsilon
#: (its own arm, dp_finetune_uniform_half: its release is scored too), then Aug-PE with the
#: uniform split at the other half, generating from that DP-tuned model (the adapter merged
#: into SmolLM2: post-processing of the DP-SGD output). Both runs charge the one ledger
#: (HYBRID_LEDGER), which composes them: the pair's release is (epsilon, 2 delta)-DP at most.
HYBRID_STAGES = ("dp_finetune_uniform_half", "aug_pe_on_tuned")
HYBRID_LEDGER = "aug_pe_on_tuned.ledger.json"
#: where the merged DP-tuned model is written, beside the run folders (its engines' converted
#: copies get this name with a suffix)
HYBRID_MODEL = "aug_pe_on_tuned.model"

#: aug_pe_uniform_tT: aug_pe_uniform with T voting rounds (synthesis.iterations; the default 2)
ITERATIONS = {"aug_pe_uniform_t1": 1, "aug_pe_uniform_t3": 3}

#: dp_finetune_chat_lr: AdamW's learning rate (the default is 1e-3)
DP_FINETUNE_SMALL_LR = 2e-4

#: dp_finetune_full: every record in every step (q = 1: the batch's noise is divided by all
#: 500 records, not 32), a few steps with a larger step size, adapters on the last 8 layers
#: (fewer coordinates of noise; the backward pass stops below them)
DP_FINETUNE_FULL = {"batch_size": "all", "epochs": 4, "learning_rate": 5e-3,
                    "lora_layers": 8}

#: dp_finetune_top2: every record in every step for twice the steps, adapters on the last 2
#: layers only (a quarter of the coordinates: each step's noise ratio 0.60 at epsilon 8, where
#: dp_finetune_full's 4 steps had 0.84), a larger step size; the loop path then runs the top 2
#: layers from each record's stored lower-layer state after its first pass
DP_FINETUNE_TOP2 = {"batch_size": "all", "epochs": 8, "learning_rate": 1e-2,
                    "lora_layers": 2}
#: dp_finetune_top2_long: the same for 16 steps (each step's noise ratio 0.84 at epsilon 8)
DP_FINETUNE_TOP2_LONG = {**DP_FINETUNE_TOP2, "epochs": 16}

#: dp_finetune_nonprivate, NOT private (a reference, like ``real``): dp_finetune_chat's model,
#: prompt and adapter trained by plain minibatch AdamW over the 500 records (no clipping, no
#: noise; each epoch in its own seeded order): what fine-tuning can give on this job at all.
#: Its run folder's privacy statement does not hold (a NOT-PRIVATE file beside it says so)
NONPRIVATE = {"epochs": 2, "batch": 16, "learning_rate": 1e-3}

#: what "on task" means when a text is read by eye, and the set's name, per data set
ON_TASK = {"banking77": "a plausible customer banking query of the labelled intent",
           "yelp": "a plausible Yelp review of the labelled business category and stars"}
DATASET_NAME = {"banking77": "Banking77", "yelp": "Yelp"}

#: aug_pe_preference: DPO pairs per vote (synthesis.preference.pairs; 64 is the default)
PREFERENCE_PAIRS = 64

#: the prompts of bench_released_text.py's Banking77 set (the customer as the writer); Yelp's
#: are bench_yelp.py's defaults
PROMPTS = {"banking77": {"writer": "a customer of an online bank",
                         "task": "a short question you ask your online bank",
                         "label_template": "It is about {category}."},
           "yelp": {"task": "a short Yelp review", "label_template": "{label1}. {label2}."}}


def config_of(arm: str, samples: int, ledger: Path) -> dict[str, Any]:
    """The ``config`` sections of one arm (on top of the shared data / privacy arguments)."""
    cfg: dict[str, Any] = {"prompts": dict(PROMPTS[DATASET]),
                           "privacy": {"ledger": str(ledger)}}
    if arm in ("zero_shot", "aug_pe", "wasp", "wasp_one"):
        cfg["synthesis"] = {"samples": samples}
    if arm in ("aug_pe_uniform", "wasp_one_uniform", "aug_pe_on_tuned",
               *ITERATIONS):  # evenly by label
        cfg["synthesis"] = {"samples": samples, "label_split": "uniform"}
        if arm in ITERATIONS:
            cfg["synthesis"]["iterations"] = ITERATIONS[arm]
    if arm == "wasp_one_every":  # WASP before its votes were sized: a vote on every candidate
        cfg["synthesis"] = {"samples": samples, "population": samples}
    if arm in ("aug_pe_preference", "aug_pe_preference_uniform"):
        cfg["synthesis"] = {"samples": samples,
                            "preference": {"enabled": True, "pairs": PREFERENCE_PAIRS}}
        if arm == "aug_pe_preference_uniform":
            cfg["synthesis"]["label_split"] = "uniform"
    if arm == "wasp":  # WASP's several generators: both embedded models (default: SmolLM2 only)
        cfg["generators"] = [{"model": "smollm2"}, {"model": "gemma3"}]
    elif arm in ("dp_finetune_default", "dp_finetune_layers2", "dp_finetune_uniform",
                 "dp_finetune_uniform_half"):
        # today's dp_finetune defaults, only the public record count and N set (layers2: the
        # adapters on the last 2 layers as well; uniform: the release split evenly over the
        # labels, no label counts released, the whole budget to DP-SGD)
        cfg["dp_finetune"] = {"records": RECORDS, "samples": samples}
        if arm == "dp_finetune_layers2":
            cfg["dp_finetune"]["lora_layers"] = 2
        if arm in ("dp_finetune_uniform", "dp_finetune_uniform_half"):
            cfg["dp_finetune"]["label_split"] = "uniform"
    elif arm.startswith("dp_finetune"):
        # dp_finetune sampled its release from the whole vocabulary (top_k null, the default
        # then); dp_finetune_topk samples from the 50 likeliest tokens, the default now;
        # dp_finetune_chat also trains and samples after the zero-shot request in the chat
        # template (dp_finetune.prompt: chat) instead of the plain label sentence
        # per-sample gradients on the default path (loop) since 2026-12-06; hooks before
        cfg["dp_finetune"] = {"records": RECORDS, "epochs": 1,
                              "batch_size": 32, "samples": samples,
                              "top_k": None if arm == "dp_finetune" else 50,
                              "prompt": "plain" if arm in ("dp_finetune", "dp_finetune_topk")
                              else "chat"}
        if arm == "dp_finetune_chat_lr":  # a smaller step: stay nearer the zero-shot model
            cfg["dp_finetune"]["learning_rate"] = DP_FINETUNE_SMALL_LR
        if arm == "dp_finetune_full":
            cfg["dp_finetune"].update(DP_FINETUNE_FULL)
        if arm == "dp_finetune_top2":
            cfg["dp_finetune"].update(DP_FINETUNE_TOP2)
        if arm == "dp_finetune_top2_long":
            cfg["dp_finetune"].update(DP_FINETUNE_TOP2_LONG)
        if cfg["dp_finetune"]["batch_size"] == "all":  # every record in every step (q = 1)
            cfg["dp_finetune"]["batch_size"] = RECORDS
    return cfg


def run_facts(arm: str, run_dir: Path) -> str | None:
    """What the run's own files say of the new arms: WASP's generator weights after each vote
    and its release by generator (stats.jsonl, released: they follow the noisy votes); the
    preference arm's DPO trainings and their wall time (log.txt)."""
    if arm.startswith("wasp"):
        stats = [json.loads(x) for x in (run_dir / "stats.jsonl").read_text().splitlines()
                 if x.strip()]
        weights = "; ".join(
            f"vote {r.get('iteration')}: weights {r.get('generator_weights')}, near-vote "
            f"share {r.get('generator_vote_share')}" for r in stats
            if r.get("generator_weights"))
        voted = ", ".join(f"{r.get('voted')} of {r.get('candidates')}" for r in stats)
        names = "smollm2, gemma3" if arm == "wasp" else "smollm2"
        return (f"generators {names}; votes on {voted} candidates; "
                f"{weights or 'no weights in stats.jsonl'}")
    if arm in ("aug_pe_preference", "aug_pe_preference_uniform"):
        # a training starts at its log line and ends when its model's marker is written
        starts = [line for line in (run_dir / "log.txt").read_text(
            encoding="utf-8").splitlines() if "preference training" in line]
        ends = sorted(m.stat().st_mtime for m in
                      (run_dir / "private" / "preference").glob("*/dpsynth-tuned.json"))
        spans = [f"{line[20:].split(' on ', 1)[-1]} in "
                 f"{end - time.mktime(time.strptime(line[:19], '%Y-%m-%d %H:%M:%S')):.0f} s"
                 for line, end in zip(starts, ends, strict=False)]
        return ("DPO after each vote: " + ", ".join(spans) + " (log.txt and the tuned "
                "models' markers)" if spans else "no preference training in log.txt")
    return None


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def job() -> tuple[dict[str, list[str]], Any, Any, set[str]]:
    """(each label column's declared values, the RECORDS private records, the test slice, every
    text of the dataset). Banking77: the INTENTS most frequent intents of its training file
    (0: all 77), RECORDS training records of them drawn at random (seed 0), the test records
    of those intents. Yelp: RECORDS of yelp/dev.csv's 5000 reviews drawn at random (seed 0),
    yelp/test.csv's 5000 as the test set, the values of both files as the declared domain
    (the dataset's public schema)."""
    import pandas as pd

    if DATASET == "yelp":
        dev = pd.read_csv(SHARED / "yelp" / "dev.csv")
        test = pd.read_csv(SHARED / "yelp" / "test.csv")
        cols = LABELS["yelp"]
        domain = {c: sorted(set(dev[c].astype(str)) | set(test[c].astype(str))) for c in cols}
        private = dev.sample(n=RECORDS, random_state=0).reset_index(drop=True)
        every = set(dev["text"].astype(str).str.strip()) | set(test["text"].astype(str)
                                                             .str.strip())
        return domain, private[["text", *cols]], test[["text", *cols]], every
    train = pd.read_csv(SHARED / "banking77" / "train.csv")
    test = pd.read_csv(SHARED / "banking77" / "test.csv")
    counts = train["category"].value_counts()
    intents = sorted(sorted(counts.index, key=lambda c: (-counts[c], c))[:INTENTS or None])
    pool = train[train["category"].isin(intents)]
    private = pool.sample(n=RECORDS, random_state=0).reset_index(drop=True)
    held_out = test[test["category"].isin(intents)].reset_index(drop=True)
    every = set(train["text"].astype(str).str.strip()) | set(test["text"].astype(str).str.strip())
    return ({"category": intents}, private[["text", "category"]],
            held_out[["text", "category"]], every)


@contextlib.contextmanager
def nonprivate_training() -> Iterator[None]:
    """For the length of the block, dp_finetune's DP-SGD loop replaced by ordinary minibatch
    training (:data:`NONPRIVATE`; NOT private: the reference arm only)."""
    import numpy as np
    import torch

    from dpsynth.methods.dpfinetune import method
    from dpsynth.methods.dpfinetune.train import collate, per_sample_loss

    def run(self: Any, resume: bool = True) -> dict[str, Any]:
        t0 = time.perf_counter()
        opt = torch.optim.AdamW([p for _, p in self.params], lr=NONPRIVATE["learning_rate"])
        self.model.train()
        rng = np.random.default_rng(0)
        for _ in range(NONPRIVATE["epochs"]):
            order = rng.permutation(len(self.examples))
            for lo in range(0, len(order), NONPRIVATE["batch"]):
                chunk = [self.examples[int(i)] for i in order[lo:lo + NONPRIVATE["batch"]]]
                ids, attn, target = collate(chunk, self.pad_id)
                per_sample_loss(self.model, ids, attn, target).mean().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        self.model.eval()
        self.close()  # the pass workers the method started: this loop does not use them
        return {"steps_run": 0, "seconds": time.perf_counter() - t0, "resumed_at": None}

    original = method.DPSGD.run
    method.DPSGD.run = run  # type: ignore[method-assign]
    try:
        yield
    finally:
        method.DPSGD.run = original  # type: ignore[method-assign]


def generate_arm(arm: str, runs: Path, private: Any, domain: dict[str, list[str]], samples: int,
                 epsilon: float = EPSILON) -> Path:
    """Run (or resume) one generating arm; returns its run folder."""
    if arm == "dp_finetune_nonprivate":
        with nonprivate_training():
            out = _generate(arm, runs, private, domain, samples, epsilon)
        (out / "NOT-PRIVATE.txt").write_text(
            "Trained without clipping or noise by benchmarks/bench_side_by_side.py (a "
            "reference arm): the privacy statement in release/ does not hold.\n")
        return out
    if arm in HYBRID_STAGES:  # half the epsilon each, one ledger (HYBRID_STAGES)
        tuned = _generate(HYBRID_STAGES[0], runs, private, domain, samples, epsilon / 2)
        if arm == HYBRID_STAGES[0]:
            return tuned
        return _generate(arm, runs, private, domain, samples, epsilon / 2,
                         generator=merged_adapter(tuned, runs / HYBRID_MODEL))
    return _generate(arm, runs, private, domain, samples, epsilon)


def merged_adapter(run_dir: Path, out: Path) -> Path:
    """The DP-tuned model of a finished dp_finetune run: its LoRA adapter (private/dp-finetune/
    adapter, a DP output) merged into the base generator's float32 weights and saved with its
    tokenizer to ``out`` by the method's own :func:`save_merged` (once)."""
    if (out / "config.json").is_file():
        return out
    from peft import PeftModel

    from dpsynth.llm.local import LocalGenerator
    from dpsynth.methods.dpfinetune.sample import save_merged

    base = LocalGenerator("smollm2", engine="transformers")
    tuned = PeftModel.from_pretrained(base.model,
                                      str(run_dir / "private" / "dp-finetune" / "adapter"))
    tmp = out.with_suffix(".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    save_merged(tuned, base.tokenizer, tmp)
    tmp.rename(out)
    return out


def _generate(arm: str, runs: Path, private: Any, domain: dict[str, list[str]], samples: int,
              epsilon: float, generator: Path | None = None) -> Path:
    import dpsynth

    out = runs / arm
    meta = out / "run.json"
    if meta.is_file():
        if json.loads(meta.read_text()).get("status") == "finished":
            return out
        return dpsynth.generate(None, output=out, resume=True, progress=False).run_dir
    ledger = runs / (HYBRID_LEDGER if arm in HYBRID_STAGES else f"{arm}.ledger.json")
    config = config_of(arm, samples, ledger)
    if generator is not None:  # a local model directory instead of the embedded SmolLM2
        config["generators"] = [{"model": str(generator)}]
    return dpsynth.generate(
        private, text="text", labels=list(domain), label_values=domain,
        epsilon=epsilon, delta=DELTA, method=METHOD[arm], output=out,
        config=config, progress=False).run_dir


def evaluate_arm(run_dir: Path, test: Any, zero_shot: Path, embedder: Any
                 ) -> dict[str, dict[str, Any]]:
    """dpsynth.evaluate (logreg, no MAUVE, no audits) with the operator's reference put back:
    the scores per label column."""
    import dpsynth

    labels = LABELS[DATASET]
    shareable = dpsynth.evaluate(run_dir, test, labels=labels, classifier="logreg",
                                 mauve=False, audits=False, zero_shot=zero_shot, report=False,
                                 embedder=embedder, progress=False)
    ref_path = run_dir / "private" / "eval" / "reference.json"
    ref = json.loads(ref_path.read_text()) if ref_path.is_file() else {}
    return {col: _scores(shareable, ref, col, len(test)) for col in labels}


def _scores(shareable: dict[str, Any], ref: dict[str, Any], col: str, n_test: int
            ) -> dict[str, Any]:
    cell = shareable["utility"]["logreg"][col]
    real = ((ref.get("utility") or {}).get("logreg") or {}).get(col, {}).get("private")
    versus = shareable.get("versus_zero_shot", {}).get("logreg", {}).get(col, {})
    return {"synthetic": cell["synthetic"], "zero_shot": cell.get("zero_shot"), "real": real,
            "chance": cell.get("chance"), "fid": shareable["fidelity"]["synthetic"].get("fid"),
            "n_test": n_test, "n_synthetic": shareable["n"]["synthetic"],
            "n_zero_shot": shareable["n"].get("zero_shot"),
            "versus_zero_shot": {k: versus.get(k) for k in ("accuracy_points",
                                                             "interval_points")},
            "notes": [n for n in shareable.get("notes", []) if "/" not in n]}


def real_fid(private: Any, test: Any, embedder: Any) -> float:
    """FID of 200 random private records against the test slice (the arms' size)."""
    import numpy as np

    from dpsynth.eval.fidelity import fid

    texts = private["text"].astype(str).tolist()
    pick = random.Random(0).sample(texts, min(SAMPLES, len(texts)))
    a = np.asarray(embedder.embed(pick), dtype=np.float32)
    b = np.asarray(embedder.embed(test["text"].astype(str).tolist()), dtype=np.float32)
    return float(fid(a, b))


def released(run_dir: Path) -> list[dict[str, Any]]:
    rows = (run_dir / "release" / "synthetic.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(x) for x in rows if x.strip()]


def by_eye_sample(run_dir: Path, n: int = 20) -> list[dict[str, Any]]:
    """``n`` random released texts (seed 0): the by-eye read; the table shows the first 10."""
    rows = released(run_dir)
    return random.Random(0).sample(rows, min(n, len(rows)))


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def num(x: Any, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float | int) and not isinstance(x, bool) else "n/a"


def gap(value: float | None, zs: float | None, real: float | None) -> float | None:
    if None in (value, zs, real) or real == zs:
        return None
    return (value - zs) / (real - zs)  # type: ignore[operator]


def column_scores(rec: dict[str, Any], column: str | None) -> dict[str, Any]:
    """An arm's scores on ``column`` (None: the table's first column, ``scores``)."""
    if column is None:
        return rec.get("scores", {})
    return (rec.get("scores_by") or {}).get(column, {})


def peak_cell(rec: dict[str, Any], arm: str) -> str:
    """The arm's peak resident set in MB, with the process's before its generation."""
    if arm == "real":
        return "n/a"
    if "peak_mb" not in rec:
        return "not measured"
    return f"{rec['peak_mb']} ({rec['rss_before_mb']})"


def table(state: dict[str, Any], by_eye: dict[str, str], column: str | None = None
          ) -> list[str]:
    arms = [a for a in ARMS if a in state["arms"]]
    zs = column_scores(state["arms"].get("zero_shot", {}), column).get("synthetic") or {}
    real = next((column_scores(state["arms"][a], column)["real"] for a in arms
                 if column_scores(state["arms"][a], column).get("real")), None) or {}
    lines = ["| arm | epsilon spent | texts released | wall (s) | peak RSS, MB (before) | load "
             "before -> after (1 / 5 / 15 min) | accuracy | macro-F1 | vs zero-shot, accuracy "
             "points (95 % interval) | gap closed (accuracy) | gap closed (macro-F1) | FID | on "
             "task by eye (of 20) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        a = state["arms"][arm]
        sc = {**column_scores(a, column), "fid": a.get("scores", {}).get("fid")}
        cell = real if arm == "real" else (sc.get("synthetic") or {})
        acc, f1 = cell.get("accuracy"), cell.get("macro_f1")
        eye = "n/a (real records)" if arm == "real" else by_eye.get(arm, "not read")
        eps = a.get("epsilon")
        vs = sc.get("versus_zero_shot") or {}
        ci = vs.get("interval_points") or []
        lead = ("n/a" if arm in ("real", "zero_shot") or vs.get("accuracy_points") is None
                else f"{vs['accuracy_points']:+.1f} ({ci[0]:+.1f} to {ci[1]:+.1f})")
        n = f"{RECORDS} real" if arm == "real" else sc.get("n_synthetic", "n/a")
        spent = ("none: NOT private" if arm == "dp_finetune_nonprivate"
                 else "n/a" if eps is None else num(float(eps), 2))
        lines.append(
            f"| {arm} | {spent} | {n} | "
            f"{a.get('wall_s', 'n/a')} | "
            f"{peak_cell(a, arm)} "
            f"| {a.get('load_before', '')} -> {a.get('load_after', '')} | {num(acc)} | "
            f"{num(f1)} | {lead} | {pct(gap(acc, zs.get('accuracy'), real.get('accuracy')))} | "
            f"{pct(gap(f1, zs.get('macro_f1'), real.get('macro_f1')))} | "
            f"{num(sc.get('fid'))} | {eye} |")
    return lines


def write_markdown(state: dict[str, Any], by_eye: dict[str, str], every: set[str]) -> str:
    arms = [a for a in ARMS if a in state["arms"]]
    ones = [float(state["arms"][a][k].split(" / ")[0]) for a in arms
            for k in ("load_before", "load_after") if state["arms"][a].get(k)]
    lo, hi = (min(ones), max(ones)) if ones else (float("nan"), float("nan"))
    chance = next((state["arms"][a]["scores"].get("chance") for a in arms
                   if state["arms"][a].get("scores", {}).get("chance") is not None), None)
    lines = [
        f"# Side by side on the same job, {RECORDS} records (issue 45)", "",
        f"`{state['command'].strip()}`", "",
        *([f"(table and by-eye counts rewritten from the finished runs by "
           f"`{state['last_command']}`)", ""]
          if state.get("last_command", state["command"]) != state["command"] else []),
        f"Date {state['date']}; {state['machine']}, 1-minute load "
        f"average {lo:.1f} to {hi:.1f} at the arms' starts and ends (each arm's in the table), "
        "so every wall time is inflated over a quiet machine and only roughly comparable "
        "across arms.", "",
        (f"The job: Yelp, {RECORDS} of yelp/dev.csv's reviews drawn at random (seed 0) as the "
         "private set, labelled by business category (`label1`) and stars (`label2`); "
         if DATASET == "yelp" else
         ("The job: Banking77, all its intents"
          if not INTENTS or len(state["intents"]) <= INTENTS else
          f"The job: Banking77, its {INTENTS} most frequent intents in the training file "
          f"({', '.join(state['intents'])})")
         + f"; {RECORDS} training records of those intents drawn at random (seed 0) as the "
         "private set; ")
        + f"epsilon {state.get('epsilon', EPSILON):g}, "
        f"delta {DELTA:g}, "
        f"N = {SAMPLES} released texts; SmolLM2-135M-Instruct (`wasp`: beside Gemma 3 270M), "
        "MiniLM. Scored by "
        "`dpsynth.evaluate` (logistic regression on MiniLM embeddings, the default classifier) "
        + (f"on the {state['n_test']} reviews of yelp/test.csv, per label column (the table: "
           f"`label1`, chance {num(chance)}; below it the other columns)."
           if DATASET == "yelp" else
           f"on the {state['n_test']} Banking77 test records of the same intents (chance: "
           f"{num(chance)}).")
        + f" `gap closed` = (arm - zero_shot) / (real - zero_shot), every arm "
        "against the zero_shot arm's release. FID as `dpsynth eval` reports it, against the "
        f"test slice, at the texts each arm released (N = {SAMPLES} asked; `real`: {SAMPLES} "
        "random private records; below 384 texts FID is biased upward, so only near-equal "
        "sizes compare). One run per arm, one seed each: on 400 test records an accuracy "
        "has a standard error of about 2 to 2.5 points (about 0.9 on 3080), and two runs of "
        "one configuration can "
        "differ by more (benchmarks/results/released_text.md saw 7 points on Banking77); the "
        "interval column is the evaluation's paired 95 % interval of the difference to "
        "zero-shot on the same test texts, which does not cover run-to-run variation.", "",
        *table(state, by_eye), "",
        *[line for col in state.get("columns", [None])[1:]
          for line in (f"On `{col}`:", "", *table(state, by_eye, col), "")],
        "Arms: `zero_shot` no private record read (epsilon 0); `aug_pe` today's defaults "
        f"(only `synthesis.samples` = {SAMPLES}); `aug_pe_uniform` the same with "
        "`synthesis.label_split: uniform`; `aug_pe_uniform_t1` / `_t3` that with "
        "`synthesis.iterations` 1 / 3 (the default 2); `aug_pe_preference` `aug_pe` plus "
        "`synthesis.preference.enabled` (DPO of a LoRA adapter on the generator after each "
        f"vote, on up to {PREFERENCE_PAIRS} pairs ranked by the released votes; its other "
        "settings the defaults; no budget); `aug_pe_preference_uniform` that with "
        "`synthesis.label_split: uniform`; `wasp` WASP's defaults with two generators, "
        f"`generators: [smollm2, gemma3]`, `synthesis.samples` = {SAMPLES}; `wasp_one` "
        "WASP's defaults (SmolLM2 alone); `wasp_one_uniform` the same with "
        "`synthesis.label_split: uniform`; "
        "`dp_finetune` record level, `clipping: loop` (hooks before 2026-12-06),"
        f" 1 epoch, batch size 32, `dp_finetune.records` = {RECORDS}, the default LoRA (r = 8, "
        "q_proj / v_proj), 64 training tokens of each record (after its prompt: the plain label "
        "sentence, or with `dp_finetune_chat` the zero-shot request in the chat template); "
        f"`dp_finetune_full` as `dp_finetune_chat` with {DP_FINETUNE_FULL}; "
        f"`dp_finetune_top2` with {DP_FINETUNE_TOP2}, `dp_finetune_top2_long` with "
        f"{DP_FINETUNE_TOP2_LONG}; `dp_finetune_default` today's `dp_finetune` defaults "
        f"with `records` = {RECORDS} and `samples` = {SAMPLES} only; `dp_finetune_layers2` "
        "the same with `lora_layers: 2`, `dp_finetune_uniform` with `label_split: uniform` "
        "(the release split evenly over the labels; no label counts released); "
        "`dp_finetune_uniform_half` that at half the epsilon, and `aug_pe_on_tuned` "
        "`aug_pe_uniform` at the other half generating from its DP-tuned model (the adapter "
        "merged into SmolLM2), both charged to one ledger: the pair's texts are (epsilon, "
        "2 delta)-DP by basic composition, the table shows each run's half; "
        "`dp_finetune_nonprivate` (NOT "
        f"private, a reference like `real`) `dp_finetune_chat`'s model, prompt and adapter "
        f"trained by plain minibatch AdamW, {NONPRIVATE}, no clipping and no noise; "
        "`real` the private records as the training set "
        "(no release: the ceiling). Each generating arm has its own ledger file (but the two "
        "above). Wall time is "
        "the `dpsynth.generate` call only (models loaded inside; the evaluation apart); peak "
        "RSS the bench process's resident set at its highest during that call, sampled every "
        "50 ms, beside its size before the call (the evaluation's embedder and the data, "
        "loaded first, are in both; an arm run after others in one process may start above "
        "its own needs, since freed memory is not always returned).",
        "",
    ]
    for arm in arms:
        a = state["arms"][arm]
        extra = a.get("facts")
        if extra:
            lines += [f"`{arm}` facts: {extra}.", ""]
        ev_notes = (a.get("scores") or {}).get("notes")
        if ev_notes and arm != "real":
            lines += [f"`{arm}` evaluation notes: {'; '.join(ev_notes)}.", ""]
    lines += ["## Released texts", "",
              "10 random released texts per arm (seed 0; the first 10 of the 20 read by eye). "
              f"\"On task\" by eye: {ON_TASK[DATASET]}. "
              f"A text equal to any {DATASET_NAME[DATASET]} record is not shown.", ""]
    for arm in arms:
        if arm == "real":
            continue
        rows = state["arms"][arm].get("samples") or []
        lines += [f"### {arm}", ""]
        for r in rows[:10]:
            text = " ".join(str(r.get("text", "")).split())
            label = " / ".join((r.get("labels") or {}).values())
            if text.strip() in every:
                text = f"(equal to a {DATASET_NAME[DATASET]} record: not shown)"
            lines.append(f"- `{label}`: {text.replace('|', '/')}")
        lines.append("")
    if state.get("notes"):
        lines += ["## Notes", "", *state["notes"], ""]
    return "\n".join(lines)


def main() -> None:
    global RECORDS, INTENTS, SAMPLES, DATASET
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--runs", type=Path,
                    default=Path(tempfile.gettempdir()) / "dpsynth-side-by-side")
    ap.add_argument("--samples", type=int, default=SAMPLES)
    ap.add_argument("--records", type=int, default=RECORDS, help="private records")
    ap.add_argument("--dataset", choices=sorted(LABELS), default=DATASET)
    ap.add_argument("--intents", type=int, default=INTENTS,
                    help="the most frequent intents kept (0: all 77)")
    ap.add_argument("--epsilon", type=float, default=EPSILON,
                    help="the private arms' epsilon (zero_shot reads no record at any)")
    ap.add_argument("--fresh", default="", help="arms to start again (comma-separated)")
    ap.add_argument("--by-eye", default="",
                    help="on-task counts read by eye, e.g. 'aug_pe=7,dp_finetune=12 / 20 (2 "
                         "borderline)'")
    ap.add_argument("--notes", type=Path, help="a markdown file: the Notes section (readings)")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    RECORDS, INTENTS, SAMPLES = args.records, args.intents, args.samples
    DATASET = args.dataset
    runs = args.runs
    runs.mkdir(parents=True, exist_ok=True)
    os.chmod(runs, 0o700)
    state_path = runs / "state.json"
    state: dict[str, Any] = (json.loads(state_path.read_text()) if state_path.is_file()
                             else {"arms": {}})
    domain, private, test, every = job()
    primary = LABELS[DATASET][0]
    command = ("HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python "
               "benchmarks/bench_side_by_side.py " + shlex.join(sys.argv[1:])).strip()
    state.setdefault("command", command)  # the run's; a later call only rewrites the table
    state["last_command"] = command
    state.update(intents=domain[primary], n_test=len(test), machine=machine(),
                 columns=LABELS[DATASET])
    if state.setdefault("epsilon", args.epsilon) != args.epsilon:
        sys.exit(f"{runs} holds runs at epsilon {state['epsilon']:g}: use another --runs")
    job_size = {"records": RECORDS, "top_intents": INTENTS, "samples": SAMPLES,
                "dataset": DATASET}
    if {k: state.setdefault(k, v) for k, v in job_size.items()} != job_size:
        sys.exit(f"{runs} holds runs of another job ({ {k: state[k] for k in job_size} }): "
                 "use another --runs")
    state.setdefault("date", time.strftime("%Y-%m-%d"))
    if args.notes:
        state["notes"] = args.notes.read_text(encoding="utf-8").strip().splitlines()
    fresh = {a for a in args.fresh.split(",") if a}
    if HYBRID_STAGES[0] in fresh:  # Aug-PE on the tuned model goes with the model it ran on
        fresh.add(HYBRID_STAGES[1])
    for arm in fresh:
        shutil.rmtree(runs / arm, ignore_errors=True)
        # a new, empty ledger on purpose: the ledger with its key, backup and lock (a ledger
        # missing beside its key stops every run, as it should for a lost one)
        # the hybrid stages' one ledger only with the first stage (a second stage run again
        # on the same model is charged again beside it)
        ledger = (None if arm == HYBRID_STAGES[1] else
                  HYBRID_LEDGER if arm == HYBRID_STAGES[0] else f"{arm}.ledger.json")
        for suffix in ("", ".key", ".bak", ".lock") if ledger else ():
            (runs / f"{ledger}{suffix}").unlink(missing_ok=True)
        if arm == HYBRID_STAGES[0]:  # a fresh tuned model: the merged copy of the old one
            for old in runs.glob(f"{HYBRID_MODEL}*"):  # goes, and its engines' copies
                shutil.rmtree(old, ignore_errors=True)
        state["arms"].pop(arm, None)

    from dpsynth.embed import Embedder

    embedder = Embedder("minilm")
    wanted = [a for a in ARMS if a in args.arms.split(",")]
    zs_dir = runs / "zero_shot"
    for arm in wanted:
        rec = state["arms"].setdefault(arm, {})
        if arm == "real":
            first = "load_before" not in rec
            if first:
                rec["load_before"] = load()
            t0 = time.time()
            if not (zs_dir / "run.json").is_file():
                sys.exit("the real arm reads the zero_shot arm's evaluation: run zero_shot first")
            by = evaluate_arm(zs_dir, test, zs_dir, embedder)
            rec["scores"], rec["scores_by"] = by[primary], by
            rec["scores"]["fid"] = real_fid(private, test, embedder)
            rec["wall_s"] = "n/a (no generation)"
            rec["eval_s"] = round(time.time() - t0)
            if first:
                rec["load_after"] = load()
        else:
            done = (runs / arm / "run.json").is_file() and json.loads(
                (runs / arm / "run.json").read_text()).get("status") == "finished"
            if not done:
                rec["load_before"] = load()
                t0 = time.time()
                print(f"[{time.strftime('%H:%M:%S')}] {arm}: generating (load {load()})",
                      flush=True)
                with PeakRSS(interval=0.05) as mem:
                    try:
                        generate_arm(arm, runs, private, domain, args.samples, args.epsilon)
                    finally:
                        # the process's resident set at its highest during the generation
                        # (the bench's own evaluation embedder, loaded before, included)
                        rec["peak_mb"] = max(rec.get("peak_mb", 0), round(mem.peak / 2**20))
                        rec["rss_before_mb"] = round(mem.baseline / 2**20)
                        rec["wall_s"] = rec.get("wall_s_before", 0) + round(time.time() - t0)
                        rec["wall_s_before"] = rec["wall_s"]
                        rec["load_after"] = load()
                        state_path.write_text(json.dumps(state, indent=1))
            t0 = time.time()
            by = evaluate_arm(runs / arm, test, zs_dir, embedder)
            rec["scores"], rec["scores_by"] = by[primary], by
            rec["eval_s"] = round(time.time() - t0)
            privacy = json.loads((runs / arm / "release" / "privacy.json").read_text())
            rec["epsilon"] = privacy.get("epsilon")
            if arm.startswith("dp_finetune"):
                mech = {m.get("name"): m for m in privacy.get("mechanisms", [])}
                sgd, counts = mech.get("dp_sgd", {}), mech.get("label_counts", {})
                rec["facts"] = (f"DP-SGD noise multiplier {sgd.get('sigma', 0):.3f}, "
                                f"T = {sgd.get('count')} steps at q = "
                                f"{sgd.get('sampling_rate')}; label counts sigma "
                                f"{counts.get('sigma')} (privacy.json)")
            if run_facts(arm, runs / arm):
                rec["facts"] = run_facts(arm, runs / arm)
            rec["samples"] = by_eye_sample(runs / arm)
            with open(runs / f"by_eye_{arm}.txt", "w", encoding="utf-8") as fh:
                for i, r in enumerate(rec["samples"], 1):
                    fh.write(f"{i:2d} [{' / '.join((r.get('labels') or {}).values())}] "
                             f"{' '.join(str(r.get('text', '')).split())}\n")
        state_path.write_text(json.dumps(state, indent=1))
        print(json.dumps({"arm": arm, **{k: v for k, v in rec.items() if k != "samples"}}),
              flush=True)
    # ARM=COUNT pairs split at the commas that start the next ARM=, so a count may hold commas
    by_eye = dict(re.findall(r"(\w+)=(.*?)(?=,\s*\w+=|$)", args.by_eye))
    by_eye = {k: v if "/" in v else f"{v} / 20" for k, v in by_eye.items()}
    state["by_eye"] = {**state.get("by_eye", {}), **by_eye}
    state_path.write_text(json.dumps(state, indent=1))
    text = write_markdown(state, state["by_eye"], every)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print("\n".join(table(state, state["by_eye"])))
    print(args.out, file=sys.stderr)


if __name__ == "__main__":
    main()
