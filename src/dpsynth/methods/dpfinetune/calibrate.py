"""DP-SGD's cost on this machine, for ``dpsynth plan`` (no private data): the seconds one
per-record gradient takes on the loop path's own code (one record a pass, one thread, the
run's adapter), timed on public records as long as the run's longest (its prompt and
``max_tokens`` text tokens); the plan divides the run's gradients over the pass workers (each
runs one thread: two on two cores took 0.51x the time of one, benchmarks/results/
dp_finetune.md). Measured against full epochs of 2000 records: 16 min said for Yelp's
reviews (which fill ``max_tokens``) trained in 18.3 (the steps' noise, optimizer and
checkpoints are not counted), 15 min said for Banking77's shorter questions trained in 11."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from ...config import RunConfig
from ...llm.local import LocalGenerator
from .config import DPFineTuneConfig
from .prompts import label_heads
from .train import DPSGD, Example, StepSettings, attach_lora, text_start

#: public records timed (after one untimed warm-up record)
RECORDS = 4
#: the public label sentence the calibration's prompt carries
SENTENCE = "About the weather this week."


def public_examples(gen: Any, config: RunConfig, s: DPFineTuneConfig, n: int) -> list[Example]:
    """``n`` public training examples of the run's longest shape: the run's prompt for a
    public label sentence, then ``max_tokens`` text tokens of a public text and the end
    token."""
    head = label_heads(gen, [SENTENCE], config.prompts, s.prompt)[0]
    words = " ".join(["the morning train was late again and we waited on the platform"] * 64)
    body = list(gen.tokenizer.encode(words, add_special_tokens=False))[:s.max_tokens]
    ids = tuple(int(i) for i in [*head, *body, int(gen.eos_token_ids[0])])
    return [Example(ids, text_start(head)) for _ in range(n)]


def trainer_for(config: RunConfig, s: DPFineTuneConfig) -> DPSGD:
    """The loop path's trainer on a fresh torch copy of the configured generator with the
    run's adapter, over public examples (one worker: the pass on one thread)."""
    import torch

    g = config.generators[0]
    gen = LocalGenerator(g.model, engine="transformers", num_threads=1, device="cpu")
    torch.manual_seed(0)  # the adapter's initial values: public
    model = attach_lora(gen.model, s.lora_rank, s.lora_alpha, s.target_modules, s.lora_layers)
    examples = public_examples(gen, config, s, RECORDS + 1)
    settings = StepSettings(noise_multiplier=1.0, q=1.0, steps=1, expected_batch=1.0,
                            clip=s.max_grad_norm, learning_rate=s.learning_rate,
                            secure=False)
    model.train()
    return DPSGD(model, examples, settings, None, None, int(gen.pad_token_id),
                 first_target=examples[0].start)


def gradients_per_second(trainer: DPSGD) -> float:
    """Per-record clipped gradients a second on one thread: one untimed record (it decides
    the stored lower-layer states, warms the kernels), then :data:`RECORDS` more. Each record
    is another index: with ``lora_layers`` the states of each are computed, as a record's
    first pass in an epoch computes them."""
    trainer.clipped_sum(np.array([0]))
    started = time.perf_counter()
    trainer.clipped_sum(np.arange(1, RECORDS + 1))
    return RECORDS / max(time.perf_counter() - started, 1e-6)


def calibration_key(config: RunConfig, s: DPFineTuneConfig) -> str:
    """What the rate depends on: the generator, the adapter's shape and placement, the
    record length and prompt form (with :func:`dpsynth.estimate.machine` in the cache)."""
    g = config.generators[0]
    return (f"{Path(g.model).name}|r{s.lora_rank}|{','.join(s.target_modules)}|"
            f"layers={s.lora_layers}|tokens={s.max_tokens}|{s.prompt}")
