"""What never reaches the run's artifacts or logs: secret extravars, secret-named environment
variables, and the passwords ansible asks for (become, vault).

- Extravars whose name looks secret travel in a 0600 file in memory (`-e @file`), not in argv.
- Passwords (-K, --ask-vault-pass, --vault-id LABEL@prompt) are typed into ansible-playbook's own
  prompt by ansible-runner (pexpect): never in argv, the environment or a file.
- ansible-runner's record of the command and environment is scrubbed, and every file of the run
  is searched for the secret values at the end (a safety net for a task that printed one).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Extravars whose name matches are kept out of the artifacts. Broad on purpose: a false positive
# only means the variable travels in the in-memory file instead of the command line.
SECRET_NAME_RE = re.compile(r"token|key|passw|secret|credential|cred", re.IGNORECASE)
# Environment variables are matched on how secrets are conventionally named (HF_TOKEN,
# OPENAI_API_KEY, VAULT_PASSWORD), not ANSIBLE_HOST_KEY_CHECKING and the like.
SECRET_ENV_RE = re.compile(r"(TOKEN|PASSWORD|PASSWD|PASSPHRASE|SECRET|CREDENTIALS?|_KEY)$", re.IGNORECASE)
_NOT_SECRET_VALUES = {"true", "false", "yes", "no", "none", "null"}
REDACTED = "<redacted>"


# ansible-playbook's own prompts (ansible/cli/__init__.py), answered by ansible-runner.
BECOME_PROMPT = r"^BECOME password.*:\s*?$"
VAULT_PROMPT = r"^Vault password:\s*?$"  # --ask-vault-pass


def vault_id_prompt(label: str) -> str:
    """The prompt of `--vault-id LABEL@prompt`."""
    return rf"^Vault password \({re.escape(label)}\):\s*?$"


@dataclass
class Passwords:
    """Passwords a person typed (or the API was given), answered at ansible-playbook's prompts."""

    become: str | None = None  # -K / --ask-become-pass
    vault: str | None = None  # --ask-vault-pass
    vault_ids: dict[str, str] = field(default_factory=dict)  # --vault-id LABEL@prompt: label -> password

    def __bool__(self) -> bool:
        return self.become is not None or self.vault is not None or bool(self.vault_ids)

    def cmdline(self) -> list[str]:
        """The options that make ansible-playbook ask (the answers are not in them)."""
        args = ["--ask-become-pass"] if self.become is not None else []
        if self.vault is not None:
            args.append("--ask-vault-pass")
        for label in self.vault_ids:
            args += ["--vault-id", f"{label}@prompt"]
        return args

    def expect(self) -> dict[str, str]:
        """ansible-runner's `passwords`: prompt pattern -> answer."""
        out = {}
        if self.become is not None:
            out[BECOME_PROMPT] = self.become
        if self.vault is not None:
            out[VAULT_PROMPT] = self.vault
        for label, password in self.vault_ids.items():
            out[vault_id_prompt(label)] = password
        return out

    def values(self) -> list[str]:
        return [v for v in (self.become, self.vault, *self.vault_ids.values()) if v]


def split_secrets(extravars: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    public: dict[str, Any] = {}
    secret: dict[str, Any] = {}
    for key, value in (extravars or {}).items():
        (secret if SECRET_NAME_RE.search(str(key)) else public)[key] = value
    return public, secret


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _strings(v)
    elif value is not None and not isinstance(value, bool):
        yield str(value)


def secret_values(
    secret_vars: dict[str, Any], env: dict[str, str], extra: list[str] | None = None
) -> list[str]:
    """Every value to blank in the artifacts: secret extravars, secret-named environment
    variables, and `extra` (the passwords typed at ansible's prompts)."""
    values = set(_strings(secret_vars))
    values.update(v for k, v in env.items() if SECRET_ENV_RE.search(k))
    values.update(extra or [])
    # Very short or boolean-like values would redact unrelated text all over the artifacts.
    return sorted(
        (v for v in values if len(v) >= 6 and v.lower() not in _NOT_SECRET_VALUES), key=len, reverse=True
    )


def _memory_dir() -> str | None:
    for candidate in ("/dev/shm", os.environ.get("XDG_RUNTIME_DIR")):
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK):
            return candidate
    return None


@contextlib.contextmanager
def secret_vars_file(secret_vars: dict[str, Any]) -> Iterator[str | None]:
    """A 0600 JSON file in a 0700 dir in memory (/dev/shm) for `-e @file`, removed afterwards."""
    if not secret_vars:
        yield None
        return
    tmp = tempfile.mkdtemp(prefix="sparkfleet-secrets-", dir=_memory_dir())
    path = os.path.join(tmp, "extravars.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(secret_vars, fh)
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def scrub_command_file(artifacts: Path, values: list[str]) -> None:
    """ansible-runner records the full environment in artifacts/command; blank the secret ones."""
    path = artifacts / "command"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    env = data.get("env") or {}
    for key in env:
        if SECRET_ENV_RE.search(key):
            env[key] = REDACTED
    data["command"] = [_redact_text(str(arg), values) for arg in data.get("command") or []]
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def _redact_text(text: str, values: list[str]) -> str:
    for value in values:
        text = text.replace(value, REDACTED)
    return text


def redact_tree(root: Path, values: list[str]) -> None:
    """Safety net after the run: a secret value a task printed anyway is blanked in the artifacts."""
    if not values:
        return
    needles = []
    for value in values:
        needles.append((value.encode(), REDACTED.encode()))
        escaped = json.dumps(value)[1:-1].encode()
        if escaped != value.encode():
            needles.append((escaped, REDACTED.encode()))
    for path in root.rglob("*"):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        new = data
        for needle, repl in needles:
            new = new.replace(needle, repl)
        if new != data:
            path.write_bytes(new)
