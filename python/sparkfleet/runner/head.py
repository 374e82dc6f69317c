"""How the controller reaches the head for the cluster lock, read from the inventory with
ansible's own inventory and variable code (group_vars, host_vars, templating, vault, `-e`), as
ansible-playbook would connect: ansible_host, ansible_port, ansible_user (else `-u`, else
ansible.cfg's remote_user), ansible_ssh_private_key_file (else `--private-key`),
ansible_ssh_common_args and ansible_ssh_extra_args, ansible.cfg's host key checking and timeout.
`ansible_connection: local` runs the holder as a local process (same code, no SSH).

Root is needed for the state directory: no sudo when the connection user is root, `sudo -n`
without a become password, `sudo -S` (the password on stdin, never in argv) with one.
"""

from __future__ import annotations

import getpass
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkfleet.ansible_inprocess import init_ansible
from sparkfleet.collection import CONSTANTS
from sparkfleet.runner.result import RunnerError

DEFAULT_STATE_DIR = CONSTANTS.STATE_DIR
HEAD_GROUP = "head"
_SSH_CONNECTIONS = {
    "ssh",
    "smart",
    "paramiko",
    "paramiko_ssh",
    "ansible.builtin.ssh",
    "ansible.builtin.paramiko_ssh",
}
_LOCAL_CONNECTIONS = {"local", "ansible.builtin.local"}


@dataclass
class HeadConnection:
    """The head as the lock needs it: where, as whom, and how to become root there."""

    name: str  # inventory name
    state_dir: str
    local: bool = False
    address: str = ""
    port: int | None = None
    user: str | None = None
    private_key: str | None = None
    ssh_args: list[str] = field(default_factory=list)  # common + extra args, host key checking
    connect_timeout: int = 30
    python: str = "python3"
    become_password: str | None = field(default=None, repr=False)

    @property
    def root(self) -> bool:
        return (self.user or getpass.getuser()) == "root" if not self.local else os.geteuid() == 0

    @property
    def lock_path(self) -> str:
        return f"{self.state_dir.rstrip('/')}/lock"

    def command(self, args: Sequence[str]) -> list[str]:
        """argv that runs `args` on the head, as root."""
        if self.root:
            remote = list(args)
        elif self.become_password is not None:
            remote = ["sudo", "-S", "-p", "", *args]
        else:
            remote = ["sudo", "-n", *args]
        if self.local:
            return remote
        ssh = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={self.connect_timeout}"]
        # The controller notices a dead link too (the holder notices through missing heartbeats).
        ssh += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        if self.port:
            ssh += ["-p", str(self.port)]
        if self.user:
            ssh += ["-l", self.user]
        if self.private_key:
            ssh += ["-i", self.private_key]
        return [*ssh, *self.ssh_args, "--", self.address, shlex.join(remote)]

    def describe(self) -> str:
        if self.local:
            return f"{self.name} (local)"
        who = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port else ""
        return f"{self.name} ({who}{self.address}{port})"


def _vault_secrets(
    loader: Any,
    vault_ids: Sequence[str],
    vault_password_files: Sequence[str],
    vault_password: str | None,
    vault_id_passwords: dict[str, str],
) -> list[tuple[str, Any]]:
    from ansible.parsing.vault import VaultSecret, get_file_vault_secret

    secrets: list[tuple[str, Any]] = []

    def from_file(label: str, path: str) -> None:
        secret = get_file_vault_secret(filename=str(Path(path).expanduser()), vault_id=label, loader=loader)
        secret.load()
        secrets.append((label, secret))

    for vault_id in vault_ids:
        label, sep, source = vault_id.partition("@")
        if sep:
            from_file(label or "default", source)
        else:
            from_file("default", vault_id)
    for path in vault_password_files:
        from_file("default", path)
    if vault_password is not None:
        secrets.append(("default", VaultSecret(vault_password.encode())))
    for label, password in vault_id_passwords.items():
        secrets.append((label, VaultSecret(password.encode())))
    return secrets


