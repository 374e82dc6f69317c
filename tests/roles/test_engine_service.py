"""Role engine_service on a two-node lab with the hub (molecule/engine_service): both ranks run as
sparkfleet's labelled containers under systemd, and the API of rank 0 answers real requests
(playbooks/verify.yml)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("lab")


@pytest.mark.parametrize(("name", "rank"), [("spark1", "0"), ("spark2", "1")])
def test_each_rank_runs_under_systemd_as_a_labelled_container(node, name, rank):
    host = node(name)
    assert host.service("sparkfleet-engine").is_running
    with host.sudo():
        info = json.loads(host.check_output("docker inspect sparkfleet-engine"))[0]
    assert info["State"]["Running"]
    labels = info["Config"]["Labels"]
    assert labels["io.sparkfleet.engine.managed"] == "true" and labels["io.sparkfleet.engine.rank"] == rank


def test_the_api_answers_real_requests(play):
    result = play("playbooks/verify.yml")
    assert result.ok, result.failures


def started_at(node, name: str) -> str:
    with node(name).sudo():
        info = json.loads(node(name).check_output("docker inspect sparkfleet-engine"))[0]
    return info["State"]["StartedAt"]


def test_an_address_rank_0_does_not_have_is_refused_before_anything_changes(node, play):
    """issue 21: a setting that would only fail when the engine starts (an API address the head does not
    have) is refused by rank 0's bind check before the unit is written or a rank stopped: the running
    ranks keep running (StartedAt unchanged) and the API still answers."""
    before = {h: started_at(node, h) for h in ("spark1", "spark2")}
    bad = play(
        "playbooks/start.yml",
        extravars={"engine_service_host": "192.0.2.77", "engine_service_api_key_required": True},
    )
    assert not bad.ok
    msgs = " ".join(f.msg for f in bad.failures)
    assert "engine_service_host=192.0.2.77" in msgs, msgs
    assert "192.0.2.77 is not an address of this node" in msgs and "a running engine keeps running" in msgs
    check = (
        "The API can listen where the settings say, before anything changes (a running engine keeps running)"
    )
    assert bad.failures and all(f.task.endswith(check) for f in bad.failures), [
        (f.host, f.task) for f in bad.failures
    ]
    assert {h: started_at(node, h) for h in ("spark1", "spark2")} == before
    again = play("playbooks/verify.yml")
    assert again.ok, again.failures


def test_a_value_the_engine_refuses_is_refused_before_anything_changes(node, play):
    """issue 21: an extra argument whose value the engine refuses (argparse would exit 2 and the rank die at
    once) is refused by preflight's parse with the engine version's real flags, in argparse's words, before
    any node is touched: the running ranks keep running (StartedAt unchanged), the units are as they were."""
    unit = "cat /etc/systemd/system/sparkfleet-engine.service"
    before = {h: (started_at(node, h), node(h).check_output(unit)) for h in ("spark1", "spark2")}
    bad = play("playbooks/start.yml", extravars={"engine_service_extra_args": ["--kv-dtype", "fp3"]})
    assert not bad.ok
    msgs = " ".join(f.msg for f in bad.failures)
    assert "engine_service_extra_args: the engine of this profile (tensorfold 0.6.6) would refuse" in msgs, (
        msgs
    )
    assert "tensorfold serve: error: argument --kv-dtype: invalid choice: 'fp3'" in msgs, msgs
    assert "nothing was changed" in msgs, msgs
    assert {h: (started_at(node, h), node(h).check_output(unit)) for h in ("spark1", "spark2")} == before


@pytest.mark.parametrize(
    ("extra", "state", "words"),
    [
        ([], "ok", ""),
        (
            ["--kv-dtype", "fp3"],
            "refused",
            "tensorfold serve: error: argument --kv-dtype: invalid choice: 'fp3'",
        ),
        (["--no-such-flag"], "refused", "tensorfold: error: unrecognized arguments: --no-such-flag"),
    ],
)
def test_the_images_own_parser_judges_the_command_line(play, extra, state, words):
    """The check a start makes before it rewrites a unit or stops a rank (module engine_args): the engine's
    own parser, in a throw-away container of the running rank 0's image, over its command line as it runs
    now plus `extra`. The real docker and the image the role built."""
    result = play("tests/lab/playbooks/engine_args.yml", extravars={"extra": extra})
    assert result.ok, result.failures
    verdict = result.data["engine_args"]
    assert verdict["state"] == state and words in verdict["problem"], verdict
    assert verdict["changed"] is False


def test_a_port_another_process_holds_while_the_engine_runs_is_refused(node, play):
    """issue 21: while the engine runs, a new API port that another process listens on is traced to that
    process (not taken to be the engine's) and refused before anything changes."""
    head = node("spark1")
    with head.sudo():
        head.check_output(
            "nohup python3 -m http.server 18123 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > /tmp/other.pid"
        )
    try:
        before = {h: started_at(node, h) for h in ("spark1", "spark2")}
        bad = play("playbooks/start.yml", extravars={"engine_service_port": 18123})
        assert not bad.ok
        msgs = " ".join(f.msg for f in bad.failures)
        assert "port 18123 on 127.0.0.1 is in use by python3 (pid " in msgs, msgs
        assert "not by the running engine" in msgs and "a running engine keeps running" in msgs, msgs
        assert {h: started_at(node, h) for h in ("spark1", "spark2")} == before
    finally:
        with head.sudo():
            head.run("kill $(cat /tmp/other.pid)")
