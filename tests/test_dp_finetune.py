"""method dp_finetune (issue 45): exact tests of the accounting (the dp_accounting event of T
Poisson-subsampled Gaussian steps, cross-checked against Opacus's own RDP and PRV accountants
and dp_accounting's), the plan solving sigma before any model loads, checkpoint / resume on a
tiny randomly initialised Llama (no download), kill -9 and the audits through the generation API,
and short runs on the real SmolLM2 (one of them examples/tiny-dp-finetune.yaml itself). User
level (``privacy.unit: user``): the same event over users, each user's gradient clipped as one,
a run whose statement says so. ``dpsynth bench dp-finetune``: the shape of its result."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("opacus")
pytest.importorskip("peft")

from dpsynth.cli import app  # noqa: E402
from dpsynth.evolution.prompts import cut_share  # noqa: E402
from dpsynth.methods.dpfinetune import accounting  # noqa: E402
from dpsynth.methods.dpfinetune.frozen import decoder_layers  # noqa: E402
from dpsynth.methods.dpfinetune.train import (  # noqa: E402
    DPSGD,
    Example,
    StepSettings,
    attach_lora,
)
from dpsynth.methods.loop import MOSTLY_CUT  # noqa: E402

#: (q, sigma, T) of the cross-checks: a long small-q run, a short one, a large q
CASES = [(0.01, 1.0, 1000), (0.064, 0.9, 16), (0.2, 2.0, 50)]
DELTA = 1e-5
INT_ORDERS = [2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 32.0, 64.0]


# ------------------------------------------------------------------------------ accounting
def test_the_event_is_the_poisson_subsampled_gaussian_self_composed() -> None:
    from dp_accounting import dp_event

    ev = accounting.dp_sgd_dp_event(0.9, 0.064, 16)
    assert ev == dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(0.064, dp_event.GaussianDpEvent(0.9)), 16)
    # the session's release event says the same to the accountant
    assert accounting.dp_sgd_event(0.9, 0.064, 16).dp_event() == ev


@pytest.mark.parametrize(("q", "sigma", "steps"), CASES)
def test_rdp_matches_opacus_order_by_order(q: float, sigma: float, steps: int) -> None:
    """The RDP of the event (dp_accounting) equals Opacus's compute_rdp at every integer
    order, and both convert to the same epsilon."""
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib
    from opacus.accountants.analysis import rdp as opacus_rdp

    acc = rdp_lib.RdpAccountant(INT_ORDERS)
    acc.compose(accounting.dp_sgd_dp_event(sigma, q, steps))
    ours = np.asarray(acc._rdp)
    theirs = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=INT_ORDERS)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)
    eps_theirs = opacus_rdp.get_privacy_spent(orders=INT_ORDERS, rdp=theirs, delta=DELTA)[0]
    assert acc.get_epsilon(DELTA) == pytest.approx(eps_theirs, rel=1e-9)


@pytest.mark.parametrize(("q", "sigma", "steps"), CASES)
def test_run_epsilon_against_dp_accounting_and_opacus(q: float, sigma: float,
                                                      steps: int) -> None:
    """The project's accountant on the run's events: 'pld' is dp_accounting's PLD of the
    event (exactly) and within 1% of Opacus's PRV accountant; 'rdp' is within 0.1% of
    Opacus's RDP accountant (another grid of orders)."""
    from dp_accounting.pld import pld_privacy_accountant as pld_lib
    from opacus.accountants import PRVAccountant, RDPAccountant

    pld = pld_lib.PLDAccountant()
    pld.compose(accounting.dp_sgd_dp_event(sigma, q, steps))
    ours_pld = accounting.run_epsilon(sigma, q, steps, DELTA, "pld")
    assert ours_pld == pytest.approx(pld.get_epsilon(DELTA), rel=1e-9)
    prv = PRVAccountant()
    prv.history = [(sigma, q, steps)]
    assert ours_pld == pytest.approx(prv.get_epsilon(DELTA), rel=1e-2)
    rdp = RDPAccountant()
    rdp.history = [(sigma, q, steps)]
    assert accounting.run_epsilon(sigma, q, steps, DELTA, "rdp") == pytest.approx(
        rdp.get_epsilon(DELTA), rel=1e-3)


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_solved_noise_multiplier_is_the_smallest_that_meets_the_target(kind: str) -> None:
    q, steps = accounting.schedule(2000, 64, 3.0)
    assert (q, steps) == (0.032, 94)
    solved = {}
    # 'pld' (each PLD evaluation is costly) checks the search on the plan with the label
    # counts, the composed one; the plan without them is the same search on fewer events,
    # checked under 'rdp' here and solved under 'pld' by the user-level plan test below
    for label_sigma in (None, 20.0) if kind == "rdp" else (20.0,):
        sigma = accounting.solve_noise_multiplier(4.0, DELTA, q, steps, kind, label_sigma)
        assert accounting.run_epsilon(sigma, q, steps, DELTA, kind, label_sigma) <= 4.0
        assert accounting.run_epsilon(sigma - 2e-3, q, steps, DELTA, kind, label_sigma) > 4.0
        solved[label_sigma] = sigma
    if kind == "rdp":  # the label counts take part of the budget: more gradient noise
        assert solved[20.0] > solved[None]


def test_schedule_and_accountants() -> None:
    assert accounting.schedule(100, 200, 1.0) == (1.0, 1)  # B >= n: full batch
    assert accounting.schedule(1000, 10, 0.5) == (0.01, 50)
    from dpsynth.config import ConfigError

    with pytest.raises(ConfigError, match="cannot account"):
        accounting.check_accountant("zcdp")


# --------------------------------------------------------------------------------- the plan
def _config(data: Path, **section: Any) -> dict[str, Any]:
    return {"method": "dp_finetune",
            "data": {"path": str(data), "text": "text", "labels": ["label"],
                     "label_values": {"label": ["billing", "clinical"]}},
            "privacy": {"epsilon": 2.0, "delta": 1e-5, "noise": "seeded", "seed": 11,
                        "accountant": "rdp"},
            "prompts": {"label_template": "About {label}."},
            "dp_finetune": {"secure_mode": False, **section}}


def _rows(n: int) -> list[dict[str, str]]:
    return [{"text": f"patient {i} asks about {'a bill' if i % 3 else 'a fever'} today",
             "label": "billing" if i % 3 else "clinical"} for i in range(n)]


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["text", "label"])
        w.writeheader()
        w.writerows(rows)
    return path


def test_plan_solves_sigma_before_any_model_loads(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsynth.config import parse_config
    from dpsynth.data import load_dataset
    from dpsynth.llm import local
    from dpsynth.methods import get_method
    from dpsynth.run_folder import RunDir

    def no_model(*a: Any, **k: Any) -> None:
        raise AssertionError("plan loaded a model")

    monkeypatch.setattr(local.LocalGenerator, "__init__", no_model)
    cfg = parse_config(_config(_write(tmp_path / "d.csv", _rows(50)), batch_size=5,
                               epochs=2))
    ds = load_dataset(tmp_path / "d.csv", "text", ["label"],
                      label_values={"label": ["billing", "clinical"]})
    run = RunDir(tmp_path / "run")
    run.private.mkdir(parents=True)
    method = get_method("dp_finetune")
    plan = method.plan(cfg, ds, run)
    assert plan.guarantee == "dp" and plan.target == (2.0, 1e-5)
    assert plan.notes["q"] == 0.1 and plan.notes["steps"] == 20
    assert plan.sigma == accounting.solve_noise_multiplier(2.0, 1e-5, 0.1, 20, "rdp", 20.0)
    saved = json.loads((run.private / "plan.json").read_text())
    assert saved["noise_multiplier"] == plan.sigma and saved["records"] == 50


def test_check_refuses_what_it_cannot_state(tmp_path: Path) -> None:
    from dpsynth.config import ConfigError, parse_config
    from dpsynth.methods import get_method

    data = _write(tmp_path / "d.csv", _rows(10))
    method = get_method("dp_finetune")
    for over, match in ((("privacy", "accountant", "zcdp"), "cannot account"),
                        (("dp_finetune", "users", 10), "privacy.unit: user"),
                        (("dp_finetune", "max_records_per_user", 2), "privacy.unit: user"),
                        (("dp_finetune", "secure_mode", True), "secure_mode")):
        raw = _config(data)
        raw[over[0]][over[1]] = over[2]
        with pytest.raises(ConfigError, match=match):
            method.check(parse_config(raw))


# ----------------------------------------------------------------- training on a tiny model
def _tiny(seed: int = 0, vocab: int = 64, last_layers: int | None = None) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64)
    return attach_lora(LlamaForCausalLM(cfg), 4, 8.0, ["q_proj", "v_proj"], last_layers)


