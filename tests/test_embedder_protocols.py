"""The embedder's typed seams (issue 47): what an embedder offers is a Protocol
(dpsynth.embed.protocols) checked with isinstance; no getattr on embedders in src/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpsynth.embed.protocols import CachedEmbedder, EngineTagged, TextEmbedder
from fakes import FakeEmbedder

SRC = Path(__file__).resolve().parents[1] / "src" / "dpsynth"
_GETATTR = re.compile(r"getattr\(\s*(?:self\.)?_?(?:embedder|emb)\b")


def test_the_fake_is_a_plain_embedder() -> None:
    fake = FakeEmbedder()
    assert isinstance(fake, TextEmbedder)
    assert not isinstance(fake, EngineTagged) and not isinstance(fake, CachedEmbedder)


@pytest.mark.models
def test_the_real_embedder_offers_every_seam() -> None:
    from dpsynth.embed import Embedder

    real = Embedder("minilm")
    assert isinstance(real, TextEmbedder) and isinstance(real, EngineTagged)
    assert isinstance(real, CachedEmbedder) and real.dim == 384


def capability_getattrs(text: str) -> list[str]:
    """The lines of ``text`` that ask an embedder for a capability by getattr."""
    return [line.strip() for line in text.splitlines() if _GETATTR.search(line)]


def test_no_getattr_on_embedders() -> None:
    found = [f"{p.relative_to(SRC)}: {line}" for p in sorted(SRC.rglob("*.py"))
             for line in capability_getattrs(p.read_text(encoding="utf-8"))]
    assert found == [], "\n".join(found)
    assert capability_getattrs('dim = getattr(embedder, "dim", None)')  # it can fail
