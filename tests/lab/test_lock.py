"""The cluster lock on a live lab, over SSH and sudo as on real Sparks: two changing runs at once
(the second refuses at once, naming the first), and once the first has ended a run takes the lock.

`SPARKFLEET_LAB=<name> pytest tests/lab/test_lock.py`. The same on TP2 and TP3 (`any_topology`: the
tp3 scenario runs it). It changes nothing on the cluster: the first run waits for a file, the
other runs set the inventory's own GPU clock cap (or are refused before anything runs).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import jsonschema
import pytest
import yaml
from lab_cli import command, sparkfleet
from sparkfleet.runner import SCHEMA_FILE

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
HOLD = "tests/lab/playbooks/hold.yml"
EXIT_LOCKED = 75


def state_dir(lab) -> str:
    cluster = yaml.safe_load(
        (lab.project_dir / "inventory" / lab.topology / "group_vars/all/cluster.yml").read_text()
    )
    return cluster["sparkfleet_state_dir"]


def inventory_cap(lab) -> int:
    clocks = yaml.safe_load(
        (lab.project_dir / "inventory" / lab.topology / "group_vars/all/clocks.yml").read_text()
    )
    return int(clocks["gpu_clocks_cap_mhz"])


@pytest.mark.any_topology
def test_two_changing_runs_at_once_the_second_refuses(lab, node, tmp_path: Path) -> None:
    head = node(lab.hosts[0])
    record_file = f"{state_dir(lab)}/lock.json"
    gate = f"/tmp/sparkfleet-lock-gate-{uuid.uuid4().hex[:8]}"
    cap = inventory_cap(lab)
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        command(lab, "run", HOLD, "-e", f"gate={gate}"),
        cwd=lab.project_dir,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        record = None
        while record is None and time.monotonic() < deadline and first.poll() is None:
            out = head.run(f"sudo cat {record_file}")
            record = json.loads(out.stdout) if out.rc == 0 and out.stdout.strip() else None
            if record is None:
                time.sleep(0.5)
        assert record is not None, (tmp_path / "first.log").read_text()[-3000:]
        assert record["pid"] == first.pid and record["verb"] == f"run {HOLD}"
        assert record["head_hostname"] and head.run(f"sudo test -d /proc/{record['holder_pid']}").rc == 0

        # The second changing run refuses at once, naming the first, and runs nothing.
        started = time.monotonic()
        second = sparkfleet(lab, "clocks set", str(cap))
        assert second.returncode == EXIT_LOCKED, second.stdout + second.stderr
        assert time.monotonic() - started < 60
        who = f"{record['user']}@{record['controller']} (pid {first.pid}, `sparkfleet run {HOLD}`"
        assert (
            f"LOCKED  the cluster lock on {lab.hosts[0]} ({record_file[:-5]}) is held by {who}"
            in second.stdout
        )
        assert "--break-lock" in second.stdout and "result: locked (exit 75)" in second.stdout
        as_json = sparkfleet(lab, "clocks set", str(cap), "--json", "-q")
        doc = json.loads(as_json.stdout)
        VALIDATOR.validate(doc)
        assert as_json.returncode == EXIT_LOCKED and doc["status"] == "locked" and doc["hosts"] == {}
        assert doc["lock"]["outcome"] == "refused" and doc["lock"]["holder"]["run_id"] == record["run_id"]
        # The first run goes on untouched.
        assert first.poll() is None and json.loads(head.run(f"sudo cat {record_file}").stdout) == record
    finally:
        head.run(f"touch {gate}")
        try:
            first.wait(timeout=120)
        finally:
            if first.poll() is None:
                first.kill()
            log.close()
    assert first.returncode == 0, (tmp_path / "first.log").read_text()[-3000:]
    # Let go at the end: no record, no holder; the next changing run takes the lock.
    assert head.run(f"sudo test -e {record_file}").rc == 1
    assert head.run(f"sudo test -d /proc/{record['holder_pid']}").rc == 1
    head.run(f"rm -f {gate}")
    third = sparkfleet(lab, "clocks set", str(cap), "--json", "-q")
    doc = json.loads(third.stdout)
    assert third.returncode == 0, doc["failures"]
    assert doc["lock"]["outcome"] == "taken" and doc["lock"]["head"] == lab.hosts[0]
    assert head.run(f"sudo test -e {record_file}").rc == 1
