"""dpsynth's error hierarchy: every error the toolkit raises on purpose is a DpsynthError, so
the CLI catches them by class and prints one clear line (no traceback, no private text).

    DpsynthError
    ├── ConfigError          a config file, option or --set value that cannot be used
    ├── InputError           input files (private data, secrets, vocabularies) that cannot be used
    ├── PrivacyError         a privacy refusal: budget, ledger, store, accounting
    ├── GenerationError      an LLM backend that did not answer usefully
    ├── ComputeError         the compute engine (Ray) or a federated round could not finish
    ├── OutputFolderError    an --output folder that cannot take the run (also FileExistsError)
    ├── MissingFileError     a file the command needs is absent (also FileNotFoundError)
    └── MissingExtraError    an optional dependency group is not installed (also ImportError)

The last three keep their built-in base so existing ``except OSError/ImportError`` still work
(Python cannot mix those bases with ``ValueError``, hence siblings of ConfigError/InputError).
"""

from __future__ import annotations

import importlib
from types import ModuleType


class DpsynthError(Exception):
    """Base of every error dpsynth raises on purpose (the CLI catches this class).

    ``hint``: an optional next step the CLI prints under the error line (e.g. how to resume a
    run that stopped after its work began)."""

    hint: str | None = None


class ConfigError(DpsynthError, ValueError):
    """A config value that cannot be used; the message names the field."""


class InputError(DpsynthError, ValueError):
    """An input file that cannot be used; the message names the file, row or field."""


class PrivacyError(DpsynthError):
    """A privacy refusal (budget, ledger, release store, accounting)."""


class GenerationError(DpsynthError, RuntimeError):
    """An LLM backend that did not answer usefully.

    The message never holds prompt or output text (prompts may hold private records); it names
    the backend, the cause (e.g. an HTTP status) and how many of ``total`` requests completed.
    """

    def __init__(self, message: str, *, completed: int = 0, total: int = 0,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.completed = completed
        self.total = total
        self.status = status


class ComputeError(DpsynthError, RuntimeError):
    """The compute engine or a federated round could not finish."""


class OutputFolderError(DpsynthError, FileExistsError):
    """The output folder holds something else (or already a run): choose another one."""


class MissingFileError(DpsynthError, FileNotFoundError):
    """A file the command needs (run.json, kb.jsonl, a model file) is absent."""


class MissingExtraError(DpsynthError, ImportError):
    """An optional dependency group (extra) is not installed; the message says which."""


def require(module: str, extra: str, what: str | None = None) -> ModuleType:
    """Import ``module`` from the optional extra ``extra``, or raise :class:`MissingExtraError`
    telling the user to ``pip install 'dpsynth[extra]'``. ``what``: the feature that needs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtraError(
            f"{what or 'this feature'} needs the Python package {module.split('.')[0]!r}, which "
            f"is not installed: pip install 'dpsynth[{extra}]'") from err
