"""docs/architecture.md's module table names every module of the package (issue 47): a module
is covered when the table names it, a package above it, or it among a package's braces
(`dpsynth.evolution.{pool,parts}`); a package is covered when a module in it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "dpsynth"


def table() -> str:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return doc[doc.index("## Modules"):doc.index("## The run lifecycle")]


def modules() -> list[str]:
    names = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def named(module: str, text: str) -> bool:
    """The table names ``module`` or a package above it (plainly or among braces)."""
    parts = module.split(".")
    for i in range(len(parts), 1, -1):
        if f"`{'.'.join(parts[:i])}`" in text:
            return True
        parent, leaf = ".".join(parts[:i - 1]), parts[i - 1]
        for group in re.finditer(r"`" + re.escape(parent) + r"\.\{([^}]*)\}`", text):
            if leaf in [x.strip() for x in group.group(1).split(",")]:
                return True
    return False


def uncovered(names: list[str], text: str) -> list[str]:
    return [m for m in names if m != "dpsynth" and not named(m, text)
            and not any(n.startswith(m + ".") and named(n, text) for n in names)]


def test_the_module_table_names_every_module() -> None:
    missing = uncovered(modules(), table())
    assert missing == [], f"docs/architecture.md's module table lacks: {', '.join(missing)}"


def test_the_check_can_fail() -> None:
    text = "| `dpsynth.a` | x |\n| `dpsynth.b.{c,d}` | y |"
    assert uncovered(["dpsynth.a.x", "dpsynth.b.c", "dpsynth.b", "dpsynth.e"], text) == [
        "dpsynth.e"]
