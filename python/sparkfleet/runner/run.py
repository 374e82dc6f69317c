"""One run: the environment, the ansible-playbook options, ansible-runner's invocation, and the
result. Secrets are handled by `secrets`, Ctrl-C by `interrupt`, events by `events`."""

from __future__ import annotations

import configparser
import contextlib
import datetime as dt
import hashlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sparkfleet import progress as _progress
from sparkfleet import text as _text
from sparkfleet.runner.events import Collector
from sparkfleet.runner.head import head_connection
from sparkfleet.runner.interrupt import Interrupt
from sparkfleet.runner.lock import ClusterLock, LockOutcome, LockRequest, run_record
from sparkfleet.runner.project import find_project, new_run_dir, resolve
from sparkfleet.runner.result import EXIT_LOCKED, STATUS_BY_EXIT, Failure, RunnerError, RunResult
from sparkfleet.runner.secrets import (
    Passwords,
    redact_tree,
    scrub_command_file,
    secret_values,
    secret_vars_file,
    split_secrets,
)

# ansible-playbook modes that print a listing (or a syntax verdict) and run nothing.
LISTING_FLAGS = ("--list-hosts", "--list-tasks", "--list-tags", "--syntax-check")
# Options after `--` that would make ansible wait for keyboard input no one can give it (the run
# is driven by ansible-runner), or put values on the command line that sparkfleet keeps off it.
_REFUSED_PASSTHROUGH = {
    "-k": "SSH passwords are not supported: use SSH keys (--private-key)",
    "--ask-pass": "SSH passwords are not supported: use SSH keys (--private-key)",
    "-K": "use sparkfleet's own -K (before --)",
    "--ask-become-pass": "use sparkfleet's own -K (before --)",
    "-J": "use sparkfleet's own --ask-vault-pass (before --)",
    "--ask-vault-pass": "use sparkfleet's own --ask-vault-pass (before --)",
    "--ask-vault-password": "use sparkfleet's own --ask-vault-pass (before --)",
    "--step": "--step asks before every task; it cannot be answered through sparkfleet",
    "-e": "use sparkfleet's own -e (before --): it keeps secret variables off the command line",
    "--extra-vars": "use sparkfleet's own -e (before --): it keeps secret variables off the command line",
}


@dataclass
class AnsibleOptions:
    """ansible-playbook's own options that sparkfleet passes through (ansible-playbook parity).

    Passwords are not here: they are answered at ansible's prompts (`secrets.Passwords`)."""

    forks: int | None = None
    user: str | None = None
    private_key: str | None = None
    become_password_file: str | None = None
    vault_ids: list[str] = field(default_factory=list)  # LABEL@FILE (LABEL@prompt: see Passwords)
    vault_password_files: list[str] = field(default_factory=list)
    start_at_task: str | None = None
    flush_cache: bool = False
    list_hosts: bool = False
    list_tasks: bool = False
    list_tags: bool = False
    syntax_check: bool = False
    extra: list[str] = field(default_factory=list)  # anything else, after `--`

    def cmdline(self) -> list[str]:
        return [*self._connection(), *self._vault(), *self._modes(), *self._passthrough()]

    def _connection(self) -> list[str]:
        args: list[str] = []
        if self.forks is not None:
            if self.forks < 1:
                raise RunnerError(f"forks must be 1 or more, got {self.forks}")
            args += ["--forks", str(self.forks)]
        if self.user:
            args += ["--user", self.user]
        if self.private_key:
            args += ["--private-key", _existing(self.private_key, "private key")]
        if self.become_password_file:
            args += ["--become-password-file", _existing(self.become_password_file, "become password file")]
        return args

    def _vault(self) -> list[str]:
        args: list[str] = []
        for vault_id in self.vault_ids:
            label, sep, source = vault_id.partition("@")
            if sep and source == "prompt":
                raise RunnerError(
                    f"vault id {vault_id}: give its password to sparkfleet instead "
                    "(the CLI asks for it; the API takes Passwords(vault_ids={label: password}))"
                )
            if sep and source:
                args += ["--vault-id", f"{label}@{_existing(source, 'vault password file')}"]
            else:  # a bare file
                args += ["--vault-id", _existing(vault_id, "vault password file")]
        for path in self.vault_password_files:
            args += ["--vault-password-file", _existing(path, "vault password file")]
        return args

    def _modes(self) -> list[str]:
        args: list[str] = []
        if self.start_at_task:
            args += ["--start-at-task", self.start_at_task]
        if self.flush_cache:
            args.append("--flush-cache")
        asked = (self.list_hosts, self.list_tasks, self.list_tags, self.syntax_check)
        return args + [flag for flag, on in zip(LISTING_FLAGS, asked, strict=True) if on]

    def _passthrough(self) -> list[str]:
        for arg in self.extra:
            name = arg.split("=", 1)[0]
            if name in _REFUSED_PASSTHROUGH:
                raise RunnerError(f"{arg} after --: {_REFUSED_PASSTHROUGH[name]}")
            if arg.endswith("@prompt"):
                raise RunnerError(f"{arg} after --: use sparkfleet's own --vault-id (before --)")
        return list(self.extra)

    @property
    def listing(self) -> bool:
        """ansible-playbook only lists (hosts, tasks, tags) or checks the syntax: nothing runs."""
        asked = {self.list_hosts, self.list_tasks, self.list_tags, self.syntax_check}
        return True in asked or any(arg.split("=", 1)[0] in LISTING_FLAGS for arg in self.extra)


