"""execution-environment.yml stays in step with the lock file and requirements.yml."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / "lock.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


def test_execution_environment_matches_the_pins() -> None:
    ee = yaml.safe_load((REPO / "execution-environment.yml").read_text())
    lock = _lock()
    assert ee["version"] == 3
    deps = ee["dependencies"]
    assert deps["ansible_core"]["package_pip"] == f"ansible-core=={lock['ansible-core']}"
    assert deps["ansible_runner"]["package_pip"] == f"ansible-runner=={lock['ansible-runner']}"
    assert deps["galaxy"] == "requirements.yml" and (REPO / deps["galaxy"]).is_file()
    for requirement in deps["python"]:
        name, _, version = requirement.partition("==")
        assert lock[name.lower()] == version, requirement
    assert ee["images"]["base_image"]["name"]
