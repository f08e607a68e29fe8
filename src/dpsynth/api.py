"""The Python API: the same runner as the CLI, from a notebook (docs/python-api.md).

    import dpsynth
    result = dpsynth.generate("messages.csv", text="text", labels=["department"],
                              label_values={"department": ["billing", "support"]},
                              epsilon=2, output="runs/first",
                              config={"synthesis": {"samples": 60}})
    result.synthetic          # a DataFrame: text and one column per label
    result.privacy            # release/privacy.json as a dict
    result.run_dir            # the run folder (release/, private/, ...)
    dpsynth.load_run("runs/first")                     # the same for a finished run
    dpsynth.evaluate("runs/first", test="test.csv")    # eval/eval.json as a dict
    kb = dpsynth.build_rag("docs.csv", epsilon=10, delta=1e-3, output="runs/kb",
                           config={"synrag": {...}})
    kb.ask("Which disease causes ...?")

``data`` is a path (CSV, JSONL, Parquet; ``"demo"`` the built-in corpus), a pandas DataFrame
or a list of dicts. A DataFrame or list is written, with only the columns the run uses, to
the run's private area (``private/input/records.parquet``, mode 0600), which a resumed run
reads again; its fingerprint is that of the records, so the budget ledger counts it as the
same dataset as the file it came from. Errors name the column, row or setting, never a value.

:func:`run_generation` (a config file or object, as ``dpsynth generate`` takes) is the lower
layer; the run's life (open or resume, data, privacy plan, ledger, session, work, statement,
summary, status) is :func:`dpsynth.runner.run_method`'s.
"""

from __future__ import annotations

import copy
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import ConfigError, RunConfig, parse_config
from .errors import DpsynthError, InputError, MissingFileError
from .hooks import RunHooks
from .run_folder import RunDir
from .runner import RunOptions, open_run, run_method

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["RagResult", "Result", "build_rag", "evaluate", "generate", "load_run",
           "open_run", "report", "run_generation"]

STAGED_INPUT = Path("private") / "input" / "records.parquet"


# -- argument checks: a wrong type is a TypeError naming the argument, at the call ----------


def _type_name(value: Any) -> str:
    return "a string" if isinstance(value, str) else f"a {type(value).__name__}"


def check_text(name: str, value: Any, *, optional: bool = True) -> None:
    """``value`` is a string (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise TypeError(f"{name}: give a string, not {_type_name(value)}")


def check_number(name: str, value: Any, *, optional: bool = True) -> None:
    """``value`` is an int or a float, not a bool or a string (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        example = f" (e.g. {name}=4.0)" if name == "epsilon" else ""
        raise TypeError(f"{name}: give a number{example}, not {_type_name(value)}")


def check_int(name: str, value: Any, *, optional: bool = True) -> None:
    """``value`` is an int, not a bool (or None when ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: give a whole number, not {_type_name(value)}")


def check_flag(name: str, value: Any) -> None:
    """``value`` is True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: give True or False, not {_type_name(value)}")


def check_path(name: str, value: Any, *, optional: bool = True) -> None:
    """``value`` is a path (a string or an os.PathLike) (or None when ``optional``)."""
    if value is None and optional:
        return
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{name}: give a path (a string or pathlib.Path), not "
                        f"{_type_name(value)}")


def check_names(name: str, value: Any) -> None:
    """``value`` is a list (or tuple) of strings, or None; a lone string is refused (one
    column is ``[name]``: a string is a sequence of characters, not of names)."""
    if value is None:
        return
    if isinstance(value, str):
        raise TypeError(f"{name}: give a list of column names, e.g. {name}=[{value!r}], not a "
                        "string")
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{name}: give a list of column names (strings), not "
                        f"{_type_name(value)}")


def check_mapping(name: str, value: Any) -> None:
    """``value`` is a dict (any Mapping), or None."""
    if value is not None and not isinstance(value, Mapping):
        raise TypeError(f"{name}: give a dict, not {_type_name(value)}")


def check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    """``value`` is one of ``choices`` (a TypeError for a non-string, ValueError else)."""
    check_text(name, value, optional=False)
    if value not in choices:
        raise ValueError(f"{name}: give one of {', '.join(map(repr, choices))}, not {value!r}")


