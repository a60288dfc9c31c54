"""One config path: TOML files, dicts and command lines fill the component *Config dataclasses.

    load(cls, data)          nested dicts (as TOML parses them) -> a checked `cls` (msgspec.convert)
    add_options(parser, cls) one --option per leaf field, its help the field's documentation
    build(cls, args, launch) a launch file's table overlaid with the command line's options -> `cls`
    parse(cls, argv)         add_options and build for its own program (`python -m edgeinfer.engines.peers.hf_peer`)
    to_argv(cfg)             the inverse of add_options/build (configures child processes)

A list field takes its values space separated, and repeated options add to it (`--policy A B`, `--policy A
--policy B`); a tuple field takes one comma-separated value (`--ks 2,4,8`).

Nested dataclass fields are flattened to one option each (`--budget-ms` fills
ReplayConfig.runtime.scheduler.budget_ms); a name that two fields share is an error when the parser is
built. A TOML file fills the same dataclasses by nesting ([runtime.scheduler] budget_ms = 12); options on
the command line override it.

A field's documentation is its comment: the `#` comment at the end of its line, else the comment lines
directly above it (the convention of draccus, LeRobot's config library). `--help` shows its first sentence.
"""
from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import functools
import inspect
import io
import re
import sys
import textwrap
import tokenize
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import msgspec

from edgeinfer.core import commands

# ---------------------------------------------------------------------------------------------------- loading

def read_toml(path: Path) -> dict:
    """The TOML document at `path`. Raises ValueError naming the file for invalid TOML; FileNotFoundError."""
    with open(path, "rb") as fh:
        try:
            return tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None


def load(cls, data: Any, where: str | None = None, base_dir: Path | None = None, file: str | Path | None = None):
    """An instance of dataclass `cls` filled from `data` (nested dicts and lists, as TOML parses them).

    Values are checked against the annotations (int is accepted for float, nothing else is converted; a str
    fills a Path field, relative to `base_dir` when given: the folder of the file it came from), then by each
    dataclass's __post_init__. Raises ValueError naming `file` (when given) and the dotted key (`where`
    first: by default the class name, or nothing when a file is named: `ReplayConfig.runtime.scheduler.budget_ms:
    expected float, got str '16'`, `spec.toml: action.name: missing`) for an unknown key, a missing required one, a
    value of the wrong type, or one that __post_init__ rejects.
    """
    if where is None:
        where = "" if file is not None else cls.__name__
    try:
        return _load(cls, data, where, base_dir)
    except ValueError as e:
        raise ValueError(f"{file}: {e}" if file is not None else str(e)) from None


def _load(cls, data, where: str, base_dir: Path | None):
    _refuse_unknown(cls, data, where)

    def dec_hook(tp, obj):
        if tp is Path and isinstance(obj, (str, Path)):
            relative = base_dir is not None and isinstance(obj, str) and not Path(obj).is_absolute()
            return (base_dir / obj).resolve() if relative else Path(obj)
        raise TypeError(f"Expected `{getattr(tp, '__name__', tp)}`, got `{type(obj).__name__}`")

    try:
        return msgspec.convert(data, cls, strict=True, dec_hook=dec_hook)
    except msgspec.ValidationError as e:
        raise ValueError(_explain(str(e), cls, data, where)) from None


def _join(where: str, key: str) -> str:
    return f"{where}{key}" if key.startswith("[") else (f"{where}.{key}" if where else key)


def _at(where: str, msg: str) -> str:
    return f"{where}: {msg}" if where else msg


