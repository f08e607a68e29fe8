"""The registry of methods: a method is one module (or package) plus one line here.

Each entry names a :class:`~dpsynth.methods.base.Method` subclass; the class declares its
config model and what it releases (docs/adding-a-method.md).
"""

from __future__ import annotations

import importlib
import warnings

from ..config import ConfigError
from .base import Method

#: method name -> "module:Class" (imported on first use, so a method's heavy dependencies
#: load only for runs of that method)
REGISTRY: dict[str, str] = {
    "zero_shot": "dpsynth.methods.zero_shot:ZeroShot",
    "aug_pe": "dpsynth.methods.aug_pe:AugPE",
    "wasp": "dpsynth.methods.wasp:Wasp",
    "secpe": "dpsynth.methods.secpe:SecPE",
    "synrag": "dpsynth.methods.synrag.method:SynRAG",
}

#: old spellings accepted on read (run folders written before the rename)
ALIASES: dict[str, str] = {"dp_synrag": "synrag"}


def canonical_name(name: str) -> str:
    """The registered spelling of a method name; an old spelling is accepted with a
    DeprecationWarning."""
    if name in ALIASES:
        new = ALIASES[name]
        warnings.warn(f"method name {name!r} is deprecated: it is now {new!r}",
                      DeprecationWarning, stacklevel=2)
        return new
    return name


def method_class(name: str) -> type[Method]:
    """The class registered as ``name``, or a ConfigError listing the known ones."""
    name = canonical_name(name)
    try:
        target = REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise ConfigError(f"unknown method {name!r}: choose one of {known}") from None
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if cls.name != name:  # the one spelling: registry key and class name agree
        raise ConfigError(f"registry entry {name!r} names a method called {cls.name!r}")
    return cls


def get_method(name: str, releases: str | None = None) -> Method:
    """A fresh instance of the method called ``name``; with ``releases`` ("text" or
    "knowledge_base") a method that releases something else is refused with the command that
    runs it."""
    cls = method_class(name)
    if releases is not None and cls.releases != releases:
        command = "dpsynth rag build" if cls.releases == "knowledge_base" else "dpsynth generate"
        raise ConfigError(f"method {cls.name!r} releases a "
                          f"{cls.releases.replace('_', ' ')}: run `{command} CONFIG` instead")
    return cls()


__all__ = ["ALIASES", "REGISTRY", "Method", "canonical_name", "get_method", "method_class"]
