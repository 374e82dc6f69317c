"""The collection's own module_utils that the CLI and the lab share with the roles, loaded from their file.

Outside Ansible, `ansible_collections.sparkfleet.cluster...` imports only once Ansible's collection loader is
installed (sparkfleet.ansible_inprocess), and a package imported before it makes the loader refuse it later.
So a module_utils without imports of its own is loaded here from this checkout's plugins/module_utils by its
path, once, under a private name. `CONSTANTS` is plugins/module_utils/cluster_constants.py: the topologies and
node counts, the engine's ports, the state directory; `TEXT_FORMAT` is text_format.py: durations, byte counts
and text tables written as the roles write them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

CHECKOUT = Path(__file__).resolve().parents[2]  # python/sparkfleet/collection.py -> the checkout


def module_utils(name: str) -> ModuleType:
    """plugins/module_utils/<name>.py of this checkout (a file importing only the standard library)."""
    key = f"sparkfleet._module_utils.{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = CHECKOUT / "plugins" / "module_utils" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    if spec is None or spec.loader is None or not path.is_file():
        raise ImportError(f"{path} not found: the sparkfleet package runs from its checkout (make venv)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module


CONSTANTS = module_utils("cluster_constants")
TEXT_FORMAT = module_utils("text_format")
