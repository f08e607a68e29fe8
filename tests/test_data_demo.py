"""The built-in demo corpus: deterministic, realistic, secrets inside, fictional diseases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from dpsynth.data import load_dataset
from dpsynth.demo_corpus import (
    DEPARTMENTS,
    URGENCIES,
    demo_knowledge,
    demo_label_values,
    make_demo_corpus,
    write_demo_corpus,
)

COLUMNS = [
    "patient_id",
    "text",
    "department",
    "urgency",
    "disease",
    "patient_name",
    "phone",
    "email",
]
REAL_DISEASES = {
    "asthma", "diabetes", "influenza", "flu", "pneumonia", "bronchitis", "gastritis", "colitis",
    "arthritis", "osteoporosis", "migraine", "epilepsy", "eczema", "psoriasis", "acne",
    "dermatitis", "hypertension", "angina", "tuberculosis", "measles", "mumps", "gout",
    "lupus", "anemia", "hepatitis", "appendicitis", "tendinitis", "sinusitis", "meningitis",
    "parkinson's disease", "alzheimer's disease", "crohn's disease", "cushing's syndrome",
    "down syndrome", "lyme disease", "celiac disease", "scoliosis", "cardiomyopathy",
    "endocarditis", "enteritis", "neuropathy", "osteoarthritis", "bursitis", "emphysema",
}  # fmt: skip


@pytest.fixture(scope="module")
def corpus() -> pd.DataFrame:
    return make_demo_corpus(600, seed=0)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_demo_corpus(tmp_path_factory.mktemp("demo"), n=400, seed=3, test_n=200)


def test_columns_and_size(corpus: pd.DataFrame) -> None:
    assert list(corpus.columns) == COLUMNS
    assert len(corpus) == 600
    assert set(corpus["department"]) == {d[0] for d in DEPARTMENTS}
    assert set(corpus["urgency"]) == set(URGENCIES)


def test_deterministic_given_seed(corpus: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(make_demo_corpus(600, seed=0), corpus)
    other = make_demo_corpus(600, seed=1)
    assert not set(other["text"]) & set(corpus["text"])
    assert demo_knowledge(5) == demo_knowledge(5)
    assert [k["disease"] for k in demo_knowledge(5)] != [k["disease"] for k in demo_knowledge(6)]


def test_departments_unbalanced(corpus: pd.DataFrame) -> None:
    counts = corpus["department"].value_counts()
    assert len(counts) == 6
    assert counts.max() >= 2.5 * counts.min()
    assert counts.idxmax() == "Gastroenterology"
    assert counts.idxmin() == "Cardiology"


def test_every_row_carries_its_secrets(corpus: pd.DataFrame) -> None:
    for row in corpus.itertuples():
        assert row.patient_name in row.text, row.patient_id
        assert row.phone in row.text, row.patient_id
        assert row.email in row.text, row.patient_id
        assert re.search(r"\d{3}\D{1,2}\d{3}\D\d{4}", row.phone), row.phone
        assert re.fullmatch(r"[a-z0-9._]+@[a-z0-9.-]+\.[a-z]+", row.email), row.email


def test_patients_write_several_messages_consistently(corpus: pd.DataFrame) -> None:
    per_patient = corpus.groupby("patient_id")
    sizes = per_patient.size()
    assert sizes.max() >= 3
    assert (sizes >= 2).sum() >= 50
    assert 250 <= len(sizes) <= 500
    for col in ("patient_name", "phone", "email", "disease", "department"):
        assert (per_patient[col].nunique() == 1).all(), col
    # secrets are unique per patient
    firsts = per_patient.first()
    for col in ("patient_name", "phone", "email"):
        assert firsts[col].is_unique, col


def test_messages_vary_and_have_typos(corpus: pd.DataFrame) -> None:
    sentences = corpus["text"].str.count(r"[.!?](?:\s|$)")
    assert sentences.min() <= 1 and sentences.max() >= 5
    words = corpus["text"].str.split().str.len()
    assert words.min() < 30 < words.max()
    assert corpus["text"].is_unique
    # opening phrases (first three words, names removed) come from many templates
    openings = {
        " ".join(t.replace(n, "NAME").split()[:3])
        for t, n in zip(corpus["text"], corpus["patient_name"], strict=True)
    }
    assert len(openings) >= 15
    assert corpus["text"].str.contains("  ").sum() == 0
    # typos: words found in no template, knowledge entry or secret
    import inspect

    import dpsynth.demo_corpus as dc

    known = " ".join(
        [inspect.getsource(dc), json.dumps(demo_knowledge(0))]
        + corpus[["patient_name", "phone", "email"]].astype(str).agg(" ".join, axis=1).tolist()
    )
    known_words = set(re.findall(r"[a-z]+", known.lower()))
    typo_rows = [set(re.findall(r"[a-z]+", t.lower())) - known_words for t in corpus["text"]]
    share = sum(bool(w) for w in typo_rows) / len(corpus)
    assert 0.03 <= share <= 0.25, share


def test_diseases_are_fictional_and_tied_to_departments(corpus: pd.DataFrame) -> None:
    know = demo_knowledge(0)
    assert len(know) == 24
    names = [k["disease"] for k in know]
    assert len(set(names)) == 24
    for name in names:
        assert name.lower() not in REAL_DISEASES
        head = name.lower().replace("chronic ", "").replace("acute ", "").split("'")[0].split()[0]
        assert head not in REAL_DISEASES
    dept_of = {k["disease"]: k["department"] for k in know}
    assert (corpus["department"] == corpus["disease"].map(dept_of)).all()
    for k in know:
        assert len(k["symptoms"]) == 4
        assert k["drug"] in k["treatment"]
        assert k["disease"] in k["description"] and k["treatment"] in k["description"]
    # the text depends on the label: a disease's symptoms appear in its patients' messages
    sym_of = {k["disease"]: k["symptoms"] for k in know}
    pairs = list(zip(corpus["text"], corpus["disease"], strict=True))
    hits = [any(s in t for s in sym_of[d]) for t, d in pairs]
    assert sum(hits) >= 0.95 * len(corpus)
    mentioned = [d in t for t, d in pairs]
    assert 0.15 <= sum(mentioned) / len(corpus) <= 0.6


def test_urgency_cues_follow_the_label(corpus: pd.DataFrame) -> None:
    urgent = corpus[corpus["urgency"] == "urgent"]["text"]
    routine = corpus[corpus["urgency"] == "routine"]["text"]
    cue = r"urgent|today|asap|worried|scary|right away|as soon as possible|ER\b"
    assert urgent.str.contains(cue).mean() > 0.9
    assert routine.str.contains(cue).mean() < 0.1


def test_write_demo_corpus_splits_are_disjoint(written: dict[str, Path]) -> None:
    assert set(written) == {"private", "test", "knowledge"}
    private = pd.read_csv(written["private"], dtype=str, keep_default_na=False)
    test = pd.read_csv(written["test"], dtype=str, keep_default_na=False)
    assert (len(private), len(test)) == (400, 200)
    for col in ("text", "patient_id", "patient_name", "phone", "email"):
        assert not set(private[col]) & set(test[col]), col
    assert set(test["disease"]) <= set(private["disease"]) | {
        k["disease"] for k in demo_knowledge(3)
    }
    assert set(test["disease"]) & set(private["disease"])
    know = json.loads(written["knowledge"].read_text(encoding="utf-8"))
    assert know == demo_knowledge(3)
    pd.testing.assert_frame_equal(private, make_demo_corpus(400, seed=3).astype(str))


def test_demo_corpus_passes_validation(written: dict[str, Path]) -> None:
    ds = load_dataset(written["private"], "text", ["department", "urgency"], user="patient_id",
                      label_values=demo_label_values())
    assert len(ds) == 400
    assert ds.warnings == []
    _, classes = ds.label_codes("department")
    assert classes == [d[0] for d in DEPARTMENTS]
    assert set(ds.labels["urgency"]) <= set(URGENCIES)
    codes, joint = ds.joint_label_codes()
    assert len(joint) == 18 and len(set(codes.tolist())) <= 18
    assert len(set(ds.users or [])) < len(ds)