def head_connection(
    inventories: Sequence[str],
    project: Path,
    *,
    extravars: dict[str, Any] | None = None,
    user: str | None = None,
    private_key: str | None = None,
    become_password: str | None = None,
    become_password_file: str | None = None,
    vault_ids: Sequence[str] = (),
    vault_password_files: Sequence[str] = (),
    vault_password: str | None = None,
    vault_id_passwords: dict[str, str] | None = None,
) -> HeadConnection | None:
    """The head of the cluster in `inventories` (resolved paths, layered in order); None when
    the inventories have no `head` group at all (not a sparkfleet cluster: nothing to lock)."""
    init_ansible(project)  # the project's ansible.cfg and Ansible's loaders (as plan.py does)
    from ansible import constants as C

    vault = (vault_ids, vault_password_files, vault_password, dict(vault_id_passwords or {}))
    found = _head_vars(inventories, extravars or {}, vault)
    if found is None:
        return None
    name, v = found
    state_dir = str(v["sparkfleet_state_dir"] or DEFAULT_STATE_DIR)
    if not state_dir.startswith("/"):
        raise RunnerError(
            f"sparkfleet_state_dir={state_dir!r} on {name}: expected an absolute path "
            f"(default {DEFAULT_STATE_DIR})"
        )
    if become_password is None and become_password_file:
        become_password = _read_password_file(become_password_file)
    if become_password is None and isinstance(v["ansible_become_password"], str):
        become_password = v["ansible_become_password"]
    connection = str(v["ansible_connection"] or C.DEFAULT_TRANSPORT or "ssh")
    if connection in _LOCAL_CONNECTIONS:
        return HeadConnection(
            name=name, state_dir=state_dir, local=True, python=sys.executable, become_password=become_password
        )
    if connection not in _SSH_CONNECTIONS:
        raise RunnerError(
            f"ansible_connection={connection!r} on {name}: the cluster lock reaches the head by ssh "
            "(or `local`); no other connection is supported"
        )
    ssh_args = [
        *shlex.split(str(v["ansible_ssh_common_args"] or "")),
        *shlex.split(str(v["ansible_ssh_extra_args"] or "")),
    ]
    if not C.HOST_KEY_CHECKING:
        ssh_args += ["-o", "StrictHostKeyChecking=no"]
    interpreter = v["ansible_python_interpreter"]
    conn_user = v["ansible_user"] or user or C.DEFAULT_REMOTE_USER
    key = v["ansible_ssh_private_key_file"] or private_key
    port = v["ansible_port"]
    return HeadConnection(
        name=name,
        state_dir=state_dir,
        address=str(v["ansible_host"] or name),
        port=int(port) if port not in (None, "") else None,
        user=str(conn_user) if conn_user else None,
        private_key=str(Path(str(key)).expanduser()) if key else None,
        ssh_args=ssh_args,
        connect_timeout=int(C.DEFAULT_TIMEOUT or 30),
        python=str(interpreter)
        if isinstance(interpreter, str) and interpreter.startswith("/")
        else "python3",
        become_password=become_password,
    )


# What the lock reads of the head's variables: the name it is known by -> ansible's aliases.
_HEAD_VARS = {
    "ansible_connection": ("ansible_connection",),
    "sparkfleet_state_dir": ("sparkfleet_state_dir",),
    "ansible_become_password": ("ansible_become_password", "ansible_become_pass"),
    "ansible_python_interpreter": ("ansible_python_interpreter",),
    "ansible_host": ("ansible_host", "ansible_ssh_host"),
    "ansible_port": ("ansible_port", "ansible_ssh_port"),
    "ansible_user": ("ansible_user", "ansible_ssh_user"),
    "ansible_ssh_private_key_file": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "ansible_ssh_common_args": ("ansible_ssh_common_args",),
    "ansible_ssh_extra_args": ("ansible_ssh_extra_args",),
}
# A variable ansible itself would only need later, if at all: a template that cannot be resolved
# here (it may use facts) means "not known", not an error.
_OPTIONAL = {"ansible_python_interpreter"}


def _head_vars(
    inventories: Sequence[str], extravars: dict[str, Any], vault: tuple[Any, ...]
) -> tuple[str, dict[str, Any]] | None:
    """The head's name and its connection variables, templated; None without a `head` group."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    try:
        secrets = _vault_secrets(loader, *vault)
        if secrets:
            loader.set_vault_secrets(secrets)
        inventory = InventoryManager(loader=loader, sources=list(inventories))
        if HEAD_GROUP not in inventory.groups:
            return None
        heads = inventory.get_hosts(HEAD_GROUP)
        if len(heads) != 1:
            found = ", ".join(h.name for h in heads) or "none"
            raise RunnerError(
                f"the cluster lock lives on the head: group `{HEAD_GROUP}` of the inventory must hold "
                f"exactly one host (found: {found}); fix the inventory, or run read-only verbs only"
            )
        host = heads[0]
        host_vars = {**VariableManager(loader=loader, inventory=inventory).get_vars(host=host), **extravars}
        templar = Templar(loader=loader, variables=host_vars)
        values: dict[str, Any] = {}
        for key, names in _HEAD_VARS.items():
            raw = next((host_vars[n] for n in names if host_vars.get(n) is not None), None)
            try:
                values[key] = templar.template(trust_as_template(raw)) if isinstance(raw, str) else raw
            except AnsibleError:
                if key not in _OPTIONAL:
                    raise
                values[key] = None
    except AnsibleError as exc:
        raise RunnerError(f"cannot read the head's connection from the inventory: {exc.message}") from exc
    return host.name, values


def _read_password_file(path: str) -> str:
    """ansible-playbook's --become-password-file, read as ansible reads it (a script is run)."""
    from ansible.cli import CLI
    from ansible.errors import AnsibleError

    try:
        return CLI.get_password_from_file(str(Path(path).expanduser()))
    except AnsibleError as exc:
        raise RunnerError(f"become password file {path}: {exc.message}") from exc
