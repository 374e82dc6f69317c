"""The hub's wheel directory: the pinned huggingface_hub and its dependencies for the node Python.

Lab nodes have no internet, so the weights role installs huggingface_hub on the head with
`pip install --no-index --find-links http://<hub>:8080/wheels/`. `prepare(data_dir)` fills
`data_dir/wheels/` on the controller with `pip download` for the lab nodes' Python (Debian
trixie: CPython 3.13) on x86_64 and on this machine's architecture. The version is the pin in
`inventory/*/group_vars/all/pins.yml` (`sparkfleet_pins.hf_client.huggingface_hub`). Downloads
are cached in `.cache/wheels/<key>/` of the checkout, so a second lab needs no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

NODE_PYTHON = "3.13"  # Debian trixie's python3
NODE_ABI = "cp313"
PLATFORM_TAGS = ("manylinux_2_28_{arch}", "manylinux_2_17_{arch}", "manylinux2014_{arch}", "linux_{arch}")


def _project_dir() -> Path:
    from sparkfleet_lab.core import default_project_dir

    return default_project_dir()


def pinned_version(project_dir: Path | None = None) -> str:
    """The huggingface_hub pin; the TP2 and TP3 inventories must agree."""
    project_dir = project_dir or _project_dir()
    versions = {}
    for pins_file in sorted((project_dir / "inventory").glob("*/group_vars/all/pins.yml")):
        pins = (yaml.safe_load(pins_file.read_text()) or {}).get("sparkfleet_pins", {})
        version = str((pins.get("hf_client") or {}).get("huggingface_hub", "")).strip()
        if version:
            versions[pins_file.parts[-4]] = version
    if not versions:
        raise RuntimeError(
            "no sparkfleet_pins.hf_client.huggingface_hub in inventory/*/group_vars/all/pins.yml"
        )
    if len(set(versions.values())) != 1:
        raise RuntimeError(f"the inventories pin different huggingface_hub versions: {versions}")
    return next(iter(versions.values()))


def architectures() -> list[str]:
    machine = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return sorted({"x86_64", arch})


def _download(dest: Path, requirement: str, arch: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--only-binary=:all:",
    ]
    for tag in PLATFORM_TAGS:
        cmd += ["--platform", tag.format(arch=arch)]
    cmd += ["--python-version", NODE_PYTHON, "--implementation", "cp"]
    for abi in (NODE_ABI, "abi3", "none"):
        cmd += ["--abi", abi]
    cmd += ["-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download {requirement} for {arch} failed:\n{proc.stderr[-2000:]}")


def prepare(data_dir: Path, version: str | None = None, cache_root: Path | None = None) -> None:
    """Put huggingface_hub==<pin> and its dependencies as wheels into data_dir/wheels/."""
    version = version or pinned_version()
    requirement = f"huggingface_hub=={version}"
    archs = architectures()
    key = hashlib.sha256(json.dumps([requirement, NODE_PYTHON, archs]).encode()).hexdigest()[:12]
    cache = (cache_root or (_project_dir() / ".cache" / "wheels")) / key
    stamp = cache / ".complete"
    if not stamp.exists():
        tmp = cache.with_name(cache.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for arch in archs:
            _download(tmp, requirement, arch)
        (tmp / ".complete").write_text(
            json.dumps({"requirement": requirement, "python": NODE_PYTHON, "archs": archs})
        )
        shutil.rmtree(cache, ignore_errors=True)
        tmp.rename(cache)
    dest = Path(data_dir) / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(cache.glob("*.whl")):
        target = dest / wheel.name
        if target.exists() and target.stat().st_size == wheel.stat().st_size:
            continue
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(wheel, partial)
        os.replace(partial, target)
