#!/usr/bin/python
"""Ansible module: read a Spark's host state and check it against pinned expectations (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_status
short_description: The TP3 recipe's `prep-sparks status` as data, its readiness table, and the reboot reasons
description:
  - >-
    Reads OS release, kernel and page size, NVIDIA driver, board firmware (BIOS from DMI; SoC, EC and PD from
    C(fwupdmgr get-devices --json)), ConnectX-7 firmware (C(fw_ver) of the RDMA devices), memory saver, THP,
    swap, kernel command line, live sysctls and the clock caps sparkfleet configured, and checks each against
    I(expect). Every check has a status (C(ok), C(off), C(n/a), C(warn)) and, when not ok, how to fix it.
  - >-
    C(NVIDIA driver family) is ok in I(expect.driver_family) (580), a warning with the reason on 590.x (it
    runs, and deadlocks in CUDA-graph capture on GB10), off in any other family. C(next kernel) reads the
    kernel the next boot runs (a C(grub-reboot) entry, else GRUB_DEFAULT, resolved in grub.cfg; else the
    newest /boot/vmlinuz-*) and is off when /lib/modules/<that kernel> has no nvidia.ko: a reboot into it
    loses the GPU (playbooks/reboot.yml refuses it). It is n/a where /boot has no kernel (a container).
  - >-
    C(readiness) groups the checks a TP3 cluster needs before the engine may start (I(expect.ready_checks):
    page size, memory saver, firmware, kernel pair), one entry per item, ready or not, with what is missing.
    A check that cannot be read here (C(n/a)) leaves its item not ready (unverified is not ready).
  - >-
    In a container (I(container=true)) checks of the kernel and hardware that are off report C(n/a), as
    they describe the host's kernel, not the node. The ConnectX-7 firmware read from a stand-in tree
    (I(sysfs_root) other than /sys, the lab's) is the node's own and is checked.
  - >-
    C(reboot_reasons) lists what only a reboot brings into effect, i.e. kernel arguments written to GRUB
    but not in /proc/cmdline, a 64K kernel installed but not running, packages that ask for one
    (/run/reboot-required).
  - >-
    Degrades, never crashes: a tool or file it cannot read makes its checks C(n/a) with what could not be read
    (a missing nvidia-smi, a missing systemd-detect-virt, an unreadable file), and the rest is reported.
  - >-
    Changes nothing.
options:
  expect:
    description: >-
      Expected values: os (dict distro id -> minimum version), kernel_min, page_size, driver_min,
      driver_family, firmware_min (dict bios, soc, ec, pd, connectx7 -> minimum version), memory_saver
      (bool: required), memory_saver_pairs and kernel_pairs (lists of {kernel, driver}), thp, swap_min_mib,
      swapfile, sysctl (dict), gpu_cap_mhz (0 = stock: never capped is ok), cpu_cap_mhz, cmdline_add (list),
      cmdline_remove (list),
      kernel_release (the 64K kernel, or null), ready_checks (list).
    type: dict
    required: true
  container:
    description: >-
      The node is a container. Unset: detected here (I(systemd_detect_virt), else the files container
      runtimes leave: /run/systemd/container, /.dockerenv, /run/.containerenv, container= in PID 1's
      environment); C(facts.container) says what was decided.
    type: bool
  systemd_detect_virt:
    description: >-
      The systemd-detect-virt executable (on a node without it the files decide, and a row says so).
    type: str
    default: systemd-detect-virt
  state_dir:
    description: sparkfleet's state directory on the node.
    type: path
    default: /var/lib/sparkfleet
  run_dir:
    description: sparkfleet's runtime directory (a tmpfs).
    type: path
    default: /run/sparkfleet
  sysfs_root:
    description: Where the RDMA devices are read (/sys; the lab's stand-in tree elsewhere).
    type: path
    default: /sys
  nvidia_smi:
    description: The nvidia-smi executable.
    type: str
    default: nvidia-smi
  fwupdmgr:
    description: The fwupdmgr executable.
    type: str
    default: fwupdmgr
  kho_off:
    description: >-
      Decide here whether I(expect.cmdline_add) gets C(kho=off) (C(on), C(off), or C(auto): where the build
      options of kernel I(kconfig_release), its /boot/config, enable Kexec HandOver by default; without that
      file, a 7.x or later release), in the same round trip. Unset: I(expect.cmdline_add) is taken as given.
    type: str
    choices: [auto, "on", "off"]
  kconfig_release:
    description: The kernel whose build options C(auto) reads (the kernel the next boot runs); empty = none.
    type: str
    default: ""
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
  description: "Per check: check, value, expected, status (ok, off, n/a, warn), fix."
  type: list
  returned: always
warned:
  description: The checks that warn (they run, with a known problem; also Ansible warnings).
  type: list
  returned: always
"off":
  description: The checks that are off.
  type: list
  returned: always
readiness:
  description: "Per item of expect.ready_checks: item, ready (bool), missing (one line per check not ok)."
  type: list
  returned: always
not_ready:
  description: "One line per item and per missing check: '<item>: <what>' (empty when ready)."
  type: list
  returned: always
readiness_report:
  description: "One line per readiness item: 'ready      <item>' or 'NOT READY  <item>'."
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
    expect: {os: {ubuntu: "24.04"}, kernel_min: "6.11", driver_min: "580.95.05"}
"""

