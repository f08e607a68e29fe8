"""DP-SynRAG's public candidate set (docs/methods.md §4, step 4): built from public inputs and
released values only, sampled exactly, charged as over the whole vocabulary."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpsynth.methods.synrag.private_prediction import (
    Shortcut,
    private_predict,
    private_predict_shortcut,
)
from dpsynth.methods.synrag.support import (
    make_support,
    term_forms,
    term_token_ids,
    top_tokens,
)
from dpsynth.privacy import Accountant, PrivacyConfigError, PrivacySession, make_noise_source
from fakes import EOS_ID, FakeGenerator
from test_release_check import private_rows


class ScriptedSession:
    """Releases a fixed token script whatever z says, and records each call's candidate set:
    what the candidate set is made of, seen from the mechanism's side."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.supports: list[list[int] | None] = []
        self.sizes: list[int] = []

    def private_token(self, key: str, z: np.ndarray, clip: float, temperature: float,
                      support: np.ndarray | None = None) -> int:
        self.supports.append(None if support is None else np.asarray(support).tolist())
        self.sizes.append(int(np.asarray(z).size))
        return self.script[len(self.supports) - 1]

    def release_external(self, key: str, event: object, compute: Any) -> Any:
        return compute()

    noise = make_noise_source("seeded", 0)


def _support(gen: FakeGenerator, top: int = 5):
    return make_support(gen, term_token_ids(gen, ["fever", "cough", "skin rash"]), "throat",
                        top)


OPTS = {"instruction": "Rephrase the document.", "tokens": 6, "clip": 0.5,
        "temperature": 1.0, "max_doc_tokens": 32}


def test_term_forms_and_fixed_ids() -> None:
    assert term_forms("vultes disorder") == sorted(
        {"vultes disorder", " vultes disorder", "Vultes disorder", " Vultes disorder",
         "Vultes Disorder", " Vultes Disorder"})
    gen = FakeGenerator()
    sup = _support(gen)
    want = {*gen.encode("fever cough skin rash throat"), EOS_ID}
    assert set(sup.fixed.tolist()) == want
    assert list(top_tokens(np.array([0.0, 3.0, 1.0, 3.0, 2.0]), 3)) == [1, 3, 4]


@pytest.mark.parametrize("shortcut", [False, True])
def test_the_candidate_set_never_depends_on_the_documents(shortcut: bool) -> None:
    """Same released tokens, different private documents (or none): the same candidate set at
    every step; each z has one entry per candidate."""
    gen = FakeGenerator()
    rows = [r["text"] for r in private_rows(12)]
    script = [gen.encode(w)[0] for w in ("the", "fever", "pain", "a", "cough", "skin")]
    seen = []
    for docs in (rows[:3], rows[3:11], []):
        session = ScriptedSession(script)
        if shortcut:
            private_predict_shortcut(session, "c", gen, docs, support=_support(gen),
                                     shortcut=Shortcut(1e6, 6, -1e9), **OPTS)
        else:
            private_predict(session, "c", gen, docs, support=_support(gen), **OPTS)
        assert session.sizes == [len(s) for s in session.supports]
        seen.append(session.supports)
    assert seen[0] == seen[1] == seen[2] and len(seen[0]) == 6
    # and it moves with the released prefix (the public model's top tokens)
    assert len({tuple(s) for s in seen[0]}) > 1


def test_tokens_are_drawn_from_the_candidates_with_their_softmax(tmp_path) -> None:
    """The session's supported release: support[i] with probability softmax(z / tau)[i]
    (no cut inside the set), charged (1/2)(c / tau)^2 like a full-vocabulary token."""
    support = np.array([3, 17, 40, 41, 90, 95])
    z = np.array([2.0, 1.0, 0.0, -1.0, -3.0, -3.0])
    tau = 2.0
    session = PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 5))
    n = 600
    draws = [session.private_token(f"t{i}", z, 0.1, tau, support=support) for i in range(n)]
    assert set(draws) <= set(support.tolist())
    counts = np.array([draws.count(int(t)) for t in support])
    p = np.exp(z / tau) / np.exp(z / tau).sum()
    assert stats.chisquare(counts, n * p).pvalue > 1e-3
    assert session.accountant.rho() == pytest.approx(n * 0.5 * (0.1 / tau) ** 2)
    # a resumed session replays the stored token ids
    again = PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 99))
    assert [again.private_token(f"t{i}", z, 0.1, tau, support=support)
            for i in range(n)] == draws


@pytest.mark.parametrize("support", [np.array([1, 2]), np.array([1, 1, 2, 3, 4, 5])])
def test_a_support_that_does_not_match_z_is_refused(tmp_path, support) -> None:
    session = PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 5))
    with pytest.raises(PrivacyConfigError, match="support"):
        session.private_token("t", np.zeros(6), 0.1, 1.0, support=support)
    assert session.accountant.rho() == 0.0


@pytest.mark.parametrize("lead", [False, True])
def test_private_prediction_over_the_candidates(tmp_path, lead: bool) -> None:
    """Every released token is a candidate of its step: the fixed ids or the public model's
    top tokens given the released prefix (recomputed here from the public prompt). With a
    cluster prompt (the released keyword in the instruction, a public lead): the public
    model's prompt ends with the same lead as the documents', and the text starts with it."""
    from dpsynth.methods.synrag.private_prediction import Rephrase, prompt_parts

    gen = FakeGenerator()
    sup = _support(gen, top=4)
    docs = [r["text"] for r in private_rows(8)]
    prompt = (Rephrase("Rephrase the note on {keyword}.", "Symptoms of {keyword} are")
              .for_keyword("skin rash") if lead else Rephrase(OPTS["instruction"]))
    with PrivacySession(tmp_path, Accountant("zcdp"), make_noise_source("seeded", 2)) as s:
        pred = private_predict(s, "c", gen, docs, support=sup,
                               **{**OPTS, "tokens": 12, "instruction": prompt})
    prefix, suffix = prompt_parts(gen, prompt.instruction)
    public = gen.encode_prompt(prefix) + gen.encode(suffix + prompt.lead)
    for n, tok in enumerate(pred.token_ids):
        row = gen.next_token_logits_ids([public + pred.token_ids[:n]])[0]
        assert tok in set(sup.at(row).tolist())
    assert pred.steps == len(pred.token_ids) or pred.steps == len(pred.token_ids) + 1
    if lead:
        assert prompt == Rephrase("Rephrase the note on skin rash.",
                                  "Symptoms of skin rash are")
        assert pred.text.startswith("Symptoms of skin rash are")
        assert prompt.parts(gen) == (prefix, suffix + "Symptoms of skin rash are")


