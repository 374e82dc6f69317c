"""What runs a parsed `sparkfleet` command line: a verb's playbook through the runner (the -e variables and
what the verb itself sets, ansible-playbook's options, the passwords asked before anything runs, the
cluster lock, live progress, the table and the recap, or one JSON document), and `sparkfleet plan`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from sparkfleet.api import CLOCKS_CAP_VAR, READ_ONLY_VERBS, REBOOT_FORCE_VAR, lock_request
from sparkfleet.progress import Progress, render_recap
from sparkfleet.runner import AnsibleOptions, Passwords, find_project, run_playbook
from sparkfleet.tables import CLI_TABLES_VAR, TABLES


class CommandLineError(Exception):
    """A command line that parses but cannot run (exit 64)."""


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


def run_plan(args: argparse.Namespace) -> int:
    from sparkfleet.plan import RENDER, load_plan

    project = find_project(getattr(args, "project_dir", None))
    vault_password = ask_password("Vault password: ") if args.ask_vault_pass else None
    plan = load_plan(
        args.inventories,
        project,
        vault_password_files=args.vault_password_files,
        vault_password=vault_password,
    )
    text = RENDER[args.format](plan)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def ask_password(prompt: str) -> str:
    """A password typed at the terminal (no echo); without one, the next line of stdin."""
    return getpass.getpass(prompt)


def passwords_for(args: argparse.Namespace, ask: Callable[[str], str] = ask_password) -> Passwords:
    """Ask for what -K, --ask-vault-pass and --vault-id LABEL@prompt need, before anything runs."""
    passwords = Passwords()
    if args.ask_become_pass:
        passwords.become = ask("BECOME password: ")
    if args.ask_vault_pass:
        passwords.vault = ask("Vault password: ")
    for vault_id in args.vault_ids:
        label, sep, source = vault_id.partition("@")
        if sep and source == "prompt":
            passwords.vault_ids[label] = ask(f"Vault password ({label}): ")
    return passwords


def ansible_options(args: argparse.Namespace) -> AnsibleOptions:
    return AnsibleOptions(
        forks=args.forks,
        user=args.user,
        private_key=args.private_key,
        become_password_file=args.become_password_file,
        vault_ids=[v for v in args.vault_ids if not v.endswith("@prompt")],
        vault_password_files=list(args.vault_password_files),
        start_at_task=args.start_at_task,
        flush_cache=args.flush_cache,
        list_hosts=args.list_hosts,
        list_tasks=args.list_tasks,
        list_tags=args.list_tags,
        syntax_check=args.syntax_check,
        extra=list(getattr(args, "ansible_args", [])),
    )


def verb_extravars(args: argparse.Namespace) -> dict[str, Any]:
    """-e, then what the verb itself sets (its variable wins over a user -e of the same name)."""
    try:
        extravars = parse_extravars(args.extra_vars)
    except ValueError as exc:
        raise CommandLineError(str(exc)) from exc
    extravars.update(args.verb_vars)
    if getattr(args, "force", False):
        extravars[REBOOT_FORCE_VAR] = True
    if getattr(args, "mhz", None) is not None:
        extravars[CLOCKS_CAP_VAR] = args.mhz
    return extravars


def lock_verb(args: argparse.Namespace) -> str:
    """What the cluster lock's record says this run is doing: `up`, `clocks set 2400`, `run x.yml`."""
    label = getattr(args, "lock_verb", None) or args.verb
    if args.verb == "run":
        return f"run {args.playbook}"
    if getattr(args, "mhz", None) is not None:
        return f"{label} {args.mhz}"
    if getattr(args, "force", False):
        return f"{label} --force"
    return label


def run_verb(args: argparse.Namespace) -> int:
    extravars = verb_extravars(args)
    tags = args.tags
    if args.verb_tags:
        tags = f"{args.verb_tags},{tags}" if tags else args.verb_tags
    ansible = ansible_options(args)
    if args.json and ansible.listing:
        raise CommandLineError(
            "--json cannot be combined with --list-hosts, --list-tasks, --list-tags or --syntax-check: "
            "ansible prints those as text"
        )
    try:
        lock = lock_request(
            lock_verb(args),
            read_only=(getattr(args, "lock_verb", None) or args.verb) in READ_ONLY_VERBS,
            check=args.check,
            ansible=ansible,
            break_lock=args.break_lock,
        )
    except ValueError as exc:
        raise CommandLineError(str(exc)) from exc
    project = find_project(getattr(args, "project_dir", None))
    playbook = project / args.playbook if args.verb != "run" else args.playbook
    table = TABLES.get(args.table) if getattr(args, "table", None) else None
    if table is not None and not args.json:
        # the roles' own text reports are left out: the CLI draws the table from their data
        extravars.setdefault(CLI_TABLES_VAR, True)
    passwords = passwords_for(args)
    display = None
    if not args.quiet:
        stream = sys.stderr if args.json else sys.stdout
        display = Progress(stream, verbosity=args.verbosity, show_diff=args.diff, listing=ansible.listing)
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
        project_dir=project,
        quiet=True,
        ansible=ansible,
        passwords=passwords,
        display=display,
        lock=lock,
        notify=display.emit if display is not None else None,
    )
    if args.json:
        if not args.quiet:
            sys.stderr.write(render_recap(result))
        sys.stdout.write(json.dumps(result.to_dict(), indent=2) + "\n")
    else:
        text = table(result.data) if table is not None else ""
        if text:
            sys.stdout.write("\n" + text)
        if not ansible.listing or result.exit_code != 0:
            sys.stdout.write(render_recap(result))
    sys.stdout.flush()
    return result.exit_code