import re
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils import boot, clock_state
from ansible_collections.sparkfleet.cluster.plugins.module_utils.node import NodeProbe

# Checks that describe the kernel or the hardware: in a container that is the host's, not the node's.
HOST_BOUND = {
    "kernel",
    "page size",
    "kernel command line",
    "BIOS firmware",
    "SoC firmware",
    "EC firmware",
    "PD firmware",
    "ConnectX-7 firmware",
    "memory saver",
    "kernel pair",
    "THP",
    "swap",
    "sysctl",
}
FIRMWARE = {  # component -> check name, where it is read, how to update it
    "bios": (
        "BIOS firmware",
        "/sys/class/dmi/id/bios_version",
        "the DGX OS firmware update (fwupdmgr update)",
    ),
    "soc": ("SoC firmware", "fwupdmgr get-devices", "the DGX OS firmware update (fwupdmgr update)"),
    "ec": ("EC firmware", "fwupdmgr get-devices", "the DGX OS firmware update (fwupdmgr update)"),
    "pd": (
        "PD firmware",
        "fwupdmgr get-devices",
        "the DGX OS firmware update (fwupdmgr update), then unplug AC",
    ),
    "connectx7": (
        "ConnectX-7 firmware",
        "fw_ver of the RDMA devices",
        "update the ConnectX-7 firmware (sudo fwupdmgr refresh && sudo fwupdmgr update, or NVIDIA's "
        "mlxfwmanager), then power-cycle the Spark",
    ),
}
READY_ITEMS = {  # readiness item -> the checks it needs
    "page size": ("page size",),
    "memory saver": ("memory saver", "swap"),
    "firmware": tuple(name for name, _where, _fix in FIRMWARE.values()),
    "kernel pair": ("kernel pair",),
}
HEX = re.compile(r"^0x[0-9A-Fa-f]+$")
# Driver families that run but are known bad on a GB10: a warning with the reason, not a refusal.
DRIVER_FAMILY_WARN = {
    "590": "590.x deadlocks in CUDA-graph capture on GB10 (eugr/spark-vllm-docker README, 2026-03-12 entry): "
    "stay on 580",
}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def at_least(value: str | None, minimum: str) -> bool:
    return value is not None and version_tuple(value) >= version_tuple(minimum)


def _hex_dotted(text: str) -> tuple[int, ...]:
    """fwupd's hex form of a Spark's board firmware, 0xAABBBBCC, as the dotted AA.BBBB.CC that DMI and
    fwupd's other formats print (0x03000508 = 3.5.8, 0x02009b0b = 2.155.11, 0x00000516 = 0.5.22)."""
    n = int(text, 16)
    return ((n >> 24) & 0xFF, (n >> 8) & 0xFFFF, n & 0xFF)


