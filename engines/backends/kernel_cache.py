"""The numba kernels' on-disk cache, shared by the fused, packed and batched engines: where it lives, the compile
lock that makes processes starting together compile once, and what happens to a cache file that cannot be read.

Where: numba's cache is the first writable folder of $NUMBA_CACHE_DIR, engines/__pycache__, ~/.cache/numba. A
read-only install with a read-only home has none: the kernels then compile in every process, with a warning
(cached_njit).

When: an engine compiles (or loads) its kernels when it is made (kernels_ready), not in its first chunk. Processes
that start at once on a cold machine (a fleet's runtimes, a launch file, test workers) take turns: the first compiles
and writes numba's cache, the others load it (~10-25 s each otherwise, side by side on the same CPUs). One lock per
engine kind (different kernels compile side by side), per user and machine: a lock, not a cache, so any clone or
install may share it. An engine whose kernels are cached takes no turn.

Unreadable files: numba raises on a cache file it cannot unpickle (a disk fault, a partial copy) and does not
recompile. kernels_ready then removes every cache file of this process's cached kernels that cannot be read, names
each on stderr and compiles again; it re-raises when no file was unreadable (the error was the kernel's own), and
raises an error naming the file when one cannot be removed (a folder in its place, an immutable file).
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Callable

from numba import njit

from edgeinfer.core.filelock import held, say_waiting

COMPILE_WAIT_S = 300.0  # the longest an engine waits for another process's compile before compiling itself
_cached: list = []  # every dispatcher cached_njit made with the on-disk cache: what unreadable_files checks
_uncached: list[str] = []  # kernels compiled without the on-disk cache (no writable cache folder)


def cached_njit(fn, **options):
    """njit(cache=True, nogil=True, **options)(fn), or without the cache where no folder is writable (one warning per
    process). Raises what njit raises, other than numba's "no locator available"."""
    try:
        kernel = njit(cache=True, nogil=True, **options)(fn)
    except RuntimeError as e:  # numba.core.caching: "cannot cache function ...: no locator available ..."
        if "no locator available" not in str(e):
            raise
        if not _uncached:
            print("WARNING: engine: no writable numba cache folder, so its kernels compile in every process "
                  "(~25 s on a busy 2-core machine): set NUMBA_CACHE_DIR to a writable folder", file=sys.stderr)
        _uncached.append(fn.__name__)
        return njit(nogil=True, **options)(fn)
    _cached.append(kernel)
    _check_cache_dir(kernel)
    return kernel


def _check_cache_dir(kernel) -> None:
    """Warn once when $NUMBA_CACHE_DIR is set but numba caches elsewhere (it skips a folder it cannot write)."""
    wanted = os.environ.get("NUMBA_CACHE_DIR")
    if not wanted or _cached[0] is not kernel:
        return
    try:
        used = Path(kernel._cache._cache_path)
    except AttributeError:  # numba internals
        return
    if not used.resolve().is_relative_to(Path(wanted).resolve()):
        print(f"WARNING: engine: NUMBA_CACHE_DIR={wanted} cannot be written, so numba caches the kernels in {used}",
              file=sys.stderr)


def compile_lock(kind: str) -> Path:
    """The lock file of engine kind `kind`'s kernels ("fused", "packed", "fused_batched"), in the temp folder."""
    return Path(tempfile.gettempdir()) / f"edgeinfer-numba-{kind}-{os.getuid()}.lock"


def kernels_cached(*kernels) -> bool:
    """Whether numba's on-disk cache holds an entry of each of `kernels` (njit dispatchers) for their current source
    (numba's cache index, read as numba reads it); False when it cannot be told (no kernels, no cache, an unreadable
    index, other numba internals)."""
    try:
        return bool(kernels) and all(kernel._cache._cache_file._load_index() for kernel in kernels)
    except Exception:  # noqa: BLE001  (numba internals: unknown means compile, under the lock)
        return False


def unreadable_files() -> list[Path]:
    """The cache files (index .nbi, data .nbc) of this process's cached kernels that numba cannot read: an index or a
    data file it lists that does not unpickle. A missing file is not one (numba compiles then)."""
    bad = []
    for kernel in _cached:
        store = kernel._cache._cache_file
        try:
            names = list(store._load_index().values())
        except Exception:  # noqa: BLE001  (whatever numba's unpickling raises: the file is unusable)
            bad.append(Path(store._index_path))
            continue
        for name in names:
            try:
                store._load_data(name)
            except FileNotFoundError:
                pass
            except Exception:  # noqa: BLE001  (a folder in its place included: numba cannot save over it either)
                bad.append(Path(store._data_path(name)))
    return bad


def kernels_ready(kind: str, first_calls: Callable[[], None], kernels: tuple = ()) -> None:
    """Run `first_calls` (an engine's first call of each kernel entry: compiled, or loaded from numba's on-disk cache)
    so that an engine's first pass is a pass: holding its kind's compile lock (compile_lock, core.filelock) unless
    numba's cache already holds each of `kernels` (the entries first_calls calls, kernels_cached). Loading needs no
    turn, and an engine whose kernels are cached never waits for a process that compiles others of its kind (another
    argument type, the packed engine's second thread), however slowly that process runs (a niced benchmark).
    Where first_calls raises and a cache file is unreadable (unreadable_files), those files are removed, named on
    stderr, and first_calls runs again; otherwise its error is raised."""
    try:
        _first_calls(kind, first_calls, kernels)
    except Exception as error:
        bad = unreadable_files()
        if not bad:
            raise
        for path in bad:
            try:
                path.unlink(missing_ok=True)
            except OSError as e:
                raise RuntimeError(f"numba cache file {path} cannot be read ({error!r}) nor removed ({e}): remove it, "
                                   "or set NUMBA_CACHE_DIR to another folder") from error
            print(f"WARNING: engine: removed the unreadable numba cache file {path}", file=sys.stderr, flush=True)
        print(f"engine: compiling the {kind} kernels again", file=sys.stderr, flush=True)
        _first_calls(kind, first_calls, kernels)


def _first_calls(kind: str, first_calls: Callable[[], None], kernels: tuple) -> None:
    if kernels_cached(*kernels):
        first_calls()
        return
    lock = compile_lock(kind)
    waiting = say_waiting("engine", f"compiling the {kind} kernels", "they then load from its cache", lock,
                          COMPILE_WAIT_S)
    with held(lock, COMPILE_WAIT_S, waiting):
        first_calls()
