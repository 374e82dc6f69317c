"""engine_service's container-as-data logic: every rank's argv of every built-in engine profile, rendered by
Ansible from the role and the sample inventories and parsed by the engine double's `tensorfold serve` parser
of that profile's engine version; the profile rules; the status table; the roles' argument specs."""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible_collections.sparkfleet.cluster.plugins.filter import engine as spec_mod
from sparkfleet_lab.engine.tensorfold import cli_args, serve

ROOT = Path(__file__).resolve().parents[2]
PROFILES = yaml.safe_load((ROOT / "roles/engine_service/vars/main.yml").read_text())[
    "__engine_service_builtin_profiles"
]
HEX40 = "0123456789abcdef0123456789abcdef01234567"
PINS = {
    "model": {"repo": "org/model", "revision": HEX40},
    "engram": {"repo": "org/engram", "revision": HEX40},
    "engine": {"repo": "https://github.com/sfxnz/TensorFold.git", "commit": HEX40},
    "base_image": {"name": "nvcr.io/nvidia/pytorch", "digest": "sha256:" + "a" * 64},
    "hf_client": {"huggingface_hub": "2.4.0"},
}
# A node as probe.yml reads it (engine_node): a verified snapshot, a TP3 rank file, a Spark's hardware.
NODE = {
    "image": {"id": "sha256:" + "1" * 64, "exists": True, "labels": {}},
    "weights_paths": {"dir": "/srv/sparkfleet/models/snapshot", "rank_file": "", "chat_template": ""},
    "gpu_runtime": True,
    "devices_present": ["/dev/infiniband"],
    "memlock_hard": -1,
    "capabilities": ["IPC_LOCK"],
}
NCCL = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}
# Renders, for each host of a sample inventory, the spec configure.yml renders (the role's own defaults, vars
# and the inventory's group_vars), through ansible-playbook on the controller: no host is contacted.
PLAY = """---
- name: Render every rank's container
  hosts: cluster
  gather_facts: false
  connection: local
  roles:
    - role: cluster_plan
  tasks:
    - name: The engine's inputs pass its own checks
      ansible.builtin.include_role:
        name: engine_service
        tasks_from: validate
        public: true
    - name: Render the spec
      ansible.builtin.set_fact:
        rendered: "{{ __engine_service_spec_inputs | sparkfleet.cluster.engine_spec }}"
        rendered_profile: "{{ __engine_service_profile }}"
      vars:
        __engine_service_node: "{{ node }}"
        network_links_nccl_env: "{{ nccl }}"
"""


def render(tmp_path: Path, inventory: str, **extra) -> dict[str, dict]:
    """{host: (spec, profile)} for the sample inventory `inventory` (tp2, tp3), with extra vars."""
    n = 2 if inventory == "tp2" else 3
    overlay = tmp_path / "overlay"
    hosts = {
        f"spark{i}": {"ansible_host": f"127.0.0.{10 + i}", "sparkfleet_node": i, "ansible_user": "admin"}
        for i in range(1, n + 1)
    }
    groups = {
        "head": {"hosts": {"spark1": hosts["spark1"]}},
        "workers": {"hosts": dict(list(hosts.items())[1:])},
    }
    overlay.mkdir()
    (overlay / "hosts.yml").write_text(
        yaml.safe_dump({"all": {"children": {"cluster": {"children": groups}}}})
    )
    (tmp_path / "play.yml").write_text(PLAY)
    extravars = {"sparkfleet_pins": PINS, "node": NODE, "nccl": NCCL, **extra}
    (tmp_path / "extra.json").write_text(json.dumps(extravars))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp_path / "facts"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(ROOT / "inventory" / inventory),
         "-i", str(overlay), str(tmp_path / "play.yml"), "-e", f"@{tmp_path / 'extra.json'}"],
        capture_output=True, text=True, env=env, cwd=ROOT, check=False, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    out, _end = json.JSONDecoder().raw_decode(proc.stdout[proc.stdout.index("{") :])
    results = {
        host: result["ansible_facts"]
        for play in out["plays"]
        for task in play["tasks"]
        if task["task"]["name"] == "Render the spec"
        for host, result in task["hosts"].items()
    }
    return {h: (facts["rendered"], facts["rendered_profile"]) for h, facts in results.items()}


