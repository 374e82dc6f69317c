"""ansible-playbook parity: each option reaches ansible-playbook, passwords are typed into its own
prompts (never in argv, environment, files or logs), vault-encrypted group_vars decrypt, and the
listing modes print ansible's text."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from sparkfleet import cli
from sparkfleet.runner import AnsibleOptions, Passwords, RunnerError, run_playbook

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "tests" / "unit" / "playbooks"
LOCAL = PB / "inventory" / "local.yml"
VENV_BIN = Path(sys.executable).parent
MISSING = str(Path("/nonexistent/sparkfleet-test-file"))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.delenv("SPARKFLEET_PROJECT", raising=False)
    return dict(os.environ)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def command_of(result) -> list[str]:
    return json.loads((result.artifacts_dir / "command").read_text())["command"]


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


# ---- the options as argv ---------------------------------------------------------------------


def test_every_option_becomes_its_ansible_playbook_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = secret_file(tmp_path / "id_ed25519", "not a real key")
    become = secret_file(tmp_path / "become.txt", "pw")
    vault = secret_file(tmp_path / "vault.txt", "pw")
    monkeypatch.chdir(tmp_path)  # relative paths are the caller's, made absolute for ansible
    args = cli.build_parser().parse_args(
        [
            "up",
            "-i",
            "inv",
            "-f",
            "7",
            "-u",
            "admin",
            "--private-key",
            "id_ed25519",
            "--become-password-file",
            "become.txt",
            "--vault-id",
            "prod@vault.txt",
            "--vault-password-file",
            "vault.txt",
            "--start-at-task",
            "Download the missing files",
            "--flush-cache",
            "--list-tasks",
        ]
    )
    args.ansible_args = ["--force-handlers", "--timeout=30"]
    options = cli.ansible_options(args)
    assert options.cmdline() == [
        "--forks",
        "7",
        "--user",
        "admin",
        "--private-key",
        str(key),
        "--become-password-file",
        str(become),
        "--vault-id",
        f"prod@{vault}",
        "--vault-password-file",
        str(vault),
        "--start-at-task",
        "Download the missing files",
        "--flush-cache",
        "--list-tasks",
        "--force-handlers",
        "--timeout=30",
    ]
    assert options.listing


def test_short_and_long_spellings_are_the_same() -> None:
    parse = cli.build_parser().parse_args
    short = parse(["status", "-i", "x", "-f", "3", "-u", "u", "-K", "-J"])
    long = parse(
        ["status", "-i", "x", "--forks", "3", "--user", "u", "--ask-become-pass", "--ask-vault-pass"]
    )
    for name in ("forks", "user", "ask_become_pass", "ask_vault_pass"):
        assert getattr(short, name) == getattr(long, name)
    assert parse(["status", "-i", "x", "--key-file", "k"]).private_key == "k"
    spelled = parse(["status", "-i", "x", "--become-pass-file", "b"])
    assert spelled.become_password_file == "b"  # noqa: S105 - a file name, not a password


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (AnsibleOptions(private_key="/nonexistent/key"), "private key not found"),
        (AnsibleOptions(become_password_file=MISSING), "become password file not found"),
        (AnsibleOptions(vault_password_files=["/nonexistent/v"]), "vault password file not found"),
        (AnsibleOptions(vault_ids=["prod@prompt"]), "give its password to sparkfleet"),
        (AnsibleOptions(forks=0), "forks must be 1 or more"),
        (AnsibleOptions(extra=["-K"]), "use sparkfleet's own -K"),
        (AnsibleOptions(extra=["--ask-pass"]), "SSH passwords are not supported"),
        (AnsibleOptions(extra=["-e", "hf_token=x"]), "use sparkfleet's own -e"),
        (AnsibleOptions(extra=["--extra-vars=a=b"]), "use sparkfleet's own -e"),
        (AnsibleOptions(extra=["--vault-id", "x@prompt"]), "use sparkfleet's own --vault-id"),
        (AnsibleOptions(extra=["--step"]), "--step asks before every task"),
    ],
)
def test_options_that_cannot_work_are_refused_before_a_run(options: AnsibleOptions, message: str) -> None:
    with pytest.raises(RunnerError, match=message):
        options.cmdline()


def test_passwords_make_ansible_ask_and_hold_no_value_in_argv() -> None:
    pw = Passwords(become="b-secret", vault="v-secret", vault_ids={"prod": "p-secret"})
    argv = pw.cmdline()
    assert argv == ["--ask-become-pass", "--ask-vault-pass", "--vault-id", "prod@prompt"]
    assert not any("secret" in a for a in argv)
    assert sorted(pw.expect().values()) == ["b-secret", "p-secret", "v-secret"]


def test_usage_errors_for_the_new_options(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", "-i", "x", "-f", "0"]) == 64
    assert cli.main(["status", "-i", "x", "--list-hosts", "--json"]) == 64
    assert "--json cannot be combined with --list-hosts" in capsys.readouterr().err
    assert cli.main(["lab", "status", "--", "-v"]) == 64
    assert "runs no playbook" in capsys.readouterr().err


# ---- for real, through ansible-playbook -------------------------------------------------------


def test_options_reach_ansible_playbook(tmp_path: Path, env: dict[str, str]) -> None:
    vault = secret_file(tmp_path / "vault.txt", "vault-pw")
    events: list[dict] = []
    result = run_playbook(
        PB / "listing.yml",
        [LOCAL],
        project_dir=REPO,
        quiet=True,
        on_event=events.append,
        ansible=AnsibleOptions(
            forks=1,
            user=os.environ.get("USER", "root"),
            vault_password_files=[str(vault)],
            start_at_task="Middle task",
            flush_cache=True,
            extra=["--force-handlers"],
        ),
    )
    assert result.exit_code == 0, result.failures
    ran = [e["event_data"]["task"] for e in events if e["event"] == "runner_on_ok"]
    assert "Early task" not in ran and "Middle task" in ran and "Late task" in ran  # --start-at-task
    argv = command_of(result)
    flags = (
        "--forks",
        "--user",
        "--vault-password-file",
        "--start-at-task",
        "--flush-cache",
        "--force-handlers",
    )
    for flag in flags:
        assert flag in argv, flag


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--list-hosts", ["pattern: ['all']", "local1", "local2", "pattern: ['local1']"]),
        ("--list-tasks", ["Early task", "Middle task", "TAGS: [first, middle]", "Late task"]),
        ("--list-tags", ["TASK TAGS: [first, middle]", "TASK TAGS: [second]"]),
        ("--syntax-check", ["playbook: "]),
    ],
)
def test_listing_modes_print_ansibles_text(flag: str, expected: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sparkfleet", "run", str(PB / "listing.yml"), "-i", str(LOCAL), flag],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in expected:
        assert text in proc.stdout, (text, proc.stdout)
    assert "RECAP" not in proc.stdout  # nothing ran: no recap of nothing


def test_become_password_answered_at_ansibles_prompt(tmp_path: Path, env: dict[str, str]) -> None:
    typed = "Sudo-Pass-4242"
    result = run_playbook(
        PB / "become_password.yml",
        [LOCAL],
        extravars={"expected_sha": sha(typed)},
        project_dir=REPO,
        quiet=True,
        passwords=Passwords(become=typed),
    )
    assert result.exit_code == 0, result.failures
    assert "--ask-become-pass" in command_of(result)
    assert files_containing(result.artifacts_dir.parent, typed) == []


def test_become_password_file(tmp_path: Path, env: dict[str, str]) -> None:
    typed = "File-Pass-8181"
    result = run_playbook(
        PB / "become_password.yml",
        [LOCAL],
        extravars={"expected_sha": sha(typed)},
        project_dir=REPO,
        quiet=True,
        ansible=AnsibleOptions(become_password_file=str(secret_file(tmp_path / "pw", typed))),
    )
    assert result.exit_code == 0, result.failures
    assert files_containing(result.artifacts_dir.parent, typed) == []


def test_cli_dash_K_asks_at_the_terminal(tmp_path: Path, env: dict[str, str]) -> None:
    """As a person runs it: sparkfleet asks (no echo), ansible-runner answers ansible's prompt."""
    typed = "Typed-Pass-5151"
    child = pexpect.spawn(
        sys.executable,
        [
            "-m",
            "sparkfleet",
            "run",
            str(PB / "become_password.yml"),
            "-i",
            str(LOCAL),
            "-K",
            "-e",
            f"expected_sha={sha(typed)}",
        ],
        cwd=str(REPO),
        env=env,
        encoding="utf-8",
        timeout=120,
    )
    child.expect_exact("BECOME password: ")
    child.sendline(typed)
    child.expect(pexpect.EOF)
    child.close()
    out = child.before
    assert child.exitstatus == 0, out
    assert typed not in out  # not echoed
    assert "result: successful (exit 0)" in out
    artifacts = next(line for line in out.splitlines() if line.startswith("artifacts: "))
    run_dir = Path(artifacts.removeprefix("artifacts: ").strip()).parent
    assert files_containing(run_dir, typed) == []