def _existing(path: str, what: str) -> str:
    """An absolute path (ansible runs in the project directory, not the caller's cwd)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise RunnerError(f"{what} not found: {path}")
    return str(p.resolve())


def _cfg_host_key_checking(cfg: Path) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    with contextlib.suppress(configparser.Error, OSError):
        parser.read(cfg)
    return parser.get("defaults", "host_key_checking", fallback="True")


def runner_env(project: Path) -> dict[str, str]:
    cfg = project / "ansible.cfg"
    bindir = str(Path(sys.executable).parent)
    env = {
        "ANSIBLE_CONFIG": str(cfg),
        # ansible-playbook from the same virtualenv as this package, whatever PATH says.
        "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        "PYTHONUNBUFFERED": "1",
    }
    # ansible-runner turns host key checking off unless told otherwise; keep ansible.cfg's choice.
    if "ANSIBLE_HOST_KEY_CHECKING" not in os.environ:
        env["ANSIBLE_HOST_KEY_CHECKING"] = _cfg_host_key_checking(cfg)
    env.update(strategy_env(os.environ.get("SPARKFLEET_STRATEGY", "")))
    return env


def fact_cache_env(inventories: list[Path]) -> dict[str, str]:
    """One fact cache per set of inventories. ansible.cfg's jsonfile cache is keyed by host name
    only: two clusters whose hosts are both called spark1 (two labs, or tp2 and tp3 fleets run
    from one controller) would read each other's facts. An ANSIBLE_CACHE_PLUGIN_CONNECTION of the
    caller's own is kept."""
    if os.environ.get("ANSIBLE_CACHE_PLUGIN_CONNECTION"):
        return {}
    key = hashlib.sha256("\n".join(str(Path(i).resolve()) for i in inventories).encode()).hexdigest()[:16]
    base = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkfleet" / "facts-by-inventory"
    )
    return {"ANSIBLE_CACHE_PLUGIN_CONNECTION": str(base / key)}


STRATEGIES = ("linear", "mitogen")


def strategy_env(name: str) -> dict[str, str]:
    """SPARKFLEET_STRATEGY: unset = ansible.cfg's strategy (Ansible's linear); `linear` = the same, said
    explicitly; `mitogen` = plugins/strategy/sparkfleet.py, mitogen's linear strategy, refused without
    the mitogen package (an opt-in: measured slower than linear on the no-op and on status; README,
    "Speed")."""
    if name == "":
        return {}
    if name == "linear":
        return {"ANSIBLE_STRATEGY": "linear"}
    if name != "mitogen":
        choices = ", ".join(STRATEGIES)
        raise RunnerError(f"SPARKFLEET_STRATEGY={name!r}: use one of {choices} (or leave it unset)")
    try:
        import ansible_mitogen  # noqa: F401 - only whether it is there
    except ImportError as exc:
        raise RunnerError(
            "SPARKFLEET_STRATEGY=mitogen needs the mitogen package: `make venv` installs it from "
            "requirements/lock.txt, or unset SPARKFLEET_STRATEGY"
        ) from exc
    return {"ANSIBLE_STRATEGY": "sparkfleet"}


