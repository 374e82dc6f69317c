"""requirements.yml pins exactly the collections the roles use, at the versions the pinned `ansible`
package ships (requirements/lock.txt); LICENSE is the one pyproject and galaxy.yml name."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import ansible_collections
import yaml

REPO = Path(__file__).resolve().parents[2]
FQCN_RE = re.compile(r"\b([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*\b")
OURS_OR_CORE = {("ansible", "builtin"), ("ansible", "legacy"), ("sparkfleet", "cluster")}
NAMESPACES = {"ansible", "community", "containers", "kubernetes", "cisco", "amazon", "google", "azure"}


def lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements" / "lock.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            pins[name.strip().lower()] = version.strip()
    return pins


def requirements() -> dict[str, str]:
    doc = yaml.safe_load((REPO / "requirements.yml").read_text())
    return {c["name"]: str(c["version"]) for c in doc["collections"]}


def shipped(name: str) -> str:
    """The version of a collection inside the installed `ansible` package."""
    namespace, collection = name.split(".")
    for root in ansible_collections.__path__:
        path = Path(root) / namespace / collection / "MANIFEST.json"
        if path.is_file() and "site-packages" in path.parts:
            return json.loads(path.read_text())["collection_info"]["version"]
    raise AssertionError(f"{name} is not in the installed ansible package")


def test_the_installed_ansible_package_is_the_locked_one() -> None:
    assert importlib.metadata.version("ansible") == lock()["ansible"]


def test_requirements_pin_the_versions_ansible_ships() -> None:
    for name, version in requirements().items():
        assert version == shipped(name), f"{name}: requirements.yml {version}, ansible ships {shipped(name)}"


def test_every_collection_the_project_uses_is_required_and_used() -> None:
    used = set()
    sources = [*REPO.glob("roles/**/*.yml"), *REPO.glob("playbooks/*.yml")]
    sources += [REPO / "site.yml", REPO / "ansible.cfg"]
    for path in sources:
        for ns, coll in FQCN_RE.findall(path.read_text()):
            if ns in NAMESPACES and (ns, coll) not in OURS_OR_CORE:
                used.add(f"{ns}.{coll}")
    assert used == set(requirements()), f"used {sorted(used)}, required {sorted(requirements())}"


def test_license_file_is_apache_2() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = { text = "Apache-2.0" }' in (REPO / "python" / "pyproject.toml").read_text()
    assert yaml.safe_load((REPO / "galaxy.yml").read_text())["license"] == ["Apache-2.0"]
