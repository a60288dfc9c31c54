"""tests/cpu_share.py shares the CPUs among the workers: a background test (CPU-bound, no real-time bound) runs at
nice 19 with all its threads, and the test after it at the niceness its worker had; every other test holds one of
the run's CPU slots when there are more workers than CPUs, and no more tests than slots hold one at once."""
import os
import subprocess
import sys
import threading
import time

import cpu_share
import pytest
from cpu_share import BACKGROUND_NICE

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
SHARED = WORKERS >= 2 and cpu_share.may_renice()


def _nices() -> set[int]:
    """The niceness of every thread of this process (a thread that exits meanwhile is skipped)."""
    nices = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            nices.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except ProcessLookupError:
            pass
    return nices


def _flocks_held_by(pid: int) -> set[int]:
    """Inodes of the FLOCK locks /proc/locks says `pid` holds."""
    held = set()
    for line in open("/proc/locks"):
        f = line.split()
        if f[1] == "FLOCK" and f[3] == "WRITE" and int(f[4]) == pid:
            held.add(int(f[5].split(":")[2]))
    return held


@pytest.mark.background
def test_a_background_test_and_the_threads_it_starts_run_at_nice_19_holding_no_slot():
    seen = []
    thread = threading.Thread(target=lambda: seen.append(os.getpriority(os.PRIO_PROCESS, 0)))
    thread.start()
    thread.join()
    if SHARED:
        assert _nices() == {BACKGROUND_NICE} and seen == [BACKGROUND_NICE]
    else:  # serial: nothing is reniced
        assert BACKGROUND_NICE not in _nices() | set(seen)
    slots = {os.stat(p).st_ino for p in cpu_share.share_dir().glob("slot-*")}
    assert not slots & _flocks_held_by(os.getpid())


def test_a_test_not_marked_background_keeps_its_workers_niceness_and_holds_a_slot_beside_more_workers():
    assert BACKGROUND_NICE not in _nices()
    slots = {os.stat(p).st_ino for p in cpu_share.share_dir().glob("slot-*")}
    held = slots & _flocks_held_by(os.getpid())
    assert len(held) == (1 if cpu_share.slots_used(WORKERS) else 0)


_HOLDER = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n" \
          "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(60)\n"


def test_no_more_tests_than_slots_hold_one_and_a_waiter_gets_the_first_freed(tmp_path):
    holders = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / f"slot-{k}")], stdout=subprocess.PIPE,
                                text=True) for k in range(2)]
    got, release = threading.Event(), threading.Event()

    def hold():
        with cpu_share.cpu_slot(tmp_path, 2, poll_s=0.01):
            got.set()
            release.wait(30)

    try:
        assert [p.stdout.readline() for p in holders] == ["held\n"] * 2
        waiter = threading.Thread(target=hold, daemon=True)
        waiter.start()
        time.sleep(0.3)
        assert not got.is_set()  # both slots held by the two processes
        holders[1].kill()  # a killed holder's slot is free
        assert got.wait(10)
    finally:
        release.set()
        for p in holders:
            p.kill()
            p.wait()


class _Item:
    def __init__(self, name: str, background: bool):
        self.name, self.background = name, background

    def get_closest_marker(self, name):
        return object() if name == "background" and self.background else None


def _worksteal_split(n: int, workers: int) -> list[int]:
    """Where pytest-xdist's worksteal starts each worker's initial share of n tests (xdist/scheduler/worksteal.py)."""
    starts, taken = [], 0
    for i in range(workers):
        starts.append(taken)
        taken += (n - taken) // (workers - i)
    return starts


@pytest.mark.parametrize("n_plain,n_background,workers", [(20, 5, 3), (7, 9, 3), (100, 1, 4), (3, 0, 3)])
def test_the_background_tests_start_the_last_workers_share_and_the_others_keep_their_order(n_plain, n_background,
                                                                                            workers):
    items = [_Item(f"p{i}", False) for i in range(n_plain)] + [_Item(f"b{i}", True) for i in range(n_background)]
    items = items[::2] + items[1::2]  # interleaved
    ordered = cpu_share.order(items, workers)
    assert sorted(i.name for i in ordered) == sorted(i.name for i in items)
    start = _worksteal_split(len(items), workers)[-1]
    background = [k for k, item in enumerate(ordered) if item.background]
    assert background == list(range(min(start, n_plain), min(start, n_plain) + n_background))
    assert [i.name for i in ordered if not i.background] == [i.name for i in items if not i.background]


def test_a_slot_test_waits_for_the_warm_up_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_share.SHARE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(cpu_share, "_warm_up_done", False)
    warm_up = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path / "warm-up.lock")], stdout=subprocess.PIPE,
                               text=True)
    done = threading.Event()
    try:
        assert warm_up.stdout.readline() == "held\n"
        threading.Thread(target=lambda: (cpu_share.wait_for_warm_up(), done.set()), daemon=True).start()
        assert not done.wait(0.3)
        warm_up.kill()  # exited, however: the tests go on (and build what they need themselves)
        assert done.wait(10)
    finally:
        warm_up.kill()
        warm_up.wait()
    cpu_share.wait_for_warm_up()  # once done, never waits again
