"""Fault injection and stops for the tests, passed into a run (:class:`dpsynth.hooks.RunHooks`):
nothing of it lives in the code a run executes.

:class:`StopAt` stops a run after its n-th checkpoint (``RunHooks(on_checkpoint=...)``), as a
kill would: the run's status is ``interrupted`` and ``--resume`` continues it.

:class:`FaultyShardActor` is the production shard actor plus a fault point before every
kernel: a file ``fault-<what>-shard<i>`` in the run's private compute folder makes that shard
die once, mid-call (``os._exit``: Ray restarts it and retries the call); ``hang-<what>-
shard<i>`` makes it stop answering (until the driver kills it). ``<what>`` is the kernel's
name, or ``synrag_<op>`` for DP-SynRAG's document operations. :class:`Arming` (a fake
generator) drops such a file at its first call once the compute folder exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dpsynth.compute.ray_engine import ShardActor
from dpsynth.hooks import RunHooks
from dpsynth.methods.synrag.shard import on_documents
from fakes import FakeGenerator


def _what(kernel: Any, args: tuple[Any, ...]) -> str:
    if kernel is on_documents:
        return f"synrag_{args[0]}"
    return str(getattr(kernel, "__name__", kernel))


class FaultyShardActor(ShardActor):
    """A shard actor that dies (or hangs) once where a fault file says so."""

    def _fault_point(self, what: str) -> None:
        marker = self.cache_dir / f"fault-{what}-shard{self.shard_index}"
        if marker.is_file():
            marker.unlink()
            os._exit(1)
        hang = self.cache_dir / f"hang-{what}-shard{self.shard_index}"
        if hang.is_file():
            hang.unlink()
            time.sleep(3600)

    def run(self, kernel: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        self._fault_point(_what(kernel, args))
        return super().run(kernel, *args, **kwargs)


FAULTS = RunHooks(shard_actor=FaultyShardActor)


class StopAt:
    """A checkpoint hook that raises KeyboardInterrupt once the run has saved its ``n``-th
    checkpoint (counting only those whose name starts with ``prefix``)."""

    def __init__(self, n: int = 1, prefix: str = "") -> None:
        self.n, self.prefix, self.seen = n, prefix, 0

    def __call__(self, name: str) -> None:
        if name.startswith(self.prefix):
            self.seen += 1
            if self.seen == self.n:
                raise KeyboardInterrupt(f"test stop after checkpoint {name} ({self.n})")


def stop_at(n: int = 1, prefix: str = "", *, faults: bool = False) -> RunHooks:
    """Hooks that stop the run after its ``n``-th checkpoint (``prefix``: of those names);
    ``faults``: with the fault-injecting shard actors too."""
    return RunHooks(shard_actor=FaultyShardActor if faults else None,
                    on_checkpoint=StopAt(n, prefix))


class Arming(FakeGenerator):
    """A fake generator that, at its first call once the run's compute folder exists, drops
    the fault file ``marker`` there, once. Pickled with the run, it also arms from a shard
    (DP-SynRAG's keyword extraction)."""

    def __init__(self, name: str, compute: Path, marker: str) -> None:
        super().__init__(name)
        self.compute, self.marker = compute, marker

    def generate(self, requests, **kw):  # type: ignore[no-untyped-def]
        if self.compute.is_dir() and not (self.compute / "armed").exists():
            (self.compute / "armed").write_text("")
            (self.compute / self.marker).write_text("")
        return super().generate(requests, **kw)
