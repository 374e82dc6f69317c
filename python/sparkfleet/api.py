"""The Python API: one method per sparkfleet verb, each returning a typed `RunResult`.

>>> from sparkfleet.api import Cluster
>>> result = Cluster("inventory/tp3").up(check=True)  # doctest: +SKIP
>>> [(f.host, f.task, f.msg) for f in result.failures]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, Unpack

from sparkfleet.runner import AnsibleOptions, Passwords, RunResult, find_project, run_playbook
from sparkfleet.runner.lock import LockRequest

# Verb → playbook, relative to the project (docs/CONTRACTS.md).
PLAYBOOKS: dict[str, str] = {
    "up": "site.yml",
    "preflight": "playbooks/preflight.yml",
    "network": "playbooks/network.yml",
    "host": "playbooks/host.yml",
    "host-status": "playbooks/host_status.yml",
    "reboot": "playbooks/reboot.yml",
    "weights": "playbooks/weights.yml",
    "engine": "playbooks/engine.yml",
    "start": "playbooks/start.yml",
    "stop": "playbooks/stop.yml",
    "status": "playbooks/status.yml",
    "verify": "playbooks/verify.yml",
    "clocks": "playbooks/clocks.yml",
}

# One line per verb: the CLI's help and the API's docstrings say the same thing.
VERB_HELP: dict[str, str] = {
    "up": "provision the whole cluster: site.yml (preflight, network, host, reboot, clocks, "
    "weights, engine, start)",
    "preflight": "validate the inventory and the nodes (OS, disk, memory, GPU, links); changes nothing",
    "network": "configure the fabric links (addresses, MTU 9000, checks) and SSH trust between nodes",
    "host": "tune the hosts (sysctls, limits, services) and install earlyoom",
    "host-status": "report the host tuning of every node (what is set, what differs); changes nothing",
    "reboot": "reboot every node of the cluster together when one needs it (--force: always); waits for all",
    "weights": "download the model weights on the head, verify them, distribute them to every node",
    "engine": "build the engine image on the head and ship it to the workers",
    "start": "start the engine ranks in order and wait until the API is ready",
    "stop": "stop the engine on every node",
    "status": "report the state of every node and of the engine; changes nothing",
    "verify": "send real requests to the API and check the answers",
    "clocks": "GPU clock caps: set a cap in MHz, reset to the default, or show the current state",
}

# Verbs that change nothing take no cluster lock (docs/cli.md, "The cluster lock"); every other
# verb, `run PLAYBOOK` and Cluster.run do, unless they only check (--check) or list.
READ_ONLY_VERBS = frozenset({"preflight", "status", "host-status", "verify", "clocks show"})

CLOCKS_CAP_VAR = "gpu_clocks_cap_mhz"
REBOOT_VAR = "host_tuning_reboot"
REBOOT_FORCE_VAR = "host_tuning_reboot_force"


class RunOptions(TypedDict, total=False):
    """The options every verb takes: the CLI's run options and ansible-playbook's own."""

    check: bool
    diff: bool
    limit: str | None
    tags: str | None
    skip_tags: str | None
    extravars: dict[str, Any] | None
    verbosity: int
    on_event: Callable[[dict], None] | None
    quiet: bool
    # ansible-playbook parity (docs/cli.md "ansible-playbook's options")
    forks: int | None
    user: str | None
    private_key: str | None
    become_password: str | None  # answered at ansible's BECOME prompt (-K), never on disk
    become_password_file: str | None
    vault_ids: list[str]  # LABEL@FILE or FILE
    vault_password_files: list[str]
    vault_password: str | None  # answered at ansible's vault prompt (--ask-vault-pass)
    vault_id_passwords: dict[str, str]  # LABEL -> password, for --vault-id LABEL@prompt
    start_at_task: str | None
    flush_cache: bool
    list_hosts: bool
    list_tasks: bool
    list_tags: bool
    syntax_check: bool
    ansible_args: list[str]  # anything else for ansible-playbook (the CLI's `--`)
    break_lock: bool  # stop the run that holds the cluster lock and take it (changing verbs only)


_ANSIBLE_FIELDS = {
    "forks": "forks",
    "user": "user",
    "private_key": "private_key",
    "become_password_file": "become_password_file",
    "vault_ids": "vault_ids",
    "vault_password_files": "vault_password_files",
    "start_at_task": "start_at_task",
    "flush_cache": "flush_cache",
    "list_hosts": "list_hosts",
    "list_tasks": "list_tasks",
    "list_tags": "list_tags",
    "syntax_check": "syntax_check",
    "ansible_args": "extra",
}


def lock_request(
    verb: str, *, read_only: bool, check: bool, ansible: AnsibleOptions, break_lock: bool
) -> LockRequest | None:
    """The cluster lock a run needs: none when it changes nothing (a read-only verb, --check,
    a listing); else one, recorded as `verb`. `break_lock` where no lock is taken is a mistake."""
    passthrough_check = any(arg in ("--check", "-C") for arg in ansible.extra)
    why = (
        f"`{verb}` changes nothing"
        if read_only
        else "--check changes nothing"
        if check or passthrough_check
        else "a listing runs nothing"
        if ansible.listing
        else ""
    )
    if why:
        if break_lock:
            raise ValueError(f"--break-lock (break_lock): {why} and takes no cluster lock")
        return None
    return LockRequest(verb=verb, break_lock=break_lock)


def runner_kwargs(options: RunOptions, verb: str, read_only: bool = False) -> dict[str, Any]:
    """RunOptions -> run_playbook's keyword arguments (ansible's options and passwords grouped,
    the cluster lock the run needs)."""
    opts: dict[str, Any] = dict(options)
    break_lock = bool(opts.pop("break_lock", False))
    ansible = {dest: opts.pop(name) for name, dest in _ANSIBLE_FIELDS.items() if name in opts}
    for key in ("vault_ids", "vault_password_files", "extra"):
        if key in ansible:
            ansible[key] = list(ansible[key] or [])
    passwords = Passwords(
        become=opts.pop("become_password", None),
        vault=opts.pop("vault_password", None),
        vault_ids=dict(opts.pop("vault_id_passwords", None) or {}),
    )
    ansible_options = AnsibleOptions(**ansible)
    check = bool(opts.get("check"))
    lock = lock_request(
        verb, read_only=read_only, check=check, ansible=ansible_options, break_lock=break_lock
    )
    return {**opts, "ansible": ansible_options, "passwords": passwords, "lock": lock}


class Cluster:
    """A cluster as described by one or more inventories (layered in order, like repeated -i).

    Runs are silent by default (`quiet=True`); pass `quiet=False` for the CLI's live progress.
    """

    def __init__(
        self, inventory: str | Path | list[str | Path], project_dir: str | Path | None = None
    ) -> None:
        self.inventories: list[str | Path] = (
            [inventory] if isinstance(inventory, str | Path) else list(inventory)
        )
        if not self.inventories:
            raise ValueError("Cluster needs at least one inventory")
        self.project_dir = Path(project_dir) if project_dir is not None else None

    def __repr__(self) -> str:
        return f"Cluster({[str(i) for i in self.inventories]!r})"

    def run(self, playbook: str | Path, **options: Unpack[RunOptions]) -> RunResult:
        """Run any playbook (a path, or relative to the cwd or the project) against this cluster.
        It holds the cluster lock (it may change anything) unless `check` or a listing is asked."""
        return self._run(playbook, f"run {playbook}", False, options)

    def _run(self, playbook: str | Path, verb: str, read_only: bool, options: RunOptions) -> RunResult:
        opts = runner_kwargs({"quiet": True, **options}, verb, read_only)
        return run_playbook(playbook, self.inventories, project_dir=self.project_dir, **opts)

    def verb(self, name: str, **options: Unpack[RunOptions]) -> RunResult:
        """Run the playbook of a CLI verb by name ("up", "host-status", ...). Changing verbs hold
        the cluster lock; a held lock gives a result with status `locked` (exit code 75)."""
        return self._verb(name, name, options)

    def _verb(self, name: str, label: str, options: RunOptions) -> RunResult:
        if name not in PLAYBOOKS:
            raise ValueError(f"unknown verb {name!r}; known: {', '.join(PLAYBOOKS)}")
        project = find_project(self.project_dir)
        return self._run(project / PLAYBOOKS[name], label, label in READ_ONLY_VERBS, options)

    def up(self, **options: Unpack[RunOptions]) -> RunResult:
        """Provision the whole cluster (site.yml)."""
        return self.verb("up", **options)

    def preflight(self, **options: Unpack[RunOptions]) -> RunResult:
        """Validate inventory and nodes; changes nothing."""
        return self.verb("preflight", **options)

    def network(self, **options: Unpack[RunOptions]) -> RunResult:
        """Fabric links and SSH trust."""
        return self.verb("network", **options)

    def host(self, **options: Unpack[RunOptions]) -> RunResult:
        """Host tuning and earlyoom."""
        return self.verb("host", **options)

    def host_status(self, **options: Unpack[RunOptions]) -> RunResult:
        """Report host tuning; changes nothing."""
        return self.verb("host-status", **options)

    def reboot(self, force: bool = False, **options: Unpack[RunOptions]) -> RunResult:
        """Reboot the whole cluster together when a node needs it (or always, with force)."""
        extra: dict[str, Any] = {REBOOT_VAR: "allowed"}
        if force:
            extra[REBOOT_FORCE_VAR] = True
        return self._verb("reboot", "reboot --force" if force else "reboot", _with_vars(options, extra))

    def weights(self, **options: Unpack[RunOptions]) -> RunResult:
        """Download, verify and distribute the model weights."""
        return self.verb("weights", **options)

    def engine(self, **options: Unpack[RunOptions]) -> RunResult:
        """Build the engine image and ship it to the workers."""
        return self.verb("engine", **options)

    def start(self, **options: Unpack[RunOptions]) -> RunResult:
        """Start the engine ranks and wait for readiness."""
        return self.verb("start", **options)

    def stop(self, **options: Unpack[RunOptions]) -> RunResult:
        """Stop the engine."""
        return self.verb("stop", **options)

    def status(self, **options: Unpack[RunOptions]) -> RunResult:
        """Report every node and the engine; changes nothing."""
        return self.verb("status", **options)

    def verify(self, **options: Unpack[RunOptions]) -> RunResult:
        """Send real requests to the API."""
        return self.verb("verify", **options)

    def clocks_set(self, mhz: int, **options: Unpack[RunOptions]) -> RunResult:
        """Cap the GPU clocks at `mhz` MHz."""
        if isinstance(mhz, bool) or not isinstance(mhz, int) or mhz <= 0:
            raise ValueError(f"clock cap must be a positive number of MHz, got {mhz!r}")
        return self._verb("clocks", f"clocks set {mhz}", _with_vars(options, {CLOCKS_CAP_VAR: mhz}))

    def clocks_reset(self, **options: Unpack[RunOptions]) -> RunResult:
        """Remove the GPU clock cap (back to the default clocks)."""
        return self._verb("clocks", "clocks reset", _with_vars(options, {CLOCKS_CAP_VAR: 0}))

    def clocks_show(self, **options: Unpack[RunOptions]) -> RunResult:
        """Show the GPU clock state of every node; changes nothing."""
        tags = options.get("tags")
        return self._verb("clocks", "clocks show", {**options, "tags": f"show,{tags}" if tags else "show"})


def _with_vars(options: RunOptions, extra: dict[str, Any]) -> RunOptions:
    """The verb's own variable wins over a user `-e` of the same name."""
    return {**options, "extravars": {**(options.get("extravars") or {}), **extra}}  # type: ignore[typeddict-item]
