"""plugin_utils/yaml_files.py: the validate and phase_state actions parse the roles' files with libyaml where
PyYAML has it. A phase gate's digest covers the data of its role's meta/argument_specs.yml and galaxy.yml, so
the data must be exactly what yaml.safe_load gave (a different value would make every phase apply again once,
and a validate rule read differently would check something else)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.plugin_utils import yaml_files

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(
    [
        ROOT / "galaxy.yml",
        *ROOT.glob("roles/*/meta/argument_specs.yml"),
        *ROOT.glob("roles/*/defaults/main.yml"),
    ]
)


def test_libyaml_is_used_here():
    assert yaml.__with_libyaml__, "PyYAML without libyaml: the pinned wheel has it (requirements/lock.txt)"
    assert yaml_files.LOADER is yaml.CSafeLoader


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_the_same_data_as_safe_load(path: Path):
    text = path.read_text()
    assert yaml_files.load(text) == yaml.safe_load(text)