def parse(profile: dict, command: list[str]):
    """`tensorfold serve ...` through the engine double's parser of the profile's engine version and the
    family's own refusals (serve.precheck): what the real engine checks before it loads anything."""
    assert command[:2] == ["tensorfold", "serve"]
    return serve.precheck(command[1:], profile["engine_version"])


CASES = [  # (sample inventory, profile): every built-in profile, with the sample inventory of its TP size
    ("tp2", "dsv41-fork-0.6.6"),
    ("tp2", "dsv41-fork-0.6.4"),
    ("tp3", "tp3-recipe"),
]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    return {
        (inv, name): render(tmp_path_factory.mktemp(f"{inv}-{name}"), inv, engine_service_profile=name)
        for inv, name in CASES
    }


def test_every_profile_has_a_case_and_every_case_renders_every_rank(rendered):
    assert {name for _inv, name in CASES} == set(PROFILES)
    for (inv, _name), specs in rendered.items():
        assert sorted(specs) == [f"spark{i}" for i in range(1, (2 if inv == "tp2" else 3) + 1)]


@pytest.mark.parametrize(("inventory", "name"), CASES)
def test_every_rank_parses_with_the_engines_own_parser(rendered, inventory, name):
    specs = rendered[(inventory, name)]
    tp = 2 if inventory == "tp2" else 3
    masters = set()
    for host, (spec, profile) in specs.items():
        args = parse(profile, spec["command"])  # argparse exits 2 on a flag or a choice the engine lacks
        rank = int(host[-1]) - 1
        assert args.model == "/srv/sparkfleet/models/snapshot" and args.tp == tp and args.rank == rank
        assert args.no_update_check is True
        masters.add((args.master, args.master_port))
        if rank == 0:
            assert args.host == "127.0.0.1"
        else:  # --host --port --max-tokens --api-key-file are rank 0's only: the parser's defaults elsewhere
            for flag in ("--host", "--port", "--max-tokens", "--api-key-file"):
                assert flag not in spec["command"], (host, flag)
    assert len(masters) == 1  # one rendezvous for every rank


def _settings_of(spec: dict) -> list[str]:
    """The flags every rank must agree on: the command less rank, host, port, max-tokens, key file, caches."""
    cmd, out, skip = spec["command"][3:], [], {"--rank", "--host", "--port", "--max-tokens", "--api-key-file"}
    skip |= {"--snapshot-dir", "--spill-gib"}  # the spill tier is the head's
    i = 0
    while i < len(cmd):
        if cmd[i] in skip:
            i += 2
            continue
        out.append(cmd[i])
        i += 1
    return out


@pytest.mark.parametrize(("inventory", "name"), CASES)
def test_every_rank_gets_the_same_settings(rendered, inventory, name):
    specs = rendered[(inventory, name)]
    settings = {h: _settings_of(s) for h, (s, _p) in specs.items()}
    assert len({json.dumps(v) for v in settings.values()}) == 1, settings
    envs = {json.dumps(s["env"], sort_keys=True) for s, _p in specs.values() if not s["is_head"]}
    head_env = next(s["env"] for s, _p in specs.values() if s["is_head"])
    assert all(json.loads(e).items() <= head_env.items() for e in envs)  # the head adds only its own tier


def test_tp2_sample_inventory_keeps_the_recipes_values_on_real_flags(rendered):
    specs = rendered[("tp2", "dsv41-fork-0.6.6")]
    head, _p = specs["spark1"]
    args = parse(PROFILES["dsv41-fork-0.6.6"], head["command"])
    assert (args.port, args.name, args.thinking) == (8888, "DeepSeek-V4.1-Flash-1017", False)
    assert (args.context, args.parallel, args.mtp_drafts, args.mtp_confidence) == (1048576, "4", 5, 0.15)
    assert args.master_port == 29571 and args.max_tokens == 4096 and args.top_p == 1.0
    assert args.api_key_file is None  # loopback, no key (the recipe's way)
    env = head["env"]
    assert env["TF_DSV41_DISK"] == "/cache/prompt-disk" and env["TF_DSV41_DISK_GIB"] == "100"
    assert env["TORCH_EXTENSIONS_DIR"] == "/cache/tf/torch_extensions" and env["HF_HUB_OFFLINE"] == "1"
    assert "MASTER_ADDR" not in env and env["NCCL_IB_HCA"] == NCCL["NCCL_IB_HCA"]
    run = " ".join(head["docker_args"])
    for part in ("--init", "--restart no", "--oom-score-adj 1000", "--ulimit core=1", "--gpus all",
                 "--network host", "--ipc host", "--device /dev/infiniband", "--cap-add IPC_LOCK",
                 "--ulimit memlock=-1:-1", "--ulimit stack=67108864", "--log-opt max-size=200m",
                 "--log-opt max-file=3", f"/var/lib/sparkfleet/engine/kernels/{HEX40}:/cache/tf:rw",
                 "/srv/sparkfleet/models/snapshot:/srv/sparkfleet/models/snapshot:ro"):  # fmt: skip
        assert part in run, part
    assert "--shm-size" not in run  # the receipts run without one (README)


