"""Phase gates on a converged lab (docs/design.md "Phase gates"): a re-run of site.yml skips the phases whose
inputs and state are unchanged, yet a node changed behind sparkfleet's back is found and fixed by the next
run, and a second run restarts no container. Cheap for CI: two site.yml runs in all (one no-op, one with every
kind of drift made at once on different nodes), and three of playbooks/weights.yml (model_weights'
cluster-wide gate: a no-op, a worker's shard removed, an option changed). See tests/lab/conftest.py for the
fixtures."""

from __future__ import annotations

import json

import pytest
from lab_events import Events

ENGINE_LABEL = "label=io.sparkfleet.engine.managed=true"


class Changed:
    """The tasks each host reported as changed in a run: changes[host] -> [task names]."""

    def __init__(self) -> None:
        self.by_host: dict[str, list[str]] = {}
        self.surveyed: dict[str, set[str]] = {}  # host -> the roles whose gate took preflight's survey

    def __call__(self, event: dict) -> None:
        data = event.get("event_data") or {}
        res = data.get("res") or {}
        if event.get("event") == "runner_on_ok" and res.get("changed"):
            self.by_host.setdefault(data["host"], []).append(data.get("task", ""))
        if event.get("event") == "runner_on_ok" and res.get("surveyed") is True:
            self.surveyed.setdefault(data["host"], set()).add(data.get("role", ""))


def engine_started(lab) -> dict[str, dict[str, str]]:
    """host -> {container id: StartedAt} of the engine's containers."""
    out = {}
    for host in lab.hosts:
        ids = lab.exec(host, "docker", "ps", "-q", "--filter", ENGINE_LABEL, check=False).split()
        if not ids:
            out[host] = {}
            continue
        data = json.loads(lab.exec(host, "docker", "inspect", *ids))
        out[host] = {c["Id"]: c["State"]["StartedAt"] for c in data}
    return out


def reach(lab, head: str, worker: str, user: str) -> str:
    """`ssh <worker> true` on the head as the user, through its ssh config (the managed block): "rc=<rc>"."""
    cmd = f"ssh -o ConnectTimeout=3 {worker} true </dev/null >/dev/null 2>&1; echo rc=$?"
    return lab.exec(head, "sh", "-c", cmd, user=user).strip()


def phase_record(lab, host: str, role: str) -> dict | None:
    text = lab.exec(host, "cat", f"/var/lib/sparkfleet/phases/{role}.json", check=False)
    return json.loads(text) if text.strip() else None


@pytest.mark.tp2_faults  # the same on either topology: tp2 runs it (tp3's lane is CI's longest)
def test_a_second_up_changes_nothing_and_restarts_no_container(lab, play):
    before = engine_started(lab)
    assert any(before.values()), (
        f"no engine container runs on {lab.name}: converge it first (sparkfleet lab up)"
    )
    changed = Changed()
    result = play("site.yml", on_event=changed)
    assert result.exit_code == 0, result.failures
    assert changed.by_host == {}, changed.by_host
    assert engine_started(lab) == before  # the same containers, not one restarted
    for host in lab.hosts:  # the gated phases were recorded by the converge, and found clean now
        assert phase_record(lab, host, "earlyoom") is not None, host
        assert phase_record(lab, host, "host_tuning") is not None, host
        assert phase_record(lab, host, "ssh_trust") is not None, host
        assert phase_record(lab, host, "model_weights") is not None, host
        assert phase_record(lab, host, "network_links") is not None, host
    # and every gate took preflight layer 2's read of its record (and ssh_trust's its user's passwd entry)
    # instead of a round trip of its own (plugins/action/phase_state.py)
    gated = {"earlyoom", "host_tuning", "model_weights", "network_links", "ssh_trust"}
    assert changed.surveyed == dict.fromkeys(lab.hosts, gated), changed.surveyed


