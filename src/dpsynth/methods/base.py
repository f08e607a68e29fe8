"""What a method is (docs/architecture.md, "The run lifecycle"): its name, what it releases,
its own config section, the extras it needs, its privacy plan, its work and its own privacy
statement.

The runner (:mod:`dpsynth.runner`) owns the run's life and calls a method at four points:
``check`` (before anything is written), ``plan`` (after the data is loaded, before the ledger
and the session), ``execute`` (the work; writes the release files) and ``statement``
(release/privacy.json). The PE family shares one base on top of this
(:mod:`dpsynth.methods.pe`).
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from ..config import ConfigError, RunConfig
from ..hooks import RunHooks
from ..run_folder import RunDir

if TYPE_CHECKING:
    from ..data import Dataset
    from ..planning import RunPlan
    from ..privacy import PrivacySession

Guarantee = Literal["dp", "none", "secret-protection", "public"]
#: the model passes over private records a method may make (:attr:`Method.private_passes`):
#: embedding the records, the LLM's keywords of a document, next-token logits of a document,
#: secret (PII) detection in a record, a record's per-sample gradient in DP-SGD (its own forward
#: and backward pass: no batch statistic such as batch normalisation couples records)
PRIVATE_PASSES = ("embed", "keywords", "logits", "secrets", "train")


@dataclass
class PrivacyPlan:
    """What a method will spend, decided before the ledger and the session.

    ``guarantee``: "dp" reserves (epsilon, delta) in the ledger and settles it at the end;
    "none" (epsilon = inf) and "secret-protection" are recorded without an amount; "public"
    reads no private record and records nothing. ``sigma``: the noise multiplier (None while a
    label domain is still to be discovered). ``target``: the session's (epsilon, delta) cap.
    ``ledger``: public details recorded with a non-DP run; ``meta``: extra (public) run.json
    fields; ``notes``: what the method's ``execute`` needs to know from planning; ``votes``:
    a PE run's vote plan (:class:`dpsynth.planning.RunPlan`, the operator's: it holds the exact
    record count), None where the method has none or the label domain is still to be
    discovered."""

    guarantee: Guarantee
    sigma: float | None
    accountant: str
    target: tuple[float, float] | None = None
    ledger: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    votes: RunPlan | None = None


@dataclass
class Job:
    """One attempt of a run as the runner hands it to :meth:`Method.execute`."""

    config: RunConfig
    run: RunDir
    meta: dict[str, Any]
    dataset: Dataset
    session: PrivacySession
    plan: PrivacyPlan
    #: the keyed (HMAC) dataset fingerprint of run.json and the ledger
    fingerprint: str = ""
    resume: bool = False
    progress: bool = True
    generators: Sequence[Any] | None = None
    embedder: Any | None = None
    echo: Callable[[str], None] | None = None
    #: what the caller plugs into the run (tests: fault injection, stops)
    hooks: RunHooks = field(default_factory=RunHooks)
    #: LLM calls paid by this attempt (set by the method once its models exist)
    paid_calls: Callable[[], int] = lambda: 0
    #: closed by the runner when the attempt ends (compute workers and the like)
    cleanup: ExitStack = field(default_factory=ExitStack)
    #: another store of the run's noise (``private/<folder>``, the plan's accountant and noise,
    #: no cap of its own) for releases the method composes itself (DP-SynRAG's per-cluster
    #: releases); the runner supplies it, so a method never reaches back into the runner
    open_store: Callable[[str], PrivacySession] | None = None

    def store(self, folder: str) -> PrivacySession:
        """A session over ``private/<folder>`` (:attr:`open_store`), closed with the attempt."""
        if self.open_store is None:
            raise RuntimeError("this job has no store opener (the runner supplies one)")
        session = self.open_store(folder)
        self.cleanup.callback(session.close)
        return session


@dataclass
class Outcome:
    """What ``execute`` reports: summary.json's method-specific keys (the runner adds the
    method name, and fills epsilon / delta given as None from the statement) and facts for
    the method's own statement."""

    summary: dict[str, Any]
    facts: dict[str, Any] = field(default_factory=dict)
    #: a public one-line result for log.txt
    message: str = ""


M = TypeVar("M", bound=BaseModel)


