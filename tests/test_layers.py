"""The floors of docs/architecture.md hold (issue 47): every room (a top-level module or
subpackage of dpsynth; a subpackage of ``methods`` is a room of its own) is on exactly one
floor of the doc's table, no import runs up a floor but the two the doc names, and the rooms'
import graph has no cycle once those two are set aside. Every import counts: at the top,
inside a function, under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
import re
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from test_imports_at_top import _targets, package_modules

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
#: the arrows up a floor the doc names, and why they stay (docs/architecture.md, "Floors")
NAMED_UP = {
    ("dpsynth.config", "dpsynth.methods"),  # the lazy registry validates a method's section
    ("dpsynth.on_shards", "dpsynth.compute"),  # a type name only (TYPE_CHECKING)
}


def floors(doc: str) -> dict[str, int]:
    """room -> floor, read from the table of the doc's "Floors" section."""
    section = doc[doc.index("## Floors"):doc.index("## Seams")]
    found: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        for room in re.findall(r"`(dpsynth(?:\.[\w.]+)?)`", cells[2]):
            assert room not in found, f"{room} is on two floors"
            found[room] = int(cells[0])
    return found


def room_of(module: str, modules: dict[str, tuple[Path, bool]]) -> str:
    """The room a module stands in: ``dpsynth.X`` for a top-level module or subpackage, and
    ``dpsynth.methods.X`` for a method's own subpackage."""
    parts = module.split(".")
    if len(parts) >= 3 and parts[1] == "methods" and modules.get(".".join(parts[:3]),
                                                                  (None, False))[1]:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def room_arrows(src: Path | None = None) -> set[tuple[str, str]]:
    """(importing room, imported room) for every import between two rooms of the package."""
    modules = package_modules(src) if src is not None else package_modules()
    arrows: set[tuple[str, str]] = set()
    for module, (path, is_pkg) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, is_pkg, modules):
                    while target not in modules and "." in target:
                        target = target.rsplit(".", 1)[0]
                    a, b = room_of(module, modules), room_of(target, modules)
                    if target in modules and a != b:
                        arrows.add((a, b))
    return arrows


def violations(arrows: set[tuple[str, str]], floor: dict[str, int],
               named: set[tuple[str, str]]) -> list[str]:
    """What breaks the floors: rooms off the table, arrows up a floor that are not named,
    named arrows that no longer exist, and cycles among the other arrows."""
    rooms = {r for arrow in arrows for r in arrow}
    found = [f"{r} is on no floor" for r in sorted(rooms - set(floor))]
    found += [f"{a} (floor {floor[a]}) imports {b} (floor {floor[b]})"
              for a, b in sorted(arrows - named)
              if a in floor and b in floor and floor[b] > floor[a]]
    found += [f"the named arrow {a} -> {b} is gone: drop it from the doc and the test"
              for a, b in sorted(named - arrows)]
    graph: dict[str, set[str]] = {}
    for a, b in arrows - named:
        graph.setdefault(a, set()).add(b)
    try:
        TopologicalSorter(graph).prepare()
    except CycleError as err:
        found.append(f"cycle: {' -> '.join(err.args[1])}")
    return found


def test_the_floors_hold() -> None:
    floor = floors(DOC.read_text(encoding="utf-8"))
    assert len(NAMED_UP) <= 2
    assert violations(room_arrows(), floor, NAMED_UP) == []


def test_every_room_of_the_table_exists() -> None:
    modules = package_modules()
    rooms = {room_of(m, modules) for m in modules}
    assert set(floors(DOC.read_text(encoding="utf-8"))) == rooms


def test_the_check_can_fail() -> None:
    floor = {"dpsynth.a": 0, "dpsynth.b": 1, "dpsynth.c": 1}
    assert violations({("dpsynth.b", "dpsynth.a")}, floor, set()) == []
    assert violations({("dpsynth.a", "dpsynth.b")}, floor, set()) == [
        "dpsynth.a (floor 0) imports dpsynth.b (floor 1)"]
    cycle = violations({("dpsynth.b", "dpsynth.c"), ("dpsynth.c", "dpsynth.b")}, floor, set())
    assert len(cycle) == 1 and cycle[0].startswith("cycle:")
    assert violations({("dpsynth.d", "dpsynth.a")}, floor, set()) == ["dpsynth.d is on no floor"]
    assert violations(set(), floor, {("dpsynth.a", "dpsynth.b")})[0].startswith("the named")
