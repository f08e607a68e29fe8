"""SecPE (Lin et al. 2025): protect named secrets instead of whole records, and vote through
noisy cluster representatives (docs/methods.md §3).

The method (:mod:`.method`), its secret split and calibrated noise (:mod:`.plan`), the
SecretNoise calibration (:mod:`.theory`), the noisy representatives (:mod:`.representatives`),
its shard kernels (:mod:`.kernels`) and their driver side over any engine
(:mod:`.statistics`).
"""

# The method (and what it pulls in: the loop, the accountant) loads on first use (PEP 562): a
# Ray shard that runs one of SecPE's kernels imports only :mod:`.kernels`.

from __future__ import annotations

from typing import TYPE_CHECKING

from ...lazy import lazy_exports

if TYPE_CHECKING:
    from .method import SecPE, SecPEStrategy, discretisation_tv
    from .plan import SecretPlan, plan_digest

__all__ = ["SecPE", "SecPEStrategy", "SecretPlan", "discretisation_tv", "plan_digest"]

_WHERE = {"SecPE": "method", "SecPEStrategy": "method", "discretisation_tv": "method",
          "SecretPlan": "plan", "plan_digest": "plan"}

__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
