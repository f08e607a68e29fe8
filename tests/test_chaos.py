"""Chaos: a whole tiny Aug-PE run through a proxy that fails 30 % of requests (503, 429 with
Retry-After, connection resets) and hangs 5 %, in front of the real server over SmolLM2.

The run must finish without a human (no --resume), spend exactly the planned epsilon, and pay
for no request twice: every answer the client receives is one request-cache row, and the
upstream is paid again for a request only where the client gave up waiting for its answer
(a slow, not hung, server under CPU load: the per-attempt timeout then has to re-send). The
counts are per request body, from both ends (the proxy, and a log of the client's attempts),
so they hold however slow the machine is; no assertion depends on timing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dpsynth.llm.server import create_app
from fault_proxy import FaultProxy, body_key, running

pytestmark = [pytest.mark.chaos, pytest.mark.models]

RATES = {"503": 0.12, "429": 0.08, "reset": 0.10, "hang": 0.05}
TIMEOUT_S = 20  # the client's per-attempt timeout (a hang costs one; 4 rows of 16 tokens take ~6 s)


class ClientLog:
    """What the client's HTTP library got for each POST to ``url``, per request body
    (:func:`body_key`): ``answered`` (200 answers received), ``failed`` (the other outcomes:
    ``"HTTP <status>"``, ``"connection error"``, ``"timeout"`` -- no answer within the read
    timeout, which ``timeouts`` records -- or another exception's name). Observation only: it
    wraps ``httpx.Client.post`` and returns or raises what that does, so a client that throws
    away an answer it received shows up here as an answer received twice."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.lock = threading.Lock()
        self.answered: Counter[str] = Counter()
        self.failed: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self.timeouts: list[float | None] = []  # the read timeout each "timeout" had

    def wrap(self, post: Callable[..., httpx.Response]) -> Callable[..., httpx.Response]:
        def logged(client: httpx.Client, url: Any, *args: Any, **kwargs: Any) -> httpx.Response:
            if not str(client.base_url).startswith(self.url):
                return post(client, url, *args, **kwargs)
            key = body_key(kwargs.get("json"))
            try:
                resp = post(client, url, *args, **kwargs)
            except httpx.ReadTimeout:
                self._failed(key, "timeout", getattr(kwargs.get("timeout"), "read", None))
                raise
            except httpx.TransportError as exc:
                self._failed(key, "connection error" if not isinstance(exc, httpx.TimeoutException)
                             else type(exc).__name__)
                raise
            if resp.status_code == 200:
                with self.lock:
                    self.answered[key] += 1
            else:
                self._failed(key, f"HTTP {resp.status_code}")
            return resp

        return logged

    def _failed(self, key: str, cause: str, read_timeout: float | None = None) -> None:
        with self.lock:
            self.failed[key][cause] += 1
            if cause == "timeout":
                self.timeouts.append(read_timeout)

    def causes(self) -> Counter[str]:
        return sum(self.failed.values(), Counter())


def test_tiny_run_completes_through_a_flaky_server(smollm, tmp_path, monkeypatch) -> None:
    from dpsynth.api import run_generation
    from dpsynth.privacy import Accountant, DiscreteGaussianEvent

    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path / "ledger.json"))
    raw = yaml.safe_load((Path(__file__).parents[1] / "examples" / "tiny-aug-pe.yaml")
                         .read_text())
    # the tiny example with the fewest samples it allows (one per department) and its two
    # iterations; shorter texts to save time. One request per POST, 12 of them for the first
    # pool alone: with the proxy's seed 11 the attempts meet 503s, 429s and a hang (the 12th)
    raw["privacy"].update(noise="seeded", seed=3)
    raw["synthesis"].update(samples=6, min_words=4, max_words=12)  # none refused as short
    # the server never refuses by itself (no queue timeout), so every failed attempt is an
    # injected fault or the client's own timeout; a hang lasts until the client gives up
    with running(create_app(smollm, max_batch_requests=8, queue_timeout_s=3600)) as upstream, \
            FaultProxy(upstream, rates=RATES, seed=11, retry_after=1, hang_s=600) as proxy:
        client = ClientLog(proxy.url)
        monkeypatch.setattr(httpx.Client, "post", client.wrap(httpx.Client.post))
        raw["generators"] = [{
            "backend": "openai", "base_url": proxy.url, "model": "smollm2",
            "max_new_tokens": 16, "max_concurrency": 4, "timeout_s": TIMEOUT_S,
            # far more than a slow machine needs: the run must not give up
            "retry_budget_s": 900, "outage_patience_s": 600,
        }]
        cfg = tmp_path / "chaos.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        run = run_generation(cfg, tmp_path / "run", progress=False)

    meta = json.loads((run / "run.json").read_text())
    assert meta["status"] == "finished" and meta["attempts"] == 1  # no human, no --resume
    assert sum(proxy.faults.values()) > 0 and proxy.faults["503"] + proxy.faults["429"] > 0
    assert proxy.faults["hang"] >= 1  # a hang was cut by the timeout and the run went on

    with sqlite3.connect(run / "private" / "llm-cache.sqlite") as db:
        rows = db.execute("select count(*) from generations").fetchone()[0]
    summary = json.loads((run / "release" / "summary.json").read_text())
    answered, causes = client.answered, client.causes()
    keys = set(proxy.forwarded) | set(proxy.hung) | set(answered) | set(client.failed)
    # per request: forwarded attempts the client gave up on, the answer too slow (not hung)
    slow = {k: client.failed[k]["timeout"] - proxy.hung[k] for k in keys}
    print(f"chaos: rows={rows} faults={dict(proxy.faults)} slow={sum(slow.values())} "
          f"paid_twice={proxy.paid_twice()} client={dict(causes)} "
          f"upstream_failed={dict(proxy.upstream_failed)}")

    # no answer used twice: each answer the client received is one cached result, and none
    # was received twice (no request was sent again once its answer had come back)
    assert answered and max(answered.values()) == 1
    assert len(answered) == rows == summary["llm_calls"] > 0
    assert meta["history"][-1] == {"attempt": 1, "status": "finished", "error": None,
                                   "reason": None, "llm_calls": rows}

    # every failed attempt is an injected fault, or a forwarded one the client gave up on after
    # its full timeout; each hang cost one timeout; the server itself refused nothing
    assert not proxy.upstream_failed
    assert set(causes) <= {"HTTP 503", "HTTP 429", "connection error", "timeout"}
    assert (causes["HTTP 503"], causes["HTTP 429"], causes["connection error"]) == \
        (proxy.faults["503"], proxy.faults["429"], proxy.faults["reset"])
    assert all(s >= 0 for s in slow.values())
    assert causes["timeout"] == proxy.faults["hang"] + sum(slow.values())
    assert all(t == TIMEOUT_S for t in client.timeouts)
    assert all(proxy.forwarded[k] == answered[k] + slow[k] for k in keys)

    # no request paid twice: the upstream was paid for the cached requests only, once each,
    # and again only for a slow answer the client never received (none on an idle machine)
    assert set(proxy.upstream_ok) == set(answered)
    assert all(1 <= proxy.upstream_ok[k] <= 1 + slow[k] for k in keys)
    # truthful counters: every failed attempt was counted as one retry
    assert summary["http_retries"] == sum(causes.values()) \
        == sum(proxy.faults.values()) + sum(slow.values())

    # the final epsilon is the planned accountant value, faults or not
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    releases = (run / "private" / "releases" / "releases.jsonl").read_text().splitlines()
    acc = Accountant("pld")  # discrete Gaussian counts and k = 1 votes: shift profile (1,)
    acc.add(DiscreteGaussianEvent(sigma=privacy["noise_multiplier"], sensitivity=1.0,
                                  count=len([r for r in releases if r.strip()]), shifts=(1,)))
    assert privacy["epsilon"] == pytest.approx(acc.epsilon(1e-5), rel=1e-6)
    assert privacy["epsilon"] <= privacy["target_epsilon"] + 1e-6
