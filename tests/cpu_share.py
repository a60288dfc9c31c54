"""How the suite's workers share the CPUs (wired in by tests/conftest.py).

The end-to-end tests replay logs in real time: their replayer and control loop run at SCHED_FIFO, their runtime at
nice 0, and their bounds allow a 100 ms stall, not a host whose CPUs other tests keep busy. So at most one of them
per CPU runs at once: every test not marked background holds a CPU slot (`cpu_slot`) for its setup, call and
teardown. The CPU-bound tests with no real-time bound (marked background: engines, training, property tests of pure
code) take no slot and run at nice 19 (BACKGROUND_NICE) with every process they start: they fill the CPUs that the
replays leave idle (a replay sleeps between its ticks) and yield them as soon as a replay's process wakes. `-n auto`
therefore starts one worker more than there are CPUs (`workers`), so that a background test always has a worker.
Where a raised niceness cannot be lowered again (not root, no RLIMIT_NICE), it is one worker per CPU, no slot and
no renicing. Measured on the 2-core EPYC VM, a fresh clone: one worker per CPU 408 s; one more without slots ran
~60 s faster, but three replays then ran at once on two CPUs and missed their bounds (26 misses against 25,
pre-roll rows dropped as stale); one more with slots (and the rest below) 309-352 s, no miss.

Two more things keep the slots busy with work rather than waiting:
- `order`: the last worker's initial share (pytest-xdist's worksteal splits the collection into equal runs, one per
  worker) starts with every background test, so one worker has CPU-bound work while the others' replays hold the
  slots, instead of each worker waiting for a slot in turn.
- `start_warm_up`: the run's controller builds, once, what every replay's runtime opens first on a cold machine
  (numba's fused, packed and batched kernels, the ONNX plan, the engine choice: engines/backends/auto.py) while the
  workers collect. The tests that hold a slot wait for it (`wait_for_warm_up`); the background tests do not.
  Without it, the first replay measured the engines for ~30 s and the next one waited on the measurement's lock
  holding a slot.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BACKGROUND_NICE = 19
SLOT_POLL_S = 0.02
SHARE_DIR_ENV = "EDGEINFER_TEST_SHARE_DIR"  # the run's folder (slots, warm-up lock and log), set by its controller


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


def slots_used(worker_count: int) -> bool:
    """Whether `worker_count` workers share the CPUs by slots (more workers than CPUs, background tests reniced)."""
    return worker_count > cpus() and worker_count >= 2 and may_renice()


def is_background(item) -> bool:
    """A test marked background: CPU-bound with no real-time bound, whatever it starts (a training or a start-up
    error through the command line may be marked; a replay may not: its processes would run at nice 19 too)."""
    return item.get_closest_marker("background") is not None


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


def share_dir() -> Path:
    """The run's folder, shared by its workers, made by the controller (start_warm_up; a run that shares no CPU has
    none: a path that does not exist)."""
    return Path(os.environ.get(SHARE_DIR_ENV) or Path(tempfile.gettempdir()) / "edgeinfer-pytest-unshared")


@contextlib.contextmanager
def cpu_slot(folder: Path, n: int, poll_s: float = SLOT_POLL_S):
    """Hold one of `n` CPU slots (an exclusive flock on folder/slot-<k>, k < n) while the block runs; waits, polling
    every poll_s, while all n are held by other processes, first in line (folder/queue): a worker that frees a slot
    and wants one for its next test waits behind a worker already waiting (polling alone, the waiter lost each race
    to it and waited 34 s at the end of a run). The files are opened once per process (close-on-exec: a process a
    test starts does not hold its slot; a forked one shares the lock, which LOCK_UN releases)."""
    if folder not in _slot_fds:
        folder.mkdir(parents=True, exist_ok=True)
        _slot_fds[folder] = [os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o600)
                             for name in ["queue", *(f"slot-{k}" for k in range(n))]]
    queue, *slots = _slot_fds[folder]
    fcntl.flock(queue, fcntl.LOCK_EX)  # one waiter at a time: a worker that frees a slot queues behind it
    try:
        while (fd := _free_slot(slots)) is None:
            time.sleep(poll_s)
    finally:
        fcntl.flock(queue, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _free_slot(slots: list[int]) -> int | None:
    """The first of `slots` this process could lock (now held), else None."""
    for fd in slots:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            continue
    return None


def share(item, worker_count: int):
    """The context a test runs in: at BACKGROUND_NICE if it is background, else holding a CPU slot; nothing when it
    does not share the CPUs (one worker) or cannot renice."""
    if worker_count < 2 or not may_renice():
        return contextlib.nullcontext()
    if is_background(item):
        return at_background_nice()
    if slots_used(worker_count):
        wait_for_warm_up()
        return cpu_slot(share_dir(), cpus())
    return contextlib.nullcontext()


def order(items: list, worker_count: int) -> list:
    """`items` with every background test at the start of the last worker's share of worksteal's initial split
    (worker i of w gets remaining // (w - i) of the tests, in collection order); the others in their order."""
    background = [item for item in items if is_background(item)]
    others = [item for item in items if not is_background(item)]
    remaining = len(items)
    for i in range(worker_count - 1):
        remaining -= remaining // (worker_count - i)
    last_start = max(len(items) - remaining, 0)
    return others[:last_start] + background + others[last_start:]


# ------------------------------------------------------------------------------------------------------ warm-up
_WARM_UP = """
import os, signal, threading, time
from edgeinfer.core.lifecycle import ParentWatch

def _die_with_the_run(watch):  # a killed controller leaves no warm-up (nor its packed compile) behind
    while not watch.parent_gone():
        time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)

threading.Thread(target=_die_with_the_run, args=(ParentWatch(),), daemon=True).start()
from edgeinfer.engines.backends.batched import open_batched
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig

# backend auto, as a replay's runtime: every candidate built (packed compiled aside), the choice measured and cached
runtime = PolicyRuntime(RuntimeConfig())
print("warm-up: engine choice", runtime.engine_choice["chosen"], "cached" if runtime.engine_choice["cached"] else "")
open_batched(runtime.policy, "fused", 2)  # a fleet runtime's kernels
"""
_warm_up_done = False


def start_warm_up() -> subprocess.Popen:
    """In the run's controller, before its workers start: make the share folder (SHARE_DIR_ENV, inherited by the
    workers), hold its warm-up lock and start the warm-up; the lock is released when the warm-up exits, however it
    exits. Its output goes to <share dir>/warm-up.log."""
    folder = Path(tempfile.mkdtemp(prefix="edgeinfer-pytest-"))
    os.environ[SHARE_DIR_ENV] = str(folder)
    lock = os.open(folder / "warm-up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    with open(folder / "warm-up.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", _WARM_UP], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def release():
        proc.wait()
        fcntl.flock(lock, fcntl.LOCK_UN)

    threading.Thread(target=release, name="warm-up-wait", daemon=True).start()
    return proc


def finish_warm_up(proc: subprocess.Popen) -> str | None:
    """After the run: stop the warm-up if it still runs, remove the share folder; the warm-up's log when it
    failed (a test then built what it needed itself), else None."""
    folder = share_dir()
    if proc.poll() is None:  # with the packed compile it started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    code = proc.wait()
    failed = None if code in (0, -signal.SIGKILL) else \
        f"warm-up exited {code}:\n{(folder / 'warm-up.log').read_text(errors='replace')[-3000:]}"
    shutil.rmtree(folder, ignore_errors=True)
    return failed


def wait_for_warm_up() -> None:
    """Block until the controller's warm-up has exited (at once without one, and after the first call)."""
    global _warm_up_done
    lock = share_dir() / "warm-up.lock"
    if _warm_up_done or not lock.exists():
        return
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)
    _warm_up_done = True
