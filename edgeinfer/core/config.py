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
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

LAUNCH_SECTIONS = ("replay", "serve", "control", "train")  # one table per edgeinfer command


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
    """(converter, nargs, choices) for an annotation: Optional[X] -> X, list[float] -> float with nargs '+',
    Literal[...] -> str with choices."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is typing.Literal:
        return str, None, list(typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], "+", None
    if tp is bool:
        return lambda s: s.lower() in ("1", "true", "yes"), None, None
    return tp, None, None


def add_options(parser: argparse.ArgumentParser, *classes) -> None:
    """One --option per leaf field of `classes` (nested dataclasses flattened). Raises ValueError when two
    fields would share an option name."""
    seen: dict[str, tuple] = {}
    for cls in classes:
        for path, tp, default in _leaves(cls):
            name = path[-1]
            if name in seen:
                raise ValueError(f"option --{name} is ambiguous: {seen[name]} and {path}")
            seen[name] = path
            conv, nargs, choices = _scalar(tp)
            required = default == "required"
            parser.add_argument("--" + name.replace("_", "-"), dest=".".join(path), type=conv, nargs=nargs,
                                choices=choices, required=required, metavar=name.upper(),
                                default=argparse.SUPPRESS, help="(required)" if required else f"(default: {default})")


def build(cls, args: argparse.Namespace, launch: dict | None = None, base_dir: Path | None = None):
    """Instantiate `cls` from launch-file values overlaid with command-line values.

    Relative paths from the launch file resolve against `base_dir` (the launch file's folder). Raises
    ValueError naming the dotted key for an unknown key or a value of the wrong type.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k.split(".")[0] in names}
    return _from_dict(cls, _overlay(launch or {}, values), cls.__name__, base_dir)


def _overlay(base: dict, dotted: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _is_bool(tp) -> bool:
    return tp is bool or bool in typing.get_args(tp)


def _check_type(where: str, tp, value, base_dir: Path | None):
    """The value converted to the field's type (str -> Path), or ValueError naming the field."""
    if value is None:
        if type(None) in typing.get_args(tp):
            return None
        raise ValueError(f"{where}: must not be empty")
    inner, nargs, choices = _scalar(tp)
    items = value if nargs else [value]
    if nargs and not isinstance(value, list):
        raise ValueError(f"{where}: expected a list, got {value!r}")
    out = []
    for v in items:
        if isinstance(v, bool) and _is_bool(tp):
            pass
        elif inner is float and type(v) in (int, float):
            v = float(v)
        elif inner is Path and isinstance(v, (str, Path)):
            relative_to_launch = base_dir is not None and isinstance(v, str) and not Path(v).is_absolute()
            v = (base_dir / v).resolve() if relative_to_launch else Path(v)
        elif not (isinstance(inner, type) and type(v) is inner) and not (choices and isinstance(v, str)):
            raise ValueError(f"{where}: expected {getattr(inner, '__name__', inner)}, got {v!r}")
        out.append(v)
    return out if nargs else out[0]


def _from_dict(cls, d: dict, where: str, base_dir: Path | None = None):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(d) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(names)}")
    kwargs = {}
    for k, v in d.items():
        at = f"{where}.{k}"
        if dataclasses.is_dataclass(hints[k]):
            if not isinstance(v, dict):
                raise ValueError(f"{at}: expected a table, got {v!r}")
            kwargs[k] = _from_dict(hints[k], v, at, base_dir)
        else:
            kwargs[k] = _check_type(at, hints[k], v, base_dir)
    return cls(**kwargs)


def load_launch(path: Path | None, section: str) -> dict:
    """The `section` table of a TOML launch file ({} when no file). Raises ValueError naming the file for
    invalid TOML or a top-level table that is not an edgeinfer command (a typo would silently run defaults)."""
    if path is None:
        return {}
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: {e}") from None
    if set(doc) - set(LAUNCH_SECTIONS):
        raise ValueError(f"{path}: unknown table(s) {sorted(set(doc) - set(LAUNCH_SECTIONS))}; "
                         f"expected one of {list(LAUNCH_SECTIONS)}")
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