def test_a_closing_is_post_processing(tmp_path) -> None:
    """synrag.closing: the same seeded build with and without it draws the same tokens at the
    same charge, no model sees it (same prompt parts), and the released text ends with it,
    the cluster's released keyword filled in."""
    from dpsynth.methods.synrag.config import SynRAGConfig
    from dpsynth.methods.synrag.private_prediction import join_closing, rephrase_of

    gen = FakeGenerator()
    docs = [r["text"] for r in private_rows(8)]
    preds, rhos, prompts = [], [], []
    for closing in ("", "Diagnosis: {keyword}."):
        cfg = SynRAGConfig(rephrase_instruction="Rephrase the note on {keyword}.",
                           lead="Symptoms of {keyword} are", closing=closing)
        prompt = rephrase_of(cfg, "skin rash")
        with PrivacySession(tmp_path / f"s{len(preds)}", Accountant("zcdp"),
                            make_noise_source("seeded", 2)) as s:
            preds.append(private_predict(s, "c", gen, docs, support=_support(gen, top=4),
                                         **{**OPTS, "tokens": 12, "instruction": prompt}))
            rhos.append(s.accountant.rho())
        prompts.append(prompt)
    plain, closed = preds
    assert closed.token_ids == plain.token_ids and rhos[0] == rhos[1] > 0
    assert prompts[0].parts(gen) == prompts[1].parts(gen)
    assert closed.text == join_closing(plain.text, "Diagnosis: skin rash.")
    assert closed.text.endswith(" Diagnosis: skin rash.") and closed.text != plain.text
    assert join_closing("", "Done.") == "Done." and join_closing("a ", "b") == "a b"


@pytest.mark.parametrize("require", [False, True])
def test_an_empty_knowledge_base_warns_and_fails_only_when_asked(tmp_path, monkeypatch,
                                                                 require) -> None:
    """`rag build` whose KB comes out empty: a warning saying what to change, exit 0; exit 3
    with --require-passages (the real build, with the fake models passed in)."""
    from pathlib import Path

    from typer.testing import CliRunner

    import dpsynth.api as build
    from dpsynth.cli import app
    from dpsynth.demo_corpus import write_demo_corpus
    from fakes import FakeEmbedder

    real = build.build_kb
    monkeypatch.setattr(build, "build_kb", lambda *a, **k: real(
        *a, generator=FakeGenerator(), embedder=FakeEmbedder(), **k))
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    data = write_demo_corpus(tmp_path / "data", n=30, seed=0)["private"]
    example = Path(__file__).parents[1] / "examples" / "tiny-synrag.yaml"
    args = ["rag", "build", str(example), "-o", str(tmp_path / "kb"), "--set",
            f"data.path={data}", "--set", "privacy.noise=seeded", "--set", "privacy.seed=1",
            "--set", "synrag.min_noisy_count=1000000"]
    res = CliRunner().invoke(app, args + (["--require-passages"] if require else []))
    assert res.exit_code == (3 if require else 0), res.output
    assert "knowledge base is empty" in res.output
    summary = (tmp_path / "kb" / "release" / "summary.json").read_text()
    assert "synrag.clusters" in summary or "nothing above noise" in summary


def test_each_document_gets_a_stepper_row_of_its_own() -> None:
    """open_documents (the private prediction's stepper) on a generator without its own
    rows-apart stepper: one stepper per document, each opened with that document's prompt
    alone (no batch whose padding or size another document sets); documents longer than
    max_doc_tokens are cut to fit the public width, and counted."""
    from dpsynth.methods.synrag.private_prediction import document_width, open_documents

    gen = FakeGenerator()
    opened: list[list[str]] = []
    real = gen.open_stepper

    def recording(prompts: Any, shared_prefix: str = "") -> Any:
        opened.append(list(prompts))
        return real(prompts, shared_prefix)

    gen.open_stepper = recording  # type: ignore[method-assign]
    docs = ["fever cough", "rash " * 40, "knee pain"]
    suffix = " Rephrased:"
    stepper, cut = open_documents(gen, docs, "Rephrase this.", suffix, 8)
    assert stepper is not None and stepper.batch_size == 3 and cut == 1
    assert [len(p) for p in opened] == [1, 1, 1]
    assert all(len(gen.encode(p[0])) <= document_width(gen, suffix, 8) for p in opened)
    assert opened[0] == ["fever cough" + suffix] and opened[2] == ["knee pain" + suffix]
    alone, _ = open_documents(gen, docs[:1], "Rephrase this.", suffix, 8)
    np.testing.assert_array_equal(stepper.logits()[0], alone.logits()[0])
    stepper.advance(3)
    alone.advance(3)
    np.testing.assert_array_equal(stepper.logits_at([1, 2, 5])[0], alone.logits_at([1, 2, 5])[0])
    assert open_documents(gen, [], "Rephrase this.", suffix, 8) == (None, 0)
