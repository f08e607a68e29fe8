"""The ``secpe:`` section of a run config (SecPE, docs/methods.md §3); validated through the
method registry (``dpsynth.methods.section_model``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from ...config import Section


class SecPEConfig(Section):
    """SecPE (docs/methods.md §3)."""

    secrets: list[dict[str, Any]] = Field(
        default_factory=lambda: [{"kind": "pii",
                                  "entities": ["PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS"]}],
        description="secret definitions (dpsynth.secrets.SecretSpec)",
    )
    p: float = Field(1e-4, gt=0, lt=1)
    r_over_p: float = Field(10.0, gt=1)
    clusters: int = Field(50, gt=0)
    clip: float = Field(
        1.0, gt=0,
        description="R: private embeddings are clipped to norm R; a centre's noise scale is "
                    "(R + max(1, R)) / n_k, so R < 1 still pays (1 + R) / n_k",
    )
    discretization: float = Field(
        3e-3, gt=0, le=0.05,
        description="the privacy-loss grid of SecretNoise's accountant (dp_accounting's "
                    "value_discretization_interval): pessimistic at any grid, so the (p, r) "
                    "bound holds either way; a coarser grid calibrates faster and asks for a "
                    "little more noise",
    )

    @property
    def r(self) -> float:
        """The protection target r = min(1, p * r_over_p) of every secret (r = 1: none)."""
        return min(1.0, self.p * self.r_over_p)