@pytest.mark.destructive
@pytest.mark.tp2_faults  # the same on either topology: tp2 runs it (tp3's lane is CI's longest)
def test_drift_behind_our_back_is_found_and_fixed_by_the_next_up(lab, play):
    """Three kinds of drift, each on its own node, all fixed by one site.yml run and reported as changed: a
    managed file edited (earlyoom's settings), a unit stopped (earlyoom), a sysctl reset (the drop-in's
    vm.swappiness back to the kernel's 60: a lab node's /proc/sys/vm is the host's and read-only, so the live
    half is the module's unit test, tests/unit/test_phase_state.py). And ssh_trust's trust broken at both
    ends: the managed block of the head's ssh config pointed elsewhere, the head's key taken out of a
    worker's authorized_keys; ssh_trust's gate sees its files changed and applies in full. And network_links'
    netplan file edited on a node: its gate sees the file changed and writes it again. And engine_service's
    files, which its start writes only when its read of the node finds one changed (files_pending): a worker's
    container helper given another mode, the head's watch environment edited."""
    edited, stopped, reset = lab.hosts[0], lab.hosts[1], lab.hosts[-1]  # TP2: the last two on one node
    # ssh_trust's files, as its records list them (the head's record has its ssh config, a worker's its
    # authorized_keys)
    head, worker = lab.hosts[0], lab.hosts[1]
    config = next(f for f in phase_record(lab, head, "ssh_trust")["files"] if f.endswith("/.ssh/config"))
    keys = next(f for f in phase_record(lab, worker, "ssh_trust")["files"] if f.endswith("/authorized_keys"))
    user = lab.exec(head, "stat", "-c", "%U", config).strip()
    ssh_config, authorized = lab.exec(head, "cat", config), lab.exec(worker, "cat", keys)
    assert f"Host {worker}\n  HostName " in ssh_config and f"sparkfleet {head} -> workers" in authorized
    lab.exec(head, "sed", "-i", f"/^Host {worker}$/{{n;s/HostName .*/HostName 192.0.2.1/}}", config)
    lab.exec(worker, "sed", "-i", f"/sparkfleet {head} -> workers/d", keys)
    assert reach(lab, head, worker, user) != "rc=0"
    netplan = next(
        f for f in phase_record(lab, stopped, "network_links")["files"] if f.startswith("/etc/netplan/")
    )
    fabric = lab.exec(stopped, "cat", netplan)
    lab.exec(stopped, "sed", "-i", "1i # edited by hand", netplan)
    helper = "/usr/local/libexec/sparkfleet-engine-container"
    watch_env = next(  # the watch's environment file, as its unit names it
        line.split("=", 2)[2]
        for line in lab.exec(head, "systemctl", "cat", "sparkfleet-engine-watch.service").splitlines()
        if line.startswith("Environment=SPARKFLEET_ENGINE_WATCH_ENV=")
    )
    watch_settings = lab.exec(head, "cat", watch_env)
    lab.exec(worker, "chmod", "0700", helper)
    lab.exec(head, "sh", "-c", f"echo '# edited by hand' >> {watch_env}")
    settings = lab.exec(edited, "cat", "/etc/default/earlyoom")
    sysctl = lab.exec(reset, "cat", "/etc/sysctl.d/60-sparkfleet.conf")
    assert "vm.swappiness" in sysctl
    lab.exec(edited, "sh", "-c", "echo 'EARLYOOM_ARGS=\"-m 50\"' > /etc/default/earlyoom")
    lab.exec(stopped, "systemctl", "stop", "earlyoom.service")
    lab.exec(
        reset, "sed", "-i", "s/^vm.swappiness *=.*/vm.swappiness = 60/", "/etc/sysctl.d/60-sparkfleet.conf"
    )
    changed = Changed()
    result = play("site.yml", on_event=changed)
    assert result.exit_code == 0, result.failures

    assert lab.exec(edited, "cat", "/etc/default/earlyoom") == settings
    assert any("Configure earlyoom" in t for t in changed.by_host.get(edited, [])), changed.by_host
    assert "-m 50" not in lab.exec(edited, "sh", "-c", "tr '\\0' ' ' < /proc/$(pidof earlyoom)/cmdline")

    assert lab.exec(stopped, "cat", netplan) == fabric
    assert any("Write the fabric netplan file" in t for t in changed.by_host.get(stopped, [])), (
        changed.by_host
    )

    assert lab.exec(stopped, "systemctl", "is-active", "earlyoom.service").strip() == "active"
    assert any("Run earlyoom" in t for t in changed.by_host.get(stopped, [])), changed.by_host

    assert lab.exec(reset, "cat", "/etc/sysctl.d/60-sparkfleet.conf") == sysctl
    assert any("sysctl drop-in" in t for t in changed.by_host.get(reset, [])), changed.by_host

    assert lab.exec(head, "cat", config) == ssh_config
    assert any("Point ssh on the head" in t for t in changed.by_host.get(head, [])), changed.by_host
    assert sorted(lab.exec(worker, "cat", keys).splitlines()) == sorted(authorized.splitlines())
    assert any("Authorize the head's key" in t for t in changed.by_host.get(worker, [])), changed.by_host
    assert reach(lab, head, worker, user) == "rc=0"  # the trust works again

    assert lab.exec(worker, "stat", "-c", "%a", helper).strip() == "755"
    unit_write = "Write the unit, its environment"
    assert any(unit_write in t for t in changed.by_host.get(worker, [])), changed.by_host
    assert lab.exec(head, "cat", watch_env) == watch_settings
    assert any(unit_write in t for t in changed.by_host.get(head, [])), changed.by_host

    # and the run after that finds every phase clean again
    again = Changed()
    assert play("site.yml", on_event=again).exit_code == 0
    assert again.by_host == {}, again.by_host