#: CLI flags and config keys in messages from the layers below, as the Python arguments.
_API_WORDS: tuple[tuple[str, str], ...] = (
    (r"--set data\.text(=\S*)?", "text=..."),
    (r"--set data\.labels(=\S*)?", "labels=[...]"),
    (r"--set data\.label_values(=\S*)?", "label_values={...}"),
    (r"--set privacy\.epsilon(=\S*)?", "epsilon=..."),
    (r"--set privacy\.delta(=\S*)?", "delta=..."),
    (r"--set (\w+)\.(\w+)(=\S*)?", r"config={'\1': {'\2': ...}}"),
    (r"\bdata\.label_values\b", "label_values"),
    (r"\bdata\.labels\b", "labels"),
    (r"\bdata\.text\b", "text"),
    (r"\bdata\.user\b", "user"),
    (r"\bdata\.source\b", "source"),
    (r"--test FILE", "test=FILE"),
    (r"--zero-shot RUN_DIR", "zero_shot=RUN_DIR"),
    (r"--resume", "resume=True"),
    (r"--pii-column", "pii_columns"),
    (r"--(test|text|classifier|epochs)\b", r"\1"),
    (r"--label\b", "labels"),
    (r"--zero-shot\b", "zero_shot"),
)


def api_message(message: str, staged: Path | None = None) -> str:
    """``message`` in the API's words: the Python argument for a CLI flag or config key, and
    ``data`` for the run's internal copy of a DataFrame (``staged``)."""
    if staged is not None:
        message = message.replace(str(staged), "data").replace(STAGED_INPUT.name, "data")
    for pattern, words in _API_WORDS:
        message = re.sub(pattern, words, message)
    return message


@contextmanager
def api_errors(staged: Path | None = None) -> Iterator[None]:
    """Errors raised inside, reworded by :func:`api_message` (same class, same object)."""
    try:
        yield
    except DpsynthError as err:
        if err.args and isinstance(err.args[0], str):
            err.args = (api_message(err.args[0], staged), *err.args[1:])
        if err.hint:
            err.hint = api_message(err.hint, staged)
        raise


def _finished(output_dir: str | Path) -> bool:
    run = RunDir(output_dir)
    return run.exists() and run.meta().get("status") == "finished"


def _prepare_output(output_dir: str | Path) -> None:
    from .preflight import check_output_writable

    check_output_writable(output_dir)


def run_generation(config: RunConfig | str | Path, output_dir: str | Path, *,
                   resume: bool = False, overrides: dict[str, Any] | None = None,
                   progress: bool = True, generators: Sequence[Any] | None = None,
                   embedder: Any | None = None, hooks: RunHooks | None = None,
                   no_cap: bool = False) -> Path:
    """Run a text-releasing method end to end, or resume it; returns the run folder.

    ``no_cap=True`` (``privacy.no_cap``, the CLI's ``--no-cap``) runs past the default
    epsilon cap of a data source that has no cap of its own.

    ``generators`` / ``embedder`` replace the configured models with ready objects (one
    generator per configured entry), e.g. the deterministic fakes of the fast tests;
    ``hooks``: what the caller plugs into the run (:class:`dpsynth.hooks.RunHooks`).

    A refusal before any work (bad data, a config the method cannot run, a ledger refusal)
    removes the new run folder again; a stop after work began keeps it for ``--resume``, with a
    true status in run.json (failed with the error's class, or interrupted by SIGINT / SIGTERM).
    Resuming a finished run does nothing (it is not a new attempt). The run shows its stages
    on one progress display (:mod:`dpsynth.progress`; ``progress=False``: warnings only).
    """
    from . import progress as display

    if not isinstance(config, RunConfig):
        check_path("config", config, optional=False)
    check_path("output_dir", output_dir, optional=False)
    check_flag("resume", resume)
    check_mapping("overrides", overrides)
    check_flag("progress", progress)
    check_flag("no_cap", no_cap)
    if no_cap:
        overrides = {**(overrides or {}), "privacy.no_cap": True}
    if resume and not overrides and _finished(output_dir):
        return RunDir(output_dir).root  # nothing to do; with --set the runner says why
    _prepare_output(output_dir)
    with display.session(enabled=progress):
        return run_method(config, output_dir, resume=resume, overrides=overrides,
                          releases="text", options=RunOptions(
                              progress=progress, generators=generators, embedder=embedder,
                              hooks=hooks or RunHooks()))


