"""scripts/check-docs.py (run by `make lint`) finds documentation that is not the truth: a fake module whose
DOCUMENTATION disagrees with the argument spec it builds, YAML with a duplicate key, a filter whose
options are not its parameters, and documentation the real ansible-doc cannot render (issue 25), in a
collection tree of fake modules and roles. The real plugins pass it (make lint runs it on them)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_docs", ROOT / "scripts/check-docs.py")
check_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_docs)

MODULE = '''
DOCUMENTATION = r"""
module: fake
short_description: A module for the checker
description: [Checks nothing.]
author: sparkfleet developers
options:
  name: {type: str, required: true, description: The name.}
  size: {type: int, default: DEFAULT_SIZE, description: The size.}
  mode: {type: str, choices: [a, b], default: a, description: The mode.}
  DOC_ONLY
"""

EXAMPLES = r"""
- name: Call it
  sparkfleet.cluster.fake:
    name: x
"""

RETURN = r"""
size: {description: The size., type: int, returned: always}
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "size": {"type": "int", "default": 2},
            "mode": {"type": "str", "choices": ["a", "b"], "default": "a"},
            SPEC_ONLY
        },
        supports_check_mode=True,
    )
'''


def module_text(**parts: str) -> str:
    text = MODULE
    for key, value in {"DEFAULT_SIZE": "2", "DOC_ONLY": "", "SPEC_ONLY": "", **parts}.items():
        assert key in text, key  # a replacement that misses would leave the module unbroken
        text = text.replace(key, value)
    return text


def problems_of(tmp_path: Path, **parts: str) -> list[str]:
    path = tmp_path / "fake.py"
    path.write_text(module_text(**parts))
    problems: list[str] = []
    check_docs.check_module(path, problems)
    return problems


def test_true_documentation_passes(tmp_path):
    assert problems_of(tmp_path) == []


@pytest.mark.parametrize(
    ("parts", "found"),
    [
        ({"DEFAULT_SIZE": "3"}, "option size: default is 3 in the docs, 2 in the spec"),
        ({"DOC_ONLY": "gone: {type: str, description: G.}"}, "option gone is documented but not in"),
        ({"SPEC_ONLY": '"new": {"type": "list", "elements": "str"},'}, "spec but not documented"),
        ({"DOC_ONLY": "mode: {type: str, description: Again.}"}, "duplicate key 'mode'"),
        ({"sparkfleet.cluster.fake:": "fake:"}, "EXAMPLES task 1: does not call sparkfleet.cluster.fake"),
        ({"returned: always": "x: 1"}, "RETURN size: no returned"),
        ({'"choices": ["a", "b"]': '"choices": ["a", "b", "c"]'}, "mode: choices is ['a', 'b'] in the docs"),
        ({"description: [Checks nothing.]": "description: a: b: c"}, "DOCUMENTATION: not valid YAML"),
        ({"[Checks nothing.]": "[Checks: nothing.]"}, "description item 1 is not text but dict"),
        ({"The size., type: int": "[The: size.], type: int"}, "RETURN: contains.size.description item 1"),
    ],
)  # fmt: skip
def test_untrue_documentation_is_found(tmp_path, parts, found):
    problems = problems_of(tmp_path, **parts)
    assert any(found in p for p in problems), problems


def test_filter_options_are_its_parameters():
    def fil(value, host, fabric=True):
        return value

    good = {
        "_input": {},
        "host": {"description": "h", "required": True},
        "fabric": {"description": "f", "default": True},
    }
    problems: list[str] = []
    check_docs.compare_parameters("x.yml", "fil", fil, good, problems)
    assert problems == []
    check_docs.compare_parameters("x.yml", "fil", fil, {"_input": {}, "host": {"description": "h"}}, problems)
    assert any("host: required False" in p for p in problems)
    assert any("parameter fabric of fil is not documented" in p for p in problems)


# ---- the real ansible-doc over a collection tree ---------------------------------------------------------
# a description item that YAML reads as a mapping ("Workers need no internet: they ..."): ansible-doc
# --json dumps it, the text page ansible-doc shows fails on it (issue 25)
BROKEN = {"[Checks nothing.]": "[Checks nothing., Workers need no internet: they only receive.]"}
ROLE = """---
argument_specs:
  main:
    short_description: A role for the checker
    description: [DESCRIPTION]
    options:
      size: {type: int, default: 2, description: The size.}
"""


def collection(tmp_path: Path, modules: dict[str, str], roles: dict[str, str | None]) -> tuple[Path, dict]:
    """sparkfleet.cluster under tmp_path with these modules and roles (None: a role without argument specs),
    and the environment that makes ansible-doc find it there (and nowhere else)."""
    root = tmp_path / "ansible_collections/sparkfleet/cluster"
    (root / "plugins/modules").mkdir(parents=True)
    (root / "galaxy.yml").write_text(
        "namespace: sparkfleet\nname: cluster\nversion: 1.0.0\nreadme: README.md\nauthors: [sparkfleet]\n"
    )
    (root / "README.md").write_text("# sparkfleet.cluster\n")
    for name, text in modules.items():
        (root / f"plugins/modules/{name}.py").write_text(text.replace("module: fake", f"module: {name}"))
    for name, spec in roles.items():
        (root / f"roles/{name}/tasks").mkdir(parents=True)
        (root / f"roles/{name}/tasks/main.yml").write_text("- ansible.builtin.debug: {msg: x}\n")
        if spec is not None:
            (root / f"roles/{name}/meta").mkdir()
            (root / f"roles/{name}/meta/argument_specs.yml").write_text(spec)
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path),
    }
    return root, env


def test_ansible_doc_renders_true_documentation(tmp_path):
    root, env = collection(
        tmp_path, {"a": module_text(), "b": module_text()}, {"r": ROLE.replace("DESCRIPTION", "Fine.")}
    )
    problems: list[str] = []
    checked = check_docs.check_ansible_doc(root, problems, env=env, cwd=tmp_path)
    assert checked == {"module": ["a", "b"], "role": ["r"]}
    assert problems == []


def test_ansible_doc_names_every_document_that_does_not_render(tmp_path):
    """Broken ones among good ones in one batch: ansible-doc stops at the first, each is still named."""
    modules = {
        "a_good": module_text(),
        "b_broken": module_text(**BROKEN),
        "c_good": module_text(),
        "d_broken": module_text(**BROKEN),
    }
    roles = {
        "r_broken": ROLE.replace("DESCRIPTION", "Fine., Not fine: a mapping"),
        "r_good": ROLE.replace("DESCRIPTION", "Fine."),
        "r_undocumented": None,
    }
    root, env = collection(tmp_path, modules, roles)
    problems: list[str] = []
    check_docs.check_ansible_doc(root, problems, env=env, cwd=tmp_path)
    for name in ("b_broken", "d_broken"):
        assert any(
            p.startswith(f"ansible-doc -t module sparkfleet.cluster.{name}: exit ")
            and f"Unable to retrieve documentation from 'sparkfleet.cluster.{name}'" in p
            for p in problems
        ), problems
    assert any(p.startswith("ansible-doc -t role sparkfleet.cluster.r_broken: exit ") for p in problems), (
        problems
    )
    assert (
        "ansible-doc -t role -l sparkfleet.cluster: does not list sparkfleet.cluster.r_undocumented"
        in problems
    )
    assert any(
        p.startswith("ansible-doc -t role sparkfleet.cluster.r_undocumented: no page rendered")
        for p in problems
    ), problems
    assert not [p for p in problems if "_good" in p], problems
