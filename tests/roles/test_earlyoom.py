"""Role earlyoom on one lab node (molecule/earlyoom): the daemon runs with the configured arguments and
systemd spares the protected services."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def test_earlyoom_runs_enabled_with_the_configured_arguments(node):
    host = node("spark1")
    service = host.service("earlyoom")
    assert service.is_running and service.is_enabled
    pid = host.check_output("systemctl show -p MainPID --value earlyoom.service")
    argv = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()
    assert argv[argv.index("-m") + 1] == "4,2"
    assert argv[argv.index("-s") + 1] == "100"
    assert "tensorfold" in argv[argv.index("--prefer") + 1]
    assert "sshd" in argv[argv.index("--avoid") + 1]


@pytest.mark.parametrize("unit", ["ssh.service", "docker.service", "containerd.service"])
def test_protected_services_get_the_lower_oom_score_from_systemd(node, unit):
    # The drop-in is loaded (daemon-reloaded): systemd gives the service this score at its next start.
    host = node("spark1")
    assert host.check_output(f"systemctl show -p OOMScoreAdjust --value {unit}") == "-900"
    assert host.check_output(f"systemctl show -p NeedDaemonReload --value {unit}") == "no"
