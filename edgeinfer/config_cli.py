"""Command-line options generated from the component *Config dataclasses (no hand-copied argparse).

Nested dataclass fields are flattened to one option each (`--budget-ms` fills
ReplayConfig.runtime.scheduler.budget_ms); a name that two fields share is an error when the parser is
built. A TOML launch file fills the same dataclasses by nesting ([runtime.scheduler] budget_ms = 12);
options on the command line override it.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import tomllib


def _leaves(cls, path=()) -> list[tuple[tuple[str, ...], Any, Any]]:
    """(dotted path, type, default) for every non-dataclass field, depth first."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, path + (f.name,))
        else:
            if f.default is not dataclasses.MISSING:
                default = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = "required"
            out.append((path + (f.name,), tp, default))
    return out


def _scalar(tp):
    """(converter, nargs) for an annotation: Optional[X] -> X, list[float] -> float with nargs '+'."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], "+"
    if tp is bool:
        return lambda s: s.lower() in ("1", "true", "yes"), None
    return tp, None


def add_options(parser: argparse.ArgumentParser, *classes) -> None:
    seen: dict[str, tuple] = {}
    for cls in classes:
        for path, tp, default in _leaves(cls):
            name = path[-1]
            if name in seen:
                raise ValueError(f"option --{name} is ambiguous: {seen[name]} and {path}")
            seen[name] = path
            conv, nargs = _scalar(tp)
            parser.add_argument("--" + name.replace("_", "-"), dest=".".join(path), type=conv, nargs=nargs,
                                default=argparse.SUPPRESS, help=f"(default: {default})")


def build(cls, args: argparse.Namespace, launch: dict | None = None):
    """Instantiate `cls` from launch-file values overlaid with command-line values."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k.split(".")[0] in names}
    return _from_dict(cls, _overlay(launch or {}, values))


def _overlay(base: dict, dotted: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _from_dict(cls, d: dict):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown keys {sorted(unknown)}")
    kwargs = {k: (_from_dict(hints[k], v) if dataclasses.is_dataclass(hints[k]) else v) for k, v in d.items()}
    return cls(**kwargs)


def load_launch(path: Path | None, section: str) -> dict:
    """The `section` table of a TOML launch file ({} when no file)."""
    if path is None:
        return {}
    with open(path, "rb") as fh:
        doc = tomllib.load(fh)
    return doc.get(section, {})


def to_argv(obj) -> list[str]:
    """Inverse of add_options/build for one dataclass instance (used to configure child processes)."""
    argv: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            argv += to_argv(value)
        elif value is not None:
            argv.append("--" + f.name.replace("_", "-"))
            argv += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return argv
