"""`sparkfleet`'s command line as argparse sees it: a subcommand per verb (one playbook each), `clocks
set|reset|show`, `run PLAYBOOK`, `plan`, and `lab` when sparkfleet_lab is installed; the options every
verb shares and ansible-playbook's own. What runs a parsed command line is sparkfleet.cli_run; the entry
point, sparkfleet.cli.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable

from sparkfleet import __version__
from sparkfleet.api import CLOCKS_CAP_VAR, PLAYBOOKS, REBOOT_VAR, VERB_HELP
from sparkfleet.runner import EXIT_ERROR
from sparkfleet.tables import TABLES

PLAN_FORMATS = ("text", "mermaid", "svg")

DESCRIPTION = (
    "Turn two or three NVIDIA DGX Sparks into one DeepSeek V4.1 Flash inference server (TP2/TP3). "
    "Each verb runs one playbook of this project through ansible-runner against the inventory "
    "given with -i (repeat -i to layer inventories), shows live progress and a per-host recap, "
    "and exits 0 (ok), 2 (failed hosts), 4 (unreachable hosts), 130 (interrupted), 1 (ansible "
    "could not run the playbook) or 75 (another changing run holds the cluster lock on the head)."
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


def common_options() -> argparse.ArgumentParser:
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
    g.add_argument(
        "--break-lock",
        action="store_true",
        help="another run holds the cluster lock: stop its holder on the head, say whose it was, and take it "
        "(verbs that change something; read-only verbs and --check take no lock)",
    )
    a = common.add_argument_group(
        "ansible-playbook's options",
        "passed to ansible-playbook as they are; anything else goes after `--` "
        "(e.g. `sparkfleet up -i inv -- --force-handlers`)",
    )
    a.add_argument(
        "-f", "--forks", type=_positive_int, metavar="N", help="parallel processes (ansible's --forks)"
    )
    a.add_argument(
        "-u", "--user", metavar="USER", help="connect as this user (the inventory's ansible_user wins)"
    )
    a.add_argument(
        "--private-key", "--key-file", dest="private_key", metavar="FILE", help="the SSH private key to use"
    )
    a.add_argument(
        "-K",
        "--ask-become-pass",
        action="store_true",
        help="ask for the sudo password (typed into ansible's prompt; never on disk, in argv or logs)",
    )
    a.add_argument(
        "--become-password-file",
        "--become-pass-file",
        dest="become_password_file",
        metavar="FILE",
        help="read the sudo password from FILE (as ansible-playbook does)",
    )
    a.add_argument(
        "--vault-id",
        dest="vault_ids",
        action="append",
        default=[],
        metavar="ID",
        help="a vault identity: LABEL@FILE, FILE, or LABEL@prompt (sparkfleet asks); repeatable",
    )
    a.add_argument(
        "--vault-password-file",
        "--vault-pass-file",
        dest="vault_password_files",
        action="append",
        default=[],
        metavar="FILE",
        help="the vault password file; repeatable",
    )
    a.add_argument(
        "-J",
        "--ask-vault-pass",
        "--ask-vault-password",
        dest="ask_vault_pass",
        action="store_true",
        help="ask for the vault password",
    )
    a.add_argument(
        "--list-hosts", action="store_true", help="list the hosts each play would run on; run nothing"
    )
    a.add_argument("--list-tasks", action="store_true", help="list the tasks that would run; run nothing")
    a.add_argument("--list-tags", action="store_true", help="list the tags; run nothing")
    a.add_argument("--syntax-check", action="store_true", help="check the playbook's syntax; run nothing")
    a.add_argument("--start-at-task", metavar="NAME", help="start at the task of this name")
    a.add_argument(
        "--flush-cache", action="store_true", help="clear the fact cache of every host in the inventory"
    )
    return common


def _positive(refusal: str) -> Callable[[str], int]:
    """An argparse type: a positive whole number, else `refusal` with the text given ({text})."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(refusal.format(text=repr(text)))
        return value

    return parse


