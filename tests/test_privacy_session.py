"""PrivacySession: durable releases, resume without redraw, and the budget guard."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dpsynth.privacy import (
    Accountant,
    BudgetExceededError,
    DiscreteGaussianEvent,
    GaussianEvent,
    Lattice,
    PrivacyConfigError,
    PrivacySession,
    ReleasePlan,
    Scaled,
    ZCDPEvent,
    calibrate_gaussian_sigma,
    calibrate_steps,
    make_noise_source,
)

CRASHING_RUN = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import numpy as np
    from dpsynth.privacy import Accountant, PrivacySession, make_noise_source

    store, mode = Path(sys.argv[1]), sys.argv[2]
    sess = PrivacySession(store, Accountant("pld"), make_noise_source(mode, 0), target=(10.0, 1e-5))
    out = {
        "votes": sess.gaussian("iter0/votes", np.arange(6.0), 1.0, 5.0).tolist(),
        "big": float(sess.gaussian("iter0/big", np.zeros(5000), 1.0, 5.0).sum()),
        "pick": sess.exponential("iter0/pick", np.arange(10.0), 1.0, 0.5),
        "eps": sess.epsilon(),
    }
    print(json.dumps(out), flush=True)
    os._exit(1)  # crash: no cleanup, no atexit
    """
)


class CountingNoise:
    """A noise source that counts draws (to prove the guard draws nothing)."""

    def __init__(self) -> None:
        self.inner = make_noise_source("seeded", 0)
        self.mode = "seeded"
        self.draws = 0

    def normal(self, size, scale=1.0):
        self.draws += 1
        return self.inner.normal(size, scale)

    def uniform(self, size):
        self.draws += 1
        return self.inner.uniform(size)

    def gumbel(self, size):
        self.draws += 1
        return self.inner.gumbel(size)

    def choice(self, probs):
        self.draws += 1
        return self.inner.choice(probs)

    def integers(self, high):
        self.draws += 1
        return self.inner.integers(high)