def read_section(config: RunConfig, section: str, model: type[M]) -> M:
    """The section ``section`` of ``config`` as ``model`` (its defaults when the config has
    none; the run config validated it already through the registry); a section that does not
    validate is a ConfigError naming the field."""
    raw = getattr(config, section, None)
    if isinstance(raw, model):
        return raw
    data = raw.model_dump() if isinstance(raw, BaseModel) else raw
    try:
        return model.model_validate(data or {})
    except ValidationError as err:
        lines = [f"invalid {section} section"]
        for item in err.errors():
            where = ".".join(str(p) for p in item["loc"]) or "(top level)"
            lines.append(f"  {section}.{where}: {item['msg']}")
        raise ConfigError("\n".join(lines)) from None


def check_prompt_fields(config: RunConfig) -> None:
    """prompts.label_template may only name the configured label columns; every
    prompts.label_descriptions entry must describe a declared value of a label column."""
    check_label_descriptions(config)
    fields = {name for _, name, _, _ in string.Formatter().parse(config.prompts.label_template)
              if name}
    unknown = sorted(fields - set(config.data.labels))
    if unknown:
        raise ConfigError(
            f"prompts.label_template names {', '.join(map(repr, unknown))}, which "
            f"{'is' if len(unknown) == 1 else 'are'} not among data.labels "
            f"{config.data.labels}: use only label columns in the template"
        )


def check_label_descriptions(config: RunConfig) -> None:
    """Refuse a description of an unknown column or of a value outside the declared domain
    (a typo would silently leave the code in the prompts), and an empty description."""
    descriptions = config.prompts.descriptions()
    if not descriptions:
        return
    declared = config.data.declared_label_values()
    for col, values in descriptions.items():
        where = f"prompts.label_descriptions.{col}"
        if col not in config.data.labels:
            raise ConfigError(f"{where}: {col!r} is not among data.labels {config.data.labels}")
        for value, text in values.items():
            if not str(text).strip():
                raise ConfigError(f"{where}: the description of {value!r} is empty")
            if col in declared and value not in declared[col]:
                raise ConfigError(f"{where}: {value!r} is not a declared value of {col} "
                                  "(data.label_values)")


class Method(ABC):
    """A registered method (dpsynth.methods.REGISTRY): one instance per run attempt."""

    name: ClassVar[str] = ""
    #: what release/ holds: synthetic text rows, or a knowledge base (kb.jsonl + index)
    releases: ClassVar[Literal["text", "knowledge_base"]] = "text"
    #: the method's own section of the run config (a registered method's is named after it;
    #: None: none) and its pydantic model, which validates the section through the registry
    section: ClassVar[str | None] = None
    config_model: ClassVar[type[BaseModel] | None] = None
    #: False: the method reads per-record fields in this process, so the runner loads the
    #: private file here even with compute.engine ray
    sharded_data: ClassVar[bool] = True
    #: the model passes this method makes over private records, each of :data:`PRIVATE_PASSES`
    #: (None: undeclared). Each must be rows apart, a record's output a function of that record
    #: alone; tests/test_rows_apart.py runs every registered method's passes on the real models
    #: and fails for a method that declares none
    private_passes: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def settings(cls, config: RunConfig) -> Any:
        """The method's section of ``config`` as its config model (:func:`read_section`;
        None for a method without a section)."""
        if cls.section is None or cls.config_model is None:
            return None
        return read_section(config, cls.section, cls.config_model)

    @classmethod
    def extras(cls, config: RunConfig) -> list[tuple[str, str, str]]:
        """The optional dependencies this config of the method needs, as (module, extra,
        what needs it), checked before any budget is spent (``preflight.check_extras``)."""
        return []

    def check(self, config: RunConfig) -> None:
        """Refuse a config that cannot work, before any folder is written."""
        self.settings(config)

    @abstractmethod
    def plan(self, config: RunConfig, dataset: Dataset, run: RunDir) -> PrivacyPlan:
        """Validate against the data (no model loads) and plan the privacy spend."""

    @abstractmethod
    def execute(self, job: Job) -> Outcome:
        """The method's work: every release file except privacy.json and summary.json."""

    @abstractmethod
    def statement(self, job: Job, outcome: Outcome) -> dict[str, Any]:
        """release/privacy.json: the method's own guarantee (schema in the README)."""