# -- data given as a DataFrame or records ------------------------------------------------------


def _frame(data: Any) -> pd.DataFrame:
    """A DataFrame of ``data`` (a DataFrame, or a list of mappings)."""
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        return data
    if isinstance(data, Mapping) or not isinstance(data, Sequence) or isinstance(data, str):
        raise InputError(f"data: give a file path, a pandas DataFrame or a list of dicts, not "
                         f"a {type(data).__name__}")
    for i, row in enumerate(data, start=1):
        if not isinstance(row, Mapping):
            raise InputError(f"data: item {i} is a {type(row).__name__}, not a dict of "
                             "column -> value")
    if not data:
        raise InputError("data: the list holds no records")
    return pd.DataFrame.from_records(list(data))


def records_table(data: Any, columns: Sequence[str]) -> Any:
    """The ``columns`` of ``data`` as a pyarrow Table (what the run reads back). A missing
    column or one that cannot be stored is an :class:`InputError` naming the column; no value
    is ever shown."""
    import pyarrow as pa

    frame = _frame(data)
    names = [str(c) for c in frame.columns]
    missing = [c for c in columns if c not in names]
    if missing:
        shown = ", ".join(repr(c) for c in names[:50]) or "(none)"
        raise InputError(f"data: no column {', '.join(map(repr, missing))}; the columns are "
                         f"{shown}")
    if len(frame) == 0:
        raise InputError("data: the DataFrame holds no rows")
    arrays = {}
    for col in dict.fromkeys(columns):
        series = frame[[c for c in frame.columns if str(c) == col][0]]
        if not hasattr(series, "dtype"):  # a name given twice: a DataFrame, not a column
            raise InputError(f"data: column {col!r} appears more than once")
        try:
            arrays[col] = pa.array(series, from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError):
            raise InputError(
                f"data: column {col!r} mixes value types that cannot be stored (e.g. text "
                "and numbers, or lists); give strings (labels may also be integers)") from None
    return pa.table(arrays)


# -- results ------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def _jsonl_frame(path: Path, labels: Sequence[str]) -> pd.DataFrame:
    """release/*.jsonl as a DataFrame: ``text`` and one column per label."""
    import pandas as pd

    from .files import iter_jsonl

    rows = []
    for row in iter_jsonl(path):
        got = row.get("labels") or {}
        rows.append({"text": row.get("text", ""), **{c: got.get(c) for c in labels}})
    return pd.DataFrame(rows, columns=["text", *labels])


@dataclass
class Result:
    """A finished run of a text-releasing method: ``run_dir``, ``privacy`` (the statement,
    release/privacy.json), ``summary`` (release/summary.json) and the synthetic data."""

    run_dir: Path
    privacy: dict[str, Any]
    summary: dict[str, Any]
    labels: list[str] = field(default_factory=list)

    @property
    def method(self) -> str:
        return str(self.summary.get("method", ""))

    @property
    def synthetic(self) -> pd.DataFrame:
        """release/synthetic.jsonl: ``text`` and one column per label."""
        return _jsonl_frame(self.run_dir / "release" / "synthetic.jsonl", self.labels)

    @property
    def zero_shot(self) -> pd.DataFrame | None:
        """The epsilon-0 reference (release/zero_shot.jsonl), when the method made one."""
        path = self.run_dir / "release" / "zero_shot.jsonl"
        return _jsonl_frame(path, self.labels) if path.is_file() else None

    @property
    def evaluation(self) -> dict[str, Any] | None:
        """eval/eval.json (the shareable evaluation), once :meth:`evaluate` ran."""
        return _read_json(self.run_dir / "eval" / "eval.json") or None

    def evaluate(self, test: str | Path | pd.DataFrame | list[Any] | None = None,
                 **options: Any) -> dict[str, Any]:
        """:func:`evaluate` of this run: ``test`` a path, a DataFrame or a list of dicts (or
        of texts)."""
        return evaluate(self.run_dir, test, **options)

    def report(self, out: str | Path | None = None, *,
               test: str | Path | pd.DataFrame | list[Any] | None = None) -> Path:
        """Write the shareable HTML report (default RUN_DIR/eval/report.html; the operator's
        page goes to private/), evaluating against ``test`` first when given; returns its
        path (:func:`report`)."""
        return report(self.run_dir, out, test=test)

    def __repr__(self) -> str:
        eps = self.privacy.get("epsilon")
        return (f"Result(method={self.method!r}, samples={self.summary.get('samples')}, "
                f"epsilon={eps!r}, run_dir={str(self.run_dir)!r})")


