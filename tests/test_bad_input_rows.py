"""Bad input refused by row, naming file, row and field and never the text (issue 43): control
characters in a record (a NUL was accepted), and an evaluation test file whose label lies
outside the run's domain (it was scored as an extra class)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dpsynth.data import DataError, load_dataset
from test_budget_bypass import cli, env, generate  # noqa: F401  (the fixture)

SECRET = "Maria's diagnosis"


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
@pytest.mark.parametrize("bad", ["\x00", "\x07", "\x1b[31m", "\x7f", "\x85"])
def test_control_characters_are_refused_by_row(tmp_path: Path, suffix: str, bad: str) -> None:
    rows = [{"text": "a fine record\twith a tab\nand a line break", "label": "a"},
            {"text": f"{SECRET}{bad}", "label": "a"},
            {"text": "another fine record", "label": f"b{bad}"}]
    path = tmp_path / f"data{suffix}"
    frame = pd.DataFrame(rows)
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        frame.to_parquet(path)
    with pytest.raises(DataError) as err:
        load_dataset(path, "text", ["label"])
    found = [(p.row, p.field) for p in err.value.problems]
    assert found == [(2, "text"), (3, "label")], found
    assert all("control character" in p.message for p in err.value.problems)
    assert SECRET not in str(err.value)
    rows[1]["text"], rows[2]["label"] = SECRET, "b"  # the same file without them loads
    (pd.DataFrame(rows).to_csv(tmp_path / "ok.csv", index=False))
    assert len(load_dataset(tmp_path / "ok.csv", "text", ["label"])) == 3


def test_an_evaluation_label_outside_the_domain_is_refused_by_row(env: dict[str, Any]  # noqa: F811
                                                                   ) -> None:
    assert generate(env, "r1").exit_code == 0, "the run to evaluate"
    test = env["tmp"] / "test.csv"
    test.write_text("text,intent\nwhere is my card,card_arrival\nhello there,greeting\n"
                    "refund please,refund\n")
    res = cli("eval", env["tmp"] / "r1", "--test", test, "--json")
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "test.csv, row 2, field 'intent'" in out and "declared values" in out, out
    assert "greeting" not in out and "Traceback" not in out
