"""A node's log lines through the bounded queue and writer thread (edgeinfer.core.logwriter): a blocked stdout
never blocks the caller, costs dropped lines (counted, and told in the next line written), and long lines are
cut with a marker."""
import re
import threading
import time

from hypothesis import given
from hypothesis import strategies as st

from edgeinfer.core.logwriter import MAX_LINE_CHARS, LogWriter, cut
from edgeinfer.core.telemetry import Telemetry


@given(st.text(max_size=2000), st.integers(40, 500))
def test_a_cut_line_fits_and_keeps_its_head(text, max_chars):
    line = cut(text, max_chars)
    flat = text.replace("\n", " ")
    assert len(line) <= max_chars and "\n" not in line
    if len(flat) <= max_chars:
        assert line == flat
    else:
        m = re.search(r" \.\.\.\[(\d+) chars, cut\]$", line)
        assert m and int(m.group(1)) == len(flat)
        assert flat.startswith(line[:m.start()]) and len(line) == max_chars


class Blocked:
    """A sink that blocks every write until released, as a pipe nobody reads does."""

    def __init__(self):
        self.release, self.lines = threading.Event(), []

    def __call__(self, line):
        self.release.wait()
        self.lines.append(line)


def test_a_blocked_stdout_costs_dropped_lines_never_a_blocked_caller():
    sink = Blocked()
    w = LogWriter(sink, max_lines=16)
    t = time.perf_counter()
    took = [w.put("x" * 10_000 + f" {i}") for i in range(40)]  # 24 more than the queue holds
    assert time.perf_counter() - t < 0.5  # a blocking write would never return
    assert took == [True] * 16 + [False] * 24
    assert (w.accepted, w.dropped, w.cut, w.pending) == (16, 24, 16, 16)
    sink.release.set()
    assert w.flush(5.0)
    assert (w.written, w.pending, w.failed) == (16, 0, 0)
    assert all(len(line.split(" (")[0]) <= MAX_LINE_CHARS for line in sink.lines)
    told = [int(m.group(1)) for line in sink.lines if (m := re.search(r"\((\d+) log lines dropped", line))]
    assert sum(told) == 24  # every drop is told, in the next line that goes out


def test_a_closed_stdout_is_counted_not_raised():
    def closed(line):
        raise OSError(9, "Bad file descriptor")
    w = LogWriter(closed)
    w.put("a"), w.put("b")
    assert w.flush(5.0)
    assert (w.failed, w.written, w.pending) == (2, 0, 0)


def test_the_node_stats_carry_the_log_counters():
    counters = Telemetry("control").snapshot().counters
    assert {"log_dropped", "log_cut", "log_suppressed"} <= counters.keys()
