#!/usr/bin/python
"""Ansible module: read a Spark's host state and check it against pinned expectations (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_status
short_description: The TP3 recipe's `prep-sparks status` as data, and the reasons a node needs a reboot
description:
  - Reads OS release, kernel and page size, NVIDIA driver, ConnectX-7 firmware, memory saver, THP, swap,
    kernel command line, live sysctls and the clock caps sparkfleet configured, and checks each against
    I(expect). Every check has a status (C(ok), C(off), C(n/a)) and, when off, how to fix it.
  - In a container (I(container=true)) checks of the kernel and hardware that are off report C(n/a), since
    they describe the host's kernel, not the node.
  - C(reboot_reasons) lists what only a reboot brings into effect - kernel arguments written to GRUB but not
    in /proc/cmdline, a 64K kernel installed but not running, packages that ask for one
    (/run/reboot-required).
  - Changes nothing.
options:
  expect:
    description: >-
      Expected values: os (dict distro id -> minimum version), kernel_min, page_size, driver_min,
      cx7_firmware_min, memory_saver (bool), thp, swap_min_mib, swapfile, sysctl (dict), gpu_cap_mhz,
      cpu_cap_mhz, cmdline_add (list), cmdline_remove (list), kernel_release (the 64K kernel, or null).
    type: dict
    required: true
  container:
    description: The node is a container.
    type: bool
    default: false
  state_dir:
    description: sparkfleet's state directory on the node.
    type: path
    default: /var/lib/sparkfleet
  run_dir:
    description: sparkfleet's runtime directory (a tmpfs).
    type: path
    default: /run/sparkfleet
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
  root:
    description: Prefix of every file read (tests).
    type: path
    default: /
  kernel_release:
    description: The running kernel release (default uname -r; tests).
    type: str
  page_size:
    description: The running kernel's page size (default the real one; tests).
    type: int
author: sparkfleet developers
"""

RETURN = r"""
facts:
  description: What was read.
  type: dict
  returned: always
checks:
  description: "Per check: check, value, expected, status (ok, off, n/a), fix."
  type: list
  returned: always
off:
  description: The checks that are off.
  type: list
  returned: always
reboot_reasons:
  description: Why this node needs a reboot (empty when it does not).
  type: list
  returned: always
report:
  description: One human line per check.
  type: list
  returned: always
"""

