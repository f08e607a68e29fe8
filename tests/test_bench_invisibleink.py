"""benchmarks/bench_invisibleink.py's own logic (issue 45): the classes it gives invink on a
job of two label columns, the small classes it skips only when told, the release cut per
class, and a gap closed only where there is a gap. invink itself is not run here (it lives in
its own environment)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_invisibleink as ink  # noqa: E402

DOMAIN = {"label1": ["Bars", "Grocery"], "label2": ["1.0", "5.0"]}


def _private() -> pd.DataFrame:
    rows = ([("bar one", "Bars", "5.0")] * 9 + [("shop", "Grocery", "1.0")] * 3
            + [("bar low", "Bars", "1.0")] * 14)
    return pd.DataFrame(rows, columns=["text", "label1", "label2"])


def _args(**over: object) -> argparse.Namespace:
    base = {"batch": 8, "per_intent": 1, "fewer_where_small": False, "prompts": "side_by_side",
            "dataset": "yelp"}
    return argparse.Namespace(**{**base, **over})


def test_classes_are_every_pair_of_the_public_domain() -> None:
    assert ink.classes_of(DOMAIN) == [
        {"label1": "Bars", "label2": "1.0"}, {"label1": "Bars", "label2": "5.0"},
        {"label1": "Grocery", "label2": "1.0"}, {"label1": "Grocery", "label2": "5.0"}]


def test_a_class_too_small_for_its_text_exits_unless_told() -> None:
    classes = ink.classes_of(DOMAIN)
    with pytest.raises(SystemExit, match="--fewer-where-small"):
        ink.parts_of(_args(), _private(), classes)
    parts = ink.parts_of(_args(fewer_where_small=True, per_intent=2), _private(), classes)
    # 14 and 9 records: two texts and one; 3 and 0 records: none (no call)
    assert [(p["label"], p["num"], len(p["texts"])) for p in parts] == [
        ("Bars / 1.0", 2, 14), ("Bars / 5.0", 1, 9)]
    assert parts[0]["labels"] == {"label1": "Bars", "label2": "1.0"}
    assert parts[0]["description"] == "Bars. 1.0."
    auto = ink.parts_of(_args(per_intent="auto"), _private(), classes)
    assert [p["num"] for p in auto] == [2, 1]


def test_a_release_is_cut_by_its_joint_class(tmp_path: Path) -> None:
    release = tmp_path / "arm" / "release"
    release.mkdir(parents=True)
    rows = [{"text": "a", "labels": {"label1": "Bars", "label2": "1.0"}},
            {"text": "b", "labels": {"label1": "Bars", "label2": "5.0"}},
            {"text": "c", "labels": {"label1": "Bars", "label2": "1.0"}}]
    (release / "synthetic.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert ink._release_by_class(tmp_path, "arm") == {"Bars / 1.0": ["a", "c"],
                                                       "Bars / 5.0": ["b"]}
    real = ink._private_by_class(_private(), ["label1", "label2"])
    assert {k: len(v) for k, v in real.items()} == {"Bars / 1.0": 14, "Bars / 5.0": 9,
                                                     "Grocery / 1.0": 3}


def _scores(acc: float) -> dict[str, object]:
    return {"columns": {"label2": {"accuracy": acc, "macro_f1": 0.0}}}


def test_the_gap_closed_only_where_real_beats_zero_shot() -> None:
    ours = {"label2": {"accuracy": 0.45, "macro_f1": 0.0}}
    line = ink.gap_lines({"zero_shot": _scores(0.35), "real": _scores(0.55),
                          "aug_pe": _scores(0.50)}, ours)[0]
    assert "InvisibleInk +50 %" in line and "`aug_pe` +75 %" in line
    line = ink.gap_lines({"zero_shot": _scores(0.60), "real": _scores(0.50)}, ours)[0]
    assert "none, the real records score under zero-shot" in line
    assert ink.gap_lines({"zero_shot": _scores(0.35)}, ours) == []
