"""One version for the collection and both Python packages: galaxy.yml's (the CHANGELOG's numbering).

The lab's pyproject, the product's pyproject, `sparkfleet --version` (sparkfleet.__version__, also written
into the run lock) and the execution environment's image tag all carry it."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def galaxy_version() -> str:
    return str(yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"])


def test_packages_carry_the_collection_version():
    version = galaxy_version()
    for pyproject in ("python/pyproject.toml", "lab/pyproject.toml"):
        assert tomllib.loads((ROOT / pyproject).read_text())["project"]["version"] == version, pyproject
    init = ast.parse((ROOT / "python/sparkfleet/__init__.py").read_text())
    (value,) = [
        node.value.value
        for node in init.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]
    ]
    assert value == version


def test_changelog_heads_with_the_version():
    first = next(line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## "))
    assert first.split()[1] == galaxy_version()


def test_execution_environment_image_is_tagged_with_the_version():
    ee = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
    assert ee["options"]["tags"] == [f"sparkfleet-ee:{galaxy_version()}"]
