"""Ansible in this process, set up as its own command-line tools set it up.

sparkfleet reads the inventory in-process (`sparkfleet plan`, the cluster lock's head variables) with
Ansible's InventoryManager and VariableManager. A VariableManager loads ansible.cfg's fact cache plugin,
and that is a collection's (`sparkfleet.cluster.facts`): plugins of collections, `ansible.builtin.*`
included, are found only once Ansible's collection loader is installed, which its CLIs do at start
(`init_plugin_loader`). This is the one place sparkfleet does that.
"""

from __future__ import annotations

import os
from pathlib import Path


def init_ansible(project: Path) -> None:
    """Read the project's ansible.cfg (Ansible reads its configuration once, at import) and install
    Ansible's plugin and collection loaders, once per process."""
    os.environ["ANSIBLE_CONFIG"] = str(project / "ansible.cfg")
    from ansible.plugins.loader import init_plugin_loader
    from ansible.utils.collection_loader import AnsibleCollectionConfig

    if AnsibleCollectionConfig.collection_finder is None:
        init_plugin_loader()
