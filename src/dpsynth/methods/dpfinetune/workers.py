"""The loop path's per-record passes in several processes at once, one thread each.

A loop pass is one record of some 30-120 tokens: products that small keep a second thread of
the same pass mostly waiting (on 2 cores, 0.54 wall s a record on two threads against 0.59
on one), where a second process running other records on its own thread nearly halves the
step (benchmarks/results/dp_finetune.md). :class:`PassWorkers` splits a step's units (records,
or users at user level) between this process and ``workers - 1`` spawned ones; each computes
its share's exact fixed-point sum of clipped gradients with :meth:`DPSGD.clipped_sum` on one
thread, and the integer sums are added here. Integer addition is exact and ordered by nothing,
and a record's pass is the same computation on the same weights on one thread wherever it runs,
so the step's sum is the same bit for bit whatever the number of workers or the split: the
path stays rows-apart, and a run resumed with another ``workers`` continues the same run.

The workers get the model object itself once, its tensors in shared memory (torch's
multiprocessing moves them there: the base weights are not copied), each keeps a copy of its
own of the adapter, and each step gets the adapter's current values with the units to sum. A
worker ends when this process closes the pool or dies (its end of the pipe closes)."""

from __future__ import annotations

import contextlib
import sys
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: a worker's own memory besides its share of the shared weights: the runtime it imports and
#: one record's activations (measured with SmolLM2-135M: ~0.46 GB; benchmarks/results/
#: dp_finetune.md), with room for longer records and larger models (plus half their weights)
WORKER_BYTES = 600 << 20


