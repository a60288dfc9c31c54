"""The command line of a bench suite run as a program of its own (`python -m edgeinfer.bench.fleet_capacity`, a test's
`main(argv)`): its *Config dataclass's options, parsed as `edgeinfer bench SUITE` parses them (core.config), and
the command line the result records."""
from __future__ import annotations

import sys
from typing import Any

from edgeinfer.core.config import parse


def parse_suite(suite: str, cls, argv: list[str] | None, description: str | None = None) -> tuple[Any, list[str]]:
    """(cls filled from argv's options, the command line as typed) for `edgeinfer bench SUITE`; argv None: the
    process's. Exits 2 (argparse's usage error) for an unknown option or a value cls refuses."""
    cfg = parse(cls, argv, prog=f"edgeinfer bench {suite}", description=description)
    return cfg, ["edgeinfer", *(sys.argv[1:] if argv is None else ["bench", suite, *argv])]