def test_tp3_sample_inventory_keeps_the_recipe_cards_words(rendered):
    specs = rendered[("tp3", "tp3-recipe")]
    head, profile = specs["spark1"]
    args = parse(profile, head["command"])
    assert (args.port, args.name, args.thinking, args.reasoning_effort) == (
        18002,
        "deepseek-v4.1-flash",
        True,
        "high",
    )
    assert (args.temperature, args.top_p, args.top_k, args.parallel) == (1.0, 1.0, 20, "16")
    assert args.api_key_file == "/run/sparkfleet/api-keys" and args.spill_gib == 256.0
    assert args.snapshot_dir == "/cache/spill"
    assert head["env"]["TF_DSV41_POOL_TOKENS"] == "8388608"
    assert "/var/lib/sparkfleet/engine/api/keys:/run/sparkfleet/api-keys:ro" in head["docker_args"]
    worker = parse(profile, specs["spark3"][0]["command"])
    assert worker.spill_gib == 0.0 and worker.api_key_file is None  # the spill tier and the key are rank 0's


def test_the_064_engine_gets_no_key_flag_and_takes_no_key(rendered):
    head, _profile = rendered[("tp2", "dsv41-fork-0.6.4")]["spark1"]
    assert "--api-key-file" not in head["command"]
    with pytest.raises(SystemExit):  # the 0.6.4 parser has no --api-key-file: argparse exits 2
        cli_args.parser_of("0.6.4").parse_args([*head["command"][1:], "--api-key-file", "/k"])


# ---- the filter without Ansible -------------------------------------------------------------------

PLAN = {
    "size": 2,
    "head": "spark1",
    "ranks": {"spark1": 0, "spark2": 1},
    "hosts_by_rank": ["spark1", "spark2"],
    "master_addr": "10.12.1.1",
}


def inputs(host: str = "spark1", profile: str = "dsv41-fork-0.6.6", **over) -> dict:
    p = copy.deepcopy(PROFILES[profile])
    s = p["settings"]
    base = {
        "host": host,
        "plan": PLAN,
        "profile": p,
        "profile_name": profile,
        "nccl_env": NCCL,
        "name": "sparkfleet-engine",
        "image": "sparkfleet/engine:" + HEX40,
        "image_id": "sha256:" + "1" * 64,
        "weights_dir": "/m/snapshot",
        "rank_file": "",
        "chat_template": "",
        "master_port": s["master_port"],
        "api": {"host": "127.0.0.1", "port": 8888, "name": "m", "key_required": False,
                "key_file": "/var/lib/sparkfleet/engine/api/keys", "key_mount": "/run/sparkfleet/api-keys"},
        "values": {"context": s["context"], "parallel": s["parallel"], "mtp_drafts": s["mtp_drafts"],
                   "thinking": False, "top_p": 1.0, "max_tokens": 4096},
        "caches": [{"name": "d", "nodes": "all", "size_gib": 1, "path": "/var/d", "mount": "/cache/d",
                    "dir_env": "TF_DSV41_DISK", "size_env": "TF_DSV41_DISK_GIB"}],
        "kernel_cache": "/var/lib/sparkfleet/engine/kernels/" + HEX40,
        "gpus": "auto",
        "node_has_gpu_runtime": True,
        "devices": ["/dev/infiniband"],
        "node_devices": ["/dev/infiniband"],
        "node_memlock_hard": -1,
        "cap_add": ["IPC_LOCK"],
        "ulimits": ["core=1", "memlock=-1:-1", "stack=67108864"],
        "log_opts": {"max-size": "200m", "max-file": "3"},
    }  # fmt: skip
    base.update(over)
    return base


def opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_rank0_only_flags_and_the_profiles_order():
    head = spec_mod.engine_spec(inputs())["command"]
    worker = spec_mod.engine_spec(inputs("spark2"))["command"]
    assert head[:3] == ["tensorfold", "serve", "/m/snapshot"]
    assert head[3:9] == ["--tp", "2", "--rank", "0", "--master", "10.12.1.1"]  # the receipts' order
    assert "--no-thinking" in head and "--no-thinking" in worker and "--thinking" not in head
    assert opt(head, "--port") == "8888" and "--port" not in worker
    assert opt(worker, "--rank") == "1" and opt(worker, "--master") == "10.12.1.1"


def test_keys_only_where_the_engine_reads_them():
    keyed = inputs(api={**inputs()["api"], "key_required": True})
    spec = spec_mod.engine_spec(keyed)
    assert opt(spec["command"], "--api-key-file") == "/run/sparkfleet/api-keys"
    assert "/var/lib/sparkfleet/engine/api/keys:/run/sparkfleet/api-keys:ro" in spec["docker_args"]
    assert "--api-key-file" not in spec_mod.engine_spec({**keyed, "host": "spark2"})["command"]
    with pytest.raises(spec_mod.SpecError, match="reads no API key file"):
        spec_mod.engine_spec(inputs(profile="dsv41-fork-0.6.4", api=keyed["api"]))
    with pytest.raises(spec_mod.SpecError, match="key is required off loopback"):
        spec_mod.engine_spec(inputs(api={**inputs()["api"], "host": "0.0.0.0"}))  # noqa: S104 - data


def test_hardware_the_node_lacks_is_left_out_and_said():
    spec = spec_mod.engine_spec(
        inputs(node_has_gpu_runtime=False, node_devices=[], node_memlock_hard=8388608)
    )
    text = " ".join(spec["docker_args"])
    assert "--gpus" not in text and "--device" not in text
    assert "--ulimit memlock=8388608:8388608" in text
    assert len(spec["omitted"]) == 3


def test_missing_nccl_env_fails_clearly():
    with pytest.raises(spec_mod.SpecError, match="network_links_nccl_env is not set for spark2"):
        spec_mod.engine_spec(inputs("spark2", nccl_env=None))


@pytest.mark.parametrize("key", ["HF_TOKEN", "TENSORFOLD_API_KEY", "DB_PASSWORD"])
def test_secrets_never_enter_the_environment(key):
    with pytest.raises(spec_mod.SpecError, match="secret"):
        spec_mod.engine_spec(inputs(extra_env={key: "x"}))


def test_digest_is_stable_and_moves_with_every_input():
    base = spec_mod.engine_spec(inputs())["digest"]
    assert spec_mod.engine_spec(inputs())["digest"] == base
    changes = [
        {"image_id": "sha256:" + "2" * 64},
        {"values": {**inputs()["values"], "parallel": 3}},
        {"nccl_env": {**NCCL, "NCCL_IB_GID_INDEX": "3"}},
        {"node_devices": []},
        {"extra_args": ["--x"]},
        {"kernel_cache": "/var/lib/sparkfleet/engine/kernels/" + "b" * 40},
    ]
    digests = {spec_mod.engine_spec(inputs(**c))["digest"] for c in changes}
    assert base not in digests and len(digests) == len(changes)
    spec = spec_mod.engine_spec(inputs())
    assert spec["docker_args"][-2:] == ["--label", f"{spec_mod.SETTINGS_LABEL}={spec['digest']}"]


def test_rank_file_is_mounted_and_handed_over_only_as_the_profile_says():
    spec = spec_mod.engine_spec(inputs("spark2", rank_file="/m/rank/rank1.safetensors"))
    assert "/m/rank/rank1.safetensors:/m/rank/rank1.safetensors:ro" in spec["docker_args"]
    assert "/m/rank/rank1.safetensors" not in spec["command"]  # the built-in profiles know no flag for it
    own = copy.deepcopy(PROFILES["tp3-recipe"])
    own["weights"]["rank_file_env"] = "TF_RANK_FILE"
    plan = {**PLAN, "size": 3, "ranks": {"spark1": 0, "spark2": 1, "spark3": 2}}
    env = spec_mod.engine_spec({**inputs("spark2", rank_file="/r", plan=plan), "profile": own})["env"]
    assert env["TF_RANK_FILE"] == "/r"


