"""Filters of role host_tuning: decisions its variables and its modules share (module_utils/boot.py)."""

from __future__ import annotations

from ansible_collections.sparkfleet.cluster.plugins.module_utils.boot import kho_auto as _kho_auto
from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import parse_kernel_config


def kho_auto(kconfig_lines: list[str] | None, release: str | None) -> bool:
    """Whether host_tuning_kho_off=auto adds kho=off for kernel `release`, from the lines its build options
    were read as (`grep ^CONFIG_...= /boot/config-<release>`; None when the file could not be read): the
    decision host_status makes on the node from the same file (module_utils/boot.py kho_auto)."""
    kconfig = None if kconfig_lines is None else parse_kernel_config("\n".join(str(x) for x in kconfig_lines))
    return _kho_auto(kconfig, release)


class FilterModule:
    def filters(self) -> dict:
        return {"kho_auto": kho_auto}
