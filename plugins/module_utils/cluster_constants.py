"""Cluster-wide constants, in one place: the topologies and their node counts, the engine's ports on the head
and sparkfleet's state directory on every node.

Imported by the filters, modules and action plugins (`from
ansible_collections.sparkfleet.cluster.plugins.module_utils.cluster_constants import ...`), by the CLI and by
the lab (python/sparkfleet/collection.py loads this file by its path), and handed to Jinja by the filter
`sparkfleet.cluster.cluster_constant` (plugins/filter/cluster.py). Where Ansible needs a literal (a role's
defaults/main.yml and meta/argument_specs.yml, a module's DOCUMENTATION, the sample inventories), the literal
stays and tests/unit/test_cluster_constants.py fails when it differs from the value here.

No imports at all: this file is also loaded outside Ansible, on its own.
"""

# sparkfleet_topology -> how many DGX Sparks (and engine ranks: one per node, TP = node count)
NODE_COUNT = {"tp2": 2, "tp3": 3}
TOPOLOGIES = tuple(NODE_COUNT)

# What sparkfleet records on each node (resolved pins, clock caps, the weights record): sparkfleet_state_dir
STATE_DIR = "/var/lib/sparkfleet"

# The engine's ports on the head, per topology: its API (engine_service_port; the TP2 recipe's 8888, the TP3
# recipe card's 18002) and the rendezvous of the ranks (engine_service_master_port; the receipts' 29571 for
# TP2, the engine's default 29551 for TP3). Role engine_service README "The TP2/TP3 sample inventory".
API_PORT = {"tp2": 8888, "tp3": 18002}
MASTER_PORT = {"tp2": 29571, "tp3": 29551}

# The names the filter cluster_constant takes; those in PER_TOPOLOGY need a topology.
CONSTANTS = {
    "topologies": list(TOPOLOGIES),
    "node_count": NODE_COUNT,
    "state_dir": STATE_DIR,
    "api_port": API_PORT,
    "master_port": MASTER_PORT,
}
PER_TOPOLOGY = ("node_count", "api_port", "master_port")


def constant(name: str, topology: str | None = None) -> object:
    """The constant `name`; for those per topology, its value for `topology`. ValueError names the fix."""
    if name not in CONSTANTS:
        raise ValueError(f"cluster constant {name!r}: expected one of {', '.join(CONSTANTS)}")
    if name not in PER_TOPOLOGY:
        return CONSTANTS[name]
    if topology not in NODE_COUNT:
        raise ValueError(
            f"sparkfleet_topology={topology!r}: expected one of {', '.join(TOPOLOGIES)} "
            "(group_vars/all/cluster.yml)"
        )
    return CONSTANTS[name][topology]
