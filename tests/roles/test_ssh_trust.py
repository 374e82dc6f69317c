"""Role ssh_trust on a two-node lab (molecule/ssh_trust): the head reaches the worker by key, with the
worker's host key pinned, by name and on every fabric address."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def test_head_reaches_the_worker_by_name(node):
    head = node("spark1")
    out = head.run("ssh -o BatchMode=yes -o ConnectTimeout=5 spark2 hostname")
    assert out.rc == 0 and out.stdout.strip() == "spark2", out.stderr


def test_head_reaches_the_worker_on_its_fabric_addresses_with_a_pinned_host_key(plan, node):
    head = node("spark1")
    args = (
        "-o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        " -i ~/.ssh/sparkfleet_ed25519 -o UserKnownHostsFile=~/.ssh/sparkfleet_known_hosts"
    )
    for rail in plan["interfaces"]["spark1"]:
        out = head.run(f"ssh -F /dev/null {args} {rail['peer_address']} hostname")
        assert out.rc == 0 and out.stdout.strip() == "spark2", (rail["peer_address"], out.stderr)


def test_the_worker_does_not_reach_the_head(plan, node):
    # trust goes one way: the head drives the workers, a worker has no key for the head. The head's sshd must
    # answer on each of its fabric addresses and refuse the worker's keys: an exit status 255 alone would also
    # be a name that does not resolve or a port nobody listens on. (The status is read from the output:
    # testinfra takes a 255 for a failure of its own connection.)
    worker = node("spark2")
    args = (
        "-F /dev/null -o BatchMode=yes -o ConnectTimeout=5 -o StrictHostKeyChecking=no"
        " -o UserKnownHostsFile=/dev/null -o PreferredAuthentications=publickey"
    )
    rails = [r for r in plan["interfaces"]["spark2"] if r["peer_host"] == "spark1"]
    assert rails, plan["interfaces"]["spark2"]
    for rail in rails:
        out = worker.check_output(f"ssh {args} {rail['peer_address']} true 2>&1; echo rc=$?")
        assert out.endswith("rc=255") and "Permission denied (publickey" in out, (rail["peer_address"], out)
