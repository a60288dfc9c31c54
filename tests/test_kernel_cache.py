"""engines/backends/kernel_cache.py: the numba kernels' on-disk cache. Without a writable folder the kernels compile
in each process; an unreadable cache file is removed, named and compiled again; a kernel's own error is raised."""
import os
import subprocess
import sys
from pathlib import Path

from edgeinfer.engines.backends import fused_engine, kernel_cache

# two cached kernels, one calling the other (as the engines' passes call their layers), made ready as an engine does
KERNELS = """
from edgeinfer.engines.backends.kernel_cache import cached_njit


@cached_njit
def inner(x):
    return x * 2.0


@cached_njit
def outer(x):
    return inner(x) + 1.0
"""
READY = """
import sys
from kernels import inner, outer
from edgeinfer.engines.backends.kernel_cache import kernels_ready


def first_calls():
    print(outer(1.0), flush=True)
    if sys.argv[1] == "own-error":
        raise ValueError("the kernel's own error")


kernels_ready("test", first_calls, (outer,))
"""


def _ready(tmp_path: Path, mode: str = "ok", cache: Path | None = None) -> subprocess.CompletedProcess:
    """kernels_ready in a fresh process, with this test's numba cache (tmp_path/cache unless `cache`) and compile
    lock (not the suite's)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache or tmp_path / "cache"), "TMPDIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(tmp_path / "ready.py"), mode], capture_output=True, text=True,
                          env=env, timeout=300)


def _cache_files(tmp_path: Path, pattern: str) -> list[Path]:
    return sorted((tmp_path / "cache").rglob(pattern))


def test_unreadable_cache_files_are_removed_named_and_compiled_again(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "ready.py").write_text(READY)
    first = _ready(tmp_path)
    assert (first.returncode, first.stdout, first.stderr) == (0, "3.0\n", "")
    [inner_index], [outer_data] = _cache_files(tmp_path, "*inner*.nbi"), _cache_files(tmp_path, "*outer*.nbc")
    # outer's index still lists its entry (kernels_cached: True, no lock); its data and inner's index are garbage
    inner_index.write_bytes(b"garbage")
    outer_data.write_bytes(b"\x80\x05garbage")
    again = _ready(tmp_path)
    assert (again.returncode, again.stdout) == (0, "3.0\n"), again.stderr
    removed = sorted(line for line in again.stderr.splitlines() if "removed the unreadable" in line)
    assert removed == [f"WARNING: engine: removed the unreadable numba cache file {p}"
                       for p in (inner_index, outer_data)]
    assert "engine: compiling the test kernels again" in again.stderr
    assert inner_index.read_bytes() != b"garbage"  # written anew by the compile
    third = _ready(tmp_path)  # and read from the cache from then on
    assert (third.returncode, third.stdout, third.stderr) == (0, "3.0\n", "")


def test_an_unreadable_cache_file_that_cannot_be_removed_is_named_in_the_error(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "ready.py").write_text(READY)
    assert _ready(tmp_path).returncode == 0
    [outer_index] = _cache_files(tmp_path, "*outer*.nbi")
    outer_index.unlink()
    (outer_index / "a file").mkdir(parents=True)  # a folder where numba's index should be: not ours to delete
    failed = _ready(tmp_path)
    assert failed.returncode == 1 and "Traceback" in failed.stderr
    assert f"RuntimeError: numba cache file {outer_index} cannot be read (IsADirectoryError" in failed.stderr
    assert "remove it, or set NUMBA_CACHE_DIR to another folder" in failed.stderr
    assert (outer_index / "a file").is_dir() and _cache_files(tmp_path, "*inner*")  # nothing else removed


def test_a_numba_cache_dir_that_cannot_be_written_is_named(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "ready.py").write_text(READY)
    (tmp_path / "a file").write_text("")  # not a folder: numba skips it, for the next cache folder it finds
    ran = _ready(tmp_path, cache=tmp_path / "a file")
    assert (ran.returncode, ran.stdout) == (0, "3.0\n"), ran.stderr
    assert f"WARNING: engine: NUMBA_CACHE_DIR={tmp_path / 'a file'} cannot be written, so numba caches the kernels in" \
        in ran.stderr


def test_a_kernels_own_error_is_raised_and_no_cache_file_removed(tmp_path):
    (tmp_path / "kernels.py").write_text(KERNELS)
    (tmp_path / "ready.py").write_text(READY)
    assert _ready(tmp_path).returncode == 0
    files = _cache_files(tmp_path, "*.nb*")
    failed = _ready(tmp_path, "own-error")
    assert failed.returncode == 1 and "ValueError: the kernel's own error" in failed.stderr
    assert "unreadable" not in failed.stderr and _cache_files(tmp_path, "*.nb*") == files


def test_kernels_compile_uncached_where_no_cache_folder_is_writable(monkeypatch, capsys):
    """numba raises at decoration when cache=True finds no writable folder (a read-only install and home):
    the engine's kernels then compile without the disk cache instead of failing to import."""
    def njit(cache=False, **options):
        if cache:
            raise RuntimeError("cannot cache function 'f': no locator available for file 'fused_engine.py'")
        return lambda fn: ("compiled", fn, options)

    monkeypatch.setattr(kernel_cache, "njit", njit)
    monkeypatch.setattr(kernel_cache, "_uncached", [])

    def f():
        pass

    assert fused_engine._kernel(f) == ("compiled", f, {"nogil": True, "fastmath": fused_engine._FASTMATH})
    assert kernel_cache._uncached == ["f"] and "set NUMBA_CACHE_DIR" in capsys.readouterr().err
