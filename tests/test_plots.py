"""The replay's three PNGs, drawn from in-memory Recordings through summarize()."""
import numpy as np
import pytest
from synthetic_runs import report

from edgeinfer.sim.plots import PLOT_FILES, plot_stages, plot_timeline, write_plots

pytestmark = pytest.mark.background  # CPU-bound, no real-time bound (tests/conftest.py)

PNG = b"\x89PNG\r\n\x1a\n"


def _red_pixels(path) -> int:
    """Pixels drawn in pure red (misses and lost commands are marked in matplotlib's "red")."""
    from matplotlib.image import imread

    img = imread(path)[..., :3]
    return int(np.sum((img[..., 0] > 0.9) & (img[..., 1] < 0.1) & (img[..., 2] < 0.1)))


def test_three_pngs_and_misses_marked_only_when_there_are_misses(tmp_path):
    clean, per_clean = report()
    paths = write_plots(clean, per_clean, tmp_path / "clean")
    assert [p.name for p in paths] == list(PLOT_FILES)
    for p in paths:
        data = p.read_bytes()
        assert data[:8] == PNG and len(data) > 10_000
    assert _red_pixels(paths[1]) < 50  # the legend's "miss (0)" marker only

    stalled, per_stalled = report("stall", stall_ms=20, drop_rate=0.01)
    assert stalled["deadline_misses"] > 10
    paths = write_plots(stalled, per_stalled, tmp_path / "stall")
    assert _red_pixels(paths[1]) > _red_pixels(tmp_path / "clean" / PLOT_FILES[1]) + 100


def test_stage_plot_leaves_out_what_was_not_measured(tmp_path):
    stages = {"send": np.full(100, 0.02), "decode": np.full(100, np.nan), "command": np.linspace(0.1, 2, 100)}
    path = plot_stages(stages, {"send": "due -> sent"}, ("plan",), tmp_path / "s.png", "stages")
    assert path.read_bytes()[:8] == PNG
    none = plot_stages({"decode": np.full(3, np.nan)}, {}, (), tmp_path / "none.png", "nothing measured")
    assert none.stat().st_size > 1000


def test_timeline_rejects_mismatched_shapes(tmp_path):
    with pytest.raises(ValueError, match="differ"):
        plot_timeline(np.arange(10.0), np.ones(9), np.zeros(10, bool), np.full(10, "full", object), 4.0,
                      tmp_path / "x.png", "bad")
