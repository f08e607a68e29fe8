"""Shared fixtures. Model fixtures are session-scoped: each real model loads once per test run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from xdist_scheduler import RayModulesTogether, module_fixture_modules, ray_modules

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Two xdist workers share the cores, and a stepper runs on every core whatever the load
# (dpsynth.llm.runtime.stepper_threads): OpenMP threads that spin while they wait for a busy
# core made torch twice as slow here (30 SmolLM2 steps on 2 threads, two processes at once:
# 13.5 s spinning, 6.5 s passive, 5.9 s alone). Sleeping waits change no result, only time.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("DPSYNTH_SHARED_DATA", REPO.parent / "shared" / "data"))


def _temp_root_in_memory(root: Path = Path("/dev/shm"), room: int = 2 * 2**30) -> None:
    """Put pytest's tmp_path folders on a RAM file system (``/dev/shm``, when it is there,
    writable and has ``room`` bytes free). dpsynth fsyncs every file and folder it writes
    (dpsynth.files): some 18,000 fsyncs in the fast layer, each waiting on the disk, which on
    a disk that others use cost more than the tests' own work (test_release_check, test_seams
    and test_ledger_holds: 144 s on disk, 78 s here). The code runs the same; only the wait is
    gone (no test can observe durability). The numbered pytest-of-<user>/pytest-N folders and
    their cleanup are pytest's own; PYTEST_DEBUG_TEMPROOT or --basetemp, when given, win
    (PYTEST_DEBUG_TEMPROOT=/tmp puts them back on disk)."""
    if "PYTEST_DEBUG_TEMPROOT" in os.environ:
        return
    try:
        free = os.statvfs(root)
    except OSError:
        return
    if os.access(root, os.W_OK | os.X_OK) and free.f_bavail * free.f_frsize >= room:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(root)


_temp_root_in_memory()


@pytest.fixture(autouse=True, scope="session")
def _own_calibration_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`dpsynth plan`'s model timings and the solved noise multipliers
    (``$XDG_CACHE_HOME/dpsynth/``) go to a folder of the test session's, shared by its xdist
    workers and their subprocesses, never to the user's cache."""
    before = os.environ.get("XDG_CACHE_HOME")
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's, above each worker's own folder
    (root / "xdg-cache").mkdir(exist_ok=True)
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg-cache")
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture(autouse=True)
def _own_ledger(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                ) -> None:
    """Every test gets its own budget ledger (a test that wants one sets DPSYNTH_LEDGER or
    privacy.ledger itself): runs of different tests never share a budget or a seed."""
    monkeypatch.setenv("DPSYNTH_LEDGER", str(tmp_path_factory.mktemp("ledger") / "ledger.json"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test when it is absent (it is never part of the project)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not found at {SHARED_DATA}")
    return SHARED_DATA


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where converted model weights are cached; kept across sessions when DPSYNTH_CACHE is set."""
    env = os.environ.get("DPSYNTH_CACHE")
    return Path(env) if env else tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="session")
def embedder():
    """The real offline all-MiniLM-L6-v2 embedder (no disk cache)."""
    from dpsynth.embed import Embedder

    return Embedder("minilm")


@pytest.fixture(scope="session")
def smollm():
    """The real offline SmolLM2-135M-Instruct generator (local transformers backend)."""
    from dpsynth.llm import load_generator

    return load_generator("smollm2")


@pytest.fixture(scope="session")
def ct2_smollm():
    """The same model on the ctranslate2 int8 engine (``auto`` picks openvino where the CPU
    has native bf16)."""
    from dpsynth.llm import load_generator

    return load_generator({"backend": "local", "model": "smollm2", "engine": "ctranslate2"})


@pytest.fixture(scope="session")
def ray_cluster_address() -> Iterator[str]:
    """One real local Ray cluster (a head and one more node on 127.0.0.1) for the whole
    session; yields its address. The modules that use it run on one xdist worker."""
    import ray

    from ray_local_cluster import local_ray_cluster

    for address in local_ray_cluster():
        try:
            yield address
        finally:
            if ray.is_initialized():
                ray.shutdown()


@pytest.fixture
def ray_cluster(ray_cluster_address: str) -> str:
    """The session's cluster, with this process connected to it as the driver, as a caller
    who runs ``ray.init`` before dpsynth does (the engine then joins that connection). One
    driver serves every run of the session instead of a new driver per run: Ray reuses the
    ports of finished workers and drivers, and a run that started right after another one
    once hung in CI on a reply sent to the previous driver's port. A test that disconnected
    (Flower's simulation shuts Ray down when it ends) is connected again here."""
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_cluster_address, log_to_driver=False)
    return ray_cluster_address


def _typer_shape(app: Any) -> tuple[Any, ...]:
    """What a Typer app's click command is built from: its callbacks and the names and
    callbacks of its commands and groups, recursively (a command added later is a new shape)."""
    callback = app.registered_callback.callback if app.registered_callback else None
    return (id(callback), id(app.info.callback),
            tuple((c.name, id(c.callback)) for c in app.registered_commands),
            tuple((g.name, _typer_shape(g.typer_instance)) for g in app.registered_groups
                  if g.typer_instance is not None))


@pytest.fixture(scope="session", autouse=True)
def _cli_built_once() -> Iterator[None]:
    """typer's ``CliRunner.invoke`` turns the Typer app into a click command on every call
    (signatures and type hints of every command read again: about 0.03 s for dpsynth's app on
    a quiet core, 0.1 s on a busy one, and the fast layer invokes it some 600 times). The app
    is fixed once imported, so each app's command is built once per session and reused
    (click makes a fresh context per invocation); an app whose commands or groups change is
    built again."""
    import typer.testing

    build = typer.testing._get_command
    built: dict[int, tuple[Any, tuple[Any, ...], Any]] = {}

    def get_command(app: Any) -> Any:
        shape = _typer_shape(app)
        hit = built.get(id(app))
        if hit is None or hit[0] is not app or hit[1] != shape:
            hit = built[id(app)] = (app, shape, build(app))
        return hit[2]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(typer.testing, "_get_command", get_command)
        yield


#: Fixtures that load a real offline model: a test using one is a ``models`` test.
MODEL_FIXTURES = frozenset({"embedder", "smollm"})


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark every test that uses a real-model fixture ``models`` and every test on the real
    Ray cluster ``cluster`` (set as each test is collected, so before ``-m`` selects):
    ``-m "not models and not cluster"`` is the fast layer, on the fakes."""
    names = set(getattr(item, "fixturenames", ()))
    if names & MODEL_FIXTURES:
        item.add_marker(pytest.mark.models)
    if "ray_cluster" in names:
        item.add_marker(pytest.mark.cluster)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist, every test of a module that uses the shared Ray cluster runs on one
    worker, so does every test of a module with a module-scoped fixture, every other test is
    balanced alone, and a crashed worker does not hang the run (tests/xdist_scheduler.py)."""
    tests = Path(__file__).parent
    return RayModulesTogether(config, log, together=ray_modules(tests),
                              whole=module_fixture_modules(tests))


@pytest.fixture
def small_probe(monkeypatch):
    """The standalone bench commands probe the machine's capacity before and after at the
    reference size (2048^3 GEMMs, 64 MB copies, three times each side: nearly all of these
    tests' time at toy sizes); here at a toy size. The probe and its judgement are checked by
    tests/test_bench_all.py's test_where_result_fields and
    test_a_host_that_delivers_a_fraction_of_its_rate_is_not_quiet;
    `dpsynth bench all` (test_bench_all_toy_sizes) probes through its production default."""
    import functools

    import dpsynth.cli.bench as cli_bench
    from dpsynth.bench.machine import Where, probe_capacity

    monkeypatch.setattr(cli_bench, "Where", functools.partial(
        Where, probe=lambda: probe_capacity(size=64, mb=1, repeats=1)))
