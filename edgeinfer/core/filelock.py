"""A machine-wide lock on a file (fcntl.flock) for work that processes starting together should do one at a time:
the first does it (a numba compile, an engine measurement) and the others, once it is done, find its result on disk.

The lock saves work and keeps measurements apart; nothing depends on it for correctness, so a caller that cannot
make the file, or waits longer than its timeout, goes on without it. The kernel releases it with its holder's
process, whatever way that ends (SIGKILL included).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

POLL_S = 0.05  # how often a waiter tries the lock again


@contextlib.contextmanager
def held(path: Path, timeout_s: float, waiting: Callable[[str], None] | None = None) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (made, with its folder, if missing) for the block; yields True when held,
    False when the block runs without it (the file cannot be made, or timeout_s s of waiting went by). The holder
    writes its pid into the file; waiting(holder) is called once when the lock is taken, holder the pid found there
    ("" when none), so that a wait is never silent."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        deadline, told = time.monotonic() + timeout_s, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                break
            except BlockingIOError:
                if waiting is not None and not told:
                    told = True
                    waiting(os.pread(fd, 32, 0).decode(errors="replace").strip())
                if time.monotonic() >= deadline:
                    locked = False
                    break
                time.sleep(POLL_S)
        yield locked
    finally:
        os.close(fd)  # releases the lock


def say_waiting(who: str, what: str, then: str, path: Path, timeout_s: float) -> Callable[[str], None]:
    """A `waiting` for held(): one stderr line, "<who>: waiting for process <pid> to finish <what> (up to <timeout_s>
    s; lock <path>); <then>"."""
    def waiting(holder: str) -> None:
        print(f"{who}: waiting for process {holder or '?'} to finish {what} (up to {timeout_s:g} s; lock {path}); "
              f"{then}", file=sys.stderr, flush=True)
    return waiting