def _examples(n: int = 24) -> list[Example]:
    rng = np.random.default_rng(5)
    return [Example(tuple(int(x) for x in rng.integers(1, 64, size=int(rng.integers(6, 14)))),
                    3) for _ in range(n)]


class Keys:
    """A seeded noise source that records every key it is asked for."""

    def __init__(self, seed: int = 3) -> None:
        from dpsynth.privacy import SeededNoise

        self.noise = SeededNoise(seed)
        self.keys: list[str] = []

    def __call__(self, key: str) -> Any:
        self.keys.append(key)
        return self.noise.spawn(key)


def _settings(**over: Any) -> StepSettings:
    base = {"noise_multiplier": 1.1, "q": 0.25, "steps": 6, "expected_batch": 6.0, "clip": 1.0,
            "learning_rate": 5e-2, "clipping": "loop", "micro_batch": 4,
            "checkpoint_every": 1, "secure": False}
    return StepSettings(**{**base, **over})


def _adapter(model: Any) -> dict[str, bytes]:
    return {n: p.detach().numpy().tobytes() for n, p in model.named_parameters()
            if p.requires_grad}


class Killed(Exception):
    pass


@pytest.mark.parametrize("every", [1, 2])
def test_kill_and_resume_continues_from_the_last_checkpoint(tmp_path: Path, every: int) -> None:
    """A run stopped after step 3 (checkpointed after step 3 with every = 1, after step 2
    with every = 2) and resumed in a fresh process (a fresh model) ends with the same adapter,
    bit for bit, as a run never stopped: no step is skipped, none of the checkpointed steps is
    redone, a redone step draws the same coins and noise from its keyed streams."""
    whole_keys = Keys()
    whole = _tiny()
    DPSGD(whole, _examples(), _settings(checkpoint_every=every), tmp_path / "a", whole_keys,
          0).run()

    def kill(name: str) -> None:
        if name == "dp_sgd-00003" or (every == 2 and name == "dp_sgd-00002"):
            raise Killed

    first = _tiny()
    keys1 = Keys()
    stopped = DPSGD(first, _examples(), _settings(checkpoint_every=every), tmp_path / "b",
                    keys1, 0, on_checkpoint=kill)
    with pytest.raises(Killed):
        stopped.run()
    done = 3 if every == 1 else 2
    assert stopped.step == done
    second = _tiny()  # a fresh process: the same base model, the adapter from the checkpoint
    keys2 = Keys()
    resumed = DPSGD(second, _examples(), _settings(checkpoint_every=every), tmp_path / "b",
                    keys2, 0)
    facts = resumed.run()
    assert facts["steps_run"] == 6 - done
    assert _adapter(second) == _adapter(whole)
    assert not any(f"step{t}/" in k for k in keys2.keys for t in range(done))
    assert keys1.keys + keys2.keys == whole_keys.keys[:2 * done] + whole_keys.keys[2 * done:]


def test_a_finished_run_resumed_trains_nothing(tmp_path: Path) -> None:
    model = _tiny()
    DPSGD(model, _examples(), _settings(steps=2), tmp_path, Keys(), 0).run()
    again = _tiny()
    keys = Keys()
    assert DPSGD(again, _examples(), _settings(steps=2), tmp_path, keys, 0).run()[
        "steps_run"] == 0
    assert keys.keys == [] and _adapter(again) == _adapter(model)
    with pytest.raises(RuntimeError, match="other DP-SGD settings"):
        DPSGD(_tiny(), _examples(), _settings(steps=3), tmp_path, Keys(), 0).run()


@pytest.mark.parametrize("mode", ["loop", "hooks"])
def test_the_clipped_sum_is_exact_and_rows_apart(tmp_path: Path, mode: str) -> None:
    """One record added to a batch moves the exact (fixed-point integer) sum of clipped
    gradients by that record's own clipped gradient, bit for bit, and every clipped gradient
    has norm <= C: on ``loop`` (one record a pass) and on ``hooks`` (fixed-shape passes of 3
    rows: the added record shifts every other record to another row and pass); ghost clipping
    computes the same clipped sum up to float rounding. Every record's text starts at 3
    (``first_target``): hooks passes keep the logits from position 2 on (loop keeps each
    record's own)."""
    ex = _examples()
    trainer = DPSGD(_tiny(), ex, _settings(clip=0.05, clipping=mode, micro_batch=3), tmp_path,
                    Keys(), 0, first_target=3)
    rows = np.arange(1, 9)
    base, _ = trainer.clipped_sum(rows)
    more, _ = trainer.clipped_sum(np.concatenate([[0], rows]))
    alone, _ = trainer.clipped_sum(np.array([0]))
    for b, m, a in zip(base, more, alone, strict=True):
        assert bool(((m - b) == a).all())
    norm = math.sqrt(sum(float((a.double() / 2**32).pow(2).sum()) for a in alone))
    assert 0 < norm <= 0.05
    other_mode = "ghost" if mode == "loop" else "loop"
    other = DPSGD(_tiny(), ex, _settings(clip=0.05, clipping=other_mode, micro_batch=3),
                  tmp_path / other_mode, Keys(), 0)
    sums, _ = other.clipped_sum(rows)
    for b, s in zip(base, sums, strict=True):
        np.testing.assert_allclose(s.double().numpy() / 2**32, b.double().numpy() / 2**32,
                                   atol=1e-6)


def test_the_loss_from_the_kept_logits_is_the_full_ones() -> None:
    """The loop path projects only the positions that predict a record's text
    (``logits_to_keep``): the same loss and gradient as from every position, up to float
    rounding; a target before the kept positions is refused, never dropped."""
    import torch

    from dpsynth.methods.dpfinetune.train import (
        collate,
        per_sample_loss,
        target_positions,
        trainable,
    )

    model = _tiny()
    params = [p for _, p in trainable(model)]
    for e in _examples(4):
        ids, attn, target = collate([e], 0)
        full = per_sample_loss(model, ids, attn, target)
        g_full = torch.cat([g.ravel() for g in torch.autograd.grad(full.sum(), params)])
        kept = per_sample_loss(model, ids, attn, target, keep=target_positions(e))
        g_kept = torch.cat([g.ravel() for g in torch.autograd.grad(kept.sum(), params)])
        torch.testing.assert_close(kept, full)
        torch.testing.assert_close(g_kept, g_full)
        assert float(g_full.abs().max()) > 0
    with pytest.raises(ValueError, match="before the logits kept"):
        per_sample_loss(model, ids, attn, target, keep=target_positions(e) - 1)


def test_hooks_passes_have_a_fixed_shape_set_by_each_record_alone() -> None:
    """The hooks path's passes: every record once, at the width its own length gives (never
    the longest record's), ``micro_batch`` rows a pass with filler rows that carry no target;
    loop is one record a pass."""
    import torch

    from dpsynth.methods.dpfinetune.train import fixed_shape_batch, hooks_keep, passes

    ex = [Example(tuple(range(1, n + 1)), 2) for n in (5, 17, 40, 16, 70, 3)]
    got = passes(ex, np.arange(6), "hooks", 2)
    assert sorted(int(i) for _, part in got for i in part) == list(range(6))
    assert all(len(part) <= 2 for _, part in got)
    width_of = {int(i): w for w, part in got for i in part}
    assert width_of == {0: 16, 1: 32, 2: 48, 3: 16, 4: 96, 5: 16}
    assert [len(part) for _, part in passes(ex, np.arange(6), "loop", 2)] == [1] * 6
    ids, attn, target = fixed_shape_batch([ex[0]], 16, 3, pad_id=0)
    assert tuple(ids.shape) == (3, 16) and tuple(target.shape) == (3, 15)
    assert attn[0].tolist() == [1] * 5 + [0] * 11 and target[0].sum() == 3
    assert attn[1:].sum(dim=1).tolist() == [1, 1] and not bool(target[1:].any())
    assert torch.equal(ids[1:], torch.zeros((2, 16), dtype=torch.long))
    with pytest.raises(ValueError, match="fixed shape"):
        fixed_shape_batch([ex[1]], 16, 3, pad_id=0)
    # the logits a pass keeps: from the position before the earliest possible target on
    assert [hooks_keep(16, t) for t in (1, 2, 3, 16)] == [0, 15, 14, 1]
    with pytest.raises(ValueError, match="first_target"):
        DPSGD(_tiny(), ex, _settings(clipping="hooks"), Path("/nonexistent"), Keys(), 0,
              first_target=3)  # ex's starts are 2


