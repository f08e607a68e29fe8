"""DP-SGD on a LoRA adapter (Abadi et al. 2016, Algorithm 1; Hu et al. 2022), resumable.

Each step t: Poisson sampling (every record in the batch with probability q, coins from the
session's stream ``dp_sgd/step{t}/poisson``), one record's loss = the mean next-token loss of
its own tokens after the label prompt, its gradient g_i over the adapter clipped to
g_i min(1, C / ||g_i||), the clipped gradients summed EXACTLY (each truncated towards zero onto
the 2^-32 fixed-point grid and added as integers, so the sum does not depend on the order or
grouping of the records), then sum + N(0, (sigma C)^2 I) (stream ``dp_sgd/step{t}/noise``),
divided by the expected batch B, and an AdamW step (post-processing).

User level (``privacy.unit: user``, ``groups``: each user's record indices, at most
``max_records_per_user`` of them, the first in file order): the unit of every step above is a
user. Each user is in the batch with probability q (its own coin, users in id order); a sampled
user's gradient is the mean of the gradients of its records (each record in its own forward
and backward pass, summed in float64 in the user's record order), clipped to C as one and
truncated onto the grid, so adding or removing one user moves the exact sum by at most C in
L2, whatever their number of records; the noise and B (in users) as above. Only the ``loop``
path computes this (hooks and ghost clipping clip per record).

Per-sample gradients (``clipping``): ``loop``, one record per forward and backward pass (no
batch mixes records at all), each on one thread, in ``workers`` processes (:mod:`.workers`);
``hooks``, Opacus's GradSampleModule (per-sample gradients from
its hooks) on passes of a fixed shape (:mod:`dpsynth.fixed_shape`: ``micro_batch`` rows, each
record padded to a width set by its own length, filler rows with no target), so a record's
clipped gradient is bit-identical whatever records share its pass, as on ``loop``;
``ghost``, Opacus's fast gradient clipping (per-sample norms without the gradients, then a
second backward pass of the clipped loss: Li et al. 2022, "Large language models can be strong
differentially private learners", and Bu et al. 2023), whose second pass sums a micro-batch's
clipped gradients in floating point (equal to the others' sum up to rounding only).
The models here have no batch normalisation: a record's per-sample gradient is a function of
that record alone (layer/RMS norms and attention act within one sequence; right padding and
the attention mask keep padded positions out).

Checkpoints (``private/dp-finetune/checkpoint.pt``, mode 0600) hold the adapter, AdamW's
state and the next step; the noise and coins of step t come from keyed streams, so a resumed
run continues at the step after the last checkpoint and, with seeded noise, redraws exactly
what the killed one drew (with secure noise a step that was never checkpointed was never
released either; the budget was charged once, before step 0, for all T steps).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...fixed_shape import fixed_shape_passes
from ...llm.models import quiet_transformers
from ...llm.runtime import torch_threads
from .frozen import CACHE_BYTES, PROBE_IDS, PROBE_START, FrozenBelow, first_adapted
from .workers import PassSpec, PassWorkers

#: fixed-point grid of the exact sum of clipped gradients
GRID_BITS = 32
CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Example:
    """One training record as token ids; the loss is on ``ids[start:]`` (the record after
    its label prompt, and the end-of-text token)."""

    ids: tuple[int, ...]
    start: int


def text_start(head: Sequence[int]) -> int:
    """The position of a record's first text token after its label prompt ``head`` (at
    least 1: the first token has no prediction)."""
    return max(1, len(head))


def make_examples(tokenizer: Any, heads: Sequence[Sequence[int]], texts: Sequence[str],
                  max_tokens: int, eos_id: int) -> list[Example]:
    """Per record its head's ids (the label's prompt, :func:`dpsynth.methods.dpfinetune.
    prompts.label_heads`), then the record's text cut at ``max_tokens`` tokens and the end
    token; the loss is on the text and the end token only."""
    out = []
    for head, text in zip(heads, texts, strict=True):
        body = list(tokenizer.encode(text, add_special_tokens=False))[:max_tokens]
        ids = [int(i) for i in head] + body + [int(eos_id)]
        out.append(Example(tuple(ids), text_start(head)))
    return out


def attach_lora(model: Any, rank: int, alpha: float, targets: Sequence[str],
                last_layers: int | None = None) -> Any:
    """The model with a LoRA adapter on ``targets`` (no dropout: a step is a function of its
    batch, the noise and the state alone), on the last ``last_layers`` transformer layers
    only when given (nothing below them is trainable, so backward passes stop there); only
    the adapter is trainable."""
    from peft import LoraConfig, get_peft_model

    layers = None
    if last_layers is not None:
        total = int(model.config.get_text_config().num_hidden_layers)
        layers = list(range(max(0, total - last_layers), total))
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0,
                     bias="none", layers_to_transform=layers)
    with warnings.catch_warnings():  # peft asks transformers a deprecated question: not ours
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                category=FutureWarning)
        return get_peft_model(model, cfg)


def adapter_coordinates(model_dir: Path, rank: int, alpha: float, targets: Sequence[str],
                        last_layers: int | None = None) -> int:
    """The trainable coordinates d of the adapter :func:`attach_lora` puts on the model in
    ``model_dir``, counted on torch's meta device from its config.json alone (no weights
    read): a public value, for ``dpsynth plan`` before any model loads."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with quiet_transformers(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))
    with quiet_transformers():
        model = attach_lora(model, rank, alpha, targets, last_layers)
    return sum(int(p.numel()) for _, p in trainable(model))


