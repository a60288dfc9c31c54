import os
from pathlib import Path

import cpu_share
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
# tests/cpu_share.py: one worker more than there are CPUs; background tests at nice 19, every other test holding one
# of the run's CPU slots, so that no more real-time replays run at once than there are CPUs; the background tests
# first in the last worker's share; the engines every replay opens built once, before the first replay.
_WARM_UP_PROC = pytest.StashKey()


def _workers() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: `-p no:xdist` runs the suite serially
def pytest_xdist_auto_num_workers(config):
    return cpu_share.workers()


def pytest_configure(config):
    if not hasattr(config, "workerinput") and cpu_share.slots_used(getattr(config.option, "numprocesses", 0) or 0):
        config.stash[_WARM_UP_PROC] = cpu_share.start_warm_up()  # the controller, before its workers start


def pytest_unconfigure(config):
    if _WARM_UP_PROC in config.stash and (failed := cpu_share.finish_warm_up(config.stash[_WARM_UP_PROC])):
        print(f"\ntests/cpu_share.py: {failed}")


def pytest_collection_modifyitems(config, items):
    if cpu_share.slots_used(_workers()):
        items[:] = cpu_share.order(items, _workers())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test's setup, call and teardown (its module's fixtures too) inside cpu_share.share's context."""
    with cpu_share.share(item, _workers()):
        return (yield)
