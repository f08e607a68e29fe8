"""`--set KEY=VALUE` for every field a user can type: lists are indexed (generators.0.x), and
every bad value of every field of the config schema is one `error:` line naming the field,
exit 2, never a traceback (the schema is walked, so a new field is covered when it is added)."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel
from typer.testing import CliRunner

from dpsynth.cli import ERROR_EXIT, app
from dpsynth.config import ConfigError, RunConfig, apply_overrides, load_config
from dpsynth.methods import REGISTRY, section_model
from test_release_check import pe_config, private_rows, write_csv


def _inner(annotation: Any) -> list[Any]:
    """The types of an annotation without None (``X | None`` -> [X])."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def leaves(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, FieldInfo) of every leaf field; a list of sections is entered at 0."""
    for name, info in model.model_fields.items():
        types_ = _inner(info.annotation)
        if len(types_) == 1 and _is_model(types_[0]):
            yield from leaves(types_[0], f"{prefix}{name}.")
            continue
        if len(types_) == 1 and typing.get_origin(types_[0]) is list and \
                _is_model(typing.get_args(types_[0])[0]):
            yield from leaves(typing.get_args(types_[0])[0], f"{prefix}{name}.0.")
            continue
        yield f"{prefix}{name}", info


def bad_values(info: Any) -> list[str]:
    """YAML texts no value of this field accepts: the wrong type, and for a bounded number
    one past its bound."""
    kinds = _inner(info.annotation)
    takes_mapping = any(t is dict or typing.get_origin(t) is dict for t in kinds)
    out = ["7" if takes_mapping else "{bad: 1}"]
    numeric = all(t in (int, float) for t in kinds)
    if numeric:
        for m in info.metadata:
            if isinstance(m, Gt):
                out.append(str(m.gt))
            elif isinstance(m, Ge):
                out.append(str(m.ge - 1))
            elif isinstance(m, Lt):
                out.append(str(m.lt))
            elif isinstance(m, Le):
                out.append(str(m.le + 1))
    return out


def schema_leaves() -> Iterator[tuple[str, Any]]:
    """The run config's leaves and those of every registered method's own section (each
    validated by its method's model through the registry)."""
    yield from leaves(RunConfig)
    for name in REGISTRY:
        model = section_model(name)
        if model is not None:
            yield from leaves(model, f"{name}.")


CASES = [(path, bad) for path, info in schema_leaves() for bad in bad_values(info)]


def test_the_walk_reaches_every_section() -> None:
    paths = {p for p, _ in CASES}
    for want in ("privacy.epsilon", "generators.0.temperature", "generators.0.base_url",
                 "generators.0.device", "data.deduplicate", "wasp.federated.parties",
                 "compute.timeout_s", "synthesis.voting", "secpe.secrets", "synrag.clusters",
                 "synrag.vocabulary", "embedder.device", "llm_cache"):
        assert want in paths, want
    assert len(CASES) > 100


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("schema")
    data = write_csv(root / "d.csv", private_rows(12))
    cfg = root / "run.yaml"
    cfg.write_text(yaml.safe_dump(pe_config("aug_pe", data)), encoding="utf-8")
    return cfg


def _one_error_naming(result: Any, field: str) -> None:
    assert result.exit_code == ERROR_EXIT, (field, result.output)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), (field, lines)
    assert all(ln.startswith("  ") for ln in lines[1:]), (field, lines)
    assert "Traceback" not in result.output, field
    assert field in result.stderr, (field, result.stderr)


def test_every_field_refuses_a_bad_value_with_one_line(config_file: Path, tmp_path: Path
                                                       ) -> None:
    runner = CliRunner()
    for path, bad in CASES:
        out = tmp_path / "never"
        result = runner.invoke(app, ["generate", str(config_file), "-o", str(out),
                                     "--set", f"{path}={bad}"])
        _one_error_naming(result, path)
        assert not out.exists(), path


@pytest.mark.parametrize(("setting", "named"), [
    ("generators.3.temperature=0.5", "generators has 1 entry"),
    ("generators.x=1", "generators is a list"),
    ("privacy.epsilon.x=1", "privacy.epsilon is a number"),
    ("data.labels.5=x", "data.labels has 1 entry"),
    ("synthesis..samples=3", "a key part is empty"),
    ("=3", "use KEY=VALUE"),
    ("privacy.epsilon", "use KEY=VALUE"),
    ("prompts.task=[unclosed", "not valid YAML"),
    ("generators.0.base_url=http://127.0.0.1:9/v1", "generators.0"),  # a URL needs openai
])
def test_set_paths_that_cannot_be_followed_are_one_line(config_file: Path, tmp_path: Path,
                                                        setting: str, named: str) -> None:
    result = CliRunner().invoke(app, ["generate", str(config_file), "-o", str(tmp_path / "r"),
                                      "--set", setting])
    assert result.exit_code == ERROR_EXIT, result.output
    assert named in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.output


def test_set_indexes_lists_and_fills_missing_sections(config_file: Path) -> None:
    cfg = load_config(config_file, {"generators.0.temperature": 0.5,
                                    "generators.1.model": "gemma3",
                                    "data.labels.0": "label",
                                    "wasp.federated.parties": 3})
    assert cfg.generators[0].temperature == 0.5 and cfg.generators[0].model == "fake-g0"
    assert [g.model for g in cfg.generators] == ["fake-g0", "gemma3"]
    assert cfg.wasp.federated.parties == 3
    raw: dict[str, Any] = {}  # no generators section yet: starts from the default list
    apply_overrides(raw, {"generators.0.max_new_tokens": 7})
    assert raw["generators"][0]["max_new_tokens"] == 7
    assert raw["generators"][0]["model"] == "smollm2"
    with pytest.raises(ConfigError, match="generators has 1 entry"):
        apply_overrides({}, {"generators.2.model": "x"})