def trainable(model: Any) -> list[tuple[str, Any]]:
    """The trainable parameters, in name order (the order of the noise draws)."""
    return sorted(((n, p) for n, p in model.named_parameters() if p.requires_grad),
                  key=lambda item: item[0])


def collate(examples: Sequence[Example], pad_id: int) -> tuple[Any, Any, Any]:
    """Right-padded ids, attention mask and the loss mask of the targets (shifted by one),
    padded to the longest example (:func:`fixed_shape_batch` with no filler row)."""
    return fixed_shape_batch(examples, max(len(e.ids) for e in examples), len(examples),
                             pad_id)


#: the width cap of a fixed-shape pass: none (a record's width follows from its own length
#: alone, never from the longest record's)
_NO_WIDTH_CAP = 1 << 30


def fixed_shape_batch(examples: Sequence[Example], width: int, rows: int,
                      pad_id: int) -> tuple[Any, Any, Any]:
    """:func:`collate` at the fixed shape ``(rows, width)``: each example right-padded to
    ``width``, then filler rows (one pad token attended, no target: loss and gradient 0) up to
    ``rows``."""
    import torch

    if len(examples) > rows or any(len(e.ids) > width for e in examples):
        raise ValueError("the examples do not fit the pass's fixed shape")
    ids = torch.full((rows, width), int(pad_id), dtype=torch.long)
    attn = torch.zeros((rows, width), dtype=torch.long)
    target = torch.zeros((rows, width - 1), dtype=torch.bool)
    attn[len(examples):, 0] = 1
    for i, e in enumerate(examples):
        ids[i, :len(e.ids)] = torch.tensor(e.ids, dtype=torch.long)
        attn[i, :len(e.ids)] = 1
        target[i, e.start - 1:len(e.ids) - 1] = True
    return ids, attn, target


def passes(examples: Sequence[Example], rows: np.ndarray, clipping: str,
           micro_batch: int) -> list[tuple[int | None, np.ndarray]]:
    """``(width, rows)`` of each forward and backward pass over ``rows`` (indices into
    ``examples``): one record a pass on ``loop``; on ``hooks`` the fixed-shape passes of
    :func:`dpsynth.fixed_shape.fixed_shape_passes` (width from each record's own length,
    ``micro_batch`` rows); on ``ghost`` ``micro_batch`` records in order, padded to their
    longest (width None)."""
    rows = np.asarray(rows, dtype=np.int64)
    if clipping == "loop":
        return [(None, rows[i:i + 1]) for i in range(len(rows))]
    if clipping == "hooks":
        lengths = [len(examples[int(i)].ids) for i in rows]
        return [(w, rows[idx]) for w, idx in fixed_shape_passes(lengths, micro_batch,
                                                                _NO_WIDTH_CAP)]
    return [(None, rows[lo:lo + micro_batch]) for lo in range(0, len(rows), micro_batch)]


