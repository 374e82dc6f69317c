"""Preflight's layer-1 checks (filter) and layer-2 probe helpers (module), without Ansible."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


pf = _load("sparkfleet_preflight", ROOT / "plugins/filter/preflight.py")
kinds = _load("input_kinds", ROOT / "plugins/module_utils/input_kinds.py")
HEX40 = "f" * 40


@pytest.mark.parametrize(
    ("kind", "row", "value", "ok"),
    [
        ("port", {}, 8888, True),
        ("port", {}, "18002", True),  # -e engine_service_port=18002 gives a string
        ("port", {}, 0, False),
        ("port", {}, 65536, False),
        ("port", {}, True, False),
        ("mhz", {"min": 1000, "max": 3003}, 0, True),
        ("mhz", {"min": 1000, "max": 3003}, 2300, True),
        ("mhz", {"min": 1000, "max": 3003}, "2300", True),
        ("mhz", {"min": 1000, "max": 3003}, 999, False),
        ("mhz", {"min": 1000, "max": 3003}, 2300.5, False),
        ("abs_path", {}, "/srv/models", True),
        ("abs_path", {}, "srv/models", False),
        ("abs_path", {}, "/srv//models", False),
        ("abs_path", {"pattern": r"^/etc/netplan/[^/]+\.yaml$"}, "/etc/netplan/x.yml", False),
        ("ip", {}, "10.0.0.1", True),
        ("ip", {}, "10.0.0.256", False),
        ("host", {}, "spark1.lan", True),
        ("host", {}, "10.0.0.300/24", False),
        ("cidr", {}, "10.12.1.0/24", True),
        ("cidr", {}, "10.12.1.1/24", False),
        ("ifname", {}, "enP7s7", True),
        ("ifname", {}, "a-very-long-interface-name", False),
        ("int", {"min": 1500, "max": 9216}, 9000, True),
        ("int", {"min": 1500, "max": 9216}, 9217, False),
        ("int", {"min": 1}, True, False),  # a boolean is not a number
        ("number", {"min": 0}, 2.5, True),
        ("number", {"min": 0}, -1, False),
        ("str", {}, "", False),
        ("str", {"pattern": "^[a-z]+$"}, "Abc", False),
        ("hex40", {}, "f" * 40, True),
        ("hex40", {}, "30a9647", False),
        ("digest", {}, "sha256:" + "0" * 64, True),
        ("image", {}, "nvcr.io/nvidia/pytorch", True),
        ("image", {}, "My Image", False),
        ("hf_repo", {}, "owner/name", True),
        ("version", {}, "2.4.0", True),
        ("version", {}, 2.4, False),
    ],
)
def test_kinds(kind, row, value, ok):
    expected = kinds.check_kind(value, {"kind": kind, **row})
    assert (expected is None) == ok, expected


def test_a_range_without_a_kind_is_a_whole_number_range():
    assert kinds.check_kind(5, {"min": 1, "max": 300}) is None
    assert kinds.check_kind(0, {"min": 1, "max": 300}) == "a whole number between 1 and 300"
    assert kinds.check_kind(5, {"kind": "nope"}).startswith("(unknown kind 'nope'")


def test_verdict_names_each_problem_once_and_the_nodes_when_not_all():
    shared = {"role": "earlyoom", "msg": "earlyoom_mem_kill_percent=0: expected a whole number >= 1"}
    own = {"role": "sparkfleet", "msg": "sparkfleet_node=10: expected a whole number between 1 and 9"}
    recorded = {
        "spark1": {"sparkfleet_validation_problems": [shared], "sparkfleet_validation_values": {}},
        "spark2": {"sparkfleet_validation_problems": [shared, own], "sparkfleet_validation_values": {}},
    }
    out = pf.validation_verdict({h: {"ansible_facts": f} for h, f in recorded.items()}, ["spark1", "spark2"])
    assert out["problems"] == [
        "earlyoom: earlyoom_mem_kill_percent=0: expected a whole number >= 1",
        "spark2: sparkfleet: sparkfleet_node=10: expected a whole number between 1 and 9",
    ]


def test_verdict_refuses_a_node_whose_uniform_value_differs_from_the_head():
    values = {"host_tuning_vm_min_free_kbytes": {"role": "host_tuning", "value": 1048576}}
    recorded = {
        "spark1": {"sparkfleet_validation_problems": [], "sparkfleet_validation_values": values},
        "spark2": {
            "sparkfleet_validation_problems": [],
            "sparkfleet_validation_values": {
                "host_tuning_vm_min_free_kbytes": {"role": "host_tuning", "value": 65536}
            },
        },
        "spark3": {"sparkfleet_validation_problems": [], "sparkfleet_validation_values": values},
    }
    hostvars = {h: {"ansible_facts": f} for h, f in recorded.items()}  # the verdict is host facts
    out = pf.validation_verdict(hostvars, ["spark1", "spark2", "spark3"])
    assert out["problems"] == [
        "spark2: host_tuning: host_tuning_vm_min_free_kbytes=65536 on spark2 differs from spark1's 1048576: "
        "it must be the same on every node; set it once in group_vars/all, not in host_vars"
    ]


def test_verdict_of_an_empty_cluster_names_the_groups():
    assert "group cluster is empty or missing" in pf.validation_verdict({}, [])["problems"][0]


def pins(**over) -> dict:
    p = {
        "model": {"repo": "o/m", "revision": HEX40},
        "engram": {"repo": "o/e", "revision": HEX40},
        "engine": {"repo": "git://10.250.1.2/sparkfleet/tensorfold.git", "commit": HEX40},
        "base_image": {"name": "10.250.1.2:5000/sparkfleet-lab/engine-base", "digest": "sha256:" + "0" * 64},
        "hf_client": {"huggingface_hub": "2.4.0"},
    }
    for path, v in over.items():
        k, f = path.split("__")
        p[k][f] = v
    return p


def test_good_pins_and_short_ones():
    assert pf.pins_problems(pins()) == ([], [])
    probs, warns = pf.pins_problems(pins(model__revision="afc7aa0a", engram__revision="1bae0e10"))
    assert probs == []
    assert len(warns) == 2 and "pin the full 40-hex commit" in warns[0]
    assert pf.pins_problems(pins(engine__repo="Elevatormusic/TensorFold"))[0] == []
    assert pf.pins_problems(pins(engine__repo="https://github.com/Elevatormusic/TensorFold.git"))[0] == []
    assert pf.pins_problems(pins(base_image__name="nvcr.io/nvidia/pytorch:25.08-py3"))[0] == []


def test_the_engine_commit_must_be_full():
    probs, _ = pf.pins_problems(pins(engine__commit="30a9647"))
    assert probs == [
        "sparkfleet_pins.engine.commit='30a9647': expected the full commit, 40 lowercase hex digits (the "
        "image is built from and labelled with exactly this commit; a short form as the recipes publish it, "
        "a branch or a tag is not enough); set it in group_vars/all/pins.yml"
    ]


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"model__revision": "AFC7AA0A"}, "sparkfleet_pins.model.revision='AFC7AA0A': expected a commit"),
        ({"model__revision": "afc7aa"}, "expected a commit"),  # 6 hex: too short to accept
        ({"engram__revision": None}, "sparkfleet_pins.engram.revision=None"),
        ({"engine__repo": "not a url"}, "sparkfleet_pins.engine.repo='not a url'"),
        ({"base_image__digest": "sha256:" + "A" * 64}, "expected sha256:<64 lowercase hex>"),
        ({"base_image__name": "x@sha256:" + "0" * 64}, "sparkfleet_pins.base_image.name="),
        ({"hf_client__huggingface_hub": ">=2.4"}, "expected an exact version"),
    ],
)
def test_bad_pins(over, expected):
    probs, _ = pf.pins_problems(pins(**over))
    assert any(expected in p for p in probs), probs


def test_pins_shape():
    assert "expected the pins table" in pf.pins_problems("x")[0][0]
    p = pins()
    del p["engine"]["commit"]
    assert "sparkfleet_pins.engine=" in pf.pins_problems(p)[0][0]


def test_inventory_shape_problems():
    hosts = {
        "spark1": {"ansible_host": "10.0.0.1", "sparkfleet_node": 1, "sparkfleet_topology": "tp3"},
        "spark2": {"ansible_host": "10.0.0.1", "sparkfleet_node": "1", "sparkfleet_topology": "tp3"},
    }
    groups = {"cluster": ["spark1", "spark2"], "head": ["spark1"], "workers": ["spark2"]}
    out = pf.inventory_problems(hosts, groups)
    assert any("sparkfleet_topology='tp3' needs exactly 3" in p for p in out), out
    assert "spark2: sparkfleet_node=1 is already spark1's: every Spark needs its own number" in out
    assert any(p.startswith("spark2: ansible_host='10.0.0.1' is also spark1's") for p in out), out


def test_settings_differ_and_check_lines():
    same = {"a": {"kernel": "6.11", "page_size": "65536"}, "b": {"kernel": "6.11", "page_size": "65536"}}
    assert pf.settings_differ(same, ["kernel", "page_size"]) == []
    diff = {"a": {"vm.min_free_kbytes": "1048576"}, "b": {"vm.min_free_kbytes": "67584"}}
    assert pf.settings_differ(diff, ["vm.min_free_kbytes"]) == ["vm.min_free_kbytes: a=1048576, b=67584"]
    check = {"name": "docker", "found": "`docker version` fails: x", "fix": "start it"}
    assert pf.check_line(check) == "docker: `docker version` fails: x. Fix: start it"
    assert pf.check_line(check, ok=True) == "docker: `docker version` fails: x"
