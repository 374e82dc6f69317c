"""The callback sparkfleet.cluster.payloads (ansible.cfg enables it): a run keeps the module payloads it
built, the next run with the same code takes them instead of building them, and a change to a module or
module_utils file makes another key (an empty directory: built again)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.sparkfleet.cluster.plugins.callback import payloads

ROOT = Path(__file__).resolve().parents[2]
PB = ROOT / "tests/unit/playbooks"


def run(store: Path, tmp: Path) -> str:
    """payloads.yml with ANSIBLE_DEBUG (ansible-core then says, per task, whether it built a payload or took
    the cached one); its output."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "SPARKFLEET_PAYLOAD_CACHE": str(store),
        "ANSIBLE_DEBUG": "1",
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(PB / "inventory/local.yml"),
         "-e", f"sysfs_root={tmp / 'sys'}", str(PB / "payloads.yml")],
        env=env, capture_output=True, text=True, cwd=ROOT, check=False, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_the_next_run_takes_the_payloads_the_first_built(tmp_path: Path) -> None:
    store = tmp_path / "payloads"
    first = run(store, tmp_path)
    assert first.count("ANSIBALLZ: Creating module") == 2, "the first run builds both payloads"
    (key,) = store.iterdir()
    assert (key.stat().st_mode & 0o777, store.stat().st_mode & 0o777) == (0o700, 0o700)
    kept = sorted(p.name.split("-")[0] for p in key.iterdir() if p.name != payloads.MARK)
    ours = "ansible_collections.sparkfleet.cluster.plugins.modules.rdma_facts"
    assert kept == ["ansible.modules.ping", ours]
    second = run(store, tmp_path)
    assert "ANSIBALLZ: Creating module" not in second
    assert second.count("ANSIBALLZ: using cached module") == 2


def test_a_store_others_can_write_is_not_used(tmp_path: Path) -> None:
    store = tmp_path / "payloads"
    store.mkdir()
    store.chmod(0o777)
    out = run(store, tmp_path)
    assert out.count("ANSIBALLZ: Creating module") == 2
    assert list(store.iterdir()) == []


def collection(root: Path, text: str) -> Path:
    utils = root / "ansible_collections/ns/coll/plugins/module_utils"
    utils.mkdir(parents=True, exist_ok=True)
    (utils / "helper.py").write_text(text)
    (root / "ansible_collections/ns/coll/README.md").write_text("not code: not in the key")
    return utils / "helper.py"


def test_the_key_follows_every_module_and_module_utils_file(tmp_path: Path) -> None:
    helper = collection(tmp_path / "coll", "A = 1\n")
    utils = tmp_path / "module_utils"  # a module_utils directory outside ansible-core and the collections
    utils.mkdir()
    (utils / "mine.py").write_text("B = 1\n")
    roots, dirs = [str(tmp_path / "coll")], [str(utils)]
    key = payloads.cache_key(roots, dirs)
    assert payloads.cache_key(roots, dirs) == key
    (tmp_path / "coll/ansible_collections/ns/coll/README.md").write_text("changed, still not code")
    assert payloads.cache_key(roots, dirs) == key
    keys = {key}
    helper.write_text("A = 2\n")
    keys.add(payloads.cache_key(roots, dirs))
    module = tmp_path / "coll/ansible_collections/ns/coll/plugins/modules/new.py"
    module.parent.mkdir()
    module.write_text("")
    keys.add(payloads.cache_key(roots, dirs))
    (utils / "mine.py").write_text("B = 2\n")
    keys.add(payloads.cache_key(roots, dirs))
    assert len(keys) == 4, "each change makes another key"


def test_the_module_utils_path_outside_ansible_core_is_in_the_key(tmp_path: Path, monkeypatch) -> None:
    """ansible-core's own module_utils (its version is in the key) is left out of the search path the key
    hashes; a directory on it, as Ansible adds one beside a playbook or in a role, is in."""
    import ansible

    core = str(Path(ansible.__file__).resolve().parent / "module_utils")
    search = f"{tmp_path}:/nonexistent:{core}"
    monkeypatch.setattr(payloads.module_utils_loader, "print_paths", lambda: search)
    assert payloads._module_utils_dirs() == [str(tmp_path)]


def test_save_keeps_whole_payloads_only_and_the_newest_keys(tmp_path: Path) -> None:
    run_cache = tmp_path / "run"
    run_cache.mkdir()
    names = (
        "m1-ZIP_DEFLATED-none",
        "m1-ZIP_DEFLATED-none.lock",
        "m2-ZIP_DEFLATED-none-part",
        "ansible.legacy.mine-ZIP_DEFLATED-none",
    )  # the last: a library/ module, by name only
    for name in names:
        (run_cache / name).write_text(name)
    root = tmp_path / "store"
    for i in range(payloads.KEEP + 1):  # key directories earlier runs made, oldest first
        old = root / f"{i:016x}"
        old.mkdir(parents=True)
        (old / payloads.MARK).touch()
        os.utime(old, (1000 + i, 1000 + i))
    mine = root / "0123456789abcdef"  # a key-like name, but not made by the plugin (no mark)
    mine.mkdir()
    os.utime(mine, (1, 1))
    (root / "photos").mkdir()  # and a directory of the admin's own in a cache directory they chose
    os.utime(root / "photos", (1, 1))
    store = root / "fedcba9876543210"
    assert payloads.save(store, run_cache) == 1
    assert [p.name for p in store.iterdir() if p.name != payloads.MARK] == ["m1-ZIP_DEFLATED-none"]
    assert payloads.save(store, run_cache) == 0
    left = sorted(p.name for p in root.iterdir())
    keys = [f"{i:016x}" for i in (2, 3, 4)]
    assert left == sorted(["0123456789abcdef", "photos", "fedcba9876543210", *keys])
    into = tmp_path / "next-run"
    assert payloads.load(store, into) == 1
    assert (into / "m1-ZIP_DEFLATED-none").read_text() == "m1-ZIP_DEFLATED-none"


@pytest.mark.parametrize("mode", [0o770, 0o707])
def test_private_means_this_users_and_not_writable_by_others(tmp_path: Path, mode: int) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    assert payloads._private(d)
    d.chmod(mode)
    assert not payloads._private(d)
    link = tmp_path / "link"
    d.chmod(0o700)
    link.symlink_to(d)
    assert not payloads._private(link)
