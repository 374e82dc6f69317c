"""Role engine_image on a two-node lab with the hub (molecule/engine_image): the head built the image of
the pinned engine commit, labelled with it, and the worker has the very same layers."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.usefixtures("lab")


def image(host, ref: str) -> dict:
    with host.sudo():
        return json.loads(host.check_output(f"docker image inspect {ref}"))[0]


def test_both_nodes_have_the_pinned_image_with_the_same_layers(lab, node):
    commit = lab.state["pins"]["engine"]["commit"]
    ref = f"sparkfleet/engine:{commit}"
    head, worker = image(node("spark1"), ref), image(node("spark2"), ref)
    assert head["Config"]["Labels"]["io.sparkfleet.engine.commit"] == commit
    assert head["RootFS"]["Layers"] == worker["RootFS"]["Layers"]


def test_the_image_runs_the_engine(lab, node):
    ref = f"sparkfleet/engine:{lab.state['pins']['engine']['commit']}"
    with node("spark2").sudo():
        out = node("spark2").run(f"docker run --rm --network host {ref} tensorfold --help")
    assert out.rc == 0 and "tensorfold" in (out.stdout + out.stderr).lower()
