from pathlib import Path

import pytest
import zmq

from edgeinfer.core.transport import Endpoints

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
