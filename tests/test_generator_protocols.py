"""Typed seams of generators (issue 47): what a generator can do beyond ``generate`` is a
runtime-checkable protocol each (dpsynth.llm.base.CAPABILITIES), checked where a generator is
built; every real generator class satisfies exactly the protocols it claims, and no module of
src/ asks ``hasattr`` of a generator."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from dpsynth.llm import load_generator
from dpsynth.llm.base import CAPABILITIES, Generator, capabilities, checked_generator
from dpsynth.llm.cache import CachedGenerator, RequestCache
from dpsynth.llm.local import LocalGenerator
from dpsynth.llm.openai_compat import OpenAIGenerator
from fake_lm import ReportingFake, TokenFake
from fakes import FakeGenerator

SRC = Path(__file__).resolve().parents[1] / "src" / "dpsynth"

#: The capabilities each real generator class claims (CachedGenerator: its inner one's).
LOCAL = frozenset(CAPABILITIES)
OPENAI = frozenset({"completions"})


def members(proto: type) -> set[str]:
    """The attributes and methods a protocol asks for."""
    own = {k for k, v in vars(proto).items() if callable(v) and not k.startswith("_")}
    return own | set(vars(proto).get("__annotations__", {}))


def test_every_capability_is_a_runtime_checkable_protocol() -> None:
    for name, proto in {"generator": Generator, **CAPABILITIES}.items():
        assert getattr(proto, "_is_runtime_protocol", False), name
        assert members(proto), name


def test_the_openai_generator_claims_completions_only() -> None:
    gen = OpenAIGenerator("http://127.0.0.1:9/v1", "m", api_key_env=None)
    try:
        assert isinstance(gen, Generator)
        assert capabilities(gen) == OPENAI
    finally:
        gen.close()


def test_a_cached_generator_has_its_inner_generators_capabilities(tmp_path: Path) -> None:
    inner = OpenAIGenerator("http://127.0.0.1:9/v1", "m", api_key_env=None)
    cached = CachedGenerator(inner, RequestCache(tmp_path / "c.sqlite"))
    try:
        assert isinstance(cached, Generator) and capabilities(cached) == OPENAI
        fake = CachedGenerator(TokenFake(), RequestCache(tmp_path / "d.sqlite"))
        assert capabilities(fake) == capabilities(TokenFake())
    finally:
        inner.close()


def test_the_local_generator_defines_every_member_it_claims() -> None:
    """Model-free: each claimed method is on the class, each claimed attribute set by it."""
    tree = ast.parse((SRC / "llm" / "local.py").read_text(encoding="utf-8"))
    assigned = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                and isinstance(n.ctx, ast.Store) and ast.unparse(n.value) == "self"}
    for name in LOCAL:
        for member in members(CAPABILITIES[name]):
            assert callable(getattr(LocalGenerator, member, None)) or member in assigned, (
                name, member)


def test_the_local_generator_satisfies_what_it_claims(smollm: Any) -> None:
    assert isinstance(smollm, LocalGenerator) and isinstance(smollm, Generator)
    assert capabilities(smollm) == LOCAL


def test_the_fakes_satisfy_what_the_tests_rely_on() -> None:
    assert capabilities(TokenFake()) >= {"row_decoding", "prompt_tokens", "token_counts"}
    assert capabilities(ReportingFake()) == OPENAI
    assert {"next_token_logits", "stepper"} <= capabilities(FakeGenerator())
    assert "row_decoding" not in capabilities(FakeGenerator())


def test_a_generator_is_checked_where_it_is_built() -> None:
    fake = FakeGenerator()
    assert checked_generator(fake) is fake
    with pytest.raises(TypeError, match="not a Generator"):
        checked_generator(object())
    with pytest.raises(TypeError):
        load_generator(3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ no hasattr on generators
#: What names a generator object in src/ (gen, generator, self.generator, inner, g, cand ...).
GENERATOR_NAME = re.compile(r"(^|\.|_)(gen|generator|generators\[[^]]*\]|inner|g|cand)$")


def hasattr_on_generators(source: str) -> list[str]:
    """``hasattr(<generator>, ...)`` calls in ``source``."""
    return [ast.unparse(n) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == "hasattr" and n.args
            and GENERATOR_NAME.search(ast.unparse(n.args[0]))]


def test_no_hasattr_on_generators_in_src() -> None:
    found = [f"{p.relative_to(SRC)}: {call}" for p in sorted(SRC.rglob("*.py"))
             for call in hasattr_on_generators(p.read_text(encoding="utf-8"))]
    assert found == [], "branch on dpsynth.llm.base's protocols instead:\n" + "\n".join(found)


def test_the_hasattr_check_can_fail() -> None:
    bad = ("def f(gen, self):\n    if hasattr(gen, 'open_stepper'):\n        pass\n"
           "    return hasattr(self.generator, 'render') or hasattr(config, 'x')\n")
    assert hasattr_on_generators(bad) == ["hasattr(gen, 'open_stepper')",
                                          "hasattr(self.generator, 'render')"]
