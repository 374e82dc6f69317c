"""`sparkfleet plan`: the cluster plan drawn from the inventory alone, as text, mermaid and svg; the
pictures in docs/ are what it draws for the sample inventories."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from sparkfleet import cli
from sparkfleet.plan import load_plan, render_mermaid, render_svg, render_text
from sparkfleet.runner import RunnerError

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def tp3() -> dict:
    return load_plan(["inventory/tp3"], REPO)


def test_tp3_plan_is_nvidias_ring(tp3: dict) -> None:
    text = render_text(tp3).splitlines()
    assert text[0] == "TP3 cluster: 3 Sparks, head spark1 (rank 0); MASTER_ADDR CHANGE-ME (management)"
    assert text[2].split() == ["NODE", "SPARK", "RANK", "ROLE", "MANAGEMENT"]
    assert text[3].split() == ["spark1", "1", "0", "head", "CHANGE-ME"]
    # docs/recipes.md "Cabling and addressing": N1.P0-N2.P1, N2.P0-N3.P1, N3.P0-N1.P1; one /24 per rail per
    # cable, host part = node number
    cables = [line for line in text if line.startswith("cable ")]
    assert cables == [
        "cable n1p0-n2p1: spark1 port 0 <-> spark2 port 1 (QSFP)",
        "cable n2p0-n3p1: spark2 port 0 <-> spark3 port 1 (QSFP)",
        "cable n3p0-n1p1: spark3 port 0 <-> spark1 port 1 (QSFP)",
    ]
    rail = next(line for line in text if "10.12.2.0/24" in line).split()
    assert rail[:3] == ["rail", "2", "10.12.2.0/24"]
    assert rail[3:7] == ["spark1", "enP2p1s0f0np0", "(roceP2p1s0f0)", "10.12.2.1"]
    assert rail[8:] == ["spark2", "enP2p1s0f1np1", "(roceP2p1s0f1)", "10.12.2.2"]


def test_mermaid_has_every_node_and_rail(tp3: dict) -> None:
    lines = render_mermaid(tp3).splitlines()
    assert lines[0] == "graph LR"
    assert sum(line.strip().startswith(("spark1[", "spark2[", "spark3[")) for line in lines) == 3
    edges = [line for line in lines if "<--" in line]
    assert len(edges) == 6  # 3 cables x 2 rails
    assert 'spark1 <-- "n1p0-n2p1 rail 1: 10.12.1.0/24' in edges[0]


def test_svg_is_valid_and_labels_every_rail(tp3: dict) -> None:
    root = ET.fromstring(render_svg(tp3))  # noqa: S314 - our own output, not untrusted input
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    lines = list(root.iter("{http://www.w3.org/2000/svg}line"))
    assert len(lines) == 6
    for link in tp3["links"]:
        assert f"{link['cable']} rail {link['rail']}: {link['subnet']}" in texts
        for end in (link["a"], link["b"]):
            assert f"{end['netdev']} {end['address']}" in texts
    assert "spark1  (Spark 1)" in texts and "rank 0 · head" in texts


@pytest.mark.parametrize("topology", ["tp2", "tp3"])
def test_the_pictures_in_docs_are_what_plan_draws(topology: str) -> None:
    plan = load_plan([f"inventory/{topology}"], REPO)
    assert (REPO / "docs" / f"plan-{topology}.svg").read_text() == render_svg(plan)
    assert (REPO / "docs" / f"plan-{topology}.mmd").read_text() == render_mermaid(plan)


def write_inventory(root: Path, hosts: dict[str, dict], group_vars: dict) -> Path:
    (root / "group_vars" / "all").mkdir(parents=True)
    head, *workers = hosts
    doc = {
        "all": {
            "children": {
                "cluster": {
                    "children": {
                        "head": {"hosts": {head: hosts[head]}},
                        "workers": {"hosts": {w: hosts[w] for w in workers}},
                    }
                }
            }
        }
    }
    (root / "hosts.yml").write_text(json.dumps(doc))
    (root / "group_vars" / "all" / "cluster.yml").write_text(json.dumps(group_vars))
    return root


def test_layered_inventory_addresses_and_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a real cluster's own file layered on the sample: its management addresses (TEST-NET, never contacted)
    mine = tmp_path / "mine"
    (mine / "host_vars").mkdir(parents=True)
    for n in (1, 2):
        (mine / "host_vars" / f"spark{n}.yml").write_text(f"ansible_host: 198.51.100.{10 + n}\n")
    hosts = "all:\n  children:\n    cluster:\n      hosts:\n        spark1:\n        spark2:\n"
    (mine / "hosts.yml").write_text(hosts)
    assert cli.main(["plan", "-i", "inventory/tp2", "-i", str(mine), "--project-dir", str(REPO)]) == 0
    out = capsys.readouterr().out
    # TP2's ranks meet on the cable (rank 0's fabric address), the management addresses are SSH's
    assert "MASTER_ADDR 10.12.1.1 (rank 0's fabric address)" in out
    assert "spark2  2      1     worker  198.51.100.12" in out
    svg = tmp_path / "plan.svg"
    assert cli.main(["plan", "-i", "inventory/tp2", "--format", "svg", "-o", str(svg)]) == 0
    assert svg.read_text().startswith("<svg ")


def test_an_inventory_without_a_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write_inventory(
        tmp_path / "bad",
        {"a": {"sparkfleet_node": 1}, "b": {"sparkfleet_node": 1}},
        {"sparkfleet_topology": "tp3"},
    )
    with pytest.raises(RunnerError) as err:
        load_plan([inv], REPO)
    assert "tp3 needs exactly 3" in str(err.value) and "sparkfleet_node=1 is also a's" in str(err.value)
    assert cli.main(["plan", "-i", str(inv)]) == 1
    assert "the cluster plan cannot be computed" in capsys.readouterr().err


def test_vault_encrypted_group_vars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write_inventory(
        tmp_path / "vaulted",
        {"s1": {"sparkfleet_node": 1, "ansible_host": "192.0.2.1"}, "s2": {"sparkfleet_node": 2}},
        {"sparkfleet_topology": "tp2"},
    )
    secret = inv / "group_vars" / "all" / "secrets.yml"
    secret.write_text("model_weights_hf_token: hf_NotPrintedAnywhere\n")
    pw = tmp_path / "pw"
    pw.write_text("Plan-Vault-1\n")
    subprocess.run(
        [str(VENV_BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(pw), str(secret)],
        check=True,
        capture_output=True,
    )
    assert cli.main(["plan", "-i", str(inv)]) == 1  # ansible cannot read the inventory without it
    assert "vault" in capsys.readouterr().err.lower()
    assert cli.main(["plan", "-i", str(inv), "--vault-password-file", str(pw)]) == 0
    out = capsys.readouterr().out
    assert "s1    1      0     head    192.0.2.1" in out and "hf_NotPrintedAnywhere" not in out
