"""The label check (issue 44): a candidate that reads as another label's text is refused and
regenerated, on public inputs only; a column the embedder does not separate is left alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.api import run_generation
from dpsynth.config import parse_config
from dpsynth.evolution.label_check import LabelCheck, kappa, own_ranks, top_k_for
from dpsynth.llm import GenerationRequest
from fakes import FakeEmbedder, FakeGenerator, _rng
from test_release_check import LABELS, pe_config, private_rows, write_csv

# ----------------------------------------------------------------------------- the pure math


def test_own_ranks_count_the_values_nearer_than_the_own_one() -> None:
    values = np.eye(3, dtype=np.float32)
    texts = np.array([[0.9, 0.1, 0.0], [0.2, 0.7, 0.5], [0.0, 0.6, 0.8]], dtype=np.float32)
    assert own_ranks(texts, values, np.array([0, 0, 2])).tolist() == [0, 2, 0]


def test_kappa_is_zero_at_chance_and_one_when_every_text_passes() -> None:
    assert kappa(0.1, 1, 10) == pytest.approx(0.0)
    assert kappa(1.0, 1, 10) == pytest.approx(1.0)
    assert kappa(0.55, 1, 10) == pytest.approx(0.5)
    assert kappa(1.0, 2, 2) == 0.0  # every value within the top k: nothing to judge


def test_top_k_grows_with_the_label_domain() -> None:
    assert [top_k_for(n) for n in (2, 10, 39, 40, 77, 150)] == [1, 1, 1, 2, 3, 7]


def _check(columns: dict[str, list[str]]) -> LabelCheck:
    emb = FakeEmbedder(dim=256)
    return LabelCheck(columns, lambda col, v: v, emb)


def test_a_separated_column_is_checked_and_its_off_label_texts_refused() -> None:
    check = _check({"topic": ["billing", "clinical", "travel"]})
    rng = np.random.default_rng(0)
    labels, texts = [], []
    for i in range(60):
        own = ["billing", "clinical", "travel"][i % 3]
        written = own if i % 4 else ["billing", "clinical", "travel"][(i + 1) % 3]
        labels.append({"topic": own})
        texts.append(f"{written} " + " ".join(f"w{int(x)}" for x in rng.integers(0, 50, 3)))
    refused = check.refused(texts, labels)
    assert check.gate == {"topic": True}
    off = np.array([not t.startswith(lab["topic"]) for t, lab in zip(texts, labels,
                                                                       strict=True)])
    assert refused[off].mean() > 0.9 and refused[~off].mean() < 0.1


def test_a_column_the_embedder_does_not_separate_is_not_checked() -> None:
    check = _check({"stars": ["one", "two", "three", "four", "five"]})
    rng = np.random.default_rng(1)
    texts = [" ".join(f"w{int(x)}" for x in rng.integers(0, 50, 6)) for _ in range(80)]
    labels = [{"stars": ["one", "two", "three", "four", "five"][i % 5]} for i in range(80)]
    refused = check.refused(texts, labels)
    assert check.gate == {"stars": False}
    assert not refused.any()


def test_the_gate_waits_for_enough_candidates_then_holds() -> None:
    check = _check({"topic": ["billing", "clinical"]})
    labels = [{"topic": "billing"}] * 12
    assert not check.refused(["clinical case"] * 12, labels).any()  # a dozen: not judged
    assert check.gate is None
    many = [f"billing {i}" if i % 5 else f"clinical {i}" for i in range(40)]
    refused = check.refused(many, [{"topic": "billing"}] * 40)
    assert check.gate == {"topic": True} and refused.sum() == 8
    later = LabelCheck(check.domain, lambda col, v: v, check.embedder, gate=check.gate)
    assert later.refused(["clinical case"] * 2, labels[:2]).all()  # kept, not re-judged


def test_a_gate_that_is_significant_by_luck_alone_stays_closed() -> None:
    check = _check({"topic": ["billing", "clinical"]})
    # 19 of 30 on label against a chance of 1 in 2: kappa 0.27, p = 0.10
    texts = [f"billing {i}" if i < 19 else f"clinical {i}" for i in range(30)]
    check.refused(texts, [{"topic": "billing"}] * 30)
    assert check.gate == {"topic": False}


# ----------------------------------------------------------------------------- in a run


class _OffLabelGenerator(FakeGenerator):
    """Writes its prompt's label word first, except for about 2 in 5 texts, which start with
    the other label's word: another label's text."""

    def _text(self, request: GenerationRequest, occurrence: int) -> str:
        prompt = request.prompt if isinstance(request.prompt, str) else \
            " ".join(m["content"] for m in request.prompt)
        own = next(lab for lab in LABELS if lab in prompt.split("Text:")[0])
        rng = _rng("off-label", prompt, request.params.seed, occurrence)
        word = own if rng.random() > 0.4 else next(lab for lab in LABELS if lab != own)
        rest = " ".join(f"w{int(x)}" for x in rng.integers(0, 200, 9))
        return f"{word.capitalize()} {rest}."


def _run(tmp_path: Path, name: str, check: bool) -> Path:
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(120)),
                    **{"synthesis.samples": 40, "synthesis.label_check": check,
                       "synthesis.retries": 3,
                       "privacy.epsilon": 8.0})
    cfg["privacy"]["ledger"] = str(tmp_path / f"{name}.ledger.json")
    return Path(run_generation(parse_config(cfg), tmp_path / name, progress=False,
                               generators=[_OffLabelGenerator("fake-g0")],
                               embedder=FakeEmbedder(dim=256)))


def _on_label_share(run: Path, file: str) -> float:
    rows = [json.loads(x) for x in (run / "release" / file).read_text().splitlines() if x]
    return float(np.mean([r["text"].lower().startswith(r["labels"]["label"]) for r in rows]))


def _stats(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "stats.jsonl").read_text().splitlines() if x]


def test_a_run_refuses_another_labels_text_and_says_how_often(tmp_path) -> None:
    on, off = _run(tmp_path, "on", True), _run(tmp_path, "off", False)
    for file in ("zero_shot.jsonl", "synthetic.jsonl"):
        assert _on_label_share(on, file) >= 0.85
        assert _on_label_share(off, file) <= 0.75  # the same generator, unchecked
    stats = _stats(on)
    assert stats[0]["off_label_share_initial"] > 0.2  # about 2 in 5 refused, then retried
    assert all(s["off_label_share"] <= s["filtered_share"] for s in stats)
    assert all(s["off_label_share"] == 0.0 for s in _stats(off))
    assert "label check of generator 0 (init): label checked" in (on / "log.txt").read_text()
    summary = json.loads((on / "release" / "summary.json").read_text())
    assert summary["off_label"] > 0


def test_a_resumed_run_keeps_the_gate_the_first_attempt_decided(tmp_path) -> None:
    from dpsynth.hooks import RunHooks
    from faults import StopAt

    whole = _run(tmp_path, "whole", True)
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(120)),
                    **{"synthesis.samples": 40, "synthesis.retries": 3,
                       "privacy.epsilon": 8.0})
    cfg["privacy"]["ledger"] = str(tmp_path / "cut.ledger.json")
    with pytest.raises(KeyboardInterrupt):  # stopped after the initial pool's checkpoint
        run_generation(parse_config(cfg), tmp_path / "cut", progress=False,
                       generators=[_OffLabelGenerator("fake-g0")],
                       embedder=FakeEmbedder(dim=256),
                       hooks=RunHooks(on_checkpoint=StopAt(1, "evolution")))
    resumed = Path(run_generation(tmp_path / "cut" / "config.yaml", tmp_path / "cut",
                                  resume=True, progress=False,
                                  generators=[_OffLabelGenerator("fake-g0")],
                                  embedder=FakeEmbedder(dim=256)))
    log = (resumed / "log.txt").read_text()
    assert log.count("label check of generator 0") == 1  # decided once, before the stop
    for file in ("zero_shot.jsonl", "synthetic.jsonl"):
        assert (resumed / "release" / file).read_text() == \
            (whole / "release" / file).read_text()


@pytest.mark.parametrize(("counts", "warned", "first"), [
    ({"sent": 100, "rejected": 40, "off_label": 30}, False, None),
    ({"sent": 100, "rejected": 58, "off_label": 31}, True, "another label's text"),  # the demo
    ({"sent": 100, "rejected": 70, "off_label": 10}, True, "refused by the filters"),
    ({"sent": 100, "rejected": 61, "off_label": 40}, True, "another label's text"),  # Banking77
    ({"sent": 100, "rejected": 80, "off_label": 0}, True, "refused by the filters"),
    # short texts are their own part, not chatter
    ({"sent": 100, "rejected": 70, "off_label": 10, "short": 45}, True, "shorter than the"),
])
def test_the_closing_warning_says_when_most_generations_were_refused_and_why(
        tmp_path, counts: dict[str, int], warned: bool, first: str | None) -> None:
    """Above half refused in all (the report's caveat reads the same total), one warning names
    both parts, chatter and another label's text, each with its share, the larger first; at
    half or less, none."""
    from dpsynth.methods.loop import FilterShares
    from dpsynth.run_folder import RunDir

    class Counted:
        def counts(self) -> dict[str, int]:
            return counts

    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    FilterShares(Counted()).warn_if_mostly_filtered(run)  # type: ignore[arg-type]
    log = (run.root / "log.txt").read_text() if (run.root / "log.txt").exists() else ""
    assert ("warning:" in log) == warned
    if not warned:
        return
    off, short = counts["off_label"], counts.get("short", 0)
    chatter = counts["rejected"] - off - short
    assert f"{counts['rejected']}% of this run's generations were refused" in log
    assert (f"{chatter}% were refused by the filters" in log) == (chatter > 0)
    assert (f"{off}% were another label's text" in log) == (off > 0)
    assert (f"{short}% were shorter than the length band" in log) == (short > 0)
    parts = [p for p in ("refused by the filters", "another label's text", "shorter than the")
             if p in log]
    assert min(parts, key=log.index) == first
