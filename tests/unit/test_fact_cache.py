"""The cache plugin sparkfleet.cluster.facts (ansible.cfg's fact cache): files, expiry, how Ansible loads it,
and a real ansible-playbook run that caches facts in one run and reads them in the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loader(monkeypatch, tmp_path):
    import layer1  # Ansible's collection loader, installed as ansible-playbook installs it

    layer1._load_plugins()
    from ansible.plugins.loader import cache_loader

    monkeypatch.setenv("ANSIBLE_CACHE_PLUGIN_CONNECTION", str(tmp_path / "facts"))
    return cache_loader


def test_the_loader_hands_it_out_unwrapped_and_jsonfile_wrapped(loader):
    ours = loader.get("sparkfleet.cluster.facts")
    assert type(ours).__module__.endswith("sparkfleet.cluster.plugins.cache.facts"), type(ours)
    theirs = loader.get("ansible.builtin.jsonfile")
    # ansible-core's interposer (the per-read decode this plugin avoids) wraps the builtin one
    assert type(theirs).__name__ == "PluginInterposer", type(theirs)


def test_facts_are_plain_json_files_per_host_and_read_back(loader, tmp_path):
    cache = loader.get("sparkfleet.cluster.facts")
    facts = {"ansible_hostname": "spark1", "ansible_interfaces": ["enP7s7", "enp1s0f0np0"], "n": 3}
    cache.set("spark1", facts)
    on_disk = json.loads((tmp_path / "facts/spark1").read_text())
    assert on_disk == facts
    again = loader.get("sparkfleet.cluster.facts")  # a new run: read from the file
    assert again.get("spark1") == facts
    assert again.contains("spark1") and not again.contains("spark2")
    with pytest.raises(KeyError):
        again.get("spark2")
    again.delete("spark1")  # meta: clear_facts
    assert not (tmp_path / "facts/spark1").exists()


def test_expired_facts_are_not_read(loader, tmp_path, monkeypatch):
    cache = loader.get("sparkfleet.cluster.facts")
    cache.set("spark1", {"a": 1})
    old = time.time() - 90000  # older than fact_caching_timeout (86400)
    os.utime(tmp_path / "facts/spark1", (old, old))
    with pytest.raises(KeyError):
        loader.get("sparkfleet.cluster.facts").get("spark1")


def test_a_real_run_caches_facts_and_the_next_run_reads_them(tmp_path):
    """ansible.cfg's settings (smart gathering, this cache, facts only under ansible_facts): run 1 gathers and
    caches, run 2 (a play with gather_facts false) still sees the facts, from the file this plugin wrote."""
    book = tmp_path / "facts.yml"
    book.write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: true\n  gather_subset: [min]\n  tasks:\n"
        "    - ansible.builtin.set_fact:\n        mine: 42\n        cacheable: true\n"
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        "        msg: 'kernel={{ ansible_facts.kernel }} mine={{ ansible_facts.mine }}'\n"
    )
    second = tmp_path / "second.yml"
    second.write_text(  # and not also as top-level variables (inject_facts_as_vars off)
        "- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.debug:\n"
        "        msg: 'kernel={{ ansible_facts.kernel }} mine={{ ansible_facts.mine }}'\n"
        "    - ansible.builtin.debug:\n"
        "        msg: 'top-level={{ mine is defined or ansible_kernel is defined }}'\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "ANSIBLE_STRATEGY": "linear",
    }
    exe = str(Path(sys.executable).parent / "ansible-playbook")
    for path in (book, second):
        proc = subprocess.run(
            [exe, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}", str(path)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert f"kernel={os.uname().release} mine=42" in proc.stdout
    assert "top-level=False" in proc.stdout
    assert json.loads((tmp_path / "facts/localhost").read_text())["mine"] == 42
