"""DP-SynRAG's logit clipping clip_c (docs/methods.md §4), used by private prediction.

It belongs to the method, not to the privacy core: the core only sees the clipped sum through
:meth:`dpsynth.privacy.PrivacySession.private_token`, whose charge assumes per-coordinate
sensitivity c.
"""

from __future__ import annotations

import math

import numpy as np

from ...privacy.errors import PrivacyConfigError


def clip_logits(logits: np.ndarray, c: float) -> np.ndarray:
    """DP-SynRAG clip_c (docs/methods.md §4), row-wise (rows = documents):
    l = exp(logits - max) - 1 (in [-1, 0]); centre by (max + min) / 2; scale by
    min(1, c / ||l||_inf). Each returned row has sup-norm <= c, so the sum over documents has
    per-coordinate sensitivity c (one document added or removed)."""
    if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
        raise PrivacyConfigError(f"clip c must be a finite number > 0, got {c!r}")
    x = np.asarray(logits, dtype=np.float64)
    one_d = x.ndim == 1
    x = np.atleast_2d(x)
    if x.ndim != 2 or x.shape[1] == 0:
        raise PrivacyConfigError(f"logits must be 1-D or 2-D (docs x vocab), got shape {x.shape}")
    if np.isnan(x).any() or np.isposinf(x).any():
        raise PrivacyConfigError("logits contain NaN or +inf")
    m = x.max(axis=1, keepdims=True)
    if not np.isfinite(m).all():
        raise PrivacyConfigError("a row of logits is entirely -inf")
    lv = np.expm1(x - m)
    lv = lv - (lv.max(axis=1, keepdims=True) + lv.min(axis=1, keepdims=True)) / 2.0
    norm = np.abs(lv).max(axis=1, keepdims=True)
    scale = np.minimum(1.0, c / np.where(norm > 0, norm, np.inf))
    out = lv * scale
    return out[0] if one_d else out
