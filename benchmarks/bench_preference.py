"""Preference training (``synthesis.preference``) in float32 against bf16 autocast, side by side.

The production trainer (:func:`dpsynth.evolution.preference.train_dpo`, trl's DPO over a
peft LoRA adapter on SmolLM2-135M) runs on the same pairs with ``precision: float32`` and
``precision: bf16`` in alternating rounds (the order flipped each round), each in this process;
per precision: seconds per pair (median over rounds) and what the training did to the pairs,
the mean log-probability margin chosen minus rejected under the tuned model less the same
margin under the base model (float32 scoring; DPO raises it). The pairs are public: zero-shot
prompts of the demo corpus's departments answered by demo texts (chosen) and by assistant
chatter (rejected), the shape of the pairs a vote ranks.

Usage: HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python benchmarks/bench_preference.py
       [--pairs 64] [--rounds 2] [--out benchmarks/results/preference_bf16.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CHATTER = ("Sure! Here is a message you could send:", "I'd be happy to help with that request.",
           "Here is a rephrased version of the text.", "As an AI, I can write a short note.")


def demo_pairs(n: int) -> list[Any]:
    """``n`` public pairs: a department's zero-shot chat prompt, a demo message of it
    (chosen) and a line of chatter (rejected)."""
    from dpsynth.bench.embedding import demo_texts
    from dpsynth.evolution import prompts as P
    from dpsynth.evolution.preference import PreferencePair

    texts = demo_texts(n)
    return [PreferencePair(P.render(P.zero_shot_instruction("a patient's message", ""), True,
                                    "a patient"), text, CHATTER[i % len(CHATTER)])
            for i, text in enumerate(texts)]


def margins(model_dir: Path, pairs: list[Any]) -> list[float]:
    """Per pair: log p(chosen | prompt) - log p(rejected | prompt), float32, summed over the
    answer's tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()

    def logp(prompt: Any, answer: str) -> float:
        text = tok.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
        head = tok(text, add_special_tokens=False)["input_ids"]
        ids = head + tok(answer, add_special_tokens=False)["input_ids"]
        with torch.inference_mode():
            out = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1)
        return float(out[torch.arange(len(head) - 1, len(ids) - 1),
                         torch.tensor(ids[len(head):])].sum())

    return [logp(p.prompt, p.chosen) - logp(p.prompt, p.rejected) for p in pairs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/preference_bf16.json"))
    args = ap.parse_args()

    from dpsynth.bench.machine import Where, describe
    from dpsynth.config import PreferenceConfig
    from dpsynth.evolution.preference import train_dpo
    from dpsynth.llm.models import default_model_cache

    base = default_model_cache() / "smollm2"  # the float weights `make demo` converted
    pairs = demo_pairs(args.pairs)
    base_margin = statistics.mean(margins(base, pairs))
    seconds: dict[str, list[float]] = {"float32": [], "bf16": []}
    moved: dict[str, list[float]] = {"float32": [], "bf16": []}
    with tempfile.TemporaryDirectory() as tmp, Where() as where:
        for r in range(args.rounds):  # each round in the other order: no side always first
            for precision in (list(seconds) if r % 2 == 0 else list(seconds)[::-1]):
                out = Path(tmp) / f"{precision}-{r}"
                start = time.perf_counter()
                train_dpo(base, pairs, out, PreferenceConfig(enabled=True, precision=precision),
                          seed=r)
                seconds[precision].append((time.perf_counter() - start) / len(pairs))
                moved[precision].append(statistics.mean(margins(out, pairs)) - base_margin)
    m = where.result()
    per_pair = {k: statistics.median(v) for k, v in seconds.items()}
    result = {"pairs": args.pairs, "rounds": args.rounds,
              "seconds_per_pair": {k: round(v, 3) for k, v in per_pair.items()},
              "speedup_bf16": round(per_pair["float32"] / per_pair["bf16"], 3),
              "margin_gain": {k: [round(x, 3) for x in v] for k, v in moved.items()},
              "rounds_seconds_per_pair": {k: [round(x, 3) for x in v]
                                          for k, v in seconds.items()},
              "machine": m, "where": describe(m)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