def firmware_at_least(value: str | None, minimum: str) -> bool | None:
    """Whether a firmware version is at least the minimum; None when the two cannot be compared (another
    vendor's format). Hex against hex compares the numbers, hex against dotted the dotted forms, anything
    else only when both have the same shape (the same letters around the numbers, e.g. 5.36_0ACUM027)."""
    if value is None:
        return False
    value, minimum = value.strip(), str(minimum).strip()
    if HEX.match(value) and HEX.match(minimum):
        return int(value, 16) >= int(minimum, 16)
    if HEX.match(value) or HEX.match(minimum):
        left = _hex_dotted(value) if HEX.match(value) else version_tuple(value)
        right = _hex_dotted(minimum) if HEX.match(minimum) else version_tuple(minimum)
        return left >= right if len(left) == len(right) else None
    if re.sub(r"\d+", "#", value) != re.sub(r"\d+", "#", minimum):
        return None
    return version_tuple(value) >= version_tuple(minimum)


# fact -> the checks that read it: when the fact cannot be read, they are n/a and say why
FACT_CHECKS = {
    "os": ("OS release",),
    "kernel": ("kernel", "kernel pair"),
    "page_size": ("page size",),
    "cmdline": ("kernel command line",),
    "driver": ("NVIDIA driver", "NVIDIA driver family", "kernel pair", "memory saver"),
    "next_kernel": ("next kernel",),
    "firmware": tuple(name for name, _where, _fix in FIRMWARE.values() if name != "ConnectX-7 firmware"),
    "cx7_firmware": ("ConnectX-7 firmware",),
    "memory_saver": ("memory saver",),
    "thp": ("THP",),
    "swap": ("swap", "memory saver"),
    "sysctl": ("sysctl",),
    "clock_caps": ("GPU clock cap", "CPU clock cap"),
    "gpu_cap_verify": ("GPU clock cap",),
}


def _read(unreadable: dict[str, str], fact: str, read: Callable[[], object], default: object) -> object:
    """One fact, or `default` with why it could not be read: a reader that fails is a row, never a crash."""
    try:
        return read()
    except Exception as err:  # any failure of one reader leaves the report standing
        unreadable[fact] = f"{type(err).__name__}: {err}"
        return default


def next_kernel(root: str) -> dict:
    """The kernel the next boot runs (module_utils/boot.py) and the NVIDIA modules it has."""
    found = boot.next_kernel(root)
    found["nvidia_modules"] = boot.nvidia_modules(found["release"], root) if found["release"] else []
    return found


def collect(module: AnsibleModule, p: dict) -> dict:
    node = NodeProbe(p["root"], kernel_release=p["kernel_release"], page_size=p["page_size"])
    expect = p["expect"]
    bad: dict[str, str] = {}
    caps = _read(bad, "clock_caps", lambda: node.clock_caps(p["state_dir"], p["run_dir"]), {})
    reboot = _read(bad, "reboot_required", node.reboot_required, {"required": False, "packages": []})
    wanted_fw = expect.get("firmware_min") or {}
    board = (
        _read(
            bad, "firmware", lambda: node.board_firmware(module, p["fwupdmgr"]), {"versions": {}, "error": ""}
        )
        if {"soc", "ec", "pd"} & set(wanted_fw)
        else {"versions": {}, "error": ""}
    )
    driver = _read(
        bad, "driver", lambda: node.driver(module, p["nvidia_smi"]), {"version": None, "missing": ""}
    )
    virt = _read(
        bad,
        "container",
        lambda: node.container(module, p["systemd_detect_virt"]),
        {"container": False, "how": "not read", "missing": ""},
    )
    facts = {
        "os": _read(bad, "os", node.os_release, {"id": "?", "version": "?", "name": "?"}),
        "kernel": _read(bad, "kernel", node.kernel_release, "?"),
        "page_size": _read(bad, "page_size", node.page_size, None),
        "cmdline": _read(bad, "cmdline", node.cmdline, []),
        "driver": driver["version"],
        "driver_missing": driver["missing"],
        "next_kernel": _read(bad, "next_kernel", lambda: next_kernel(p["root"]), None),
        "firmware": {"bios": _read(bad, "firmware", node.bios_version, None), **board["versions"]},
        "firmware_error": board["error"],
        "cx7_firmware": _read(bad, "cx7_firmware", lambda: node.cx7_firmware(p["sysfs_root"]), {}),
        "nvidia_uvm_loaded": _read(bad, "memory_saver", node.nvidia_uvm_loaded, False),
        "memory_saver": _read(bad, "memory_saver", node.memory_saver, None),
        "thp": _read(bad, "thp", node.thp, None),
        "swap": _read(
            bad,
            "swap",
            lambda: node.swap(expect.get("swapfile")),
            {"active_mib": 0, "devices": [], "swapfile": expect.get("swapfile")},
        ),
        "sysctl": _read(
            bad, "sysctl", lambda: {key: node.sysctl(key) for key in expect.get("sysctl") or {}}, {}
        ),
        "gpu_cap_configured": caps.get("gpu_configured"),
        "gpu_cap_applied": caps.get("gpu_applied"),
        "gpu_cap_verify": _read(
            bad,
            "gpu_cap_verify",
            lambda: clock_state.read_verify(node.path(clock_state.verify_path(p["run_dir"]))),
            None,
        ),
        "cpu_cap_configured": caps.get("cpu_configured"),
        "reboot_required_file": reboot["required"],
        "reboot_required_pkgs": reboot["packages"],
        "virtualization": virt,
        "container": virt["container"] if p["container"] is None else p["container"],
    }
    facts["unreadable"] = bad
    return facts


