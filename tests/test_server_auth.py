"""dpsynth's HTTP servers bind loopback by default, and any other address needs an API key
that every request must carry (issue 43: the README showed --host 0.0.0.0 with no
authentication). Real uvicorn servers on 127.0.0.1; `llm serve` is driven with the official
openai client, which sends its api_key as a bearer token."""

from __future__ import annotations

import httpx
import openai
import pytest
from typer.testing import CliRunner

from dpsynth.api_key import API_KEY_ENV, authorised, server_api_key
from dpsynth.cli import app as cli_app
from dpsynth.errors import ConfigError
from dpsynth.llm.server import create_app as llm_app
from dpsynth.rag.service import create_app as rag_app
from fault_proxy import FakeGenerator, running
from loopback import serve_in_thread

KEY = "s3cret-key-for-tests"


def test_loopback_needs_no_key_and_any_other_address_needs_one(monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        assert server_api_key(host, None) is None
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.org"):
        with pytest.raises(ConfigError, match="needs an API key"):
            server_api_key(host, None)
        assert server_api_key(host, KEY) == KEY
    monkeypatch.setenv(API_KEY_ENV, KEY)
    assert server_api_key("0.0.0.0", None) == KEY
    assert authorised(f"Bearer {KEY}", KEY) and authorised(f"bearer {KEY}", KEY)
    assert not authorised(None, KEY) and not authorised(KEY, KEY)
    assert not authorised(f"Bearer {KEY}x", KEY) and not authorised("Basic abc", KEY)


@pytest.mark.parametrize("command", [["llm", "serve", "--host", "0.0.0.0"],
                                     ["rag", "serve", "--kb", "nowhere", "--host", "0.0.0.0"]])
def test_the_cli_refuses_a_public_host_without_a_key(command, monkeypatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    res = CliRunner().invoke(cli_app, command, env={"COLUMNS": "200"})
    assert res.exit_code == 2, res.output
    assert "needs an API key" in res.output and "Traceback" not in res.output


def test_llm_serve_with_a_key_answers_the_openai_client_that_sends_it() -> None:
    with running(llm_app(FakeGenerator(), api_key=KEY)) as url:
        good = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)
        reply = good.completions.create(model="echo", prompt="hello", max_tokens=4)
        assert reply.choices[0].text is not None
        assert [m.id for m in good.models.list()]
        bad = openai.OpenAI(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as err:
            bad.completions.create(model="echo", prompt="hello", max_tokens=4)
        assert err.value.status_code == 401
        assert err.value.body["code"] == "invalid_api_key"  # OpenAI's error shape
        none = httpx.get(f"{url}/models")
        assert none.status_code == 401 and none.headers["www-authenticate"] == "Bearer"


def test_llm_serve_without_a_key_stays_open_on_loopback() -> None:
    with running(llm_app(FakeGenerator())) as url:
        assert httpx.get(f"{url}/models").status_code == 200


class Answerer:
    def ask(self, question: str, k: int = 3) -> dict:
        return {"question": question, "answer": "ok", "passages": []}


def test_rag_serve_with_a_key_refuses_every_request_without_it() -> None:
    with serve_in_thread(rag_app(Answerer(), {"passages": 0}, api_key=KEY)) as url:
        for method, path, body in (("GET", "/health", None),
                                   ("POST", "/ask", {"question": "why?"})):
            assert httpx.request(method, url + path, json=body).status_code == 401
            ok = httpx.request(method, url + path, json=body,
                               headers={"Authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200, ok.text


def test_a_server_prints_its_url_once_it_listens(tmp_path) -> None:
    """`llm serve` and `rag serve` run through http_serve.run_app: its line comes once the
    socket answers (a real uvicorn in a child process on loopback)."""
    import subprocess
    import sys

    from loopback import free_port

    port = free_port()
    script = tmp_path / "serve.py"
    script.write_text(
        "from fastapi import FastAPI\nfrom dpsynth.http_serve import run_app\n"
        "app = FastAPI()\n\n@app.get('/v1/ping')\ndef ping():\n    return {'ok': True}\n\n"
        f"run_app(app, '127.0.0.1', {port}, what='test serve', path='/v1', key=True)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server says it is ready
        assert line.strip() == (f"test serve: ready at http://127.0.0.1:{port}/v1 "
                                "(requests need the API key)")
        # ready means answering: the first request after the line gets through
        assert httpx.get(f"http://127.0.0.1:{port}/v1/ping").json() == {"ok": True}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
