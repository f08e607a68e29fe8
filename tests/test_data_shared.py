"""The loader on the real shared data sets (skipped when ../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.data import check_dataset, load_dataset

pytestmark = pytest.mark.data


def test_yelp_dev(shared_data: Path) -> None:
    ds = load_dataset(shared_data / "yelp" / "dev.csv", "text", ["label1", "label2"])
    assert len(ds) == 5000
    _, categories = ds.label_codes("label1")
    _, stars = ds.label_codes("label2")
    assert len(categories) == 10 and all(c.startswith("Business Category: ") for c in categories)
    assert len(stars) == 5
    codes, joint = ds.joint_label_codes()
    assert len(joint) <= 50 and codes.max() == len(joint) - 1
    assert min(len(t) for t in ds.texts) > 0
    assert (
        ds.fingerprint()
        == load_dataset(
            shared_data / "yelp" / "dev.csv", "text", ["label1", "label2"]
        ).fingerprint()
    )


def test_banking77_train(shared_data: Path) -> None:
    path = shared_data / "banking77" / "train.csv"
    ds = load_dataset(path, "text", ["category"])
    assert len(ds) == 10003
    _, intents = ds.label_codes("category")
    assert len(intents) == 77 and "card_arrival" in intents
    report = check_dataset(path, "text", ["category"])
    assert report.ok
    assert report.summary["rows"] == 10003
    assert len(report.summary["labels"]["category"]) == 77
    assert report.summary["text_words"]["min"] >= 1
