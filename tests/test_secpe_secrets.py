"""Secret definitions and detection (strings, regex, random words, Presidio PII)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from dpsynth.secrets import (
    SecretDefinitionError,
    SecretSpec,
    choose_random_words,
    find_secrets,
)

TEXTS = [
    "Acme Corp shipped order 123-4567 late.",
    "I love acme products; call 555-0000.",
    "The acmes were fine, nothing else to say.",
    "Nothing here at all.",
]


def test_strings_case_insensitive_whole_word():
    idx = find_secrets(TEXTS, [{"kind": "strings", "values": ["Acme"], "name": "brand"}])
    assert idx.n_secrets == 1 and idx.types == ["brand"]
    priv, pub = idx.split()
    assert priv.tolist() == [0, 1]  # "acmes" is not the word "acme"
    assert pub.tolist() == [2, 3]


def test_regex_distinct_values_and_membership():
    idx = find_secrets(TEXTS, [SecretSpec(kind="regex", pattern=r"\d{3}-\d{4}", name="code")])
    assert sorted(idx.values) == ["123-4567", "555-0000"]
    m = idx.membership.toarray()
    assert m.shape == (4, 2) and m.sum() == 2
    assert idx.split()[0].tolist() == [0, 1]


def test_split_report_counts_only():
    idx = find_secrets(TEXTS, [{"kind": "strings", "values": ["acme"]},
                               {"kind": "regex", "pattern": r"\d{3}-\d{4}", "name": "code"}])
    rep = idx.split_report()
    assert rep["private_records"] == 2 and rep["public_records"] == 2 and rep["secrets"] == 3
    assert rep["per_type"]["code"] == {"secrets": 2, "records_with": 2}
    dumped = json.dumps(rep) + repr(idx)
    for v in idx.values:
        assert v not in dumped


def test_random_words_percentile_seeded():
    # word w{k} appears in exactly k of 40 documents (k = 1..20); plus filler in all
    docs = []
    for i in range(40):
        words = ["filler"] + [f"w{chr(97 + k)}" for k in range(20) if i < k + 1]
        docs.append(" ".join(words))
    spec = SecretSpec(kind="random_words", percentile=50, count=3, seed=7, min_df=2)
    a = choose_random_words(docs, spec)
    b = choose_random_words(docs, spec)
    assert a == b and len(a) == 3
    dfs = {w: sum(w in d.split() for d in docs) for w in a}
    # df values 2..20 and 40 (filler): median df among them = 11
    assert all(abs(df - 11) <= 2 for df in dfs.values())
    idx = find_secrets(docs, [spec])
    assert set(idx.values) == set(a)
    priv, pub = idx.split()
    assert priv.size == max(dfs.values()) and pub.size == 40 - priv.size
    other = choose_random_words(docs, spec.model_copy(update={"seed": 8}))
    assert len(other) == 3


def test_nothing_matched_message_and_strict():
    idx = find_secrets(TEXTS, [{"kind": "strings", "values": ["zebra"]}])
    assert idx.no_secrets
    assert idx.split()[0].size == 0 and idx.split()[1].size == 4
    assert any("no noise is needed" in m for m in idx.messages)
    with pytest.raises(SecretDefinitionError, match="matched no record"):
        find_secrets(TEXTS, [{"kind": "strings", "values": ["zebra"]}], strict=True)


def test_everything_matched_raises():
    with pytest.raises(SecretDefinitionError, match="matches every record"):
        find_secrets(TEXTS, [{"kind": "regex", "pattern": r"\w+"}])
    with pytest.raises(SecretDefinitionError, match="together match every record"):
        find_secrets(TEXTS[:2] + TEXTS[3:], [{"kind": "strings", "values": ["acme"]},
                                             {"kind": "strings", "values": ["nothing"]}])


def test_bad_specs():
    with pytest.raises(ValidationError, match="pattern"):
        SecretSpec(kind="regex")
    with pytest.raises(ValidationError, match="not a valid regex"):
        SecretSpec(kind="regex", pattern="(")
    with pytest.raises(ValidationError, match="values"):
        SecretSpec(kind="strings")
    with pytest.raises(ValidationError):
        SecretSpec(kind="colour")
    with pytest.raises(ValueError, match="record 1"):
        find_secrets(["ok", None], [{"kind": "strings", "values": ["ok"]}])


def test_presidio_pii_offline():
    texts = [
        "Hi, my name is John Smith and you can call me at 212-555-0199.",
        "Please email alice.jones@example.com about the invoice.",
        "The weather in the park was lovely today.",
    ]
    idx = find_secrets(texts, [{"kind": "pii"}])
    got = dict(zip(idx.values, idx.types, strict=True))
    assert got.get("john smith") == "PERSON"
    assert got.get("2125550199") == "PHONE_NUMBER"
    assert got.get("alice.jones@example.com") == "EMAIL_ADDRESS"
    priv, pub = idx.split()
    assert priv.tolist() == [0, 1] and pub.tolist() == [2]
    rep = idx.split_report()
    assert rep["per_type"]["PERSON"]["records_with"] == 1
    assert np.all(idx.membership.toarray().sum(axis=0) == 1)
