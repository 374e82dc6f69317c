"""The engine on a live lab, launched from its engine profile exactly as on real Sparks (the lab's engine is
the double of the profile's TensorFold version): verify, status, no-op start, the container, loopback and the
key, and the fault tests.

Needs a converged lab (site.yml, or network/weights/engine/start): `SPARKFLEET_LAB=<name> pytest
tests/lab/test_engine.py`. The destructive tests (an unknown flag, a slow load, the key switched on, a killed
worker, a restarted node, a whole-cluster restart, a settings change, a pin change) run last and leave the
cluster converged and verified.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml
from sparkfleet_lab import engine as engine_repo

NAME = "sparkfleet-engine"
KEYS = "/var/lib/sparkfleet/engine/api/keys"
PORTS = {"tp2": 8888, "tp3": 18002}
MODELS = {"tp2": "DeepSeek-V4.1-Flash-1017", "tp3": "deepseek-v4.1-flash"}
KEYED = {"tp2": False, "tp3": True}  # the sample inventories: TP2 serves loopback without a key, TP3 with one
ARTIFACTS: list[Path] = []  # every run of this module, searched for secrets at the end


def run(play, playbook: str, **extravars):
    result = play(playbook, extravars=extravars or None)
    ARTIFACTS.append(Path(result.artifacts_dir))
    return result


def failure_text(result) -> str:
    return " ".join(f"{f.host}: {f.task}: {f.msg}" for f in result.failures)


def engine_status(result) -> dict:
    """The status playbook's set_stats data (what `sparkfleet status --json` carries)."""
    for path in sorted((Path(result.artifacts_dir) / "job_events").glob("*.json")):
        event = json.loads(path.read_text())
        if event.get("event") == "playbook_on_stats":
            return event["event_data"]["artifact_data"]["engine_status"]
    raise AssertionError("no playbook_on_stats event with engine_status")


def container(lab, host: str) -> dict:
    out = lab.exec(host, "docker", "inspect", NAME, check=False)
    data = json.loads(out) if out.strip() else []
    return data[0] if data else {}


def started_at(lab, host: str) -> str:
    return container(lab, host).get("State", {}).get("StartedAt", "")


def api(
    lab,
    path: str,
    body: object | None = None,
    *,
    key: bool = True,
    raw: str | None = None,
    headers: bool = False,
) -> tuple[int, str]:
    """curl on the head (the API is on its loopback); the key is read there, never passed around."""
    port = PORTS[lab.topology]
    cmd = "set --; "
    if key:  # the first key of the key file, when there is one (`label: key` lines)
        first = f'grep -v "^#" {KEYS} | head -n1 | sed "s/^[^:]*: //"'
        cmd += f'[ -f {KEYS} ] && set -- -H "Authorization: Bearer $({first})"; '
    cmd += "curl -s -o /tmp/engine-test.out -D /tmp/engine-test.hdr -w '%{http_code}' \"$@\""
    cmd += f" http://127.0.0.1:{port}{path}"
    if body is not None or raw is not None:
        data = raw if raw is not None else json.dumps(body)
        cmd += f" -H 'Content-Type: application/json' --data-binary {shlex.quote(data)}"
    code = lab.exec("spark1", "sh", "-c", cmd, check=False).strip()
    out = lab.exec("spark1", "cat", "/tmp/engine-test.out", check=False)
    if headers:
        out = lab.exec("spark1", "cat", "/tmp/engine-test.hdr", check=False) + "\n" + out
    return int(code or 0), out


def chat(lab, content: str = "What is 17*19? Reply with only the number.") -> tuple[int, str]:
    body = {"model": MODELS[lab.topology], "messages": [{"role": "user", "content": content}]}
    return api(lab, "/v1/chat/completions", {**body, "reasoning_effort": "none"})


