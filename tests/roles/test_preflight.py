"""Role preflight on the walk's two-node lab (molecule/preflight, on molecule/default's lab), with the lab's
own pins. That it passes on a good lab and changes nothing is what converge, idempotence and check showed;
here the nodes are made wrong in ways it must catch and it must fail naming what and where, having changed
nothing: a busy API port on the head; GPU clock caps that differ between the nodes (read through the one
clock state reader)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


@pytest.fixture(scope="module")
def preflight(play):
    def run():
        events = []
        result = play("playbooks/preflight.yml", on_event=events.append)
        text = "\n".join(str((e.get("event_data") or {}).get("res", {}).get("msg", "")) for e in events)
        assert all(stats.changed == 0 for stats in result.hosts.values())
        return result, text

    return run


def test_a_busy_port_on_the_head_is_refused_by_name(preflight, node):
    head = node("spark1")
    head.run(
        "nohup python3 -m http.server 8888 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > /tmp/pf-port.pid"
    )
    try:
        head.run("for i in $(seq 50); do ss -ltn | grep -q ':8888 ' && break; sleep 0.1; done")
        result, text = preflight()
    finally:
        head.run("kill $(cat /tmp/pf-port.pid)")
    assert result.exit_code == 2 and "8888" in text and "in use" in text


def test_clock_caps_that_differ_between_nodes_are_refused(preflight, node):
    worker = node("spark2")
    with worker.sudo():
        worker.run("mkdir -p /var/lib/sparkfleet/clocks")
        worker.run("echo GPU_CLOCK_CAP_MHZ=2100 > /var/lib/sparkfleet/clocks/gpu.conf")
    try:
        result, text = preflight()
    finally:
        with worker.sudo():
            worker.run("rm -f /var/lib/sparkfleet/clocks/gpu.conf")
    assert result.exit_code == 2 and "gpu_clock_cap" in text and "spark2=2100" in text
