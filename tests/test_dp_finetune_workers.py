"""DP-SGD's pass workers (issue 45's speed goal): the loop path's one-record passes split
between this process and spawned ones, each pass on one thread. The step's exact clipped sum
is the same bit for bit whatever the number of workers or the split (record level, user level,
the stored lower-layer states), a run resumed with another number continues the same run, a
failing or killed worker is a clear error, workers end with their parent, and a script that
calls dpsynth at top level (no main guard) is not run again in them. On the tiny Llama of
tests/test_dp_finetune.py; the real SmolLM2's check is tests/test_rows_apart.py's."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("opacus")
pytest.importorskip("peft")

from dpsynth.methods.dpfinetune.train import DPSGD, Example  # noqa: E402
from dpsynth.methods.dpfinetune.workers import default_workers, shares  # noqa: E402
from test_dp_finetune import Keys, Killed, _adapter, _examples, _settings, _tiny  # noqa: E402

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _digest(sums: list[Any]) -> str:
    return hashlib.sha256(b"".join(s.numpy().tobytes() for s in sums)).hexdigest()


def _sum(model: Any, workers: int, rows: np.ndarray, **over: Any) -> tuple[str, float]:
    groups = over.pop("groups", None)
    trainer = DPSGD(model, _examples(), _settings(clip=0.05, **over), None, None, 0,
                    groups=groups, workers=workers)
    try:
        sums, loss = trainer.clipped_sum(rows)
    finally:
        trainer.close()
    return _digest(sums), loss


def test_shares_deal_every_unit_once_and_balance_the_cost() -> None:
    """Every unit in one share, in its given order; the costliest first, each to the least
    loaded share (LPT): loads within the largest unit's cost of each other."""
    units = np.array([7, 3, 9, 1, 4])
    parts = shares(units, 3)
    assert [p.tolist() for p in parts] == [[7, 1], [3, 4], [9]]
    assert sorted(np.concatenate(parts).tolist()) == sorted(units.tolist())
    assert [p.tolist() for p in shares(units[:1], 3)] == [[7], [], []]
    cost = [10.0, 1.0, 1.0, 1.0, 9.0]
    assert [p.tolist() for p in shares(units, 2, cost)] == [[7, 9], [3, 1, 4]]
    rng = np.random.default_rng(0)
    many = rng.integers(30, 80, size=33).astype(float)
    loads = [many[p].sum() for p in shares(np.arange(33), 2, many)]
    assert abs(loads[0] - loads[1]) <= many.max()


def test_default_workers_follow_the_threads_and_the_memory_available() -> None:
    """One per thread while half the memory available holds them (600 MiB each besides half
    the model's bytes), never fewer than one."""
    gib, model = 1 << 30, 540 << 20
    assert default_workers(2, model, 16 * gib) == 2
    assert default_workers(16, model, 4 * gib) == 2  # 2048 MiB / 870 MiB
    assert default_workers(4, model, gib) == 1
    assert default_workers(3, 0, 0) == 1


@pytest.mark.parametrize("case", ["record", "stored states", "user"])
def test_the_sum_is_the_same_bits_whatever_the_workers(case: str) -> None:
    """One, two or three workers (each pass on one thread, the integer sums added): the
    step's exact clipped sum bit for bit, and the added record still moves it by its own
    clipped gradient (the check of tests/test_dp_finetune.py, here across processes)."""
    model = _tiny(last_layers=1 if case == "stored states" else None)
    over: dict[str, Any] = {}
    rows = np.arange(1, 9)
    if case == "user":
        over = {"unit": "user", "groups": [[0, 5], [1], [2, 6, 7], [3], [4, 8], [9]]}
        rows = np.arange(1, 6)
    got = {w: _sum(model, w, rows, **over) for w in (1, 2, 3)}
    assert len({d for d, _ in got.values()}) == 1, got
    assert {round(loss, 9) for _, loss in got.values()} == {round(got[1][1], 9)}
    if case == "record":  # adding record 0: the sum moves by its own clipped gradient
        trainer = DPSGD(model, _examples(), _settings(clip=0.05), None, None, 0, workers=2)
        base, _ = trainer.clipped_sum(rows)
        more, _ = trainer.clipped_sum(np.concatenate([[0], rows]))
        alone, _ = trainer.clipped_sum(np.array([0]))
        trainer.close()
        assert all(bool(((m - b) == a).all()) for b, m, a in zip(base, more, alone,
                                                                  strict=True))


