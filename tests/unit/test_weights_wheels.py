"""The hub's wheel directory: the pin comes from the inventories, downloads are cached (no network here)."""

from __future__ import annotations

import hashlib
import json
import platform

import pytest
from sparkfleet_lab.hub import wheels


def test_the_pin_is_the_inventories_huggingface_hub_version():
    from test_weights_support import ROOT

    assert wheels.pinned_version(ROOT) == "2.4.0"


def test_disagreeing_inventories_are_refused(tmp_path):
    for topo, version in (("tp2", "2.4.0"), ("tp3", "2.5.0")):
        d = tmp_path / "inventory" / topo / "group_vars" / "all"
        d.mkdir(parents=True)
        (d / "pins.yml").write_text(f"sparkfleet_pins:\n  hf_client:\n    huggingface_hub: '{version}'\n")
    with pytest.raises(RuntimeError, match="different huggingface_hub versions"):
        wheels.pinned_version(tmp_path)


def test_x86_64_is_always_among_the_architectures():
    archs = wheels.architectures()
    assert "x86_64" in archs and len(archs) in (1, 2)
    if platform.machine() in ("aarch64", "arm64"):
        assert "aarch64" in archs


def test_a_cached_download_is_copied_without_pip(tmp_path, monkeypatch):
    requirement = "huggingface_hub==9.9.9"
    key = hashlib.sha256(
        json.dumps([requirement, wheels.NODE_PYTHON, wheels.architectures()]).encode()
    ).hexdigest()[:12]
    cache = tmp_path / "cache" / key
    cache.mkdir(parents=True)
    (cache / "huggingface_hub-9.9.9-py3-none-any.whl").write_bytes(b"PK")
    (cache / ".complete").write_text("{}")

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the cache is complete")

    monkeypatch.setattr(wheels, "_download", no_pip)
    wheels.prepare(tmp_path / "hub", version="9.9.9", cache_root=tmp_path / "cache")
    assert (tmp_path / "hub" / "wheels" / "huggingface_hub-9.9.9-py3-none-any.whl").read_bytes() == b"PK"