@dataclass
class RagResult:
    """A finished DP-SynRAG build: ``run_dir``, ``privacy``, ``summary`` and the synthetic
    knowledge base (release/kb.jsonl); :meth:`ask` answers from it at no privacy cost."""

    run_dir: Path
    privacy: dict[str, Any]
    summary: dict[str, Any]
    _answerer: Any = field(default=None, repr=False)

    @property
    def knowledge_base(self) -> pd.DataFrame:
        import pandas as pd

        from .files import read_jsonl

        return pd.DataFrame(read_jsonl(self.run_dir / "release" / "kb.jsonl"))

    def ask(self, question: str, k: int | None = None, *, generator: Any = None,
            embedder: Any = None) -> dict[str, Any]:
        """The answer and the ``k`` retrieved passages (default: the build's
        ``synrag.retrieve``); post-processing of the release."""
        check_text("question", question, optional=False)
        check_int("k", k)
        if not str(question).strip():
            raise ConfigError("the question is blank (empty or whitespace only)")
        if self._answerer is None or generator is not None or embedder is not None:
            from .rag.answer import open_answerer

            self._answerer = open_answerer(self.run_dir, generator=generator,
                                           embedder=embedder)
        return self._answerer.ask(question, k)


def load_run(path: str | Path) -> Result | RagResult:
    """The :class:`Result` (or, for a DP-SynRAG build, :class:`RagResult`) of a finished run
    folder; a run that did not finish is an error saying how to continue it."""
    check_path("path", path, optional=False)
    run = RunDir(path)
    meta = run.meta()  # MissingFileError: not a run folder
    if meta.get("status") != "finished":
        raise MissingFileError(
            f"{run.root}: the run has not finished (status {meta.get('status')!r}); continue it "
            f"with generate(None, output={str(run.root)!r}, resume=True) (the CLI: dpsynth "
            f"generate CONFIG -o {run.root} --resume)")
    privacy = _read_json(run.release / "privacy.json")
    summary = _read_json(run.release / "summary.json")
    if (run.release / "kb.jsonl").is_file():
        return RagResult(run.root, privacy, summary)
    import yaml

    cfg = yaml.safe_load(run.config_path.read_text(encoding="utf-8")) or {}
    labels = list((cfg.get("data") or {}).get("labels") or [])
    return Result(run.root, privacy, summary, labels)


CLASSIFIERS = ("logreg", "finetune", "both")


def _test_frame(test: Any, text: str) -> pd.DataFrame:
    """A DataFrame of test data given as a DataFrame, a list of dicts or a list of texts."""
    import pandas as pd

    if isinstance(test, pd.DataFrame):
        return test
    if isinstance(test, list | tuple) and test and all(isinstance(t, str) for t in test):
        return pd.DataFrame({text: list(test)})
    try:
        return _frame(test)
    except InputError as err:
        raise InputError(str(err).replace("data:", "test:", 1)) from None


@contextmanager
def _test_file(test: Any, text: str) -> Iterator[tuple[Path | None, str | None]]:
    """(the path :func:`dpsynth.eval.suite.evaluate_run` reads, the name eval.json gives it):
    a path as it is; a DataFrame or list written to a private temporary file (mode 0600),
    removed afterwards, and named for what it was."""
    if test is None or isinstance(test, str | os.PathLike):
        yield (None if test is None else Path(test)), None
        return
    import pandas as pd

    if not isinstance(test, pd.DataFrame | list | tuple):
        raise TypeError(f"test: give a path, a pandas DataFrame or a list of dicts (or of "
                        f"texts), not {_type_name(test)}")
    frame = _test_frame(test, text)
    with tempfile.TemporaryDirectory(prefix="dpsynth-test-") as folder:
        path = Path(folder) / "test.parquet"
        try:
            frame.to_parquet(path, index=False)
        except (ValueError, TypeError, ImportError) as err:
            raise InputError(f"test: the table cannot be stored ({type(err).__name__}); give "
                             "strings (labels may also be integers)") from None
        path.chmod(0o600)
        kind = "DataFrame" if isinstance(test, pd.DataFrame) else "list"
        yield path, f"(a {kind} of {len(frame):,} rows given to evaluate())"


