"""What identifies the private data a run reads, for the budget ledger (docs/methods.md §0).

The ledger charges a run to a *data source*, not to the bytes the run happened to read, so a
subset, another column, another privacy unit or a new version of the same records is charged
to the same budget. A run describes its data by a :class:`DataIdentity`:

- ``name``: the source's name: ``data.source`` when set, else the resolved path of the private
  file (``demo`` for the built-in corpus);
- ``content``: sha256 of the file's bytes, the *version* (a copied file has the same one,
  whatever its path);
- ``records``: the fingerprint of the records the run reads (its columns, limit and unit);
- ``sketch``: the :data:`SKETCH_SIZE` smallest distinct keyed 64-bit hashes of the texts
  read, a bottom-k sketch: a file that shares most of its texts with a known version (one
  record added, a subset, another format, at another path) is recognised as that source
  (:func:`containment`);
- ``normalised``: the same sketch of the *normalised* records (:func:`normalise_record`:
  Unicode NFKC, invisible format characters dropped, case-folded, whitespace collapsed,
  punctuation and symbols at the ends dropped), so a copy with a trailing space on each line,
  a "." appended or every letter upper-cased is the same source. A source is its records, not
  their bytes: to count as new data an edit must change the words of most records
  (docs/methods.md §0, "One budget per data source").
  ``sketch`` (exact text) stays beside it so versions a ledger knew before still match.

``content`` and ``records`` are raw digests of private data: the ledger stores only keyed
(HMAC) forms of them; the sketch is keyed from the start (the ledger's sketch key).
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: hashes kept in a text sketch (bottom-k); 1,024 keeps a 1 % subset of 100,000 records
#: recognisable by about 10 shared hashes
SKETCH_SIZE = 1024
#: share of a run's comparable sketch hashes that must lie in a known version's sketch for the
#: run's data to count as that source (unrelated data sets share almost none)
CONTAINMENT_MATCH = 0.5
#: fewest comparable hashes for a sketch match (below this, only name and content match)
MIN_COMPARABLE = 8


@dataclass(frozen=True)
class DataIdentity:
    """The identity of the data a run reads; see the module docstring."""

    name: str
    content: str
    records: str
    sketch: tuple[int, ...]
    normalised: tuple[int, ...] = ()


def file_digest(path: str | Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, streamed."""
    h = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


#: characters dropped at the ends of a normalised record: anything but a letter or digit
_ENDS = re.compile(r"^[\W_]+|[\W_]+$")


@functools.cache
def _invisible() -> dict[int, None]:
    """A str.translate table that drops Unicode format characters (category Cf: zero-width
    spaces and joiners, soft hyphens, byte-order marks, direction marks): they change the
    bytes of a text but nothing a reader sees."""
    return {cp: None for cp in range(sys.maxunicode + 1)
            if unicodedata.category(chr(cp)) == "Cf"}


def normalise_record(text: str) -> str:
    """The form records are compared in for the ledger: Unicode NFKC, invisible format
    characters dropped, case-folded, runs of whitespace as one space, punctuation, symbols and
    spaces at both ends dropped."""
    visible = unicodedata.normalize("NFKC", text).translate(_invisible())
    return _ENDS.sub("", " ".join(visible.casefold().split()))


def text_hash(text: str, key: bytes) -> int:
    """A keyed 64-bit hash of one text (blake2b under the ledger's sketch key): the sketch's
    unit. Keyed, so a sketch in the ledger cannot be tested against a guessed text."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8, key=key).digest()
    return int.from_bytes(digest, "big")


def text_sketch(texts: Sequence[str], key: bytes, size: int = SKETCH_SIZE, *,
                normalised: bool = False) -> tuple[int, ...]:
    """The ``size`` smallest distinct :func:`text_hash` values of ``texts`` (ascending), read
    in chunks (:func:`dpsynth.columns.chunks_of`): a bottom-k sketch of the set of texts;
    ``normalised``: of the texts' :func:`normalise_record` forms (under a derived key, so the
    two kinds of sketch never share a hash)."""
    from .columns import chunks_of

    if normalised:
        key = hashlib.blake2b(key, digest_size=32, person=b"dpsynth-norm").digest()
    form = normalise_record if normalised else str
    kept = np.zeros(0, dtype=np.uint64)
    for chunk in chunks_of(texts):
        hashes = np.fromiter((text_hash(form(t), key) for t in chunk), dtype=np.uint64,
                             count=len(chunk))
        kept = np.unique(np.concatenate([kept, hashes]))[:size]
    return tuple(int(v) for v in kept)


def merge_sketches(*sketches: Sequence[int], size: int = SKETCH_SIZE) -> tuple[int, ...]:
    """The bottom-k sketch of the union of the sketched sets."""
    return tuple(sorted({int(h) for s in sketches for h in s})[:size])


def containment(run: Sequence[int], known: Sequence[int], size: int = SKETCH_SIZE
                ) -> tuple[float, int]:
    """(estimated share of the run's texts that lie in the known set, hashes compared).

    Both are bottom-k sketches (:func:`text_sketch`, one key). Up to the smaller of their
    largest hashes (of a full sketch) both hold every hash of their set, so the run's hashes
    there are a uniform sample of its texts, and the share of them in ``known`` estimates the
    containment |R & K| / |R| (Broder 1997)."""
    full = [s[-1] for s in (run, known) if len(s) >= size]
    bound = min(full) if full else None
    mine = [h for h in run if bound is None or h <= bound]
    if not mine:
        return 0.0, 0
    theirs = set(known)
    return sum(h in theirs for h in mine) / len(mine), len(mine)


def sketch_matches(run: Sequence[int], known: Sequence[int]) -> bool:
    """Whether the run's texts lie mostly (:data:`CONTAINMENT_MATCH`) in the known set, on
    enough compared hashes (:data:`MIN_COMPARABLE`, or every hash of a small run)."""
    share, compared = containment(run, known)
    return compared > 0 and share >= CONTAINMENT_MATCH and (
        compared >= MIN_COMPARABLE or compared == len(run))
