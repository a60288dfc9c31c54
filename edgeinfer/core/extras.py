"""Optional requirements: which extra of pyproject.toml ([project.optional-dependencies]) brings which module, and
one check that a command runs before its work starts, failing in one line that names the extra to install.

    extra    modules                          needed by
    logs     mcap, mcap_ros2, rosbags         MCAP and rosbag logs (replay, hil, train, sweep, ...); run.mcap
    sweep    ray                              edgeinfer sweep
    hf       transformers                     bench spec's Hugging Face peer rows
    gpu      onnxruntime (the -gpu build)     onnxruntime on CUDA (engines/backends/engine.py names the missing build)

Availability is looked up (importlib.util.find_spec), not imported: a check costs microseconds, where importing
ray or transformers takes seconds.
"""
from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "logs": ("mcap", "mcap_ros2", "rosbags"),
    "sweep": ("ray",),
    "hf": ("transformers",),
    "gpu": ("onnxruntime",),
}


class MissingExtra(RuntimeError):
    """An optional module a command needs is not installed; the message names the extra (one line)."""


def install_hint(extra: str) -> str:
    """The command that installs `extra`, as a user types it (quoted: brackets are a glob to the shell)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; expected one of {sorted(EXTRAS)}")
    return f"pip install 'edgeinfer[{extra}]'"


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of `extra` (or the given subset of them) that cannot be imported here."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; expected one of {sorted(EXTRAS)}")
    gone = []
    for name in modules if modules is not None else EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module blocked in sys.modules
            found = False
        if not found:
            gone.append(name)
    return gone


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise MissingExtra "WHAT needs MODULE: pip install 'edgeinfer[EXTRA]'" unless every module of `extra` (or
    the given subset) is installed. Call it before the work starts."""
    if gone := missing(extra, modules):
        raise MissingExtra(f"{what} needs {', '.join(gone)}, not installed: {install_hint(extra)}")


def missing_line(extra: str, what: str, modules: tuple[str, ...] | None = None) -> str | None:
    """require's message without raising (None when installed): for an optional part a command skips."""
    try:
        require(extra, what, modules)
    except MissingExtra as e:
        return str(e)
    return None
