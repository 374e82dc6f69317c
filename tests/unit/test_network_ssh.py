"""ssh_trust filters: the names and addresses the head reaches each worker by; and the head's reach check
itself (its shell, rendered as the role writes it), run with doubles of ssh and runuser."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


ssh = _load("sparkfleet_ssh", ROOT / "plugins/filter/ssh.py")
plan_mod = _load("sparkfleet_plan", ROOT / "plugins/filter/plan.py")
D = yaml.safe_load((ROOT / "roles/cluster_plan/defaults/main.yml").read_text())


def tp3_plan() -> dict:
    hosts = {
        f"spark{i}": {
            "node": i,
            "mgmt_address": f"192.168.1.{10 + i}",
            "group": "head" if i == 1 else "workers",
        }
        for i in (1, 2, 3)
    }
    return plan_mod.cluster_plan(
        hosts,
        "tp3",
        D["cluster_plan_default_cabling"]["tp3"],
        D["cluster_plan_port_netdevs"],
        D["cluster_plan_subnet_template"],
    )


def test_names_are_the_worker_its_mgmt_address_and_its_fabric_addresses_toward_the_head():
    p = tp3_plan()
    assert ssh.ssh_names("spark2", p) == ["spark2", "192.168.1.12", "10.12.1.2", "10.12.2.2"]
    assert ssh.ssh_names("spark3", p) == ["spark3", "192.168.1.13", "10.13.1.3", "10.13.2.3"]
    assert ssh.ssh_names("spark3", p, fabric=False) == ["spark3", "192.168.1.13"]


def test_targets_leave_out_the_alias_names_and_sources_are_the_heads_addresses():
    p = tp3_plan()
    names = {w: ssh.ssh_names(w, p) for w in p["workers"]}
    targets = ssh.ssh_targets(names, p)
    assert ["spark2", "10.12.2.2"] in targets
    assert all(t[1] not in p["hosts_by_rank"] for t in targets)
    assert len(targets) == 6
    assert ssh.ssh_sources(p, "spark1", "spark3") == ["192.168.1.11", "10.13.1.1", "10.13.2.1"]


def test_any_changed_and_failure_text():
    hv = {"spark1": {"__k": {"changed": False}}, "spark2": {"__a": {"changed": True}}}
    assert ssh.any_changed(hv, ["spark1", "spark2"], ["__k", "__a"]) is True
    assert ssh.any_changed(hv, ["spark1"], ["__k", "__a"]) is False
    expected = [["spark2", "10.12.1.2"], ["spark2", "192.168.1.12"], ["spark2", "spark2"]]
    out = (
        "SSH spark2 10.12.1.2 rc=255 Host key verification failed.\n"
        "SSH spark2 192.168.1.12 rc=0 \n"
        "SSH spark2 spark2 rc=0 \n"
    )
    assert ssh.ssh_failures(out, expected) == ["spark2 at 10.12.1.2: Host key verification failed."]
    assert ssh.ssh_failures(out.replace("rc=255", "rc=0"), expected) == []
    assert ssh.ssh_failures(out.replace("rc=255", "rc=0").splitlines(), expected) == []  # stdout_lines
    assert ssh.ssh_failures("", expected[2:]) == ["spark2 (by name, ~/.ssh/config): no result"]


# The head's reach check (roles/ssh_trust/tasks/main.yml) run by bash with doubles of ssh and runuser on
# PATH, shaped on the real ones: OpenSSH exits 255 with its refusal as the last line on stderr ("Permission
# denied (publickey)."), `true`'s status otherwise; runuser takes `-u USER -- COMMAND...` and runs the
# command as USER (it refuses another shape, as util-linux's does with its usage).
SSH_DOUBLE = """#!/bin/bash
target=${@: -2:1}
printf '%s|%s\\n' "${SPARKFLEET_TEST_AS:-root}" "$*" >> "$SPARKFLEET_TEST_LOG"
for refused in $SPARKFLEET_TEST_REFUSE; do
  if [ "$target" = "$refused" ]; then
    echo "Warning: Permanently added '$target' (ED25519) to the list of known hosts." >&2
    echo "spark@$target: Permission denied (publickey)." >&2
    exit 255
  fi