def test_a_profile_that_does_not_serve_the_tp_size_is_refused():
    with pytest.raises(spec_mod.SpecError, match="serves TP"):
        spec_mod.engine_spec(inputs(profile="tp3-recipe"))


def test_profile_problems_name_the_variable():
    assert spec_mod.profile_problems(PROFILES, "dsv41-fork-0.6.6") == []
    assert "is not a profile" in spec_mod.profile_problems(PROFILES, "vllm")[0]
    bad = {**PROFILES, "mine": {**PROFILES["tp3-recipe"], "engine_version": "0.7", "verify": ["nope"]}}
    problems = spec_mod.profile_problems(bad, "mine")
    assert any("engine_version='0.7'" in p for p in problems) and any("'nope'" in p for p in problems)
    lacking = spec_mod.profile_problems({"mine": {"summary": "x"}}, "mine")
    assert len(lacking) == 1 and "lacks engine_version" in lacking[0]
    args = {**PROFILES, "mine": {**PROFILES["tp3-recipe"], "args": [{"flag": "--x", "setting": "colour"}]}}
    assert "setting 'colour'" in spec_mod.profile_problems(args, "mine")[0]


def test_serves_names_the_profile_and_the_pin():
    tp3 = spec_mod.profile_serves(PROFILES, 3)
    assert len(tp3) == 1 and tp3[0].startswith("tp3-recipe")
    tp2 = spec_mod.profile_serves(PROFILES, 2)
    assert any("19f5478ba778531ffb9a1ebb9c1ca7e06b8ceacb" in line for line in tp2)


def test_settings_an_engine_cannot_take_are_refused():
    fork = PROFILES["dsv41-fork-0.6.6"]
    assert spec_mod.setting_problems(fork, {"kv_pool_tokens": 0, "context": 5}, "f") == []
    problem = spec_mod.setting_problems(fork, {"kv_pool_tokens": 8388608}, "f")
    assert len(problem) == 1 and problem[0].startswith("engine_service_kv_pool_tokens=8388608")
    assert spec_mod.setting_problems(PROFILES["tp3-recipe"], {"kv_pool_tokens": 8388608}, "t") == []


def test_extra_args_may_not_set_a_flag_sparkfleet_passes():
    fork = PROFILES["dsv41-fork-0.6.6"]
    assert spec_mod.extra_arg_problems(["--bogus", "--alias", "x"], fork) == []
    problem = spec_mod.extra_arg_problems(["--cont", "5"], fork)  # argparse would read it as --context
    assert len(problem) == 1 and "--context" in problem[0] and "engine_service_context" in problem[0]
    assert spec_mod.extra_arg_problems(["--no-thinking"], fork)
    caches = [{"dir_arg": "--snapshot-dir", "size_arg": "--spill-gib"}]
    assert "engine_service_caches" in spec_mod.extra_arg_problems(["--spill-gib=3"], fork, caches)[0]


def test_cache_problems():
    ok = [
        {
            "name": "a",
            "nodes": "head",
            "size_gib": 1,
            "path": "/a",
            "mount": "/b",
            "dir_arg": "--snapshot-dir",
        }
    ]
    assert spec_mod.cache_problems(ok) == []
    bad = [{**ok[0], "dir_arg": "", "nodes": "workers", "size_gib": 0}]
    assert len(spec_mod.cache_problems(bad)) == 3


def test_systemd_exec_round_trips_through_a_shell_like_split():
    args = ["/usr/bin/docker", "run", "--label", "a=b c", 'x"y', "50%", "$HOME", r"back\slash", '{"k": 1}']
    line = spec_mod.systemd_exec(args).replace(" \\\n    ", " ")
    assert shlex.split(line.replace("%%", "%").replace("$$", "$")) == args
    assert "%%" in line and "$$HOME" in line


def test_env_file_is_literal_lines():
    assert spec_mod.env_file({"B": '{"x": 1}', "A": "1"}) == 'A=1\nB={"x": 1}\n'


# ---- status ---------------------------------------------------------------------------------------

COMMIT = "io.sparkfleet.engine.commit"


