"""Names a package exports but imports only on first use (PEP 562), so that a process that
needs one light submodule (a Ray worker importing ``dpsynth.privacy.noise``) does not load
the heavy ones (dp_accounting, with scipy.signal and scipy.stats)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, where: dict[str, str]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``; ``where`` maps each exported name to the
    submodule (relative to the package) that defines it, imported the first time the name is
    asked for and then kept in the package's namespace."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