def test_the_noise_has_the_planned_scale(tmp_path: Path) -> None:
    """An empty batch: the update direction is the noise alone, (sigma C / B) N(0, I)."""
    model = _tiny()
    trainer = DPSGD(model, _examples(), _settings(noise_multiplier=2.0, clip=0.5,
                                                  expected_batch=4.0), tmp_path, Keys(), 0)
    zeros = [np.zeros(p.shape, dtype=np.int64) for _, p in trainer.params]
    import torch

    grads = trainer.noisy_gradient(0, [torch.from_numpy(z) for z in zeros])
    flat = torch.cat([g.reshape(-1) for g in grads]).double().numpy()
    assert flat.size >= 1024
    assert np.std(flat) == pytest.approx(2.0 * 0.5 / 4.0, rel=0.1)
    secure = DPSGD(model, _examples(), _settings(noise_multiplier=2.0, clip=0.5,
                                                 expected_batch=4.0, secure=True),
                   tmp_path, Keys(), 0)
    flat2 = torch.cat([g.reshape(-1) for g in secure.noisy_gradient(
        0, [torch.from_numpy(z) for z in zeros])]).double().numpy()
    assert np.std(flat2) == pytest.approx(0.25, rel=0.1)  # sum of 4 / 2: the same std


# -------------------------------------------------------------- through the runner: resume
def _tiny_model_dir(root: Path) -> Path:
    """A 2-layer, hidden-32 random Llama saved with SmolLM2's tokenizer (from the local model
    cache; the test skips without it): a local generator directory, no download."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from dpsynth.llm.models import default_model_cache

    src = default_model_cache() / "smollm2"
    if not (src / "tokenizer.json").is_file():
        pytest.skip("SmolLM2's converted weights are not in the model cache")
    tok = AutoTokenizer.from_pretrained(str(src))
    import torch

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=128, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id)
    out = root / "tiny-llama"
    LlamaForCausalLM(cfg).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    for name in ("generation_config.json",):
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out


def _run(cfg: dict[str, Any], out: Path, *, resume: bool = False, hooks: Any = None) -> Path:
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config

    return run_generation(parse_config(cfg), out, resume=resume, progress=False, hooks=hooks)


def test_kill_and_resume_through_the_runner(tmp_path: Path) -> None:
    """A run stopped after its third checkpoint and resumed with ``--resume`` releases the
    same texts as a run never stopped, pays the budget once, and keeps the per-step losses in
    private/ only."""
    from dpsynth.hooks import RunHooks

    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(40))
    section = {"batch_size": 8, "epochs": 1, "records": 40, "max_tokens": 24, "samples": 4,
               "max_new_tokens": 8, "sample_batch": 2}
    raw = _config(data, **section)
    raw["generators"] = [{"model": str(model_dir)}]

    def ledger(name: str) -> dict[str, Any]:
        return {**raw, "privacy": {**raw["privacy"],
                                   "ledger": str(tmp_path / f"{name}.ledger.json")}}

    whole = _run(ledger("whole"), tmp_path / "whole")

    def stop(name: str) -> None:
        if name == "dp_sgd-00003":
            raise KeyboardInterrupt

    from dpsynth.errors import DpsynthError

    with pytest.raises((KeyboardInterrupt, DpsynthError)):
        _run(ledger("killed"), tmp_path / "killed", hooks=RunHooks(on_checkpoint=stop))
    killed = tmp_path / "killed"
    assert json.loads((killed / "run.json").read_text())["status"] == "interrupted"
    _run(ledger("killed"), killed, resume=True)
    a = (whole / "release" / "synthetic.jsonl").read_text()
    b = (killed / "release" / "synthetic.jsonl").read_text()
    assert a == b and len(a.splitlines()) == 4
    # the tiny model's 8-token samples stop mid-sentence: the run says so, with what to change
    texts = [json.loads(x)["text"] for x in a.splitlines()]
    warned = "stop mid-sentence" in (whole / "log.txt").read_text()
    assert cut_share(texts) > MOSTLY_CUT and warned
    assert "dp_finetune.max_tokens" in (whole / "log.txt").read_text()
    steps = [json.loads(x) for x in (killed / "private" / "dp-finetune" / "steps.jsonl")
             .read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]  # 5 = ceil(1 / (8 / 40))
    releases = (killed / "private" / "releases" / "releases.jsonl").read_text()
    assert releases.count('"key":"dp_sgd"') == 1
    privacy = json.loads((killed / "release" / "privacy.json").read_text())
    assert privacy["epsilon"] <= 2.0 and privacy["method"] == "dp_finetune"
    assert privacy == {**json.loads((whole / "release" / "privacy.json").read_text()),
                       "releases": privacy["releases"]}
    for f in (killed / "release").iterdir():
        assert "loss" not in f.read_text()
    # stopped after its last step, before the release: the resume trains nothing, says so,
    # and draws the same release from the same adapter
    def stop_last(name: str) -> None:
        if name == "dp_sgd-00005":
            raise KeyboardInterrupt

    with pytest.raises((KeyboardInterrupt, DpsynthError)):
        _run(ledger("late"), tmp_path / "late", hooks=RunHooks(on_checkpoint=stop_last))
    late = _run(ledger("late"), tmp_path / "late", resume=True)
    assert (late / "release" / "synthetic.jsonl").read_text() == a
    assert "resumed after the last step; nothing trained again" in (late / "log.txt").read_text()
    assert len((late / "private" / "dp-finetune" / "steps.jsonl").read_text().splitlines()) == 5


def _config_file(path: Path, data: Path, model_dir: Path, ledger: Path, **section: Any
                 ) -> Path:
    """A config file on the tiny model with its own ledger, for the CLI and the audits."""
    raw = _config(data, **section)
    raw["generators"] = [{"model": str(model_dir)}]
    raw["privacy"]["ledger"] = str(ledger)
    path.write_text(yaml.safe_dump(raw))
    return path


def test_sigkill_mid_training_and_resume_through_the_cli(tmp_path: Path) -> None:
    """kill -9 of `dpsynth generate` in the middle of DP-SGD, then `--resume`: the release is
    byte-identical to an uninterrupted run's, the training continued from the last checkpoint
    (no step lost, none trained twice past it), the budget was reserved once and settled once,
    and the one dp_sgd release is the planned one."""
    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(240))
    section = {"batch_size": 8, "epochs": 1, "records": 240, "max_tokens": 24, "samples": 4,
               "max_new_tokens": 8, "sample_batch": 2}

    def config(name: str) -> Path:
        return _config_file(tmp_path / f"{name}.yaml", data, model_dir,
                            tmp_path / f"{name}.ledger.json", **section)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def generate(name: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "dpsynth.cli", "generate", str(config(name)), "--output",
                str(tmp_path / name), "--quiet", *extra]

    whole = subprocess.run(generate("whole"), env=env, capture_output=True, text=True,
                           timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    steps_file = tmp_path / "killed" / "private" / "dp-finetune" / "steps.jsonl"
    proc = subprocess.Popen(generate("killed"), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if steps_file.is_file() and len(steps_file.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL  # killed mid-training, not finished
    killed = tmp_path / "killed"
    done_before = len(steps_file.read_text().splitlines())
    assert 3 <= done_before < 30  # ceil(1 / (8 / 240)) = 30 steps
    assert json.loads((killed / "run.json").read_text())["status"] == "running"
    resumed = subprocess.run(generate("killed", "--resume"), env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert ((killed / "release" / "synthetic.jsonl").read_bytes()
            == (tmp_path / "whole" / "release" / "synthetic.jsonl").read_bytes())
    steps = [json.loads(x)["step"] for x in steps_file.read_text().splitlines()]
    assert sorted(set(steps)) == list(range(1, 31)) and len(steps) <= 31
    releases = (killed / "private" / "releases" / "releases.jsonl").read_text()
    assert releases.count('"key":"dp_sgd"') == 1
    ledger = json.loads((tmp_path / "killed.ledger.json").read_text())
    assert len(ledger["entries"]) == 1 and ledger["entries"][0]["status"] == "settled"
    privacy = json.loads((killed / "release" / "privacy.json").read_text())
    assert privacy == {**json.loads((tmp_path / "whole" / "release" / "privacy.json")
                                    .read_text()), "releases": privacy["releases"]}


def test_the_empirical_audits_cover_a_dp_finetune_run(tmp_path: Path) -> None:
    """The canary audit plants its secret and runs dp_finetune through the generation API the
    CLI passes it; the DCR, membership-inference and PII audits open the run it made and
    report numbers only (no private text)."""
    from dpsynth.api import run_generation
    from dpsynth.eval.canary import run_canary_audit
    from dpsynth.eval.suite import audit_run
    from fakes import FakeEmbedder

    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(40))
    cfg = _config_file(tmp_path / "cfg.yaml", data, model_dir, tmp_path / "ledger.json",
                       batch_size=8, epochs=1, records=40, max_tokens=24, samples=4,
                       max_new_tokens=8, sample_batch=2)
    canary = "the vault code of Quillon Mabberwick is 55-19-73"
    report = run_canary_audit(cfg, tmp_path / "audit", generate=run_generation, canary=canary,
                              copies=3, progress=False)
    assert report["method"] == "dp_finetune" and report["private_records"] == 40
    assert report["synthetic"]["outputs"] == 4 and report["synthetic"]["exact"] == 0
    run = Path(report["run_dir"])
    planted = (tmp_path / "audit" / "private").glob("canary_data*")
    assert canary in next(planted).read_text()
    holdout = _write(tmp_path / "holdout.csv", [
        {"text": f"visitor {i} writes about {'parking' if i % 2 else 'a refill'}",
         "label": "billing"} for i in range(20)])
    audit = audit_run(run, holdout, embedder=FakeEmbedder())
    assert audit["method"] == "dp_finetune"
    assert 0.0 <= audit["membership_inference"]["auc"] <= 1.0  # computed, not unavailable
    assert audit["dcr"]["n_synthetic"] == 4 and "pii" in audit
    assert canary not in json.dumps(audit) and "patient 1 " not in json.dumps(audit)
    assert (run / "private" / "eval" / "audit.json").is_file()


# ---------------------------------------------------------------------- the real generator
def test_a_short_run_on_the_real_smollm2(tmp_path: Path, smollm: Any) -> None:
    """Two DP-SGD steps on SmolLM2-135M (loop per-sample gradients), a handful of records,
    then 2 samples: the release holds texts and the statement, with epsilon from the
    accountant at the target."""
    data = _write(tmp_path / "d.csv", _rows(6))
    raw = _config(data, batch_size=3, epochs=1, records=6, max_tokens=16, samples=2,
                  max_new_tokens=4)
    out = tmp_path / "run"
    from dpsynth.api import run_generation
    from dpsynth.config import parse_config

    run_generation(parse_config(raw), out, progress=False, generators=[smollm])
    rows = [json.loads(x) for x in (out / "release" / "synthetic.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 2 and all(r["generator"] == "dp_finetune:smollm2" for r in rows)
    privacy = json.loads((out / "release" / "privacy.json").read_text())
    assert privacy["epsilon"] == pytest.approx(2.0, rel=1e-3) and privacy["epsilon"] <= 2.0
    assert [m["name"] for m in privacy["mechanisms"]] == ["label_counts", "dp_sgd"]
    assert privacy["mechanisms"][1]["count"] == 2
    steps = (out / "private" / "dp-finetune" / "steps.jsonl").read_text().splitlines()
    assert len(steps) == 2
    # the caller's model was not touched (the adapter went into a fresh copy)
    assert not any("lora" in n for n, _ in smollm.model.named_parameters())
    # the release was drawn by the sampling engine on the merged model, which is gone now
    # (the adapter stays)
    log = (out / "log.txt").read_text()
    assert f"sampling the release from the tuned model on {smollm.engine}" in log
    assert not (out / "private" / "dp-finetune" / "tuned-model").exists()
    assert (out / "private" / "dp-finetune" / "adapter").is_dir()


def test_the_tiny_example_on_the_real_smollm2(tmp_path: Path, smollm: Any) -> None:
    """examples/tiny-dp-finetune.yaml itself on the real SmolLM2, cut short through overrides
    (two DP-SGD steps instead of eight, two 4-token samples): its data, labels, accountant and
    DP-SGD settings are the example's, and the statement is the one it plans."""
    from dpsynth.api import run_generation

    example = Path(__file__).resolve().parents[1] / "examples" / "tiny-dp-finetune.yaml"
    out = run_generation(example, tmp_path / "run", progress=False, generators=[smollm],
                         overrides={"dp_finetune.epochs": 0.25, "dp_finetune.samples": 2,
                                    "dp_finetune.max_new_tokens": 4,
                                    "privacy.ledger": str(tmp_path / "ledger.json")})
    privacy = json.loads((out / "release" / "privacy.json").read_text())
    assert privacy["method"] == "dp_finetune" and privacy["epsilon"] <= 4.0
    assert privacy["epsilon"] == pytest.approx(4.0, rel=1e-3)  # sigma solved for the target
    sgd = privacy["mechanisms"][1]
    assert sgd["name"] == "dp_sgd" and sgd["count"] == 2  # ceil(0.25 / (16 / 120))
    rows = [json.loads(x) for x in (out / "release" / "synthetic.jsonl").read_text()
            .splitlines()]
    assert len(rows) == 2 and all("department" in r["labels"] for r in rows)


