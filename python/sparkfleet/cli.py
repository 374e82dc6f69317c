"""Command line entry point (filled in by the runner/CLI work)."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("sparkfleet: not yet wired", file=sys.stderr)
    return 1
