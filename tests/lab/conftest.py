"""Fixtures for tests that run against a live lab cluster.

The lab is named by the environment variable SPARKFLEET_LAB (molecule's tp2/tp3 scenarios set it
to molecule-tp2 / molecule-tp3; by hand: `SPARKFLEET_LAB=tp3 pytest tests/lab`). Without a lab
of that name these tests are skipped with the reason; molecule's verify step always has one.

Fixtures:
  lab              sparkfleet_lab.core.Lab of the running lab
  node(host)       a testinfra host over SSH (the lab's ssh config), e.g. node("spark1").service("ssh")
  play(pb, ...)    run a playbook against the lab through sparkfleet's runner -> RunResult
Markers:
  @pytest.mark.topology("tp3")    skip unless the lab has that topology
  @pytest.mark.destructive        restarts/kills things; runs after the other tests of the session;
                                  SPARKFLEET_LAB_FAULT_TESTS=0 skips them (the tp2 scenario: the tp3
                                  one runs them, and CI stays short)
  @pytest.mark.tp2_faults         a destructive test that the tp2 scenario runs instead (the engine's
                                  restarts, the CLI's progress and prompts, clock caps: the same on
                                  either topology); SPARKFLEET_LAB_TP2_FAULT_TESTS=0 skips it (the tp3
                                  scenario), so the two cluster scenarios share the fault tests' time
  @pytest.mark.any_topology       runs playbooks whose outcome cannot depend on TP2 vs TP3 (host
                                  tuning, clocks); SPARKFLEET_LAB_ANY_TOPOLOGY_TESTS=0 skips them
                                  (the tp2 scenario, like the fault tests)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import testinfra
from sparkfleet_lab.core import Lab


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "topology(name): run only on a lab of that topology")
    config.addinivalue_line("markers", "destructive: disturbs the cluster; ordered last")
    config.addinivalue_line("markers", "any_topology: the same on TP2 and TP3; one scenario runs it")
    config.addinivalue_line("markers", "tp2_faults: a fault test that tp2 runs (tp3 skips it)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Fault tests (restarts, kills) go last so the read-only checks see a converged cluster.
    items.sort(key=lambda item: item.get_closest_marker("destructive") is not None)
    # The gates below skip at collection, before any fixture (a module's `started`) runs for nothing.
    for item in items:
        why = gated(item)
        if why:
            item.add_marker(pytest.mark.skip(reason=why))


# The cluster scenarios share the fault tests: tp3 runs the chaos suite and the other fault tests, tp2 those
# marked tp2_faults (the engine's restarts, the CLI's progress and prompts, clock caps: the same on either
# topology), and the tests whose outcome cannot depend on the topology run once, in tp3. marker -> (variable
# whose "0" skips it, why); a destructive test's variable is SPARKFLEET_LAB_TP2_FAULT_TESTS when it is marked
# tp2_faults, else SPARKFLEET_LAB_FAULT_TESTS.
GATES = {
    "destructive": (
        "SPARKFLEET_LAB_FAULT_TESTS",
        "fault test: SPARKFLEET_LAB_FAULT_TESTS=0 here (the tp3 scenario runs the fault tests)",
    ),
    "tp2_faults": (
        "SPARKFLEET_LAB_TP2_FAULT_TESTS",
        "fault test of tp2: SPARKFLEET_LAB_TP2_FAULT_TESTS=0 here (the tp2 scenario runs it)",
    ),
    "any_topology": (
        "SPARKFLEET_LAB_ANY_TOPOLOGY_TESTS",
        "the same on every topology: SPARKFLEET_LAB_ANY_TOPOLOGY_TESTS=0 here (the tp3 scenario runs it)",
    ),
}


def gated(item: pytest.Item) -> str:
    """Why this scenario skips the test ('' when it runs it)."""
    markers = [m for m in GATES if item.get_closest_marker(m)]
    if "tp2_faults" in markers and "destructive" in markers:
        markers.remove("destructive")
    for marker in markers:
        variable, why = GATES[marker]
        if os.environ.get(variable) == "0":
            return why
    return ""


@pytest.fixture(scope="session")
def lab() -> Lab:
    name = os.environ.get("SPARKFLEET_LAB")
    if not name:
        pytest.skip("SPARKFLEET_LAB is not set: these tests need a running lab (see tests/lab/conftest.py)")
    lab = Lab(name=name, require_topology=False)
    if not lab.state or not lab.ssh_config.exists():
        pytest.skip(f"lab {name!r} does not exist (sparkfleet lab up --name {name})")
    return lab


@pytest.fixture(autouse=True)
def _topology_gate(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("topology")
    if marker is None:
        return
    lab = request.getfixturevalue("lab")
    if lab.topology not in marker.args:
        pytest.skip(f"needs a {' or '.join(marker.args)} lab; this one is {lab.topology}")


@pytest.fixture(scope="session")
def node(lab: Lab) -> Iterator[Callable[[str], testinfra.host.Host]]:
    # One SSH connection per node, shared by every command (testinfra asks for ControlMaster but
    # sets no ControlPath, so without this each command pays a full handshake). A short socket
    # directory: unix socket paths are limited to ~100 bytes. ServerAlive ends a master whose node
    # was restarted under it, so the next command opens a fresh one instead of hanging.
    sockets = Path(tempfile.mkdtemp(prefix="sf-ssh-"))
    extra = (
        f"-o ControlMaster=auto -o ControlPath={sockets}/%C -o ControlPersist=120"
        " -o ServerAliveInterval=2 -o ServerAliveCountMax=3"
    )
    cache: dict[str, testinfra.host.Host] = {}

    def close(host: str) -> None:
        subprocess.run(
            ["ssh", "-F", str(lab.ssh_config), "-o", f"ControlPath={sockets}/%C", "-O", "exit", host],
            capture_output=True,
            check=False,
        )

    def get(host: str) -> testinfra.host.Host:
        if host not in cache:
            h = testinfra.get_host(f"ssh://{host}", ssh_config=str(lab.ssh_config), ssh_extra_args=extra)
            first = h.backend.run_ssh

            def run_ssh(command: str, first=first, host=host) -> object:
                # ssh's own failure (255): most likely a master whose node restarted; once more, fresh
                try:
                    return first(command)
                except RuntimeError:
                    close(host)
                    return first(command)

            h.backend.run_ssh = run_ssh
            cache[host] = h
        return cache[host]

    yield get
    for host in cache:
        close(host)
    shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture(scope="session")
def play(lab: Lab) -> Callable[..., object]:
    from sparkfleet import runner

    def run(playbook: str, **kwargs: object) -> runner.RunResult:
        kwargs.setdefault("quiet", True)
        return runner.run_playbook(
            Path(lab.project_dir) / playbook,
            [str(p) for p in lab.inventories],
            project_dir=lab.project_dir,
            **kwargs,
        )

    return run