def test_training_runs_on_every_core_not_the_idle_ones_at_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DP-SGD runs for minutes: it trains on the configured threads, else every core, never
    on the cores idle when the run started (a one-minute load left by the job before it once
    held a 2000-record training to one of two cores). Here the idle-core rule says 1. The
    loop path's passes run in as many processes (pass workers, one thread each), or in
    ``dp_finetune.workers``."""
    import torch

    from dpsynth.llm import runtime
    from dpsynth.methods.dpfinetune import method

    if runtime.available_cores() < 2:
        pytest.skip("one core: nothing to tell apart")
    from dpsynth.llm import local

    # the generator reads the rule through its own import of the name
    monkeypatch.setattr(runtime, "default_threads", lambda: 1)
    monkeypatch.setattr(local, "default_threads", lambda: 1)
    seen: list[int] = []
    run = method.DPSGD.run

    def spy(self: Any, *a: Any, **k: Any) -> Any:
        seen.append(torch.get_num_threads())
        workers.append(self.workers)
        return run(self, *a, **k)

    workers: list[int] = []

    monkeypatch.setattr(method.DPSGD, "run", spy)
    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(8))
    raw = _config(data, batch_size=4, epochs=1, records=8, max_tokens=8, samples=2,
                  max_new_tokens=2)
    raw["generators"] = [{"model": str(model_dir), "engine": "transformers"}]
    _run(raw, tmp_path / "run")
    assert seen == [runtime.available_cores()] == workers
    said = f"passes in {runtime.available_cores()} process(es), one thread each"
    assert said in (tmp_path / "run" / "log.txt").read_text()
    assert torch.get_num_threads() == 1  # the generator's count again after the training
    raw["generators"][0]["threads"] = 1  # configured threads are kept
    raw["privacy"].pop("seed")  # a seed's noise is drawn once (the ledger refuses a reuse)
    seen.clear()
    workers.clear()
    _run(raw, tmp_path / "run1")
    assert seen == [1] == workers
    raw["dp_finetune"]["workers"] = 3
    workers.clear()
    _run(raw, tmp_path / "run2")
    assert workers == [3]


def test_the_merged_model_is_the_tuned_model(tmp_path: Path) -> None:
    """The release's engine runs the adapter merged into the weights: its next-token logits
    are the peft model's (up to float32 rounding), and a prompt text tokenises to the training
    prompt's ids; the same draws give the same texts, and on ``openvino`` (f32 or bf16, as the
    CPU has) a sample follows its own seed whatever is drawn beside it."""
    import torch
    from transformers import AutoModelForCausalLM

    from dpsynth.llm.local import LocalGenerator
    from dpsynth.methods.dpfinetune.sample import engine_draw, tuned_generator
    from dpsynth.methods.dpfinetune.train import attach_lora

    model_dir = _tiny_model_dir(tmp_path)
    base = LocalGenerator(model_dir, engine="transformers")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = attach_lora(model, 4, 8.0, ["q_proj", "v_proj"], None)
    torch.manual_seed(1)
    with torch.no_grad():  # a trained adapter: B is 0 at init, which would merge to nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ids = torch.tensor([base.encode_prompt("It is about sleep.\n")])
    with torch.no_grad():
        want = model(input_ids=ids).logits[0, -1]
        before = AutoModelForCausalLM.from_pretrained(str(model_dir))(input_ids=ids).logits
    assert (want - before[0, -1]).abs().max() > 1e-3  # the adapter moves the logits
    tuned = tuned_generator(model, base, tmp_path / "tuned", engine="transformers",
                            batch_size=None, threads=None, device="cpu")
    got = torch.as_tensor(tuned.next_token_logits_ids([ids[0].tolist()])[0])
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    prompts = ["It is about sleep.\n", "It is about a rash.\n"]
    heads = [base.encode_prompt(p) for p in prompts]
    for engine in ("transformers", "openvino"):
        eng = tuned_generator(model, base, tmp_path / f"tuned-{engine}", engine=engine,
                              batch_size=None, threads=2, device="cpu")
        draw = engine_draw(eng, prompts, heads, max_new_tokens=6, temperature=1.0,
                           top_p=1.0, top_k=50)
        beside = draw([(0, 3), (1, 7), (0, 11)])
        assert draw([(0, 3), (1, 7), (0, 11)]) == beside  # the same draws, the same texts
        if engine == "openvino":  # a sample follows its own seed (others: the batch's)
            assert draw([(1, 7)]) == [beside[1]]
    with pytest.raises(Exception, match="tokenises differently"):
        engine_draw(tuned, ["It is about sleep."], [heads[0]], max_new_tokens=2,
                    temperature=1.0, top_p=1.0, top_k=None)


def test_label_heads_on_the_real_smollm2(smollm: Any) -> None:
    """``plain``: the label sentence and a newline; ``chat``: the zero-shot request (task,
    label sentence, writer as the system message) in SmolLM2's chat template with the
    assistant's turn open, so a record's text and a sample follow that turn."""
    from dpsynth.config import PromptConfig
    from dpsynth.methods.dpfinetune.prompts import label_heads

    prompts = PromptConfig(task="a short note to a clinic", writer="a patient")
    sentences = ["It is about sleep.", "It is about a rash."]
    plain = label_heads(smollm, sentences, prompts, "plain")
    assert plain == [smollm.encode_prompt(s + "\n") for s in sentences]
    chat = [smollm.tokenizer.decode(h) for h in label_heads(smollm, sentences, prompts, "chat")]
    for text, sentence in zip(chat, sentences, strict=True):
        assert "You are a patient." in text and "Write a short note to a clinic." in text
        assert sentence in text and text.rstrip().endswith("<|im_start|>assistant")
    assert chat[0] != chat[1]


def test_adapters_on_the_last_layers_only() -> None:
    """``lora_layers: k``: adapters on the last k layers, nothing trainable below them."""
    model = _tiny(last_layers=1)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all(".layers.1." in n for n in names)


def _train_counting(model: Any, tmp_path: Path, freeze: bool, steps: int = 3,
                    **over: Any) -> tuple[DPSGD, list[Any], list[int]]:
    """A full-batch run of ``steps`` on ``model`` (q = 1: every record every step); its
    trainer, its adapter after it and the input lengths of every full-model forward pass."""

    widths: list[int] = []
    embedding = model.get_input_embeddings()
    hook = embedding.register_forward_hook(lambda m, args, out: widths.append(args[0].shape[1]))
    trainer = DPSGD(model, _examples(12), _settings(q=1.0, steps=steps, clip=0.05, **over),
                    tmp_path, Keys(), 0, freeze_below=freeze)
    trainer.run(resume=False)
    hook.remove()
    return trainer, [p.detach().clone() for _, p in trainer.params], widths


def test_the_layers_below_the_adapter_run_once_per_record(tmp_path: Path) -> None:
    """``lora_layers`` on the loop path: each record's state below the adapted layers is
    computed once (the probe's full pass and one lower pass per record, whatever the step
    count), and training from the stored states ends on the adapter of the full passes
    bit for bit."""
    import torch

    frozen, after, widths = _train_counting(_tiny(last_layers=1), tmp_path / "a", True)
    full, want, full_widths = _train_counting(_tiny(last_layers=1), tmp_path / "b", False)
    assert frozen._frozen is not None and full._frozen is None
    assert len(frozen._frozen.states) == 12  # every record's state stored once
    assert all(torch.equal(a, b) for a, b in zip(after, want, strict=True))
    assert len(full_widths) == 3 * 12  # the full path: a pass per record and step
    assert len(widths) == 2 + 12  # the probe (its full pass and its lower one), then 12
    assert sorted(widths[2:]) == sorted(len(e.ids) for e in _examples(12))
    # an adapter on every layer leaves nothing to store; hooks keep their own passes
    every, _, _ = _train_counting(_tiny(), tmp_path / "c", True, steps=1)
    hooks, _, _ = _train_counting(_tiny(last_layers=1), tmp_path / "d", True, steps=1,
                                  clipping="hooks", micro_batch=3)
    assert every._frozen is None and hooks._frozen is None
    # a decoder whose pass from stored states differs from its full pass (here a hook moves
    # the states it is handed) fails the probe and keeps the full pass: the same adapter
    odd = _tiny(last_layers=1)

    def moved(_m: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        if kwargs.get("inputs_embeds") is None:
            return None
        return args, {**kwargs, "inputs_embeds": kwargs["inputs_embeds"] + 1e-3}

    decoder_layers(odd).register_forward_pre_hook(moved, with_kwargs=True)
    kept, same, _ = _train_counting(odd, tmp_path / "e", True)
    assert kept._frozen is None and kept._frozen_decided
    assert all(torch.equal(a, b) for a, b in zip(same, want, strict=True))


def test_a_record_s_stored_state_is_its_own(tmp_path: Path) -> None:
    """Rows apart: a record's stored state and its clipped gradient are the same whatever
    other records the run holds and in whatever order they come."""
    import torch

    ex = _examples(12)
    a = DPSGD(_tiny(last_layers=1), ex, _settings(clip=0.05), tmp_path / "a", Keys(), 0)
    b = DPSGD(_tiny(last_layers=1), [ex[5], *ex[8:], ex[2]], _settings(clip=0.05),
              tmp_path / "b", Keys(), 0)
    one, _ = a.clipped_sum(np.array([5]))
    other, _ = b.clipped_sum(np.array([0]))
    assert a._frozen is not None and b._frozen is not None
    assert torch.equal(a._frozen.states[5], b._frozen.states[0])
    assert all(torch.equal(x, y) for x, y in zip(one, other, strict=True))


def test_a_private_schedule_stays_out_of_the_release(tmp_path: Path) -> None:
    """Without ``records`` the sampling rate, step count and noise multiplier follow from the
    exact record count: release/ states epsilon and delta but none of them (private/plan.json
    and run.json, both outside release/, hold them)."""
    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(37))
    raw = _config(data, batch_size=9, epochs=0.5, max_tokens=16, samples=2, max_new_tokens=4)
    raw["generators"] = [{"model": str(model_dir)}]
    out = _run(raw, tmp_path / "run")
    plan = json.loads((out / "private" / "plan.json").read_text())
    assert plan["records"] == 37 and plan["steps"] == 3  # ceil(0.5 / (9 / 37))
    privacy = json.loads((out / "release" / "privacy.json").read_text())
    assert privacy["epsilon"] <= 2.0 and privacy["noise_multiplier"] is None
    (sgd,) = [m for m in privacy["mechanisms"] if m["name"] == "dp_sgd"]
    assert {sgd[k] for k in ("sigma", "sampling_rate", "count", "mu")} == {
        "private: set from the record count"}
    text = "".join(f.read_text() for f in (out / "release").iterdir())
    for secret in (repr(plan["sampling_rate"]), repr(plan["noise_multiplier"])):
        assert secret not in text
    assert "gradient noise" not in (out / "log.txt").read_text()  # it would follow from 37


def test_a_schedule_from_the_private_count_is_research_mode_only(tmp_path: Path) -> None:
    """Secure noise (the default) without a public record count is refused before anything
    is read or charged: q and T would be functions of the private count."""
    from dpsynth.config import parse_config
    from dpsynth.errors import ConfigError
    from dpsynth.methods import get_method

    raw = _config(_write(tmp_path / "d.csv", _rows(10)), batch_size=4)
    raw["privacy"] = {"epsilon": 2.0, "delta": 1e-5, "accountant": "rdp"}
    raw["dp_finetune"] = {"batch_size": 4}
    with pytest.raises(ConfigError, match="dp_finetune.records"):
        get_method("dp_finetune").check(parse_config(raw))
    raw["dp_finetune"]["records"] = 10
    get_method("dp_finetune").check(parse_config(raw))


# ------------------------------------------------------------------------------ user level
def _user_config(data: Path, **section: Any) -> dict[str, Any]:
    raw = _config(data, **section)
    raw["privacy"]["unit"] = "user"
    raw["data"]["user"] = "user"
    return raw


def _user_rows(per_user: list[int]) -> list[dict[str, str]]:
    """``per_user[u]`` records for user u (interleaved in file order, as real data is)."""
    rows = []
    for j in range(max(per_user)):
        for u, n in enumerate(per_user):
            if j < n:
                i = len(rows)
                rows.append({"text": f"patient {u}-{j} asks about "
                                     f"{'a bill' if i % 3 else 'a fever'} today",
                             "label": "billing" if i % 3 else "clinical", "user": f"u{u:02d}"})
    return rows


def _write_users(path: Path, rows: list[dict[str, str]]) -> Path:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=["text", "label", "user"])
        w.writeheader()
        w.writerows(rows)
    return path


def test_user_level_check_needs_loop_a_user_column_and_a_public_user_count(
        tmp_path: Path) -> None:
    """User level is accepted with the loop path and a public ``users``; hooks and ghost
    clipping (per record) are refused naming dp_finetune.clipping; ``records`` (a record
    count) is refused; secure noise without ``users`` is refused (q and T would follow from
    the private user count)."""
    from dpsynth.config import ConfigError, parse_config
    from dpsynth.methods import get_method

    method = get_method("dp_finetune")
    data = _write_users(tmp_path / "d.csv", _user_rows([2, 3]))
    method.check(parse_config(_user_config(data, users=40)))
    method.check(parse_config(_user_config(data)))  # seeded: research mode
    for mode in ("hooks", "ghost"):
        with pytest.raises(ConfigError, match="dp_finetune.clipping: loop"):
            method.check(parse_config(_user_config(data, users=40, clipping=mode)))
    with pytest.raises(ConfigError, match="dp_finetune.users"):
        method.check(parse_config(_user_config(data, records=40)))
    raw = _user_config(data, batch_size=4)
    raw["privacy"] = {**raw["privacy"], "noise": "secure"}
    raw["privacy"].pop("seed")
    raw["dp_finetune"] = {"batch_size": 4}
    with pytest.raises(ConfigError, match="dp_finetune.users: give the number of users"):
        method.check(parse_config(raw))
    raw["dp_finetune"]["users"] = 40
    method.check(parse_config(raw))
    with pytest.raises(ValueError, match="'loop' path only"):
        DPSGD(_tiny(), _examples(), _settings(unit="user", clipping="hooks"), tmp_path,
              Keys(), 0, groups=[[0], [1]])


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_user_level_plan_is_the_poisson_subsampled_gaussian_over_users(
        tmp_path: Path, kind: str) -> None:
    """At user level q = batch_size / users (the public count: 40 here, 7 users in the data),
    T = ceil(epochs / q), and the run's accounting is dp_accounting's
    SelfComposedDpEvent(PoissonSampledDpEvent(q_users, GaussianDpEvent(sigma)), T): the PLD
    epsilon of that event exactly (no label counts); with label counts, the user-level counts'
    event (each user's count vector of norm <= 1 on the 2^-32 grid: zCDP, no shift profile)
    is the one the session records."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant as pld_lib
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    from dpsynth.config import parse_config
    from dpsynth.data import load_dataset
    from dpsynth.methods import get_method
    from dpsynth.privacy import Accountant, PrivacySession, SeededNoise
    from dpsynth.privacy.lattice import count_lattice
    from dpsynth.run_folder import RunDir

    rows = _user_rows([1, 2, 3, 4, 5, 6, 7])
    data = _write_users(tmp_path / "d.csv", rows)
    ds = load_dataset(data, "text", ["label"], "user",
                      label_values={"label": ["billing", "clinical"]})
    method = get_method("dp_finetune")
    for label_split in ("uniform", "noisy_counts"):
        raw = _user_config(data, users=40, batch_size=8, epochs=2, label_split=label_split)
        raw["privacy"]["accountant"] = kind
        run = RunDir(tmp_path / f"run-{label_split}")
        run.private.mkdir(parents=True)
        plan = method.plan(parse_config(raw), ds, run)
        q, steps = plan.notes["q"], plan.notes["steps"]
        assert (q, steps) == (0.2, 10)  # 8 / 40 users, not 8 / 28 records
        saved = json.loads((run.private / "plan.json").read_text())
        assert saved["unit"] == "user" and saved["users"] == 7 and saved["records"] == 28
        event = dp_event.SelfComposedDpEvent(
            dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(plan.sigma)), 10)
        assert accounting.dp_sgd_event(plan.sigma, q, steps).dp_event() == event
        eps = accounting.run_epsilon(plan.sigma, q, steps, 1e-5, kind,
                                     plan.notes["label_sigma"], user_level=True)
        assert eps <= 2.0
        assert plan.sigma == accounting.solve_noise_multiplier(
            2.0, 1e-5, q, steps, kind, plan.notes["label_sigma"], user_level=True)
        if label_split == "uniform":
            assert plan.notes["label_sigma"] is None
            if kind == "pld":  # exactly dp_accounting's PLD of the event
                pld = pld_lib.PLDAccountant()
                pld.compose(event)
                assert eps == pytest.approx(pld.get_epsilon(1e-5), rel=1e-9)
            else:  # dp_accounting's RDP of the event (its default orders: within 1 %)
                rdp = rdp_lib.RdpAccountant()
                rdp.compose(event)
                assert eps == pytest.approx(rdp.get_epsilon(1e-5), rel=1e-2)
        else:
            assert plan.notes["label_sigma"] == 20.0
            session = PrivacySession(tmp_path / f"s-{kind}", Accountant(kind), SeededNoise(0))
            session.noisy_counts("label_counts", np.array([1.5, 0.25]), 20.0,
                                 name="label_counts", lattice=count_lattice(True))
            (recorded,) = session.store.events("label_counts")
            assert recorded.to_dict() == accounting.label_count_event(20.0, True).to_dict()
            assert recorded.dp_event() == dp_event.ZCDpEvent(0.5 / 20.0**2)


