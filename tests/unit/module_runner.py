"""A collection module's run, with its arguments as Ansible passes them and the JSON result it prints.

`run(name, args, env, real=False)` calls the module's main() in this process: its arguments through
ansible-core's own test seam (ansible.module_utils.testing.patch_module_args), os.environ set to `env` for
the run (what a module process would have had: PATH to the test's stand-ins, their state files), stdout
captured, the exit of exit_json / fail_json caught, the warnings and deprecations AnsibleModule collects in
module globals started empty and put back afterwards. A pytest process has imported Ansible's controller,
and module_utils then behaves as the controller (a module's warn() goes to the controller's display instead
of the result, the controller's JSON encoder and traceback settings): for the run it is told it is not the
controller (module_utils._internal.is_controller, _traceback._is_traceback_enabled), as in a module's own
process. What the module does is the same code as in a run of its own; what it costs is not a Python
process and the import of ansible.module_utils per case.
`real=True` runs the module file as Ansible's AnsiballZ does, a Python process of its own reading its
arguments from a file: each test module that runs a module keeps at least one such run, so the real entry
point (the argument file, __main__, the JSON on stdout) stays tested.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from unittest import mock

from ansible.module_utils import _internal as module_utils_internal
from ansible.module_utils._internal import _traceback
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "plugins/modules"
PACKAGE = "ansible_collections.sparkfleet.cluster.plugins.modules"


def run(name: str, args: dict[str, Any], env: Mapping[str, str] | None = None, real: bool = False) -> dict:
    """The module's result: what it printed, parsed (exit_json's or fail_json's document)."""
    return (subprocess_run if real else in_process)(name, args, env)


def in_process(
    name: str, args: dict[str, Any], env: Mapping[str, str] | None = None, package: str = PACKAGE
) -> dict:
    """`package`: another module package (ansible.modules: Ansible's own, for a comparison)."""
    module = importlib.import_module(f"{package}.{name}")
    out = io.StringIO()
    with (
        patch_module_args(args),
        mock.patch.dict(os.environ, dict(env) if env is not None else {}, clear=env is not None),
        mock.patch.dict(ansible_warnings._global_warnings, clear=True),
        mock.patch.dict(ansible_warnings._global_deprecations, clear=True),
        mock.patch.object(module_utils_internal, "is_controller", False),
        mock.patch.object(_traceback, "_is_traceback_enabled", _traceback._is_module_traceback_enabled),
        contextlib.redirect_stdout(out),
    ):
        try:
            module.main()
        except SystemExit:
            pass  # exit_json (0) or fail_json (1): the document printed says which
        else:
            raise AssertionError(f"{name}: main() returned without exit_json or fail_json")
    return json.loads(out.getvalue())


def subprocess_run(name: str, args: dict[str, Any], env: Mapping[str, str] | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"sparkfleet-{name}-") as tmp:
        argfile = Path(tmp) / "args.json"
        argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        proc = subprocess.run(
            [sys.executable, str(MODULES / f"{name}.py"), str(argfile)],
            capture_output=True,
            text=True,
            check=False,
            env=dict(env) if env is not None else None,
        )
    assert proc.stdout.strip(), f"{name}: no result on stdout (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)
