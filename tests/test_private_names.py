"""A ``_``-private name of dpsynth is used only inside the module that defines it (issue 47):
no ``from x import _name`` between modules of the package, and no ``obj._name`` on anything
but ``self`` / ``cls`` unless the module itself defines ``_name`` (another instance of its own
class, e.g. a copy). What a module shares is public and documented."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "dpsynth"


def own_names(tree: ast.Module) -> set[str]:
    """Names a module defines: its functions and classes (at any depth), names bound at
    module or class level, and attributes it sets on ``self`` / ``cls``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))]:
        for stmt in scope.body:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


#: private names a dpsynth class inherits from a library and handles itself
INHERITED = {"_ledger": "dp_accounting's PrivacyAccountant state, copied by Accountant.copy"}
#: a library's own underscored API that dpsynth calls, for want of a public one
LIBRARY = {"_int_mm": "torch's int8 matrix product (the int8 GEMM rate of dpsynth.bench.bounds)"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    own = own_names(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or
                                                 (node.module or "").startswith("dpsynth")):
            out += [f"{path.name}:{node.lineno}: imports {a.name}" for a in node.names
                    if private(a.name)]
        elif isinstance(node, ast.Attribute) and private(node.attr) \
                and node.attr not in own | set(INHERITED) | set(LIBRARY) \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            out.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_private_names_stay_in_their_module() -> None:
    found = [v for p in sorted(SRC.rglob("*.py")) for v in violations(p)]
    assert found == [], "\n".join(found)


def test_the_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from .other import _helper\n\ndef f(gen):\n    return gen._pad(1)\n")
    assert len(violations(bad)) == 2
    good = tmp_path / "good.py"
    good.write_text("class A:\n    def __init__(self):\n        self._x = 1\n\n"
                    "    def copy(self):\n        new = A()\n        new._x = self._x\n"
                    "        return new\n")
    assert violations(good) == []