def _user_trainer(tmp_path: Path, clip: float, groups: list[list[int]]) -> DPSGD:
    return DPSGD(_tiny(), _examples(), _settings(clip=clip, unit="user",
                                                 max_records_per_user=8),
                 tmp_path, Keys(), 0, groups=groups)


def test_a_user_with_many_records_moves_the_clipped_sum_by_at_most_c(tmp_path: Path) -> None:
    """User level: adding user 0 (8 records) to a batch of users moves the exact fixed-point
    sum by user 0's own clipped gradient, bit for bit, and that has L2 norm <= C (the clip
    binds: unclipped it is far larger); unclipped, a user's gradient is the mean of the
    record-level per-record gradients of its records."""
    groups = [list(range(8)), [8, 9], [10], [11, 12, 13], [14, 15, 16, 17], [18]]
    trainer = _user_trainer(tmp_path / "a", 0.05, groups)
    rest = np.arange(1, 6)
    base, _ = trainer.clipped_sum(rest)
    more, _ = trainer.clipped_sum(np.concatenate([[0], rest]))
    alone, _ = trainer.clipped_sum(np.array([0]))
    for b, m, a in zip(base, more, alone, strict=True):
        assert bool(((m - b) == a).all())

    def norm(sums: list[Any]) -> float:
        return math.sqrt(sum(float((a.double() / 2**32).pow(2).sum()) for a in sums))

    assert 0 < norm(alone) <= 0.05
    big = 1e6  # no clipping: the user's gradient itself
    unclipped, _ = _user_trainer(tmp_path / "b", big, groups).clipped_sum(np.array([0]))
    assert norm(unclipped) > 2 * 0.05  # the clip at 0.05 did bind
    per_record = DPSGD(_tiny(), _examples(), _settings(clip=big), tmp_path / "c", Keys(), 0)
    mean = [sum(r) for r in zip(*[[t.double() / 2**32 for t in per_record.clipped_sum(
        np.array([i]))[0]] for i in range(8)], strict=True)]
    for u, m in zip(unclipped, mean, strict=True):
        np.testing.assert_allclose(u.double().numpy() / 2**32, m.numpy() / 8, atol=1e-7)


