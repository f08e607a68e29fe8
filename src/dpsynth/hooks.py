"""What a caller plugs into a run without changing what it computes or releases.

A :class:`RunHooks` is passed to the runner (``run_method(..., hooks=...)``) and reaches the
places it names: the tests inject faults and stops through it (tests/faults.py), so no test
hook lives in the code a run executes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RunHooks:
    """Extension points of one run.

    ``shard_actor``: the class of the Ray shard actors (a subclass of
    :class:`dpsynth.compute.ray_engine.ShardActor`; None: that class). ``on_checkpoint``:
    called with a checkpoint's name (``loop``, ``cluster-0003``) each time the run has saved
    one (:meth:`dpsynth.run_folder.RunDir.save_checkpoint`); raising there (e.g.
    KeyboardInterrupt) stops the run as a kill would, after that checkpoint."""

    shard_actor: type[Any] | None = None
    on_checkpoint: Callable[[str], None] | None = None
    #: trains a generator on preference pairs in place of trl's DPO (synthesis.preference;
    #: dpsynth.evolution.preference.Trainer): a test records what the trainer is shown
    preference_trainer: Callable[..., None] | None = None
