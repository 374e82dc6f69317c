"""scripts/check-docs.py (run by `make lint`) finds documentation that is not the truth: a fake module whose
DOCUMENTATION disagrees with the argument spec it builds, YAML with a duplicate key, a filter whose
options are not its parameters. The real plugins pass it (make lint runs it on them)."""

from __future__ import annotations

import importlib.util
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


def problems_of(tmp_path: Path, **parts: str) -> list[str]:
    text = MODULE
    for key, value in {"DEFAULT_SIZE": "2", "DOC_ONLY": "", "SPEC_ONLY": "", **parts}.items():
        text = text.replace(key, value)
    path = tmp_path / "fake.py"
    path.write_text(text)
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
