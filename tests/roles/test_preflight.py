"""Role preflight on a two-node lab (molecule/preflight): on a good lab it passes and changes nothing;
made wrong in ways it must catch (a busy API port on the head, GPU clock caps that differ between the
nodes), it fails naming what and where, and passes again once that is put back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.usefixtures("lab")
PINS = Path(__file__).resolve().parents[2] / "molecule/preflight/pins.yml"


@pytest.fixture(scope="module")
def preflight(play):
    pins = yaml.safe_load(PINS.read_text())["sparkfleet_pins"]

    def run():
        events = []
        result = play("playbooks/preflight.yml", extravars={"sparkfleet_pins": pins}, on_event=events.append)
        text = "\n".join(str((e.get("event_data") or {}).get("res", {}).get("msg", "")) for e in events)
        return result, text

    return run


def test_passes_and_changes_nothing(preflight):
    result, _ = preflight()
    assert result.ok, result.failures
    assert all(stats.changed == 0 for stats in result.hosts.values())


def test_a_busy_port_on_the_head_is_refused_by_name(preflight, node):
    head = node("spark1")
    head.run(
        "nohup python3 -m http.server 8888 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > /tmp/pf-port.pid"
    )
    try:
        head.run("for i in $(seq 50); do ss -ltn | grep -q ':8888 ' && break; sleep 0.1; done")
        result, text = preflight()
        assert result.exit_code == 2 and "8888" in text and "in use" in text
    finally:
        head.run("kill $(cat /tmp/pf-port.pid)")
    assert preflight()[0].ok


def test_clock_caps_that_differ_between_nodes_are_refused(preflight, node):
    worker = node("spark2")
    with worker.sudo():
        worker.run("mkdir -p /var/lib/sparkfleet/clocks")
        worker.run("echo GPU_CLOCK_CAP_MHZ=2100 > /var/lib/sparkfleet/clocks/gpu.conf")
    try:
        result, text = preflight()
        assert result.exit_code == 2 and "gpu_clock_cap" in text and "spark2=2100" in text
    finally:
        with worker.sudo():
            worker.run("rm -f /var/lib/sparkfleet/clocks/gpu.conf")
    assert preflight()[0].ok
