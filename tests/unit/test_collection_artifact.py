"""The collection artifact: `ansible-galaxy collection build` gives a tarball without the lab, the product's
Python package, tests or local state; installed into an empty collections path, a playbook outside the
repository uses a module, a filter and a role of sparkfleet.cluster by FQCN (on localhost: no remote host).
And from the checkout, site.yml passes --syntax-check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
# what the artifact must never carry (top-level names; the lab's keys live under .lab)
LEFT_OUT = {
    ".lab", ".venv", ".cache", ".collections", ".config", ".pytest_cache", ".ruff_cache", "artifacts",
    "lab", "python", "tests", "molecule", "bench", "scripts", "requirements", "Makefile", "ansible.cfg",
}  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a user outside this repository: no checkout on PYTHONPATH, no ANSIBLE_* of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("build")
    run(
        [str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(out), str(ROOT)],
        ROOT,
        clean_env(),
    )
    (tarball,) = out.glob("*.tar.gz")
    assert tarball.name == f"{GALAXY['namespace']}-{GALAXY['name']}-{GALAXY['version']}.tar.gz"
    return tarball


def test_artifact_holds_the_collection_and_nothing_local(artifact):
    with tarfile.open(artifact) as tar:
        names = tar.getnames()
    top = {n.split("/", 1)[0] for n in names}
    assert not top & LEFT_OUT, sorted(top & LEFT_OUT)
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", "id_ed25519", ".partial"))]
    for path in ROOT.glob("plugins/*/*.py"):
        assert str(path.relative_to(ROOT)) in names
    for role in (ROOT / "roles").iterdir():
        assert f"roles/{role.name}/tasks/main.yml" in names
        assert f"roles/{role.name}/meta/argument_specs.yml" in names
    assert {"MANIFEST.json", "FILES.json", "meta/runtime.yml", "README.md", "site.yml"} <= set(names)
    assert {f"playbooks/{p.name}" for p in (ROOT / "playbooks").glob("*.yml")} <= set(names)
    # what the roles' messages and READMEs cite (docs/recipes.md, style.md, design.md) travels with them
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= set(names)


PLAYBOOK = """\
- name: A cluster plan, a filter and a module of the installed collection
  hosts: cluster
  gather_facts: false
  roles:
    - role: sparkfleet.cluster.cluster_plan
  tasks:
    - name: Read this node (a module with module_utils, by FQCN)
      sparkfleet.cluster.preflight_facts:
        weights_path: "{{ weights_path }}"
        gpu_clock_state_file: "{{ weights_path }}/gpu.conf"
        docker: no-docker-here
        nvidia_smi: no-nvidia-smi-here
      register: node

    - name: Check what the role, the filter and the module gave
      ansible.builtin.assert:
        that:
          - sparkfleet_plan.head == 'spark1'
          - sparkfleet_plan.ranks.spark2 == 1
          - (sparkfleet_plan | sparkfleet.cluster.fabric_peers(inventory_hostname)) | length == 1
          - ('f' * 40) | sparkfleet.cluster.short_commit == 'ffffffffffff'
          - node.settings.gpu_clock_cap == '2300'
          - node.disk.measured_at == weights_path
          - not node.docker.ok
"""
INVENTORY = {
    "all": {
        "vars": {
            "sparkfleet_topology": "tp2",
            "ansible_connection": "local",
            "ansible_user": "admin",  # sparkfleet_admin_user: no fallback to root or the controller's user
            "sparkfleet_pins": {  # required by the role sparkfleet's spec
                "model": {"repo": "LibertAIDAI/DeepSeek-V4.1-Flash-1017-EXL3-2.9bpw", "revision": "f" * 40},
                "engram": {"repo": "deepseek-ai/DeepSeek-V4.1-Flash-1017", "revision": "f" * 40},
                "engine": {"repo": "https://github.com/Elevatormusic/TensorFold.git", "commit": "f" * 40},
                "base_image": {"name": "nvcr.io/nvidia/pytorch", "digest": "sha256:" + "a" * 64},
                "hf_client": {"huggingface_hub": "2.4.0"},
            },
        },
        "children": {
            "cluster": {
                "children": {
                    "head": {"hosts": {"spark1": {"sparkfleet_node": 1, "ansible_host": "127.0.0.11"}}},
                    "workers": {"hosts": {"spark2": {"sparkfleet_node": 2, "ansible_host": "127.0.0.12"}}},
                }
            }
        },
    }
}


def test_a_playbook_outside_the_repository_uses_the_installed_collection(artifact, tmp_path):
    collections = tmp_path / "collections"
    project = tmp_path / "project"
    weights = tmp_path / "weights"
    project.mkdir()
    weights.mkdir()
    (weights / "gpu.conf").write_text("GPU_CLOCK_CAP_MHZ=2300\n")
    env = clean_env(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1")
    galaxy = str(BIN / "ansible-galaxy")
    run([galaxy, "collection", "install", "--no-deps", "-p", str(collections), str(artifact)], project, env)
    listed = run([galaxy, "collection", "list", "sparkfleet.cluster", "--format", "json"], project, env)
    listed = json.loads(listed.stdout)
    assert list(listed) == [str(collections / "ansible_collections")], listed  # the installed copy, only

    (project / "site.yml").write_text(PLAYBOOK)
    (project / "hosts.yml").write_text(yaml.safe_dump(INVENTORY))
    proc = run([str(BIN / "ansible-playbook"), "-i", "hosts.yml", "site.yml", "-e", f"weights_path={weights}",
                "-e", f"ansible_python_interpreter={sys.executable}"], project, env)  # fmt: skip
    assert "failed=0" in proc.stdout and "ok=" in proc.stdout
    # the collection's own playbooks resolve their roles from the installed copy too
    run([str(BIN / "ansible-playbook"), "-i", "hosts.yml", "sparkfleet.cluster.status", "--syntax-check"],
        project, env)  # fmt: skip


def test_site_yml_syntax_check_from_the_checkout():
    env = clean_env(ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    run([str(BIN / "ansible-playbook"), "site.yml", "-i", "inventory/tp3", "--syntax-check"], ROOT, env)
