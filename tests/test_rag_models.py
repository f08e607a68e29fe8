"""DP-SynRAG with the real SmolLM2 and MiniLM: batched private prediction, a tiny build end to
end (resume without redraw), `rag ask`, the HTTP service and the DP-RAG budget."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from dpsynth.methods.synrag.private_prediction import (
    clipped_sum,
    private_predict,
    prompt_parts,
)
from dpsynth.privacy import Accountant, BudgetExceededError, PrivacySession, make_noise_source
from faults import stop_at
from loopback import serve_in_thread

DOCS = [
    "I am Ann Lee. I have a red rash on my arms and a mild fever since Monday.",
    "Hello, this is Bob Stone; my knee hurts when I climb stairs and it is swollen.",
    "My cough has lasted two weeks and I feel short of breath at night.",
]
INSTR = "Rephrase the following document without altering the important information."


def separate_logit_sum(gen: Any, documents: Sequence[str], instruction: str,
                       clip: float, prefix_tokens: Sequence[int] = ()) -> np.ndarray:
    """Reference: z at the next step computed document by document (one unbatched
    forward pass per document, no shared cache) after the tokens ``prefix_tokens``."""
    prefix, suffix = prompt_parts(gen, instruction)
    rows = [gen.encode_prompt(prefix) + gen.encode(d + suffix) + list(prefix_tokens)
            for d in documents]
    logits = np.concatenate([gen.next_token_logits_ids([r]) for r in rows])
    return clipped_sum(logits, clip)


def test_stepper_sum_equals_per_document_computation(smollm) -> None:
    c = 0.5
    prefix, suffix = prompt_parts(smollm, INSTR)
    with smollm.open_stepper([d + suffix for d in DOCS], shared_prefix=prefix) as st:
        z1 = clipped_sum(st.logits(), c)
        ref1 = separate_logit_sum(smollm, DOCS, INSTR, c)
        np.testing.assert_allclose(z1, ref1, atol=2e-3)
        tok = int(np.argmax(ref1))
        st.advance(tok)
        z2 = clipped_sum(st.logits(), c)
    ref2 = separate_logit_sum(smollm, DOCS, INSTR, c, prefix_tokens=[tok])
    np.testing.assert_allclose(z2, ref2, atol=2e-3)
    assert np.abs(z1).max() <= len(DOCS) * c + 1e-9
    assert not np.allclose(z1, z2)


def test_candidate_logits_and_bf16_stepper(smollm) -> None:
    """logits_at(ids) computes exactly the ids' columns of the full logits; the bf16 stepper
    (synrag.logits_dtype) stays close to float32 (KL per token, cf. BENCHMARKS.md)."""
    from dpsynth.bench.private_prediction import _kl

    prefix, suffix = prompt_parts(smollm, INSTR)
    ids = np.array([5, 17, 300, 4096, int(smollm.vocab_size) - 1])
    rows = [d + suffix for d in DOCS]
    try:
        smollm.set_logits_dtype("float32")
        with smollm.open_stepper(rows, shared_prefix=prefix) as st:
            st.advance(int(smollm.encode(" The")[0]))
            full32 = st.logits()
            np.testing.assert_allclose(st.logits_at(ids), full32[:, ids], atol=1e-4)
            with pytest.raises(ValueError):
                st.logits_at(np.array([int(smollm.vocab_size)]))
        smollm.set_logits_dtype("bfloat16")
        with smollm.open_stepper(rows, shared_prefix=prefix) as st:
            st.advance(int(smollm.encode(" The")[0]))
            kl = _kl(full32, st.logits())
        assert 0 < kl.max() < 0.05, kl
    finally:
        smollm.set_logits_dtype("float32")


@pytest.mark.parametrize("dtype,bound", [("float32", 1e-5), ("bfloat16", 0.01)])
def test_openvino_stepper_matches_torch_float32(smollm, dtype, bound) -> None:
    """The OpenVINO stepper (synrag.stepper) reads the same prompts, padding and positions as
    the torch one: its next-token distribution stays within ``bound`` of float32 torch (mean
    KL per token: the issue's 0.01 for bf16; no token above 5x that), with and without a
    shared prefix, over three advances; logits_at is the full logits' columns; a closed
    stepper refuses."""
    from dpsynth.bench.private_prediction import _kl
    from dpsynth.llm.base import GenerationError

    prefix, suffix = prompt_parts(smollm, INSTR)
    ids = np.array([5, 17, 300, 4096, int(smollm.vocab_size) - 1])
    tokens = [int(t) for t in smollm.encode(" The patient has a rash")][:3]
    try:
        for shared in (True, False):
            rows = [d + suffix for d in DOCS] if shared else [prefix + d + suffix for d in DOCS]
            head = prefix if shared else ""
            smollm.set_logits_dtype("float32")
            smollm.set_stepper_engine("transformers")
            ref = smollm.open_stepper(rows, shared_prefix=head)
            smollm.set_logits_dtype(dtype)
            smollm.set_stepper_engine("openvino")
            with smollm.open_stepper(rows, shared_prefix=head) as st, ref:
                assert type(st).__name__ == "OpenVinoStepper"
                kls = [_kl(ref.logits(), st.logits())]
                for tok in tokens:
                    ref.advance(tok)
                    st.advance(tok)
                    kls.append(_kl(ref.logits(), st.logits()))
                np.testing.assert_allclose(st.logits_at(ids), st.logits()[:, ids], atol=1e-4)
            kl = np.concatenate(kls)
            assert kl.mean() < bound and kl.max() < 5 * bound, (shared, kl.mean(), kl.max())
            with pytest.raises(GenerationError):
                st.advance(tokens[0])
    finally:
        smollm.set_logits_dtype("float32")
        smollm.set_stepper_engine("transformers")


LONGER = ("I am Carl Moe. Since last week my joints ache every morning, my hands are stiff "
          "until noon, and yesterday a fever came with a rash on my chest and both arms.")


@pytest.mark.parametrize("engine,dtype", [("openvino", "bfloat16"), ("openvino", "float32"),
                                          ("transformers", "bfloat16")])
def test_each_documents_logits_are_its_own(smollm, engine, dtype) -> None:
    """The private prediction's stepper (open_documents, the production path): a document's
    logits are the same, bit for bit, whatever other documents share its cluster -- more of
    them than one decode pass holds, a longer one (which pads a batched stepper's rows), or
    none -- at every step, and its output layer's rows too. (A batched stepper moved a row's
    clipped logits by up to 0.03 in bf16 when another row came in: the sum's sensitivity was
    more than c; benchmarks/results/private_prediction.md.) And they stay close to float32.
    Small sizes (emulated bf16 on a CPU without it is slow): a width of 48 document tokens
    (LONGER, the longest, is 43 with the seam), two advances, two decode passes at most."""
    from dpsynth.bench.private_prediction import _kl
    from dpsynth.methods.synrag.private_prediction import open_documents

    prefix, suffix = prompt_parts(smollm, INSTR)
    tokens = [int(t) for t in smollm.encode(" The patient has a rash")][:2]
    ids = np.array([5, 17, 300, 4096])

    def first_row(docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
        st, cut = open_documents(smollm, docs, prefix, suffix, 48, rows=2)
        assert cut == 0 and st.batch_size == len(docs)
        with st:
            seen, at = [st.logits()[0]], [st.logits_at(ids)[0]]
            for tok in tokens:
                st.advance(tok)
                seen.append(st.logits()[0])
                at.append(st.logits_at(ids)[0])
        return np.stack(seen), np.stack(at)

    try:
        smollm.set_logits_dtype("float32")
        smollm.set_stepper_engine("transformers")
        with smollm.open_stepper([DOCS[0] + suffix], shared_prefix=prefix) as ref:
            want = [ref.logits()[0]]
            for tok in tokens:
                ref.advance(tok)
                want.append(ref.logits()[0])
        smollm.set_logits_dtype(dtype)
        smollm.set_stepper_engine(engine)
        alone, alone_at = first_row([DOCS[0]])
        # a longer one in its decode pass (it would pad a batched row) and one more than the
        # pass holds; a shorter one in its pass
        for others in ([LONGER, DOCS[1]], [DOCS[2]]):
            logits, at = first_row([DOCS[0], *others])
            np.testing.assert_array_equal(logits, alone)
            np.testing.assert_array_equal(at, alone_at)
        np.testing.assert_allclose(alone_at, alone[:, ids], atol=1e-4)
        kl = _kl(np.stack(want), alone)
        assert kl.mean() < 0.01 and kl.max() < 0.05, kl
    finally:
        smollm.set_logits_dtype("float32")
        smollm.set_stepper_engine("transformers")


@pytest.mark.models  # loads SmolLM2 twice itself (no fixture marks it)
def test_the_stepper_ignores_the_machine_load(monkeypatch) -> None:
    """The stepper runs on ``stepper_threads`` (the configured threads, else every core this
    process may use), never on the cores idle when the generator was loaded: a generator
    loaded while the machine looks busy (load 50, one idle core) gives the bf16 logits of one
    loaded at rest (load 0), bit for bit. (It compiled for the idle cores, one on a busy
    machine, where bf16 runs as f32: a seeded DP-SynRAG build released other text under
    load.)"""
    from dpsynth.llm import load_generator
    from dpsynth.llm.runtime import available_cores
    from dpsynth.methods.synrag.private_prediction import open_documents

    def loaded_at(load: float) -> Any:
        monkeypatch.setattr("os.getloadavg", lambda: (load, load, load))
        gen = load_generator("smollm2")
        assert gen.configured_threads is None
        assert gen.num_threads == (1 if load else available_cores())
        return gen

    def logits(gen: Any) -> np.ndarray:
        prefix, suffix = prompt_parts(gen, INSTR)
        gen.set_logits_dtype("bfloat16")
        gen.set_stepper_engine("openvino")
        st, _ = open_documents(gen, DOCS, prefix, suffix, 48, rows=2)
        with st:
            first = st.logits()
            st.advance(int(gen.encode(" The")[0]))
            return np.stack([first, st.logits()])

    calm = logits(loaded_at(0.0))
    np.testing.assert_array_equal(logits(loaded_at(50.0)), calm)


@pytest.mark.models  # loads SmolLM2 in a child process (no fixture marks it)
def test_openvino_stepper_on_one_thread() -> None:
    """bf16 on one inference thread kills the process inside OpenVINO's compile (SIGFPE,
    measured with OpenVINO 2026.4): on one thread the stepper compiles f32 instead, and steps.
    In a child process, since the failure would take the test worker with it."""
    import subprocess

    code = (
        "from dpsynth.llm import load_generator\n"
        "g = load_generator('smollm2', engine='transformers', num_threads=1)\n"
        "g.set_logits_dtype('bfloat16')\n"
        "g.set_stepper_engine('openvino')\n"
        "with g.open_stepper(['Hello there.', 'A rash.']) as st:\n"
        "    st.advance(int(st.logits()[0].argmax()))\n"
        "    print('stepped', type(st).__name__, st.logits().shape[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "stepped OpenVinoStepper 2" in done.stdout


def test_private_predict_charges_each_token(smollm, tmp_path) -> None:
    s = PrivacySession(tmp_path / "s", Accountant("zcdp"), make_noise_source("seeded", 0))
    pred = private_predict(s, "c0", smollm, DOCS, instruction=INSTR, tokens=3, clip=1.0,
                           temperature=1.0, max_doc_tokens=8)
    assert pred.truncated == 3  # every document is longer than 8 tokens: cut, not dropped
    assert 1 <= pred.steps <= 3
    assert s.accountant.rho() == pytest.approx(pred.steps * 0.5)
    again = private_predict(s, "c0", smollm, DOCS, instruction=INSTR, tokens=3, clip=1.0,
                            temperature=1.0, max_doc_tokens=8)
    assert again.token_ids == pred.token_ids  # stored releases replayed, not redrawn
    assert s.accountant.rho() == pytest.approx(pred.steps * 0.5)
    empty = private_predict(s, "c1", smollm, [], instruction=INSTR, tokens=3, clip=1.0,
                            temperature=1.0, max_doc_tokens=8)
    assert empty.steps >= 1  # an empty cluster still draws (uniform) tokens and is charged


def test_keyword_extraction_with_the_llm(smollm) -> None:
    from dpsynth.methods.synrag.keywords import Vocabulary, extract_keywords, one_document_a_pass

    vocab = Vocabulary(["rash", "fever", "knee", "cough", "breath", "stairs", "swollen"], "t")
    kws = extract_keywords(DOCS, vocab, 3, answer=one_document_a_pass(smollm, 16))
    assert all(1 <= len(k) <= 3 and len(set(k)) == len(k) for k in kws)
    assert vocab.index["rash"] in kws[0] or vocab.index["fever"] in kws[0]
    assert vocab.index["cough"] in kws[2] or vocab.index["breath"] in kws[2]


def _tiny_overrides(tmp: Path) -> dict:
    return {
        "data.demo_rows": 40,
        "privacy.epsilon": 10.0,
        "privacy.delta": 1e-3,
        "privacy.accountant": "zcdp",
        # seeded (research mode): with OS noise the released histogram, and so whether any
        # cluster passes the threshold, changed from build to build; a KB built empty in one
        # xdist worker failed the ask tests there (1 in ~15 suites)
        "privacy.noise": "seeded",
        "privacy.seed": 7,
        "synrag": {"vocabulary": "demo", "keyword_extractor": "vocabulary",
                   "keywords_per_doc": 4, "clusters": 3, "overlap": 2, "target_size": 6,
                   "tokens": 8, "max_doc_tokens": 96, "rho_hist": 0.5,
                   "min_noisy_count": 2.0, "self_filter": False, "eps_theta": 2.0},
    }


@pytest.fixture(scope="module")
def tiny_kb(smollm, embedder, tmp_path_factory, monkeypatch_module) -> Path:
    from dpsynth.api import build_kb

    out = tmp_path_factory.mktemp("kb") / "run"
    over = _tiny_overrides(out)
    before = _stepper_settings(smollm)
    with pytest.raises(KeyboardInterrupt):
        build_kb(Path(__file__).parents[1] / "examples" / "tiny-synrag.yaml", out,
                 overrides=over, generator=smollm, embedder=embedder,
                 hooks=stop_at(1, "cluster-"))  # killed after its first cluster
    ckpt = json.loads((out / "private" / "checkpoints" / "cluster-0000.json").read_text())
    store = (out / "private" / "cluster-releases" / "releases.jsonl").read_text().splitlines()
    (out / "first-cluster.json").write_text(json.dumps({"ckpt": ckpt, "lines": store}))
    build_kb(None, out, resume=True, generator=smollm, embedder=embedder)
    (out / "generator-settings.json").write_text(json.dumps(
        {"before": before, "after": _stepper_settings(smollm)}))
    return out


def _stepper_settings(gen) -> list:
    return [getattr(gen, "logits_dtype", "float32"),
            getattr(gen, "stepper_engine", "transformers"), gen.num_threads]


def test_a_build_gives_the_generator_back_as_it_was(tiny_kb, smollm) -> None:
    """The build runs its private prediction on the engine it picks (OpenVINO here) and puts
    the caller's generator back: its stepper again agrees with a full recompute."""
    settings = json.loads((tiny_kb / "generator-settings.json").read_text())
    assert settings["after"] == settings["before"]
    log = (tiny_kb / "log.txt").read_text()
    assert "private prediction on" in log
    prompts = ["The capital of France is", "My dog likes to"]
    rows = [smollm.encode_prompt(p) for p in prompts]
    with smollm.open_stepper(prompts) as st:
        tok = int(np.argmax(st.logits()[0]))
        st.advance(tok)
        np.testing.assert_allclose(st.logits(), smollm.next_token_logits_ids(
            [r + [tok] for r in rows]), atol=2e-3, rtol=0)


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("DPSYNTH_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.json"))
    yield mp
    mp.undo()


