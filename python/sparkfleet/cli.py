"""`sparkfleet`: every playbook is a verb; `sparkfleet run PLAYBOOK` runs any other one.

Exit codes: 0 ok, 1 ansible could not run the playbook (or sparkfleet could not start it),
2 failed hosts, 4 unreachable hosts, 130 interrupted, 64 bad command line.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

from sparkfleet import __version__
from sparkfleet.api import CLOCKS_CAP_VAR, PLAYBOOKS, REBOOT_FORCE_VAR, REBOOT_VAR, VERB_HELP
from sparkfleet.progress import Progress, render_recap
from sparkfleet.runner import EXIT_ERROR, EXIT_INTERRUPTED, RunnerError, find_project, run_playbook

EXIT_USAGE = 64

DESCRIPTION = (
    "Turn two or three NVIDIA DGX Sparks into one DeepSeek V4.1 Flash inference server (TP2/TP3). "
    "Each verb runs one playbook of this project through ansible-runner against the inventory "
    "given with -i (repeat -i to layer inventories), shows live progress and a per-host recap, "
    "and exits 0 (ok), 2 (failed hosts), 4 (unreachable hosts), 130 (interrupted) or 1 (ansible "
    "could not run the playbook)."
)
EPILOG = (
    "examples:\n"
    "  sparkfleet preflight -i inventory/tp3\n"
    "  sparkfleet up -i inventory/tp3 --check --diff\n"
    "  sparkfleet clocks set 2400 -i inventory/tp3 --limit spark2\n"
    "  sparkfleet status -i inventory/tp3 --json > status.json\n"
    "  sparkfleet run playbooks/weights.yml -i inventory/tp2 -i .lab/tp2/inventory -v"
)


class UsageError(Exception):
    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on bad usage; 2 means "failed hosts" here, so usage errors raise instead."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message}", self.format_usage())


def _common_options() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    g = common.add_argument_group("run options")
    g.add_argument(
        "-i",
        "--inventory",
        dest="inventories",
        action="append",
        required=True,
        metavar="INVENTORY",
        help="inventory directory or file; repeat to layer (later ones win)",
    )
    g.add_argument("--check", action="store_true", help="dry run: report what would change, change nothing")
    g.add_argument("--diff", action="store_true", help="show the changes to files and templates")
    g.add_argument("-l", "--limit", metavar="PATTERN", help="only these hosts (an ansible host pattern)")
    g.add_argument("-t", "--tags", metavar="TAGS", help="only tasks with these tags (comma-separated)")
    g.add_argument("--skip-tags", metavar="TAGS", help="skip tasks with these tags")
    g.add_argument(
        "-e",
        "--extra-vars",
        dest="extra_vars",
        action="append",
        default=[],
        metavar="VARS",
        help="set variables: key=value [key=value...], a YAML/JSON mapping, or @FILE; repeatable. "
        "Variables whose name contains token/key/password/secret never reach the run's artifacts",
    )
    g.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="count",
        default=0,
        help="-v: each task result; -vv and more: ansible's own output at that verbosity",
    )
    g.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (docs/json-schema.md) on stdout; progress and recap go to stderr",
    )
    g.add_argument("-q", "--quiet", action="store_true", help="no live progress (the recap is still printed)")
    g.add_argument(
        "--project-dir", default=argparse.SUPPRESS, metavar="DIR", help="the sparkfleet checkout to run from"
    )
    return common


def parse_extravars(values: list[str]) -> dict[str, Any]:
    """ansible's -e forms, merged in order (later wins). @FILE is read here as YAML/JSON."""
    merged: dict[str, Any] = {}
    for value in values:
        text = value.strip()
        if text.startswith("@"):
            path = Path(text[1:]).expanduser()
            try:
                loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, yaml.YAMLError) as exc:
                raise ValueError(f"-e {value}: cannot read {path}: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ValueError(f"-e {value}: {path} does not hold a mapping of variables")
            merged.update(loaded)
        elif text.startswith(("{", "[")):
            try:
                loaded = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise ValueError(f"-e {value!r}: not valid YAML/JSON: {exc}") from exc
            if not isinstance(loaded, dict):
                raise ValueError(f"-e {value!r}: expected a mapping of variables")
            merged.update(loaded)
        else:
            for token in shlex.split(text):
                key, sep, val = token.partition("=")
                if not sep or not key:
                    raise ValueError(f"-e {value!r}: expected key=value, got {token!r}")
                merged[key] = val
    return merged


def _positive_mhz(text: str) -> int:
    try:
        mhz = int(text)
    except ValueError:
        mhz = 0
    if mhz <= 0:
        raise argparse.ArgumentTypeError(f"MHZ must be a positive whole number of MHz, got {text!r}")
    return mhz


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="sparkfleet",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sparkfleet {__version__}")
    parser.add_argument("--project-dir", metavar="DIR", help="the sparkfleet checkout to run from")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs")
    common = _common_options()

    for verb in PLAYBOOKS:
        if verb == "clocks":
            continue
        p = subparsers.add_parser(
            verb,
            parents=[common],
            help=VERB_HELP[verb],
            description=f"{VERB_HELP[verb]}. Runs {PLAYBOOKS[verb]}.",
        )
        verb_vars = {}
        if verb == "reboot":
            # Asking for a reboot is the admin's permission to reboot (site.yml only reports
            # unless host_tuning_reboot is `allowed` in the inventory).
            verb_vars = {REBOOT_VAR: "allowed"}
            p.add_argument(
                "--force",
                action="store_true",
                help="reboot every node of the cluster even when none reports a pending change",
            )
        p.set_defaults(func=_run_verb, playbook=PLAYBOOKS[verb], verb_vars=verb_vars, verb_tags=None)

    clocks = subparsers.add_parser(
        "clocks",
        help=VERB_HELP["clocks"],
        description=f"{VERB_HELP['clocks']}. Runs {PLAYBOOKS['clocks']}.",
    )
    clock_cmds = clocks.add_subparsers(dest="clocks_cmd", metavar="{set,reset,show}", required=True)
    cset = clock_cmds.add_parser(
        "set",
        parents=[common],
        help="cap the GPU clocks at MHZ",
        description=f"Cap the GPU clocks at MHZ (sets -e {CLOCKS_CAP_VAR}=MHZ).",
    )
    cset.add_argument("mhz", type=_positive_mhz, metavar="MHZ", help="the cap, in MHz")
    cset.set_defaults(func=_run_verb, playbook=PLAYBOOKS["clocks"], verb_vars={}, verb_tags=None)
    creset = clock_cmds.add_parser(
        "reset",
        parents=[common],
        help="remove the cap (default clocks)",
        description=f"Remove the GPU clock cap (sets -e {CLOCKS_CAP_VAR}=0).",
    )
    creset.set_defaults(
        func=_run_verb, playbook=PLAYBOOKS["clocks"], verb_vars={CLOCKS_CAP_VAR: 0}, verb_tags=None
    )
    cshow = clock_cmds.add_parser(
        "show",
        parents=[common],
        help="show the clock state of every node; changes nothing",
        description="Show the GPU clock state of every node (runs only the tasks tagged `show`).",
    )
    cshow.set_defaults(func=_run_verb, playbook=PLAYBOOKS["clocks"], verb_vars={}, verb_tags="show")

    run = subparsers.add_parser(
        "run",
        parents=[common],
        help="run any playbook with sparkfleet's progress, recap, --json and exit codes",
        description="Run PLAYBOOK (a path; relative to the cwd, else to the project) like a verb.",
    )
    run.add_argument("playbook", metavar="PLAYBOOK", help="the playbook to run")
    run.set_defaults(func=_run_verb, verb_vars={}, verb_tags=None)

    _register_lab(subparsers)
    return parser


def _register_lab(subparsers: argparse._SubParsersAction) -> None:
    """`sparkfleet lab ...` comes from sparkfleet_lab.cli when that module is there."""
    try:
        spec = importlib.util.find_spec("sparkfleet_lab.cli")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return
    try:
        importlib.import_module("sparkfleet_lab.cli").register(subparsers)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
        if "lab" in subparsers.choices:
            return
        lab = subparsers.add_parser("lab", help=f"the simulated cluster (unavailable: {problem})")
        lab.add_argument("rest", nargs=argparse.REMAINDER)
        lab.set_defaults(func=lambda _args: _lab_unavailable(problem))


def _lab_unavailable(problem: str) -> int:
    print(f"sparkfleet lab: cannot load sparkfleet_lab.cli ({problem})", file=sys.stderr)
    return EXIT_ERROR


def _run_verb(args: argparse.Namespace) -> int:
    try:
        extravars = parse_extravars(args.extra_vars)
    except ValueError as exc:
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_USAGE
    extravars.update(args.verb_vars)
    if getattr(args, "force", False):
        extravars[REBOOT_FORCE_VAR] = True
    if getattr(args, "mhz", None) is not None:
        extravars[CLOCKS_CAP_VAR] = args.mhz
    tags = args.tags
    if args.verb_tags:
        tags = f"{args.verb_tags},{tags}" if tags else args.verb_tags
    project = find_project(getattr(args, "project_dir", None))
    playbook = project / args.playbook if args.verb != "run" else args.playbook

    display = None
    if args.json and not args.quiet:
        display = Progress(sys.stderr, verbosity=args.verbosity, show_diff=args.diff)
    result = run_playbook(
        playbook,
        args.inventories,
        check=args.check,
        diff=args.diff,
        limit=args.limit,
        tags=tags,
        skip_tags=args.skip_tags,
        extravars=extravars,
        verbosity=args.verbosity,
        on_event=display,
        project_dir=project,
        quiet=args.json or args.quiet,
    )
    if display is not None:
        display.close()
        sys.stderr.write(render_recap(result))
    elif args.quiet and not args.json:
        sys.stdout.write(render_recap(result))
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    sys.stdout.flush()
    return result.exit_code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        sys.stderr.write(exc.usage)
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version
        return exc.code if isinstance(exc.code, int) else 0
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.verb == "lab" and getattr(args, "project_dir", None):
        # The lab finds the project through this variable.
        os.environ["SPARKFLEET_PROJECT"] = str(Path(args.project_dir).resolve())
    try:
        return int(args.func(args))
    except RunnerError as exc:
        print(f"sparkfleet: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("\nsparkfleet: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