# ---- model_weights: a cluster-wide gate (the head downloads and copies to the workers) -------------------

WEIGHTS_GATE = "Read model_weights' phase record and re-read the state it lists"
# the tasks a clean gate still runs, on the controller: whether every node is clean, the recorded pins for
# --json, and the end of the role
WEIGHTS_CLEAN_TASKS = {
    "Note whether every node's weights are as last applied",
    "Report the resolved pins as last applied",
    "Stop here when nothing changed on any node since the last apply",
}
# prepare.yml's first task: every node runs it whenever the role goes on past the gate
WEIGHTS_APPLIED = "Find the user Ansible connects as and whether rsync, venv and packaging are there"
SNAPSHOT = "/srv/sparkfleet/models/snapshot"


def weights_run(play, **extravars):
    events = Events()
    result = play("playbooks/weights.yml", on_event=events, extravars=extravars or None)
    assert result.exit_code == 0, [(f.host, f.task, f.msg) for f in result.failures]
    return result, events


@pytest.mark.tp2_faults  # the same on either topology: tp2 runs it (tp3's lane is CI's longest)
def test_a_second_weights_run_changes_nothing_and_ends_at_the_gate_on_every_node(lab, play):
    """After the converge, playbooks/weights.yml reads every node's record in one round trip, finds all clean
    and ends the role there: no task of the apply runs on any node, nothing changes, and the pins the last
    apply resolved are still reported (`sparkfleet weights --json`)."""
    result, events = weights_run(play)
    gate = events.results(WEIGHTS_GATE)
    seen = {h: (r.get("clean"), r.get("drift")) for h, r in gate.items()}
    assert seen == dict.fromkeys(lab.hosts, (True, [])), seen
    names = [e["task"] for e in events.items]
    after = set(names[max(i for i, n in enumerate(names) if n == WEIGHTS_GATE) + 1 :])
    assert after <= WEIGHTS_CLEAN_TASKS, sorted(after - WEIGHTS_CLEAN_TASKS)
    assert {h: s.changed for h, s in result.hosts.items()} == dict.fromkeys(lab.hosts, 0)
    pins = result.data["pins"]["weights"]
    assert pins and all(len(p["commit"]) == 40 and p["commit"].startswith(p["revision"]) for p in pins), pins


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_shard_removed_from_a_worker_is_found_by_the_weights_gate_and_copied_back(lab, play):
    """A worker's shard deleted behind sparkfleet's back: that worker's gate names it, so every node applies
    (the head copies it) and the shard is back with its manifest sha256; the records are written again."""
    worker = lab.hosts[-1]
    files = json.loads(lab.exec(worker, "cat", "/srv/sparkfleet/models/.sparkfleet/manifest.json"))["files"]
    shard = next(f for f in files if f["path"].endswith(".safetensors"))
    path = f"{SNAPSHOT}/{shard['path']}"
    lab.exec(worker, "rm", path)
    result, events = weights_run(play)
    gate = events.results(WEIGHTS_GATE)
    assert gate[worker]["clean"] is False
    found = f"{SNAPSHOT}: 1 removed ({shard['path']})"
    assert any(line.startswith(found) for line in gate[worker]["drift"]), gate
    assert set(events.results(WEIGHTS_APPLIED)) == set(lab.hosts)  # every node applied, the clean head too
    assert lab.exec(worker, "sha256sum", path).split()[0] == shard["sha256"]
    assert sum(s.changed for s in result.hosts.values()) >= 1  # the copy
    for host in lab.hosts:
        assert phase_record(lab, host, "model_weights") is not None, host


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_changed_weights_option_makes_every_node_apply(lab, play):
    """Another value of one of the role's options (here the progress interval) is another digest: every node
    applies (and changes nothing: the weights are right), and records the new digest."""
    before = {h: phase_record(lab, h, "model_weights")["digest"] for h in lab.hosts}
    result, events = weights_run(play, model_weights_progress_interval=7)
    gate = events.results(WEIGHTS_GATE)
    for host in lab.hosts:
        assert gate[host]["drift"] == ["the inputs changed (digest of the role's variables and files)"], gate
    assert set(events.results(WEIGHTS_APPLIED)) == set(lab.hosts)
    assert {h: s.changed for h, s in result.hosts.items()} == dict.fromkeys(lab.hosts, 0)
    after = {h: phase_record(lab, h, "model_weights")["digest"] for h in lab.hosts}
    assert all(after[h] != before[h] for h in lab.hosts), (before, after)
