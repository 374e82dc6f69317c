"""A role changes the owner or mode only of what it made, and replaces only files that are its own (issue 21):
the API key's and the credentials file's directories, the credentials file, the swapfile."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_engine_modules import run_module  # a module file run as Ansible runs it

ROOT = Path(__file__).resolve().parents[2]


def me() -> dict:
    import grp
    import pwd

    return {"owner": pwd.getpwuid(os.getuid()).pw_name, "group": grp.getgrgid(os.getgid()).gr_name}


def test_the_key_and_credentials_go_into_existing_directories_without_changing_them(tmp_path):
    home = tmp_path / "home" / "admin"  # someone's home: 0755, must stay so
    home.mkdir(parents=True)
    home.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o751)
    ids = me()
    args = {"path": str(state / "keys"), **ids, "credentials_file": str(home / "credentials.env"),
            "credentials_owner": ids["owner"], "credentials_group": ids["group"]}  # fmt: skip
    out = run_module("engine_api_key", args)
    assert out["changed"] and out["generated"], out
    assert state.stat().st_mode & 0o7777 == 0o751 and home.stat().st_mode & 0o7777 == 0o755
    assert (state / "keys").stat().st_mode & 0o777 == 0o600
    assert (home / "credentials.env").stat().st_mode & 0o777 == 0o600
    assert not run_module("engine_api_key", args)["changed"]
    # directories it makes are its own: 0700
    deep = dict(args, credentials_file=str(home / "ds1017" / "api" / "credentials.env"))
    assert run_module("engine_api_key", deep)["changed"]
    for made in (home / "ds1017", home / "ds1017" / "api"):
        assert made.stat().st_mode & 0o7777 == 0o700
    assert home.stat().st_mode & 0o7777 == 0o755


def test_a_credentials_file_sparkfleet_did_not_write_is_never_replaced(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my own notes\n")
    notes.chmod(0o644)
    ids = me()
    args = {"path": str(tmp_path / "api" / "keys"), **ids, "credentials_file": str(notes),
            "credentials_owner": ids["owner"], "credentials_group": ids["group"]}  # fmt: skip
    for check_mode in (True, False):
        out = run_module("engine_api_key", args, check_mode=check_mode)
        assert (
            out.get("failed") and "was not written by sparkfleet" in out["msg"] and str(notes) in out["msg"]
        )
    assert notes.read_text() == "my own notes\n" and notes.stat().st_mode & 0o777 == 0o644


needs_mkswap = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v mkswap"], capture_output=True, check=False).returncode != 0,
    reason="mkswap (util-linux) not installed",
)


def swapfile(tmp_path: Path, **args) -> dict:
    swaps = tmp_path / "swaps"
    swaps.write_text("Filename\tType\tSize\tUsed\tPriority\n")
    return run_module("swapfile", {"proc_swaps": str(swaps), "activate": False, "size_mib": 1, **args})


@pytest.mark.parametrize("check_mode", [True, False])
def test_a_file_that_is_not_a_swap_file_is_never_replaced(tmp_path, check_mode):
    theirs = tmp_path / "data.img"
    theirs.write_bytes(b"someone's data\n" * 100)
    out = swapfile(tmp_path, path=str(theirs), page_size=4096, _ansible_check_mode=check_mode)
    assert out.get("failed") and "is not a swap file" in out["msg"] and "host_tuning_swapfile" in out["msg"]
    assert theirs.read_bytes() == b"someone's data\n" * 100
    folder = tmp_path / "dir"
    folder.mkdir()
    out = swapfile(tmp_path, path=str(folder), page_size=4096)
    assert out.get("failed") and "is not a regular file" in out["msg"] and folder.is_dir()


@needs_mkswap
def test_a_swap_file_of_another_page_size_is_still_remade(tmp_path):
    path = tmp_path / "swap.sparkfleet"
    assert swapfile(tmp_path, path=str(path), page_size=4096)["created"]
    again = swapfile(tmp_path, path=str(path), page_size=65536)
    assert again["created"] and path.read_bytes()[65536 - 10 : 65536] == b"SWAPSPACE2"