def _unwrap(tp) -> list:
    """The alternatives of a Union/Optional annotation (the annotation itself otherwise)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def _refuse_unknown(tp, value, where: str) -> None:
    """msgspec ignores unknown keys of a dataclass (forbid_unknown_fields is for Structs): refuse them here."""
    for alt in _unwrap(tp):
        if dataclasses.is_dataclass(alt) and isinstance(value, dict):
            hints = typing.get_type_hints(alt)
            names = sorted(f.name for f in dataclasses.fields(alt) if f.init)
            if unknown := sorted(set(value) - set(names), key=str):
                raise ValueError(_at(where, f"unknown keys {unknown}; known: {names}"))
            for k, v in value.items():
                _refuse_unknown(hints[k], v, _join(where, k))
        elif typing.get_origin(alt) is list and isinstance(value, list):
            for i, v in enumerate(value):
                _refuse_unknown(typing.get_args(alt)[0], v, f"{where}[{i}]")
        elif typing.get_origin(alt) is dict and len(typing.get_args(alt)) == 2 and isinstance(value, dict):
            for k, v in value.items():
                _refuse_unknown(typing.get_args(alt)[1], v, _join(where, str(k)))


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>.*)`)?$", re.S)
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def _explain(text: str, cls, data, where: str) -> str:
    """msgspec's `Expected `float`, got `str` - at `$.a.b`` as `where.a.b: expected float, got str '16'`."""
    m = _AT.match(text)
    msg, path = m["msg"], m["path"] or ""
    parts = [k if k else int(i) for k, i in _PATH_PART.findall(path)]
    at = where
    for p in parts:
        at = _join(at, f"[{p}]" if isinstance(p, int) else p)
    value, tp = data, cls
    for p in parts:  # the offending value and its annotation, for the message
        value = value[p] if isinstance(value, (dict, list)) else None
        tp = _child_type(tp, p)
    if missing := re.match(r"Object missing required field `(.*)`", msg):
        return _at(_join(at, missing[1]), "missing")
    if got := re.match(r"Expected `(.*?)`, got `(.*?)`", msg):
        wanted = {"object": "a table", "array": "a list"}.get(got[1], got[1])
        return _at(at, f"expected {wanted}, got {type(value).__name__} {value!r}")
    if msg.startswith("Invalid enum value"):
        choices = [a for alt in _unwrap(tp) if typing.get_origin(alt) is typing.Literal for a in typing.get_args(alt)]
        return _at(at, f"expected one of {choices}, got {value!r}")
    return _at(at, msg) if at != where else msg  # __post_init__'s own message names its class and field


def _child_type(tp, part):
    for alt in _unwrap(tp):
        if dataclasses.is_dataclass(alt) and isinstance(part, str):
            return typing.get_type_hints(alt).get(part)
        if typing.get_origin(alt) is list and isinstance(part, int):
            return typing.get_args(alt)[0]
        if typing.get_origin(alt) is dict and len(typing.get_args(alt)) == 2:
            return typing.get_args(alt)[1]
    return None


def build(cls, args: argparse.Namespace, launch: dict | None = None, base_dir: Path | None = None):
    """Instantiate `cls` from launch-file values overlaid with command-line values (see `load`).

    Relative paths from the launch file resolve against `base_dir` (the launch file's folder); those given
    on the command line stay relative to the working directory. Raises ValueError naming the dotted key.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args).items() if k.split(".")[0] in names}
    return load(cls, _overlay(launch or {}, values), base_dir=base_dir)


def _overlay(base: dict, dotted: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in dotted.items():
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break  # the file's value is not a table: load() names it
        else:
            node[leaf] = value
    return out


def load_launch(path: Path | None, section: str) -> dict:
    """The `section` table of a TOML launch file ({} when no file). Raises ValueError naming the file for
    invalid TOML, a top-level table that is not an edgeinfer command, or a file without a `section` table (a
    typo would silently run defaults)."""
    if path is None:
        return {}
    doc = read_toml(path)
    tables = commands.config_tables()  # one per edgeinfer command with options (registered by the command line)
    if set(doc) - set(tables):
        raise ValueError(f"{path}: unknown table(s) {sorted(set(doc) - set(tables))}; expected one of {list(tables)}")
    if section not in doc:  # e.g. `replay --launch launch/hil.toml`: running the defaults instead would mislead
        raise ValueError(f"{path}: no [{section}] table (it has {sorted(doc)})")
    if not isinstance(doc[section], dict):
        raise ValueError(f"{path}: {section} must be a table, got {type(doc[section]).__name__}")
    return doc[section]


def to_argv(obj) -> list[str]:
    """Inverse of add_options/build for one dataclass instance (used to configure child processes)."""
    argv: list[str] = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            argv += to_argv(value)
        elif isinstance(value, tuple):
            argv += ["--" + f.name.replace("_", "-"), ",".join(map(str, value))]
        elif value is not None:
            argv.append("--" + f.name.replace("_", "-"))
            argv += [str(v) for v in value] if isinstance(value, list) else [str(value)]
    return argv


# ------------------------------------------------------------------------------------------- documentation

@functools.cache
def field_docs(cls) -> dict[str, str]:
    """{field name: its documentation} for dataclass `cls` (inherited fields documented where they are
    defined): the comment at the end of the field's line(s), else the comment lines directly above it."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or not dataclasses.is_dataclass(klass):
            continue
        try:
            src = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        lines = src.splitlines()
        comments = {t.start[0]: t.string.lstrip("#").strip()
                    for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT}
        comments = {n: c for n, c in comments.items() if not c.startswith(("noqa", "type:"))}
        for node in ast.parse(src).body[0].body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            text = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
            n = node.lineno - 1
            while not text and n in comments and lines[n - 1].lstrip().startswith("#"):
                n -= 1
            if not text:
                text = [comments[i] for i in range(n + 1, node.lineno)]
            if text:
                docs[node.target.id] = " ".join(text)
    return docs


