"""Which variation prompt keeps a record a record (issue 44)?

Aug-PE's VARIATION_API rewrites a voted text. Each variant here asks SmolLM2 (the default
engine, chat template, the customer as the writer) for one variation of each of 120 Banking77
test messages of the 10 most frequent intents, as parents: public benchmark texts standing in
for synthetic winners. Scored: the share the production filters keep (and that differ from
their parent), the share a classifier trained on real training records gives the parent's
intent, the own-voice share (:func:`voice.own_voice`), the mean cosine to the parent (MiniLM)
and the median length.

    .venv/bin/python benchmarks/variation_prompts.py [--parents 120]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable

import numpy as np
import pandas as pd
from sklearn.linear_model import LogisticRegression

from dpsynth.evolution import prompts as P
from dpsynth.llm import GenerationRequest, SamplingParams, load_generator
from harness import ROOT, SHARED
from voice import own_voice

WRITER = "a customer of an online bank"
TASK = "a short question you ask your online bank"
STYLES = ("casual", "formal", "brief", "detailed", "worried", "polite", "direct", "plain")
OUT = ROOT / "results" / "variation_prompts.md"


def another_like_it(text: str, label_text: str, style: str) -> str:
    """The parent quoted first, then the ask for another text like it."""
    return (f'Here is {TASK}: "{text}"\n\nWrite another {TASK} like it, in a {style} style, '
            f"about the same problem. {label_text} Reply with the new question only.")


def say_it_again(text: str, label_text: str, style: str) -> str:
    """The writer's own words handed back to them."""
    return (f'You wrote: "{text}"\n\nSay it again in other words, in a {style} style. Reply '
            "with your new message only.")


def variants(seed: int) -> dict[str, Callable[[str, str, str], str]]:
    """variant name -> instruction(parent, label sentence, style)."""
    rng = np.random.default_rng(seed)
    return {
        "rephrase (today)": lambda t, lt, st: P.rephrase_instruction(TASK, lt, t, st),
        "another like it": another_like_it,
        "say it again": say_it_again,
        "fill in (today's other)": lambda t, lt, st: P.fill_in_instruction(
            TASK, lt, P.mask_words(t, 0.5, rng)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parents", type=int, default=120)
    args = ap.parse_args()
    from dpsynth.embed import Embedder

    train = pd.read_csv(SHARED / "banking77" / "train.csv")
    test = pd.read_csv(SHARED / "banking77" / "test.csv")
    counts = train["category"].value_counts()
    intents = sorted(sorted(counts.index, key=lambda c: (-counts[c], c))[:10])
    embedder = Embedder("minilm", cache_dir=ROOT / "runs" / "embed-cache")
    known = train[train.category.isin(intents)]
    judge = LogisticRegression(max_iter=2000).fit(
        embedder.embed(list(known.text), progress=False), known.category)
    parents = test[test.category.isin(intents)].sample(args.parents, random_state=0)
    gen = load_generator({"backend": "local", "model": "smollm2", "batch_size": 32})
    rows, samples = [], []
    for name, make in variants(0).items():
        requests, pairs = [], []
        for j, (text, label) in enumerate(zip(parents.text, parents.category, strict=True)):
            label_text = f"It is about {P.readable_label(label)}."
            instruction = make(text, label_text, STYLES[j % len(STYLES)])
            requests.append(GenerationRequest(P.render(instruction, True, WRITER), SamplingParams(
                temperature=1.0, top_k=50, max_new_tokens=40, seed=1000 + j)))
            pairs.append((text, label, instruction))
        kept = []
        for (text, label, instruction), raw in zip(pairs, gen.generate(requests, progress=False),
                                                   strict=True):
            echoes = P.instruction_sentences(P.with_writer(instruction, WRITER))
            out = P.clean_generation(raw or "", 12, drop_off_task=True, writer=WRITER,
                                     echoes=echoes)
            if out is not None and P.normalised(out) != P.normalised(text):
                kept.append((text, label, out))
        x = embedder.embed([o for _, _, o in kept], progress=False)
        xp = embedder.embed([t for t, _, _ in kept], progress=False)
        fidelity = np.mean(judge.predict(x) == np.array([y for _, y, _ in kept]))
        rows.append(f"| {name} | {len(kept)} / {len(pairs)} | {fidelity:.2f} | "
                    f"{np.mean([own_voice(o) for _, _, o in kept]):.2f} | "
                    f"{float(np.mean(np.sum(x * xp, axis=1))):.2f} | "
                    f"{np.median([len(o.split()) for _, _, o in kept]):.0f} |")
        print(rows[-1], flush=True)
        samples += [f"- {name}: \"{t}\" -> \"{o}\"" for t, _, o in
                    random.Random(0).sample(kept, min(3, len(kept)))]
    OUT.write_text(
        "# Variation prompts (issue 44)\n\n`.venv/bin/python benchmarks/variation_prompts.py`\n\n"
        + __doc__.split("\n\n")[1].replace("\n", " ") + "\n\n"
        "| variant | kept, new | parent's intent | own voice | cosine to parent | median "
        "words |\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n\n## Samples\n\n"
        + "\n".join(samples) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
