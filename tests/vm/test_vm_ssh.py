"""SSH trust over a real management LAN (molecule/vm converged playbooks/network.yml, ssh_trust included): the
head reaches every worker by key, by name through the managed ssh config and by management address, and the
connection crosses the LAN between the nodes' own kernels (the worker sees it come from the head's enP7s7
address), not the controller's forwarded port. The test addresses nothing itself: the LAN addresses are the
lab's (VmLab.mgmt_address), the names and keys the role's."""

from __future__ import annotations

import shlex

import pytest
from sparkfleet_lab.vm.lab import NODE_USER

pytestmark = pytest.mark.usefixtures("lab")

# BatchMode: a key or nothing (no password prompt); the host key must already be pinned by the role
SSH = "ssh -o BatchMode=yes -o ConnectTimeout=10"


def _from_head(lab, node, target: str) -> list[str]:
    """`$SSH_CONNECTION` as the worker saw the head's connection: client address and port, server address and
    port."""
    out = node(lab.hosts[0]).check_output(f"{SSH} {shlex.quote(target)} 'echo $SSH_CONNECTION'")
    return out.split()


def test_the_head_reaches_every_worker_by_name_over_the_management_lan(lab, node):
    head = lab.hosts[0]
    for worker in lab.hosts[1:]:
        client, _port, server, server_port = _from_head(lab, node, worker)
        assert (client, server, server_port) == (lab.mgmt_address(head), lab.mgmt_address(worker), "22")


def test_the_head_reaches_every_worker_by_its_management_address_with_a_pinned_host_key(lab, node):
    head = lab.hosts[0]
    for worker in lab.hosts[1:]:
        address = lab.mgmt_address(worker)
        client, _port, server, _sport = _from_head(lab, node, address)
        assert (client, server) == (lab.mgmt_address(head), address)
        # the host key was pinned by the role (read over Ansible's connection), never learnt on first use
        pinned = node(head).check_output(f"ssh-keygen -F {address} -f ~/.ssh/sparkfleet_known_hosts")
        assert address in pinned


def test_a_worker_does_not_reach_the_head_by_the_heads_key(lab, node):
    # the trust is one way, head to workers: a worker holds no key the head accepts
    head, worker = lab.hosts[0], lab.hosts[1]
    h = node(worker)
    cmd = f"{SSH} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null {lab.mgmt_address(head)} true"
    # its exit status echoed: testinfra's SSH backend takes a 255 of the command for one of its own connection
    out = h.check_output(f"{cmd} 2>&1; echo rc=$?").splitlines()
    assert out[-1] == "rc=255", out
    # refused for want of a key, on the head's address (not a name that did not resolve, not a timeout)
    assert f"{NODE_USER}@{lab.mgmt_address(head)}: Permission denied (publickey)." in out, out
