"""How a local model's requests are cut into batches, and each batch's seed (a function of
the request list alone, so a run's batches and texts are the same run to run)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from .base import GenerationRequest, SamplingParams


def batch_seed(seeds: Sequence[int | None]) -> int | None:
    """The seed of a batch: None when no request has a seed, else a hash of the seeds in order.

    A batch's rows share one random stream (one ``torch.multinomial`` call per step), so a
    batch is reproducible given the same requests in the same batch composition; a request
    alone in its batch with seed ``s`` is reproducible on its own.
    """
    if all(s is None for s in seeds):
        return None
    text = ",".join("none" if s is None else str(int(s)) for s in seeds)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % (2**63 - 1)


def plan_batches(
    requests: Sequence[GenerationRequest],
    batch_size: int,
    lengths: Sequence[int] | None = None,
) -> list[list[int]]:
    """Indices grouped by sampling parameters without the seed, cut into batches.

    Groups keep the order of their first request, and inside a group the original order, so
    interleaved parameters (A, B, A, B, ...) give full batches rather than batches of one.
    With ``lengths`` (prompt tokens) a group is ordered by (length, first index of the same
    prompt, index) first, so that a batch holds prompts of similar length and a repeated
    prompt's requests sit together (the OpenVINO engine prefills each distinct prompt of a
    batch once) -- still a function of the request list alone.
    """
    groups: dict[SamplingParams, list[int]] = {}
    seen: dict[str, int] = {}  # a prompt -> the index of its first request
    first = [seen.setdefault(repr(r.prompt), i) for i, r in enumerate(requests)]
    for i, r in enumerate(requests):
        groups.setdefault(r.params.without_seed(), []).append(i)
    if lengths is not None:
        groups = {k: sorted(v, key=lambda i: (lengths[i], first[i], i))
                  for k, v in groups.items()}
    return [
        idx[s : s + batch_size] for idx in groups.values() for s in range(0, len(idx), batch_size)
    ]
