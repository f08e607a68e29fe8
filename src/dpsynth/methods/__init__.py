"""The PE-family methods, by name. A new method is a module here plus, at most, a new part."""

from __future__ import annotations

from ..config import ConfigError
from .aug_pe import AugPE
from .base import Method
from .secpe import SecPE
from .wasp import Wasp
from .zero_shot import ZeroShot

METHODS: dict[str, type[Method]] = {m.name: m for m in (ZeroShot, AugPE, Wasp, SecPE)}


def get_method(name: str) -> Method:
    """The method called `name`, or a ConfigError listing the known ones."""
    if name == "synrag":
        raise ConfigError("method 'synrag' builds a knowledge base: run `dpsynth rag build "
                          "CONFIG` instead of `dpsynth generate`")
    try:
        return METHODS[name]()
    except KeyError:
        known = ", ".join(sorted(METHODS))
        raise ConfigError(f"unknown method {name!r}: choose one of {known}") from None
