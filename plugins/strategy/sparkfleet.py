"""sparkfleet's default strategy (ansible.cfg: strategy = sparkfleet): mitogen's linear strategy when the
pinned mitogen package is installed (requirements/lock.txt; `make venv`), else ansible's own linear one.

mitogen keeps one Python interpreter per node for the whole run instead of starting one per task: the
same tasks in the same order, a no-op re-run 1.7-2x as fast in the lab (README, "Speed"). To run without it:
SPARKFLEET_STRATEGY=linear (sparkfleet) or ANSIBLE_STRATEGY=linear (ansible-playbook).
"""

from __future__ import annotations

from ansible.utils.display import Display

try:
    from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule
except ImportError:  # plain Ansible without mitogen (an execution environment built without it, say)
    from ansible.plugins.strategy.linear import StrategyModule

    Display().warning(
        "sparkfleet: the mitogen package is not installed; running with ansible's linear strategy "
        "(the same result, slower: install requirements/lock.txt)"
    )

__all__ = ["StrategyModule"]
