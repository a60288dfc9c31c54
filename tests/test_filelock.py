"""core/filelock.py: processes that start together take turns (an engine's kernels compile once, an engine choice
is measured once); a lock that cannot be had in time, or made at all, is waited out and then gone without."""
import os
import select
import subprocess
import sys
from pathlib import Path

from edgeinfer.core.filelock import held
from edgeinfer.engines.backends import fused_engine
from edgeinfer.engines.backends.fused_engine import FusedEngine
from edgeinfer.engines.backends.kernel_cache import compile_lock, kernels_cached

RELEASE_ON_INPUT = """
import sys
from pathlib import Path
from edgeinfer.core.filelock import held
with held(Path(sys.argv[1]), 60) as got:
    print("locked" if got else "not locked", flush=True)
    sys.stdin.readline()
    open(sys.argv[2], "w").close()
"""


def _hold(lock: Path, marker: Path) -> subprocess.Popen:
    """A process holding `lock` (core.filelock.held) until a line on its stdin, which writes `marker` first."""
    proc = subprocess.Popen([sys.executable, "-c", RELEASE_ON_INPUT, str(lock), str(marker)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_waiter_gets_the_lock_once_its_holder_dies_and_gives_up_after_its_timeout(tmp_path):
    lock, marker = tmp_path / "locks" / "x.lock", tmp_path / "released"
    holder = _hold(tmp_path / "x.lock", marker)
    with held(tmp_path / "x.lock", timeout_s=0.2) as got:
        assert got is False and not marker.exists()  # waited 0.2 s, then ran without it
    holder.kill()  # no unlock, no close: the kernel releases it with the process
    holder.wait(timeout=30)
    with held(tmp_path / "x.lock", timeout_s=30) as got:
        assert got is True  # a SIGKILLed holder's lock is free
    with held(lock, timeout_s=1) as got:  # its folder is made
        assert got is True and lock.exists()
    (tmp_path / "a_file").write_text("")
    with held(tmp_path / "a_file" / "x.lock", timeout_s=1) as got:  # a file where the folder should be
        assert got is False


def _engine_beside_a_held_lock(tmp_path: Path, env: dict, cold: bool = False):
    """(a process holding the fused compile lock, a process making a FusedEngine meanwhile, the marker the holder
    writes as it lets go); the lock is this test's own (TMPDIR): the suite's engines keep theirs. cold: the engine's
    process finds no kernel in numba's cache (kernel_cache.kernels_cached)."""
    marker = tmp_path / "released"
    env = {**os.environ, **env, "TMPDIR": str(tmp_path)}
    lock = tmp_path / compile_lock("fused").name
    holder = _hold(lock, marker)
    script = ("import sys; from pathlib import Path\n"
              "from edgeinfer.engines.backends.fused_engine import FusedEngine\n"
              "from edgeinfer.engines.backends.kernel_cache import compile_lock\n"
              "from edgeinfer.engines.models.policy import load_policy\n"
              f"if {cold}:\n"
              "    import edgeinfer.engines.backends.kernel_cache as kc; kc.kernels_cached = lambda *k: False\n"
              "policy = load_policy()\n"
              f"assert compile_lock('fused') == Path({str(lock)!r}), compile_lock('fused')\n"
              "print('making', flush=True)\n"
              "FusedEngine.from_policy(policy)\n"
              f"print(Path({str(marker)!r}).exists(), flush=True)\n")
    engine = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    assert engine.stdout.readline() == "making\n"
    return holder, engine, marker


def test_an_engine_opened_while_another_process_compiles_waits_for_its_kernels(tmp_path):
    """The compile lock is held by another process (as while it compiles) and numba's cache does not hold the fused
    kernels (kernels_cached says so, in the engine's process: a cold cache would cost a compile here): a FusedEngine
    made meanwhile returns only after that process let go."""
    holder, engine, _ = _engine_beside_a_held_lock(tmp_path, {}, cold=True)
    # held: nothing comes for 5 s (unlocked, it would have compiled and returned by then, or be compiling)
    assert select.select([engine.stdout], [], [], 5.0)[0] == [] and engine.poll() is None
    holder.communicate("release\n", timeout=60)  # the marker is written, then the lock goes
    assert engine.stdout.readline() == "True\n" and engine.wait(timeout=300) == 0
    # and it said why it waited, naming the holder
    assert f"engine: waiting for process {holder.pid} to finish compiling the fused kernels" in engine.stderr.read()


def test_an_engine_whose_kernels_are_cached_does_not_wait_for_the_lock(policy, tmp_path):
    """numba's cache holds the fused kernels (made so here): a FusedEngine loads them while another process holds
    the compile lock (compiling other kernels of the kind, or slowly at a low priority), without waiting for it."""
    FusedEngine.from_policy(policy)  # the kernels in numba's cache, where the process below looks
    assert kernels_cached(fused_engine._pass, fused_engine._greedy)
    holder, engine, _ = _engine_beside_a_held_lock(tmp_path, {})
    try:
        assert select.select([engine.stdout], [], [], 60.0)[0], "the engine waited for the lock"
        assert engine.stdout.readline() == "False\n"  # made while the lock was still held
        assert engine.wait(timeout=120) == 0 and "waiting" not in engine.stderr.read()
    finally:
        holder.communicate("release\n", timeout=60)


def test_a_waiter_is_told_the_holders_pid_once(tmp_path):
    lock = tmp_path / "x.lock"
    holder = _hold(lock, tmp_path / "m")
    told = []
    with held(lock, timeout_s=0.3, waiting=told.append) as got:
        assert got is False
    holder.communicate("release\n", timeout=60)
    assert told == [str(holder.pid)]
    with held(lock, timeout_s=5, waiting=told.append) as got:  # free: nobody to wait for, nothing said
        assert got is True and told == [str(holder.pid)] and lock.read_text() == str(os.getpid())
