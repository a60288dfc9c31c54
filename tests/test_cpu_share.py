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
    return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}


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
    slots = {os.stat(p).st_ino for p in cpu_share.slot_folder().glob("slot-*")}
    assert not slots & _flocks_held_by(os.getpid())


def test_a_test_not_marked_background_keeps_its_workers_niceness_and_holds_a_slot_beside_more_workers():
    assert BACKGROUND_NICE not in _nices()
    slots = {os.stat(p).st_ino for p in cpu_share.slot_folder().glob("slot-*")}
    held = slots & _flocks_held_by(os.getpid())
    assert len(held) == (1 if SHARED and WORKERS > cpu_share.cpus() else 0)


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