def first_sentence(text: str) -> str:
    """The first sentence of a field's documentation (what `--help` shows on one line): up to the first
    `. ` or `; ` outside parentheses, not after `e.g.` or `i.e.`."""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(ch, 0)
        if (depth == 0 and ch in ".;" and text[i + 1:i + 2] in (" ", "") and text[i - 1:i] != "."
                and not text[:i + 1].endswith(("e.g.", "i.e."))):
            return text[:i]
    return text


# --------------------------------------------------------------------------------------------- command line

def field_default(f: dataclasses.Field) -> Any:
    """A dataclass field's default (a fresh one from its default_factory); dataclasses.MISSING when it has none."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _leaves(cls, path=()) -> list[tuple[tuple[str, ...], Any, Any, str, type]]:
    """(dotted path, type, default, documentation, owning class) for every non-dataclass field, depth first."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, path + (f.name,))
        else:
            default = field_default(f)
            out.append((path + (f.name,), tp, "required" if default is dataclasses.MISSING else default,
                        docs.get(f.name, ""), cls))
    return out


def _scalar(tp, option: str):
    """(converter, nargs, choices) for an annotation: Optional[X] -> X, list[float] -> float with nargs '+',
    tuple[int, ...] -> one comma-separated value, Literal[...] -> str with choices."""
    tp = _unwrap(tp)[0]
    if typing.get_origin(tp) is typing.Literal:
        return str, None, list(typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return typing.get_args(tp)[0], "+", None
    if typing.get_origin(tp) is tuple:
        return _Comma(typing.get_args(tp)[0], option), None, None
    if tp is bool:
        return _bool, None, None
    return tp, None, None


_BOOLS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def expand_bool_flags(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with `true` after each bool option given alone (`--dry-run FILE` -> `--dry-run true FILE`), so that
    a bool option never takes a positional argument for its value. A word after it that is not a bool is its
    (refused) value when the command takes no positional argument. parser: the one add_options filled."""
    flags = {s for a in parser._actions if a.type is _bool for s in a.option_strings}
    positionals = any(not a.option_strings and not isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    out: list[str] = []
    for i, arg in enumerate(argv):
        out.append(arg)
        after = argv[i + 1] if i + 1 < len(argv) else None
        if arg in flags and (after is None or after.startswith("-") or (positionals and after.lower() not in _BOOLS)):
            out.append("true")
    return out


class _Comma:
    """A tuple option's value: items separated by commas, each converted by `item` (`--ks 2,4,8`). Refuses an
    empty item or one `item` refuses, naming the option."""

    _WORDS = {int: "integers", float: "numbers", str: "names", Path: "paths"}

    def __init__(self, item, option: str):
        self.item, self.option = item, option
        self.__name__ = f"{_METAVARS.get(item, item.__name__.upper())},..."

    def __call__(self, text: str) -> tuple:
        try:
            items = tuple(self.item(x.strip()) for x in text.split(","))
        except ValueError:
            items = ()
        if not items or not all(str(x) for x in items):
            # argparse's own ArgumentTypeError would say `argument --ks: ...`: the option leads the line instead
            words = self._WORDS.get(self.item, f"{self.item.__name__} values")
            raise argparse.ArgumentError(None, f"{self.option} must be comma separated {words}, got {text!r}")
        return items


def _bool(text: str) -> bool:
    """A bool option's value: true/yes/on/1 or false/no/off/0 (any case); anything else is refused, never
    read as false."""
    try:
        return _BOOLS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}") from None


def option_help(doc: str, default) -> str:
    """An option's one-line help: the first sentence of its field's documentation and the default (None, the
    field unset, goes without saying: the documentation says what it means)."""
    text = first_sentence(doc) if doc else ""
    if re.fullmatch(r"[a-z][a-z-]*[,:]?", text.split(" ", 1)[0]):  # a word, not a literal (tcp://HOST:PORT, k_max)
        text = text[:1].upper() + text[1:]
    shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
    tail = "(required)" if default == "required" else ("" if default is None else f"(default: {shown})")
    return f"{text} {tail}".strip().replace("%", "%%")


_METAVARS = {float: "FLOAT", int: "INT", str: "STR", Path: "PATH"}
# A value after an option that starts with "-" is a negative number, not an option, when float() reads it: argparse
# (3.11) takes only "-3" and "-.5" so, and would refuse "-1e-05" and "-inf" (a continuous joint's lower limit), both
# of which to_argv writes (str of a float).
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-inf(inity)?$", re.IGNORECASE)


class HelpFormatter(argparse.HelpFormatter):
    """Help on the option's line where it fits, and a usage line that lists the hand-written arguments only
    (a command's generated options, dozens of them, are listed with their help below it)."""

    def __init__(self, prog: str):
        super().__init__(prog, max_help_position=32)

    def add_usage(self, usage, actions, groups, prefix=None):
        kept = [a for a in actions if not getattr(a, "generated", False)]
        if usage is None and len(kept) < len(actions):
            more = argparse.Action(["--OPTION"], "more", metavar="VALUE")
            kept = [a for a in kept if a.option_strings] + [more] + [a for a in kept if not a.option_strings]
        super().add_usage(usage, kept, [], prefix)


def add_options(parser: argparse.ArgumentParser, *classes) -> None:
    """One --option per leaf field of `classes` (nested dataclasses flattened), grouped by the dataclass
    that defines it, its help that field's documentation. Raises ValueError when two fields would share an
    option name."""
    seen: dict[str, tuple] = {}
    groups: dict[tuple, argparse._ArgumentGroup] = {}
    for cls in classes:
        for path, tp, default, doc, owner in _leaves(cls):
            name = path[-1]
            if name in seen:
                raise ValueError(f"option --{name} is ambiguous: {seen[name]} and {path}")
            seen[name] = path
            key = (cls, path[:-1])
            if key not in groups:
                title = ".".join(path[:-1]) or cls.__name__
                summary = first_sentence(" ".join((inspect.getdoc(owner) or "").split())) if path[:-1] else ""
                groups[key] = parser.add_argument_group(f"{title} ({owner.__name__})" if path[:-1] else title,
                                                        summary or None)
            option = "--" + name.replace("_", "-")
            conv, nargs, choices = _scalar(tp, option)
            metavar = None if choices else ("BOOL" if conv is _bool else _METAVARS.get(conv, conv.__name__.upper()))
            action = groups[key].add_argument(option, dest=".".join(path), type=conv, nargs=nargs,
                                              action="extend" if nargs else "store",  # `--policy A --policy B`
                                              choices=choices, required=default == "required",
                                              metavar=metavar, default=argparse.SUPPRESS,
                                              help=option_help(doc, default))
            action.generated = True
    parser.formatter_class = HelpFormatter
    parser._negative_number_matcher = _NEGATIVE_NUMBER


def refuse_bad(owner: str, checks) -> None:
    """One ValueError naming every field that fails its check; checks: (field, value, ok, rule) tuples, e.g.
    ("steps", 0, False, ">= 1") -> "TrainConfig.steps must be >= 1, got 0" (a command line then names the option,
    name_options). Returns None when every check passes."""
    if bad := [f"{owner}.{field} must be {rule}, got {value}" for field, value, ok, rule in checks if not ok]:
        raise ValueError("; ".join(bad))


_CONFIG_KEY = re.compile(r"\b[A-Z][A-Za-z0-9]*(?:\.[a-z_][a-z0-9_]*)+")


def name_options(message: str, parser: argparse.ArgumentParser) -> str:
    """`message` (a config's ValueError) with each `SomeClass.dotted.field` that is one of `parser`'s options
    written as that option (`SchedulerConfig.budget_ms` -> `--budget-ms`), and a leading `ReplayConfig.runtime.x: `
    dropped before one: an error about a command line names what the user typed."""
    options = {o for a in parser._actions for o in a.option_strings}

    def option(m: re.Match) -> str:
        flag = "--" + m.group(0).rsplit(".", 1)[1].replace("_", "-")
        return flag if flag in options else m.group(0)

    named = _CONFIG_KEY.sub(option, message)
    return re.sub(r"^[A-Z][A-Za-z0-9]*(?:\.[a-z_][a-z0-9_]*)*: (?=--)", "", named)


def parse(cls, argv: list[str] | None, prog: str, description: str | None = None):
    """`cls` filled from command line `argv` (None: the process's) for a program of its own (`python -m
    edgeinfer.engines.peers.hf_peer`): the parser add_options builds, so that its -h reads as every edgeinfer
    command's. Exits 2 (argparse's usage error) for an unknown option or a value argparse or `cls` refuses."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    add_options(parser, cls)
    argv = expand_bool_flags(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        return build(cls, parser.parse_args(argv))
    except ValueError as e:
        parser.error(name_options(str(e), parser))