def encrypt(path: Path, text: str, vault_password_file: Path, vault_id: str | None = None) -> None:
    path.write_text(text)
    label = vault_id or "default"
    subprocess.run(
        [
            str(VENV_BIN / "ansible-vault"),
            "encrypt",
            "--encrypt-vault-id",
            label,
            "--vault-id",
            f"{label}@{vault_password_file}",
            str(path),
        ],
        check=True,
        capture_output=True,
    )
    assert path.read_text().startswith("$ANSIBLE_VAULT;")


@pytest.fixture
def vault_inventory(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An inventory whose group_vars hold the HF token and an API key, vault-encrypted."""
    inv = tmp_path / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(LOCAL.read_text())
    secrets = {
        "model_weights_hf_token": "hf_VaultedToken_7e3a",
        "client_api_key": "sk-Vaulted-Key-19bd",
    }
    pw = secret_file(tmp_path / "vault-pw", "Vault-Pass-6060")
    encrypt(inv / "group_vars" / "all" / "secrets.yml", json.dumps(secrets), pw)
    return inv, secrets


def _vault_run(inv: Path, secrets: dict[str, str], **kw):
    return run_playbook(
        PB / "vault.yml",
        [inv],
        extravars={
            "expected_token_sha": sha(secrets["model_weights_hf_token"]),
            "expected_key_sha": sha(secrets["client_api_key"]),
        },
        project_dir=REPO,
        quiet=True,
        **kw,
    )


def test_vault_group_vars_with_a_password_file(tmp_path: Path, env: dict[str, str], vault_inventory) -> None:
    inv, secrets = vault_inventory
    options = AnsibleOptions(vault_password_files=[str(tmp_path / "vault-pw")])
    result = _vault_run(inv, secrets, ansible=options)
    assert result.exit_code == 0, result.failures
    for value in [*secrets.values(), "Vault-Pass-6060"]:
        assert files_containing(result.artifacts_dir.parent, value) == []
    # without the password ansible cannot read the inventory: exit 1, in plain words
    refused = _vault_run(inv, secrets)
    assert refused.exit_code == 1 and "vault" in refused.failures[0].msg.lower()


def test_vault_password_asked_and_vault_id_prompt(
    tmp_path: Path, env: dict[str, str], vault_inventory
) -> None:
    inv, secrets = vault_inventory
    asked = _vault_run(inv, secrets, passwords=Passwords(vault="Vault-Pass-6060"))
    assert asked.exit_code == 0, asked.failures
    assert "--ask-vault-pass" in command_of(asked)
    # a labelled vault: --vault-id prod@prompt, answered at "Vault password (prod): "
    prod_pw = secret_file(tmp_path / "prod-pw", "Prod-Pass-3030")
    encrypt(inv / "group_vars" / "all" / "secrets.yml", json.dumps(secrets), prod_pw, vault_id="prod")
    labelled = _vault_run(inv, secrets, passwords=Passwords(vault_ids={"prod": "Prod-Pass-3030"}))
    assert labelled.exit_code == 0, labelled.failures
    assert "prod@prompt" in command_of(labelled)
    for run in (asked, labelled):
        for value in [*secrets.values(), "Vault-Pass-6060", "Prod-Pass-3030"]:
            assert files_containing(run.artifacts_dir.parent, value) == []
