"""The registry of methods: a method is one module (or package) plus one line here.

Each entry names a :class:`~dpsynth.methods.base.Method` subclass; the class declares what it
releases and, when it has its own config section (named after the method), that section's
model, which the run config validates through :func:`section_model`
(docs/adding-a-method.md). This module imports no method and nothing of the config: a method
loads on first use, so its heavy dependencies load only for runs (or sections) of that
method.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from ..errors import ConfigError

#: method name -> "module:Class" (imported on first use)
REGISTRY: dict[str, str] = {
    "zero_shot": "dpsynth.methods.zero_shot:ZeroShot",
    "aug_pe": "dpsynth.methods.aug_pe:AugPE",
    "wasp": "dpsynth.methods.wasp:Wasp",
    "secpe": "dpsynth.methods.secpe:SecPE",
    "synrag": "dpsynth.methods.synrag.method:SynRAG",
    "dp_finetune": "dpsynth.methods.dpfinetune.method:DPFineTune",
}

#: old spellings accepted on read (run folders written before the rename)
ALIASES: dict[str, str] = {"dp_synrag": "synrag"}


def canonical_name(name: str, *, warn: bool = True) -> str:
    """The registered spelling of a method name; an old spelling is accepted (with a
    DeprecationWarning unless ``warn`` is False)."""
    if name in ALIASES:
        new = ALIASES[name]
        if warn:
            warnings.warn(f"method name {name!r} is deprecated: it is now {new!r}",
                          DeprecationWarning, stacklevel=2)
        return new
    return name


def method_class(name: str) -> Any:
    """The :class:`~dpsynth.methods.base.Method` subclass registered as ``name``, or a
    ConfigError listing the known ones."""
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
    if cls.section not in (None, name):
        raise ConfigError(f"method {name!r} declares the section {cls.section!r}: a "
                          "registered method's own section is named after it")
    return cls


def section_model(key: str) -> Any:
    """The config model of the section ``key`` of a run config: that of the registered method
    named ``key`` (None: no such method, or a method without a section)."""
    if key not in REGISTRY:
        return None
    cls = method_class(key)
    return cls.config_model if cls.section == key else None


def get_method(name: str, releases: str | None = None) -> Any:
    """A fresh instance of the method called ``name``; with ``releases`` ("text" or
    "knowledge_base") a method that releases something else is refused with the command that
    runs it."""
    cls = method_class(name)
    if releases is not None and cls.releases != releases:
        command = "dpsynth rag build" if cls.releases == "knowledge_base" else "dpsynth generate"
        raise ConfigError(f"method {cls.name!r} releases a "
                          f"{cls.releases.replace('_', ' ')}: run `{command} CONFIG` instead")
    return cls()


def required_extras(config: Any) -> list[tuple[str, str, str]]:
    """The optional dependencies the run's method needs for ``config``: (module, extra, what
    needs it), from the method's own :meth:`~dpsynth.methods.base.Method.extras`."""
    return list(method_class(config.method).extras(config))


__all__ = ["ALIASES", "REGISTRY", "canonical_name", "get_method", "method_class",
           "required_extras", "section_model"]
