"""set_stats data: from a playbook through ansible-runner's artifact_data into RunResult.data, the
--json document (validated against the schema) and the tables `status`, `host-status` and `clocks`
draw from it. The data shapes are those the roles report (roles/*/tasks: set_stats)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from sparkfleet import cli, tables
from sparkfleet.api import PLAYBOOKS, Cluster
from sparkfleet.runner import SCHEMA_FILE

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))

NA = {"check": "cmdline", "value": "-", "expected": "kho=off", "status": "n/a", "fix": "no kernel of its own"}
CHECKS = {
    "local1": [
        NA,
        {"check": "THP", "value": "never", "expected": "never", "status": "ok", "fix": ""},
        {"check": "swap", "value": "0 MiB", "expected": "16384 MiB", "status": "off", "fix": "run host"},
    ],
    "local2": [
        NA,
        {"check": "THP", "value": "never", "expected": "never", "status": "ok", "fix": ""},
        {"check": "swap", "value": "16384 MiB", "expected": "16384 MiB", "status": "ok", "fix": ""},
    ],
}

# host-status as a project playbook: each host reports its part, as roles/host_tuning/tasks/status.yml
HOST_STATUS_PLAY = """---
- name: Host status
  hosts: all
  gather_facts: false
  tasks:
    - name: Report the host (text)
      ansible.builtin.debug:
        msg: "TEXT REPORT of {{{{ inventory_hostname }}}}"
      when: not (sparkfleet_cli_tables | default(false) | bool)
    - name: Record the host status for machines
      ansible.builtin.set_stats:
        data:
          host_status: >-
            {{{{ {{inventory_hostname: {{'checks': checks[inventory_hostname],
                 'off': checks[inventory_hostname] | selectattr('status', 'eq', 'off')
                        | map(attribute='check') | list,
                 'reboot_reasons': []}}}} }}}}
        per_host: false
      vars:
        checks: {checks}
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "project"
    (root / "playbooks").mkdir(parents=True)
    (root / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = false\n")
    for playbook in PLAYBOOKS.values():
        (root / playbook).write_text("- name: Nothing\n  hosts: all\n  gather_facts: false\n  tasks: []\n")
    (root / PLAYBOOKS["host-status"]).write_text(HOST_STATUS_PLAY.format(checks=json.dumps(CHECKS)))
    (root / "local.yml").write_text(
        "all:\n  hosts:\n    local1:\n    local2:\n  vars:\n    ansible_connection: local\n"
        '    ansible_python_interpreter: "{{ ansible_playbook_python }}"\n'
    )
    monkeypatch.setenv("SPARKFLEET_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("SPARKFLEET_PROJECT", str(root))
    return root


def test_set_stats_data_reaches_the_api_and_json(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = Cluster(str(project / "local.yml")).host_status()
    assert result.exit_code == 0, result.failures
    assert set(result.data["host_status"]) == {"local1", "local2"}  # every host's part, merged
    assert result.data["host_status"]["local1"]["off"] == ["swap"]
    assert cli.main(["host-status", "-i", str(project / "local.yml"), "--json", "-q"]) == 0
    doc = json.loads(capsys.readouterr().out)
    VALIDATOR.validate(doc)
    assert doc["schema_version"] == "1.2" and doc["data"] == result.data
    # --json leaves the roles' own text on (it goes to stderr with the progress)


def test_the_cli_draws_the_table_and_mutes_the_roles_text(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["host-status", "-i", str(project / "local.yml")]) == 0
    out = capsys.readouterr().out
    assert "TEXT REPORT" not in out  # sparkfleet_cli_tables=true: the role left its text out
    table = out[out.index("HOST STATUS") :].splitlines()
    assert table[1].split() == ["CHECK", "local1", "local2"]
    assert table[3].split() == ["cmdline", "n/a", "n/a"]
    assert table[4].split() == ["THP", "ok", "ok"] and table[5].split() == ["swap", "OFF", "ok"]
    assert "n/a cmdline on local1, local2: no kernel of its own" in table
    assert "! local1: swap: 0 MiB (expected 16384 MiB; run host)" in table
    assert "checks off on: local1" in table
    # `run` draws no table: the playbook's own text stays
    assert cli.main(["run", str(project / PLAYBOOKS["host-status"]), "-i", str(project / "local.yml")]) == 0
    assert "TEXT REPORT of local1" in capsys.readouterr().out


ENGINE = {
    "rows": [
        {"node": "spark1", "rank": 0, "unit": "active/running", "container": "running", "api": "ok"},
        {"node": "spark2", "rank": 1, "unit": "active/running", "container": "exited (137)", "api": ""},
    ],
    "notes": ["spark2 (rank 1): container exited (137) OOM-killed, unit active/running"],
    "healthy": False,
}
CLOCKS = {
    "spark1": {
        "gpu_cap_mhz": 2300,
        "gpu_applied_mhz": 2300,
        "gpu_in_effect": True,
        "latched": False,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GB10",
                "sm_mhz": 2281,
                "max_sm_mhz": 3003,
                "activity": "busy",
                "latched": False,
            }
        ],
        "cpu_cap_mhz": 0,
        "cpu_skipped": None,
        "wanted_gpu_cap_mhz": 2300,
    },
    "spark2": {
        "gpu_cap_mhz": None,
        "gpu_applied_mhz": None,
        "gpu_in_effect": False,
        "latched": True,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GB10",
                "sm_mhz": 800,
                "max_sm_mhz": 3003,
                "activity": "busy",
                "latched": True,
            }
        ],
        "cpu_cap_mhz": None,
        "cpu_skipped": "no cpufreq",
        "wanted_gpu_cap_mhz": 2300,
    },
    # never capped, stock wanted, idle at a low clock: all as it should be
    "spark3": {
        "gpu_cap_mhz": None,
        "gpu_applied_mhz": None,
        "gpu_in_effect": True,
        "latched": False,
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GB10",
                "sm_mhz": 345,
                "max_sm_mhz": 3003,
                "activity": "idle",
                "latched": False,
            }
        ],
        "gpu_error": None,
        "cpu_cap_mhz": None,
        "cpu_skipped": None,
        "wanted_gpu_cap_mhz": 0,
    },
    # no nvidia-smi on the node: said, not a crash
    "spark4": {
        "gpu_cap_mhz": 0,
        "gpu_applied_mhz": 0,
        "gpu_in_effect": True,
        "latched": False,
        "gpus": [],
        "gpu_error": "nvidia-smi not found: is the NVIDIA driver installed on this node?",
        "cpu_cap_mhz": 0,
        "cpu_skipped": None,
        "wanted_gpu_cap_mhz": 0,
    },
}


