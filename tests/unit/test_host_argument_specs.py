"""The argument specs of host_tuning, earlyoom and gpu_clocks match their defaults, variable by variable."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("role", ["host_tuning", "earlyoom", "gpu_clocks"])
def test_argument_spec_matches_defaults(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text())
    spec = yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults), "variables in one but not the other"
    for name, option in options.items():
        assert option.get("default") == defaults[name], name
        assert option.get("description"), f"{name} has no description"
        assert name.startswith(role + "_"), f"{name} lacks the role prefix"
        if "choices" in option and "{{" not in str(defaults[name]):
            assert defaults[name] in option["choices"], name


@pytest.mark.parametrize("role", ["host_tuning", "earlyoom", "gpu_clocks"])
def test_inventories_set_only_known_variables(role):
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults/main.yml").read_text())
    prefix = role + "_"
    for topology in ("tp2", "tp3"):
        for path in sorted((ROOT / "inventory" / topology / "group_vars/all").glob("*.yml")):
            values = yaml.safe_load(path.read_text()) or {}
            unknown = [k for k in values if k.startswith(prefix) and k not in defaults]
            assert unknown == [], f"{path}: {unknown} are not variables of role {role}"
    lab = yaml.safe_load((ROOT / "lab/sparkfleet_lab/group_vars/host.yml").read_text())
    assert [k for k in lab if k.startswith(prefix) and k not in defaults] == []


def test_clock_caps_per_topology():
    tp2 = yaml.safe_load((ROOT / "inventory/tp2/group_vars/all/clocks.yml").read_text())
    tp3 = yaml.safe_load((ROOT / "inventory/tp3/group_vars/all/clocks.yml").read_text())
    assert tp2["gpu_clocks_cap_mhz"] == 0  # the TP2 recipe sets no cap
    assert tp3["gpu_clocks_cap_mhz"] == 2300  # the TP3 recipe's GPU_CLOCK_CAP_MHZ default
