"""Run the benchmark sections and print every figure as a ratio against its floor.

python -m bench                 # every section whose backend is available
python -m bench ledger sqlite   # some sections
python -m bench --check         # exit 1 if a figure misses its target
python -m bench long --check-counts   # exit 1 if a count (read units, bytes) misses; times are printed only
python -m bench cost --write-docs     # also rewrite the docs' tables generated from the run (docs/operating.md)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

from .common import QUICK, Figure

SECTIONS = [
    "ledger",
    "sqlite",
    "postgres",
    "dynamodb",
    "cold_start",
    "long",
    "serve",
    "cost",
    "busy",
    "adk",
    "langgraph",
    "openai_agents",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("sections", nargs="*", default=SECTIONS, help=f"any of: {', '.join(SECTIONS)}")
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure misses its target")
    parser.add_argument(
        "--check-counts",
        action="store_true",
        help="exit 1 when a counted figure (read units, bytes: not a time) misses its target; for CI",
    )
    parser.add_argument(
        "--write-docs", action="store_true", help="rewrite the docs' tables from this run (cost: docs/operating.md)"
    )
    args = parser.parse_args(argv)
    if args.write_docs:
        os.environ["BENCH_WRITE_DOCS"] = "1"
    figures: list[Figure] = []
    print(f"dormant benchmarks{' (BENCH_QUICK: smoke sizes, figures not meaningful)' if QUICK else ''}")
    for name in args.sections:
        if name not in SECTIONS:
            parser.error(f"unknown section {name!r}")
        module = importlib.import_module(f"bench.{name}")
        started = time.perf_counter()
        print(f"\n[{name}] {module.__doc__.strip().splitlines()[0] if module.__doc__ else ''}")
        section = module.run()
        for figure in section:
            print(figure.line())
        print(f"  ({time.perf_counter() - started:.1f} s)")
        figures += section
    missed = [f for f in figures if not f.ok]
    print(f"\n{len(figures) - len(missed)}/{len(figures)} figures on target")
    counts_missed = [f for f in missed if f.counted]
    if args.check_counts:
        print(f"{len(counts_missed)} counted figure(s) missed (these fail --check-counts; times do not)")
    return 1 if (args.check and missed) or (args.check_counts and counts_missed) else 0


if __name__ == "__main__":
    sys.exit(main())