_positive_int = _positive("expected a positive whole number, got {text}")
_positive_mhz = _positive("MHZ must be a positive whole number of MHz, got {text}")


def build_parser(
    run_verb: Callable[[argparse.Namespace], int], run_plan: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """The whole command line; a verb's parsed arguments carry its handler (`func`): run_verb or run_plan."""
    parser = _Parser(
        prog="sparkfleet",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"sparkfleet {__version__}")
    parser.add_argument("--project-dir", metavar="DIR", help="the sparkfleet checkout to run from")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs")
    common = common_options()

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
        if verb == "network":  # -e network_links_discover=true: print the real cabling, change nothing
            p.add_argument(
                "--discover",
                dest="verb_vars",
                action="store_const",
                const={"network_links_discover": True},
                help="only print what each fabric port is really cabled to; changes nothing",
            )
        p.set_defaults(
            func=run_verb,
            playbook=PLAYBOOKS[verb],
            verb_vars=verb_vars,
            verb_tags=None,
            table=verb if verb in TABLES else None,
        )

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
    cset.set_defaults(
        func=run_verb,
        playbook=PLAYBOOKS["clocks"],
        verb_vars={},
        verb_tags=None,
        table="clocks",
        lock_verb="clocks set",
    )
    creset = clock_cmds.add_parser(
        "reset",
        parents=[common],
        help="remove the cap (default clocks)",
        description=f"Remove the GPU clock cap (sets -e {CLOCKS_CAP_VAR}=0).",
    )
    creset.set_defaults(
        func=run_verb,
        playbook=PLAYBOOKS["clocks"],
        verb_vars={CLOCKS_CAP_VAR: 0},
        verb_tags=None,
        table="clocks",
        lock_verb="clocks reset",
    )
    cshow = clock_cmds.add_parser(
        "show",
        parents=[common],
        help="show the clock state of every node; changes nothing",
        description="Show the GPU clock state of every node (runs only the tasks tagged `show`).",
    )
    cshow.set_defaults(
        func=run_verb,
        playbook=PLAYBOOKS["clocks"],
        verb_vars={},
        verb_tags="show",
        table="clocks",
        lock_verb="clocks show",
    )

    run = subparsers.add_parser(
        "run",
        parents=[common],
        help="run any playbook with sparkfleet's progress, recap, --json and exit codes",
        description="Run PLAYBOOK (a path; relative to the cwd, else to the project) like a verb.",
    )
    run.add_argument("playbook", metavar="PLAYBOOK", help="the playbook to run")
    run.set_defaults(func=run_verb, verb_vars={}, verb_tags=None, table=None)

    plan = subparsers.add_parser(
        "plan",
        help="draw the cluster's cabling and addressing plan from the inventory; contacts no host",
        description=(
            "Draw the cabling and addressing plan (nodes, ranks, QSFP ports, rails, subnets, addresses) "
            "that role cluster_plan computes, from the inventory alone: no host is contacted."
        ),
    )
    plan.add_argument(
        "-i",
        "--inventory",
        dest="inventories",
        action="append",
        required=True,
        metavar="INVENTORY",
        help="inventory directory or file; repeat to layer (later ones win)",
    )
    plan.add_argument("--format", choices=PLAN_FORMATS, default="text", help="text (default), mermaid or svg")
    plan.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    plan.add_argument(
        "--vault-password-file",
        dest="vault_password_files",
        action="append",
        default=[],
        metavar="FILE",
        help="for vault-encrypted inventory files; repeatable",
    )
    plan.add_argument("-J", "--ask-vault-pass", dest="ask_vault_pass", action="store_true", help="ask for it")
    plan.add_argument(
        "--project-dir", default=argparse.SUPPRESS, metavar="DIR", help="the sparkfleet checkout to run from"
    )
    plan.set_defaults(func=run_plan)

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
