"""tests/conftest.py shares the CPUs among the workers: a background test (CPU-bound, no real-time bound) runs at
nice 19 with all its threads, and the test after it at the niceness its worker had."""
import os
import threading

import pytest
from conftest import BACKGROUND_NICE, _may_renice

SHARED = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= 2


def _nices() -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}


@pytest.mark.background
def test_a_background_test_and_the_threads_it_starts_run_at_nice_19():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
    thread.start()
    thread.join()
    if SHARED and _may_renice():
        assert _nices() == {BACKGROUND_NICE} and seen == [BACKGROUND_NICE]
    else:  # serial: nothing is reniced
        assert BACKGROUND_NICE not in _nices() | set(seen)


def test_a_test_not_marked_background_keeps_its_workers_niceness():
    assert BACKGROUND_NICE not in _nices()