def evaluate(run: str | Path | Result,
             test: str | Path | pd.DataFrame | list[Any] | None = None, *, text: str | None = None,
             labels: list[str] | None = None, classifier: str = "logreg", epochs: int = 3,
             k: int = 3, mauve: bool = True, audits: bool = True,
             pii_columns: list[str] | None = None, zero_shot: str | Path | None = None,
             report: bool = True, embedder: Any = None, progress: bool = True
             ) -> dict[str, Any]:
    """``dpsynth eval``: fidelity and utility of the synthetic data against real test data
    (and the operator's audits); writes eval/eval.json (and, with ``report``, the HTML report)
    and returns the shareable evaluation (what eval/eval.json holds).

    ``test``: a path (CSV, JSONL, Parquet), a pandas DataFrame or a list of dicts (a list of
    texts for an unlabeled corpus); None: the demo corpus's test split for a demo run.
    ``text`` / ``labels``: its columns (default the run's); ``classifier``: logreg, finetune or
    both, fine-tuned for ``epochs``; ``k`` of kNN precision / recall; ``mauve``, ``audits``;
    ``pii_columns``: private columns whose values the PII audit looks for; ``zero_shot``: a
    zero-shot run folder as the reference. The same options as ``dpsynth eval``.
    ``progress``: bars for the embedding and fine-tuning (counts only; False: none)."""
    from .eval.suite import EvalOptions, evaluate_run

    if not isinstance(run, Result):
        check_path("run", run, optional=False)
    check_text("text", text)
    check_names("labels", labels)
    check_choice("classifier", classifier, CLASSIFIERS)
    check_int("epochs", epochs, optional=False)
    check_int("k", k, optional=False)
    for name, flag in (("mauve", mauve), ("audits", audits), ("report", report),
                       ("progress", progress)):
        check_flag(name, flag)
    check_names("pii_columns", pii_columns)
    check_path("zero_shot", zero_shot)
    run_dir = run.run_dir if isinstance(run, Result) else Path(run)
    with api_errors(), _test_file(test, text or _run_text(run_dir)) as (path, name):
        options = EvalOptions(
            text=text, labels=None if labels is None else list(labels),
            classifier=classifier,  # type: ignore[arg-type]
            k=k, finetune_epochs=epochs, with_mauve=mauve, with_audits=audits,
            pii_columns=None if pii_columns is None else list(pii_columns),
            zero_shot_run=zero_shot, test_name=name)
        evaluate_run(run_dir, path, options, embedder=embedder, progress=progress)
        if report:
            from .eval.report import write_report

            write_report(run_dir)
    return _read_json(run_dir / "eval" / "eval.json")


def _run_text(run_dir: Path) -> str:
    """The text column of a run's config (for test data given as a list of texts)."""
    import yaml

    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "text"
    return str((cfg.get("data") or {}).get("text") or "text")


def report(run: str | Path | Result, out: str | Path | None = None, *,
           test: str | Path | pd.DataFrame | list[Any] | None = None) -> Path:
    """``dpsynth report``: write the shareable HTML report (default RUN_DIR/eval/report.html)
    and the operator's page (private/report-operator.html); with ``test`` (as
    :func:`evaluate` takes it), evaluate against it first. Returns the shareable page's
    path."""
    from .eval.report import write_report

    if not isinstance(run, Result):
        check_path("run", run, optional=False)
    check_path("out", out)
    run_dir = run.run_dir if isinstance(run, Result) else Path(run)
    if test is not None:
        evaluate(run_dir, test, report=False)
    with api_errors():
        return write_report(run_dir, out)


# -- building a config from keyword arguments --------------------------------------------------


