"""The kernel a Spark boots next, and whether that kernel has an NVIDIA module (read-only).

DGX OS has no DKMS for the stock driver: the NVIDIA modules of a kernel come from a prebuilt package
(linux-modules-nvidia-<branch>-<flavour>), and the kernel and the driver are phased updates of their own, so
an `apt upgrade` can install a kernel whose NVIDIA modules did not come with it; booting it leaves the node
without a GPU (no /dev/nvidia*, `nvml error: driver not loaded` in every GPU container). Operators check the
next kernel's module tree before each reboot (TechPreacher/dgx-spark-vllm-cluster scripts/preboot_check.sh);
the module tree is read, not dpkg: an interrupted unpack can leave a package installed without its files.

Which kernel boots next, as GRUB decides it: a one-time `grub-reboot` entry (next_entry in grubenv) first,
then GRUB_DEFAULT (`saved` reads saved_entry from grubenv), resolved against the menu of grub.cfg (a number
counts entries, `>` walks into a submenu, else an entry's id or title). When grub.cfg cannot be read, the
newest /boot/vmlinuz-* (a Spark's GRUB_DEFAULT is 0: the first entry, the newest kernel).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex

GRUBENV = "/boot/grub/grubenv"
GRUB_CFG = "/boot/grub/grub.cfg"
GRUB_DEFAULTS = "/etc/default/grub"
GRUB_DEFAULTS_DIR = "/etc/default/grub.d"
# The NVIDIA kernel module's file, as a prebuilt package or DKMS installs it (compressed or not).
NVIDIA_MODULE = re.compile(r"^nvidia\.ko(\.(zst|xz|gz))?$")

_ENTRY = re.compile(r"^\s*(menuentry|submenu)\s+(?P<rest>.*)\{\s*$")
_ENTRY_ID = re.compile(r"\$menuentry_id_option\s+'([^']*)'")
_LINUX = re.compile(r"^\s*linux\s+\S*vmlinuz-(\S+)")


def parse_grubenv(text: str | None) -> dict[str, str]:
    """grubenv's `key=value` lines (the file is padded with '#')."""
    out: dict[str, str] = {}
    for line in (text or "").splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        out[key.strip()] = value
    return out


def grub_default(texts: list[str]) -> str:
    """GRUB_DEFAULT as the shell would leave it after sourcing each file in order ('0' when unset)."""
    value = "0"
    for text in texts:
        for line in text.splitlines():
            m = re.match(r"^\s*(?:export\s+)?GRUB_DEFAULT=(.*)$", line)
            if not m:
                continue
            try:
                words = shlex.split(m.group(1), comments=True)
            except ValueError:
                continue
            value = words[0] if words else ""
    return value or "0"


def _title(rest: str) -> str:
    try:
        words = shlex.split(rest, comments=False)
    except ValueError:
        return rest.strip()
    return words[0] if words else ""


def menu(text: str) -> list[dict]:
    """grub.cfg's menu as a tree: [{kind, title, id, release (of its linux line), children}]."""
    root: list[dict] = []
    stack: list[dict | None] = []
    for line in text.splitlines():
        m = _ENTRY.match(line)
        if m:
            ident = _ENTRY_ID.search(m.group("rest"))
            node = {
                "kind": m.group(1),
                "title": _title(m.group("rest")),
                "id": ident.group(1) if ident else "",
                "release": None,
                "children": [],
            }
            parent = next((s for s in reversed(stack) if s is not None), None)
            (parent["children"] if parent else root).append(node)
            stack.append(node)
            continue
        stripped = line.strip()
        if stripped.endswith("{"):
            stack.append(None)  # if/function blocks
            continue
        if stripped == "}":
            if stack:
                stack.pop()
            continue
        linux = _LINUX.match(line)
        if linux and stack and stack[-1] is not None and stack[-1]["release"] is None:
            stack[-1]["release"] = linux.group(1)
    return root