def test_build_writes_kb_and_privacy_within_target(tiny_kb) -> None:
    rel = tiny_kb / "release"
    priv = json.loads((rel / "privacy.json").read_text())
    assert set(priv) >= {"epsilon", "delta", "target_epsilon", "target_delta", "unit",
                         "accountant", "noise", "releases", "mechanisms"}
    assert priv["accountant"] == "zcdp" and priv["method"] == "synrag"
    assert 9.0 < priv["epsilon"] <= 10.0 + 1e-6  # calibrated to the target, not above
    assert priv["releases"] == 2  # histogram + ONE overlapping record for all clusters
    names = {m["name"]: m["count"] for m in priv["mechanisms"]}
    assert names["private_token"] == 2 * 8 and names["cluster_centre"] == 2
    assert priv["theorem1"]["rho_spent"] == pytest.approx(priv["theorem1"]["rho_planned"])
    rows = [json.loads(x) for x in (rel / "kb.jsonl").read_text().splitlines()]
    assert rows and all(r["text"].strip() for r in rows)
    assert json.loads((rel / "index.json").read_text())["passages"] == len(rows)
    # release/ holds no private text: no demo patient message appears in it
    private_csv = (tiny_kb / "private" / "demo-data" / "private.csv").read_text()
    import csv
    import io

    texts = [r["text"] for r in csv.DictReader(io.StringIO(private_csv))]
    blob = "".join(p.read_text() for p in rel.glob("*.json*"))
    assert not any(t in blob for t in texts)
    stats = [json.loads(x) for x in (tiny_kb / "stats.jsonl").read_text().splitlines()]
    assert stats[0]["stage"] == "histogram" and all("members" not in s for s in stats)


