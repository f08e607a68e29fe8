"""A generator that learns from the released votes (the idea of POPri, Hou et al., ICML 2025:
the noisy histogram is already released, so training on the ranking it gives is
post-processing and costs no budget; docs/methods.md §1, "Learning from the votes").

After a vote, pairs of synthetic candidates of one label class, one the released votes rank
high against one they rank low, train a LoRA adapter on the local generator by direct
preference optimisation (trl's ``DPOTrainer`` over a peft adapter: no trainer of our own),
with the label's zero-shot prompt as the prompt both candidates answer. The merged model is
saved in the run folder (``private/preference/iterT``, with a marker written last), so a
resumed run loads it instead of training again. What the trainer sees: synthetic texts, the
public prompt and the noisy scores' order. Never a private record.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..config import PreferenceConfig
from ..llm.local import bf16_supported
from .pool import Pool

#: written last into a finished tuned-model folder: a folder without it is retrained
MARKER = "dpsynth-tuned.json"


@dataclass(frozen=True)
class PreferencePair:
    """One preference: ``prompt`` (chat messages or plain text) answered better by
    ``chosen`` than by ``rejected`` in the released votes' order."""

    prompt: Any
    chosen: str
    rejected: str


#: trains on pairs: (base model folder or None for a test fake, pairs, output folder, the
#: settings, seed) -> None; writes the merged model into the output folder
Trainer = Callable[[Path | None, Sequence[PreferencePair], Path, PreferenceConfig, int], None]


def ranked_pairs(pool: Pool, scores: np.ndarray, n_pairs: int, rng: np.random.Generator,
                 source: int | None = None) -> list[tuple[int, int]]:
    """Up to ``n_pairs`` (chosen, rejected) candidate indices of one label class each: chosen
    among the candidates with a positive released score, highest first, against the
    lowest-scored of the label (a score below the chosen one's), label by label in turn so
    every label class contributes. ``source``: only that generator's candidates. Pure
    post-processing of the released ``scores``."""
    scores = np.asarray(scores, dtype=np.float64)
    per_label: list[list[tuple[int, int]]] = []
    for y in np.unique(pool.labels):
        idx = np.flatnonzero((pool.labels == y) & (True if source is None else
                                                   pool.sources == source))
        if len(idx) < 2:
            continue
        order = idx[np.lexsort((idx, -scores[idx]))]
        top = [int(i) for i in order if scores[i] > 0][: len(order) // 2]
        bottom = [int(i) for i in order[::-1]][: len(top)]
        pairs = [(c, r) for c, r in zip(top, bottom, strict=False) if scores[r] < scores[c]]
        if pairs:
            per_label.append(pairs)
    rng.shuffle(per_label)
    out: list[tuple[int, int]] = []
    depth = 0
    while len(out) < n_pairs and any(depth < len(p) for p in per_label):
        out += [p[depth] for p in per_label if depth < len(p)][: n_pairs - len(out)]
        depth += 1
    return out


def is_tuned(folder: Path) -> bool:
    """Whether ``folder`` holds a finished tuned model."""
    return (folder / MARKER).is_file()


def autocast_bf16(precision: str) -> bool:
    """Whether preference training runs under bf16 autocast: ``precision`` 'bf16', or
    'auto' on a CPU with native bf16 products (:func:`dpsynth.llm.local.bf16_supported`)."""
    if precision == "auto":
        return bf16_supported()
    return precision == "bf16"


def train_dpo(base: Path | None, pairs: Sequence[PreferencePair], out: Path,
              settings: PreferenceConfig, seed: int) -> None:
    """DPO (Rafailov et al. 2023) of a rank-``settings.rank`` LoRA adapter on the float
    weights in ``base`` (under bf16 autocast where :func:`autocast_bf16`), merged and saved to
    ``out`` (with :data:`MARKER` last)."""
    if base is None:
        raise ValueError("preference training needs a local generator's weights")
    import torch
    from datasets import Dataset, disable_progress_bars
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import DPOConfig, DPOTrainer

    disable_progress_bars()  # the run's own display shows the step; no library bars or logs

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    data = Dataset.from_list([_dpo_row(p) for p in pairs])
    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    args = DPOConfig(output_dir=str(work / "trainer"), per_device_train_batch_size=min(
        settings.batch_size, len(pairs)), num_train_epochs=settings.epochs,
        learning_rate=settings.learning_rate, beta=settings.beta, seed=seed,
        report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
        max_length=settings.max_length, disable_tqdm=True,
        bf16=autocast_bf16(settings.precision))
    lora = LoraConfig(r=settings.rank, lora_alpha=2 * settings.rank, lora_dropout=0.0,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    trainer = DPOTrainer(model=model, args=args, train_dataset=data,
                         processing_class=tokenizer, peft_config=lora)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    merged = trainer.model.merge_and_unload()
    merged.save_pretrained(str(work / "model"))
    tokenizer.save_pretrained(str(work / "model"))
    shutil.rmtree(out, ignore_errors=True)
    (work / "model").rename(out)
    shutil.rmtree(work, ignore_errors=True)
    (out / MARKER).write_text(json.dumps({"pairs": len(pairs), "rank": settings.rank,
                                          "beta": settings.beta, "seed": seed,
                                          "bf16": args.bf16}))


def _dpo_row(pair: PreferencePair) -> dict[str, Any]:
    """trl's preference format: conversational for chat prompts, plain text otherwise."""
    if isinstance(pair.prompt, str):
        return {"prompt": pair.prompt, "chosen": " " + pair.chosen,
                "rejected": " " + pair.rejected}
    return {"prompt": [dict(m) for m in pair.prompt],
            "chosen": [{"role": "assistant", "content": pair.chosen}],
            "rejected": [{"role": "assistant", "content": pair.rejected}]}