def _merge(base: dict[str, Any], extra: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """``extra`` laid over ``base`` (mappings merged key by key)."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, f"{where}{key}.")
        else:
            base[key] = copy.deepcopy(value) if isinstance(value, Mapping | list) else value
    return base


def _default_output(method: str) -> Path:
    return Path("runs") / f"{method}-{time.strftime('%Y%m%d-%H%M%S')}"


def build_config(data: Any, output: Path, *, method: str, text: str,
                 labels: Sequence[str] | None, label_values: Mapping[str, Any] | None,
                 user: str | None, epsilon: float | None, delta: float | None,
                 config: Mapping[str, Any] | None, source: str | None = None) -> RunConfig:
    """The RunConfig of a :func:`generate` call: ``config`` sections, then the keyword
    arguments over them; a DataFrame's records ride along, to be written into the run."""
    if config is not None and not isinstance(config, Mapping):
        raise ConfigError(f"config: give a dict of YAML sections (e.g. {{'synthesis': "
                          f"{{'samples': 6}}}}), not a {type(config).__name__}")
    raw = _merge({}, dict(config or {}))
    if "method" in raw and raw["method"] != method:
        raise ConfigError(f"config['method'] is {raw['method']!r} but method={method!r}: give "
                          "the method once (method=...)")
    raw["method"] = method
    section = raw.setdefault("data", {})
    if not isinstance(section, dict):
        raise ConfigError("config['data'] must be a dict")
    if "path" in section:
        raise ConfigError("config['data']['path']: give the data as the first argument")
    section["text"] = text
    if labels is not None:
        section["labels"] = [labels] if isinstance(labels, str) else list(labels)
    if label_values is not None:
        section["label_values"] = {k: (list(v) if isinstance(v, list | tuple) else v)
                                   for k, v in dict(label_values).items()}
    if user is not None:
        section["user"] = user
    if source is not None:
        section["source"] = source
    privacy = raw.setdefault("privacy", {})
    if not isinstance(privacy, dict):
        raise ConfigError("config['privacy'] must be a dict")
    if epsilon is not None:
        privacy["epsilon"] = epsilon
    if delta is not None:
        privacy["delta"] = delta
    staged = None
    if isinstance(data, str | Path):
        section["path"] = str(data)
    else:
        wanted = [text, *section.get("labels", []), *([section["user"]]
                                                      if section.get("user") else [])]
        staged = records_table(data, [str(c) for c in wanted])
        section["path"] = str(Path(output).resolve() / STAGED_INPUT)
    cfg = parse_config(raw, "generate()").resolve_paths(Path.cwd())
    cfg.data.stage_records(staged)  # written into the run by run_dataset.load_run_data
    return cfg


def _check_run_arguments(data: Any, *, text: Any, epsilon: Any, delta: Any, output: Any,
                         config: Any, resume: Any, progress: Any, source: Any) -> None:
    """The type checks :func:`generate` and :func:`build_rag` share."""
    import pandas as pd

    if data is not None and not isinstance(data, str | os.PathLike | pd.DataFrame | list
                                           | tuple):
        raise TypeError(f"data: give a path, a pandas DataFrame or a list of dicts, not "
                        f"{_type_name(data)}")
    check_text("text", text, optional=False)
    check_number("epsilon", epsilon)
    check_number("delta", delta)
    check_path("output", output)
    check_mapping("config", config)
    check_flag("resume", resume)
    check_flag("progress", progress)
    check_text("source", source)


def _staged(data: Any, out: Path) -> Path | None:
    """Where a DataFrame or list given as ``data`` is stored in the run (None for a path)."""
    return None if data is None or isinstance(data, str | os.PathLike) else \
        (out / STAGED_INPUT).resolve()


def generate(data: Any, *, text: str = "text", labels: Sequence[str] | None = None,
             label_values: Mapping[str, Any] | None = None, user: str | None = None,
             epsilon: float | None = None, delta: float | None = None,
             method: str = "aug_pe", output: str | Path | None = None,
             config: Mapping[str, Any] | None = None, resume: bool = False,
             progress: bool = True, generators: Sequence[Any] | None = None,
             embedder: Any | None = None, source: str | None = None,
             no_cap: bool = False) -> Result:
    """Make synthetic text from private ``data`` with a DP guarantee; returns a
    :class:`Result`.

    ``data``: a path (CSV, JSONL, Parquet, or ``"demo"``), a pandas DataFrame or a list of
    dicts. ``text``, ``labels``, ``label_values`` (the public label domain: column -> list of
    values, or a file of them), ``user``: the data section. ``epsilon`` / ``delta``: the
    privacy target (default 4 and 1e-5). ``method``: aug_pe, wasp, secpe or zero_shot.
    ``config``: any other section of the YAML, e.g. ``{"synthesis": {"samples": 60}}``.
    ``source``: the data source the budget ledger charges (``data.source``; default the
    file's path; a DataFrame is recognised by its records as the source they came from).
    ``output``: the run folder (default runs/METHOD-TIME). ``resume=True`` continues a
    stopped run in ``output`` with its stored configuration and records. ``generators`` /
    ``embedder``: ready model objects instead of the configured ones. ``no_cap=True`` runs
    past the default epsilon cap (10) of a source that has no cap of its own.

    A wrong type (``labels="sentiment"``, ``epsilon="4"``) is a TypeError naming the
    argument, raised before anything is read or spent.
    """
    _check_run_arguments(data, text=text, epsilon=epsilon, delta=delta, output=output,
                         config=config, resume=resume, progress=progress, source=source)
    check_names("labels", labels)
    check_mapping("label_values", label_values)
    check_text("user", user)
    check_text("method", method, optional=False)
    out = Path(output) if output is not None else _default_output(method)
    if resume:
        if not RunDir(out).exists():
            raise ConfigError(f"{out}: nothing to resume (no run.json there)")
        cfg: RunConfig | Path = out / "config.yaml"
    with api_errors(_staged(data, out)):
        if not resume:
            cfg = build_config(data, out, method=method, text=text, labels=labels,
                               label_values=label_values, user=user, epsilon=epsilon,
                               delta=delta, config=config, source=source)
        run_dir = run_generation(cfg, out, resume=resume, progress=progress,
                                 generators=generators, embedder=embedder, no_cap=no_cap)
    result = load_run(run_dir)
    assert isinstance(result, Result)
    return result


def build_kb(
    config: RunConfig | str | Path | None,
    output_dir: str | Path,
    *,
    resume: bool = False,
    overrides: dict[str, Any] | None = None,
    generator: Any = None,
    embedder: Any = None,
    progress: bool = False,
    echo: Callable[[str], None] | None = None,
    hooks: RunHooks | None = None,
) -> Path:
    """``dpsynth rag build CONFIG --output DIR``: build (or resume) a DP synthetic knowledge
    base with DP-SynRAG (docs/methods.md §4) through the one runner; returns the run folder.

    ``generator`` / ``embedder``: ready objects instead of the configured models (the
    generator must expose next-token logits); ``echo`` receives operator messages;
    ``hooks``: what the caller plugs into the run (:class:`dpsynth.hooks.RunHooks`: the tests
    stop a build after a cluster's checkpoint, as a kill would)."""
    from .methods.synrag.method import SynRAG  # faiss and the compute engine: on first use

    return run_method(config, output_dir, resume=resume, overrides=overrides,
                      method=SynRAG(config, output_dir), options=RunOptions(
                          progress=progress, echo=echo,
                          generators=None if generator is None else [generator],
                          embedder=embedder, hooks=hooks or RunHooks()))


def build_rag(data: Any, *, text: str = "text", epsilon: float | None = None,
              delta: float | None = None, output: str | Path | None = None,
              config: Mapping[str, Any] | None = None, resume: bool = False,
              progress: bool = True, generator: Any = None,
              embedder: Any = None, source: str | None = None) -> RagResult:
    """``dpsynth rag build``: a DP synthetic knowledge base from the documents in ``data``
    (path, DataFrame or list of dicts; ``text`` names the column); ``config`` holds the
    ``synrag`` section and any other. Returns a :class:`RagResult` (``.ask(question)``)."""
    from . import progress as display

    _check_run_arguments(data, text=text, epsilon=epsilon, delta=delta, output=output,
                         config=config, resume=resume, progress=progress, source=source)
    out = Path(output) if output is not None else _default_output("synrag")
    if resume:
        if not RunDir(out).exists():
            raise ConfigError(f"{out}: nothing to resume (no run.json there)")
        cfg: RunConfig | Path = out / "config.yaml"
    with api_errors(_staged(data, out)):
        if not resume:
            cfg = build_config(data, out, method="synrag", text=text, labels=None,
                               label_values=None, user=None, epsilon=epsilon, delta=delta,
                               config=config, source=source)
        if not (resume and _finished(out)):
            _prepare_output(out)
            with display.session(enabled=progress):
                build_kb(cfg, out, resume=resume, generator=generator, embedder=embedder,
                         progress=progress)
    result = load_run(out)
    assert isinstance(result, RagResult)
    return result
