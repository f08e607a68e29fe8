"""A trace of one run through the package's floors (issue 47: "the path from the CLI to the
release visits each layer once").

Runs a `dpsynth` command in this process under a profiler that records every call into a
function of the package: the room of the caller (the nearest package frame below it) and the
room of the callee, each placed on its floor by docs/architecture.md ("Floors"). It reports
the rooms visited, the stays (maximal runs of calls in one room), the returns to a room left
earlier, and every *climb*: a call from a room to a room on a higher floor (a callback, such
as the engine running a shard kernel a method hands it). A module's body running is an
import, not a call: imports are tests/test_layers.py's to check (every one, at the top, in
functions and under TYPE_CHECKING), so the trace leaves them out.

    python benchmarks/run_trace.py generate examples/tiny-aug-pe.yaml --set privacy.seed=7
    python benchmarks/run_trace.py --out benchmarks/results/run_trace.md generate ...
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_imports_at_top import package_modules  # noqa: E402  (tests/ holds the floor reader)
from test_layers import DOC, floors, room_of  # noqa: E402


class Trace:
    """Calls between rooms, in order, as the profiler sees them."""

    def __init__(self) -> None:
        self.modules = package_modules()
        self.floor = floors(DOC.read_text(encoding="utf-8"))
        self.calls: list[tuple[str, str, str, str]] = []  # (caller room, callee room, fns)
        self.path: list[str] = []  # the room execution is in, each change of room once
        self._rooms: dict[str, str] = {}

    def room(self, module: str) -> str | None:
        if not module.startswith("dpsynth"):
            return None
        if module not in self._rooms:
            self._rooms[module] = room_of(module, self.modules)
        return self._rooms[module]

    def _below(self, frame: Any) -> tuple[str | None, Any]:
        """The room of the nearest package frame below ``frame`` (None: the entry), and it."""
        back = frame.f_back
        while back is not None:
            room = self.room(back.f_globals.get("__name__", ""))
            if room is not None:
                return room, back
            back = back.f_back
        return None, None

    def _enter(self, room: str | None) -> None:
        if room is not None and (not self.path or self.path[-1] != room):
            self.path.append(room)

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        here = self.room(frame.f_globals.get("__name__", ""))
        if here is None:
            return
        caller, back = self._below(frame)
        if event == "return":  # execution goes back to the caller's room
            self._enter(caller)
            return
        self._enter(here)
        if frame.f_code.co_name == "<module>":  # a module's body runs: an import, not a call
            return
        if caller is not None and caller != here:
            self.calls.append((caller, here, back.f_code.co_qualname, frame.f_code.co_qualname))

    def summary(self) -> dict[str, Any]:
        """Rooms, stays, returns and climbs of the recorded calls."""
        returns = len(self.path) - len(set(self.path))
        climbs: dict[tuple[str, str], collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        for caller, callee, fn_from, fn_to in self.calls:
            if self.floor[callee] > self.floor[caller]:
                climbs[(caller, callee)][f"{fn_from} -> {fn_to}"] += 1
        rooms = set(self.path)
        return {"rooms": len(rooms), "stays": len(self.path), "returns": returns,
                "climbs": climbs, "floors": sorted({self.floor[r] for r in rooms})}


def markdown(command: list[str], result: dict[str, Any], floor: dict[str, int]) -> str:
    lines = [f"Trace of `dpsynth {' '.join(command)}` (benchmarks/run_trace.py)", "",
             f"- rooms visited: {result['rooms']} on floors {result['floors']}",
             f"- stays: {result['stays']}; returns to a room left earlier: {result['returns']}",
             f"- climbs (calls up a floor, by room pair): {len(result['climbs'])}", "",
             "| caller room (floor) | callee room (floor) | calls | the functions |",
             "|---|---|---|---|"]
    for (a, b), fns in sorted(result["climbs"].items()):
        top = "; ".join(f"`{f}` x{n}" for f, n in fns.most_common(3))
        lines.append(f"| `{a}` ({floor[a]}) | `{b}` ({floor[b]}) | {sum(fns.values())} | {top} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="write the table here (markdown)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="a dpsynth command line")
    args = ap.parse_args()
    command = list(args.command)
    if "-o" not in command and "--output" not in command:
        command += ["-o", str(Path(tempfile.mkdtemp(prefix="dpsynth-trace-")) / "run")]
    from dpsynth.cli import app

    trace = Trace()
    threading.setprofile(trace)
    sys.setprofile(trace)
    try:
        app(command, standalone_mode=False)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    text = markdown(args.command, trace.summary(), trace.floor)
    print(text)
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