def check(name: str, value: object, expected: object, ok: bool, fix: str) -> dict:
    return {"check": name, "value": value, "expected": expected, "status": "ok" if ok else "off", "fix": fix}


def pair_listed(kernel: str, driver: str | None, pairs: list) -> bool:
    return any(str(x.get("kernel")) == kernel and str(x.get("driver")) == str(driver) for x in pairs or [])


def pairs_text(pairs: list) -> str:
    return " or ".join(f"{x.get('kernel')} + driver {x.get('driver')}" for x in pairs or []) or "none listed"


# ---- the checks, one function each: (facts, expect) -> list of checks -----------------------------------
def c_os(f: dict, expect: dict) -> list[dict]:
    wanted = expect.get("os") or {}
    ok = f["os"]["id"] in wanted and at_least(f["os"]["version"], str(wanted[f["os"]["id"]]))
    expected = " or ".join(f"{k} >= {v}" for k, v in wanted.items())
    return [
        check("OS release", f["os"]["name"], expected, ok, "install DGX OS 7 (Ubuntu 24.04) on this Spark")
    ]


def c_kernel(f: dict, expect: dict) -> list[dict]:
    out = []
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
        profile = "stock" if int(expect["page_size"]) == 4096 else "64k"
        out.append(
            check(
                "page size",
                f["page_size"],
                int(expect["page_size"]),
                f["page_size"] == int(expect["page_size"]),
                f"host_tuning_kernel_profile: {profile} in group_vars, then `sparkfleet host` "
                "and `sparkfleet reboot -e host_tuning_reboot=allowed` (getconf PAGESIZE must say "
                f"{int(expect['page_size'])})",
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
    return out


def c_driver(f: dict, expect: dict) -> list[dict]:
    out = []
    if expect.get("driver_min"):
        out.append(
            check(
                "NVIDIA driver",
                f["driver"] or f"not found: {f.get('driver_missing') or 'no driver'}",
                f">= {expect['driver_min']}",
                at_least(f["driver"], str(expect["driver_min"])),
                "install the NVIDIA 580 driver of DGX OS (sudo apt full-upgrade), then `sparkfleet reboot`",
            )
        )
    family = str(expect.get("driver_family") or "")
    if family:
        major = f["driver"].split(".")[0] if f["driver"] else None
        found = f"{f['driver']} (the {major} family)" if f["driver"] else "not found"
        c = check(
            "NVIDIA driver family",
            found,
            f"the {family} family",
            major == family,
            f"install the NVIDIA {family} driver of DGX OS (nvidia-driver-{family}-open and the "
            f"linux-modules-nvidia-{family}-open package of the kernel), then `sparkfleet reboot`",
        )
        if major in DRIVER_FAMILY_WARN and major != family:
            c.update(status="warn", fix=f"{DRIVER_FAMILY_WARN[major]}; {c['fix']}")
        out.append(c)
    pairs = expect.get("kernel_pairs") or []
    if pairs:
        out.append(
            check(
                "kernel pair",
                f"{f['kernel']} + driver {f['driver'] or 'not found'}",
                pairs_text(pairs),
                pair_listed(f["kernel"], f["driver"], pairs),
                "run a validated kernel/driver pair (host_tuning_kernel_pairs; the 64K kernel and its "
                "NVIDIA modules: host_tuning_kernel_64k_*), then `sparkfleet reboot`",
            )
        )
    return out


def c_next_kernel(f: dict, expect: dict) -> list[dict]:
    """The kernel the next boot runs has an NVIDIA module (a reboot into one without it loses the GPU)."""
    nk = f.get("next_kernel")
    if not nk:
        return []  # not readable: checks() reports why
    if nk["release"] is None:
        c = check("next kernel", f"none installed ({nk['how']})", "an NVIDIA module", False, "")
        c.update(status="n/a", fix="no kernel in /boot to boot (a container boots none)")
        return [c]
    modules = nk["nvidia_modules"]
    value = f"{nk['release']} ({nk['how']}): " + (
        ", ".join(modules) if modules else f"no nvidia.ko under /lib/modules/{nk['release']}"
    )
    return [
        check(
            "next kernel",
            value,
            "an nvidia.ko for the kernel the next boot runs",
            bool(modules),
            f"install the NVIDIA modules built for {nk['release']} (linux-modules-nvidia-"
            f"{expect.get('driver_family') or '580'}-open-{nk['release']}, the version of its kernel "
            "package) before any reboot, or make GRUB boot a kernel that has them; booting it leaves the "
            "node without a GPU",
        )
    ]


def c_firmware(f: dict, expect: dict) -> list[dict]:
    out = []
    for component, minimum in (expect.get("firmware_min") or {}).items():
        if component not in FIRMWARE or minimum in (None, ""):
            continue
        name, where, fix = FIRMWARE[component]
        if component == "connectx7":
            fw = f["cx7_firmware"]
            value = (
                ", ".join(f"{k} {v}" for k, v in sorted(fw.items()))
                or "no RDMA devices (mlx5_core not loaded?)"
            )
            verdicts = [firmware_at_least(v, minimum) for v in fw.values()]
        else:
            found = f["firmware"].get(component)
            value = found or f"not readable ({f['firmware_error'] or where + ' gives nothing'})"
            verdicts = [firmware_at_least(found, minimum)] if found else [False]
        if any(v is None for v in verdicts):
            fix = (
                f"the version is in another format than {minimum!r}: set host_tuning_firmware_min."
                f"{component} to this board's minimum in its own format (or remove the key), in "
                "group_vars/all/host.yml"
            )
        out.append(check(name, value, f">= {minimum}", bool(verdicts) and all(verdicts), fix))
    return out


def c_memory_saver(f: dict, expect: dict) -> list[dict]:
    if expect.get("memory_saver") is None:
        return []
    wanted = bool(expect["memory_saver"])
    value = {
        True: "on (uvm_pack_sysmem_leaf_tables=Y)",
        False: "off (uvm_pack_sysmem_leaf_tables=N)",
    }.get(f["memory_saver"], "not available (nvidia_uvm lacks uvm_pack_sysmem_leaf_tables: stock module)")
    pairs = expect.get("memory_saver_pairs") or []
    validated = pair_listed(f["kernel"], f["driver"], pairs)
    if wanted:
        value += f"; {f['kernel']} + driver {f['driver'] or 'not found'} " + (
            "is a validated pair" if validated else f"is not a validated pair ({pairs_text(pairs)})"
        )
    return [
        check(
            "memory saver",
            value,
            "on, on a validated kernel/driver pair" if wanted else "not required",
            (f["memory_saver"] is True and validated) if wanted else True,
            "host_tuning_memory_saver_install: true (the patched nvidia-uvm DKMS module) on the pair it was "
            "validated on (host_tuning_memory_saver_pairs), then `sparkfleet host` and `sparkfleet reboot`",
        )
    ]


def c_memory(f: dict, expect: dict) -> list[dict]:
    out = []
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
                "`sparkfleet host` (makes and switches on the swapfile for this kernel's page size)",
            )
        )
    wanted = expect.get("sysctl") or {}
    if wanted:
        wrong = {k: v for k, v in f["sysctl"].items() if v != " ".join(str(wanted[k]).split())}
        out.append(
            check(
                "sysctl",
                ", ".join(f"{k}={v}" for k, v in sorted(f["sysctl"].items())),
                ", ".join(f"{k}={v}" for k, v in sorted(wanted.items())),
                not wrong,
                "`sparkfleet host` (the same values on every node: a rank with a different reserve exits)",
            )
        )
    return out