def test_user_level_poisson_coins_are_one_per_user(tmp_path: Path) -> None:
    """The batch is a set of users, each with its own coin from the step's keyed stream."""
    groups = [[0, 1, 2], [3], [4, 5]]
    keys = Keys()
    trainer = DPSGD(_tiny(), _examples(), _settings(unit="user", q=1.0), tmp_path, keys, 0,
                    groups=groups)
    assert trainer.units == 3 and trainer.batch(0).tolist() == [0, 1, 2]
    coins = Keys().noise.spawn("dp_sgd/step4/poisson").uniform(3)
    half = DPSGD(_tiny(), _examples(), _settings(unit="user", q=0.5), tmp_path, Keys(), 0,
                 groups=groups)
    assert half.batch(4).tolist() == np.flatnonzero(np.asarray(coins) < 0.5).tolist()


def test_user_groups_are_capped_deterministically() -> None:
    """Each user's records in file order, the first ``cap``; users in sorted id order."""
    from dpsynth.methods.dpfinetune.method import user_groups

    users = ["b", "a", "b", "c", "a", "b", "b"]
    assert [g.tolist() for g in user_groups(users, None)] == [[1, 4], [0, 2, 5, 6], [3]]
    assert [g.tolist() for g in user_groups(users, 2)] == [[1, 4], [0, 2], [3]]
    # another user's records leave a user's own group as it was
    more = ["z", *users]
    assert [g.tolist() for g in user_groups(more, 2)][:3] == [[2, 5], [1, 3], [4]]


