"""A real local Ray cluster for the tests: a head and one more node on 127.0.0.1, each a
separate `ray start` process (not `ray.init(local_mode=True)`). conftest.py makes it one
session fixture, ``ray_cluster``, shared by every test module that runs on Ray."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(procs: list[subprocess.Popen]) -> list[Any]:
    import psutil

    out = []
    for p in procs:
        try:
            root = psutil.Process(p.pid)
            out += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    return out


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stop the processes this fixture started and everything they started, by pid."""
    import psutil

    for _ in range(3):
        tree = _tree(procs)
        if not tree:
            break
        for proc in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.terminate()
        _, alive = psutil.wait_procs(tree, timeout=1.5)  # then killed: a test cluster
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=5)


def local_ray_cluster() -> Iterator[str]:
    """A head and one more node on 127.0.0.1 (one CPU each), each its own `ray start`
    process; yields the address and stops every process it started."""
    ray_bin = str(Path(sys.executable).with_name("ray"))
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(SRC),
                                          os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--object-store-memory=80000000",
              "--block", "--disable-usage-stats"]
    log = open(Path(temp) / "cluster.log", "ab")  # noqa: SIM115 (closed in finally)
    procs: list[subprocess.Popen] = []
    address = f"127.0.0.1:{port}"
    try:
        procs.append(subprocess.Popen(
            [ray_bin, "start", "--head", f"--port={port}", "--include-dashboard=false",
             f"--temp-dir={temp}", *common], env=env, stdout=log, stderr=log,
            start_new_session=True))
        _wait_nodes(address, 1, procs)
        procs.append(subprocess.Popen(
            [ray_bin, "start", f"--address={address}", *common], env=env, stdout=log,
            stderr=log, start_new_session=True))
        _wait_nodes(address, 2, procs)
        yield address
    finally:
        _stop(procs)
        log.close()
        if not os.environ.get("DPSYNTH_KEEP_RAY_LOGS"):  # set it to read Ray's logs afterwards
            shutil.rmtree(temp, ignore_errors=True)


def _wait_nodes(address: str, n: int, procs: list[subprocess.Popen],
                timeout: float = 180.0) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a `ray start` process exited early")
        try:
            ray.init(address=address, log_to_driver=False)
            try:
                alive = sum(1 for node in ray.nodes() if node["Alive"])
            finally:
                ray.shutdown()
            if alive >= n:
                return
        except Exception:  # noqa: BLE001 (the head is still starting)
            pass
        time.sleep(2)
    raise TimeoutError(f"the Ray cluster at {address} did not reach {n} nodes")
