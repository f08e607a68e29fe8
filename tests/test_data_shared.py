"""The loader on the real shared data sets (skipped when ../shared/data is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth.config import load_config
from dpsynth.data import check_dataset, load_dataset

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytestmark = pytest.mark.data


def test_yelp_dev(shared_data: Path) -> None:
    # the declared (public) domain of examples/yelp-augpe.yaml covers every record
    values = load_config(EXAMPLES / "yelp-augpe.yaml").data.declared_label_values()
    ds = load_dataset(shared_data / "yelp" / "dev.csv", "text", ["label1", "label2"],
                      label_values=values)
    assert len(ds) == 5000
    _, categories = ds.label_codes("label1")
    _, stars = ds.label_codes("label2")
    assert len(categories) == 10 and all(c.startswith("Business Category: ") for c in categories)
    assert len(stars) == 5
    codes, joint = ds.joint_label_codes()
    assert len(joint) == 50 and codes.max() <= 49
    assert min(len(t) for t in ds.texts) > 0
    assert (
        ds.fingerprint()
        == load_dataset(
            shared_data / "yelp" / "dev.csv", "text", ["label1", "label2"]
        ).fingerprint()
    )


def test_banking77_train(shared_data: Path) -> None:
    path = shared_data / "banking77" / "train.csv"
    values = load_config(EXAMPLES / "banking-wasp.yaml").data.declared_label_values()
    ds = load_dataset(path, "text", ["category"], label_values=values)
    assert len(ds) == 10003
    _, intents = ds.label_codes("category")
    assert len(intents) == 77 and "card_arrival" in intents
    assert set(ds.labels["category"]) == set(intents)  # examples/banking77-intents.txt is complete
    report = check_dataset(path, "text", ["category"])
    assert report.ok
    assert report.summary["rows"] == 10003
    assert len(report.summary["labels"]["category"]) == 77
    assert report.summary["text_words"]["min"] >= 1


def test_no_real_banking77_message_is_dropped_as_off_task(shared_data: Path) -> None:
    """drop_off_task's rules (commentary, the assistant's voice, a text about the writer) and
    the refusal rule keep every real Banking77 message: they drop what a customer never
    writes, not what a customer writes."""
    import pandas as pd

    from dpsynth.evolution.prompts import clean_generation

    writer = load_config(EXAMPLES / "banking-wasp.yaml").prompts.writer
    assert writer
    for split in ("train", "test"):
        texts = pd.read_csv(shared_data / "banking77" / f"{split}.csv")["text"]
        dropped = [i for i, t in enumerate(texts)
                   if clean_generation(t, 1, drop_off_task=True, writer=writer) is None]
        assert dropped == [], f"{split}.csv rows {dropped[:5]}"


@pytest.mark.parametrize(("path", "writer", "most"), [
    ("banking77/train.csv", "a customer of an online bank", 0.0),
    ("yelp/dev.csv", "", 0.006),
])
def test_the_filters_keep_real_records(shared_data: Path, path: str, writer: str,
                                       most: float) -> None:
    """The public filters that keep chatter out of a release refuse (almost) no real record:
    none of Banking77's messages, at most 0.6 % of Yelp's reviews (measured 0.48 %)."""
    import pandas as pd

    from dpsynth.evolution.prompts import clean_generation

    texts = pd.read_csv(shared_data / path)["text"].astype(str).tolist()
    refused = sum(clean_generation(t, 1, max_chars=10**6, drop_off_task=True, writer=writer)
                  is None for t in texts)
    assert refused / len(texts) <= most