def test_a_record_level_checkpoint_of_before_the_unit_setting_resumes(tmp_path: Path) -> None:
    """A checkpoint written before ``unit`` / ``max_records_per_user`` existed is one of
    record-level DP-SGD: it resumes at record level, and is refused at user level."""
    import torch

    DPSGD(_tiny(), _examples(), _settings(steps=1), tmp_path, Keys(), 0).run()
    path = tmp_path / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    for key in ("unit", "max_records_per_user"):
        del state["settings"][key]
    torch.save(state, path)
    assert DPSGD(_tiny(), _examples(), _settings(steps=1), tmp_path, Keys(), 0).load()
    with pytest.raises(RuntimeError, match="other DP-SGD settings"):
        DPSGD(_tiny(), _examples(), _settings(steps=1, unit="user"), tmp_path, Keys(), 0,
              groups=[[0], [1]]).load()


def test_a_user_level_run_states_user_level_dp(tmp_path: Path) -> None:
    """Through the runner at user level: the plan's q is batch_size / users (public), each
    step's batch is a set of users, the label counts are the user-level release, and
    privacy.json states user-level DP with the epsilon of the planned user-level events."""
    model_dir = _tiny_model_dir(tmp_path)
    rows = _user_rows([1, 5, 2, 3, 1, 4])
    data = _write_users(tmp_path / "d.csv", rows)
    raw = _user_config(data, batch_size=4, epochs=1, users=20, max_records_per_user=3,
                       max_tokens=16, samples=2, max_new_tokens=4)
    raw["generators"] = [{"model": str(model_dir)}]
    out = _run(raw, tmp_path / "run")
    privacy = json.loads((out / "release" / "privacy.json").read_text())
    assert privacy["unit"] == "user" and privacy["training"]["privacy_unit"] == "user"
    assert "user-level" in privacy["training"]["per_user_gradient"]
    assert privacy["training"]["schedule"] == "public (dp_finetune.users)"
    label, sgd = privacy["mechanisms"]
    assert label["name"] == "label_counts" and sgd["name"] == "dp_sgd"
    assert sgd["sampling_rate"] == 0.2 and sgd["count"] == 5  # 4 / 20 users
    plan = json.loads((out / "private" / "plan.json").read_text())
    assert plan["users"] == 6 and plan["expected_batch"] == pytest.approx(0.2 * 6)
    assert privacy["epsilon"] == pytest.approx(accounting.run_epsilon(
        plan["noise_multiplier"], 0.2, 5, 1e-5, "rdp", 20.0, user_level=True), rel=1e-12)
    assert privacy["epsilon"] <= 2.0
    steps = [json.loads(x) for x in (out / "private" / "dp-finetune" / "steps.jsonl")
             .read_text().splitlines()]
    assert len(steps) == 5 and all(0 <= s["batch"] <= 6 for s in steps)
    from dpsynth.statement import guarantee_sentence

    assert "for each user" in guarantee_sentence(privacy)


# ------------------------------------------------------------- dpsynth bench dp-finetune
def test_bench_dp_finetune_shape(tmp_path: Path) -> None:
    """The three per-sample gradient paths side by side at toy sizes, in this process: CPU
    and wall seconds per sample and peak memory for each, the ratios to hooks (the shape of
    the result, never the speed)."""
    from dpsynth.bench.dp_finetune import (
        bench_dp_finetune,
        lines,
        markdown,
        parse_mode,
        record_lengths,
    )

    model_dir = _tiny_model_dir(tmp_path)
    res = bench_dp_finetune(str(model_dir), ("loop", "hooks", "ghost", "plain-top1",
                                             "loop-top1", "recompute-top1", "loop-w2"),
                            samples=3, threads=1, tokens=12, micro_batch=2, isolate=False,
                            mixed=True, steps=2)
    assert list(res["paths"]) == ["loop", "hooks", "ghost", "plain-top1", "loop-top1",
                                  "recompute-top1", "loop-w2"]
    assert [m for m, r in res["paths"].items() if r["stored_states"]] == ["loop-top1"]
    assert [m for m, r in res["paths"].items() if r["workers"] > 1] == ["loop-w2"]
    assert res["paths"]["loop"]["worker_rss_mib"] is None
    assert set(res["paths"]["loop-w2"]["worker_rss_mib"]) == {"peak_rss", "pss_now"}
    assert res["steps"] == 2 and "2 steps" in lines(res)[0]
    assert res["lengths"] == "mixed, 8-12" and "8-12 tokens" in lines(res)[0]
    assert record_lengths(4, 64, False) == [64] * 4
    mixed = record_lengths(50, 64, True)
    assert mixed == record_lengths(50, 64, True) and min(mixed) >= 16 and max(mixed) <= 64
    assert len(set(mixed)) > 10
    for mode, r in res["paths"].items():
        assert r["cpu_per_sample"] >= 0 and r["wall_per_sample"] > 0
        assert r["peak_rss_mib"] > 0 and r["step_extra_mib"] >= 0 and r["samples"] == 3
        assert r["private"] is (mode != "plain-top1")
    assert res["paths"]["plain-top1"]["lora_layers"] == 1
    assert set(res["cpu_vs_hooks"]) <= set(res["paths"]) and res["isolated"] is False
    assert len(lines(res)) == 8 and "| ghost |" in markdown(res, "cmd")
    assert parse_mode("hooks-top8") == ("hooks", 8, 1)
    assert parse_mode("loop-top2-w3") == ("loop", 2, 3) and parse_mode("loop-w2")[2] == 2
    with pytest.raises(ValueError, match="loop path only"):
        parse_mode("hooks-w2")
    for bad in ("fast", "loop-top", "loop-top0", "loop-w0x"):
        with pytest.raises(ValueError, match="per-sample gradient path"):
            parse_mode(bad)


def test_bench_dp_finetune_command(tmp_path: Path, small_probe) -> None:
    """``dpsynth bench dp-finetune --json``: a path in its own process, with the machine it
    ran on; an unknown path is a usage error."""
    model_dir = _tiny_model_dir(tmp_path)
    out = CliRunner().invoke(app, ["bench", "dp-finetune", "--model", str(model_dir),
                                   "--samples", "2", "--tokens", "12", "--threads", "1",
                                   "--modes", "loop", "--json"])
    assert out.exit_code == 0, out.output
    res = json.loads(out.output.strip().splitlines()[-1])
    assert res["isolated"] is True and list(res["paths"]) == ["loop"]
    assert res["paths"]["loop"]["peak_rss_mib"] > 0 and res["cpu_vs_hooks"] is None
    assert {"cpu_model", "cores", "load_average_1m", "quiet"} <= set(res["machine"])
    bad = CliRunner().invoke(app, ["bench", "dp-finetune", "--modes", "fast"])
    assert bad.exit_code == 2


