"""The tiny DP-SynRAG example (examples/tiny-synrag.yaml) arm by arm, side by side in one run.

Each arm is the example with some overrides, built with the same models on the same demo
corpus. Measured per arm, from the released texts and PUBLIC facts only (the demo's knowledge
table): how many texts name one of its diseases, how well they read (mean log-probability per
token under the public model, no document in the prompt), what the LLM self-filter keeps
(against "names a disease"), and, on held-out patients (the demo's test split: other patients,
same diseases), how often RAG over the kept passages / over all released texts answers the
right disease, against the model without RAG.

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/bench_tiny_synrag.py \
        --arms before,support,tuned --questions 24 --out benchmarks/results/tiny_synrag.md
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tiny-synrag.yaml"

#: tuned: every document in one cluster (L = 1), a cheap threshold (eps_theta 0.5), k = 16
#: documents per cluster: a larger clip c, more documents voting on each token
TUNED = {"synrag.overlap": 1, "synrag.eps_theta": 0.5, "synrag.target_size": 16}
KEYWORD_INSTRUCTION = ("Rephrase the following message from a patient with {keyword}. Keep "
                       "the symptoms; leave out names and contact details.")
LEAD = "Typical symptoms of {keyword} are"
WRITES = "A patient with {keyword} writes: I have"
LEAD_ARM = {**TUNED, "data.demo_rows": 1000, "synrag.vocabulary": "demo-diseases",
            "synrag.keyword_extractor": "vocabulary", "synrag.keywords_per_doc": 1,
            "synrag.clusters": 16, "synrag.target_size": 32, "synrag.support_vocabulary": True,
            "synrag.rephrase_instruction": KEYWORD_INSTRUCTION, "synrag.lead": LEAD}
ARMS: dict[str, dict[str, Any]] = {
    "before": {"synrag.support": "full", "synrag.logits_dtype": "float32",
               "synrag.self_filter": True},
    "support": {"synrag.self_filter": True},
    "tuned": {**TUNED, "synrag.self_filter": True},
    "tuned-shortcut": {**TUNED, "synrag.self_filter": True, "synrag.public_shortcut": True},
    # the candidate set without the vocabulary's name fragments (public top tokens, the
    # cluster's keyword, EOS), more documents, keywords by vocabulary match in its order
    "small-set": {**TUNED, "data.demo_rows": 120, "synrag.support_vocabulary": False,
                  "synrag.keyword_extractor": "vocabulary", "synrag.keywords_per_doc": 2,
                  "synrag.keyword_fill": "vocabulary_order", "synrag.self_filter": True},
    "small-set-shortcut": {**TUNED, "data.demo_rows": 120, "synrag.support_vocabulary": False,
                           "synrag.keyword_extractor": "vocabulary",
                           "synrag.keywords_per_doc": 2,
                           "synrag.keyword_fill": "vocabulary_order",
                           "synrag.self_filter": True, "synrag.public_shortcut": True},
    # clusters seeded by disease names: the public vocabulary is the knowledge table's disease
    # names only, K = 1, so a cluster holds documents that name its disease, and the
    # candidate set has the disease name's tokens (the released keyword)
    "disease-seeded": {**TUNED, "data.demo_rows": 300, "synrag.vocabulary": "DISEASES",
                       "synrag.support_vocabulary": False,
                       "synrag.keyword_extractor": "vocabulary", "synrag.keywords_per_doc": 1,
                       "synrag.self_filter": True},
    "disease-seeded-t48": {**TUNED, "data.demo_rows": 300, "synrag.vocabulary": "DISEASES",
                           "synrag.support_vocabulary": False, "synrag.tokens": 48,
                           "synrag.keyword_extractor": "vocabulary",
                           "synrag.keywords_per_doc": 1, "synrag.self_filter": True},
    "disease-seeded-t48-shortcut": {
        **TUNED, "data.demo_rows": 300, "synrag.vocabulary": "DISEASES",
        "synrag.support_vocabulary": False, "synrag.tokens": 48,
        "synrag.keyword_extractor": "vocabulary", "synrag.keywords_per_doc": 1,
        "synrag.self_filter": True, "synrag.public_shortcut": True},
    "current": {},
    # clusters seeded by the public disease names, each cluster's prompt naming its released
    # keyword, and (lead) every text opening with public words that name it
    "keyword-prompt": {**TUNED, "data.demo_rows": 1000, "synrag.vocabulary": "demo-diseases",
                       "synrag.keyword_extractor": "vocabulary", "synrag.keywords_per_doc": 1,
                       "synrag.clusters": 8, "synrag.target_size": 32,
                       "synrag.support_vocabulary": True,
                       "synrag.rephrase_instruction": KEYWORD_INSTRUCTION},
    "lead": {**LEAD_ARM, "synrag.clusters": 8},
    "lead16": LEAD_ARM,
    "lead16-top256": {**LEAD_ARM, "synrag.support_top": 256},
    "lead16-k48": {**LEAD_ARM, "synrag.target_size": 48},
    "writes": {**LEAD_ARM, "synrag.lead": WRITES},
    "writes12": {**LEAD_ARM, "synrag.lead": WRITES, "synrag.clusters": 12},
    "writes12-k48": {**LEAD_ARM, "synrag.lead": WRITES, "synrag.clusters": 12,
                     "synrag.target_size": 48},
}


def log_prob_per_token(gen: Any, text: str) -> float:
    """Mean log-probability of ``text``'s tokens under the public model (prompt: BOS only)."""
    ids = gen.encode(text)
    if not ids:
        return float("nan")
    total = 0.0
    with gen.open_stepper([gen.tokenizer.bos_token or " "]) as st:
        for tok in ids:
            row = np.asarray(st.logits()[0], dtype=np.float64)
            row -= row.max()
            total += row[tok] - np.log(np.exp(row).sum())
            st.advance(tok)
    return total / len(ids)


