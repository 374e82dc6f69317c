"""Preflight's layer-1 checks (filter) and layer-2 probe helpers (module), without Ansible."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


pf = _load("sparkfleet_preflight", ROOT / "plugins/filter/preflight.py")
TABLE = yaml.safe_load((ROOT / "roles/preflight/vars/main.yml").read_text())["__preflight_variable_table"]
HEX40 = "f" * 40


@pytest.mark.parametrize(
    ("kind", "row", "value", "ok"),
    [
        ("bool", {}, True, True),
        ("bool", {}, "true", False),
        ("bool", {}, 1, False),
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
        ("choice", {"choices": ["tp2", "tp3"]}, "tp3", True),
        ("choice", {"choices": ["tp2", "tp3"]}, "TP3", False),
        ("ip", {}, "10.0.0.1", True),
        ("ip", {}, "10.0.0.256", False),
        ("cidr", {}, "10.12.1.0/24", True),
        ("cidr", {}, "10.12.1.1/24", False),
        ("ifname", {}, "enP7s7", True),
        ("ifname", {}, "a-very-long-interface-name", False),
        ("int", {"min": 1500, "max": 9216}, 9000, True),
        ("int", {"min": 1500, "max": 9216}, 9217, False),
        ("str", {}, "", False),
        ("list", {}, [], True),
        ("list", {}, "x", False),
    ],
)
def test_kinds(kind, row, value, ok):
    msg = pf.check_value("v", value, {"kind": kind, **row})
    assert (msg is None) == ok, msg
    if not ok:
        assert msg.startswith(f"v={value!r}: expected")


def test_placeholder_is_refused_whatever_the_kind():
    msg = pf.check_value("model_weights_path", "CHANGE-ME", {"kind": "abs_path"})
    assert "is the sample inventory's placeholder" in msg


def test_every_table_row_has_a_known_kind_and_a_unique_variable():
    names = [r["var"] for r in TABLE]
    assert len(names) == len(set(names))
    for row in TABLE:
        assert row["kind"] in pf.KINDS, row
    # the variables the brief names for other concerns are covered
    assert {"engine_service_port", "gpu_clocks_cap_mhz", "model_weights_dir", "sparkfleet_lab"} <= set(names)


def test_table_reports_a_shared_value_once_and_a_host_value_per_host():
    table = [{"var": "engine_service_port", "kind": "port"}]
    both = pf.table_problems({"a": {"engine_service_port": 0}, "b": {"engine_service_port": 0}}, table)
    assert both == [
        "engine_service_port=0: expected a TCP port, a whole number 1..65535; fix engine_service_port in "
        "the inventory group_vars"
    ]
    one = pf.table_problems({"a": {"engine_service_port": 0}, "b": {"engine_service_port": 80}}, table)
    assert one[0].startswith("a: engine_service_port=0")
    assert pf.table_problems({"a": {}}, table) == []  # not defined: not checked
    assert "unknown kind" in pf.table_problems({"a": {"x": 1}}, [{"var": "x", "kind": "nope"}])[0]


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
    probs, warns = pf.pins_problems(pins(model__revision="afc7aa0a", engine__commit="30a9647"))
    assert probs == []
    assert len(warns) == 2 and "pin the full 40-hex commit" in warns[0]
    assert pf.pins_problems(pins(engine__repo="Elevatormusic/TensorFold"))[0] == []
    assert pf.pins_problems(pins(engine__repo="https://github.com/Elevatormusic/TensorFold.git"))[0] == []
    assert pf.pins_problems(pins(base_image__name="nvcr.io/nvidia/pytorch:25.08-py3"))[0] == []


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


def test_inventory_cluster_wide_values_must_agree():
    hosts = {
        "spark1": {
            "ansible_host": "10.0.0.1",
            "sparkfleet_node": 1,
            "sparkfleet_topology": "tp2",
            "sparkfleet_pins": pins(),
        },
        "spark2": {
            "ansible_host": "10.0.0.2",
            "sparkfleet_node": 2,
            "sparkfleet_topology": "tp3",
            "sparkfleet_pins": pins(),
        },
    }
    groups = {"cluster": ["spark1", "spark2"], "head": ["spark1"], "workers": ["spark2"]}
    out = pf.inventory_problems(hosts, groups, [])
    assert any("sparkfleet_topology differs between hosts" in p for p in out["problems"]), out


def test_settings_differ_and_check_lines():
    same = {"a": {"kernel": "6.11", "page_size": "65536"}, "b": {"kernel": "6.11", "page_size": "65536"}}
    assert pf.settings_differ(same, ["kernel", "page_size"]) == []
    diff = {"a": {"vm.min_free_kbytes": "1048576"}, "b": {"vm.min_free_kbytes": "67584"}}
    assert pf.settings_differ(diff, ["vm.min_free_kbytes"]) == ["vm.min_free_kbytes: a=1048576, b=67584"]
    check = {"name": "docker", "found": "`docker version` fails: x", "fix": "start it"}
    assert pf.check_line(check) == "docker: `docker version` fails: x. Fix: start it"
    assert pf.check_line(check, ok=True) == "docker: `docker version` fails: x"