def test_engine_status_table() -> None:
    lines = tables.engine_status_table({"engine_status": ENGINE}).splitlines()
    assert lines[1].split() == ["NODE", "RANK", "UNIT", "CONTAINER", "API", "HEALTH"]
    assert lines[3].split()[:4] == ["spark1", "0", "active/running", "running"]
    assert lines[4].endswith("-") and "exited (137)" in lines[4]  # an empty cell shows as '-'
    assert lines[-2] == "! spark2 (rank 1): container exited (137) OOM-killed, unit active/running"
    assert lines[-1] == "engine: NOT healthy"
    assert tables.engine_status_table({}) == ""  # no data (the run stopped before): no table


def test_start_ends_with_the_status_table(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """playbooks/start.yml ends with the status read (engine_status): `sparkfleet start` draws its table."""
    (project / PLAYBOOKS["start"]).write_text(
        "- name: Start\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Status\n      ansible.builtin.set_stats:\n        data:\n"
        f"          engine_status: {json.dumps(ENGINE)}\n        per_host: false\n      run_once: true\n"
    )
    assert cli.main(["start", "-i", str(project / "local.yml")]) == 0
    table = tables.engine_status_table({"engine_status": ENGINE})
    assert table and table in capsys.readouterr().out


def test_clocks_table() -> None:
    lines = tables.clocks_table({"clocks": CLOCKS}).splitlines()
    assert lines[1].split()[:3] == ["NODE", "GPU", "CAP"]
    assert lines[3].startswith("spark1") and "2300 MHz" in lines[3] and "2281/3003 busy" in lines[3]
    assert "not set" in lines[4] and "YES" in lines[4] and "not set (not applied)" in lines[4]
    assert "! spark2: CPU cap not applied: no cpufreq" in lines
    assert "! spark2: the inventory wants GPU cap 2300 MHz: run `sparkfleet clocks set 2300`" in lines
    assert (
        "! spark2: GPU 0 is latched: SM clock 800 MHz under load; only an AC power cycle clears it "
        "(shut down, unplug for 30 s)"
    ) in lines
    spark3 = lines[5].split()
    assert spark3[:3] == ["spark3", "not", "set"] and "345/3003" in spark3 and "idle" in spark3
    assert spark3[spark3.index("idle") + 1] == "no"  # idle at 345 MHz: not latched
    assert "yes" in spark3  # stock wanted and never capped: in effect
    assert not [line for line in lines if "spark3" in line and line.startswith("!")]  # nothing to fix
    assert lines[6].startswith("spark4") and "stock" in lines[6]
    assert (
        "! spark4: GPU clocks not read: nvidia-smi not found: is the NVIDIA driver installed on this node?"
        in lines
    )
    assert not [line for line in lines if "latched" in line and "spark2" not in line]


def test_documents_with_every_kind_of_data_are_valid() -> None:
    doc = {
        "schema": "sparkfleet.run-result",
        "schema_version": "1.2",
        "playbook": "/p/site.yml",
        "inventories": ["/p/inv"],
        "check": False,
        "status": "successful",
        "exit_code": 0,
        "rc": 0,
        "started": "2026-12-02T19:51:39+00:00",
        "elapsed": 1.0,
        "artifacts_dir": "/p/a",
        "hosts": {},
        "failures": [],
        "slowest_tasks": [],
        "data": {
            "engine_status": ENGINE,
            "clocks": CLOCKS,
            "host_status": {h: {"checks": c, "off": [], "reboot_reasons": []} for h, c in CHECKS.items()},
            "verify": {
                "url": "http://127.0.0.1:8888/v1",
                "model": "m",
                "checks": [
                    {"name": "c", "label": "c", "ok": True, "latency_ms": 1.0, "result": "3", "detail": ""}
                ],
                "passed": 1,
                "failed_checks": [],
            },
            "pins": {"weights": [{"name": "m", "repo": "o/r", "revision": "afc7aa0a", "commit": "a" * 40}]},
            "reboot_required_on": "spark1",
        },
        "lock": None,
    }
    VALIDATOR.validate(doc)
    doc["data"]["undocumented"] = 1
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(doc)
