"""What a fleet admin sees and types, against the real roles on a live lab: the `sparkfleet` command
as a subprocess (its plain output, as in a CI log, and on a terminal), the tables and --json data
of status / host-status / clocks, a sudo that asks for a password (-K and --become-password-file),
and the Hugging Face token from vault-encrypted group_vars.

`SPARKFLEET_LAB=<name> pytest tests/lab/test_cli.py` (a converged lab: site.yml). The tests that
change the cluster (weights deleted and fetched again, the engine stopped and started, an admin
account added and removed) leave it converged; they are `destructive` (ordered last).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pexpect
import pytest
from sparkfleet.runner import SCHEMA_FILE

SNAPSHOT = "/srv/sparkfleet/models/snapshot"
MANIFEST = "/srv/sparkfleet/models/.sparkfleet/manifest.json"
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
VENV_BIN = Path(sys.executable).parent
ADMIN = "sfadmin"  # an admin account whose sudo asks for a password (made and removed by a fixture)
ADMIN_PASSWORD = "Lab-Sudo-Pass-2718"  # noqa: S105 - the test account's, made and removed here


def sparkfleet(lab, *argv: str, extra_inventory: Path | None = None, timeout: float = 1800):
    """`sparkfleet VERB -i inventory/<topology> -i .lab/<name>/inventory ARGS` without a terminal."""
    inventories = [str(p) for p in lab.inventories] + ([str(extra_inventory)] if extra_inventory else [])
    verb, *rest = argv
    words = verb.split()
    cmd = [sys.executable, "-m", "sparkfleet", *words]
    for inv in inventories:
        cmd += ["-i", inv]
    return subprocess.run(
        cmd + rest,
        cwd=lab.project_dir,
        env={k: v for k, v in os.environ.items() if k != "HF_TOKEN"} | {"COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def task_lines(output: str, task: str) -> list[str]:
    """The lines printed while `task` ran (plain output: up to the next TASK or PLAY line)."""
    out, inside = [], False
    for line in output.splitlines():
        if re.match(r"^\[[^]]+\] (TASK|PLAY) ", line):
            inside = task in line
            continue
        if inside:
            out.append(line)
    return out


def manifest_files(lab, host: str) -> list[dict]:
    return json.loads(lab.exec(host, "cat", MANIFEST))["files"]


def biggest_shard(lab, host: str) -> dict:
    shards = [f for f in manifest_files(lab, host) if f["path"].endswith(".safetensors")]
    return max(shards, key=lambda f: f["size"])


def hub_settings(lab, **settings: object) -> None:
    path = lab.state_dir / "hub" / "hf" / "_settings.json"
    path.write_text(json.dumps(settings))


BYTES = r"\d+(\.\d)? [KMGT]?B"


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_weights_download_and_copy_show_bytes_rate_and_eta(lab) -> None:
    """The real model_weights role: a corrupt shard on the head is fetched again (download), a
    missing one on every worker is copied again (copy); both report bytes, rate and ETA as they go,
    the copy per worker, in the plain output of `sparkfleet weights`."""
    head, workers = lab.hosts[0], lab.hosts[1:]
    shard = biggest_shard(lab, head)
    path = f"{SNAPSHOT}/{shard['path']}"
    lab.exec(head, "python3", "-c", f"open({path!r}, 'r+b').write(b'garbage!')")
    for worker in workers:
        lab.exec(worker, "rm", "-f", path)
    # the hub sends at most 40 MB/s per response: the download takes a few seconds, several polls
    hub_settings(lab, throttle_bytes_per_s=40_000_000)
    try:
        proc = sparkfleet(lab, "weights", "-e", "model_weights_progress_interval=1")
    finally:
        hub_settings(lab)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    download = task_lines(out, "Wait for the download")
    meter = re.compile(
        rf"^  {head}: download: {BYTES} / {BYTES} \(\d+\.\d%\), {BYTES}/s, ETA \S+, files \d+/\d+"
    )
    assert [line for line in download if meter.match(line)], download
    assert any("(100.0%)" in line for line in download), download  # and where it ended
    copy = task_lines(out, "Wait for the copy")
    assert any(re.match(rf"^  {head}: copy: {BYTES} / {BYTES} \(", line) for line in copy), copy
    for worker in workers:  # per worker
        mine = [line for line in copy if line.startswith(f"  {head} → {worker}: copy ")]
        assert mine and all(re.search(rf"{BYTES} / {BYTES} \(\d+\.\d%\), {BYTES}/s", m) for m in mine), copy
    for host in lab.hosts:
        assert lab.exec(host, "sha256sum", path).split()[0] == shard["sha256"]


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_weights_progress_bars_on_a_terminal(lab) -> None:
    """The same run on a terminal: rich progress bars with the numbers, per worker."""
    head, workers = lab.hosts[0], lab.hosts[1:]
    path = f"{SNAPSHOT}/{biggest_shard(lab, head)['path']}"
    for worker in workers:
        lab.exec(worker, "rm", "-f", path)
    argv = ["-m", "sparkfleet", "weights", "-e", "model_weights_progress_interval=1"]
    for inv in lab.inventories:
        argv += ["-i", str(inv)]
    child = pexpect.spawn(
        sys.executable,
        argv,
        cwd=str(lab.project_dir),
        env=dict(os.environ, COLUMNS="160"),
        encoding="utf-8",
        timeout=1800,
        dimensions=(50, 160),
    )
    child.expect(pexpect.EOF)
    child.close()
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", child.before or "")
    assert child.exitstatus == 0, screen[-3000:]
    bars = [line for line in screen.splitlines() if "━" in line]
    for worker in workers:
        assert any(f"{head} → {worker}" in b and re.search(rf"copy {BYTES} / {BYTES}", b) for b in bars), bars


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_start_shows_the_engine_loading(lab) -> None:
    """The real engine_service role: after a stop, `sparkfleet start` reports each readiness probe."""
    stop = sparkfleet(lab, "stop")
    assert stop.returncode == 0, stop.stdout + stop.stderr
    proc = sparkfleet(lab, "start", "-e", "engine_service_ready_poll=1")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    waiting = [
        line
        for line in task_lines(out, "Wait until the API is ready")
        if line.startswith(f"  {lab.hosts[0]}: ")
    ]
    assert waiting, out
    # every probe that found the engine not ready yet is a line with its attempt count
    polls = [line for line in waiting if re.search(r"\(attempt \d+/\d+\)$", line)]
    assert polls, waiting
    assert "engine ready on" in out
    # start ends with the status read (playbooks/start.yml): the CLI draws its table
    table = out[out.index("ENGINE STATUS") :].splitlines()
    assert [line.split()[0] for line in table[3 : 3 + len(lab.hosts)]] == lab.hosts
    assert "engine: healthy" in table


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_reboot_shows_each_node_coming_back(lab) -> None:
    """`sparkfleet reboot --force` (a lab node's reboot is a container restart): every node's state
    during ansible's reboot wait, from sparkfleet.cluster.reboot."""
    proc = sparkfleet(lab, "reboot", "--force")
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    lines = task_lines(out, "Reboot every node at once")
    for host in lab.hosts:
        mine = [line for line in lines if line.startswith(f"  {host}: reboot: ")]
        assert any("reboot command sent" in line for line in mine), lines
        done = re.compile(r"waiting for the new boot: done after \d+ tr(y|ies) \(\d+")
        assert any(done.search(m) for m in mine), lines


@pytest.mark.any_topology  # the same on TP2 and TP3: the tp3 scenario runs it
def test_status_host_status_and_clocks_draw_tables_from_the_data(lab) -> None:
    status = sparkfleet(lab, "status")
    assert status.returncode == 0, status.stdout + status.stderr
    table = status.stdout[status.stdout.index("ENGINE STATUS") :].splitlines()
    assert table[1].split()[:3] == ["NODE", "RANK", "UNIT"]
    assert [line.split()[0] for line in table[3 : 3 + len(lab.hosts)]] == lab.hosts
    assert "engine: healthy" in table
    clocks = sparkfleet(lab, "clocks show")
    assert clocks.returncode == 0, clocks.stdout + clocks.stderr
    ctable = clocks.stdout[clocks.stdout.index("CLOCKS") :].splitlines()
    assert ctable[1].split()[:3] == ["NODE", "GPU", "CAP"] and len(ctable) >= 3 + len(lab.hosts)
    hstatus = sparkfleet(lab, "host-status")
    htable = hstatus.stdout[hstatus.stdout.index("HOST STATUS") :].splitlines()
    assert htable[1].split() == ["CHECK", *lab.hosts]
    assert hstatus.returncode == (2 if any("! " in line for line in htable) else 0), hstatus.stdout


@pytest.mark.any_topology  # the same on TP2 and TP3: the tp3 scenario runs it
def test_json_carries_the_roles_data(lab) -> None:
    for verb, key in (("status", "engine_status"), ("host-status", "host_status"), ("clocks show", "clocks")):
        proc = sparkfleet(lab, verb, "--json", "-q")
        doc = json.loads(proc.stdout)
        VALIDATOR.validate(doc)
        assert doc["schema_version"] == "1.2" and key in doc["data"], (verb, sorted(doc["data"]))
        if key != "engine_status":
            assert sorted(doc["data"][key]) == lab.hosts  # one entry per node
    weights = sparkfleet(lab, "weights", "--json", "-q")
    doc = json.loads(weights.stdout)
    VALIDATOR.validate(doc)
    pins = doc["data"]["pins"]["weights"]
    assert pins and all(len(p["commit"]) == 40 and p["commit"].startswith(p["revision"]) for p in pins)


# ---- an admin account whose sudo asks for a password ---------------------------------------------


@pytest.fixture
def admin_inventory(lab, tmp_path: Path):
    """ADMIN on every node: the lab's SSH key, sudo with a password; an inventory layer that logs in
    as ADMIN. Removed again afterwards."""
    setup = (
        f"id {ADMIN} >/dev/null 2>&1 || useradd -m -s /bin/bash {ADMIN}; "
        f"echo '{ADMIN}:{ADMIN_PASSWORD}' | chpasswd; "
        f"echo '{ADMIN} ALL=(ALL:ALL) ALL' > /etc/sudoers.d/90-{ADMIN}; "
        f"chmod 0440 /etc/sudoers.d/90-{ADMIN}; "
        f"install -d -m 0700 -o {ADMIN} -g {ADMIN} /home/{ADMIN}/.ssh; "
        f"install -m 0600 -o {ADMIN} -g {ADMIN} /home/spark/.ssh/authorized_keys "
        f"/home/{ADMIN}/.ssh/authorized_keys"
    )
    for host in lab.hosts:
        lab.exec(host, "sh", "-c", setup)
    layer = tmp_path / "admin"
    (layer / "group_vars" / "all").mkdir(parents=True)
    (layer / "hosts.yml").write_text(cluster_hosts(lab))
    (layer / "group_vars" / "all" / "admin.yml").write_text(f"ansible_user: {ADMIN}\n")
    yield layer
    for host in lab.hosts:
        lab.exec(
            host,
            "sh",
            "-c",
            f"rm -f /etc/sudoers.d/90-{ADMIN}; userdel -r {ADMIN} 2>/dev/null || true",
            check=False,
        )


def cluster_hosts(lab) -> str:
    """An inventory layer's hosts.yml: the lab's nodes in group cluster (its group_vars then apply)."""
    return "all:\n  children:\n    cluster:\n      hosts:\n" + "".join(f"        {h}:\n" for h in lab.hosts)


def files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def run_dir_of(output: str) -> Path:
    line = next(line for line in output.splitlines() if line.startswith("artifacts: "))
    return Path(line.removeprefix("artifacts: ").strip()).parent


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_become_with_a_password(lab, admin_inventory: Path, tmp_path: Path) -> None:
    # sudo asks: without a password every become task fails
    refused = sparkfleet(lab, "host-status", extra_inventory=admin_inventory)
    assert refused.returncode in (2, 4), refused.stdout
    assert re.search(r"(?i)password", refused.stdout), refused.stdout
    # -K: typed at sparkfleet's prompt (as a person does), answered at ansible's; host tuning runs
    # with every become task and changes nothing on the converged nodes
    argv = ["-m", "sparkfleet", "host", "-K"]
    for inv in [*lab.inventories, admin_inventory]:
        argv += ["-i", str(inv)]
    child = pexpect.spawn(sys.executable, argv, cwd=str(lab.project_dir), encoding="utf-8", timeout=1800)
    child.expect_exact("BECOME password: ")
    child.sendline(ADMIN_PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    out = child.before or ""
    assert child.exitstatus == 0, out[-3000:]
    assert ADMIN_PASSWORD not in out
    recap = out[out.index("RECAP") :].splitlines()
    for host in lab.hosts:
        row = next(line for line in recap if line.startswith(f"{host} ")).split()
        assert row[2] == "0", row  # changed: nothing (converged), yet every become task ran
    assert files_containing(run_dir_of(out), ADMIN_PASSWORD) == []
    # --become-password-file: the read-only reports, as the admin account
    pw = tmp_path / "sudo-pass"
    pw.write_text(ADMIN_PASSWORD + "\n")
    pw.chmod(0o600)
    for verb in ("host-status", "clocks show"):
        proc = sparkfleet(lab, verb, "--become-password-file", str(pw), extra_inventory=admin_inventory)
        table = "HOST STATUS" if verb == "host-status" else "CLOCKS"
        assert proc.returncode in (0, 2) and table in proc.stdout, proc.stdout
        assert "Missing sudo password" not in proc.stdout and "incorrect sudo password" not in proc.stdout
        assert files_containing(run_dir_of(proc.stdout), ADMIN_PASSWORD) == []


# ---- the Hugging Face token from vault-encrypted group_vars ----------------------------------------


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_hf_token_from_vault_encrypted_group_vars(lab, tmp_path: Path) -> None:
    """The hub makes the model repo private: the weights role needs the token, which only a
    vault-encrypted group_vars file holds."""
    token = "hf_LabVaultToken_" + hashlib.sha256(tmp_path.name.encode()).hexdigest()[:12]
    pins = json.loads((lab.state_dir / "state.json").read_text()).get("pins", {})
    repo = pins["model"]["repo"]
    layer = tmp_path / "vaulted"
    (layer / "group_vars" / "all").mkdir(parents=True)
    (layer / "hosts.yml").write_text(cluster_hosts(lab))
    secrets = layer / "group_vars" / "all" / "secrets.yml"
    secrets.write_text(f"model_weights_hf_token: {token}\n")
    pw = tmp_path / "vault-pass"
    pw.write_text("Lab-Vault-Pass-1618\n")
    subprocess.run(
        [str(VENV_BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(pw), str(secrets)],
        check=True,
        capture_output=True,
    )
    hub_settings(lab, private=[repo], tokens=[token])
    try:
        # no vault password: the inventory cannot be read, said before any node is contacted
        without = sparkfleet(lab, "weights", extra_inventory=layer)
        told = without.stdout + without.stderr
        assert without.returncode == 1 and "A vault password must be specified to decrypt data" in told, told
        assert "artifacts: " not in told  # no playbook ran
        ok = sparkfleet(lab, "weights", "--vault-password-file", str(pw), extra_inventory=layer)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert token not in ok.stdout and files_containing(run_dir_of(ok.stdout), token) == []
        # and the repo really is private: without the token the hub refuses it
        plain = sparkfleet(lab, "weights")
        assert plain.returncode == 2 and re.search(r"(?i)401|gated|token", plain.stdout), plain.stdout
    finally:
        hub_settings(lab)
