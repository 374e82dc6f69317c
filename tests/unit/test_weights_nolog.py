"""HF_TOKEN never reaches Ansible's output, even at -vvv, on success and on failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_weights_support import ROOT, start_hub

pytest.importorskip("huggingface_hub")
TOKEN = "hf_sparkfleetTestToken0123456789"  # noqa: S105 - a test value for the stand-in hub


@pytest.fixture
def hub(tmp_path):
    h = start_hub(tmp_path / "hub", "tp2", 4)
    h.settings(private=[h.pins["model"]["repo"]], tokens=[TOKEN])
    yield h
    h.close()


def play(tmp_path: Path, hub, token_env: str | None) -> subprocess.CompletedProcess:
    playbook = [
        {
            "name": "resolve with a token",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable},
            "tasks": [
                {
                    "name": "Resolve",
                    "sparkfleet.cluster.weights_fetch": {
                        "mode": "resolve",
                        "endpoint": hub.endpoint,
                        "token": "{{ lookup('ansible.builtin.env', 'HF_TOKEN') }}",
                        "repos": hub.repos(engram=False),
                        "weights_path": str(tmp_path / "w"),
                    },
                }
            ],
        }
    ]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(playbook))
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        ANSIBLE_FACT_CACHING="memory",
    )
    env.pop("HF_TOKEN", None)
    if token_env is not None:
        env["HF_TOKEN"] = token_env
    return subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-vvv", "-i", "localhost,", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_the_token_works_and_is_not_printed(tmp_path, hub):
    out = play(tmp_path, hub, TOKEN)
    assert out.returncode == 0, out.stdout[-2000:]
    assert TOKEN not in out.stdout + out.stderr
    assert hub.pins["model"]["revision"] in out.stdout  # the result itself is shown


def test_a_refused_token_fails_clearly_and_is_not_printed(tmp_path, hub):
    wrong = TOKEN[:-1] + "X"
    out = play(tmp_path, hub, wrong)
    assert out.returncode != 0
    assert "401" in out.stdout and "HF_TOKEN" in out.stdout
    assert wrong not in out.stdout + out.stderr