def c_clocks(f: dict, expect: dict) -> list[dict]:
    out = []
    if expect.get("gpu_cap_mhz") is not None:
        want = int(expect["gpu_cap_mhz"])
        conf, applied, verify = f["gpu_cap_configured"], f["gpu_cap_applied"], f["gpu_cap_verify"]
        value = (
            f"configured {'never' if conf is None else conf} MHz, applied since boot "
            f"{'nothing' if applied is None else f'{applied} MHz'}"
        )
        checked = bool(verify and verify["cap"] == applied and applied)
        not_taken = checked and verify["result"] == "not-taken"
        if not_taken:
            value += f", NOT TAKEN (SM clock {verify['sm_mhz']} MHz right after -lgc)"
        elif checked and verify["result"] == "unverified":
            value += " (not verified: the GPU idled during the check; `sparkfleet clocks show` under load)"
        # stock wanted: never configured or 0, and no cap applied since this boot (a boot starts at stock)
        stock = want == 0 and conf in (None, 0) and applied in (None, 0)
        out.append(
            check(
                "GPU clock cap",
                value,
                f"{want} MHz (0 = stock)",
                stock or (conf == want and applied == want and not not_taken),
                "-lgc answered success without pinning the clock (GB10 can): check the clock under load with "
                "`sparkfleet clocks show` while the engine serves"
                if not_taken
                else (f"`sparkfleet clocks set {want}`" if want else "`sparkfleet clocks reset`"),
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


CHECKS: tuple[Callable[[dict, dict], list[dict]], ...] = (
    c_os,
    c_kernel,
    c_driver,
    c_next_kernel,
    c_firmware,
    c_memory_saver,
    c_memory,
    c_clocks,
)


def checks(f: dict, expect: dict) -> list[dict]:
    results = [c for fn in CHECKS for c in fn(f, expect)]
    unreadable = f.get("unreadable") or {}
    by_name = {c["check"]: c for c in results}
    for fact, error in unreadable.items():
        names = [n for n in FACT_CHECKS.get(fact, ()) if n in by_name]
        for name in names:
            c = by_name[name]
            c.update(
                status="n/a", value=f"not readable ({fact}): {error}", fix="see why it could not be read"
            )
        if not names:
            results.append(
                check(f"read {fact}", f"not readable: {error}", "readable", False, "see the error")
            )
            results[-1]["status"] = "n/a"
    virt = f.get("virtualization") or {}
    if virt.get("missing"):
        results.append(
            {
                "check": "container detection",
                "value": f"{virt['missing']}; {virt['how']}",
                "expected": "systemd-detect-virt --container answers",
                "status": "n/a",
                "fix": "install systemd-detect-virt (package systemd) for the usual detection; the files "
                "decided meanwhile",
            }
        )
    return results


def mark_container(results: list[dict], container: bool, sysfs_root: str) -> None:
    """In a container, kernel and hardware checks that are off describe the host: n/a, not off."""
    if not container:
        return
    own = set() if sysfs_root.rstrip("/") in ("", "/sys") else {"ConnectX-7 firmware"}  # the lab's stand-in
    for c in results:
        if c["check"] == "kernel command line":
            c["status"] = "n/a"  # /proc/cmdline is the host's; the node's GRUB drop-in is checked by the role
            c["fix"] = "a container boots no kernel of its own"
        elif c["status"] == "off" and c["check"] in HOST_BOUND - own:
            c["status"] = "n/a"
            c["fix"] = "a container: this is the host's kernel or hardware, not the node's"


def readiness(results: list[dict], expect: dict) -> list[dict]:
    """One entry per readiness item: ready when every check it needs is ok (n/a is unverified: not ready)."""
    by_name = {c["check"]: c for c in results}
    out = []
    for item in expect.get("ready_checks") or []:
        if item == "memory saver" and not expect.get("memory_saver"):
            out.append({"item": item, "ready": True, "missing": [], "note": "not required"})
            continue
        needed = [by_name[name] for name in READY_ITEMS.get(item, ()) if name in by_name]
        missing = []
        if not needed:
            what = {
                "firmware": "no minimums in host_tuning_firmware_min",
                "kernel pair": "no validated pairs in host_tuning_kernel_pairs",
            }.get(item, "nothing to check")
            missing.append(f"{what}: nothing says this node is ready")
        for c in needed:
            if c["status"] == "ok":
                continue
            verb = "cannot be verified here" if c["status"] == "n/a" else "off"
            missing.append(f"{c['check']} {verb}: {c['value']} (expected {c['expected']}); {c['fix']}")
        out.append({"item": item, "ready": not missing, "missing": missing})
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


def with_kho(p: dict, node: NodeProbe) -> tuple[dict, dict]:
    """I(expect) with kho=off put first in cmdline_add when I(kho_off) says so, as the role's GRUB drop-in
    puts it before host_tuning_kernel_args_extra (module_utils/boot.py kho_auto: the same decision), and the
    decision with what it read (facts.kho)."""
    release = p["kconfig_release"] or ""
    kconfig = node.kernel_config(release) if release else None
    needed = p["kho_off"] == "on" or (p["kho_off"] == "auto" and boot.kho_auto(kconfig, release))
    given = list(p["expect"].get("cmdline_add") or [])
    kho = {"mode": p["kho_off"], "release": release, "kconfig": kconfig, "kho_off": needed}
    return {**p["expect"], "cmdline_add": (["kho=off"] if needed else []) + given}, kho


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "expect": {"type": "dict", "required": True},
            "container": {"type": "bool"},
            "systemd_detect_virt": {"type": "str", "default": "systemd-detect-virt"},
            "state_dir": {"type": "path", "default": "/var/lib/sparkfleet"},
            "run_dir": {"type": "path", "default": "/run/sparkfleet"},
            "sysfs_root": {"type": "path", "default": "/sys"},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "fwupdmgr": {"type": "str", "default": "fwupdmgr"},
            "kho_off": {"type": "str", "choices": ["auto", "on", "off"]},
            "kconfig_release": {"type": "str", "default": ""},
            "root": {"type": "path", "default": "/"},
            "kernel_release": {"type": "str"},
            "page_size": {"type": "int"},
        },
        supports_check_mode=True,
    )
    p = module.params
    kho = None
    if p["kho_off"] is not None:
        p["expect"], kho = with_kho(p, NodeProbe(p["root"]))
    facts = collect(module, p)
    facts["kho"] = kho
    container = facts["container"]
    results = checks(facts, p["expect"])
    mark_container(results, container, p["sysfs_root"])
    s = facts["swap"]
    swap_check = next((c for c in results if c["check"] == "swap"), None)
    if swap_check and container and s.get("swapfile_signature"):
        swap_check["value"] += (
            f"; {s['swapfile']} made ({s['swapfile_mib']} MiB), not switched on in a container"
        )
    report = [
        f"{c['status']:>3}  {c['check']}: {c['value']}"
        + ("" if c["status"] == "ok" else f" (expected {c['expected']}; {c['fix']})")
        for c in results
    ]
    ready = readiness(results, p["expect"])
    for c in results:
        if c["status"] == "warn":
            module.warn(f"{c['check']}: {c['value']}: {c['fix']}")
    module.exit_json(
        changed=False,
        facts=facts,
        checks=results,
        off=[c for c in results if c["status"] == "off"],
        warned=[c for c in results if c["status"] == "warn"],
        readiness=ready,
        not_ready=[f"{r['item']}: {m}" for r in ready for m in r["missing"]],
        readiness_report=[
            f"{'ready' if r['ready'] else 'NOT READY':<9}  {r['item']}"
            + (f" ({r['note']})" if r.get("note") else "")
            for r in ready
        ],
        reboot_reasons=reboot_reasons(facts, p["expect"], container),
        report=report,
    )


if __name__ == "__main__":
    main()