def default_workers(threads: int, model_bytes: int, available_bytes: int) -> int:
    """The pass workers a run starts unless told: one per thread, as many as half the
    memory available now holds at :data:`WORKER_BYTES` plus half the model's bytes each
    (at least 1: the training process itself)."""
    per_worker = WORKER_BYTES + model_bytes // 2
    return max(1, min(int(threads), int(available_bytes // 2 // per_worker)))


@dataclass(frozen=True)
class PassSpec:
    """What a worker needs to build its own trainer for the loop path: the trainer's class
    (:class:`~.train.DPSGD`, sent by reference), the model (shared tensors), the examples,
    the settings, the pad id, the user groups, the first target, the stored-states switch and
    its share of their memory."""

    trainer: Any
    model: Any
    examples: Sequence[Any]
    settings: Any
    pad_id: int
    groups: Sequence[Sequence[int]] | None
    first_target: int
    freeze_below: bool
    state_bytes: int


def shares(units: np.ndarray, workers: int, cost: Sequence[float] | None = None
           ) -> list[np.ndarray]:
    """``units`` split between ``workers`` so that each share's total ``cost`` (per unit,
    e.g. its tokens; None: 1 each) is close to the others': the costliest unit first, each
    to the share with the least so far (the LPT rule, ties to the lower share). Each share
    keeps its units in their given order. Which process sums a unit changes no bit of the
    sum, so the split is scheduling only."""
    units = np.asarray(units, dtype=np.int64)
    weights = np.ones(len(units)) if cost is None else np.asarray(cost, dtype=np.float64)
    loads = np.zeros(workers)
    owner = np.empty(len(units), dtype=np.int64)
    for j in np.argsort(-weights, kind="stable"):
        k = int(np.argmin(loads))
        owner[j] = k
        loads[k] += weights[j]
    return [units[owner == k] for k in range(workers)]


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """A spawned worker that does not import the caller's main script: multiprocessing runs
    it again in the child (as ``__mp_main__``) from its ``__spec__`` or ``__file__``, so a
    script that calls dpsynth at top level, without ``if __name__ == "__main__"``, would
    start its run again there. The worker needs only dpsynth's own modules."""
    main = sys.modules["__main__"]
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def _serve(conn: Any, spec: PassSpec) -> None:
    """A worker: one thread, its own trainer on the shared model; per message (the adapter's
    values, the units) the exact clipped sum and the summed loss back, until the pipe closes
    or None arrives."""
    import torch

    torch.set_num_threads(1)
    try:
        trainer = spec.trainer(spec.model, spec.examples, spec.settings, folder=None,
                               noise_for=None, pad_id=spec.pad_id, groups=spec.groups,
                               first_target=spec.first_target,
                               freeze_below=spec.freeze_below, state_bytes=spec.state_bytes)
        with torch.no_grad():  # the adapter its own (each message brings the step's values)
            for _, p in trainer.params:
                p.data = p.data.clone()
        spec.model.train()
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", _where(exc), 0.0))
        return
    conn.send(("ready", None, 0.0))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if message is None:
            return
        adapter, units = message
        try:
            trainer.set_adapter(adapter)
            sums, loss = trainer.clipped_sum(units)
            conn.send(("ok", [s.numpy() for s in sums], loss))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises
            conn.send(("error", _where(exc), 0.0))


def _where(exc: BaseException) -> str:
    """An error's type and its last frames, never its message (it could quote a record's
    tokens)."""
    frames = "".join(traceback.format_tb(exc.__traceback__, limit=-3))
    return f"{type(exc).__name__} in\n{frames}"


class PassWorkers:
    """``workers - 1`` spawned processes that, with this one, compute a step's clipped sum
    (:meth:`clipped_sum`); ``local`` computes this process's share (the trainer's own
    one-thread passes)."""

    def __init__(self, spec: PassSpec, workers: int) -> None:
        import torch.multiprocessing as mp

        if workers < 2:
            raise ValueError("PassWorkers needs at least 2 workers (1: no pool)")
        spec.model.share_memory()  # the base weights once, not a copy per worker
        ctx = mp.get_context("spawn")  # no fork of a process with OpenMP threads running
        self.workers = int(workers)
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        try:
            for _ in range(workers - 1):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(there, spec), daemon=True)
                self.conns.append(here)
                with _main_left_out():
                    proc.start()
                there.close()
                self.procs.append(proc)
            self._replies("ready")  # each worker up (model and trainer built) before any step
        except BaseException:
            self.close()
            raise

    def _replies(self, want: str) -> list[tuple[Any, float]]:
        """Each worker's next reply (its payload and loss), after every worker has answered;
        RuntimeError naming the first failure (a worker gone, or its error)."""
        got: list[tuple[Any, float]] = []
        failed = None
        for conn in self.conns:
            try:
                status, payload, loss = conn.recv()
            except (EOFError, OSError):
                failed = failed or "a DP-SGD gradient worker stopped (killed, or out of memory)"
                continue
            if status != want:
                failed = failed or f"a DP-SGD gradient worker failed: {payload}"
                continue
            got.append((payload, float(loss)))
        if failed is not None:
            raise RuntimeError(failed + "; resume the run (--resume) to continue from the "
                               "last checkpoint")
        return got

    def clipped_sum(self, units: np.ndarray, adapter: list[Any], local: Any,
                    cost: Sequence[float] | None = None) -> tuple[list[Any], float]:
        """The exact sum over ``units`` (and the summed loss): split by :func:`shares` on
        each unit's ``cost``, the first share computed here by ``local(share)``, the others
        by the workers, the integer sums added."""
        import torch

        parts = shares(units, self.workers, cost)
        for conn, part in zip(self.conns, parts[1:], strict=True):
            conn.send((adapter, part))
        sums, loss = local(parts[0])
        for got, part_loss in self._replies("ok"):
            for acc, part in zip(sums, got, strict=True):
                acc += torch.from_numpy(part)
            loss += part_loss
        return sums, loss

    def close(self) -> None:
        """Stop the workers (each ends its loop), waiting a little for them."""
        for conn in self.conns:
            with contextlib.suppress(BrokenPipeError, OSError):
                conn.send(None)
            conn.close()
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.conns, self.procs = [], []