def test_refused_samples_are_drawn_again_with_their_own_seeds() -> None:
    """The release's samples go through the public filters: a refused text is drawn again
    with a seed of its own attempt (attempt 0 keeps the seed it had without filters), up to
    ``retries`` more times, and left out when every try was refused; the counts say so. Each
    sample's text follows its own seed only (one draw per attempt over every open slot)."""
    from dpsynth.methods.dpfinetune.sample import sample_texts

    draws: list[list[tuple[int, int]]] = []

    def draw(rows: list[tuple[int, int]]) -> list[str]:  # a text from its own seed alone
        draws.append(rows)
        return ["bad" if random.Random(seed).random() < 0.5 else "good" for _, seed in rows]

    seeds: list[tuple[int, ...]] = []

    def seed_for(*parts: int) -> int:
        seeds.append(parts)
        return hash(parts) % 10**9

    def run(retries: int, clean: Any, check: Any = None
            ) -> tuple[list[tuple[int, str]], dict[str, int]]:
        seeds.clear()
        draws.clear()
        return sample_texts(draw, 2, [6, 4], seed_for=seed_for, clean=clean, check=check,
                            retries=retries)

    plain, counts = run(0, None)
    first = list(seeds)
    assert first == [(0, i) for i in range(6)] + [(1, i) for i in range(4)]
    assert len(plain) == 10 and counts == {"refused": 0, "off_label": 0, "dropped": 0}
    assert len(draws) == 1  # one attempt: every label's slots in one draw

    def refuse(text: str) -> str | None:
        return None if text == "bad" else text

    kept, counts = run(3, refuse)
    assert [s for s in seeds if len(s) == 2] == first  # attempt 0 as without filters
    assert all(s[2] >= 1 for s in seeds if len(s) == 3) and len(seeds) > len(first)
    # a retry draws only the refused slots, each with its own attempt's seed
    assert [len(d) for d in draws] == sorted((len(d) for d in draws), reverse=True)
    assert all(text == "good" for _, text in kept)
    assert counts["refused"] > 0 and len(kept) + counts["dropped"] == 10
    never, counts = run(2, lambda text: None)
    assert never == [] and counts["dropped"] == 10 and counts["refused"] == 30
    calls: list[list[int]] = []

    def label_check(labels: list[int], texts: list[str]) -> np.ndarray:
        """Refuses every text of label 1, over all labels' texts of an attempt at once."""
        calls.append(labels)
        return np.array([y == 1 for y in labels])

    checked, counts = run(2, None, label_check)
    # label 1's 4 texts refused on every try: its slots keep the last try's texts (the check
    # steers, it never empties a release); only the filters leave a slot out
    assert [y for y, _ in checked] == [0] * 6 + [1] * 4 and counts["dropped"] == 0
    assert counts["off_label"] == counts["refused"] == 12  # 4 texts, 3 tries
    assert calls[0] == [0] * 6 + [1] * 4 and calls[1] == [1] * 4


def test_the_release_filter_trims_a_sample_cut_mid_sentence(tmp_path: Path) -> None:
    """The tuned model learned records cut at ``max_tokens`` and then ended, so its samples
    stop mid-sentence too: the release's filter (the one ``_sample`` passes to
    ``sample_texts``) trims each back to its last full sentence when that keeps at least
    half of it, and still refuses what the PE filters refuse."""
    from dpsynth.config import RunConfig
    from dpsynth.methods.dpfinetune.method import _text_filter

    cfg = RunConfig.model_validate(_config(_write(tmp_path / "d.csv", _rows(4))))
    clean = _text_filter(cfg, ["About billing."])
    cut = "The staff were kind and the bill came fast. We will come back for the"
    assert clean(cut) == "The staff were kind and the bill came fast."
    early = "Kind. The staff were kind and the bill came fast and we will come back for the"
    assert clean(early) == early  # trimming would drop most of it
    whole = "The staff were kind and the bill came fast."
    assert clean(whole) == whole
    assert clean("Sure! Here is a message about billing: [Insert name]") is None


def test_a_release_of_refused_samples_says_so(tmp_path: Path) -> None:
    """When the text filters refuse most of the tuned model's samples (here all of them: no
    sample reaches ``synthesis.min_chars``), the run leaves them out, counts them in
    summary.json and warns in log.txt with what to change."""
    model_dir = _tiny_model_dir(tmp_path)
    data = _write(tmp_path / "d.csv", _rows(16))
    raw = _config(data, batch_size=8, epochs=1, records=16, max_tokens=16, samples=4,
                  max_new_tokens=4, sample_batch=2)
    raw["generators"] = [{"model": str(model_dir)}]
    raw["synthesis"] = {"min_chars": 5000, "retries": 1}
    # `dpsynth plan` states the same ratio before any model loads, and the same warning
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(raw))
    planned = CliRunner().invoke(app, ["plan", str(config), "--no-calibrate", "--json"])
    assert planned.exit_code == 0, planned.output
    shown = CliRunner().invoke(app, ["plan", str(config), "--no-calibrate"])
    assert shown.exit_code == 0, shown.output
    out = _run(raw, tmp_path / "run")
    summary = json.loads((out / "release" / "summary.json").read_text())
    assert summary["samples"] == 0 and summary["dropped"] == 4 and summary["rejected"] == 8
    assert (out / "release" / "synthetic.jsonl").read_text() == ""
    log = (out / "log.txt").read_text()
    assert "100% of the tuned model's samples were refused by the filters" in log
    assert "prompts.writer" in log
    # a batch of 8 over 2 x (512 + 512) adapter coordinates: the steps are mostly noise
    sigma = json.loads((out / "release" / "privacy.json").read_text())["noise_multiplier"]
    ratio = sigma * math.sqrt(2 * 2 * (8 * 32 + 32 * 8)) / 8
    assert ratio > 1
    assert f"each step's gradient noise is {ratio:.1f}x the largest mean gradient" in log
    assert "raise dp_finetune.batch_size toward dp_finetune.records" in log
    assert json.loads(planned.stdout)["noise_to_signal"] == pytest.approx(ratio)
    # 16 records in expected batches of 8, one epoch: 2 steps; the warning is on the run's
    assert json.loads(planned.stdout)["noise_over_run"] == pytest.approx(ratio / math.sqrt(2))
    assert f"{ratio / math.sqrt(2):.2g}x over the run's 2 steps" in log
    warning = next(line for line in log.splitlines() if "gradient noise is" in line)
    assert f"warning: {warning.split('warning: ', 1)[1]}" in " ".join(shown.stderr.split())
    assert f"each step's gradient noise: {ratio:.3g}x" in shown.stdout


def test_the_gradient_noise_against_the_largest_mean_gradient() -> None:
    """sigma sqrt(d) / B a step, / sqrt(T) over the run (the run warns above NOISY_RUN): the
    side-by-side's default batch of 32 over the default adapter at epsilon 1 and 8 on 500
    records (16 steps: the loss showed no trend; 4 lies between) and at 1, 4 and 8 on 2000
    (63 steps: it fell), with each run's solved noise multiplier; every record a step over 8
    layers."""
    from dpsynth.methods.dpfinetune.method import NOISY_RUN

    assert accounting.noise_to_signal(0.578, 32, 30 * 15_360) == pytest.approx(
        0.578 * math.sqrt(460_800) / 32)
    assert accounting.noise_to_signal(0.578, 32, 30 * 15_360) > 12 > 1 > \
        accounting.noise_to_signal(1.201, 500, 8 * 15_360) > 0.8
    assert accounting.noise_over_run(12.0, 16) == pytest.approx(3.0)
    assert accounting.noise_over_run(12.0, 0) == 12.0  # no step: the step's own ratio

    def over_run(records: int, epsilon: float) -> float:
        q, steps = accounting.schedule(records, 32, 1.0)
        sigma = accounting.solve_noise_multiplier(epsilon, 1e-5, q, steps, "pld",
                                                  label_sigma=20.0)
        return accounting.noise_over_run(accounting.noise_to_signal(sigma, 32, 460_800), steps)

    assert over_run(500, 1.0) > over_run(500, 4.0) > over_run(500, 8.0) > NOISY_RUN
    assert NOISY_RUN > over_run(2000, 1.0) > over_run(2000, 4.0) > over_run(2000, 8.0)
