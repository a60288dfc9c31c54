"""The command line of a bench suite with its own -h (`edgeinfer bench fleet`, ...): its *Config dataclass's
options, checked before anything runs, and the command line the result records."""
from __future__ import annotations

import argparse
import sys
from typing import Any

from edgeinfer.bench.report import check_output


def parse_suite(suite: str, description: str, cls, argv: list[str] | None) -> tuple[Any, list[str]]:
    """(cls filled from argv's options, the command line as typed) for `edgeinfer bench SUITE`; argv None: the
    process's. Exits 2 (argparse) for an unknown option; raises ValueError for a value cls refuses or a --json
    path that cannot be written (before a long run)."""
    from edgeinfer.core.config import add_options, build

    ap = argparse.ArgumentParser(prog=f"edgeinfer bench {suite}", description=description)
    add_options(ap, cls)
    cfg = build(cls, ap.parse_args(argv))
    check_output(cfg.json)
    return cfg, ["edgeinfer", *(sys.argv[1:] if argv is None else ["bench", suite, *argv])]