def test_status_says_loading_while_the_port_is_closed_and_shows_the_engines_lines():
    nodes = {
        "spark1": {
            "unit": {"exists": True, "active": "active", "sub": "running"},
            "container": {"exists": True, "running": True, "running_s": 185, "labels": {COMMIT: "a" * 40}},
            "log": {"phase": "loading", "last": "[tensorfold] CUDA rank 0 startup estimate 78.46 GiB ..."},
        },
        "spark2": {
            "unit": {"exists": True, "active": "active", "sub": "running"},
            "container": {"exists": True, "running": True, "running_s": 190, "labels": {COMMIT: "a" * 40}},
            "log": {"phase": "loading", "last": "[tensorfold] loading m: ..."},
        },
    }
    status = spec_mod.status_rows(nodes, PLAN, {"state": "down", "detail": "not answering"}, "a" * 40, 15)
    rows = {r["node"]: r for r in status["rows"]}
    assert (
        rows["spark1"]["api"] == "loading, 3 min of the ~15" and rows["spark1"]["engine"] == "loading (3 min)"
    )
    assert rows["spark2"]["engine"] == "loading (3 min)" and not status["healthy"]
    assert any("startup estimate" in line for line in status["log"])
    lines = spec_mod.status_lines(status, "title")
    assert lines[0] == "title" and lines[1].split()[:3] == ["NODE", "RANK", "UNIT"]
    assert lines[-1] == "engine: NOT healthy"


def test_status_rows_say_what_runs_and_why_not():
    nodes = {
        "spark1": {
            "unit": {"exists": True, "active": "active", "sub": "running"},
            "container": {"exists": True, "running": True, "labels": {COMMIT: "a" * 40}},
            "clock": {"configured_mhz": 2300, "applied_mhz": 2300},
            "weights": {"verified": True, "manifest_digest": "sha256:" + "f" * 64},
            "log": {"phase": "serving", "ready": "[tensorfold] serving m at http://127.0.0.1:8888/v1"},
        },
        "spark2": {
            "unit": {"exists": True, "active": "failed", "sub": "failed", "exit_status": 1},
            "container": {"exists": True, "running": False, "status": "exited", "exit_code": 1,
                          "labels": {COMMIT: "b" * 40}},
            "log": {"phase": "failed", "fatal": "RuntimeError: the ranks were started with other settings"},
        },
    }  # fmt: skip
    api = {"state": "ok", "models": ["m"], "detail": "m served"}
    status = spec_mod.status_rows(nodes, PLAN, api, "a" * 40)
    rows = {r["node"]: r for r in status["rows"]}
    assert rows["spark1"]["commit"] == "a" * 12 and rows["spark1"]["clock"] == "2300 MHz"
    assert rows["spark1"]["weights"] == "verified " + "f" * 12 and rows["spark1"]["api"] == "ok"
    assert rows["spark1"]["engine"] == "serving" and rows["spark1"]["model"] == "m"
    assert rows["spark2"]["unit"] == "failed/failed (exit 1)" and rows["spark2"]["container"] == "exited (1)"
    assert rows["spark2"]["commit"] == f"{'b' * 12} (pin {'a' * 12})" and rows["spark2"]["engine"] == "failed"
    assert not status["healthy"]
    notes = " ".join(status["notes"])
    assert "spark2 (rank 1) failed: RuntimeError: the ranks were started with other settings" in notes
    assert status["log"] == ["spark1 (rank 0): [tensorfold] serving m at http://127.0.0.1:8888/v1"]


def test_a_rank_whose_unit_is_going_down_is_not_healthy_though_its_container_still_runs():
    # what a start read on a worker whose Docker was being stopped (tp3 lab, CI): unit stopping, container up
    serving = {
        "unit": {"exists": True, "active": "active", "sub": "running"},
        "container": {"exists": True, "running": True, "labels": {COMMIT: "a" * 40}},
        "log": {"phase": "serving", "ready": "[tensorfold] serving m at http://127.0.0.1:8888/v1"},
    }
    api = {"state": "ok", "models": ["m"], "detail": "m served"}
    assert spec_mod.status_rows({"spark1": serving, "spark2": serving}, PLAN, api, "a" * 40)["healthy"]
    for active, sub in (("deactivating", "stop"), ("inactive", "dead"), ("failed", "failed")):
        going = dict(serving, unit={"exists": True, "active": active, "sub": sub}, log={"phase": "following"})
        status = spec_mod.status_rows({"spark1": serving, "spark2": going}, PLAN, api, "a" * 40)
        assert not status["healthy"], active
        assert f"spark2 (rank 1): its unit is {active}/{sub} while the container still runs" in " ".join(
            status["notes"]
        )


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
            assert option["type"] in ("str", "int", "float", "bool", "list", "dict", "path", "raw"), name