def wait_for(predicate, timeout: float = 60, step: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def argv(lab, host: str) -> list[str]:
    c = container(lab, host)
    return c["Config"]["Cmd"] if c else []


def opt(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


@pytest.fixture(scope="module")
def started(lab, play):
    result = run(play, "playbooks/start.yml")
    assert result.exit_code == 0, failure_text(result)
    return result


def test_verify_passes(lab, play, started):
    result = run(play, "playbooks/verify.yml")
    assert result.exit_code == 0, failure_text(result)


def test_every_rank_runs_on_the_images_python(lab, started):
    """The engine double's processes run on the engine image's own Python (the lab's engine base: Debian
    trixie, Python 3.13), not the unit tests' 3.11: the lab is where the double meets 3.13, serving real
    requests."""
    find = (
        "for p in /proc/[0-9]*; do"
        " tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q 'tensor[f]old' && readlink $p/exe; done"
    )
    for host in lab.hosts:
        exes = set(lab.exec(host, "docker", "exec", NAME, "sh", "-c", find, check=False).split())
        exes.discard("/usr/sbin/docker-init")  # the container's init (--init): its argv is the engine's
        assert exes and all(re.fullmatch(r"/usr/bin/python3\.13", e) for e in exes), (host, exes)


def test_status_shows_every_rank_serving_the_pinned_commit(lab, play, started):
    status = engine_status(run(play, "playbooks/status.yml"))
    assert status["healthy"], status
    pin = lab.state["pins"]["engine"]["commit"]
    assert [r["node"] for r in status["rows"]] == lab.hosts
    for row in status["rows"]:
        assert row["unit"] == "active/running" and row["container"] == "running"
        assert row["commit"] == pin[:12]
        assert row["weights"].startswith("verified ")
        # the NCCL each rank mapped (its processes' memory maps): the lab's double loads none
        assert row["nccl"] == "none loaded", row
    images = {r["image"] for r in status["rows"]}  # docker image inspect's ID on each node, the same
    assert len(images) == 1 and images.pop().startswith("sha256:"), status["rows"]
    assert status["rows"][0]["model"] == MODELS[lab.topology] and status["rows"][0]["api"] == "ok"
    assert status["rows"][0]["engine"] == "serving"
    assert all(r["engine"] == "following rank 0" for r in status["rows"][1:])
    # the engine's own lines: rank 0's serving line, each worker's "following rank 0"
    assert any(
        f"[tensorfold] serving {MODELS[lab.topology]} at http://127.0.0.1:" in line for line in status["log"]
    )
    assert sum("following rank 0" in line for line in status["log"]) == len(lab.hosts) - 1


def test_a_second_start_changes_and_restarts_nothing(lab, play, started):
    before = {h: started_at(lab, h) for h in lab.hosts}
    again = run(play, "playbooks/start.yml")
    assert again.exit_code == 0, failure_text(again)
    assert {h: s.changed for h, s in again.hosts.items()} == dict.fromkeys(lab.hosts, 0)
    assert {h: started_at(lab, h) for h in lab.hosts} == before


def test_every_rank_runs_the_profiles_command_line(lab, started):
    masters = set()
    for rank, host in enumerate(lab.hosts):
        c = container(lab, host)
        labels = c["Config"]["Labels"]
        assert labels["io.sparkfleet.engine.managed"] == "true" and labels[
            "io.sparkfleet.engine.rank"
        ] == str(rank)
        assert labels["io.sparkfleet.engine.commit"] == lab.state["pins"]["engine"]["commit"]
        assert labels["tensorfold.sha"] == lab.state["pins"]["engine"]["commit"]  # the Dockerfile's own label
        cmd = c["Config"]["Cmd"]
        assert cmd[:3] == [
            "tensorfold",
            "serve",
            "/srv/sparkfleet/models/snapshot",
        ]  # positional model directory
        assert opt(cmd, "--tp") == str(len(lab.hosts)) and opt(cmd, "--rank") == str(rank)
        assert opt(cmd, "--name") == MODELS[lab.topology] and "--no-update-check" in cmd
        masters.add((opt(cmd, "--master"), opt(cmd, "--master-port")))
        head_only = {flag for flag in ("--host", "--port", "--max-tokens") if flag in cmd}
        if rank == 0:  # --max-tokens where the profile sets one (the TP3 recipe's words set none)
            assert {"--host", "--port"} <= head_only
        else:
            assert head_only == set()  # rank 0 only
        hc = c["HostConfig"]
        assert hc["NetworkMode"] == "host" and hc["IpcMode"] == "host" and hc["Init"] is True
        assert hc["OomScoreAdj"] == 1000 and hc["RestartPolicy"]["Name"] == "no"
        assert hc["LogConfig"]["Type"] == "json-file" and hc["LogConfig"]["Config"]["max-size"] == "200m"
        mounts = {m["Destination"]: m for m in c["Mounts"]}
        assert mounts["/srv/sparkfleet/models/snapshot"]["RW"] is False
        kernels = mounts["/cache/tf"]
        assert kernels["RW"] is True and kernels["Source"].endswith(lab.state["pins"]["engine"]["commit"])
        env = dict(e.split("=", 1) for e in c["Config"]["Env"])
        assert env["HF_HUB_OFFLINE"] == "1" and env["TORCH_EXTENSIONS_DIR"] == "/cache/tf/torch_extensions"
        assert "NCCL_SOCKET_IFNAME" in env and "HF_TOKEN" not in env  # the rank's NCCL env (network_links)
    assert len(masters) == 1  # one rendezvous, the plan's
    # the double built its kernels into the host's cache on the first start, as the real engine does
    assert (
        lab.exec(
            "spark1", "sh", "-c", "ls /var/lib/sparkfleet/engine/kernels/*/torch_extensions | wc -l"
        ).strip()
        != "0"
    )


def test_api_listens_on_loopback_only(lab, started):
    port = PORTS[lab.topology]
    lines = lab.exec("spark1", "ss", "-Hltn", f"sport = :{port}").splitlines()
    assert [line.split()[3] for line in lines] == [f"127.0.0.1:{port}"]  # local address column: loopback only


@pytest.mark.topology("tp3")
def test_tp3_needs_the_key_kept_private(lab, started):
    code, body = api(lab, "/v1/models", key=False)
    assert code == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    assert api(lab, "/v1/models")[0] == 200
    for path, owner in ((KEYS, "root"), ("/home/spark/ds1017/api/credentials.env", "spark")):
        assert lab.exec("spark1", "stat", "-c", "%a %U", path).split() == ["600", owner]
    key = lab.exec("spark1", "sh", "-c", f"grep -v '^#' {KEYS} | sed 's/^[^:]*: //'").strip()
    creds = lab.exec("spark1", "cat", "/home/spark/ds1017/api/credentials.env")
    assert f"SPARK_API_KEY={key}" in creds


def test_a_malformed_request_leaves_the_server_serving(lab, started):
    code, body = api(lab, "/v1/chat/completions", raw='{"model": "x", "messages": [')
    assert code == 400 and "is not JSON" in body
    code, body = api(lab, "/v1/chat/completions", {"messages": "not a list"})
    assert code == 400
    code, body = chat(lab)
    assert code == 200 and "323" in json.loads(body)["choices"][0]["message"]["content"]


# ---- fault tests (destructive: they run last and leave the cluster converged) ----------------


def assert_started_in_order(lab) -> None:
    """Workers started before rank 0 (container StartedAt, RFC 3339 with nanoseconds: sortable)."""
    times = {h: started_at(lab, h) for h in lab.hosts}
    assert all(times[w] < times[lab.hosts[0]] for w in lab.hosts[1:]), times


def recover(lab, play, verify: bool = False) -> None:
    """start.yml brings the cluster back in order and the status it ends with says healthy (one run: start
    reads the status as `sparkfleet status` does); verify.yml (real requests) only where asked: the last fault
    test, so the next module starts from a verified cluster."""
    result = run(play, "playbooks/start.yml")
    assert result.exit_code == 0, failure_text(result)
    assert_started_in_order(lab)
    status = engine_status(result)
    assert status["healthy"], status
    if verify:
        assert run(play, "playbooks/verify.yml").exit_code == 0


@pytest.mark.tp2_faults
def test_an_unknown_flag_is_refused_before_any_node_is_touched(lab, play, started):
    """An extra argument the engine's parser refuses (argparse would exit 2 on the first rank to start) is
    refused by preflight's parse of each rank's command line, in argparse's own words: the running engine
    keeps running, untouched."""
    before = {h: started_at(lab, h) for h in lab.hosts}
    failed = run(play, "playbooks/start.yml", engine_service_extra_args=["--bogus"])
    assert failed.exit_code == 2
    text = failure_text(failed)
    assert "engine_service_extra_args: the engine of this profile" in text, text
    assert "tensorfold: error: unrecognized arguments: --bogus" in text, text
    assert "nothing was changed" in text, text
    assert {h: started_at(lab, h) for h in lab.hosts} == before
    assert engine_status(run(play, "playbooks/status.yml"))["healthy"]


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_status_says_loading_while_the_port_is_closed(lab, play, started):
    slow = {"SPARKFLEET_LAB_ENGINE_LOAD_S": "300"}  # the double's load time; the real engine takes minutes
    waited = run(play, "playbooks/start.yml", engine_service_extra_env=slow, engine_service_ready_timeout=5,
                 engine_service_ready_poll=5)  # fmt: skip
    assert waited.exit_code == 2  # not ready in 5 s: it says what it waits for
    text = failure_text(waited)
    assert "the engine is not ready: loading, 0 min of the ~15 the first start takes" in text or (
        "the engine is not ready: rank 0's unit sparkfleet-engine.service runs; docker is creating" in text
    ), text

    def loading():
        status = engine_status(run(play, "playbooks/status.yml", engine_service_extra_env=slow))
        return status if status["rows"][0]["api"].startswith("loading, ") else None

    status = wait_for(loading, timeout=240, step=5)
    assert status, "status never said loading"
    head = status["rows"][0]
    assert head["container"] == "running" and " min of the ~15" in head["api"] and not status["healthy"]
    assert head["engine"].startswith("loading")
    assert any("(rank 0) loading: [tensorfold] " in line for line in status["log"]), status["log"]
    assert api(lab, "/health")[0] == 0  # the port is closed while the engine loads: connection refused
    recover(lab, play)


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_request_without_the_key_gets_the_engines_401(lab, play, started):
    keyed = {} if KEYED[lab.topology] else {"engine_service_api_key_required": True}
    if keyed:
        result = run(play, "playbooks/start.yml", **keyed)
        assert result.exit_code == 0, failure_text(result)
    code, text = api(lab, "/v1/models", key=False, headers=True)
    head, _, body = text.partition("\n\n")
    assert code == 401 and "www-authenticate: bearer" in head.lower()
    assert json.loads(body.strip().splitlines()[-1]) == {
        "error": {"message": "A valid API key is required", "type": "invalid_request_error", "param": None,
                  "code": "invalid_api_key"}
    }  # fmt: skip
    assert (
        api(lab, "/v1/models")[0] == 200 and api(lab, "/health", key=False)[0] == 200
    )  # /health is not gated
    assert run(play, "playbooks/verify.yml", **keyed).exit_code == 0  # verify's own 401 check passes too
    if keyed:
        recover(lab, play)


def watch_journal(lab) -> str:
    return lab.exec(lab.hosts[0], "journalctl", "--unit", f"{NAME}-watch", "--no-pager", "--output", "cat")


@pytest.mark.destructive
def test_rank_1_killed_with_sigkill_stops_the_whole_engine_and_start_recovers_in_order(lab, play, started):
    """Chaos (issue 15, 22): rank 1 killed with SIGKILL while serving. Rank 0's watch stops rank 0, then every
    other rank; nothing restarts on any node; status names rank 1 and the signal; start relaunches them."""
    worker = lab.hosts[1]
    before = {h: started_at(lab, h) for h in lab.hosts}
    lab.exec(worker, "docker", "kill", "--signal", "KILL", NAME)

    def states() -> dict[str, str]:
        return {h: container(lab, h).get("State", {}).get("Status", "gone") for h in lab.hosts}

    assert wait_for(lambda: "running" not in states().values(), timeout=60), states()
    assert f"rank 1 on {worker} failed: its container is exited exit 137" in watch_journal(lab)
    time.sleep(15)  # 15 s on: still nothing runs, and nothing was restarted
    for h in lab.hosts:
        c = container(lab, h)
        assert c["State"]["Status"] == "exited" and c["RestartCount"] == 0, (h, c["State"])
        assert c["State"]["StartedAt"] == before[h], h  # the container that ran, not a new one
        active = lab.exec(h, "systemctl", "is-active", f"{NAME}.service", check=False).strip()
        assert active in ("inactive", "failed"), (h, active)
    status = engine_status(run(play, "playbooks/status.yml"))
    assert not status["healthy"]
    row = next(r for r in status["rows"] if r["node"] == worker)
    assert row["container"].startswith("exited")
    notes = " ".join(status["notes"])
    assert f"{worker} (rank 1) died: killed by SIGKILL" in notes, notes
    recover(lab, play)


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_restarted_worker_node_is_explained_then_recovered(lab, play, started):
    worker = lab.hosts[1]
    os.system(f"docker restart {lab.container(worker)} >/dev/null")  # noqa: S605 - the lab's own node
    lab._wait_booted(worker)
    lab._wait_ssh(worker)
    # Rank 1 went with its node: rank 0's watch stops the whole engine (a formed cluster takes no new member).
    head = lab.hosts[0]
    assert wait_for(lambda: not container(lab, head).get("State", {}).get("Running", True), timeout=120)
    assert f"rank 1 on {worker} failed: " in watch_journal(lab)
    status = engine_status(run(play, "playbooks/status.yml"))
    assert not status["healthy"]
    recover(lab, play)


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_the_engine_comes_back_after_a_whole_cluster_restart(lab, play, started):
    for host in lab.hosts:
        os.system(f"docker restart {lab.container(host)} >/dev/null")  # noqa: S605 - the lab's own nodes
    for host in lab.hosts:
        lab._wait_booted(host)
        lab._wait_ssh(host)
    # Every unit starts at boot on its own; the rendezvous waits for the others, in any order.
    assert wait_for(lambda: api(lab, "/health")[0] == 200, timeout=240, step=3), api(lab, "/health")
    status = engine_status(run(play, "playbooks/status.yml"))
    assert status["healthy"], status
    again = run(play, "playbooks/start.yml")
    assert again.exit_code == 0 and sum(s.changed for s in again.hosts.values()) == 0


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_settings_change_restarts_in_order_and_back(lab, play, started):
    before = {h: started_at(lab, h) for h in lab.hosts}
    changed = run(play, "playbooks/start.yml", engine_service_parallel=3)
    assert changed.exit_code == 0, failure_text(changed)
    after = {h: started_at(lab, h) for h in lab.hosts}
    assert all(after[h] > before[h] for h in lab.hosts)
    assert_started_in_order(lab)
    assert {opt(argv(lab, h), "--parallel") for h in lab.hosts} == {"3"}  # every rank: they compare settings
    recover(lab, play)


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_a_pin_change_rebuilds_reships_and_restarts(lab, play, started):
    # the pins as the lab's inventory sets them (00-lab.yml): an extra-vars override replaces the whole table
    lab_vars = yaml.safe_load((lab.state_dir / "inventory/group_vars/all/00-lab.yml").read_text())
    pins = lab_vars["sparkfleet_pins"]
    version = engine_repo.VERSION_BY_TOPOLOGY[lab.topology]  # the engine version the lab pinned
    new = engine_repo.add_commit(lab.state_dir / "hub" / "git", note="lab test: pin change", version=version)
    moved = {**pins, "engine": {**pins["engine"], "commit": new}}
    built = run(play, "playbooks/engine.yml", sparkfleet_pins=moved)
    assert built.exit_code == 0, failure_text(built)
    assert built.hosts["spark1"].changed > 0  # built on the head (and shipped from there)
    ids = {
        h: lab.exec(h, "docker", "image", "inspect", "-f", "{{.Id}}", f"sparkfleet/engine:{new}").strip()
        for h in lab.hosts
    }
    assert len(set(ids.values())) == 1, ids  # the head's image on every worker
    fmt = '{{index .Config.Labels "tensorfold.sha"}}'
    label = lab.exec("spark1", "docker", "image", "inspect", "-f", fmt, f"sparkfleet/engine:{new}").strip()
    assert label == new  # pip installed exactly the pinned commit (the build checked direct_url.json)
    again = run(play, "playbooks/engine.yml", sparkfleet_pins=moved)
    assert sum(s.changed for s in again.hosts.values()) == 0  # built and shipped once
    restarted = run(play, "playbooks/start.yml", sparkfleet_pins=moved)
    assert restarted.exit_code == 0, failure_text(restarted)
    status = engine_status(restarted)  # the status start ends with
    assert {r["commit"] for r in status["rows"]} == {new[:12]}
    # the new commit's kernel cache is a directory of its own: its first start built its kernels
    assert (
        lab.exec(
            "spark1", "test", "-d", f"/var/lib/sparkfleet/engine/kernels/{new}/torch_extensions", check=False
        )
        == ""
    )
    back = run(play, "playbooks/engine.yml")  # the old pin's image is still there: nothing to build or ship
    assert back.exit_code == 0 and sum(s.changed for s in back.hosts.values()) == 0
    recover(lab, play, verify=True)


@pytest.mark.destructive
@pytest.mark.tp2_faults
def test_no_secret_in_any_artifact_or_log(lab, play, started):
    if not KEYED[lab.topology]:  # the sample TP2 inventory has no key: start with one, so there is a secret
        result = run(play, "playbooks/start.yml", engine_service_api_key_required=True)
        assert result.exit_code == 0, failure_text(result)
    cmd = f"test -f {KEYS} && grep -v '^#' {KEYS} | sed 's/^[^:]*: //' || true"
    keys = lab.exec("spark1", "sh", "-c", cmd).split()
    secrets = [s for s in (*keys, os.environ.get("HF_TOKEN", "")) if len(s) >= 8]
    assert keys and set(keys) <= set(secrets) and ARTIFACTS, (len(keys), ARTIFACTS)  # never an empty search
    places = [*ARTIFACTS, lab.state_dir / "inventory"]
    for place in places:
        for path in place.rglob("*") if place.is_dir() else []:
            if path.is_file():
                text = path.read_text(errors="replace")
                for secret in secrets:
                    assert secret not in text, f"a secret in {path}"
    for host in lab.hosts:
        logs = lab.exec(
            host, "sh", "-c", f"journalctl -u {NAME} --no-pager; docker logs {NAME} 2>&1", check=False
        )
        for secret in secrets:
            assert secret not in logs, f"a secret in {host}'s engine logs"
