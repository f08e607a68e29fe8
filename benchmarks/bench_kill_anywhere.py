"""Kill a real run anywhere, resume it, and check that nothing changed (issue 16).

One uninterrupted reference run of ``examples/tiny-aug-pe.yaml`` (real SmolLM2 and MiniLM,
seeded research noise with a fixed seed so that runs can be compared byte for byte), then
``--kills`` runs of the same config, each SIGKILLed at a random moment of its life (model load,
generation, embedding, voting, release writing, ledger settle) and resumed with ``--resume``.
For each, the script checks:

- the release is byte-identical to the reference (every file under release/; in summary.json
  only the call counters, which describe the attempts, may differ);
- no noise was redrawn: every release key stored before the kill has the same stored value and
  events after the resume, and the final store equals the reference store;
- no LLM call was paid twice: the resumed attempt sent exactly the requests that were not in the
  request cache at the kill (reference calls - cached rows at the kill).

    .venv/bin/python benchmarks/bench_kill_anywhere.py --kills 20 \
        > benchmarks/results/kill_anywhere.md

Each run gets its own ledger (a seeded run may not reuse its (dataset, seed) pair in one ledger).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from dpsynth.bench.machine import Where, describe

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
CONFIG = REPO / "examples" / "tiny-aug-pe.yaml"
DPSYNTH = [sys.executable, "-m", "dpsynth"]
COUNTERS = {"llm_calls", "llm_calls_earlier_attempts", "llm_requests_sent", "attempts",
            "requested", "sent",
            "dropped", "retried", "http_retries", "rejected", "off_label"}


def _sets(run: Path) -> list[str]:
    return ["--set", "privacy.noise=seeded", "--set", "privacy.seed=20261130",
            "--set", f"privacy.ledger={run.parent / (run.name + '-ledger.json')}",
            "--set", "data.demo_seed=7"]


def _start(run: Path, resume: bool = False) -> subprocess.Popen[bytes]:
    cmd = [*DPSYNTH, "generate", str(CONFIG), "-o", str(run), "--quiet", "--json", *_sets(run)]
    if resume:
        cmd.append("--resume")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def _finish(proc: subprocess.Popen[bytes], what: str) -> None:
    out, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}): {err.decode()[-2000:]}")


def _release_files(run: Path) -> dict[str, bytes]:
    rel = run / "release"
    return {str(p.relative_to(rel)): p.read_bytes() for p in sorted(rel.rglob("*"))
            if p.is_file()}


def _summary_core(data: bytes) -> dict:
    return {k: v for k, v in json.loads(data).items() if k not in COUNTERS}


def _store(run: Path) -> dict[str, str]:
    path = run / "private" / "releases" / "releases.jsonl"
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            out[rec["key"]] = json.dumps([rec["value"], rec["events"]], sort_keys=True)
    return out


def _cache_rows(run: Path) -> int:
    path = run / "private" / "llm-cache.sqlite"
    if not path.is_file():
        return 0
    con = sqlite3.connect(path)
    try:
        return int(con.execute("SELECT COUNT(*) FROM generations").fetchone()[0])
    except sqlite3.Error:  # killed before the table was made
        return 0
    finally:
        con.close()


def _phase(run: Path) -> str:
    """Where the run was when killed, from the last line of its log."""
    log = run / "log.txt"
    if not (run / "run.json").exists():
        return "start-up"
    if not log.is_file() or not log.read_text().strip():
        return "model load / data"
    last = log.read_text().strip().splitlines()[-1].split(" ", 2)[-1]
    return last[:60]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "kill-anywhere")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    with Where() as where:
        ref = args.work / "reference"
        t0 = time.monotonic()
        _finish(_start(ref), "reference run")
        duration = time.monotonic() - t0
        ref_files = _release_files(ref)
        ref_store = _store(ref)
        ref_calls = json.loads((ref / "release" / "summary.json").read_text())["llm_calls"]
        rng = random.Random(args.seed)
        rows = []
        for i in range(args.kills):
            run = args.work / f"kill{i:02d}"
            at = rng.uniform(0.05, 0.9) * duration  # within the reference run's lifetime
            proc = _start(run)
            deadline = time.monotonic() + at
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
            killed = proc.poll() is None
            if killed:
                proc.send_signal(signal.SIGKILL)
            proc.communicate()
            phase = _phase(run) if killed else "(finished before the kill)"
            before = _store(run)
            cached = _cache_rows(run)
            resumed = False
            if (run / "run.json").exists():
                status = json.loads((run / "run.json").read_text())["status"]
                if status != "finished":
                    _finish(_start(run, resume=True), f"resume {i}")
                    resumed = True
            else:  # killed before the folder existed: nothing to resume, start again
                _finish(_start(run), f"restart {i}")
            files = _release_files(run)
            same = files.keys() == ref_files.keys() and all(
                (_summary_core(files[k]) == _summary_core(ref_files[k])) if k == "summary.json"
                else files[k] == ref_files[k] for k in files)
            after = _store(run)
            redrawn = sum(1 for k, v in before.items() if after.get(k) != v)
            redrawn += 0 if after == ref_store else 1
            summary = json.loads((run / "release" / "summary.json").read_text())
            # a resumed attempt may send only the requests the cache did not hold at the kill
            repaid = max(0, summary["llm_calls"] - (ref_calls - cached)) if resumed else 0
            if killed and not resumed:
                phase += " (nothing left to resume)" if (run / "run.json").exists() else ""
            rows.append((i, round(at, 1), phase, same, redrawn, repaid))
            print(f"kill {i}: t={at:.1f}s phase={phase!r} identical={same} redrawn={redrawn} "
                  f"repaid={repaid}", file=sys.stderr, flush=True)
    ok = sum(r[3] for r in rows)
    print(f"## Kill anywhere ({args.kills} SIGKILLs, tiny Aug-PE, real models)\n")
    print(f"Reference run: {duration:.0f} s, {ref_calls} LLM calls. Each run below was "
          "SIGKILLed at a random moment between 5 % and 90 % of the reference run's wall time "
          "(uniform, seeded) and resumed with --resume (a run killed before its folder existed "
          "is started again). Release identical: every file of release/ byte for byte, "
          "summary.json less its per-attempt call counters. Noise redrawn: stored releases "
          "that changed. Calls repaid: requests sent by the resume beyond those missing from "
          "the request cache at the kill. Machine: "
          f"{describe(where.result())}.\n")
    print("| kill | at (s) | phase (last log line) | release identical | noise redrawn | "
          "calls repaid |")
    print("|---|---|---|---|---|---|")
    for i, at, phase, same, redrawn, repaid in rows:
        print(f"| {i} | {at} | {phase} | {'yes' if same else 'NO'} | {redrawn} | {repaid} |")
    print(f"\n{ok}/{len(rows)} byte-identical releases, "
          f"{sum(r[4] for r in rows)} redrawn noise draws, {sum(r[5] for r in rows)} repaid calls.")


if __name__ == "__main__":
    main()
