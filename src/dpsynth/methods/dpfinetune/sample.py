"""The release of a DP fine-tune: texts sampled from the tuned model, conditioned on each label's
prompt, N_y per label split from the DP noisy label counts (or evenly). Post-processing of the
DP-SGD output and the noisy counts: it reads no private record."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import GenerationError
from ...evolution.selection import allocate, shrunk_counts
from ...llm.base import GenerationRequest, SamplingParams
from ...llm.local import LocalGenerator
from ...llm.models import quiet_transformers


def quota(samples: int, noisy_counts: np.ndarray | None, n_labels: int,
          noise_var: float = 0.0) -> np.ndarray:
    """Samples per label: the total split in proportion to the noisy counts shrunk toward
    their mean by their noise variance (:func:`shrunk_counts`; negatives 0, by largest
    remainder; docs/methods.md §1), or evenly without counts."""

    weights = (np.ones(n_labels) if noisy_counts is None
               else shrunk_counts(np.asarray(noisy_counts), noise_var))
    return allocate(samples, weights)


#: one attempt's draws: (label index, seed) per sample -> its text, same order
Draw = Callable[[list[tuple[int, int]]], list[str]]


def sample_texts(draw: Draw, labels: int, per_prompt: Sequence[int],
                 *, seed_for: Callable[..., int],
                 clean: Callable[[str], str | None] | None = None,
                 check: Callable[[list[int], list[str]], np.ndarray] | None = None,
                 retries: int = 0) -> tuple[list[tuple[int, str]], dict[str, int]]:
    """(label index, text) for ``per_prompt[y]`` samples of each of the ``labels`` classes,
    every sample seeded by ``seed_for(y, i)`` (its label and slot: a resumed or repeated run
    samples the same texts from the same model; on openvino whatever else is drawn beside it,
    on the other engines with the same batches, as each run's are); and the
    counts of refused texts (``refused``, of them ``off_label``) and of those left out
    (``dropped``). One call of ``draw`` per attempt, over every label's open slots.

    ``clean``: the PE methods' public text filters (a text, or None for one they refuse);
    ``check(labels, texts)``: a mask of the texts the label check refuses, over every label's
    texts of one attempt at once (its gate needs many). A refused text is drawn again, up to
    ``retries`` more times (``seed_for(y, i, attempt)``). After the last try a slot
    still empty keeps the last text only the label check refused (the check steers, as in
    the PE methods: it never empties a release), and is left out when the filters refused
    every try."""
    counts = {"refused": 0, "off_label": 0, "dropped": 0}
    kept: list[list[str]] = [[] for _ in range(labels)]
    fallback: list[list[str]] = [[] for _ in range(labels)]  # the last attempt's off-label
    open_slots = [(y, i) for y, n in enumerate(per_prompt) for i in range(int(n))]
    for attempt in range(retries + 1 if clean is not None or check is not None else 1):
        if not open_slots:
            break
        seeds = [(y, seed_for(y, i) if attempt == 0 else seed_for(y, i, attempt))
                 for y, i in open_slots]
        drawn: list[tuple[int, int, str]] = []
        refused_slots: list[tuple[int, int]] = []
        for (y, i), text in zip(open_slots, draw(seeds), strict=True):
            cleaned = text if clean is None else clean(text)
            if cleaned is None:
                counts["refused"] += 1
                refused_slots.append((y, i))
            else:
                drawn.append((y, i, cleaned))
        off = (check([y for y, _, _ in drawn], [t for _, _, t in drawn])
               if check is not None and drawn else np.zeros(len(drawn), dtype=bool))
        counts["refused"] += int(off.sum())
        counts["off_label"] += int(off.sum())
        off_label: list[list[str]] = [[] for _ in range(labels)]
        for (y, i, text), refuse in zip(drawn, off, strict=True):
            if refuse:
                off_label[y].append(text)
                refused_slots.append((y, i))
            else:
                kept[y].append(text)
        fallback = [new or old for new, old in zip(off_label, fallback, strict=True)]
        open_slots = sorted(refused_slots)
    for y, n in enumerate(per_prompt):
        kept[y] += fallback[y][:max(0, int(n) - len(kept[y]))]
    counts["dropped"] = sum(int(n) - len(k) for n, k in zip(per_prompt, kept, strict=True))
    return [(y, text) for y, texts in enumerate(kept) for text in texts], counts


def save_merged(model: Any, tokenizer: Any, out: Path) -> None:
    """The peft ``model`` with its LoRA adapter merged into the weights (W + B A alpha / r,
    peft's ``merge_and_unload``), saved with ``tokenizer`` as a local HF model directory
    ``out`` (created)."""
    merged = model.merge_and_unload()  # the peft model of train.attach_lora
    out.mkdir(parents=True)
    with quiet_transformers():
        merged.save_pretrained(str(out), safe_serialization=True)
        tokenizer.save_pretrained(str(out))


def tuned_generator(model: Any, base: Any, folder: Path, *, engine: str,
                    batch_size: int | None, threads: int | None, device: str) -> LocalGenerator:
    """A :class:`~dpsynth.llm.local.LocalGenerator` on the tuned model, so the release is
    drawn by the same sampling engine as the PE methods' candidates (OpenVINO bf16 or
    ctranslate2 int8 on a CPU; 8-15x torch's ``generate`` at the release's small per-label
    batches). The adapter is merged into the weights and the model saved with ``base``'s
    tokenizer to ``folder/model`` (:func:`save_merged`)
    (``folder`` under private/: every engine's conversion is written under it too).
    Post-processing of the DP-SGD output: no record is read."""
    if folder.exists():  # a resumed run's half-written copy
        shutil.rmtree(folder)
    save_merged(model, base.tokenizer, folder / "model")
    tuned = LocalGenerator(folder / "model", cache_dir=folder, engine=engine,
                           batch_size=batch_size, num_threads=threads, device=device)
    if tuned.eos_token_ids != base.eos_token_ids or tuned.pad_token_id != base.pad_token_id:
        raise GenerationError(f"{base.name}: the tuned model's end or pad tokens differ from "
                              "the generator's")
    return tuned


def engine_draw(tuned: Any, prompts: Sequence[str], heads: Sequence[Sequence[int]], *,
                max_new_tokens: int, temperature: float, top_p: float,
                top_k: int | None) -> Draw:
    """:data:`Draw` on ``tuned``: each sample a plain completion of its label's prompt text
    (``prompts[y]``, which the tuned model's tokenizer must turn into exactly the training
    prompt's ids ``heads[y]``), with its own seed."""
    for y, (text, head) in enumerate(zip(prompts, heads, strict=True)):
        if tuned.encode_prompt(text) != list(head):
            raise GenerationError(f"{tuned.name}: label {y}'s prompt tokenises differently "
                                  "from the training prompt")

    def draw(rows: list[tuple[int, int]]) -> list[str]:
        requests = [GenerationRequest(prompts[y], SamplingParams(
            temperature=temperature, top_p=top_p, top_k=top_k or 0,
            max_new_tokens=max_new_tokens, seed=seed % 2**63)) for y, seed in rows]
        return [text.strip() for text in tuned.generate(requests, progress=False)]

    return draw