done
exit 0
"""
RUNUSER_DOUBLE = """#!/bin/bash
if [ "$1" != -u ] || [ -z "$2" ] || [ "$3" != -- ]; then
  echo "runuser: unrecognized usage" >&2; exit 1
fi
user=$2; shift 3
SPARKFLEET_TEST_AS=$user exec "$@"
"""


def _reach_task() -> dict:
    main = yaml.safe_load((ROOT / "roles/ssh_trust/tasks/main.yml").read_text())
    block = next(t for t in main if t.get("name") == "Check that the head reaches every worker by key")
    return next(t for t in block["block"] if t["name"].startswith("Reach every worker from the head by key"))


def _run_reach(tmp_path: Path, manage_config: bool, refuse: list[str]) -> tuple[list[str], list[str]]:
    from ansible.template import Templar, trust_as_template

    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in (("ssh", SSH_DOUBLE), ("runuser", RUNUSER_DOUBLE)):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    p = tp3_plan()
    names = {w: ssh.ssh_names(w, p) for w in p["workers"]}
    task = _reach_task()
    variables = {
        "__ssh_trust_specs": " ".join(",".join(t) for t in ssh.ssh_targets(names, p)),
        "ssh_trust_ssh_args": "-i /home/spark/.ssh/k -o BatchMode=yes -l spark",
        "ssh_trust_connect_timeout_s": 5,
        "ssh_trust_manage_ssh_config": manage_config,
        "ssh_trust_user": "spark",
        "sparkfleet_plan": p,
    }
    cmd = Templar(loader=None, variables=variables).template(
        trust_as_template(task["ansible.builtin.shell"]["cmd"])
    )
    log = tmp_path / "calls.log"
    log.unlink(missing_ok=True)
    env = {
        "PATH": f"{bindir}:/usr/bin:/bin",
        "SPARKFLEET_TEST_LOG": str(log),
        "SPARKFLEET_TEST_REFUSE": " ".join(refuse),
    }
    out = subprocess.run(
        [task["ansible.builtin.shell"]["executable"], "-c", cmd],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    expected = ssh.ssh_targets(names, p) + ([[w, w] for w in p["workers"]] if manage_config else [])
    return ssh.ssh_failures(out.stdout.splitlines(), expected), log.read_text().splitlines()


def test_the_heads_reach_check_is_one_round_trip_by_address_as_root_and_by_name_as_the_user(tmp_path):
    failed, calls = _run_reach(tmp_path, manage_config=True, refuse=["10.12.2.2", "spark3"])
    assert failed == [
        "spark2 at 10.12.2.2: spark@10.12.2.2: Permission denied (publickey).",
        "spark3 (by name, ~/.ssh/config): spark@spark3: Permission denied (publickey).",
    ]
    # the checks by name start once those by address ended (no more connections at once than before)
    assert [c.split("|")[0] for c in calls] == ["root"] * 6 + ["spark"] * 2
    by_address = [c for c in calls if "-F /dev/null" in c]
    by_name = [c for c in calls if "-F /dev/null" not in c]
    assert len(by_address) == 6 and all(
        c.startswith("root|-F /dev/null -i /home/spark/.ssh/k ") for c in by_address
    )
    assert sorted(by_name) == [
        "spark|-o ConnectTimeout=5 spark2 true",
        "spark|-o ConnectTimeout=5 spark3 true",
    ]
    # without the managed ssh config there is no check by name, and every address answering is no failure
    failed, calls = _run_reach(tmp_path, manage_config=False, refuse=[])
    assert failed == [] and len(calls) == 6 and all(c.startswith("root|") for c in calls)
