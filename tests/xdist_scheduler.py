"""The suite's pytest-xdist scheduler: every test of a module that uses the shared Ray cluster
goes to one worker (one cluster per session, not one per worker); every test of a module with
a module-scoped fixture goes to one worker (the fixture, often a whole run on the real models,
is built once, not once per worker); every other test is a work unit of its own. xdist queues
the units largest first (``--loadscope-reorder``, its default), so the long ones start early.

It is xdist's ``LoadScopeScheduling`` with three mends for a worker that crashes (a segfault, or
a test that kills its process), each a known xdist bug that otherwise hangs the whole run
(seen in CI: a worker crashed at a third of the suite and the run hung until CI's limit):

- the crashed worker's finished units went back on the queue as empty ones, which no worker
  ever reports done, so the run waits on them forever (xdist issue 1378);
- the test the worker died on was queued again, to crash its replacement too (xdist PR 1371);
- a replacement worker was given one unit of one test, and a worker runs a test only once it
  holds the next one (to know which fixtures to tear down), so it waited (xdist issue 1327).

It also queues a crashed test once more when pytest-rerunfailures asks (``mark_test_pending``).
``make test`` (what CI runs) reruns a test whose worker crashed, once: a native crash in a
library took a worker down once in CI and never here. It never reruns a test that failed
(``--rerun-except`` matches every error). The rerun is reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

RAY_SCOPE = "ray-cluster"


def ray_modules(tests: Path) -> set[str]:
    """The test modules that use the shared Ray cluster fixture."""
    return {p.name for p in tests.glob("test_*.py")
            if "ray_cluster" in p.read_text(encoding="utf-8")}


def module_fixture_modules(tests: Path) -> set[str]:
    """The test modules that define a module-scoped fixture."""
    return {p.name for p in tests.glob("test_*.py")
            if 'scope="module"' in p.read_text(encoding="utf-8")}


class RayModulesTogether(LoadScopeScheduling):
    """One scope for every Ray-cluster module (``together``), one per module for ``whole``,
    one per test elsewhere; survives a crash."""

    def __init__(self, config: Any, log: Any = None, *, together: set[str],
                 whole: frozenset[str] | set[str] = frozenset()) -> None:
        super().__init__(config, log)
        self.together = together
        self.whole = whole - together

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        module = path.rsplit("/", 1)[-1]
        if module in self.together:
            return RAY_SCOPE
        return path if module in self.whole else nodeid

    def remove_node(self, node: Any) -> str | None:
        """Forget a worker that finished or crashed; requeue only the tests it left unrun,
        never the one it crashed on (that one is reported failed by xdist)."""
        workload = self.assigned_work.pop(node)
        unrun = [nodeid for unit in workload.values() for nodeid, done in unit.items()
                 if not done]
        if not unrun:
            return None
        crashed = unrun[0]  # a worker runs its units' tests in the order they were sent
        self.registered_collections.pop(node, None)  # its replacement registers its own
        for scope, unit in workload.items():
            left = {nodeid: False for nodeid, done in unit.items()
                    if not done and nodeid != crashed}
            if left:
                self.workqueue[scope] = left
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def mark_test_pending(self, item: str) -> None:
        """Queue a test its worker crashed on once more, first in line (pytest-rerunfailures
        calls this for a crash; xdist's scope scheduler could not)."""
        scope = self._split_scope(item)
        self.workqueue.setdefault(scope, {})[item] = False
        self.workqueue.move_to_end(scope, last=False)
        for node in self.assigned_work:
            self._reschedule(node)

    def _reschedule(self, node: Any) -> None:
        """xdist's rule, then units until the worker holds at least two tests (a unit here is
        often one test; a worker holding one test waits for a second before it runs it). A
        replacement worker still collecting is scheduled once it has collected."""
        if node not in self.registered_collections:
            return
        super()._reschedule(node)
        while (not node.shutting_down and self.workqueue
               and self._pending_of(self.assigned_work[node]) < 2):
            self._assign_work_unit(node)
