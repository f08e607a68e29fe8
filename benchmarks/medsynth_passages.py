"""Passages per question and a public closing, chosen on Medical Synth's validation split.

Reads a finished ``bench_medsynth.py --work WORK`` folder (its DP-SynRAG release, every text:
the no-filter knowledge base, the default) and answers the split's questions with 1, 2 and 3
passages, beside RAG without DP over the same private documents at the same counts. With
``--closing`` the closing is appended to each released text first: the same as a build with
``synrag.closing`` set, since the closing is post-processing (no model sees it; the tokens and
their charge are unchanged, tests/test_synrag_support.py::test_a_closing_is_post_processing).

    env PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/medsynth_passages.py WORK \\
        --split validation --questions 100 [--closing ' Diagnosis: {keyword}.'] [--rag]

Prints, per passage count: correct answers, and questions with the gold disease named in a
retrieved passage.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("work", type=Path)
    ap.add_argument("--split", default="validation", choices=["validation", "test"])
    ap.add_argument("--questions", type=int, default=100)
    ap.add_argument("--private", type=int, default=2000)
    ap.add_argument("--closing", default="", help="public closing; {keyword} = the seed")
    ap.add_argument("--rag", action="store_true", help="also RAG without DP")
    args = ap.parse_args()

    from bench_medsynth import DATA, load_medsynth
    from dpsynth.embed import Embedder
    from dpsynth.files import write_jsonl
    from dpsynth.llm import load_generator
    from dpsynth.methods.synrag.private_prediction import join_closing
    from dpsynth.rag.answer import Answerer
    from dpsynth.rag.index import KnowledgeBase, build_index
    from rag_baselines import rag_without_dp

    data = load_medsynth()
    rows = data[args.split][: args.questions]
    questions = [r["question"] for r in rows]
    gold = [r["disease"].lower() for r in rows]
    released = args.work / "synrag" / "release" / "synthetic_all.jsonl"
    # the seed in the public catalogue's spelling, as the build fills {keyword}
    spell = {d.lower(): d for d in json.loads((DATA / "diseases.json").read_text())}
    texts = []
    for line in released.read_text().splitlines():
        if line:
            r = json.loads(line)
            kw = spell.get(str(r.get("keyword")), str(r.get("keyword")))
            texts.append(join_closing(r["text"], args.closing.replace("{keyword}", kw)))
    emb = Embedder("minilm")
    gen = load_generator("smollm2", batch_size=16)
    folder = args.work / "passages-kb"
    write_jsonl(folder / "kb.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts)])
    build_index(folder, texts, emb, "minilm")
    arms = {"DP-SynRAG": Answerer(KnowledgeBase.open(folder), gen, emb)}
    if args.rag:
        docs = [r["document"] for r in data["private"][: args.private]]
        arms["RAG (no DP)"] = rag_without_dp(
            docs, gen, emb, embeddings=np.asarray(emb.embed(docs), dtype=np.float32))
    print(f"{args.split}, {len(rows)} questions, closing {args.closing!r}")
    print("| arm | passages | correct | gold disease in a passage |\n|---|---|---|---|")
    for name, answerer in arms.items():
        for k in (1, 2, 3):
            ans = answerer.ask_many(questions, k)
            ok = sum(g in a["answer"].lower() for g, a in zip(gold, ans, strict=True))
            hit = sum(any(g in p["text"].lower() for p in a["passages"])
                      for g, a in zip(gold, ans, strict=True))
            print(f"| {name} | {k} | {ok}/{len(rows)} | {hit}/{len(rows)} |", flush=True)


if __name__ == "__main__":
    main()
