"""The Python API example of docs/python-api.md runs as written (every ```python block, in
order, in one namespace), on the real offline models, in a folder holding the files it
names."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def python_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text (```py blocks are illustrations only)."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.models
def test_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth.demo_corpus import write_demo_corpus

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    # the files the example names, small: the run and its evaluation embed every row of them
    paths = write_demo_corpus(tmp_path / "demo", n=60, seed=3, test_n=30)
    pd.read_csv(paths["private"]).to_csv(tmp_path / "messages.csv", index=False)
    pd.read_csv(paths["test"]).to_csv(tmp_path / "messages-test.csv", index=False)
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - our own doc
    result = namespace["result"]
    assert len(result.synthetic) == 6
    assert list(result.synthetic.columns) == ["text", "department"]
    assert result.privacy["epsilon"] <= 4.0 + 1e-9
    assert (tmp_path / "runs" / "messages-eps4" / "eval" / "report.html").is_file()
    assert "verdict" in namespace["evaluation"]