EXAMPLES = r"""
- name: Read and check the host
  sparkfleet.cluster.host_status:
    expect:
      os: {ubuntu: "24.04"}
      kernel_min: "6.11"
      driver_min: 580.95.05
      gpu_cap_mhz: 2300
  register: status
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import NodeProbe

# Checks that describe the kernel or the hardware: in a container that is the host's, not the node's.
HOST_BOUND = {
    "kernel",
    "page size",
    "kernel command line",
    "ConnectX-7 firmware",
    "memory saver",
    "THP",
    "swap",
    "sysctl",
}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def at_least(value: str | None, minimum: str) -> bool:
    return value is not None and version_tuple(value) >= version_tuple(minimum)


def collect(module: AnsibleModule, p: dict) -> dict:
    node = NodeProbe(p["root"], kernel_release=p["kernel_release"], page_size=p["page_size"])
    expect = p["expect"]
    caps = node.clock_caps(p["state_dir"], p["run_dir"])
    reboot = node.reboot_required()
    return {
        "os": node.os_release(),
        "kernel": node.kernel_release(),
        "page_size": node.page_size(),
        "cmdline": node.cmdline(),
        "driver": node.driver_version(module, p["nvidia_smi"]),
        "cx7_firmware": node.cx7_firmware(),
        "nvidia_uvm_loaded": node.nvidia_uvm_loaded(),
        "memory_saver": node.memory_saver(),
        "thp": node.thp(),
        "swap": node.swap(expect.get("swapfile")),
        "sysctl": {key: node.sysctl(key) for key in expect.get("sysctl") or {}},
        "gpu_cap_configured": caps["gpu_configured"],
        "gpu_cap_applied": caps["gpu_applied"],
        "cpu_cap_configured": caps["cpu_configured"],
        "reboot_required_file": reboot["required"],
        "reboot_required_pkgs": reboot["packages"],
    }


def check(name: str, value: object, expected: object, ok: bool, fix: str) -> dict:
    return {"check": name, "value": value, "expected": expected, "status": "ok" if ok else "off", "fix": fix}


def checks(f: dict, expect: dict) -> list[dict]:
    out = []
    wanted_os = expect.get("os") or {}
    os_ok = f["os"]["id"] in wanted_os and at_least(f["os"]["version"], str(wanted_os[f["os"]["id"]]))
    out.append(
        check(
            "OS release",
            f["os"]["name"],
            " or ".join(f"{k} >= {v}" for k, v in wanted_os.items()),
            os_ok,
            "install DGX OS 7 (Ubuntu 24.04) on this Spark",
        )
    )
    if expect.get("kernel_min"):
        out.append(
            check(
                "kernel",
                f["kernel"],
                f">= {expect['kernel_min']}",
                at_least(f["kernel"], str(expect["kernel_min"])),
                "update DGX OS (sudo apt update && sudo apt full-upgrade), then `sparkfleet reboot`",
            )
        )
    if expect.get("page_size"):
        profile = "64k" if int(expect["page_size"]) == 65536 else "stock"
        out.append(
            check(
                "page size",
                f["page_size"],
                int(expect["page_size"]),
                f["page_size"] == int(expect["page_size"]),
                f"host_tuning_kernel_profile: {profile} in group_vars, then `sparkfleet host` "
                "and `sparkfleet reboot`",
            )
        )
    add, remove = expect.get("cmdline_add") or [], expect.get("cmdline_remove") or []
    if add or remove:
        missing = [a for a in add if a not in f["cmdline"]]
        present = [w for w in remove if w in f["cmdline"]]
        names = {w.split("=")[0] for w in [*add, *remove]}
        relevant = [w for w in f["cmdline"] if w.split("=")[0] in names]
        out.append(
            check(
                "kernel command line",
                " ".join(relevant) or f"none of {', '.join(sorted(names))}",
                " ".join([*add, *(f"no {w}" for w in remove)]),
                not missing and not present,
                "`sparkfleet host` (writes the GRUB drop-in), then `sparkfleet reboot`",
            )
        )
    if expect.get("driver_min"):
        out.append(
            check(
                "NVIDIA driver",
                f["driver"] or "not found",
                f">= {expect['driver_min']}",
                at_least(f["driver"], str(expect["driver_min"])),
                "install the NVIDIA 580 driver of DGX OS (sudo apt full-upgrade), then `sparkfleet reboot`",
            )
        )
    if expect.get("cx7_firmware_min"):
        fw = f["cx7_firmware"]
        low = [hca for hca, v in fw.items() if not at_least(v, str(expect["cx7_firmware_min"]))]
        out.append(
            check(
                "ConnectX-7 firmware",
                ", ".join(f"{k} {v}" for k, v in sorted(fw.items()))
                or "no RDMA devices (mlx5_core not loaded?)",
                f">= {expect['cx7_firmware_min']}",
                bool(fw) and not low,
                "update the ConnectX-7 firmware (sudo fwupdmgr refresh && sudo fwupdmgr update, or NVIDIA's "
                "mlxfwmanager), then power-cycle the Spark",
            )
        )
    if expect.get("memory_saver") is not None:
        value = {
            True: "on (uvm_pack_sysmem_leaf_tables=Y)",
            False: "off (uvm_pack_sysmem_leaf_tables=N)",
        }.get(f["memory_saver"], "not available (nvidia_uvm lacks uvm_pack_sysmem_leaf_tables: stock module)")
        wanted = bool(expect["memory_saver"])
        out.append(
            check(
                "memory saver",
                value,
                "on" if wanted else "not required",
                (f["memory_saver"] is True) if wanted else True,
                "install the patched nvidia-uvm DKMS module of the TP3 recipe (memory saver), "
                "then `sparkfleet reboot`",
            )
        )
    if expect.get("thp"):
        out.append(
            check(
                "THP",
                f["thp"] or "?",
                expect["thp"],
                f["thp"] == expect["thp"],
                "`sparkfleet host` (sets the THP mode now and in /etc/tmpfiles.d)",
            )
        )
    if expect.get("swap_min_mib"):
        s = f["swap"]
        out.append(
            check(
                "swap",
                f"{s['active_mib']} MiB active ({', '.join(s['devices']) or 'none'})",
                f">= {expect['swap_min_mib']} MiB (never swappiness 0)",
                s["active_mib"] >= int(expect["swap_min_mib"]) * 0.98,
                "`sparkfleet host` (makes and switches on the swapfile)",
            )
        )
    wanted_sysctl = expect.get("sysctl") or {}
    if wanted_sysctl:
        wrong = {k: v for k, v in f["sysctl"].items() if v != " ".join(str(wanted_sysctl[k]).split())}
        out.append(
            check(
                "sysctl",
                ", ".join(f"{k}={v}" for k, v in sorted(f["sysctl"].items())),
                ", ".join(f"{k}={v}" for k, v in sorted(wanted_sysctl.items())),
                not wrong,
                "`sparkfleet host` (the same values on every node: a rank with a different reserve exits)",
            )
        )
    if expect.get("gpu_cap_mhz") is not None:
        want = int(expect["gpu_cap_mhz"])
        conf, applied = f["gpu_cap_configured"], f["gpu_cap_applied"]
        out.append(
            check(
                "GPU clock cap",
                f"configured {'never' if conf is None else conf} MHz, applied since boot "
                f"{'nothing' if applied is None else f'{applied} MHz'}",
                f"{want} MHz (0 = stock)",
                conf == want and applied == want,
                f"`sparkfleet clocks set {want}`" if want else "`sparkfleet clocks reset`",
            )
        )
    if expect.get("cpu_cap_mhz") is not None:
        want = int(expect["cpu_cap_mhz"])
        conf = f["cpu_cap_configured"]
        out.append(
            check(
                "CPU clock cap",
                f"configured {'never' if conf is None else conf} MHz",
                f"{want} MHz (0 = stock)",
                conf == want or (conf is None and want == 0),
                "`sparkfleet clocks set <GPU MHz> -e gpu_clocks_cpu_cap_mhz=N` or `sparkfleet clocks`",
            )
        )
    return out


def reboot_reasons(f: dict, expect: dict, container: bool) -> list[str]:
    reasons = []
    if not container:
        add, remove = expect.get("cmdline_add") or [], expect.get("cmdline_remove") or []
        missing = [a for a in add if a not in f["cmdline"]]
        present = [w for w in remove if w in f["cmdline"]]
        if missing or present:
            what = ", ".join([*(f"{a} missing" for a in missing), *(f"{w} still present" for w in present)])
            reasons.append(f"kernel command line: {what} (written to GRUB, active after a reboot)")
        release = expect.get("kernel_release")
        if release and f["kernel"] != release:
            reasons.append(f"64K kernel {release} is installed and staged; running {f['kernel']}")
    if f["reboot_required_file"]:
        pkgs = ", ".join(f["reboot_required_pkgs"]) or "packages"
        reasons.append(f"/run/reboot-required: {pkgs} asked for a reboot")
    return reasons


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "expect": {"type": "dict", "required": True},
            "container": {"type": "bool", "default": False},
            "state_dir": {"type": "path", "default": "/var/lib/sparkfleet"},
            "run_dir": {"type": "path", "default": "/run/sparkfleet"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "root": {"type": "path", "default": "/"},
            "kernel_release": {"type": "str"},
            "page_size": {"type": "int"},
        },
        supports_check_mode=True,
    )
    p = module.params
    facts = collect(module, p)
    results = checks(facts, p["expect"])
    for c in results:
        if p["container"] and c["check"] == "kernel command line":
            c["status"] = "n/a"  # /proc/cmdline is the host's; the node's GRUB drop-in is checked by the role
            c["fix"] = "a container boots no kernel of its own"
        elif p["container"] and c["status"] == "off" and c["check"] in HOST_BOUND:
            c["status"] = "n/a"
            c["fix"] = "a container: this is the host's kernel or hardware, not the node's"
    s = facts["swap"]
    swap_check = next((c for c in results if c["check"] == "swap"), None)
    if swap_check and p["container"] and s.get("swapfile_signature"):
        swap_check["value"] += (
            f"; {s['swapfile']} made ({s['swapfile_mib']} MiB), not switched on in a container"
        )
    report = [
        f"{c['status']:>3}  {c['check']}: {c['value']}"
        + ("" if c["status"] == "ok" else f" (expected {c['expected']}; {c['fix']})")
        for c in results
    ]
    module.exit_json(
        changed=False,
        facts=facts,
        checks=results,
        off=[c for c in results if c["status"] == "off"],
        reboot_reasons=reboot_reasons(facts, p["expect"], p["container"]),
        report=report,
    )


if __name__ == "__main__":
    main()