def test_a_run_resumed_with_other_workers_is_the_same_run(tmp_path: Path) -> None:
    """Killed after step 3 with two workers and resumed with three, a run ends on the adapter
    of a run on one, bit for bit: the worker count is not part of the run."""
    whole = _tiny()
    DPSGD(whole, _examples(), _settings(), tmp_path / "a", Keys(), 0).run()

    def kill(name: str) -> None:
        if name == "dp_sgd-00003":
            raise Killed

    with pytest.raises(Killed):
        DPSGD(_tiny(), _examples(), _settings(), tmp_path / "b", Keys(), 0, workers=2,
              on_checkpoint=kill).run()
    resumed = _tiny()
    facts = DPSGD(resumed, _examples(), _settings(), tmp_path / "b", Keys(), 0,
                  workers=3).run()
    assert facts["steps_run"] == 3
    assert _adapter(resumed) == _adapter(whole)


def test_a_failing_worker_is_a_clear_error_and_the_pool_ends() -> None:
    """A pass that fails in a worker (here a token id past the vocabulary) raises here,
    naming the error's type and where, never a record's tokens; run() takes the pool down."""
    import psutil

    bad = [*_examples(4), Example((5, 6, 7, 63_000, 9, 10), 3)]
    trainer = DPSGD(_tiny(), bad, _settings(steps=1, q=1.0), None, None, 0, workers=2)
    pool = trainer.start_workers()
    assert pool is not None
    procs = [psutil.Process(p.pid) for p in pool.procs]
    with pytest.raises(RuntimeError, match="gradient worker failed: IndexError") as err:
        trainer.clipped_sum(np.array([0, 4]))  # the longer row 4 is the worker's share
    assert "63000" not in str(err.value) and "--resume" in str(err.value)
    assert trainer._pool is None  # taken down: no later step reads a stale reply
    assert not any(p.is_running() and p.status() != "zombie" for p in procs)
    with pytest.raises(ValueError, match="loop path's passes only"):
        DPSGD(_tiny(), _examples(), _settings(clipping="hooks"), None, None, 0, workers=2)


_SCRIPT = textwrap.dedent("""\
    import hashlib, sys, time
    import numpy as np, torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from dpsynth.methods.dpfinetune.train import DPSGD, Example, StepSettings, attach_lora
    print("top level", flush=True)  # no main guard: a spawned child must not run this again
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64)
    model = attach_lora(LlamaForCausalLM(cfg), 4, 8.0, ["q_proj", "v_proj"])
    rng = np.random.default_rng(5)
    ex = [Example(tuple(int(x) for x in rng.integers(1, 64, size=10)), 3) for _ in range(8)]
    settings = StepSettings(1.0, 1.0, 1, 8.0, 1.0, 1e-3, secure=False)
    for w in (1, int(sys.argv[1])):
        trainer = DPSGD(model, ex, settings, None, None, 0, workers=w)
        sums, _ = trainer.clipped_sum(np.arange(8))
        print(w, hashlib.sha256(b"".join(s.numpy().tobytes() for s in sums)).hexdigest(),
              flush=True)
        if sys.argv[2] == "hang" and w > 1:
            print("pids", *[p.pid for p in trainer._pool.procs], flush=True)
            time.sleep(600)
        trainer.close()
""")


