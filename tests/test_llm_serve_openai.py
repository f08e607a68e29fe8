"""`dpsynth llm serve` against the official ``openai`` Python client (issue 25, point 3).

A real uvicorn server on 127.0.0.1 (a free port) over the production app. Fast tests serve
:class:`fake_lm.TokenFake`, decoded token by token by the production ``decode_rows`` (so
streaming, finish reasons, seeds and token counts are exact), or a generator without
token-level decoding; one thin test serves the real SmolLM2 (marked ``models``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from dpsynth.llm import GenerationRequest, SamplingParams
from dpsynth.llm.openai_compat import OpenAIGenerator
from dpsynth.llm.server import create_app
from fake_lm import BRIEF_WORDS, ReportingFake, TokenFake
from fault_proxy import FakeGenerator, running

CHAT = [{"role": "user", "content": "Tell me about the clinic."}]
BRIEF_CHAT = [{"role": "user", "content": "Be brief about the clinic."}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def fake() -> TokenFake:
    return TokenFake()


@pytest.fixture
def served(fake: TokenFake) -> Iterator[str]:
    with running(create_app(fake)) as url:
        yield url


def prompt_len(gen: Any, prompt: Any) -> int:
    text, _, _ = gen.render(GenerationRequest(prompt))
    return len(gen.encode_prompt(text))


def chat_stream(c: openai.OpenAI, **kw: Any) -> tuple[list[Any], dict[int, str]]:
    chunks = list(c.chat.completions.create(stream=True, **kw))
    texts: dict[int, str] = {}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return chunks, texts


# ----------------------------------------------------------------------------- model name
def test_served_model_name_and_404_for_another(served: str) -> None:
    c = client(served)
    assert [m.id for m in c.models.list()] == ["tiny"]
    assert c.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as err:
        c.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=2)
    assert err.value.status_code == 404 and err.value.code == "model_not_found"
    assert err.value.param == "model" and "gpt-4o" in err.value.message
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="local:tiny", prompt="hi", max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-4o")
    raw = httpx.post(f"{served}/chat/completions", json={"model": "x", "messages": CHAT})
    assert set(raw.json()) == {"error"}
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}
    nowhere = httpx.get(f"{served}/nowhere")
    assert nowhere.status_code == 404 and set(nowhere.json()["error"]) == {
        "message", "type", "param", "code"}


def test_served_model_name_option(fake: TokenFake) -> None:
    with running(create_app(fake, model_id="smol")) as url:
        c = client(url)
        assert [m.id for m in c.models.list()] == ["smol"]
        r = c.completions.create(model="smol", prompt="hi", max_tokens=2)
        assert r.model == "smol"
        with pytest.raises(openai.NotFoundError):
            c.completions.create(model="tiny", prompt="hi", max_tokens=2)


# ----------------------------------------------------------------- finish_reason and usage
def test_finish_reason_and_usage_count_the_tokens(served: str, fake: TokenFake) -> None:
    c = client(served)
    cut = c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=5, seed=1)
    assert cut.object == "chat.completion" and cut.choices[0].finish_reason == "length"
    assert cut.choices[0].message.role == "assistant"
    assert len(cut.choices[0].message.content.split()) == 5
    assert cut.usage.completion_tokens == 5
    assert cut.usage.prompt_tokens == prompt_len(fake, tuple(CHAT))
    assert cut.usage.total_tokens == cut.usage.prompt_tokens + 5

    ended = c.chat.completions.create(model="tiny", messages=BRIEF_CHAT, max_tokens=20)
    assert ended.choices[0].finish_reason == "stop"
    assert len(ended.choices[0].message.content.split()) == BRIEF_WORDS
    assert ended.usage.completion_tokens == BRIEF_WORDS + 1  # the end-of-sequence token

    # a limit that falls exactly on the end-of-sequence token: the model ended it
    exact = c.chat.completions.create(model="tiny", messages=BRIEF_CHAT,
                                      max_tokens=BRIEF_WORDS + 1)
    assert exact.choices[0].finish_reason == "stop"
    short = c.chat.completions.create(model="tiny", messages=BRIEF_CHAT,
                                      max_tokens=BRIEF_WORDS)
    assert short.choices[0].finish_reason == "length"

    # completions: prompt tokens once per prompt, completion tokens of every choice
    r = c.completions.create(model="tiny", prompt=["one two", "be brief now"], n=2,
                             max_tokens=4, seed=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2, 3]
    assert [ch.finish_reason for ch in r.choices] == ["length", "length", "stop", "stop"]
    assert r.usage.prompt_tokens == prompt_len(fake, "one two") + prompt_len(fake,
                                                                          "be brief now")
    assert r.usage.completion_tokens == 4 + 4 + 2 * (BRIEF_WORDS + 1)


def test_completions_default_max_tokens_is_16_and_chat_fills_the_context() -> None:
    fake = TokenFake(max_context=40)
    with running(create_app(fake, default_max_tokens=1000)) as url:
        c = client(url)
        r = c.completions.create(model="tiny", prompt="hello there")
        assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
        chat = c.chat.completions.create(model="tiny", messages=CHAT)
        assert chat.usage.prompt_tokens + chat.usage.completion_tokens == 40
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=39)
    assert err.value.code == "context_length_exceeded" and err.value.param == "max_tokens"


# ------------------------------------------------------------------------------ streaming
def test_chat_stream_is_the_non_streamed_answer_in_chunks(served: str) -> None:
    c = client(served)
    kw = {"model": "tiny", "messages": CHAT, "max_tokens": 7, "seed": 11, "temperature": 1.0}
    whole = c.chat.completions.create(**kw)
    chunks, texts = chat_stream(c, stream_options={"include_usage": True}, **kw)
    assert texts == {0: whole.choices[0].message.content}
    assert all(ch.object == "chat.completion.chunk" and ch.model == "tiny" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content) == 7  # one chunk per decoded token: real incremental streaming
    finals = [ch.choices[0] for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert [f.finish_reason for f in finals] == ["length"] and finals[0] is chunks[-2].choices[0]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(ch.usage is None for ch in chunks[:-1])


def test_chunks_arrive_while_the_model_is_still_decoding() -> None:
    gate = threading.Event()
    fake = TokenFake(gate=gate, gate_after=3)
    with running(create_app(fake)) as url:
        stream = client(url).chat.completions.create(model="tiny", messages=CHAT,
                                                     max_tokens=6, seed=2, stream=True)
        steps_seen = []  # the decoder's step when each chunk arrived
        for ch in stream:
            if ch.choices and ch.choices[0].delta.content:
                steps_seen.append(fake.steps)
                gate.set()
    # the decoder waits at step 3 until the first chunk is here: had the server sent nothing
    # before decoding ended, the first chunk would come at the last step (5)
    assert steps_seen[0] <= 3, steps_seen
    assert len(steps_seen) == 6


def test_completions_stream_n_choices(served: str) -> None:
    c = client(served)
    kw = {"model": "tiny", "prompt": ["alpha beta", "be brief"], "n": 2, "max_tokens": 6,
          "seed": 5}
    whole = c.completions.create(**kw)
    chunks = list(c.completions.create(stream=True, **kw))
    assert all(ch.object == "text_completion" for ch in chunks)
    texts: dict[int, str] = {}
    finish: dict[int, str] = {}
    for ch in chunks:
        for choice in ch.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert texts == {ch.index: ch.text for ch in whole.choices}
    assert finish == {ch.index: ch.finish_reason for ch in whole.choices}
    assert finish == {0: "length", 1: "length", 2: "stop", 3: "stop"}


def test_stop_sequences_cut_streamed_and_not(served: str) -> None:
    c = client(served)
    kw = {"model": "tiny", "prompt": "some words here", "max_tokens": 8, "temperature": 0}
    free = c.completions.create(**kw).choices[0].text
    words = free.split()
    stop = f" {words[3]}"  # cut before the fourth word (a prefix of it is held while streaming)
    want = free[: free.index(stop)]
    cut = c.completions.create(stop=[stop, "never-seen"], **kw).choices[0]
    assert (cut.text, cut.finish_reason) == (want, "stop")
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        stop=stop, stream=True, **kw) if ch.choices)
    assert streamed == want
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(stop=["a", "b", "c", "d", "e"], **kw)
    assert err.value.param == "stop"


def test_an_error_mid_stream_is_an_error_event() -> None:
    gate = threading.Event()
    with running(create_app(TokenFake(gate=gate, gate_after=2, fail_at=3))) as url:
        stream = client(url).chat.completions.create(model="tiny", messages=CHAT,
                                                     max_tokens=8, stream=True)
        got = []
        with pytest.raises(openai.APIError, match="decoding failed") as err:
            for ch in stream:  # headers are out (200): the failure comes as an event
                if ch.choices and ch.choices[0].delta.content:
                    got.append(ch.choices[0].delta.content)
                    gate.set()
    assert got and err.value.type == "server_error"


def test_a_stream_that_never_starts_is_an_http_503() -> None:
    gate = threading.Event()
    fake = TokenFake(gate=gate, gate_after=1)
    app = create_app(fake, max_batch_requests=1, queue_timeout_s=0.3, batch_window_s=0)
    with running(app) as url:
        c = client(url)
        busy = threading.Thread(target=lambda: c.completions.create(
            model="tiny", prompt="hold the model", max_tokens=3))
        busy.start()
        try:
            assert fake.held.wait(10)  # the model is busy with the first request
            with pytest.raises(openai.InternalServerError) as err:
                c.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3,
                                          stream=True)
        finally:
            gate.set()
            busy.join(20)
    assert err.value.status_code == 503 and "Retry-After" in err.value.response.headers
    assert app.state.batcher.expired == 1


def test_a_generator_without_token_decoding_streams_one_chunk() -> None:
    with running(create_app(ReportingFake())) as url:
        c = client(url)
        chunks, texts = chat_stream(c, model="reporting", messages=CHAT, seed=4,
                                    stream_options={"include_usage": True})
        content = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
        assert len(content) == 1 and texts == {0: "answer 0 seed=4"}
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
        assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 7)
    with running(create_app(FakeGenerator())) as url:  # only generate(): counts unknown
        r = client(url).completions.create(model="echo", prompt="hi", max_tokens=3)
        assert r.choices[0].text == "echo hi seed=None"
        assert r.choices[0].finish_reason == "stop" and r.usage.total_tokens == 0


# ------------------------------------------------------------------------- n, seeds, limits
def test_n_choices_and_seeds(served: str) -> None:
    c = client(served)
    kw = {"model": "tiny", "messages": CHAT, "max_tokens": 6, "temperature": 1.0}
    r = c.chat.completions.create(n=3, seed=21, **kw)
    texts = [ch.message.content for ch in r.choices]
    assert [ch.index for ch in r.choices] == [0, 1, 2] and len(set(texts)) == 3
    again = c.chat.completions.create(n=3, seed=21, **kw)
    assert [ch.message.content for ch in again.choices] == texts  # same seed, same texts
    one = c.chat.completions.create(seed=22, **kw)  # choice k is sampled with seed + k
    assert one.choices[0].message.content == texts[1]
    other = c.chat.completions.create(seed=99, **kw)
    assert other.choices[0].message.content not in texts


@pytest.mark.parametrize(("kw", "param"), [
    ({"n": 0}, "n"), ({"n": -1}, "n"), ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"seed": 1.5}, "seed"),
])
def test_bad_values_are_400_naming_the_parameter(served: str, kw: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(served).chat.completions.create(model="tiny", messages=CHAT, **kw)
    assert err.value.status_code == 400 and err.value.param == param
    assert param in err.value.message


CHAT_REFUSED = [
    ("logprobs", True), ("top_logprobs", 2), ("response_format", {"type": "json_object"}),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"), ("logit_bias", {"5": 10}), ("presence_penalty", 0.5),
    ("frequency_penalty", 1.0), ("parallel_tool_calls", True),
]


@pytest.mark.parametrize(("name", "value"), CHAT_REFUSED)
def test_unsupported_chat_parameters_are_refused(served: str, name: str, value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(served).chat.completions.create(model="tiny", messages=CHAT, max_tokens=2,
                                               **{name: value})
    assert err.value.param == name and name in err.value.message


@pytest.mark.parametrize(("name", "value"), [("echo", True), ("logprobs", 2), ("best_of", 3),
                                             ("suffix", "tail"), ("logit_bias", {"5": 1})])
def test_unsupported_completions_parameters_are_refused(served: str, name: str,
                                                        value: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(served).completions.create(model="tiny", prompt="hi", max_tokens=2,
                                          **{name: value})
    assert err.value.param == name and name in err.value.message


def test_unknown_parameters_and_messages_are_refused_defaults_accepted(served: str) -> None:
    c = client(served)
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=CHAT, extra_body={"mirostat": 2})
    assert err.value.param == "mirostat" and "unrecognized" in err.value.message
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=[{"role": "tool", "content": "x",
                                                           "tool_call_id": "1"}])
    assert err.value.param == "messages"
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model="tiny", messages=CHAT, stream_options={
            "include_usage": True})
    assert err.value.param == "stream_options"  # only with stream=true
    # the values that ask for nothing are accepted; text parts and a developer message too
    ok = c.chat.completions.create(
        model="tiny", max_tokens=2, logprobs=False, response_format={"type": "text"},
        presence_penalty=0, tool_choice="none", user="someone",
        messages=[{"role": "developer", "content": "Be kind."},
                  {"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert ok.choices[0].finish_reason == "length"
    ok = c.completions.create(model="tiny", prompt="hi", max_tokens=2, echo=False, best_of=1)
    assert len(ok.choices) == 1


# ----------------------------------------------------------------------------- our client
def test_our_client_reads_finish_reason_and_usage(served: str, fake: TokenFake) -> None:
    gen = OpenAIGenerator(served, "tiny", api_key_env=None, chat=True)
    reqs = [GenerationRequest(tuple(CHAT), SamplingParams(max_new_tokens=4, seed=1)),
            GenerationRequest(tuple(BRIEF_CHAT), SamplingParams(max_new_tokens=9, seed=1))]
    done = gen.complete(reqs, progress=False)
    assert [c.finish_reason for c in done] == ["length", "stop"]
    assert [c.completion_tokens for c in done] == [4, BRIEF_WORDS + 1]
    assert done[0].prompt_tokens == prompt_len(fake, tuple(CHAT))
    assert gen.generate(reqs, progress=False) == [c.text for c in done]
    wrong = OpenAIGenerator(served, "gpt-4o", api_key_env=None, max_attempts=1)
    with pytest.raises(Exception, match="HTTP 404"):
        wrong.generate(reqs[:1], progress=False)


# ------------------------------------------------------------------------------ real model
@pytest.mark.models
def test_real_smollm2_through_the_openai_client(smollm) -> None:
    with running(create_app(smollm)) as url:
        c = client(url)
        assert [m.id for m in c.models.list()] == ["smollm2"]
        story = [{"role": "user", "content": "Write a long story about a lighthouse."}]
        kw = {"model": "smollm2", "messages": story, "max_tokens": 12, "temperature": 0}
        whole = c.chat.completions.create(**kw)
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage.completion_tokens == 12
        assert whole.usage.prompt_tokens == prompt_len(smollm, tuple(story))
        chunks, texts = chat_stream(c, **kw)
        assert texts == {0: whole.choices[0].message.content}
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) > 3

        yes = c.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=40,
            messages=[{"role": "user", "content": "Answer with one word: is water wet?"}])
        done = yes.choices[0]
        assert (done.finish_reason == "stop") == (yes.usage.completion_tokens < 40)
        assert done.finish_reason == "stop"

        seeded = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 8,
                  "temperature": 1.0, "seed": 5}
        first = c.completions.create(**seeded).choices[0].text
        assert c.completions.create(**seeded).choices[0].text == first
        streamed = "".join(ch.choices[0].text for ch in c.completions.create(
            stream=True, **seeded) if ch.choices)
        assert streamed == first


# ------------------------------------------------------------------- streaming text, pure
def test_incremental_text_holds_what_may_still_change() -> None:
    from dpsynth.llm.incremental import IncrementalText, stop_prefix_len

    assert stop_prefix_len("say END", ["ENDX"]) == 3 and stop_prefix_len("abc", ["x"]) == 0
    t = IncrementalText(["\nUser:"], strip=True)
    assert t.update("  Hi") == "Hi"  # leading whitespace of a chat reply is stripped
    assert t.update("  Hi there \n") == " there"  # trailing blank and "\n" are held
    assert t.update("  Hi there \nUs") == ""
    assert t.update("  Hi there \nUser: next") == ""  # the stop came: nothing past it
    assert t.sent == "Hi there"
    u = IncrementalText([], strip=False)
    assert u.update("caf\ufffd") == "caf" and u.update("café") == "é"  # a split character


def test_streamed_pieces_add_up_to_the_final_text() -> None:
    """Over random word sequences and stop strings: every piece extends what was sent, and
    the sent text is always a prefix of the final one (what the server completes it to)."""
    import random

    from dpsynth.llm.base import apply_stops
    from dpsynth.llm.incremental import IncrementalText

    rng = random.Random(0)
    pieces = ["a", " b", "c", " ", "\n", "EN", "D", "x", " END"]
    for _ in range(2000):
        tokens = [rng.choice(pieces) for _ in range(rng.randint(1, 12))]
        stops = rng.choice([[], ["END"], ["\n\n", "cx"], ["b c"]])
        strip = rng.random() < 0.5
        tracker = IncrementalText(stops, strip)
        sent = ""
        for k in range(1, len(tokens) + 1):
            # a decoder shows U+FFFD for a character whose bytes are not all decoded yet
            partial = "\ufffd" if k < len(tokens) and rng.random() < 0.3 else ""
            sent += tracker.update("".join(tokens[:k]) + partial)
            assert sent == tracker.sent
        final = apply_stops("".join(tokens), stops)
        final = final.strip() if strip else final
        assert final.startswith(sent), (tokens, stops, strip)


@pytest.mark.models
def test_local_generator_reports_how_each_text_ended(smollm) -> None:
    """Generator.complete on both local engines: "length" with exactly max_new_tokens tokens
    when the limit cut the text, "stop" at the end-of-sequence token or a stop string."""
    from dpsynth.llm import load_generator

    story = ({"role": "user", "content": "Write a long story about a lighthouse."},)
    short = ({"role": "user", "content": "Answer with one word: is water wet?"},)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=120)  # int8 needs 70 here
    for gen in (smollm, load_generator("smollm2", engine="transformers")):
        reqs = [GenerationRequest(story, SamplingParams(temperature=0.0, max_new_tokens=3)),
                GenerationRequest(short, greedy)]
        cut, ended = gen.complete(reqs, progress=False)
        assert (cut.finish_reason, cut.completion_tokens) == ("length", 3), gen.engine
        assert ended.finish_reason == "stop" and ended.completion_tokens < 120, gen.engine
        assert cut.prompt_tokens == prompt_len(gen, story)
        assert gen.generate(reqs, progress=False) == [cut.text, ended.text]
        word = cut.text.split()[1]
        stopped = gen.complete([GenerationRequest(story, SamplingParams(
            temperature=0.0, max_new_tokens=3, stop=(word,)))], progress=False)[0]
        assert stopped.finish_reason == "stop" and word not in stopped.text, gen.engine


# -------------------------------------------------------------------------------------- CLI
def test_cli_passes_the_served_name_and_default_max_tokens(monkeypatch) -> None:
    """`dpsynth llm serve --served-model-name ...` reaches the server (uvicorn not started)."""
    import json

    from typer.testing import CliRunner

    import dpsynth.llm.server as server_mod
    from dpsynth.cli import app

    seen: dict[str, Any] = {}
    monkeypatch.setattr(server_mod, "serve", lambda gen, **kw: seen.update(gen=gen, **kw))
    upstream = json.dumps({"backend": "openai", "base_url": "http://127.0.0.1:9/v1",
                           "model": "up", "api_key_env": None})
    res = CliRunner().invoke(app, ["llm", "serve", "--model", upstream,
                                   "--served-model-name", "public-name",
                                   "--default-max-tokens", "77"])
    assert res.exit_code == 0, res.output
    assert (seen["model_id"], seen["default_max_tokens"]) == ("public-name", 77)
    app_ = create_app(seen["gen"])
    app_.state.batcher.close()
    assert app_.state.served_model == "up"  # the default: the upstream model's name
