"""How the suite's workers share the CPUs (wired in by tests/conftest.py).

The end-to-end tests replay logs in real time: their replayer and control loop run at SCHED_FIFO, their runtime at
nice 0, and their bounds allow a 100 ms stall, not a host whose CPUs other tests keep busy. So at most one of them
per CPU runs at once: every test not marked background holds a CPU slot (`cpu_slot`) for its setup, call and
teardown. The CPU-bound tests with no real-time bound (marked background: engines, training, property tests of pure
code) take no slot and run at nice 19 (BACKGROUND_NICE) with every process they start: they fill the CPUs that the
replays leave idle (a replay sleeps between its ticks) and yield them as soon as a replay's process wakes. `-n auto`
therefore starts one worker more than there are CPUs (`workers`), so that a background test always has a worker.
Where a raised niceness cannot be lowered again (not root, no RLIMIT_NICE), it is one worker per CPU, no slot and
no renicing. Measured on the 2-core EPYC VM, a fresh clone: one worker per CPU 408 s, one more without slots ran
~60 s faster but its replays missed their bounds (26 misses against 25, pre-roll rows dropped as stale).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import tempfile
import time
from pathlib import Path

BACKGROUND_NICE = 19
SLOT_POLL_S = 0.02


def cpus() -> int:
    """The CPUs this process may use (its affinity, not psutil's physical cores)."""
    return len(os.sched_getaffinity(0))


def may_renice() -> bool:
    """Whether this process may lower a niceness back to 0 (root, or an RLIMIT_NICE soft limit of 20 or more)."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def workers() -> int:
    """`-n auto`'s worker count: one per CPU, and one more where background tests can be reniced."""
    n = cpus()
    return n + 1 if n >= 2 and may_renice() else n


def is_background(item) -> bool:
    """A test marked background and not slow (a slow test starts processes: it is an end-to-end test)."""
    return item.get_closest_marker("background") is not None and item.get_closest_marker("slow") is None


def renice_threads(nice: int) -> None:
    """Every thread of this process at `nice` (Linux keeps one per thread; a thread started later inherits its
    starter's)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except (ProcessLookupError, PermissionError):  # a thread that has just exited
            pass


@contextlib.contextmanager
def at_background_nice():
    """Run the block with every thread at BACKGROUND_NICE; the niceness it had is restored after it."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    renice_threads(BACKGROUND_NICE)
    try:
        yield
    finally:
        renice_threads(own)


_slot_fds: dict[Path, list[int]] = {}


def slot_folder() -> Path:
    """This run's slot files: one folder per xdist run (PYTEST_XDIST_TESTRUNUID), shared by its workers."""
    return Path(tempfile.gettempdir()) / f"edgeinfer-pytest-slots-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'solo')}"


@contextlib.contextmanager
def cpu_slot(folder: Path, n: int, poll_s: float = SLOT_POLL_S):
    """Hold one of `n` CPU slots (an exclusive flock on folder/slot-<k>, k < n) while the block runs; waits, polling
    every poll_s, while all n are held by other processes. The files are opened once per process (close-on-exec: a
    process a test starts does not hold its slot; a forked one shares the lock, which LOCK_UN releases)."""
    if folder not in _slot_fds:
        folder.mkdir(parents=True, exist_ok=True)
        _slot_fds[folder] = [os.open(folder / f"slot-{k}", os.O_RDWR | os.O_CREAT, 0o600) for k in range(n)]
    fds = _slot_fds[folder]
    while True:
        for fd in fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return
        time.sleep(poll_s)


def share(item, worker_count: int):
    """The context a test runs in: at BACKGROUND_NICE if it is background, else holding a CPU slot; nothing when it
    does not share the CPUs (one worker) or cannot renice."""
    if worker_count < 2 or not may_renice():
        return contextlib.nullcontext()
    if is_background(item):
        return at_background_nice()
    if worker_count > cpus():
        return cpu_slot(slot_folder(), cpus())
    return contextlib.nullcontext()
