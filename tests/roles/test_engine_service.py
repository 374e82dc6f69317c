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