def _fanout(handlers: list[tuple[Callable[[dict], None] | None, str]]) -> Callable[[dict], bool]:
    """One ansible-runner event handler calling each of ours. A display or user callback that
    raises must not abort a running playbook: it is reported once and the run goes on."""
    warned: set[str] = set()
    live = [(fn, label) for fn, label in handlers if fn is not None]

    def handle(event: dict) -> bool:
        for fn, label in live:
            try:
                fn(event)
            except Exception as exc:
                if label not in warned:
                    warned.add(label)
                    print(f"sparkfleet: {label} raised {exc!r}; the run goes on", file=sys.stderr)
        return True  # ansible-runner keeps the event in artifacts/job_events

    return handle


def run_playbook(
    playbook: str | Path,
    inventories: Sequence[str | Path],
    *,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    tags: str | None = None,
    skip_tags: str | None = None,
    extravars: dict | None = None,
    verbosity: int = 0,
    on_event: Callable[[dict], None] | None = None,
    project_dir: Path | None = None,
    quiet: bool = False,
    ansible: AnsibleOptions | None = None,
    passwords: Passwords | None = None,
    display: Callable[[dict], None] | None = None,
    lock: LockRequest | None = None,
    notify: Callable[[str], None] | None = None,
) -> RunResult:
    """Run `playbook` against `inventories` (layered in order, as repeated `-i`) and wait.

    Unless `quiet`, live progress and the recap go to stdout (`display`, if given, is used
    instead of the default one). `on_event` receives every raw ansible-runner event. `ansible`
    carries ansible-playbook's own options, `passwords` the answers to its prompts. Ctrl-C
    (SIGINT/SIGTERM, main thread only) stops ansible: the result then has exit_code 130. Raises
    RunnerError when the run cannot start.

    `lock` (a changing run): take the cluster lock on the head first, hold it for the run, let it
    go at the end. When another run holds it, nothing runs and the result's status is `locked`
    (exit code 75). The lock's messages (taken over, lost, taken again) go to `notify`, else to
    stderr unless `quiet`. Without `lock` no lock is taken (read-only verbs, the lab's converge).
    """
    import ansible_runner

    project = find_project(project_dir)
    book = resolve(playbook, project, "playbook")
    if not inventories:
        raise RunnerError("no inventory given (-i INVENTORY)")
    invs = [resolve(inv, project, "inventory") for inv in inventories]
    ansible = ansible or AnsibleOptions()
    passwords = passwords or Passwords()
    ansible_args = ansible.cmdline()  # refuses bad options before a run directory is made
    now = dt.datetime.now(dt.UTC)
    public_vars, secret_vars = split_secrets(extravars)
    envvars = {**runner_env(project), **fact_cache_env(invs)}
    secrets = secret_values(secret_vars, {**os.environ, **envvars}, passwords.values())
    if display is None and not quiet:
        display = _progress.Progress(sys.stdout, verbosity=verbosity, show_diff=diff, listing=ansible.listing)
    if notify is None and not quiet:
        notify = getattr(display, "emit", None) or _to_stderr
    collector = Collector()
    cluster_lock, lock_outcome, private = _lock_and_run_dir(
        lock,
        invs,
        project,
        now=now,
        book=book,
        extravars=extravars,
        ansible=ansible,
        passwords=passwords,
        notify=notify,
        display=display,
    )
    artifacts = private / "artifacts"
    if lock_outcome is not None and lock_outcome.outcome == "refused":
        _close(display)
        result = _locked_result(lock_outcome, book, now, check=check, invs=invs, artifacts=artifacts)
        return _finish(result, artifacts, quiet)

    def status_handler(data: dict, runner_config: object = None) -> None:
        # 'running' comes right after ansible-runner wrote artifacts/command, before ansible starts.
        if data.get("status") == "running":
            scrub_command_file(artifacts, secrets)

    tick = getattr(display, "tick", None)
    interrupt = Interrupt(tick=tick)
    started = time.monotonic()
    runner = None
    interrupt.install()
    try:
        with secret_vars_file(secret_vars) as secret_file:
            cmdline = [
                *(["--check"] if check else []),
                *(["--diff"] if diff else []),
                *(["-e", f"@{secret_file}"] if secret_file else []),
                *ansible_args,
                *passwords.cmdline(),
            ]
            runner = ansible_runner.run(
                private_data_dir=str(private),
                artifact_dir=str(private),
                ident="artifacts",
                project_dir=str(project),
                playbook=book,
                inventory=invs,
                limit=limit or None,
                tags=tags or None,
                skip_tags=skip_tags or None,
                extravars=public_vars or None,
                verbosity=verbosity or None,
                cmdline=shlex.join(cmdline) if cmdline else None,
                envvars=envvars,
                # Typed into ansible's own prompts (pexpect); with suppress_env_files never on disk.
                passwords=passwords.expect() or None,
                suppress_env_files=True,
                quiet=True,
                # Not "jsonfile": ansible-runner would then point the fact cache into this run's
                # artifacts and override ansible.cfg's shared cache (no-op re-runs need it).
                fact_cache_type="ansible.cfg",
                rotate_artifacts=0,
                event_handler=_fanout(
                    [
                        (collector.feed, "result collector"),
                        (display, "progress display"),
                        (on_event, "on_event"),
                    ]
                ),
                status_handler=status_handler,
                cancel_callback=interrupt.cancel,
            )
    finally:
        if cluster_lock is not None:
            cluster_lock.release()
        interrupt.restore()
        interrupt.reap()
        _close(display)
        scrub_command_file(artifacts, secrets)
        redact_tree(private, secrets)

    interrupted = interrupt.interrupted or bool(runner is not None and runner.canceled)
    result = collector.result(
        playbook=book,
        rc=runner.rc if runner is not None else None,
        interrupted=interrupted,
        elapsed=time.monotonic() - started,
        artifacts_dir=artifacts,
        started=now.isoformat(timespec="seconds"),
        check=check,
        inventories=invs,
    )
    result.lock = lock_outcome
    return _finish(result, artifacts, quiet)