def per_sample_loss(model: Any, ids: Any, attn: Any, target: Any, keep: int = 0,
                    embeds: Any = None) -> Any:
    """Each record's mean next-token cross-entropy over its own target tokens ([b]).
    ``keep`` > 0: the model's logits at the last ``keep`` positions only (transformers'
    ``logits_to_keep``), for a pass whose targets all lie there (one unpadded record: its
    text after the prompt, :func:`target_positions`); the prompt's positions then cost no
    projection onto the vocabulary. ``embeds``: the pass starts from these states instead of
    ``ids``' embeddings (:mod:`.frozen`: the top layers only); the targets are ``ids``'."""
    import torch

    kept = {"logits_to_keep": keep} if keep > 0 else {}  # asked only where it is used
    # from states: no cache (its layers would be counted from the cut decoder's config)
    given = ({"input_ids": ids} if embeds is None
             else {"inputs_embeds": embeds, "use_cache": False})
    logits = model(**given, attention_mask=attn, **kept).logits
    first = ids.shape[1] - logits.shape[1]  # the position of the first logit kept
    if first > 0 and bool(target[:, :first].any()):
        raise ValueError("a target lies before the logits kept")
    logits = logits[:, :-1, :]
    tok = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), ids[:, first + 1:].reshape(-1),
        reduction="none").view(ids.shape[0], -1)
    mask = target[:, first:].to(tok.dtype)
    return (tok * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


def target_positions(example: Example) -> int:
    """The last positions of an unpadded example whose logits its loss needs: from the one
    that predicts its first target token to its end."""
    return len(example.ids) - example.start + 1


def hooks_keep(width: int, first_target: int) -> int:
    """The logits a fixed-shape pass of ``width`` keeps: from the position that predicts the
    earliest possible target token (``first_target``, public) to the end; 0 (all of them)
    where that is every position. A function of the pass's width and a public value only, so
    a record's logits are computed at the same shape whatever records share its pass."""
    keep = width - first_target + 1
    return keep if keep < width else 0


def torch_grad(value: Any, params: Sequence[Any]) -> list[Any]:
    """d value / d params (None for a parameter it does not reach), leaving ``.grad`` alone."""
    import torch

    return list(torch.autograd.grad(value, list(params), allow_unused=True))


def equal(a: Any, b: Any) -> bool:
    """Bit-for-bit equality of two tensors (or both None)."""
    import torch

    return (a is None and b is None) or (a is not None and b is not None
                                         and torch.equal(a.detach(), b.detach()))


def to_grid(x: Any) -> Any:
    """x truncated towards zero onto the 2^-32 grid, as int64 multiples (|x| <= C)."""
    import torch

    return torch.trunc(x.double() * float(2**GRID_BITS)).to(torch.int64)


def gaussian(source: Any, size: int, secure: bool) -> np.ndarray:
    """N(0, 1) draws from a noise source; ``secure``: each the sum of 4 draws divided by 2
    (Holohan & Braghin 2021, section 5.1, n = 2; what Opacus's secure_mode does)."""
    if not secure:
        return np.asarray(source.normal(size), dtype=np.float64)
    z = np.asarray(source.normal((4, size)), dtype=np.float64)
    return z.sum(axis=0) / 2.0


@dataclass
class StepSettings:
    """What one DP-SGD run is (all fixed before step 0)."""

    noise_multiplier: float
    q: float
    steps: int
    expected_batch: float
    clip: float
    learning_rate: float
    clipping: str = "loop"
    micro_batch: int = 8
    checkpoint_every: int = 1
    secure: bool = True
    #: the unit sampled and clipped: "record", or "user" (then DPSGD needs ``groups``)
    unit: str = "record"
    max_records_per_user: int | None = None


#: the settings added after the first checkpoints were written, at their values then: an older
#: checkpoint (without them) is one of record-level DP-SGD
_LATER_SETTINGS = {"unit": "record", "max_records_per_user": None}


class DPSGD:
    """The DP-SGD loop over ``examples`` on ``model`` (its trainable parameters: the adapter),
    checkpointed in ``folder``; ``noise_for(key)`` is the session's keyed noise stream.
    ``groups`` (user level only): the indices into ``examples`` of each user's records, users
    in a fixed order (the units the coins and :meth:`clipped_sum` index). ``first_target``:
    the earliest ``start`` any record can have, a public value (the shortest label prompt):
    a ``hooks`` pass projects onto the vocabulary only from the position before it on
    (:func:`hooks_keep`). ``freeze_below``: on the loop path, each record's state below the
    adapted layers is computed once and the top layers run from it (:mod:`.frozen`), where
    that reproduces the full pass bit for bit (False: the full pass every time), the states
    kept up to ``state_bytes`` over all processes. ``workers``: processes computing the loop
    path's passes (:mod:`.workers`; each pass on one thread, the sum the same whatever their
    number). ``folder`` and ``noise_for`` None: a trainer that only sums (a pass worker's)."""

    def __init__(self, model: Any, examples: Sequence[Example], settings: StepSettings,
                 folder: Path | None, noise_for: Callable[[str], Any] | None, pad_id: int,
                 on_step: Callable[[int, dict[str, Any]], None] | None = None,
                 on_checkpoint: Callable[[str], None] | None = None,
                 groups: Sequence[Sequence[int]] | None = None, first_target: int = 1,
                 freeze_below: bool = True, workers: int = 1,
                 state_bytes: int = CACHE_BYTES) -> None:
        import torch

        if settings.unit not in ("record", "user"):
            raise ValueError(f"unit must be 'record' or 'user', got {settings.unit!r}")
        if (settings.unit == "user") != (groups is not None):
            raise ValueError("user-level DP-SGD needs the users' record groups, and only it")
        if settings.unit == "user" and settings.clipping != "loop":
            raise ValueError(f"user-level DP-SGD clips each user's gradient on the 'loop' path "
                             f"only, not {settings.clipping!r}")
        self.model = model
        self.examples = list(examples)
        self.groups = None if groups is None else [tuple(int(i) for i in g) for g in groups]
        if self.groups is not None:
            cap = settings.max_records_per_user
            if any(not g or (cap is not None and len(g) > cap) for g in self.groups):
                raise ValueError("every user's group needs 1 to max_records_per_user records")
        if first_target < 1 or any(e.start < first_target for e in self.examples):
            raise ValueError("first_target must be at most every example's start")
        self.first_target = int(first_target)
        self.s = settings
        if workers < 1 or (workers > 1 and settings.clipping != "loop"):
            raise ValueError("workers > 1 run the loop path's passes only")
        self.folder = Path(folder) if folder is not None else None
        self.noise_for = noise_for
        self.pad_id = int(pad_id)
        self.on_step = on_step
        self.on_checkpoint = on_checkpoint
        self.params = trainable(model)
        self.optimizer = torch.optim.AdamW([p for _, p in self.params], lr=settings.learning_rate)
        self.step = 0
        self._engine: Any = None
        self.freeze_below = freeze_below
        self._frozen: FrozenBelow | None = None
        self._frozen_decided = False
        self.workers = int(workers)
        self.state_bytes = int(state_bytes) // self.workers  # each process's share
        self._pool: PassWorkers | None = None

    # -- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoint_path(self) -> Path:
        if self.folder is None:
            raise RuntimeError("a trainer without a folder (a pass worker) keeps no checkpoint")
        return self.folder / CHECKPOINT

    def save(self) -> None:
        """Adapter, optimizer state and the next step, written atomically (mode 0600)."""
        import torch

        folder = self.checkpoint_path.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = folder / f".{CHECKPOINT}.tmp-{os.getpid()}"
        state = {"step": self.step,
                 "adapter": {n: p.detach().clone() for n, p in self.params},
                 "optimizer": self.optimizer.state_dict(),
                 "settings": self.s.__dict__}
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.checkpoint_path)

    def load(self) -> bool:
        """Continue from the last checkpoint (False: none). A checkpoint of other settings is
        refused (the run's locked config cannot change on resume)."""
        import torch

        if not self.checkpoint_path.is_file():
            return False
        state = torch.load(self.checkpoint_path, weights_only=True)
        if {**_LATER_SETTINGS, **state["settings"]} != self.s.__dict__:
            raise RuntimeError(f"{self.checkpoint_path}: written with other DP-SGD settings")
        with torch.no_grad():
            for n, p in self.params:
                p.copy_(state["adapter"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step = int(state["step"])
        return True

    # -- one step ----------------------------------------------------------------------------
    @property
    def units(self) -> int:
        """How many units the coins are drawn for: records, or users at user level."""
        return len(self.examples) if self.groups is None else len(self.groups)

    def _stream(self, key: str) -> Any:
        if self.noise_for is None:
            raise RuntimeError("a trainer without a noise source (a pass worker) draws nothing")
        return self.noise_for(key)

    def batch(self, t: int) -> np.ndarray:
        """Step t's Poisson batch: unit i (record, or user) with probability q (its own
        coin)."""
        coins = self._stream(f"dp_sgd/step{t}/poisson").uniform(self.units)
        return np.flatnonzero(np.asarray(coins) < self.s.q)

    def _ensure_engine(self) -> Any:
        if self._engine is not None or self.s.clipping == "loop":
            return self._engine
        if self.s.clipping == "hooks":
            from opacus.grad_sample import GradSampleModule

            self._engine = GradSampleModule(self.model, batch_first=True, loss_reduction="sum",
                                            strict=False)
        else:
            from opacus.grad_sample.grad_sample_module_fast_gradient_clipping import (
                GradSampleModuleFastGradientClipping,
            )

            self._engine = GradSampleModuleFastGradientClipping(
                self.model, batch_first=True, loss_reduction="sum", strict=False,
                max_grad_norm=self.s.clip, use_ghost_clipping=True)
        return self._engine

    def close(self) -> None:
        """Take Opacus's hooks off the model (hooks / ghost), so that another trainer or a
        plain forward pass can use it, and stop the pass workers; a later
        :meth:`clipped_sum` puts either back."""
        if self._engine is not None:
            self._engine.cleanup()
            self._engine = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def set_adapter(self, values: Sequence[Any]) -> None:
        """The adapter's parameters set to ``values`` (arrays, in :func:`trainable` order)."""
        import torch

        with torch.no_grad():
            for (_, p), v in zip(self.params, values, strict=True):
                p.copy_(torch.as_tensor(v))

    def clipped_sum(self, rows: np.ndarray) -> tuple[list[Any], float]:
        """The exact fixed-point sum of the clipped per-sample gradients of ``rows`` (one int64
        tensor per parameter) and the summed loss (private: for the private log only). At
        user level ``rows`` are users and each is clipped as one (:meth:`_user_sum`). On the
        loop path each record's pass runs on one thread, split between this process and the
        pass workers when ``workers`` > 1 (:mod:`.workers`: the same sum, bit for bit)."""
        if self.s.clipping != "loop":
            return self._batched_sum(rows)
        pool = self.start_workers()
        if pool is None:
            return self._one_thread_sum(rows)
        adapter = [p.detach().numpy().copy() for _, p in self.params]
        try:
            return pool.clipped_sum(rows, adapter, self._one_thread_sum,
                                    cost=[self._tokens(int(u)) for u in rows])
        except BaseException:  # a reply may be left in a pipe: no later step may read it
            self.close()
            raise

    def start_workers(self) -> PassWorkers | None:
        """The pass workers, started (and each up) if they are not yet; None with one
        worker. The method starts them before any budget is charged: a worker that cannot
        start fails the run before it spends anything."""
        if self.workers > 1 and self._pool is None:
            self._pool = PassWorkers(PassSpec(
                type(self), self.model, self.examples, self.s, self.pad_id, self.groups,
                self.first_target, self.freeze_below, self.state_bytes), self.workers)
        return self._pool

    def _tokens(self, unit: int) -> int:
        """A unit's tokens (a record's, or at user level its records'): its passes' cost."""
        if self.groups is None:
            return len(self.examples[unit].ids)
        return sum(len(self.examples[i].ids) for i in self.groups[unit])

    def _one_thread_sum(self, rows: np.ndarray) -> tuple[list[Any], float]:
        """:meth:`clipped_sum` of the loop path in this process, each pass on one thread."""
        with torch_threads(1):
            if self.groups is not None:
                return self._user_sum(rows)
            return self._record_sum(rows)

    def _record_sum(self, rows: np.ndarray) -> tuple[list[Any], float]:
        """The loop path's clipped sum: one record, unpadded, a forward and backward pass."""
        import torch

        sums = [torch.zeros(p.shape, dtype=torch.int64) for _, p in self.params]
        total = 0.0
        for i in np.asarray(rows, dtype=np.int64):
            grads, loss = self._record_grads(int(i))
            for acc, c in zip(sums, self._clip([g.unsqueeze(0) for g in grads]), strict=True):
                acc += to_grid(c).sum(dim=0)
            total += loss
        for _, p in self.params:
            p.grad = None
        return sums, total

    def _record_grads(self, index: int) -> tuple[list[Any], float]:
        """Record ``index``'s gradient of the adapter (one tensor per parameter) and its loss,
        from a forward and backward pass of its own, unpadded."""
        ex = self.examples[index]
        ids, attn, target = collate([ex], self.pad_id)
        for _, p in self.params:
            p.grad = None
        loss = self._record_loss(index, ids, attn, target, target_positions(ex))
        loss.sum().backward()
        return [p.grad for _, p in self.params], float(loss.detach().sum())

    def _batched_sum(self, rows: np.ndarray) -> tuple[list[Any], float]:
        """The clipped sum on the hooks and ghost paths: Opacus's per-sample gradients or
        norms over micro-batches (:func:`passes`), on the configured threads."""
        import torch

        sums = [torch.zeros(p.shape, dtype=torch.int64) for _, p in self.params]
        total = 0.0
        engine = self._ensure_engine()
        for width, part in passes(self.examples, rows, self.s.clipping, self.s.micro_batch):
            chunk = [self.examples[int(i)] for i in part]
            if width is None:
                ids, attn, target = collate(chunk, self.pad_id)
            else:
                ids, attn, target = fixed_shape_batch(chunk, width, self.s.micro_batch,
                                                      self.pad_id)
            for _, p in self.params:
                p.grad = None
                if hasattr(p, "grad_sample"):
                    p.grad_sample = None
            if self.s.clipping == "hooks":
                loss = per_sample_loss(engine, ids, attn, target,
                                       keep=hooks_keep(int(ids.shape[1]), self.first_target))
                loss.sum().backward()
                clipped = self._clip([p.grad_sample[:len(chunk)] for _, p in self.params])
            else:
                loss = per_sample_loss(engine, ids, attn, target)
                loss.sum().backward(retain_graph=True)
                coef = engine.get_clipping_coef().detach()
                for _, p in self.params:
                    p.grad = None
                engine.disable_hooks()
                try:
                    (coef * loss).sum().backward()
                finally:
                    engine.enable_hooks()
                clipped = [p.grad.unsqueeze(0) for _, p in self.params]
            for acc, c in zip(sums, clipped, strict=True):
                acc += to_grid(c).sum(dim=0)
            total += float(loss.detach()[:len(chunk)].sum())
        for _, p in self.params:
            p.grad = None
            if hasattr(p, "grad_sample"):
                p.grad_sample = None
        return sums, total

    def _user_sum(self, users: np.ndarray) -> tuple[list[Any], float]:
        """The exact fixed-point sum over ``users`` of each user's clipped gradient: the mean
        of the gradients of the user's records (one record per forward and backward pass,
        added in float64 in the user's record order: a function of that user's records
        alone), clipped to C as one vector, truncated onto the grid (the norm stays <= C);
        and the sum of the users' mean losses (private)."""
        import torch

        assert self.groups is not None
        sums = [torch.zeros(p.shape, dtype=torch.int64) for _, p in self.params]
        total = 0.0
        for u in users:
            rows = self.groups[int(u)]
            acc = [torch.zeros(p.shape, dtype=torch.float64) for _, p in self.params]
            loss_sum = 0.0
            for i in rows:
                grads, loss = self._record_grads(i)
                for a, g in zip(acc, grads, strict=True):
                    a += g.double()
                loss_sum += loss
            mean = [(a / float(len(rows))).unsqueeze(0) for a in acc]
            for s, c in zip(sums, self._clip(mean), strict=True):
                s += to_grid(c).sum(dim=0)
            total += loss_sum / len(rows)
        for _, p in self.params:
            p.grad = None
        return sums, total

    @property
    def stores_states(self) -> bool:
        """Whether the passes run the top layers from stored lower-layer states (decided on
        the first pass: :meth:`_frozen_below`)."""
        return self._frozen is not None

    def _frozen_below(self) -> FrozenBelow | None:
        """The stored lower-layer states (:mod:`.frozen`) where the loop path can use them: an
        adapter on the top layers only, and a top-only pass equal bit for bit to the full one
        on the public probe; None otherwise (the full pass). Decided once, from public facts
        only (the model, the adapter's placement, the probe)."""
        if self._frozen_decided:
            return self._frozen
        self._frozen_decided = True
        if not self.freeze_below or self.s.clipping != "loop":
            return None
        first = first_adapted(self.model)
        if first is None:
            return None
        frozen = FrozenBelow(self.model, first, self.state_bytes)
        probe = Example(PROBE_IDS, PROBE_START)
        ids, attn, target = collate([probe], self.pad_id)
        keep = target_positions(probe)
        params = [p for _, p in self.params]
        full = per_sample_loss(self.model, ids, attn, target, keep=keep)
        want = torch_grad(full.sum(), params)
        top = self._top_loss(frozen, frozen.hidden(ids, attn), ids, attn, target, keep)
        got = torch_grad(top.sum(), params)
        if equal(full, top) and all(equal(a, b) for a, b in zip(want, got, strict=True)):
            self._frozen = frozen
        return self._frozen

    def _top_loss(self, frozen: FrozenBelow, state: Any, ids: Any, attn: Any, target: Any,
                  keep: int) -> Any:
        with frozen.top_only():
            return per_sample_loss(self.model, ids, attn, target, keep=keep, embeds=state)

    def _record_loss(self, index: int, ids: Any, attn: Any, target: Any, keep: int) -> Any:
        """One record's loss in a pass of its own: from its stored lower-layer state through
        the top layers where :meth:`_frozen_below` allows, else the full pass."""
        frozen = self._frozen_below()
        if frozen is None:
            return per_sample_loss(self.model, ids, attn, target, keep=keep)
        return self._top_loss(frozen, frozen.state(index, ids, attn), ids, attn, target, keep)

    def _clip(self, grads: list[Any]) -> list[Any]:
        """g_i min(1, C / (||g_i|| + 1e-6)) for each row i of the per-sample gradients."""
        import torch

        flat = torch.stack([g.reshape(g.shape[0], -1).double().norm(dim=1) for g in grads])
        norms = flat.norm(dim=0)
        coef = (self.s.clip / (norms + 1e-6)).clamp(max=1.0)
        return [g.double() * coef.view(-1, *([1] * (g.dim() - 1))) for g in grads]

    def noisy_gradient(self, t: int, sums: list[Any]) -> list[Any]:
        """(sum + N(0, (sigma C)^2 I)) / B with step t's own noise stream."""
        import torch

        source = self._stream(f"dp_sgd/step{t}/noise")
        std = self.s.noise_multiplier * self.s.clip
        out = []
        for (_, p), acc in zip(self.params, sums, strict=True):
            z = gaussian(source, p.numel(), self.s.secure).reshape(tuple(p.shape))
            exact = acc.double() / float(2**GRID_BITS)
            g = (exact + std * torch.from_numpy(z)) / self.s.expected_batch
            out.append(g.to(p.dtype))
        return out

    def run(self, resume: bool = True) -> dict[str, Any]:
        """Train to step T from the last checkpoint; returns public facts (steps, seconds).
        The pass workers and Opacus's hooks are taken down however it ends."""
        resumed = self.load() if resume else False
        start = self.step
        t0 = time.perf_counter()
        self.model.train()
        try:
            while self.step < self.s.steps:
                self._one_step()
        finally:
            self.model.eval()
            self.close()
        return {"steps_run": self.step - start, "seconds": time.perf_counter() - t0,
                "resumed_at": start if resumed else None}

    def _one_step(self) -> None:
        """Step t: its batch, the exact clipped sum, the noise, AdamW; the checkpoint."""
        t = self.step
        rows = self.batch(t)
        sums, loss = self.clipped_sum(rows)
        for (_, p), g in zip(self.params, self.noisy_gradient(t, sums), strict=True):
            p.grad = g
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step = t + 1
        saved = self.step % self.s.checkpoint_every == 0 or self.step == self.s.steps
        if saved:
            self.save()
        if self.on_step is not None:
            self.on_step(self.step, {"batch": int(len(rows)), "loss": loss / max(1, len(rows))})
        if saved and self.on_checkpoint is not None:  # the caller's hook (tests: a kill)
            self.on_checkpoint(f"dp_sgd-{self.step:05d}")


def step_logger(path: Path, epsilon_at: Callable[[int], float]
                ) -> Callable[[int, dict[str, Any]], None]:
    """Append each step's private facts (batch size, loss) and the accountant's epsilon after
    it to ``path`` (private/ only, mode 0600)."""

    def log(step: int, facts: dict[str, Any]) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        row = {"step": step, **facts, "epsilon": epsilon_at(step)}
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")

    return log


def isfinite_settings(s: StepSettings) -> bool:
    """All numeric settings finite (a guard before step 0)."""
    return all(math.isfinite(float(v)) for v in (s.noise_multiplier, s.q, s.expected_batch,
                                                  s.clip, s.learning_rate))
