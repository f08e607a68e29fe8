"""The suite's xdist scheduler (tests/xdist_scheduler.py) on a small suite of its own: the
Ray-like module runs on one worker, and a worker that dies mid-run fails its test and the run
goes on to the end (xdist's own scope scheduler hung there, and CI with it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from xdist_scheduler import RayModulesTogether

def pytest_xdist_make_scheduler(config, log):
    return RayModulesTogether(config, log, together={{"test_ray_like.py"}},
                              whole={{"test_fixture_like.py"}})
"""

WORKER_NOTE = """
import os
from pathlib import Path

def note(name):
    with open(Path(__file__).with_name("ran.txt"), "a") as fh:
        fh.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def suite(folder: Path) -> None:
    (folder / "pytest.ini").write_text("[pytest]\n")
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "noting.py").write_text(WORKER_NOTE)
    many = "".join(f"def test_{i}():\n    note('a{i}')\n\n" for i in range(8))
    (folder / "test_a.py").write_text(f"from noting import note\n\n{many}")
    ray_like = "".join(f"def test_{i}():\n    note('ray{i}')\n\n" for i in range(4))
    (folder / "test_ray_like.py").write_text(f"from noting import note\n\n{ray_like}")
    whole = "".join(f"def test_{i}():\n    note('whole{i}')\n\n" for i in range(3))
    (folder / "test_fixture_like.py").write_text(f"from noting import note\n\n{whole}")
    (folder / "test_crash.py").write_text(
        "import os\nfrom noting import note\n\n"
        "def test_crash():\n    note('crash')\n    os._exit(3)\n\n"
        "def test_after():\n    note('after')\n")


def run(folder: Path, *extra: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", *extra,
         str(folder)], cwd=folder, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    return out


def ran(folder: Path) -> list[list[str]]:
    return [line.split() for line in (folder / "ran.txt").read_text().splitlines()]


def test_a_crash_is_rerun_once_a_failure_never_and_the_run_ends(tmp_path) -> None:
    """With the suite's own options: a test whose worker crashes runs once more, and fails
    when it crashes again (not once per worker restart); a crash that does not come back
    passes; a failing test is not rerun; the Ray-like module and the module-fixture-like one
    each run on one worker; and the run
    ends (xdist's scope scheduler hung after a crash)."""
    suite(tmp_path)
    (tmp_path / "test_more.py").write_text(
        "import os\nfrom pathlib import Path\nfrom noting import note\n\n"
        "def test_crash_once():\n    note('once')\n"
        "    mark = Path(__file__).with_name('crashed-once')\n"
        "    if not mark.exists():\n        mark.touch()\n        os._exit(3)\n\n"
        "def test_fails():\n    note('fails')\n    assert False\n")
    out = run(tmp_path, "--reruns", "1", "--rerun-except", ".*")
    assert "2 failed, 17 passed, 2 rerun" in out, out[-3000:]
    assert "crashed while running" in out and "test_crash.py::test_crash" in out, out[-3000:]
    names = [name for name, _ in ran(tmp_path)]
    assert sorted(n for n in names if n not in ("once", "fails", "crash")) == sorted(
        [f"a{i}" for i in range(8)] + [f"ray{i}" for i in range(4)] + ["after"]
        + [f"whole{i}" for i in range(3)])
    assert names.count("once") == names.count("crash") == 2 and names.count("fails") == 1
    for module in ("ray", "whole"):  # each grouped module on one worker
        assert len({worker for name, worker in ran(tmp_path) if name.startswith(module)}) == 1