def _finish(result: RunResult, artifacts: Path, quiet: bool) -> RunResult:
    with contextlib.suppress(OSError):
        artifacts.mkdir(parents=True, exist_ok=True)
        (artifacts / "sparkfleet-result.json").write_text(json.dumps(result.to_dict(), indent=2))
    if not quiet:
        sys.stdout.write(_text.render_recap(result))
        sys.stdout.flush()
    return result


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _close(display: object) -> None:
    close = getattr(display, "close", None)
    if close is not None:
        close()


def _lock_and_run_dir(
    request: LockRequest | None,
    invs: list[str],
    project: Path,
    *,
    now: dt.datetime,
    book: str,
    extravars: dict | None,
    ansible: AnsibleOptions,
    passwords: Passwords,
    notify: Callable[[str], None] | None,
    display: object,
) -> tuple[ClusterLock | None, LockOutcome | None, Path]:
    """The cluster lock of a changing run (its outcome: taken, refused, ... or none when the
    inventory has no head), then the run's directory. The lock comes first: a run that cannot
    reach the head leaves no directory."""
    cluster_lock, outcome = None, None
    try:
        if request is not None:
            conn = head_connection(
                invs,
                project,
                extravars=extravars,
                user=ansible.user,
                private_key=ansible.private_key,
                become_password=passwords.become,
                become_password_file=ansible.become_password_file,
                vault_ids=ansible.vault_ids,
                vault_password_files=ansible.vault_password_files,
                vault_password=passwords.vault,
                vault_id_passwords=passwords.vault_ids,
            )
            if conn is None:
                outcome = LockOutcome("none", None, None)
            else:
                cluster_lock = ClusterLock(conn, run_record(request.verb, book, now), notify)
                outcome = cluster_lock.acquire(break_lock=request.break_lock)
            if notify is not None and outcome.outcome in ("taken_over", "broken", "none"):
                notify(f"lock: {outcome.message}")
        return cluster_lock, outcome, new_run_dir(project, book, now)
    except BaseException:
        _close(display)
        if cluster_lock is not None:
            cluster_lock.release()
        raise


LOCKED_HINT = (
    "Another changing run is using this cluster: wait for it to end. If that run is stuck, run again "
    "with --break-lock (Python API: break_lock=True): it stops the holder and takes the lock."
)


def _locked_result(
    outcome: LockOutcome, book: str, now: dt.datetime, *, check: bool, invs: list[str], artifacts: Path
) -> RunResult:
    """Nothing ran: another run holds the cluster lock."""
    failure = Failure(
        kind="locked", host=outcome.head, play="", task="", action="", msg=f"{outcome.message}\n{LOCKED_HINT}"
    )
    return RunResult(
        playbook=book,
        status=STATUS_BY_EXIT[EXIT_LOCKED],
        rc=None,
        exit_code=EXIT_LOCKED,
        hosts={},
        failures=[failure],
        elapsed=0.0,
        artifacts_dir=artifacts,
        started=now.isoformat(timespec="seconds"),
        check=check,
        inventories=invs,
        lock=outcome,
    )
