from pathlib import Path

import pytest

SCHUNK = Path(__file__).resolve().parents[2] / "shared" / "data" / "schunk_lwa4p"


@pytest.fixture(scope="session")
def schunk_dir() -> Path:
    """The real Schunk LWA 4P recordings (../shared/data); tests that need them skip without them."""
    if not (SCHUNK / "measurement_1").is_dir():
        pytest.skip(f"real recordings not found at {SCHUNK}")
    return SCHUNK


@pytest.fixture(scope="session")
def held_out(schunk_dir):
    """(features (N, 18), offsets (N, 8, 6)) windows of the 20 held-out runs."""
    from edgeinfer.engines.train import load_split

    feats, offsets, _ = load_split(schunk_dir, 8, 5)["held_out"]
    return feats, offsets


@pytest.fixture(scope="session")
def policy():
    from edgeinfer.engines.policy import load_policy

    return load_policy()
