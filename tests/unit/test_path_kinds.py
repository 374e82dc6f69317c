"""The path kinds of module_utils/input_kinds.py (issue 21): every path an admin sets is absolute, written
plainly, and never a system directory nor, for a role's own directories and files, inside a system tree."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "input_kinds_paths", ROOT / "plugins/module_utils/input_kinds.py"
)
kinds = importlib.util.module_from_spec(_spec)
sys.modules["input_kinds_paths"] = kinds
_spec.loader.exec_module(kinds)


def check(kind: str, value, **rule):
    return kinds.check_kind(value, {"kind": kind, **rule})


@pytest.mark.parametrize(
    "value",
    [
        "/srv/sparkfleet/models",
        "/var/lib/sparkfleet",
        "/opt/sparkfleet/hf-client",
        "/home/admin/models",
        "/mnt/nvme0/models",
        "/data",
        "/var/lib/sparkfleet/engine/prompt-disk",
    ],
)
def test_a_directory_of_its_own_is_accepted(value):
    assert check("data_dir", value) is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("/", "not the system directory /"),
        ("/etc", "not the system directory /etc"),
        ("/usr", "not the system directory /usr"),
        ("/usr/local", "not the system directory /usr/local"),
        ("/var", "not the system directory /var"),
        ("/var/lib", "not the system directory /var/lib"),
        ("/home", "not the system directory /home"),
        ("/opt", "not the system directory /opt"),
        ("/srv", "not the system directory /srv"),
        ("/mnt", "not the system directory /mnt"),
        ("/tmp", "not the system directory /tmp"),
        ("/home/admin", "not the home directory /home/admin"),
        ("/etc/sparkfleet", "outside /etc (a system tree"),
        ("/usr/local/models", "outside /usr (a system tree"),
        ("/boot/cache", "outside /boot (a system tree"),
        ("/var/lib/dpkg/x", "outside /var/lib/dpkg"),
        ("/var/lib/docker/x", "outside /var/lib/docker"),
        ("/proc/1", "outside /proc"),
        ("/sys/fs/x", "outside /sys"),
        ("/dev/shm/x", "outside /dev"),
        ("/run/x", "outside /run"),
        ("/root/models", "outside /root"),
        ("/tmp/models", "outside /tmp"),
    ],
)
def test_a_system_directory_or_one_inside_a_system_tree_is_refused(value, said):
    want = check("data_dir", value)
    assert want and said in want, want
    assert want.startswith("a directory")


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        ("/srv/sparkfleet/models/", "/srv/sparkfleet/models"),
        ("/srv//models", "/srv/models"),
        ("//srv/models", "/srv/models"),
        ("/srv/./models", "/srv/models"),
        ("/srv/sparkfleet/../models", "/srv/models"),
    ],
)
def test_a_path_not_written_plainly_is_refused_with_its_plain_form(value, plain):
    for kind in ("abs_path", "data_dir", "data_file"):
        want = check(kind, value)
        assert want == f"the path written plainly: {plain!r} (no '.', '..', '//' or trailing '/')", want


def test_dotdot_into_a_system_directory_names_both():
    want = check("data_dir", "/srv/../etc")
    assert "not the system directory /etc" in want and "'/srv/../etc' written plainly is '/etc'" in want
    want = check("data_dir", "/srv/models/../../boot/x")
    assert "outside /boot" in want


@pytest.mark.parametrize("value", ["models", "~/models", "", " /srv/x", "/srv/x\n", 5, None, ["/srv"]])
def test_not_an_absolute_path(value):
    assert check("data_dir", value) == "an absolute path (starting with /)"


def test_files_of_a_role_and_where_they_may_live():
    assert check("data_file", "/swap.sparkfleet") is None
    assert check("data_file", "/var/lib/sparkfleet/weights.json") is None
    assert "outside /etc" in check("data_file", "/etc/passwd")
    assert "outside /boot" in check("data_file", "/boot/swap")
    assert "not the system directory /etc" in check("data_file", "/etc")
    # a drop-in belongs in its system directory: `allow` names it (and only it)
    sysctl = {"allow": ["/etc/sysctl.d"], "pattern": r"^/etc/sysctl\.d/[^/]+\.conf$"}
    assert check("data_file", "/etc/sysctl.d/60-sparkfleet.conf", **sysctl) is None
    assert "outside /etc" in check("data_file", "/etc/sysctl.conf", **sysctl)
    assert "matching" in check("data_file", "/srv/x.conf", **sysctl)
    assert check("data_dir", "/run/sparkfleet/clocks", allow="/run/sparkfleet") is None
    assert "outside /run" in check("data_dir", "/run/systemd", allow="/run/sparkfleet")
    assert "not the system directory /run" in check("data_dir", "/run", allow="/run/sparkfleet")


def test_any_absolute_path_may_be_a_system_one_when_only_read():
    assert check("abs_path", "/usr/bin/docker") is None
    assert check("abs_path", "/sys") is None
    assert (
        check("abs_path", "/sys/") == "the path written plainly: '/sys' (no '.', '..', '//' or trailing '/')"
    )


def test_an_engine_cache_on_a_system_path_is_refused_naming_the_entry():
    from ansible_collections.sparkfleet.cluster.plugins.filter import engine

    ok = {"name": "spill", "nodes": "head", "size_gib": 1, "path": "/var/lib/sparkfleet/engine/spill",
          "mount": "/cache/spill", "dir_arg": "--snapshot-dir"}  # fmt: skip
    assert engine.cache_problems([ok]) == []
    for path, said in (
        ("/boot/spill", "outside /boot"),
        ("/var", "system directory /var"),
        ("/srv/x/", "'/srv/x'"),
    ):
        out = engine.cache_problems([{**ok, "path": path}])
        assert len(out) == 1 and out[0].startswith(
            f"engine_service_caches[0] (spill): path={path!r}: expected "
        )
        assert said in out[0], out
    out = engine.cache_problems([{**ok, "mount": "cache"}])
    assert out == [
        "engine_service_caches[0] (spill): mount='cache': expected an absolute path (starting with /)"
    ]