def names_disease(text: str, diseases: list[str]) -> bool:
    low = text.lower()
    return any(d.lower() in low for d in diseases)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arms", default="before,support,tuned")
    ap.add_argument("--questions", type=int, default=24)
    ap.add_argument("--config", default=str(EXAMPLE))
    ap.add_argument("--work", default=None)
    ap.add_argument("--skip", type=int, default=0,
                    help="skip the first SKIP held-out patients (the test questions) to choose "
                    "settings on the next ones (a validation split)")
    ap.add_argument("--no-dp-rows", type=int, default=0,
                    help="also RAG over this many private demo messages (no DP)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "tiny_synrag.md"))
    args = ap.parse_args()

    from dpsynth.api import build_kb
    from dpsynth.demo_corpus import demo_knowledge, write_demo_corpus
    from dpsynth.embed import Embedder
    from dpsynth.files import write_jsonl
    from dpsynth.llm import load_generator
    from dpsynth.rag.answer import Answerer
    from dpsynth.rag.index import KnowledgeBase, build_index

    t_start = time.time()
    work = Path(args.work or tempfile.mkdtemp(prefix="tiny-synrag-"))
    os.environ.setdefault("DPSYNTH_LEDGER", str(work / "ledger.json"))
    diseases = [k["disease"] for k in demo_knowledge(0)]
    held_out = write_demo_corpus(work / "demo", n=60, seed=0, test_n=200)["test"]
    import pandas as pd

    test = pd.read_csv(held_out)
    test = test[[d.lower() not in t.lower() for d, t in zip(test.disease, test.text,
                                                             strict=True)]]
    test = test.iloc[args.skip:args.skip + args.questions]  # --skip 24: a validation split
    questions = [f"{t} Which disease do I most likely have?" for t in test.text]
    gold = list(test.disease)

    gen = load_generator("smollm2", batch_size=16)
    emb = Embedder("minilm")

    def accuracy(answerer: Any, k: int = 3) -> float:
        return right(answerer.ask_many(questions, k))

    def right(out: list[dict[str, Any]]) -> float:
        """Share of answers that name the right disease."""
        return 100.0 * float(np.mean([g.lower() in a["answer"].lower()
                                      for a, g in zip(out, gold, strict=True)]))

    def first_right(out: list[dict[str, Any]]) -> float:
        """Share of questions whose first retrieved passage names the right disease."""
        return 100.0 * float(np.mean([bool(a["passages"]) and g.lower() in
                                      a["passages"][0]["text"].lower()
                                      for a, g in zip(out, gold, strict=True)]))

    def at_k1(answerer: Any) -> tuple[float, float]:
        """(answers right, first passage right) at k = 1, from one set of answers."""
        out = answerer.ask_many(questions, 1)
        return right(out), first_right(out)

    rows: list[dict[str, Any]] = []
    no_rag = accuracy(Answerer(None, gen, emb), k=0)
    reference = None
    if args.no_dp_rows:
        # RAG without DP: the private messages themselves as the knowledge base
        from dpsynth.demo_corpus import make_demo_corpus

        private = list(make_demo_corpus(args.no_dp_rows, 0).text)
        folder = work / "no-dp"
        write_jsonl(folder / "kb.jsonl", [{"id": i, "text": t} for i, t in enumerate(private)])
        build_index(folder, private, emb, "minilm")
        ans = Answerer(KnowledgeBase.open(folder), gen, emb)
        acc1, first = at_k1(ans)
        reference = {"rows": args.no_dp_rows, "acc3": accuracy(ans), "acc1": acc1, "top1": first}
        print(json.dumps({"no_dp": reference}), flush=True)
    for arm in [a for a in args.arms.split(",") if a]:
        t0 = time.time()
        over = {k: (diseases if v == "DISEASES" else v) for k, v in ARMS[arm].items()}
        run = build_kb(args.config, work / arm, generator=gen, embedder=emb,
                       overrides=over, echo=lambda m: print(m, flush=True))
        build_s = time.time() - t0
        released = [json.loads(x) for x in (run / "release" / "synthetic_all.jsonl")
                    .read_text().splitlines() if x]
        privacy = json.loads((run / "release" / "privacy.json").read_text())
        texts = [r["text"] for r in released]
        named = [names_disease(t, diseases) for t in texts]
        kept = [bool(r["kept"]) for r in released]
        lp = [log_prob_per_token(gen, t) for t in texts if t.strip()]
        kb = KnowledgeBase.open(run / "release")
        on_kb = Answerer(kb, gen, emb)
        acc_kb = accuracy(on_kb) if len(kb) else no_rag
        acc_kb1, top1_kb = at_k1(on_kb) if len(kb) else (no_rag, 0.0)
        folder = work / f"{arm}-all"
        write_jsonl(folder / "kb.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
        build_index(folder, texts, emb, "minilm")
        acc_all = accuracy(Answerer(KnowledgeBase.open(folder), gen, emb))
        rows.append({
            "arm": arm, "overrides": ARMS[arm], "epsilon": privacy["epsilon"],
            "clip": privacy.get("clip"), "texts": len(texts), "named": int(sum(named)),
            "kept": int(sum(kept)),
            "kept_named": int(sum(k and n for k, n in zip(kept, named, strict=True))),
            "logprob": float(np.mean(lp)) if lp else float("nan"),
            "acc_kb": acc_kb, "acc_kb1": acc_kb1, "top1": top1_kb, "acc_all": acc_all,
            "build_s": build_s,
            "examples": [t[:140] for t in texts],
        })
        print(json.dumps(rows[-1]), flush=True)
    reads = float(np.mean([log_prob_per_token(gen, t) for t in test.text[:8]]))
    write_report(args, rows, no_rag, reads, len(questions), time.time() - t_start, reference)


def write_report(args: Any, rows: list[dict[str, Any]], no_rag: float, reference: float,
                 n_q: int, wall: float, no_dp: dict[str, Any] | None = None) -> None:
    lines = [
        "# Tiny DP-SynRAG example, arm by arm (one run)", "",
        f"`{Path(args.config).name}` with the overrides of each arm; SmolLM2-135M-Instruct, "
        f"all-MiniLM-L6-v2; {n_q} held-out patients of the demo's test split whose message does "
        f"not name their disease, after skipping the first {args.skip} "
        f"({'validation' if args.skip else 'test'} questions; question: the message + 'Which "
        "disease do I most likely have?'; right when the answer names the disease). 'reads': "
        "mean log-probability per token under the public model (real demo messages: "
        f"{reference:.2f}). Wall time {wall / 60:.1f} min on a shared 2-core CPU.", "",
        f"No RAG: {no_rag:.1f} % right.", "",
    ]
    if no_dp:
        lines += [f"RAG without DP (the {no_dp['rows']} private messages as the knowledge base): "
                  f"{no_dp['acc3']:.1f} % right at k = 3, {no_dp['acc1']:.1f} % at k = 1; the "
                  f"first passage names the right disease for {no_dp['top1']:.1f} %.", ""]
    lines += [
        "| arm | c | texts naming a demo disease | kept by the self-filter (of them naming one) "
        "| reads | RAG on kept %, k = 3 | k = 1 | first passage right % | RAG on all texts % "
        "| build s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['clip']:.3g} | {r['named']}/{r['texts']} | "
                     f"{r['kept']} ({r['kept_named']}) | {r['logprob']:.2f} | "
                     f"{r['acc_kb']:.1f} | {r.get('acc_kb1', float('nan')):.1f} | "
                     f"{r.get('top1', float('nan')):.1f} | {r['acc_all']:.1f} | "
                     f"{r['build_s']:.0f} |")
    lines += ["", "Overrides: " + "; ".join(f"{r['arm']}: {r['overrides']}" for r in rows), ""]
    for r in rows:
        lines += [f"Texts of '{r['arm']}':", ""] + [f"* {t!r}" for t in r["examples"]] + [""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