@pytest.mark.parametrize("mode", ["seeded", "secure"])
def test_resume_after_crash_does_not_redraw(tmp_path: Path, mode: str) -> None:
    store = tmp_path / "store"
    proc = subprocess.run(
        [sys.executable, "-c", CRASHING_RUN, str(store), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    first = json.loads(proc.stdout)
    assert (store / "releases.jsonl").exists()
    assert len(list((store / "releases").glob("*.npy"))) == 1  # the 5000-element array

    acc = Accountant("pld")
    sess = PrivacySession(store, acc, make_noise_source(mode, 0), target=(10.0, 1e-5))
    assert sess.keys() == ["iter0/votes", "iter0/big", "iter0/pick"]
    assert len(acc.events) == 3
    assert sess.epsilon() == pytest.approx(first["eps"], rel=1e-12)
    # asking again returns the stored values and charges nothing
    again = sess.gaussian("iter0/votes", np.arange(6.0), 1.0, 5.0)
    assert again.tolist() == first["votes"]
    assert float(sess.gaussian("iter0/big", np.zeros(5000), 1.0, 5.0).sum()) == first["big"]
    assert sess.exponential("iter0/pick", np.arange(10.0), 1.0, 0.5) == first["pick"]
    assert len(acc.events) == 3 and sess.epsilon() == pytest.approx(first["eps"], rel=1e-12)
    # a new statistic gets fresh, independent noise and is charged
    new = sess.gaussian("iter1/votes", np.arange(6.0), 1.0, 5.0)
    assert not np.allclose(new - np.arange(6.0), np.array(first["votes"]) - np.arange(6.0))
    assert len(acc.events) == 4 and sess.epsilon() > first["eps"]


def test_interrupted_write_is_dropped(tmp_path: Path) -> None:
    store = tmp_path / "s"
    sess = PrivacySession(store, Accountant("zcdp"), make_noise_source("seeded", 1))
    v = sess.noisy_counts("labels", np.array([10.0, 20.0]), sigma=2.0)
    with open(store / "releases.jsonl", "ab") as fh:
        fh.write(b'{"key":"iter0/votes","events":[{"type":"gaus')  # crash mid-line
    again = PrivacySession(store, Accountant("zcdp"), make_noise_source("seeded", 1))
    assert again.keys() == ["labels"] and np.array_equal(again.get("labels"), v)
    assert len(again.accountant.events) == 1
    assert (store / "releases.jsonl").read_bytes().endswith(b"\n")  # cut back to a whole line
    again.noisy_counts("iter0/votes", np.zeros(3), sigma=2.0)
    third = PrivacySession(store, Accountant("zcdp"), make_noise_source("seeded", 1))
    assert third.keys() == ["labels", "iter0/votes"]


def test_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    store = tmp_path / "s"
    store.mkdir()
    (store / "releases.jsonl").write_text("not json\n{}\n")
    with pytest.raises(PrivacyConfigError, match="line 1"):
        PrivacySession(store, Accountant("pld"), make_noise_source("seeded", 1))


def test_budget_guard_raises_before_drawing(tmp_path: Path) -> None:
    sigma = calibrate_gaussian_sigma(
        1.0, 1e-5, ReleasePlan((Scaled(DiscreteGaussianEvent(1.0, 1.0, 10, shifts=(1,))),)))
    assert sigma > calibrate_steps(1.0, 1e-5, 10)  # the discrete PLD is a little wider
    noise = CountingNoise()
    store = tmp_path / "s"
    sess = PrivacySession(store, Accountant("pld"), noise, target=(1.0, 1e-5))
    counts = Lattice.counts()
    for t in range(10):
        sess.gaussian(f"iter{t}/votes", np.zeros(3), 1.0, sigma, lattice=counts)
    assert sess.epsilon() <= 1.0
    draws, lines = noise.draws, (store / "releases.jsonl").read_text()
    with pytest.raises(BudgetExceededError, match="above the target epsilon=1"):
        sess.gaussian("iter10/votes", np.zeros(3), 1.0, sigma, lattice=counts)
    with pytest.raises(BudgetExceededError):
        sess.gaussian("iter10/big", np.zeros(5000), 1.0, sigma, lattice=counts)
    assert noise.draws == draws  # no noise drawn
    assert (store / "releases.jsonl").read_text() == lines  # nothing written
    assert list((store / "releases").iterdir()) == []
    assert not sess.has("iter10/votes") and len(sess.accountant.events) == 10
    # a stored key is still served, since it costs nothing
    assert sess.gaussian("iter3/votes", np.zeros(3), 1.0, sigma, lattice=counts).shape == (3,)
    # the statement reports the achieved epsilon at the target delta
    st = sess.statement("user", (1.0, 1e-5))
    assert st["epsilon"] <= 1.0 and st["epsilon"] == pytest.approx(1.0, abs=1e-3)
    assert st["mechanisms"] == [
        {
            "mechanism": "discrete_gaussian",
            "sigma": sigma,
            "sensitivity": 1.0,
            "sampling_rate": 1.0,
            "name": "gaussian",
            "shifts": (1,),
            "grid": 1.0,
            "mu": 1.0 / sigma,
            "rho": 0.5 / sigma**2,
            "count": 10,
        }
    ]


def test_unsupported_event_is_refused_before_drawing(tmp_path: Path) -> None:
    noise = CountingNoise()
    sess = PrivacySession(tmp_path / "s", Accountant("gdp"), noise)
    with pytest.raises(PrivacyConfigError, match="gdp"):
        sess.exponential("pick", np.arange(3.0), 1.0, 1.0)
    with pytest.raises(PrivacyConfigError, match="continuous Gaussian"):
        sess.gaussian("sub", np.zeros(2), 1.0, 1.0, sampling_rate=0.1)
    assert noise.draws == 0 and sess.keys() == []


def test_record_replays_and_spent(tmp_path: Path) -> None:
    store = tmp_path / "s"
    sess = PrivacySession(store, Accountant("zcdp"), make_noise_source("seeded", 0), (8.0, 1e-3))
    sess.record("hist", ZCDPEvent(0.1, name="keyword_hist"), {"top": [3, 1, 2]})
    sess.record("centres", [GaussianEvent(10.0, 1.0, count=5, name="centre")])
    assert sess.record("hist", ZCDPEvent(0.1)) == {"top": [3, 1, 2]}  # stored, not charged
    spent = sess.spent()
    assert spent["releases"] == 2 and spent["accountant"] == "zcdp"
    assert sess.accountant.rho() == pytest.approx(0.1 + 5 / 200)
    reopened = PrivacySession(
        store, Accountant("zcdp"), make_noise_source("seeded", 0), (8.0, 1e-3)
    )
    assert reopened.get("hist") == {"top": [3, 1, 2]} and reopened.get("centres") is None
    assert reopened.epsilon() == pytest.approx(sess.epsilon())
    with pytest.raises(KeyError, match="nope"):
        reopened.get("nope")
    with pytest.raises(BudgetExceededError):
        reopened.record("more", ZCDPEvent(5.0))


# ------------------------------------------------------------------ one writer per store

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from dpsynth.privacy import Accountant, PrivacySession, make_noise_source

    sess = PrivacySession(Path(sys.argv[1]), Accountant("pld"), make_noise_source())
    print("ready", flush=True)
    sys.stdin.readline()  # hold the store until told to exit
    """
)


def test_a_second_process_cannot_open_the_store(tmp_path: Path) -> None:
    from dpsynth.privacy import StoreLockedError

    store = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match="another process"):
            PrivacySession(store, Accountant("pld"), make_noise_source())
    finally:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.close()
        proc.wait(timeout=60)
    # released at process exit: the store opens now
    sess = PrivacySession(store, Accountant("pld"), make_noise_source())
    sess.gaussian("k", np.zeros(2), 1.0, 5.0)
    sess.close()


def test_store_lock_is_released_on_close_and_superseded_in_process(tmp_path: Path) -> None:
    store = tmp_path / "store"
    old = PrivacySession(store, Accountant("pld"), make_noise_source("seeded", 1))
    old.gaussian("a", np.zeros(2), 1.0, 5.0)
    new = PrivacySession(store, Accountant("pld"), make_noise_source("seeded", 1))
    assert new.keys() == ["a"]
    with pytest.raises(PrivacyConfigError, match="superseded"):
        old.gaussian("b", np.zeros(2), 1.0, 5.0)  # a stale handle never appends
    new.gaussian("b", np.zeros(2), 1.0, 5.0)
    new.close()
    with pytest.raises(PrivacyConfigError, match="closed"):
        new.gaussian("c", np.zeros(2), 1.0, 5.0)
    # after close, another process may open it
    code = (
        "import sys; from pathlib import Path; from dpsynth.privacy import *; "
        "s = PrivacySession(Path(sys.argv[1]), Accountant('pld'), make_noise_source()); "
        "print(len(s.keys()))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "2", out.stderr


# ------------------------------------------------------------------ externally computed releases


def test_release_external_admits_before_computing(tmp_path: Path) -> None:
    sess = PrivacySession(
        tmp_path / "s", Accountant("pld"), make_noise_source(), target=(1.0, 1e-5)
    )
    calls: list[str] = []

    def compute() -> np.ndarray:
        calls.append("x")
        return np.arange(3.0)

    big = GaussianEvent(0.5, 1.0, name="secure_sum")  # far above epsilon 1
    with pytest.raises(BudgetExceededError):
        sess.release_external("fed/round0", big, compute)
    assert calls == [] and sess.keys() == []  # refused: nothing computed on private data
    ok = GaussianEvent(20.0, 1.0, name="secure_sum")
    out = sess.release_external("fed/round0", ok, compute)
    assert calls == ["x"] and np.array_equal(out, np.arange(3.0))
    again = sess.release_external("fed/round0", ok, compute)  # stored: not computed again
    assert calls == ["x"] and np.array_equal(again, out)
    assert sess.accountant.summary()[0]["count"] == 1
    with pytest.raises(PrivacyConfigError, match="at least one event"):
        sess.release_external("fed/round1", [], compute)
    sess.close()


def test_statement_states_noise_mode_and_note(tmp_path: Path) -> None:
    sess = PrivacySession(tmp_path / "s", Accountant("pld"), make_noise_source("seeded", 3))
    sess.gaussian("k", np.zeros(2), 1.0, 5.0)
    st = sess.statement("record", (5.0, 1e-5))
    assert st["noise"] == "seeded" and "only while the seed stays secret" in st["noise_note"]
    sess.close()
