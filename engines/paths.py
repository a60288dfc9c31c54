"""Where the shipped weights live, importable without torch (nodes that only read a manifest, such as the
replayer and the control loop, never load torch)."""
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
DEFAULT_POLICY = WEIGHTS_DIR / "schunk_target.json"  # the Schunk action-token target's manifest
