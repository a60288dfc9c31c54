import os
import resource
from pathlib import Path

import pytest
import zmq
from hypothesis import HealthCheck, settings

from edgeinfer.core.transport import Endpoints

# Property tests check what code computes, not how fast: no per-example deadline or too-slow health check, which on a
# shared 2-core host (a replay beside them, a background test at nice 19) measure the host.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

SCHUNK = Path(__file__).resolve().parents[2] / "shared" / "data" / "schunk_lwa4p"


@pytest.fixture(scope="session", autouse=True)
def command_table():
    """The command table registered with the layers below the command line, as `edgeinfer` (cli.main) does at
    start-up: launch files, `replay --launch` and NodeSpec.task look their commands up there."""
    from edgeinfer.cli import register_commands

    register_commands()


@pytest.fixture(scope="session")
def schunk_dir() -> Path:
    """The real Schunk LWA 4P recordings (../shared/data); tests that need them skip without them."""
    if not (SCHUNK / "measurement_1").is_dir():
        pytest.skip(f"real recordings not found at {SCHUNK}")
    return SCHUNK


@pytest.fixture(scope="session")
def held_out(schunk_dir):
    """(features (N, 18), offsets (N, 8, 6)) windows of the 20 held-out runs."""
    from edgeinfer.engines.training.fit_data import FitDataConfig, load_fit_data

    return load_fit_data(FitDataConfig(data=schunk_dir)).windows("held_out", 8, 5)


@pytest.fixture(scope="session")
def policy():
    from edgeinfer.engines.models.policy import load_policy

    return load_policy()


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module's tests: batch-1 passes on a busy 2-core machine."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def ctx():
    """A ZeroMQ context, destroyed (linger 0) after the test."""
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


@pytest.fixture
def ep():
    """Free loopback endpoints for one run."""
    return Endpoints.free_loopback()


# --------------------------------------------------------------------------- sharing the CPUs among the workers
# The end-to-end tests replay logs in real time: their replayer and control loop run at SCHED_FIFO, their runtime at
# nice 0, and their bounds allow a 100 ms stall, not a host whose CPUs other tests keep busy. So `-n auto` starts one
# worker per CPU, and the CPU-bound tests with no real-time bound (marked background: engines, training, property
# tests of pure code) run at nice 19 (BACKGROUND_NICE), with every process they start: they yield the CPUs as soon
# as a replay's process wakes up. Every other test runs at the niceness it was given. One worker more than there are
# CPUs ran the suite ~70 s faster, but the replays then missed their bounds (26 misses against 25, pre-roll rows
# dropped as stale). Where a raised niceness cannot be lowered again (not root, no RLIMIT_NICE), nothing is reniced.
BACKGROUND_NICE = 19


def _may_renice() -> bool:
    """Whether this process may lower a niceness back to 0 (root, or an RLIMIT_NICE soft limit of 20 or more)."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def pytest_xdist_auto_num_workers(config):
    return len(os.sched_getaffinity(0))  # the CPUs this process may use, not psutil's physical cores


def _renice_threads(nice: int) -> None:
    """Every thread of this process at `nice` (Linux keeps one per thread; a thread started later inherits its
    starter's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except (ProcessLookupError, PermissionError):  # a thread that has just exited
            pass


@pytest.fixture(autouse=True)
def cpu_share(request):
    """A test marked background (and not slow) runs at BACKGROUND_NICE when it shares the CPUs with other workers
    (see above); the niceness it had is restored after it."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    marked = request.node.get_closest_marker("background") and not request.node.get_closest_marker("slow")
    if not marked or workers < 2 or not _may_renice():
        yield
        return
    own = os.getpriority(os.PRIO_PROCESS, 0)
    _renice_threads(BACKGROUND_NICE)
    try:
        yield
    finally:
        _renice_threads(own)
