"""Which zero-shot prompt makes the default model write the record itself (issue 44)?

Each variant asks a local model for the same labelled Banking77 texts, public inputs only (the
label names, the task, the writer), on the same seeds. A text is *kept* when the production
filter keeps it (:func:`dpsynth.evolution.prompts.clean_generation` with ``drop_off_task``);
of the kept texts the script reports the share that reads as the customer's own message
(:func:`voice.own_voice`) and, with ``--judge``, the share a classifier trained on 4000 real
Banking77 records (logistic regression on MiniLM) gives the intent it was asked for: the
closest objective stand-in for "a record of the task" we have. It also prints 20 random kept
texts per variant for a reading by eye. The judge reads real records; the generations do not.

    .venv/bin/python benchmarks/prompt_variants.py [--per-label 4] [--labels 77] [--judge]
        [--variants "chat (today);chat, prefilled quote"] [--out results/prompt_variants_77.json]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from dpsynth.evolution import prompts as P
from dpsynth.llm import GenerationRequest, SamplingParams, load_generator
from harness import ROOT, SHARED, machine
from voice import own_voice

WRITER = "a customer of an online bank"
TASK = "a short question you ask your online bank"

#: (model, prompt builder) per variant; a builder gets the generator (its tokenizer renders a
#: prefilled chat turn) and the intent, and returns (prompt, stop strings).
Builder = Callable[[Any, str], tuple[Any, tuple[str, ...]]]


def _label_text(label: str) -> str:
    return f"It is about {P.readable_label(label)}."


def chat_today(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """The production request: the writer as the system message, the zero-shot instruction."""
    return P.render(P.zero_shot_instruction(TASK, _label_text(label)), True, WRITER), ()


def chat_prefilled_quote(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """The production request with the assistant's turn opened by a double quote (the model
    continues inside the quote; stop at the closing quote or the line's end)."""
    messages, _ = chat_today(gen, label)
    text = gen.tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=True)
    return str(text) + '"', ('"', "\n")


def chat_quoted(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """The text's exact words in quotes, as its writer would type them."""
    return P.render(f"Write the exact words of {TASK}, as {WRITER} would type it. "
                    f"{_label_text(label)} Reply with the text only, in double quotes.",
                    True, ""), ()


def plain_text_cue(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """The production instruction as a plain completion with its 'Text:' answer cue."""
    return P.render(P.zero_shot_instruction(TASK, _label_text(label)), False, WRITER), ("\n\n",)


def plain_opened_quote(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """A plain completion that opens the quote the model completes."""
    return (f"{WRITER[0].upper()}{WRITER[1:]} wrote {TASK}. {_label_text(label)}\n\n"
            'What they wrote, word for word: "'), ('"', "\n")


def plain_list(gen: Any, label: str) -> tuple[Any, tuple[str, ...]]:
    """A list a base model continues: the first item of a list of the chat's messages."""
    return ("Messages that customers of an online bank typed into the bank's support chat, "
            f"each about {P.readable_label(label)}:\n\n1. \""), ('"', "\n")


VARIANTS: dict[str, tuple[str, Builder]] = {
    "chat (today)": ("smollm2", chat_today),
    "chat, prefilled quote": ("smollm2", chat_prefilled_quote),
    "chat, quoted": ("smollm2", chat_quoted),
    "plain + Text:": ("smollm2", plain_text_cue),
    "plain, opened quote": ("smollm2", plain_opened_quote),
    "plain list": ("smollm2", plain_list),
    "plain list, Gemma 3 base": ("gemma3", plain_list),
}


def generate(model: str, builder: Builder, labels: list[str], per_label: int
             ) -> list[tuple[str, str | None]]:
    """(intent, kept text or None) per request; seeds shared by every variant."""
    gen = load_generator({"backend": "local", "model": model, "batch_size": 32})
    reqs, intents = [], []
    for i, label in enumerate(labels):
        prompt, stop = builder(gen, label)
        for j in range(per_label):
            reqs.append(GenerationRequest(prompt, SamplingParams(
                temperature=1.0, top_k=50, max_new_tokens=48, seed=1000 * i + j, stop=stop)))
            intents.append(label)
    outs = gen.generate(reqs, progress=False)
    echoes = P.instruction_sentences(P.with_writer("", WRITER))
    return [(label, P.clean_generation(o or "", 12, drop_off_task=True, writer=WRITER,
                                       echoes=echoes))
            for label, o in zip(intents, outs, strict=True)]


def judge_of() -> Callable[[list[str]], np.ndarray]:
    """A classifier of Banking77 intents trained on 4000 real records (MiniLM embeddings)."""
    from sklearn.linear_model import LogisticRegression

    from dpsynth.embed import Embedder

    emb = Embedder("minilm", cache_dir=ROOT / "runs" / "embed-cache")
    train = pd.read_csv(SHARED / "banking77" / "train.csv").sample(4000, random_state=0)
    clf = LogisticRegression(max_iter=2000).fit(emb.embed(list(train.text)), train.category)
    return lambda texts: clf.predict(emb.embed(texts))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-label", type=int, default=4)
    ap.add_argument("--labels", type=int, default=77)
    ap.add_argument("--variants", default=";".join(VARIANTS),
                    help="variant names, separated by ';'")
    ap.add_argument("--judge", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "results" / "prompt_variants_77.json"))
    args = ap.parse_args()
    names = (ROOT.parent / "examples" / "banking77-intents.txt").read_text().split()
    labels = sorted(random.Random(0).sample(names, min(args.labels, len(names))))
    judge = judge_of() if args.judge else None
    results: dict[str, Any] = {"machine": machine(), "labels": len(labels),
                               "per_label": args.per_label}
    for name in args.variants.split(";"):
        model, builder = VARIANTS[name]
        rows = generate(model, builder, labels, args.per_label)
        kept = [(label, t) for label, t in rows if t is not None]
        texts = [t for _, t in kept]
        entry: dict[str, Any] = {
            "model": model, "n": len(rows), "kept by the filter": len(kept),
            "own voice, of kept": round(float(np.mean([own_voice(t) for t in texts])), 3),
            "median words, kept": float(np.median([len(t.split()) for t in texts])),
        }
        if judge is not None:
            asked = np.array([label for label, _ in kept])
            entry["judge's intent = asked, of kept"] = round(float(np.mean(judge(texts) == asked)),
                                                            3)
        entry["read by eye"] = random.Random(3).sample(texts, min(20, len(texts)))
        results[name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "read by eye"}),
              flush=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
