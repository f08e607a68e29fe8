"""DP-SGD cost on CPU (issue 45): CPU seconds per training record of one DP-SGD step on a LoRA
adapter of the local generator (SmolLM2-135M by default), with each per-sample-gradient path of
:mod:`dpsynth.methods.dpfinetune.train` side by side in one invocation, and the peak memory of
each (``dpsynth bench dp-finetune``; ``benchmarks/bench_dp_finetune.py`` wraps it and writes
the markdown table).

Paths (each clips every record's gradient to C and adds the same noise; the adapter: r = 8 on
q_proj and v_proj, the dp_finetune defaults):

- ``loop``: one record per forward and backward pass (the default: no pass mixes records);
  with ``-topK`` each record's state below the adapted layers is computed once and later
  passes run the top K layers from it (:mod:`dpsynth.methods.dpfinetune.frozen`);
- ``recompute``: ``loop`` with every pass from the embeddings (``freeze_below`` off: the loop
  path before the stored states), the reference for ``loop-topK`` over several ``steps``;
- ``hooks``: Opacus's GradSampleModule on micro-batches (per-sample gradients from hooks);
- ``ghost``: Opacus's fast gradient clipping on micro-batches (per-sample norms, then a
  second backward pass of the clipped loss);
- ``plain``: reference only, NOT private: one ordinary backward pass per micro-batch;
- ``PATH-topK``: the same path with adapters on the last K layers only
  (``dp_finetune.lora_layers: K``): the backward pass stops below them.

Each path runs in its own child process (``isolate``, the default): its peak memory is that
process's maximum resident set (``getrusage`` ``ru_maxrss``, the float32 model included), and
``step_extra_mib`` how far the timed step took it above the peak before the step. After a
warm-up of two records, ``steps`` steps over the same ``samples`` records (q = 1: each step an
epoch) are timed: CPU seconds (user + system of the process, all its threads) and wall
seconds, per record and step.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the paths ``dpsynth bench dp-finetune`` compares by default
MODES = ("loop", "hooks", "ghost")
BASES = ("loop", "hooks", "ghost", "plain", "recompute")
#: the path the others' CPU time is compared with (Opacus's default)
REFERENCE = "hooks"


def parse_mode(mode: str) -> tuple[str, int | None, int]:
    """``"hooks-top8"`` -> ("hooks", 8, 1), ``"loop-top2-w2"`` -> ("loop", 2, 2): the path,
    the adapted layers (None: every layer) and the pass workers (loop only); ValueError for
    an unknown path."""
    rest, sep, count = mode.rpartition("-w")
    if not sep or not count.isdigit() or int(count) < 1:
        rest, count = mode, "1"
    base, sep, top = rest.partition("-top")
    if base not in BASES or (sep and not top.isdigit()) or (sep and int(top) < 1):
        raise ValueError(f"unknown per-sample gradient path {mode!r}: one of "
                         f"{', '.join(BASES)}, optionally with -topK (K >= 1) and, on loop, "
                         "-wN (N pass workers)")
    if int(count) > 1 and base != "loop":
        raise ValueError(f"{mode!r}: pass workers (-wN) run the loop path only")
    return base, int(top) if sep else None, int(count)


def _maxrss_mib() -> float:
    """This process's peak resident set so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def mixed_bounds(tokens: int) -> tuple[int, int]:
    """The range the ``mixed`` record lengths are drawn from: ``max(8, tokens // 4)`` to
    ``tokens``."""
    return max(8, tokens // 4), tokens


def record_lengths(samples: int, tokens: int, mixed: bool) -> list[int]:
    """Each record's token count: ``tokens`` each, or (``mixed``) drawn uniformly from
    :func:`mixed_bounds` (seed 0), as real records vary: the fixed-shape hooks path then
    fills part-empty passes with filler rows."""
    import numpy as np

    if not mixed:
        return [tokens] * samples
    lo, hi = mixed_bounds(tokens)
    rng = np.random.default_rng(0)
    return [int(n) for n in rng.integers(lo, hi + 1, size=samples)]


def measure_path(model: str, mode: str, samples: int, threads: int, tokens: int = 64,
                 micro_batch: int = 8, rank: int = 8, mixed: bool = False,
                 steps: int = 1) -> dict[str, Any]:
    """Time ``steps`` DP-SGD steps over ``samples`` random-token records (of
    :func:`record_lengths`) with path ``mode`` in this process (the adapter on a fresh copy
    of ``model``)."""
    import numpy as np
    import torch

    from ..llm.local import LocalGenerator
    from ..methods.dpfinetune.train import DPSGD, Example, StepSettings, attach_lora
    from ..privacy import SeededNoise

    base, top, workers = parse_mode(mode)
    torch.set_num_threads(threads)
    gen = LocalGenerator(model, engine="transformers", num_threads=threads, device="cpu")
    torch.manual_seed(0)
    net = attach_lora(gen.model, rank, 2.0 * rank, ["q_proj", "v_proj"], top)
    vocab = int(net.config.get_text_config().vocab_size)
    rng = np.random.default_rng(0)
    lo, hi = min(100, vocab // 2), min(40_000, vocab)
    examples = [Example(tuple(int(x) for x in rng.integers(lo, hi, size=n)), min(8, n - 1))
                for n in record_lengths(samples, tokens, mixed)]
    settings = StepSettings(noise_multiplier=1.0, q=1.0, steps=1, expected_batch=samples,
                            clip=1.0, learning_rate=1e-3,
                            clipping="loop" if base in ("plain", "recompute") else base,
                            micro_batch=micro_batch, secure=False)
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-dpft-{os.getpid()}"
    trainer = DPSGD(net, examples, settings, folder, SeededNoise(1).spawn, gen.pad_token_id,
                    first_target=min(e.start for e in examples),
                    freeze_below=base != "recompute", workers=workers)
    net.train()
    step = _warmed_step(base, trainer, net, examples, micro_batch, gen.pad_token_id)
    started = trainer.start_workers()  # up since the warm-up step
    pool = [] if started is None else started.procs
    before = _maxrss_mib()
    cpu0, t0 = _cpu_seconds(pool), time.perf_counter()
    for _ in range(steps):
        step()
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds(pool) - cpu0
    peak, worker_peak = _maxrss_mib(), _workers_rss_mib(pool)
    trainer.close()
    done = samples * steps
    return {"cpu_per_sample": cpu / done, "wall_per_sample": wall / done, "steps": steps,
            "stored_states": trainer.stores_states, "workers": workers,
            "peak_rss_mib": round(peak, 1), "step_extra_mib": round(max(0.0, peak - before), 1),
            "worker_rss_mib": worker_peak, "samples": samples, "private": base != "plain",
            "lora_layers": top, "load_1min_end": round(os.getloadavg()[0], 2)}


def _cpu_seconds(workers: Sequence[Any]) -> float:
    """User + system CPU seconds of this process and its live pass workers."""
    import psutil

    mine = os.times()
    total = mine.user + mine.system
    for proc in workers:
        t = psutil.Process(proc.pid).cpu_times()
        total += t.user + t.system
    return total


def _workers_rss_mib(workers: Sequence[Any]) -> dict[str, float] | None:
    """Each live pass worker's peak resident set (VmHWM, the shared weights counted in each)
    and the proportional share of its present one (Pss: the shared pages split between the
    processes that map them), MiB summed over the workers; None without workers or where
    /proc does not say (not Linux)."""
    if not workers:
        return None
    peak = pss = 0.0
    try:
        for proc in workers:
            status = Path(f"/proc/{proc.pid}/status").read_text(encoding="utf-8")
            peak += float(next(x for x in status.splitlines()
                               if x.startswith("VmHWM")).split()[1])
            rollup = Path(f"/proc/{proc.pid}/smaps_rollup").read_text(encoding="utf-8")
            pss += float(next(x for x in rollup.splitlines()
                              if x.startswith("Pss:")).split()[1])
    except (OSError, StopIteration):
        return None
    return {"peak_rss": round(peak / 1024, 1), "pss_now": round(pss / 1024, 1)}


def _warmed_step(base: str, trainer: Any, net: Any, examples: list[Any], micro_batch: int,
                 pad_token_id: int) -> Any:
    """One step of path ``base`` over every example, after a warm-up on two of them (the
    first call's one-off costs are not timed); ``plain`` is an ordinary, NOT private step."""
    import numpy as np

    from ..methods.dpfinetune.train import collate, per_sample_loss

    samples = len(examples)
    warm = np.arange(min(2, samples))
    if base == "plain":
        def step() -> None:
            for start in range(0, samples, micro_batch):
                ids, attn, target = collate(examples[start:start + micro_batch], pad_token_id)
                per_sample_loss(net, ids, attn, target).sum().backward()
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        ids, attn, target = collate([examples[int(i)] for i in warm], pad_token_id)
        per_sample_loss(net, ids, attn, target).sum().backward()
        trainer.optimizer.zero_grad(set_to_none=True)
        return step
    trainer.clipped_sum(warm)

    def dp_step() -> None:
        sums, _ = trainer.clipped_sum(np.arange(samples))
        for (_, param), g in zip(trainer.params, trainer.noisy_gradient(0, sums), strict=True):
            param.grad = g
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return dp_step


def _in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`measure_path` in a fresh Python process (its own peak memory)."""
    out = subprocess.run([sys.executable, "-m", "dpsynth.bench.dp_finetune", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        tail = "\n".join(out.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"path {spec['mode']!r} failed (exit {out.returncode}):\n{tail}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_dp_finetune(model: str = "smollm2", modes: Sequence[str] = MODES, samples: int = 8,
                      threads: int = 2, tokens: int = 64, micro_batch: int = 8, rank: int = 8,
                      isolate: bool = True, mixed: bool = False,
                      steps: int = 1) -> dict[str, Any]:
    """Each path of ``modes`` on the same records, one after the other (each in its own
    process with ``isolate``); the module docstring says what is measured."""
    modes = list(modes)
    if not modes or len(set(modes)) != len(modes):
        raise ValueError("give one or more distinct paths")
    for mode in modes:
        parse_mode(mode)
    if min(samples, threads, micro_batch, rank, steps) < 1 or tokens < 8:
        raise ValueError("samples, threads, micro_batch, rank and steps must be >= 1, "
                         "tokens >= 8")
    paths: dict[str, dict[str, Any]] = {}
    for mode in modes:
        spec = {"model": model, "mode": mode, "samples": samples, "threads": threads,
                "tokens": tokens, "micro_batch": micro_batch, "rank": rank, "mixed": mixed,
                "steps": steps}
        paths[mode] = _in_child(spec) if isolate else measure_path(**spec)
    ref = paths.get(REFERENCE)
    return {
        "model": model, "samples": samples, "steps": steps, "tokens": tokens,
        "threads": threads,
        "lengths": ("mixed, {}-{}".format(*mixed_bounds(tokens)) if mixed else "equal"),
        "micro_batch": micro_batch, "lora": {"rank": rank, "alpha": 2.0 * rank,
                                             "target_modules": ["q_proj", "v_proj"]},
        "isolated": isolate,
        "memory": ("peak RSS of each path's own process (ru_maxrss), the model included"
                   if isolate else "peak RSS of this one process so far (not per path)"),
        "paths": paths,
        "cpu_vs_hooks": ({m: round(ref["cpu_per_sample"] / r["cpu_per_sample"], 3)
                          for m, r in paths.items() if r["cpu_per_sample"] > 0}
                         if ref else None),
    }


def lines(res: dict[str, Any]) -> list[str]:
    """The result for a person: one line per path, then the machine and its load."""
    out = [f"DP-SGD {_steps(res)} over {res['samples']} records of {_tokens(res)} tokens, "
           f"{res['model']}, LoRA r = {res['lora']['rank']}, {res['threads']} threads"]
    ratios = res.get("cpu_vs_hooks") or {}
    for mode, r in res["paths"].items():
        vs = f", {ratios[mode]:.2f}x hooks" if mode in ratios else ""
        out.append(f"  {mode:<11} {r['cpu_per_sample']:.3f} CPU s / sample, "
                   f"{r['wall_per_sample']:.3f} wall s / sample, peak RSS "
                   f"{r['peak_rss_mib']:.0f} MiB (step +{r['step_extra_mib']:.0f})"
                   f"{_workers_memory(r)}{vs}"
                   + ("" if r["private"] else "  [NOT private: reference]"))
    m = res.get("machine")
    if m:
        load = m["load_average_1m"]
        out.append(f"machine: {m['cpu_model']}, {m['cores']} cores, {' '.join(m['isa'])}; "
                   f"load {load['start']} -> {load['end']} (max {load['max']}), other "
                   f"processes {m['other_load']} cores; quiet: {m['quiet']}")
    return out


def _workers_memory(path: dict[str, Any]) -> str:
    """", workers +P MiB (Pss; peak RSS R)" for a path with pass workers, else ""."""
    mem = path.get("worker_rss_mib")
    if not mem:
        return ""
    return f", workers +{mem['pss_now']:.0f} MiB (Pss; peak RSS {mem['peak_rss']:.0f})"


def _steps(res: dict[str, Any]) -> str:
    steps = int(res.get("steps", 1))
    return "step" if steps == 1 else f"{steps} steps (per record and step)"


def _tokens(res: dict[str, Any]) -> str:
    lengths = res.get("lengths", "equal")
    return str(res["tokens"]) if lengths == "equal" else lengths.split(", ", 1)[1]


def markdown(res: dict[str, Any], command: str) -> str:
    """A results table (benchmarks/results/dp_finetune.md style)."""
    m = res.get("machine") or {}
    load = m.get("load_average_1m", {})
    rows = [
        "# DP-SGD on a LoRA adapter: per-sample gradient paths",
        "",
        f"`{command}` on {m.get('cores', '?')} cores ({m.get('cpu_model', '?')}), "
        f"{time.strftime('%Y-%m-%d')}: DP-SGD {_steps(res)} over {res['samples']} records of "
        f"{_tokens(res)} tokens, {res['model']}, LoRA r = {res['lora']['rank']} on q_proj / "
        f"v_proj, clip 1, AdamW. {res['memory']}. Load average {load.get('start')} at the "
        f"start, {load.get('max')} at most; quiet: {m.get('quiet')}.",
        "",
        "| path | CPU s / sample | wall s / sample | peak RSS (MiB) | step + (MiB) | "
        "workers' Pss (MiB) | CPU vs hooks |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = res.get("cpu_vs_hooks") or {}
    for mode, r in res["paths"].items():
        ratio = f"{ratios[mode]:.2f}x" if mode in ratios else "-"
        mem = r.get("worker_rss_mib")
        workers = f"{mem['pss_now']:.0f}" if mem else "-"
        rows.append(f"| {mode} | {r['cpu_per_sample']:.3f} | {r['wall_per_sample']:.3f} | "
                    f"{r['peak_rss_mib']:.0f} | {r['step_extra_mib']:.0f} | {workers} | "
                    f"{ratio} |")
    rows += ["", "`plain` is a NOT private reference (one ordinary backward pass per "
             "micro-batch, no clipping, no noise). `CPU vs hooks`: hooks' CPU seconds over the "
             "path's (above 1: cheaper than hooks). `-topK`: adapters on the last K layers "
             "only, another model than the rows above; `loop-topK` runs them from each "
             "record's state below them, stored on its first pass, `recompute-topK` from the "
             "embeddings every pass. `-wN`: the loop path's passes in N processes, one thread "
             "each (the same sum bit for bit); CPU seconds include the workers', their memory "
             "is their proportional share (Pss) after the timed steps.", ""]
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> None:
    """The child process: one path from a JSON spec, its result as JSON on stdout."""
    args = list(sys.argv[1:] if argv is None else argv)
    spec = json.loads(args[0])
    print(json.dumps(measure_path(**spec)), flush=True)


if __name__ == "__main__":
    main()
