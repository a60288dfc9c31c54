"""Render a saved `edgeinfer bench` result as the markdown table of benchmarks/results/README.md (never by hand).

    python scripts/perf_table.py out/bench_cpu.json                            # print the markdown
    python scripts/perf_table.py out/bench_cpu.json --readme benchmarks/results/README.md --section cpu

With --readme, the text between the lines `<!-- bench-table:SECTION -->` and `<!-- /bench-table:SECTION -->`
is replaced by the table; a README without those markers is an error (exit 2), never silently appended to.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgeinfer.bench.suite_report import markdown


def replace_section(text: str, section: str, table: str) -> str:
    """text with the block between the section's markers replaced by table. Raises ValueError without them."""
    begin, end = f"<!-- bench-table:{section} -->", f"<!-- /bench-table:{section} -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"markers {begin} ... {end} not found (in this order)")
    return text[:i + len(begin)] + "\n" + table + text[j:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result", type=Path, help="a JSON written by `edgeinfer bench --json`")
    ap.add_argument("--readme", type=Path, default=None, help="replace the table between the markers here")
    ap.add_argument("--section", default="cpu", help="marker name (cpu, gpu; default cpu)")
    args = ap.parse_args(argv)
    try:
        table = markdown(json.loads(args.result.read_text()))
        if args.readme is None:
            print(table, end="")
            return 0
        args.readme.write_text(replace_section(args.readme.read_text(), args.section, table))
    except (OSError, ValueError, KeyError) as e:
        print(f"perf_table: error: {e}", file=sys.stderr)
        return 2
    print(f"updated the {args.section} table in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
