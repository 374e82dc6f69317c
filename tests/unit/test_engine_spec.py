"""engine_service's container-as-data logic, the status table, and the roles' argument specs."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.filter import engine as spec_mod

ROOT = Path(__file__).resolve().parents[2]

# The shape role cluster_plan produces (docs/CONTRACTS.md), for a TP3 ring.
PLAN = {
    "topology": "tp3",
    "size": 3,
    "head": "spark1",
    "ranks": {"spark1": 0, "spark2": 1, "spark3": 2},
    "hosts_by_rank": ["spark1", "spark2", "spark3"],
    "master_addr": "192.168.1.11",
    "interfaces": {
        "spark1": [
            {
                "netdev": "enp1s0f0np0",
                "address": "10.12.1.1",
                "peer_host": "spark2",
                "peer_address": "10.12.1.2",
                "rail": 1,
            },
            {
                "netdev": "enP2p1s0f0np0",
                "address": "10.12.2.1",
                "peer_host": "spark2",
                "peer_address": "10.12.2.2",
                "rail": 2,
            },
            {
                "netdev": "enP2p1s0f1np1",
                "address": "10.13.2.1",
                "peer_host": "spark3",
                "peer_address": "10.13.2.3",
                "rail": 2,
            },
            {
                "netdev": "enp1s0f1np1",
                "address": "10.13.1.1",
                "peer_host": "spark3",
                "peer_address": "10.13.1.3",
                "rail": 1,
            },
        ],
        "spark2": [
            {
                "netdev": "enp1s0f1np1",
                "address": "10.12.1.2",
                "peer_host": "spark1",
                "peer_address": "10.12.1.1",
                "rail": 1,
            },
            {
                "netdev": "enp1s0f0np0",
                "address": "10.23.1.2",
                "peer_host": "spark3",
                "peer_address": "10.23.1.3",
                "rail": 1,
            },
        ],
        "spark3": [
            {
                "netdev": "enp1s0f0np0",
                "address": "10.13.1.3",
                "peer_host": "spark1",
                "peer_address": "10.13.1.1",
                "rail": 1,
            },
        ],
    },
}
COMMIT = "io.sparkfleet.engine.commit"
NCCL = {"NCCL_SOCKET_IFNAME": "enP7s7", "NCCL_IB_HCA": "rocep1s0f0,roceP2p1s0f0", "NCCL_CROSS_NIC": "1"}


def settings(host: str = "spark1", **over) -> dict:
    base = {
        "host": host,
        "plan": PLAN,
        "nccl_env": NCCL,
        "name": "sparkfleet-engine",
        "image": "sparkfleet/engine:" + "a" * 40,
        "image_id": "sha256:" + "1" * 64,
        "command": ["tensorfold", "serve"],
        "weights_dir": "/srv/sparkfleet/models/snapshot",
        "rank_file": "",
        "chat_template": "",
        "master_port": 29500,
        "data_port": 29600,
        "api": {
            "host": "127.0.0.1",
            "port": 18002,
            "served_model_name": "deepseek-v4.1-flash",
            "key_required": True,
            "key_file": "/var/lib/sparkfleet/engine/api/keys",
            "key_mount": "/etc/tensorfold/api-keys",
        },
        "api_args": {"--default-top-k": 20, "--default-thinking": True, "--default-temperature": None},
        "rank_args": {"--max-model-len": 1048576, "--max-num-seqs": 16, "--kv-pool-tokens": None},
        "caches": [
            {
                "name": "spill",
                "nodes": "head",
                "size_gib": 256,
                "path": "/var/lib/sf/spill",
                "mount": "/cache/spill",
                "dir_arg": "--spill-dir",
                "size_arg": "--spill-gib",
            },
        ],
        "gpus": "auto",
        "node_has_gpu_runtime": True,
        "devices": ["/dev/infiniband"],
        "node_devices": ["/dev/infiniband"],
        "node_memlock_hard": -1,
    }
    base.update(over)
    return base


def opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_rank0_command_has_the_spec_shape():
    spec = spec_mod.engine_spec(settings())
    cmd = spec["command"]
    assert cmd[:3] == ["tensorfold", "serve", "/srv/sparkfleet/models/snapshot"]
    assert opt(cmd, "--tp") == "3" and opt(cmd, "--rank") == "0"
    assert opt(cmd, "--master") == "192.168.1.11"  # the management address, never a fabric one
    assert opt(cmd, "--master-port") == "29500"
    assert opt(cmd, "--host") == "127.0.0.1" and opt(cmd, "--port") == "18002"
    assert opt(cmd, "--served-model-name") == "deepseek-v4.1-flash"
    assert opt(cmd, "--api-key-file") == "/etc/tensorfold/api-keys"
    assert opt(cmd, "--default-thinking") == "on" and opt(cmd, "--default-top-k") == "20"
    assert "--default-temperature" not in cmd and "--kv-pool-tokens" not in cmd  # None = left out
    assert opt(cmd, "--spill-dir") == "/cache/spill" and opt(cmd, "--spill-gib") == "256"


def test_workers_get_no_api_flags_and_no_head_only_cache():
    spec = spec_mod.engine_spec(settings("spark3"))
    cmd = spec["command"]
    assert opt(cmd, "--rank") == "2"
    for flag in (
        "--host",
        "--port",
        "--served-model-name",
        "--api-key-file",
        "--spill-dir",
        "--default-top-k",
    ):
        assert flag not in cmd
    assert opt(cmd, "--max-num-seqs") == "16"  # rank arguments agree on every rank
    assert not any("api-keys" in a for a in spec["docker_args"])


def test_docker_run_has_every_flag_of_the_spec():
    run = spec_mod.engine_spec(settings())["docker_args"]
    text = " ".join(run)
    for part in (
        "--init",
        "--restart no",
        "--oom-score-adj 1000",
        "--gpus all",
        "--network host",
        "--ipc host",
        "--device /dev/infiniband",
        "--cap-add IPC_LOCK",
        "--ulimit memlock=-1:-1",
        "--ulimit stack=67108864",
        "--shm-size 10g",
        "--log-opt max-size=100m",
        "--env-file /etc/sparkfleet/engine.env",
        "--label io.sparkfleet.engine.managed=true",
        "--volume /srv/sparkfleet/models/snapshot:/srv/sparkfleet/models/snapshot:ro",
        "--volume /var/lib/sparkfleet/engine/api/keys:/etc/tensorfold/api-keys:ro",
        "--volume /var/lib/sf/spill:/cache/spill:rw",
    ):
        assert part in text, part
    assert run[:3] == ["run", "--name", "sparkfleet-engine"]


def test_hardware_the_node_lacks_is_left_out_and_said():
    spec = spec_mod.engine_spec(
        settings(node_has_gpu_runtime=False, node_devices=[], node_memlock_hard=8388608)
    )
    text = " ".join(spec["docker_args"])
    assert "--gpus" not in text and "--device" not in text
    assert "--ulimit memlock=8388608:8388608" in text
    assert len(spec["omitted"]) == 3
    assert any("NVIDIA container runtime" in o for o in spec["omitted"])
    assert any("/dev/infiniband" in o for o in spec["omitted"])
    assert any("memlock" in o and "8388608" in o for o in spec["omitted"])
    forced = spec_mod.engine_spec(settings(gpus=True, node_has_gpu_runtime=False))
    assert "--gpus all" in " ".join(forced["docker_args"]) and not any(
        "--gpus" in o for o in forced["omitted"]
    )
    off = spec_mod.engine_spec(settings(gpus=False))
    assert "--gpus" not in " ".join(off["docker_args"]) and not off["omitted"]


def test_environment_has_nccl_master_and_the_fabric():
    env = spec_mod.engine_spec(settings())["env"]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["MASTER_ADDR"] == "192.168.1.11" and env["MASTER_PORT"] == "29500"
    assert env["NCCL_IB_HCA"] == NCCL["NCCL_IB_HCA"]
    fabric = json.loads(env["SPARKFLEET_FABRIC"])
    # rank 0 reaches each worker on rail 1 of their direct cable
    assert fabric == {
        "port": 29600,
        "peers": {
            "1": {"local": "10.12.1.1", "peer": "10.12.1.2"},
            "2": {"local": "10.13.1.1", "peer": "10.13.1.3"},
        },
    }
    worker = json.loads(spec_mod.engine_spec(settings("spark3"))["env"]["SPARKFLEET_FABRIC"])
    assert worker["peers"] == {"0": {"local": "10.13.1.3", "peer": "10.13.1.1"}}


def test_missing_nccl_env_and_links_fail_clearly():
    with pytest.raises(spec_mod.SpecError, match="network_links_nccl_env is not set for spark2"):
        spec_mod.engine_spec(settings("spark2", nccl_env=None))
    plan = copy.deepcopy(PLAN)
    plan["interfaces"]["spark3"] = []
    with pytest.raises(spec_mod.SpecError, match="no fabric link between spark3 and spark1"):
        spec_mod.engine_spec(settings("spark3", plan=plan))


@pytest.mark.parametrize("key", ["HF_TOKEN", "SPARK_API_KEY", "DB_PASSWORD"])
def test_secrets_never_enter_the_environment(key):
    with pytest.raises(spec_mod.SpecError, match="secret"):
        spec_mod.engine_spec(settings(extra_env={key: "x"}))


def test_non_loopback_api_needs_a_key():
    api = {**settings()["api"], "host": "0.0.0.0", "key_required": False}  # noqa: S104 - data, nothing binds
    with pytest.raises(spec_mod.SpecError, match="key is required off loopback"):
        spec_mod.engine_spec(settings(api=api))
    api["key_required"] = True
    assert "--api-key-file" in spec_mod.engine_spec(settings(api=api))["command"]


def test_digest_is_stable_and_moves_with_every_input():
    base = spec_mod.engine_spec(settings())["digest"]
    assert spec_mod.engine_spec(settings())["digest"] == base
    changes = [
        {"image_id": "sha256:" + "2" * 64},  # a rebuilt image, same tag
        {"rank_args": {"--max-model-len": 1048576, "--max-num-seqs": 8}},
        {"nccl_env": {**NCCL, "NCCL_IB_GID_INDEX": "3"}},
        {"node_devices": []},
        {"extra_args": ["--x"]},
        {"chat_template": "/srv/sparkfleet/models/chat_template/chat_template.jinja"},
    ]
    digests = {spec_mod.engine_spec(settings(**c))["digest"] for c in changes}
    assert base not in digests and len(digests) == len(changes)


def test_the_digest_is_a_label_of_the_container():
    spec = spec_mod.engine_spec(settings())
    assert spec["labels"][spec_mod.SETTINGS_LABEL] == spec["digest"]
    assert spec["docker_args"][-2:] == ["--label", f"{spec_mod.SETTINGS_LABEL}={spec['digest']}"]


def test_rank_file_and_chat_template_are_mounted_read_only():
    spec = spec_mod.engine_spec(
        settings("spark2", rank_file="/m/rank/rank1.safetensors", chat_template="/m/ct.jinja")
    )
    assert opt(spec["command"], "--rank-file") == "/m/rank/rank1.safetensors"
    assert opt(spec["command"], "--chat-template") == "/m/ct.jinja"
    assert "/m/rank/rank1.safetensors:/m/rank/rank1.safetensors:ro" in spec["docker_args"]


def test_caches_per_node():
    caches = [{"name": "a", "nodes": "all"}, {"name": "b", "nodes": "head"}, {"name": "c"}]
    assert [c["name"] for c in spec_mod.engine_caches(caches, True)] == ["a", "b", "c"]
    assert [c["name"] for c in spec_mod.engine_caches(caches, False)] == ["a", "c"]
    bad = settings(caches=[{**settings()["caches"][0], "nodes": "workers"}])
    with pytest.raises(spec_mod.SpecError, match="nodes must be all or head"):
        spec_mod.engine_spec(bad)


def test_systemd_exec_round_trips_through_a_shell_like_split():
    args = ["/usr/bin/docker", "run", "--label", "a=b c", 'x"y', "50%", "$HOME", r"back\slash", '{"k": 1}']
    line = spec_mod.systemd_exec(args).replace(" \\\n    ", " ")
    # systemd unquotes like a shell for these cases once %% and $$ are undone
    assert shlex.split(line.replace("%%", "%").replace("$$", "$")) == args
    assert "%%" in line and "$$HOME" in line


def test_env_file_is_literal_lines():
    assert spec_mod.env_file({"B": '{"x": 1}', "A": "1"}) == 'A=1\nB={"x": 1}\n'


def test_status_rows_say_what_runs_and_why_not():
    nodes = {
        "spark1": {
            "unit": {"exists": True, "active": "active", "sub": "running"},
            "container": {"exists": True, "running": True, "labels": {COMMIT: "a" * 40}},
            "clock": {"configured_mhz": 2300, "applied_mhz": 2300},
            "weights": {"verified": True, "manifest_digest": "sha256:" + "f" * 64},
        },
        "spark2": {
            "unit": {"exists": True, "active": "failed", "sub": "failed", "exit_status": 3},
            "container": {
                "exists": True,
                "running": False,
                "status": "exited",
                "exit_code": 3,
                "log_tail": ["error: lost rank 0"],
                "labels": {COMMIT: "b" * 40},
            },
            "clock": {"configured_mhz": 2300, "applied_mhz": None},
        },
        "spark3": {"unreachable": True},
    }
    api = {
        "state": "degraded",
        "detail": "rank 1 lost",
        "models": [],
        "health": {
            "ranks": [
                {"rank": 0, "state": "ok"},
                {"rank": 1, "state": "lost"},
                {"rank": 2, "state": "ok", "rtt_ms": 0.25},
            ]
        },
    }
    status = spec_mod.status_rows(nodes, PLAN, api, "a" * 40)
    rows = {r["node"]: r for r in status["rows"]}
    assert rows["spark1"]["commit"] == "a" * 12 and rows["spark1"]["clock"] == "2300 MHz"
    assert rows["spark1"]["weights"] == "verified " + "f" * 12 and rows["spark1"]["api"] == "degraded"
    assert rows["spark2"]["unit"] == "failed/failed (exit 3)" and rows["spark2"]["container"] == "exited (3)"
    assert rows["spark2"]["commit"] == f"{'b' * 12} (pin {'a' * 12})"
    assert rows["spark2"]["clock"] == "2300 MHz (not applied since boot)"
    assert rows["spark2"]["api"] == "rank lost" and rows["spark3"]["api"] == "rank ok 0.2 ms"
    assert rows["spark3"]["unit"] == "unreachable"
    assert not status["healthy"]
    notes = " ".join(status["notes"])
    assert "lost rank 0" in notes and "spark3 (rank 2): unreachable" in notes and "rank 1 lost" in notes
    lines = spec_mod.status_lines(status, "title")
    assert lines[0] == "title" and lines[1].split()[:3] == ["NODE", "RANK", "UNIT"]
    assert lines[-1] == "engine: NOT healthy"


# ---- argument specs match the defaults --------------------------------------------------------


@pytest.mark.parametrize("role", ["engine_image", "engine_service"])
def test_argument_specs_match_the_defaults(role):
    defaults = yaml.safe_load((ROOT / f"roles/{role}/defaults/main.yml").read_text())
    specs = yaml.safe_load((ROOT / f"roles/{role}/meta/argument_specs.yml").read_text())["argument_specs"]
    assert "main" in specs
    for entry, spec in specs.items():
        options = spec["options"]
        assert set(options) == set(defaults), f"{role} {entry}: options differ from defaults"
        for name, option in options.items():
            assert option["default"] == defaults[name], f"{role} {entry}: {name}"
            assert option["description"], name
            assert option["type"] in ("str", "int", "bool", "list", "dict", "path", "raw"), name