def test_resume_does_not_redraw(tiny_kb) -> None:
    first = json.loads((tiny_kb / "first-cluster.json").read_text())
    after = (tiny_kb / "private" / "cluster-releases" / "releases.jsonl").read_text().splitlines()
    assert after[: len(first["lines"])] == first["lines"]
    keys = [json.loads(x)["key"] for x in after]
    assert len(keys) == len(set(keys))
    rows = [json.loads(x) for x in (tiny_kb / "release" / "synthetic_all.jsonl").read_text()
            .splitlines()]
    assert rows[0]["text"] == first["ckpt"]["text"]
    meta = json.loads((tiny_kb / "run.json").read_text())
    assert meta["status"] == "finished" and meta["attempts"] == 2


def test_rag_ask_returns_passages(tiny_kb, smollm, embedder) -> None:
    from dpsynth.rag.answer import answer

    out = answer("Which disease causes a rash?", tiny_kb, 2, generator=smollm,
                 embedder=embedder)
    assert out["answer"] and 1 <= len(out["passages"]) <= 2
    kb_texts = {json.loads(x)["text"] for x in
                (tiny_kb / "release" / "kb.jsonl").read_text().splitlines()}
    assert all(p["text"] in kb_texts for p in out["passages"])


def test_rag_ask_cli_json(tiny_kb) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["rag", "ask", "What helps a cough?", "--kb", str(tiny_kb),
                                   "-k", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["answer"] and len(out["passages"]) == 1


@pytest.mark.models  # the command loads SmolLM2 itself (no fixture marks it)
def test_bench_private_prediction_measures_the_default_at_its_own_rows(small_probe) -> None:
    """The command issue 24 names, on the real model: every field it reports, the speed-up
    as the ratio of the two rates, and, left unset, one pass of all the cluster's rows (a
    build's default of k), not a fixed 16. At a width of 64 document tokens (the two demo
    documents are 53 and 59: none is cut, so the KL compares the same prompts)."""
    from typer.testing import CliRunner

    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["bench", "private-prediction", "--json", "--docs", "2",
                                   "--tokens", "2", "--rounds", "1",
                                   "--max-doc-tokens", "64"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["stepper_rows"] == out["documents"] == 2
    assert out["tokens_per_second"] > 0 and out["baseline_tokens_per_second"] > 0
    assert out["speedup"] == pytest.approx(out["tokens_per_second"]
                                           / out["baseline_tokens_per_second"])
    assert 0 <= out["kl"] <= out["kl_max"] <= 0.01


def _Server(app):  # noqa: N802 - kept as the name the tests use
    """A real uvicorn server on 127.0.0.1 in a thread."""
    return serve_in_thread(app)


def test_service_over_http(tiny_kb, smollm, embedder) -> None:
    from dpsynth.rag.service import kb_app

    app = kb_app(tiny_kb, generator=smollm, embedder=embedder, max_body_bytes=512)
    with _Server(app) as url, httpx.Client(base_url=url, timeout=120) as client:
        health = client.get("/health").json()
        assert health["status"] == "ok" and health["passages"] >= 1
        assert health["epsilon"] <= 10.0 + 1e-6
        r = client.post("/ask", json={"question": "What treats a rash?", "k": 1})
        assert r.status_code == 200, r.text
        assert r.json()["answer"] and len(r.json()["passages"]) == 1
        big = client.post("/ask", json={"question": "x" * 2000})
        assert big.status_code == 413
        assert client.post("/ask", content=b"{not json").status_code == 422
        assert client.post("/ask", json={"question": ""}).status_code == 422
        assert client.post("/ask", json={"question": "hi", "k": 99}).status_code == 422
        assert client.get("/private").status_code == 404
        assert client.get("/docs").status_code == 404


def test_dprag_refuses_after_budget(smollm, embedder, tmp_path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from dpsynth.rag.service import create_app
    from rag_baselines import DPRAG, dprag_session  # research code, outside the package

    emb = embedder.embed(DOCS)
    eps_theta, clip = DPRAG.per_query(2.0, 1e-3, 2, tokens=4)
    session = dprag_session(tmp_path / "q", 2.0, 1e-3)
    rag = DPRAG(DOCS, emb, smollm, embedder, session, target_size=2, eps_theta=eps_theta,
                tokens=4, clip=clip)
    a = rag.ask("What causes a rash?")
    assert a["passages"] == [] and a["epsilon_spent"] <= 2.0
    rag.ask("Why is my knee swollen?")
    assert session.epsilon() == pytest.approx(2.0, rel=1e-3) or session.epsilon() < 2.0
    with pytest.raises(BudgetExceededError):
        rag.ask("A third question")
    with _Server(create_app(rag)) as url:
        r = httpx.post(f"{url}/ask", json={"question": "again?"}, timeout=60)
        assert r.status_code == 429
    # a fresh object on the same store knows the queries already paid for
    again = DPRAG(DOCS, emb, smollm, embedder, PrivacySession(
        tmp_path / "q", Accountant("zcdp"), make_noise_source("seeded", 0), target=(2.0, 1e-3)),
        target_size=2, eps_theta=eps_theta, tokens=4, clip=clip)
    assert again.queries == 2 and not again.can_answer()


def test_histogram_with_nothing_above_noise(smollm, embedder, tmp_path, monkeypatch) -> None:
    from dpsynth.api import build_kb

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    over = _tiny_overrides(tmp_path)
    over["synrag"] = {**over["synrag"], "min_noisy_count": 1e6}
    messages: list[str] = []
    out = build_kb(Path(__file__).parents[1] / "examples" / "tiny-synrag.yaml", tmp_path / "r",
                   overrides=over, generator=smollm, embedder=embedder, echo=messages.append)
    assert any("nothing above noise" in m for m in messages)
    priv = json.loads((out / "release" / "privacy.json").read_text())
    assert priv["releases"] == 1  # only the histogram was released, and it is charged
    assert priv["epsilon"] > 0 and priv["theorem1"]["rho_spent"] == pytest.approx(0.5)
    assert (out / "release" / "kb.jsonl").read_text() == ""
    summary = json.loads((out / "release" / "summary.json").read_text())
    assert summary["kb_passages"] == 0 and summary["warnings"]


def test_public_shortcut_svt(smollm, tmp_path) -> None:
    from dpsynth.methods.synrag.private_prediction import Shortcut, private_predict_shortcut

    def run(threshold: float, name: str):
        s = PrivacySession(tmp_path / name, Accountant("zcdp"), make_noise_source("seeded", 0))
        pred, n_priv = private_predict_shortcut(
            s, "c0", smollm, DOCS, instruction=INSTR, tokens=4, clip=0.5, temperature=1.0,
            max_doc_tokens=64, shortcut=Shortcut(epsilon=1.0, max_private=3,
                                                 threshold=threshold))
        return s, pred, n_priv

    s, pred, n_priv = run(1e9, "public")  # documents never "disagree": all tokens public
    assert n_priv == 0 and pred.steps >= 1
    assert s.accountant.rho() == pytest.approx(3 * 0.5)  # only the stored SVT noise record
    s, pred, n_priv = run(-1e9, "private")  # always "disagree": m private tokens, then public
    assert n_priv == min(3, pred.steps)
    assert s.accountant.rho() == pytest.approx(3 * 0.5 + n_priv * 0.5 * 0.5**2)
    keys = s.keys()
    assert "c0/svt" in keys and sum(k.startswith("c0/tok") for k in keys) == n_priv
    # resumed: the stored SVT noise and tokens are reused, nothing new is charged
    s2 = PrivacySession(tmp_path / "private", Accountant("zcdp"), make_noise_source("seeded", 0))
    pred2, _ = private_predict_shortcut(
        s2, "c0", smollm, DOCS, instruction=INSTR, tokens=4, clip=0.5, temperature=1.0,
        max_doc_tokens=64, shortcut=Shortcut(epsilon=1.0, max_private=3, threshold=-1e9))
    assert pred2.token_ids == pred.token_ids and s2.accountant.rho() == pytest.approx(
        s.accountant.rho())
