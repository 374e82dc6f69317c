"""`sparkfleet`: every playbook is a verb; `sparkfleet run PLAYBOOK` runs any other one.

Exit codes: 0 ok, 1 ansible could not run the playbook (or sparkfleet could not start it),
2 failed hosts, 4 unreachable hosts, 75 another run holds the cluster lock, 130 interrupted,
64 bad command line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sparkfleet.cli_parser import UsageError
from sparkfleet.cli_parser import build_parser as _build_parser
from sparkfleet.cli_run import (
    CommandLineError,
    ansible_options,
    parse_extravars,
    run_plan,
    run_verb,
    verb_extravars,
)
from sparkfleet.runner import EXIT_ERROR, EXIT_INTERRUPTED, RunnerError

# The parser is sparkfleet.cli_parser, what runs a parsed command line sparkfleet.cli_run; tests use these
# names from here too.
__all__ = ["ansible_options", "build_parser", "main", "parse_extravars", "verb_extravars"]

EXIT_USAGE = 64
_run_verb = run_verb


def build_parser() -> argparse.ArgumentParser:
    return _build_parser(run_verb, run_plan)


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """`sparkfleet VERB ... -- ARGS`: ARGS go to ansible-playbook as they are."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Our options before `--`; what follows it is for ansible-playbook."""
    ours, passthrough = split_passthrough(argv)
    args = parser.parse_args(ours)
    if passthrough:
        if getattr(args, "func", None) is not _run_verb:
            raise CommandLineError(
                f"`--` passes options to ansible-playbook; `sparkfleet {args.verb or ''}` runs no playbook"
            )
        args.ansible_args = passthrough
    return args


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parse(parser, list(sys.argv[1:] if argv is None else argv))
        if getattr(args, "func", None) is None:
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        if args.verb == "lab" and getattr(args, "project_dir", None):
            # The lab finds the project through this variable.
            os.environ["SPARKFLEET_PROJECT"] = str(Path(args.project_dir).resolve())
        return int(args.func(args))
    except (UsageError, CommandLineError) as exc:
        if isinstance(exc, UsageError):
            sys.stderr.write(exc.usage)
            print(exc, file=sys.stderr)
        else:
            print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    except RunnerError as exc:
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except (KeyboardInterrupt, EOFError):
        print("\nsparkfleet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
