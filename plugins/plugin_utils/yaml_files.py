"""YAML files the controller-side plugins read (a role's meta/argument_specs.yml and defaults, galaxy.yml),
parsed with libyaml when PyYAML has it.

Why: the validate and phase_state actions run in the worker process forked for each task and node, and each
worker parses its role's files again (nothing a worker reads outlives it). PyYAML's pure-Python parser took
33 of the 55 ms a phase gate spent computing its digest, per node (cProfile of every worker of a no-op TP2
`site.yml`); libyaml's parser gives the same data (the constructor, PyYAML's SafeConstructor, is the same)
in a fraction of the time. Without libyaml, PyYAML's own parser, as before.
"""

from __future__ import annotations

from typing import Any

import yaml

# the safe constructor either way: only plain data (no Python objects) comes out of these files
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    """The data of one YAML document, as yaml.safe_load gives it."""
    return yaml.load(text, Loader=LOADER)  # noqa: S506 - LOADER is CSafeLoader or SafeLoader, never an unsafe one
