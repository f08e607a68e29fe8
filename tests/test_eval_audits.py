"""Privacy audits: DCR, membership inference, PII leakage, canaries."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth.eval.audits import (
    canary_similarity,
    count_canary_hits,
    dcr_audit,
    find_phones,
    insert_canaries,
    membership_inference,
    pii_leakage,
)
from dpsynth.eval.common import MetricUnavailable


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture()
def clouds():
    rng = np.random.default_rng(0)
    private = _unit(rng.normal(size=(300, 32)))
    holdout = _unit(rng.normal(size=(300, 32)))
    independent = _unit(rng.normal(size=(200, 32)))
    copies = _unit(private + rng.normal(size=private.shape) * 0.01)
    return private, holdout, independent, copies


def test_mia_auc_near_half_for_independent_and_high_for_copies(clouds):
    private, holdout, independent, copies = clouds
    null = membership_inference(independent, private, holdout)
    assert 0.4 < null["auc"] < 0.6
    assert null["tpr_at_fpr"]["0.01"] < 0.1
    leak = membership_inference(copies, private, holdout)
    assert leak["auc"] > 0.99
    assert leak["tpr_at_fpr"]["0.01"] > 0.9 and leak["tpr_at_fpr"]["0.1"] > 0.9
    small = membership_inference(copies, private, holdout[:50])
    assert "unavailable" in small["tpr_at_fpr"]["0.01"]
    assert isinstance(small["tpr_at_fpr"]["0.1"], float)


def test_dcr_gap_detects_copying(clouds):
    private, holdout, independent, copies = clouds
    null = dcr_audit(independent, private, holdout)
    assert not null["memorisation_signal"]
    assert abs(null["share_closer_to_private"] - 0.5) < 0.12
    assert null["near_copies_private"] == 0
    leak = dcr_audit(copies[:100], private, holdout)
    assert leak["memorisation_signal"]
    assert leak["gap"] > 0.3 and leak["p_value"] < 1e-6
    assert leak["share_closer_to_private"] == 1.0
    assert leak["near_copies_private"] == 100 and leak["near_copies_holdout"] == 0
    with pytest.raises(MetricUnavailable):
        dcr_audit(copies[:1], private, holdout)


def test_insert_canaries_marks_exactly_the_chosen_records():
    texts = [f"record number {i}." for i in range(50)]
    out, idx = insert_canaries(texts, "my pin is 4242 ZEBRA", copies=7, seed=3)
    assert len(idx) == 7 and len(set(idx)) == 7 and idx == sorted(idx)
    for i, (a, b) in enumerate(zip(texts, out, strict=True)):
        if i in idx:
            assert b == a + " my pin is 4242 ZEBRA"
        else:
            assert a == b
    assert insert_canaries(texts, "x y", 7, seed=3)[1] == idx  # seeded
    with pytest.raises(ValueError, match="exceeds"):
        insert_canaries(texts, "c", 51)
    with pytest.raises(ValueError, match="empty"):
        insert_canaries(texts, "  ", 1)


def test_count_canary_hits_exact_near_and_none():
    canary = "the vault code of Orla Quennell is 7341-ZEBRA-0926"
    outputs = [
        "Note: THE VAULT CODE of orla quennell is 7341 zebra 0926!",  # exact (case/punct)
        "I think the vault code of Orla Quenell is 7341-ZEBRA-0962 now",  # near (typos)
        "the vault is closed today and nobody knows a code",  # neither
        "Orla Quennell",  # partial mention only
    ]
    hits = count_canary_hits(outputs, canary)
    assert hits["exact"] == 1 and hits["near"] == 1 and hits["outputs"] == 4
    assert canary_similarity(outputs[2], canary) < 0.5
    assert count_canary_hits(outputs, canary, threshold=0.99)["near"] == 0
    # normalised edit similarity: one substitution in the 17 characters of "the code is zebra"
    assert canary_similarity("The code is zebre.", "the code is zebra") == pytest.approx(
        1 - 1 / 17)


def test_pii_leakage_finds_planted_values_only():
    private_texts = [
        "Patient Maria Velasquez, call (415) 555-0199 or maria.v@example.org about the rash.",
        "Jon Sutter reports chest pain; phone 212.555.0147.",
    ]
    private_values = {"patient_name": ["Maria Velasquez", "Jon Sutter"],
                      "phone": ["(415) 555-0199", "212.555.0147"],
                      "email": ["maria.v@example.org", "jon.s@example.org"]}
    outputs = [
        "Please reach Maria Velasquez at +1 415 555 0199.",  # name + phone leaked
        "Contact jon.s@example.org for details.",  # e-mail from the private column
        "Call Pat Doe on (650) 555-0123 or pat@other.net.",  # PII, but not private
        "No personal data here.",
    ]
    res = pii_leakage(outputs, private_texts, private_values)
    assert res["phone"]["leaked"] == 1 and res["phone"]["detected"] == 2
    assert res["email"]["leaked"] == 1 and res["email"]["detected"] == 2
    assert res["name"]["leaked"] == 1
    assert res["records_with_any_leak"] == 2 and res["n_outputs"] == 4
    assert res["leak_rate"] == pytest.approx(0.5)
    flat = repr(res)
    assert "Velasquez" not in flat and "555" not in flat  # numbers only
    clean = pii_leakage(outputs[2:], private_texts, private_values)
    assert clean["records_with_any_leak"] == 0
    # without PII columns the private names, phones and e-mails come from the private texts
    # (Presidio's analyzer): the full name and the phone still leak, the title is ignored
    texts_only = pii_leakage(["Dr. Maria Velasquez called from 415-555-0199."], private_texts)
    assert texts_only["name"]["leaked"] == 1 and texts_only["phone"]["leaked"] == 1
    assert texts_only["email"]["detected"] == 0


def test_phone_detector_ignores_dates():
    assert find_phones("on 2023-01-05 call 555-867-5309") == {"5558675309"}
