"""Role argument specs match the defaults (docs/style.md "Argument specs that match the defaults") for
cluster_plan, network_links, ssh_trust and preflight: every default has a spec entry with the same default,
and back."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = ["cluster_plan", "network_links", "ssh_trust", "preflight"]


@pytest.mark.parametrize("role", ROLES)
def test_main_spec_matches_defaults(role):
    defaults = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text()) or {}
    spec = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]
    options = spec["main"]["options"]
    assert set(options) == set(defaults), (
        f"{role}: spec-only {set(options) - set(defaults)}, default-only {set(defaults) - set(options)}"
    )
    for name, opt in options.items():
        assert opt.get("description"), f"{role}.{name} has no description"
        assert "type" in opt, f"{role}.{name} has no type"
        assert opt.get("default") == defaults[name], (
            f"{role}.{name}: spec default {opt.get('default')!r} != {defaults[name]!r}"
        )
        assert name.startswith(f"{role}_"), f"{role}.{name} lacks the role prefix"
    for entry, e in spec.items():
        for name, opt in (e.get("options") or {}).items():
            assert options.get(name) == opt, f"{role} entry {entry}: {name} differs from main"


def test_lab_group_vars_only_set_known_variables():
    lab = yaml.safe_load((ROOT / "lab/sparkfleet_lab/group_vars/network.yml").read_text())
    known = set()
    for role in ROLES:
        known |= set(yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text()) or {})
    assert set(lab) <= known