def resolve(entries: list[dict], spec: str) -> str | None:
    """The kernel release an entry spec ('0', '1>2', an id or title path) boots; None when it names none."""
    level, node = entries, None
    for part in spec.split(">"):
        if part.isdigit():
            index = int(part)
            node = level[index] if index < len(level) else None
        else:
            node = next((e for e in level if part in (e["id"], e["title"])), None)
        if node is None:
            return None
        level = node["children"]
    if node is None:
        return None
    while node["kind"] == "submenu" and node["children"]:  # a submenu alone boots its first entry
        node = node["children"][0]
    return node["release"]


def version_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", release))


def installed_kernels(names: list[str]) -> list[str]:
    """The releases of /boot's vmlinuz-<release> files, newest last."""
    found = [n[len("vmlinuz-") :] for n in names if n.startswith("vmlinuz-") and len(n) > len("vmlinuz-")]
    return sorted(found, key=version_key)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def next_kernel(root: str = "/") -> dict:
    """{release (None when none is installed), how (why that one), kernels (installed, newest last)}."""

    def at(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    try:
        kernels = installed_kernels(os.listdir(at("/boot")))
    except OSError:
        kernels = []
    env = parse_grubenv(_read(at(GRUBENV)))
    texts = [_read(at(GRUB_DEFAULTS)) or ""]
    with contextlib.suppress(OSError):
        names = sorted(os.listdir(at(GRUB_DEFAULTS_DIR)))
        texts += [_read(at(f"{GRUB_DEFAULTS_DIR}/{n}")) or "" for n in names if n.endswith(".cfg")]
    if env.get("next_entry"):
        spec, how = env["next_entry"], f"grub-reboot's next_entry={env['next_entry']}"
    else:
        default = grub_default(texts)
        if default == "saved":
            spec = env.get("saved_entry") or "0"
            how = f"GRUB_DEFAULT=saved, saved_entry={env.get('saved_entry') or '(none: 0)'}"
        else:
            spec, how = default, f"GRUB_DEFAULT={default}"
    cfg = _read(at(GRUB_CFG))
    if cfg is not None:
        release = resolve(menu(cfg), spec)
        if release:
            return {"release": release, "how": f"{how} in {GRUB_CFG}", "kernels": kernels}
        how += f", which names no kernel in {GRUB_CFG}"
    else:
        how += f", {GRUB_CFG} not readable"
    if not kernels:
        return {"release": None, "how": f"{how}; no /boot/vmlinuz-* installed", "kernels": []}
    return {"release": kernels[-1], "how": f"{how}; the newest /boot/vmlinuz-*", "kernels": kernels}


def nvidia_modules(release: str, root: str = "/") -> list[str]:
    """The nvidia.ko files under /lib/modules/<release> (paths as on the node)."""
    top = os.path.join(root, "lib/modules", release)
    found = []
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            if NVIDIA_MODULE.match(name):
                full = os.path.join(dirpath, name)
                found.append("/" + os.path.relpath(full, root).lstrip("/") if root != "/" else full)
    return sorted(found)


# Kexec HandOver on by default breaks RDMA memory registration: such a kernel needs kho=off on its command
# line (module_utils/node.py KERNEL_OPTIONS has the sources). The decision for host_tuning_kho_off=auto, made
# here for the role's GRUB drop-in (filter sparkfleet.cluster.kho_auto) and for host_status's expected command
# line.
KHO_DEFAULT = "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT"


def kho_auto(kconfig: dict[str, str] | None, release: str | None) -> bool:
    """kho=off is needed: the kernel's build options (module_utils/node.py parse_kernel_config of its
    /boot/config-<release>) enable Kexec HandOver by default; without them (no config file), when the kernel
    is 7.x or later (7.0 enables it by default: roles/host_tuning/README.md has the sources)."""
    if kconfig is not None:
        return kconfig.get(KHO_DEFAULT) == "y"
    major = str(release or "").split(".")[0]
    return re.fullmatch(r"[0-9]+", major) is not None and int(major) >= 7
