"""Passes of a fixed shape over private rows (docs/methods.md §4, "Rows apart"): a row padded
to a width set by its own token count, a fixed number of rows a pass, filler rows where fewer
are left. A batch padded to its longest row, of however many rows are left, picks its kernels
(and their rounding) by the other rows; at a fixed shape the other rows change nothing, bit for
bit. Used by the embedding engines (:mod:`dpsynth.embed.engines`) and DP-SGD's per-sample
gradients (:mod:`dpsynth.methods.dpfinetune.train`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def padded_width(tokens: int, max_len: int, step: int | None = None) -> int:
    """The width a text of ``tokens`` tokens is padded to (a public rule: the shape is the
    text's own), at most ``max_len``: rounded up to a multiple of ``step``, or by default of 16
    up to 64 tokens and of 32 beyond."""
    if step is None:
        step = 16 if tokens <= 64 else 32
    elif step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    return min(max_len, max(step, -(-tokens // step) * step))


def fixed_shape_passes(lengths: Sequence[int], rows: int, max_len: int,
                       step: int | None = None) -> list[tuple[int, np.ndarray]]:
    """``(width, indices)`` of each pass: the texts of each :func:`padded_width` (``step``),
    widest first, ``rows`` at most a pass (a pass of fewer is filled to ``rows`` by
    fillers)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    widths = np.array([padded_width(n, max_len, step) for n in lengths], dtype=np.int64)
    passes = []
    for w in sorted(set(widths.tolist()), reverse=True):
        idx = np.flatnonzero(widths == w)
        passes += [(int(w), idx[s : s + rows]) for s in range(0, len(idx), rows)]
    return passes


def fixed_shape_arrays(token_rows: Sequence[Sequence[int]], width: int, rows: int, pad_id: int,
                       filler: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, attention_mask)`` of shape ``(rows, width)``: each row right-padded with
    ``pad_id``, then ``filler`` rows (a public text) up to ``rows``."""
    ids = np.full((rows, width), pad_id, dtype=np.int64)
    mask = np.zeros((rows, width), dtype=np.int64)
    for j in range(rows):
        row = token_rows[j] if j < len(token_rows) else filler
        n = min(len(row), width)
        ids[j, :n] = row[:n]
        mask[j, :n] = 1
    return ids, mask