def _script(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    path = tmp_path / "train_at_top_level.py"
    path.write_text(_SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.Popen([sys.executable, str(path), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_a_script_without_a_main_guard_is_not_run_again_in_the_workers(
        tmp_path: Path) -> None:
    proc = _script(tmp_path, "3", "end")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    lines = out.splitlines()
    assert lines.count("top level") == 1
    digests = {line.split()[1] for line in lines if line[:2] in ("1 ", "3 ")}
    assert len(digests) == 1 and len(lines) == 3


def test_workers_end_when_their_parent_is_killed(tmp_path: Path) -> None:
    """kill -9 of the process that trains: its workers see their pipe close and end."""
    import psutil

    proc = _script(tmp_path, "3", "hang")
    assert proc.stdout is not None
    pids: list[int] = []
    for line in proc.stdout:
        if line.startswith("pids"):
            pids = [int(x) for x in line.split()[1:]]
            break
    assert len(pids) == 2
    assert all(psutil.pid_exists(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 60
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    assert alive == [], "a worker outlived the killed trainer"


def test_workers_that_cannot_start_fail_the_run_before_any_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The method starts its pass workers before the label counts or DP-SGD are released: a
    pool that cannot start (here our own boundary, made to fail) stops the run before any
    mechanism runs, its budget held as reserved, and the resumed run ends charged once; a
    model the workers cannot be sent (an unpicklable attribute) fails in the real pool,
    which leaves no process behind."""
    import threading

    import psutil

    from dpsynth.methods.dpfinetune import train
    from dpsynth.privacy.ledger import BudgetLedger
    from test_dp_finetune import _config, _rows, _run, _tiny_model_dir, _write

    def refuse(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("a DP-SGD gradient worker stopped (killed, or out of memory)")

    monkeypatch.setattr(train, "PassWorkers", refuse)
    raw = _config(_write(tmp_path / "d.csv", _rows(12)), batch_size=4, records=12, epochs=1,
                  max_tokens=8, samples=2, max_new_tokens=2, workers=2)
    raw["generators"] = [{"model": str(_tiny_model_dir(tmp_path))}]
    raw["privacy"]["ledger"] = str(tmp_path / "ledger.json")
    with pytest.raises(Exception, match="gradient worker"):
        _run(raw, tmp_path / "run")
    assert not (tmp_path / "run" / "private" / "releases" / "releases.jsonl").exists()
    ledger = BudgetLedger(tmp_path / "ledger.json")
    assert [e["status"] for e in ledger.entries()] == ["reserved"]  # held, not settled
    monkeypatch.undo()
    _run(raw, tmp_path / "run", resume=True)  # the pool starts: the run ends, charged once
    assert [e["status"] for e in ledger.entries()] == ["settled"]
    releases = (tmp_path / "run" / "private" / "releases" / "releases.jsonl").read_text()
    assert releases.count('"key":"dp_sgd"') == 1

    odd = _tiny()
    odd.not_picklable = threading.Lock()
    trainer = DPSGD(odd, _examples(), _settings(), None, None, 0, workers=2)
    with pytest.raises(TypeError, match="pickle"):
        trainer.start_workers()
    assert trainer._pool is None
    assert [c for c in psutil.Process().children(recursive=True)
            if "spawn_main" in " ".join(c.cmdline())] == []


def test_the_plan_times_dp_sgd_on_public_records_of_the_longest_shape(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpsynth plan`` on a dp_finetune config: its gradients timed on the loop path's own
    code over public records (the run's prompt for a public sentence and max_tokens text
    tokens), cached, the training stage estimated over the pass workers; hooks are not."""
    from dpsynth import estimate as est
    from dpsynth.config import parse_config
    from dpsynth.methods import get_method
    from dpsynth.methods.dpfinetune.calibrate import RECORDS, trainer_for
    from test_dp_finetune import _config, _rows, _tiny_model_dir, _write

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    raw = _config(_write(tmp_path / "d.csv", _rows(12)), batch_size=4, records=12, epochs=1,
                  max_tokens=8, samples=2, max_new_tokens=2, workers=2)
    raw["generators"] = [{"model": str(_tiny_model_dir(tmp_path))}]
    cfg = parse_config(raw)
    method = get_method(cfg.method)
    probe = trainer_for(cfg, method.settings(cfg))
    lengths = {len(e.ids) - e.start for e in probe.examples}
    assert lengths == {8 + 1} and len(probe.examples) == RECORDS + 1  # text and end token
    assert method.gradients_per_second(probe) > 0
    work = est.TuneWork(3, 4.0, 8, 2, 2, workers=2)
    cache = est.RateCache()
    first = est.estimate_finetune(cfg, work, method=method, cache=cache,
                                  rates=([_rate(50.0)], ""))
    training = {s.stage: s for s in first.stages}["DP-SGD training"]
    assert training.seconds is not None and training.seconds > 0 and first.gradients
    again = est.estimate_finetune(cfg, work, method=method, cache=cache, calibrate=False,
                                  rates=([_rate(50.0)], ""))
    assert {s.stage: s for s in again.stages}["DP-SGD training"].seconds == training.seconds
    raw["dp_finetune"]["clipping"] = "hooks"
    hooks = parse_config(raw)
    assert method.training_key(hooks) is None
    stage = {s.stage: s for s in est.estimate_finetune(
        hooks, work, method=method, rates=([_rate(50.0)], "")).stages}["DP-SGD training"]
    assert stage.seconds is None and stage.note == est.FINETUNE_REASON


def _rate(per_s: float) -> Any:
    from dpsynth import estimate as est

    return est.Rate(per_s=per_s, load_s=0.0, seconds=1.0)
