"""One API (issue 46): every CLI command with a Python counterpart takes the same options under
the Python argument names, with the same types and defaults; the documented signatures are the
real ones; a wrong type is a TypeError naming the argument, raised before anything is written.

Fast: introspection of the typer app and of the API signatures, and calls that fail at the
argument checks (no model, no run)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest
import typer.main

import dpsynth
from dpsynth import api
from dpsynth.cli import app

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"

#: CLI command -> (its API counterpart, {CLI parameter: API argument}, {CLI-only parameter:
#: why the API has no such argument}). A CLI option missing here fails the test.
PARITY: dict[str, tuple[Callable[..., Any], dict[str, str], dict[str, str]]] = {
    "generate": (api.run_generation,
                 {"config": "config", "output": "output_dir", "resume": "resume",
                  "set_": "overrides", "quiet": "progress", "no_cap": "no_cap"},
                 {"as_json": "how the CLI prints; the API returns the run folder"}),
    "eval": (api.evaluate,
             {"run_dir": "run", "test": "test", "text": "text", "label": "labels",
              "classifier": "classifier", "epochs": "epochs", "k": "k", "mauve": "mauve",
              "audits": "audits", "pii_column": "pii_columns", "zero_shot": "zero_shot"},
             {"as_json": "how the CLI prints; the API returns the evaluation"}),
    "report": (api.report, {"run_dir": "run", "test": "test", "out": "out"},
               {"as_json": "how the CLI prints; the API returns the page's path"}),
    "rag build": (api.build_rag, {"output": "output", "resume": "resume", "set_": "config"},
                  {"config": "a YAML file; the API takes the documents as data= and the "
                             "sections as config=",
                   "as_json": "how the CLI prints; the API returns a RagResult",
                   "require_passages": "an exit status for scripts; the API returns the "
                                       "knowledge base to inspect"}),
    "rag ask": (api.RagResult.ask, {"question": "question", "k": "k"},
                {"kb": "the RagResult (dpsynth.load_run(kb)) is the knowledge base",
                 "as_json": "how the CLI prints; the API returns a dict"}),
}
#: CLI flags whose API argument means the opposite (--quiet is progress=False).
INVERTED = {("generate", "quiet")}
#: The API annotation a CLI parameter's type must appear in.
TYPE_WORDS = {"IntRange": "int", "IntParamType": "int", "FloatParamType": "float",
              "FloatRange": "float", "BoolParamType": "bool", "TyperPath": "Path"}


def _command(path: str) -> click.Command:
    cmd: click.Command = typer.main.get_command(app)
    ctx = click.Context(cmd)
    for part in path.split():
        assert isinstance(cmd, click.Group), path
        sub = cmd.get_command(ctx, part)
        assert sub is not None, f"no CLI command {path!r}"
        cmd = sub
    return cmd


def _params(cmd: click.Command) -> dict[str, click.Parameter]:
    return {str(p.name): p for p in cmd.params if p.name != "help"}


@pytest.mark.parametrize("path", sorted(PARITY))
def test_every_cli_option_has_its_api_argument(path: str) -> None:
    fn, mapping, cli_only = PARITY[path]
    params = _params(_command(path))
    api_params = inspect.signature(fn).parameters
    unmapped = set(params) - set(mapping) - set(cli_only)
    assert not unmapped, f"{path}: CLI options without an API argument: {sorted(unmapped)}"
    stale = (set(mapping) | set(cli_only)) - set(params)
    assert not stale, f"{path}: the table names options the CLI no longer has: {stale}"
    missing = {cli: arg for cli, arg in mapping.items() if arg not in api_params}
    assert not missing, f"{path}: API {fn.__qualname__} lacks {missing}"


@pytest.mark.parametrize("path", sorted(PARITY))
def test_the_api_arguments_take_the_cli_types_and_defaults(path: str) -> None:
    fn, mapping, _ = PARITY[path]
    params = _params(_command(path))
    api_params = inspect.signature(fn).parameters
    for cli_name, arg in mapping.items():
        p, a = params[cli_name], api_params[arg]
        annotation = str(a.annotation)
        if getattr(p, "multiple", False):
            assert re.search(r"list|Mapping|dict", annotation), (path, cli_name, annotation)
        else:
            word = TYPE_WORDS.get(type(p.type).__name__)
            if word:
                assert word in annotation, (path, cli_name, annotation)
        if p.default is None or a.default is inspect.Parameter.empty or p.multiple:
            continue
        expected = (not p.default) if (path, cli_name) in INVERTED else p.default
        assert a.default == expected, (path, cli_name, p.default, a.default)


def _doc_signature(name: str) -> set[str]:
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"`dpsynth\.(?:api\.)?{name}\((.*?)\)`", text, re.S)
    assert match, f"docs/python-api.md documents no signature of dpsynth.{name}"
    names = (part.split("=")[0].strip() for part in match.group(1).split(","))
    return {name for name in names if name and name != "*"}


#: Arguments for tests and integrations (ready model objects), described in prose instead.
OBJECT_ARGUMENTS = {"generators", "generator", "embedder", "hooks"}


@pytest.mark.parametrize("name", ["generate", "evaluate", "report", "build_rag"])
def test_the_documented_signatures_are_the_real_ones(name: str) -> None:
    real = set(inspect.signature(getattr(dpsynth, name) if hasattr(dpsynth, name)
                                 else getattr(api, name)).parameters) - OBJECT_ARGUMENTS
    documented = _doc_signature(name) - OBJECT_ARGUMENTS
    assert documented == real, (name, sorted(documented ^ real))


# -- wrong types: a TypeError naming the argument, before anything is read or written --------

ROWS = [{"text": "a message", "label": "billing"}, {"text": "another", "label": "support"}]


def _calls(tmp: Path) -> list[tuple[str, Callable[[], Any]]]:
    out = tmp / "run"
    kw: dict[str, Any] = {"text": "text", "output": out, "progress": False}
    return [
        ("labels", lambda: api.generate(ROWS, labels="label", **kw)),
        ("labels", lambda: api.generate(ROWS, labels=[1, 2], **kw)),
        ("epsilon", lambda: api.generate(ROWS, labels=["label"], epsilon="4", **kw)),
        ("epsilon", lambda: api.generate(ROWS, epsilon=True, **kw)),
        ("delta", lambda: api.generate(ROWS, delta="1e-5", **kw)),
        ("config", lambda: api.generate(ROWS, config="synthesis.samples=6", **kw)),
        ("label_values", lambda: api.generate(ROWS, label_values=["billing"], **kw)),
        ("resume", lambda: api.generate(ROWS, resume="yes", **kw)),
        ("text", lambda: api.generate(ROWS, text=["text"], output=out)),
        ("output", lambda: api.generate(ROWS, output=3)),
        ("data", lambda: api.generate(3, output=out)),
        ("epsilon", lambda: api.build_rag(ROWS, epsilon="10", output=out)),
        ("config", lambda: api.run_generation(3, out)),
        ("overrides", lambda: api.run_generation("x.yaml", out, overrides=["a=1"])),
        ("labels", lambda: api.evaluate(out, "test.csv", labels="label")),
        ("test", lambda: api.evaluate(out, 3)),
        ("test", lambda: api.evaluate(out, {"text": ["a"]})),
        ("epochs", lambda: api.evaluate(out, "test.csv", epochs="3")),
        ("k", lambda: api.evaluate(out, "test.csv", k=2.5)),
        ("classifier", lambda: api.evaluate(out, "test.csv", classifier=1)),
        ("mauve", lambda: api.evaluate(out, "test.csv", mauve="no")),
        ("pii_columns", lambda: api.evaluate(out, "test.csv", pii_columns="email")),
        ("run", lambda: api.evaluate(3, "test.csv")),
        ("out", lambda: api.report(out, 3)),
        ("path", lambda: api.load_run(3)),
    ]


def test_wrong_types_are_type_errors_naming_the_argument(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    for name, call in _calls(tmp_path):
        with pytest.raises(TypeError) as err:
            call()
        assert str(err.value).startswith(f"{name}: "), (name, str(err.value))
        assert "--" not in str(err.value)  # the Python argument, not a CLI flag
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run folder, no ledger


def test_a_string_for_a_list_says_how_to_write_the_list(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"labels=\['sentiment'\], not a string"):
        api.generate(ROWS, labels="sentiment", output=tmp_path / "run")
    with pytest.raises(ValueError, match="classifier: give one of 'logreg'"):
        api.evaluate(tmp_path, "test.csv", classifier="svm")


def test_cli_words_become_python_arguments() -> None:
    said = api.api_message("give the real test data with --test FILE; pass --label to choose; "
                           "set it with --set data.text=message (data.label_values)")
    assert "--" not in said and "data." not in said
    assert "test=FILE" in said and "labels" in said and "text=" in said
    staged = Path("/runs/r/private/input/records.parquet")
    assert api.api_message(f"1 problem in {staged}: row 5", staged) == "1 problem in data: row 5"


# -- the commands the docs show take the flags they show --------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def unknown_flags(text: str) -> list[tuple[int, str, str]]:
    """(line, command, flag) for each ``--flag`` a ``dpsynth COMMAND ...`` in ``text`` gives
    that the command does not have."""
    root = typer.main.get_command(app)
    ctx = click.Context(root)
    bad = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for match in re.finditer(r"dpsynth ((?:[a-z-]+ ?){1,2})([^`|\n]*)", line):
            words, cmd, used = match.group(1).split(), root, []
            for word in words:
                if not (isinstance(cmd, click.Group) and word in cmd.list_commands(ctx)):
                    break
                cmd = cmd.get_command(ctx, word)
                used.append(word)
            if not used or isinstance(cmd, click.Group):
                continue
            known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
            rest = " ".join(words[len(used):]) + " " + match.group(2)
            bad += [(lineno, " ".join(used), flag)
                    for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest)
                    if flag not in known]
    return bad


def test_docs_show_only_flags_the_commands_have() -> None:
    assert unknown_flags("    dpsynth budget set --data m.csv --label department") == [
        (1, "budget set", "--label")]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        assert unknown_flags(page.read_text(encoding="utf-8")) == [], page.name
