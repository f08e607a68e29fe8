"""Shared harness of the PE-family benchmarks: run arms of one config side by side, evaluate
each against a real test file, and write a markdown table for BENCHMARKS.md.

The arms of one benchmark share one LLM request cache, so identical requests (the same
zero-shot prompt with the same seed) are paid once across arms; the LLM-call column counts the
calls each arm actually sent.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DPSYNTH_LEDGER", str(Path(__file__).parent / "runs" / "ledger.json"))

ROOT = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("DPSYNTH_SHARED_DATA", ROOT.parent.parent / "shared" / "data"))


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} cores"


_EMBEDDER: Any = None


def embedder() -> Any:
    """One embedder for all arms, with an on-disk cache: the test set is embedded once."""
    global _EMBEDDER
    if _EMBEDDER is None:
        from dpsynth.embed import Embedder

        _EMBEDDER = Embedder("minilm", cache_dir=ROOT / "runs" / "embed-cache")
    return _EMBEDDER


def scored_set_key(test_path: Path) -> str:
    """What names the test set an arm is scored on: its path and a hash of its bytes."""
    import hashlib

    return f"{test_path.resolve()} {hashlib.sha256(test_path.read_bytes()).hexdigest()}"


def run_arm(name: str, config: Path, overrides: dict[str, Any], out_root: Path,
            test_path: Path, labels: list[str], fresh: bool = False) -> dict[str, Any]:
    """Run (or resume) one arm and evaluate it; returns one row of the table."""
    from dpsynth.api import run_generation
    from dpsynth.eval.suite import EvalOptions, evaluate_run

    out = out_root / name
    if fresh and out.exists():
        shutil.rmtree(out)
    start = time.time()
    resume = (out / "run.json").is_file()
    if resume and json.loads((out / "run.json").read_text()).get("status") == "finished":
        run_dir = out
    else:
        run_dir = run_generation(config, out, resume=resume, overrides=overrides, progress=False)
    wall = time.time() - start
    summary = json.loads((run_dir / "release" / "summary.json").read_text())
    done = run_dir / "eval" / "eval.json"
    # the test set an earlier evaluation used: a run scored on validation is scored again on test
    stamp, scored_on = run_dir / "eval" / "bench-test-set.txt", scored_set_key(test_path)
    if (done.is_file() and done.stat().st_mtime > (run_dir / "run.json").stat().st_mtime
            and stamp.is_file() and stamp.read_text() == scored_on):
        ev = json.loads(done.read_text())  # evaluated by an earlier invocation
    else:
        ev, _ = evaluate_run(run_dir, test_path, EvalOptions(labels=labels, with_audits=False,
                                                              with_mauve=False),
                             embedder=embedder())
        stamp.write_text(scored_on)
    # the run's own wall time (run.json, kept across resumes), else this call's
    meta = json.loads((run_dir / "run.json").read_text())
    wall = summary.get("wall_seconds") or meta.get("wall_seconds") or wall
    row: dict[str, Any] = {"arm": name, "wall_seconds": round(wall),
                           "llm_calls": summary.get("llm_calls"), "samples": summary["samples"],
                           "epsilon": summary.get("epsilon")}
    fid = ev["fidelity"]
    row["fid"] = _num(fid["synthetic"].get("fid"))
    row["fid_zero_shot"] = _num(fid.get("zero_shot", {}).get("fid"))
    for col, res in ev.get("utility", {}).get("logreg", {}).items():
        for ref in ("synthetic", "private", "zero_shot"):
            row[f"{col}:{ref}"] = _num((res.get(ref) or {}).get("accuracy"))
        row[f"{col}:chance"] = _num(res.get("chance"))
    return row


def _num(value: Any) -> Any:
    if isinstance(value, dict):
        return "n/a"
    return round(value, 4) if isinstance(value, float) else value


def markdown(title: str, intro: str, rows: list[dict[str, Any]]) -> str:
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = [f"### {title}", "", intro, "", "| " + " | ".join(cols) + " |",
             "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    lines.append("")
    lines.append(f"Machine: {machine()}.")
    return "\n".join(lines) + "\n"
