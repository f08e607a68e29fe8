"""Which zero-shot prompt makes the default model write the record itself (issue 44)?

Each variant asks SmolLM2 (the default engine) for the same labelled texts, public inputs only
(the label names, the task, the writer); a text counts as on task when the production filter
keeps it (:func:`dpsynth.evolution.prompts.clean_generation` with ``drop_off_task``) and, for
Banking77, it reads as the customer's own message (:func:`voice.own_voice`) of at most 40
words. No private record is read.

    .venv/bin/python benchmarks/prompt_variants.py [--per-label 2] [--labels 40]
"""

from __future__ import annotations

import argparse
import json
import random
from typing import Any

from dpsynth.evolution import prompts as P
from dpsynth.llm import GenerationRequest, SamplingParams, load_generator
from harness import ROOT
from voice import own_voice

WRITER = "a customer of an online bank"
TASK = "a short question you ask your online bank"


def quoted_instruction(task: str, label_text: str, writer: str) -> str:
    """The text's exact words in quotes, as its writer would type them."""
    return (f"Write the exact words of {task}, as {writer} would type it. {label_text} Reply "
            "with the text only, in double quotes.")


def opened_quote(task: str, label_text: str, writer: str) -> str:
    """A plain-completion prompt that opens the quote the model completes (stop at the
    closing quote)."""
    return (f"{writer[0].upper()}{writer[1:]} wrote {task}. {label_text}\n\n"
            'What they wrote, word for word: "')


def variants(label: str) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """variant name -> (prompt, stop strings)."""
    label_text = f"It is about {P.readable_label(label)}."
    instr = P.zero_shot_instruction(TASK, label_text)
    return {
        "chat (today)": (P.render(instr, True, WRITER), ()),
        "plain + Text:": (P.render(instr, False, WRITER), ("\n\n",)),
        "chat, quoted": (P.render(quoted_instruction(TASK, label_text, WRITER), True, ""),
                         ()),
        "plain, opened quote": (opened_quote(TASK, label_text, WRITER), ('"', "\n")),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-label", type=int, default=2)
    ap.add_argument("--labels", type=int, default=40)
    args = ap.parse_args()
    names = (ROOT.parent / "examples" / "banking77-intents.txt").read_text().split()
    labels = random.Random(0).sample(names, args.labels)
    gen = load_generator({"backend": "local", "model": "smollm2", "batch_size": 32})
    results: dict[str, Any] = {}
    for name in variants(labels[0]):
        reqs = []
        for i, label in enumerate(labels):
            prompt, stop = variants(label)[name]
            for j in range(args.per_label):
                reqs.append(GenerationRequest(prompt, SamplingParams(
                    temperature=1.0, top_k=50, max_new_tokens=56, seed=1000 * i + j, stop=stop)))
        outs = gen.generate(reqs, progress=False)
        kept = [P.clean_generation(o or "", 12, drop_off_task=True, writer=WRITER,
                                   echoes=P.instruction_sentences(P.with_writer("", WRITER)))
                for o in outs]
        on_task = [k for k in kept if k is not None and own_voice(k) and len(k.split()) <= 40]
        results[name] = {"n": len(outs), "kept by the filter": sum(k is not None for k in kept),
                         "on task": len(on_task),
                         "examples": random.Random(1).sample(on_task, min(4, len(on_task))),
                         "rejected": [o for o, k in zip(outs, kept, strict=True)
                                      if k is None][:3]}
        print(name, json.dumps({k: v for k, v in results[name].items()
                                if k in ("n", "kept by the filter", "on task")}), flush=True)
    out = ROOT / "results" / "prompt_variants.json"
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
