"""`rag serve` under load on loopback with a real uvicorn server and fake models: bounded queue
(503 + Retry-After, never a request left waiting past its timeout), blank questions are 422,
a KB whose index dimension does not match its embedder is refused at start-up (CLI exit 2)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from dpsynth.config import ConfigError
from dpsynth.rag.index import build_index
from dpsynth.rag.service import create_app, kb_app
from loopback import serve_in_thread

CLIENTS = 50
CLIENT_TIMEOUT = 10.0


class FakeEmbedder:
    def __init__(self, dim: int = 16) -> None:
        self.dim = dim

    def embed(self, texts, progress: bool = False) -> np.ndarray:
        rows = []
        for t in texts:
            seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "big")
            rows.append(np.random.default_rng(seed).normal(size=self.dim))
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


class FakeGen:
    name = "fake:gen"
    supports_chat = False

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, requests, *, progress: bool = True) -> list[str]:
        self.calls += 1
        return ["a short answer" for _ in requests]


class SlowAnswerer:
    """A slow model: each question takes ``seconds``; counts the questions it answered."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.answered = 0
        self.kb = None
        self.embedder = None

    def ask(self, question: str, k: int = 3) -> dict:
        time.sleep(self.seconds)
        self.answered += 1
        return {"question": question, "answer": "ok", "passages": []}


def Server(app):  # noqa: N802 - kept as the name the tests use
    """A real uvicorn server on 127.0.0.1 in a thread."""
    return serve_in_thread(app)


def _kb(tmp_path: Path, dim: int = 16, name: str = "fake") -> Path:
    rel = tmp_path / "run" / "release"
    rel.mkdir(parents=True)
    texts = ["Drug A treats the red rash.", "Knee pain after climbing stairs.",
             "A cough that lasts two weeks."]
    (rel / "kb.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n"
                                          for i, t in enumerate(texts)))
    build_index(rel, texts, FakeEmbedder(dim), name)
    (rel / "privacy.json").write_text(json.dumps({"epsilon": 4.0, "delta": 1e-5,
                                                  "method": "dp_synrag"}))
    return tmp_path / "run"


async def _burst(url: str, n: int) -> list:
    async def one(client: httpx.AsyncClient, i: int):
        try:
            return await client.post("/ask", json={"question": f"question {i}?"})
        except httpx.HTTPError as err:  # a timeout: the request waited unanswered
            return err

    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT, limits=limits) as client:
        return await asyncio.gather(*(one(client, i) for i in range(n)))


def test_load_every_request_answered_or_refused_in_time() -> None:
    answerer = SlowAnswerer(0.5)
    app = create_app(answerer, {"passages": 0}, max_pending=4, queue_timeout=5.0)
    with Server(app) as url:
        results = asyncio.run(_burst(url, CLIENTS))
    errors = [r for r in results if not isinstance(r, httpx.Response)]
    assert not errors, f"{len(errors)} of {CLIENTS} requests got no answer: {errors[:3]}"
    codes = [r.status_code for r in results]
    assert set(codes) <= {200, 503}, codes
    ok, busy = codes.count(200), codes.count(503)
    assert ok >= 1 and busy >= 1 and ok + busy == CLIENTS
    assert all(r.headers.get("retry-after", "").isdigit() for r in results
               if r.status_code == 503)
    assert answerer.answered == ok  # no work done for a request that was refused


def test_admitted_request_waiting_too_long_gets_503() -> None:
    entered, release = threading.Event(), threading.Event()

    class Blocking(SlowAnswerer):
        def ask(self, question: str, k: int = 3) -> dict:
            entered.set()
            release.wait(30)
            return super().ask(question, k)

    answerer = Blocking(0.0)
    app = create_app(answerer, max_pending=3, queue_timeout=0.3)
    with Server(app) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as client:
        first: list = []
        t = threading.Thread(target=lambda: first.append(
            client.post("/ask", json={"question": "first?"})))
        t.start()
        assert entered.wait(CLIENT_TIMEOUT)
        second = client.post("/ask", json={"question": "second?"})
        release.set()
        t.join(CLIENT_TIMEOUT)
    assert second.status_code == 503 and second.headers["retry-after"].isdigit()
    assert first[0].status_code == 200 and answerer.answered == 1


@pytest.mark.parametrize("question", ["", " ", "   \n\t  "])
def test_blank_question_is_422(tmp_path, question) -> None:
    gen = FakeGen()
    app = kb_app(_kb(tmp_path), generator=gen, embedder=FakeEmbedder())
    with Server(app) as url, httpx.Client(base_url=url, timeout=CLIENT_TIMEOUT) as client:
        r = client.post("/ask", json={"question": question})
        assert r.status_code == 422 and "question" in r.text
        ok = client.post("/ask", json={"question": "What treats a rash?", "k": 1})
        assert ok.status_code == 200 and len(ok.json()["passages"]) == 1
        health = client.get("/health").json()
        assert health == {"status": "ok", "passages": 3, "epsilon": 4.0, "delta": 1e-5,
                          "method": "dp_synrag"}
    assert gen.calls == 1  # the blank question never reached the model


def test_dimension_mismatch_refused(tmp_path) -> None:
    kb = _kb(tmp_path, dim=16)
    with pytest.raises(ConfigError, match="dimension 16.*gives 8"):
        kb_app(kb, generator=FakeGen(), embedder=FakeEmbedder(8))
    kb_app(kb, generator=FakeGen(), embedder=FakeEmbedder(16))  # matching: starts


def test_cli_serve_refuses_mismatch_with_exit_2(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import dpsynth.embed
    from dpsynth.cli import app

    started: list = []
    monkeypatch.setattr("uvicorn.run", lambda *a, **k: started.append(a))
    monkeypatch.setattr(dpsynth.embed, "Embedder", lambda name, **kw: FakeEmbedder(8))
    kb = _kb(tmp_path, dim=16, name="minilm")
    res = CliRunner().invoke(app, ["rag", "serve", "--kb", str(kb)])
    assert res.exit_code == 2, res.output
    assert "dimension" in res.output and not started


def test_cli_blank_question_and_missing_kb_exit_2(tmp_path) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    res = CliRunner().invoke(app, ["rag", "ask", "  ", "--kb", str(_kb(tmp_path))])
    assert res.exit_code == 2 and "blank" in res.output
    res = CliRunner().invoke(app, ["rag", "serve", "--kb", str(tmp_path / "nothing")])
    assert res.exit_code == 2 and "kb.jsonl" in res.output


@pytest.mark.parametrize("broken", ["kb.faiss", "index.json"])
def test_corrupt_kb_file_is_an_input_error(tmp_path, broken) -> None:
    from dpsynth.errors import InputError

    kb = _kb(tmp_path)
    (kb / "release" / broken).write_bytes(b"\x00not what it should be")
    with pytest.raises(InputError, match=f"{broken} is not"):
        kb_app(kb, generator=FakeGen(), embedder=FakeEmbedder(16))


def test_missing_kb_and_missing_extra_are_dpsynth_errors(tmp_path, monkeypatch) -> None:
    import sys

    from dpsynth.errors import MissingExtraError, MissingFileError

    with pytest.raises(MissingFileError, match="kb.jsonl"):
        kb_app(tmp_path / "nothing", generator=FakeGen(), embedder=FakeEmbedder(16))
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingExtraError, match=r"dpsynth\[rag\]"):
        kb_app(_kb(tmp_path), generator=FakeGen(), embedder=FakeEmbedder(16))
