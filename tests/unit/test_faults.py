"""Faults named for what they are (issue 15): Docker not running, a rank that died, an unreachable node, a
full disk during the copy. Each gets its own words in the status and in the failing task's module."""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.filter import engine as eng
from ansible_collections.sparkfleet.cluster.plugins.modules import engine_node

PLAN = {
    "size": 3,
    "head": "spark1",
    "ranks": {"spark1": 0, "spark2": 1, "spark3": 2},
    "hosts_by_rank": ["spark1", "spark2", "spark3"],
}
SERVING = {
    "unit": {"exists": True, "active": "active", "sub": "running"},
    "container": {"exists": True, "running": True, "labels": {}},
    "docker_daemon": {"running": True, "error": ""},
    "log": {"phase": "following"},
}
UNIT_SHOW = (
    "LoadState=loaded\nActiveState={active}\nSubState={sub}\nResult={result}\nExecMainStatus=0\n"
    "UnitFileState=enabled\nActiveEnterTimestamp=\nInactiveEnterTimestamp=Tue 2026-01-06 10:00:00 UTC\n"
)


def unit(active: str, sub: str, result: str = "success") -> dict:
    return {
        **engine_node.parse_unit(UNIT_SHOW.format(active=active, sub=sub, result=result)),
        "name": "docker.service",
    }


def status(**nodes: dict) -> dict:
    all_nodes = {
        "spark1": {**SERVING, "log": {"phase": "serving"}},
        "spark2": SERVING,
        "spark3": SERVING,
        **nodes,
    }
    return eng.status_rows(all_nodes, PLAN, {"state": "down", "detail": "connection refused"}, "")


def test_docker_stopped_is_named_and_never_asked_through_its_socket():
    daemon = engine_node.docker_daemon(unit("inactive", "dead"), None, "", "")
    assert daemon == {"running": False, "unit": daemon["unit"], "error": "docker.service is inactive/dead"}
    failed = engine_node.docker_daemon(unit("failed", "failed", "exit-code"), None, "", "")
    assert failed["error"] == "docker.service is failed/failed, exit-code"


def test_docker_running_or_not_answering():
    assert engine_node.docker_daemon(unit("active", "running"), 0, "26.1.5\n", "")["running"]
    gone = engine_node.docker_daemon(
        None,
        1,
        "",
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?",
    )
    assert not gone["running"] and gone["error"].startswith(
        "the Docker daemon does not answer: Cannot connect"
    )
    assert (
        engine_node.docker_daemon(None, None, "", "", cli=False)["error"] == "the docker CLI is not installed"
    )


def test_status_says_docker_is_down_not_container_absent():
    down = {
        "unit": {"exists": True, "active": "inactive", "sub": "dead"},
        "container": dict(engine_node.UNKNOWN_CONTAINER),
        "docker_daemon": {"running": False, "error": "docker.service is inactive/dead"},
    }
    got = status(spark2=down)
    row = next(r for r in got["rows"] if r["node"] == "spark2")
    assert row["container"] == "unknown (Docker down)"
    note = next(n for n in got["notes"] if n.startswith("spark2"))
    assert note.startswith(
        "spark2 (rank 1): Docker is not running on spark2 (docker.service is inactive/dead)"
    )
    assert "absent" not in note and "sparkfleet engine" not in note
    assert not got["healthy"]


def test_a_rank_killed_by_sigkill_is_said_to_have_died_by_it():
    dead = {
        **SERVING,
        "unit": {"exists": True, "active": "failed", "sub": "failed", "exit_status": 137},
        "container": {
            "exists": True,
            "running": False,
            "status": "exited",
            "exit_code": 137,
            "finished_at": "2026-01-06T10:00:00.123Z",
            "labels": {},
        },
        "log": {"phase": "stopped"},
    }
    got = status(spark2=dead)
    note = next(n for n in got["notes"] if n.startswith("spark2"))
    assert note.startswith("spark2 (rank 1) died: killed by SIGKILL (exit 137) at 2026-01-06T10:00:00.123Z")
    assert "`sparkfleet start` restarts the cluster in order" in note
    oom = {**dead, "container": {**dead["container"], "oom_killed": True}}
    assert "killed by the kernel's OOM killer (exit 137)" in eng.rank_problem("spark3", 2, oom)
    stopped = {
        **dead,
        "container": {**dead["container"], "exit_code": 0, "finished_at": "0001-01-01T00:00:00Z"},
    }
    assert eng.rank_problem("spark3", 2, stopped).startswith(
        "spark3 (rank 2) stopped: exited with status 0; unit"
    )


def test_an_unreachable_node_is_named_as_such():
    got = status(spark3={"unreachable": True})
    assert next(r for r in got["rows"] if r["node"] == "spark3")["container"] == "unreachable"
    assert any(n.startswith("spark3 (rank 2): unreachable (no answer over SSH)") for n in got["notes"])


def test_a_cut_off_copy_and_a_full_disk_are_noted_in_status(tmp_path):
    snapshot = tmp_path / "snapshot"
    (snapshot / ".rsync-partial" / "engram").mkdir(parents=True)
    (snapshot / ".rsync-partial" / "model-00003.safetensors").write_bytes(b"x" * 10)
    part = engine_node.partial_copy(str(snapshot))
    assert part["files"] == ["model-00003.safetensors"] and part["free_bytes"] > 0
    assert engine_node.partial_copy(str(tmp_path / "none"))["files"] == []
    full = {**SERVING, "weights_partial": {**part, "free_bytes": 4096}}
    note = next(n for n in status(spark2=full)["notes"] if n.startswith("spark2"))
    assert note.startswith(
        f"spark2: the disk is full at {snapshot} (4096 bytes free): the copy of the weights"
    )
    assert "model-00003.safetensors in" in note and "free space there and run `sparkfleet weights`" in note
    roomy = {**SERVING, "weights_partial": {**part, "free_bytes": 10**12}}
    got = status(spark2=roomy)
    assert any("`sparkfleet weights` resumes it" in n for n in got["notes"]) and not got["healthy"]
