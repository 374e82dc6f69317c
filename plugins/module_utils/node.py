# The node probe: what a Spark has and runs, read without changing anything. preflight_facts (layer 2),
# host_status (the `prep-sparks status` checks) and the reboot reasons all read a node through it.
# Standard library only (runs on the nodes). Every path is read below `root` ("/" on a node; a fake
# tree in tests); the kernel release and page size can be given (tests), else they are the running ones.
from __future__ import annotations

import glob
import json
import os
import re

from ansible_collections.sparkfleet.cluster.plugins.module_utils import clock_state
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import read_text

SWAP_SIGNATURE = b"SWAPSPACE2"
MEMORY_SAVER = "/sys/module/nvidia_uvm/parameters/uvm_pack_sysmem_leaf_tables"
# Kernel build options sparkfleet decides on: KHO on by default needs kho=off for RDMA memory registration
# (christopherowen/spark-ds41f docs/recovery.md; Bizuayeu docs/hosts.md), a 64K kernel must have 64K pages.
KERNEL_OPTIONS = ("CONFIG_KEXEC_HANDOVER", "CONFIG_KEXEC_HANDOVER_ENABLE_DEFAULT", "CONFIG_ARM64_64K_PAGES")
# What container runtimes leave where systemd-detect-virt is missing: systemd's own mark (written by a
# systemd booted in a container), Docker's and Podman's files.
CONTAINER_MARKS = ("/run/systemd/container", "/.dockerenv", "/run/.containerenv")
# fwupd device names of a DGX Spark's board firmware -> sparkfleet's component names (the SMBIOS firmware
# inventory christopherowen/spark-ds41f docs/recovery.md records as SoC, EC, PD).
FWUPD_COMPONENTS = (
    ("ec", re.compile(r"embedded controller", re.I)),
    ("pd", re.compile(r"power delivery|\bUSB-?C PD\b", re.I)),
    ("soc", re.compile(r"uefi device firmware|system firmware|\bSoC\b", re.I)),
)


def parse_kernel_config(text: str | None) -> dict[str, str] | None:
    """/boot/config-<release> -> {option: value} of KERNEL_OPTIONS (absent = not set); None without a file."""
    if text is None:
        return None
    out = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in KERNEL_OPTIONS:
            out[key] = value
    return out


def parse_fwupd_devices(text: str | None) -> dict[str, str]:
    """`fwupdmgr get-devices --json` -> {soc, ec, pd: version} for the board firmware it lists."""
    try:
        devices = json.loads(text or "").get("Devices", [])
    except (ValueError, AttributeError):
        return {}
    out: dict[str, str] = {}
    for device in devices if isinstance(devices, list) else []:
        name, version = str(device.get("Name", "")), device.get("Version")
        if not version:
            continue
        for component, pattern in FWUPD_COMPONENTS:
            if component not in out and pattern.search(name):
                out[component] = str(version)
                break
    return out


def parse_os_release(text: str | None) -> dict[str, str]:
    values = dict(re.findall(r'^(\w+)="?([^"\n]*)"?$', text or "", re.M))
    return {
        "id": values.get("ID", "?"),
        "version": values.get("VERSION_ID", "?"),
        "name": values.get("PRETTY_NAME", "?"),
    }


def thp_mode(text: str | None) -> str | None:
    """'always madvise [never]' -> 'never'; None when the text names no mode."""
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else None


def parse_meminfo(text: str | None) -> dict[str, int]:
    """/proc/meminfo -> {total_bytes, available_bytes} (MemFree where the kernel has no MemAvailable)."""
    values = {}
    for line in (text or "").splitlines():
        match = re.match(r"^(\w+):\s+(\d+)\s*kB", line)
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    return {
        "total_bytes": values.get("MemTotal", 0),
        "available_bytes": values.get("MemAvailable", values.get("MemFree", 0)),
    }


def listening_ports(tables: list[str], ports: list[int]) -> list[int]:
    """The ports of `ports` in LISTEN state (0A) in /proc/net/tcp and tcp6 texts."""
    found = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 4 or parts[3] != "0A":
                continue
            try:
                port = int(parts[1].rsplit(":", 1)[1], 16)
            except (IndexError, ValueError):
                continue
            if port in ports:
                found.add(port)
    return sorted(found)


class NodeProbe:
    def __init__(self, root: str = "/", kernel_release: str | None = None, page_size: int | None = None):
        self.root = root or "/"
        self._kernel_release = kernel_release
        self._page_size = page_size

    # ---- files below root -----------------------------------------------------------------------
    def path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str) -> str | None:
        return read_text(self.path(path))

    def glob(self, pattern: str) -> list[str]:
        return sorted(glob.glob(self.path(pattern)))

    # ---- the kernel -----------------------------------------------------------------------------
    def kernel_release(self) -> str:
        return self._kernel_release or os.uname().release

    def page_size(self) -> int:
        return self._page_size or os.sysconf("SC_PAGE_SIZE")

    def os_release(self) -> dict[str, str]:
        return parse_os_release(self.read("/etc/os-release"))

    def cmdline(self) -> list[str]:
        return (self.read("/proc/cmdline") or "").split()

    def thp(self) -> str | None:
        return thp_mode(self.read("/sys/kernel/mm/transparent_hugepage/enabled"))

    def sysctl(self, key: str) -> str | None:
        """A live kernel parameter (dotted key), white space folded; None when the kernel has no such key."""
        value = self.read("/proc/sys/" + key.replace(".", "/"))
        return " ".join(value.split()) if value is not None else None

    def meminfo(self) -> dict[str, int]:
        return parse_meminfo(self.read("/proc/meminfo"))

    def swap(self, swapfile: str | None = None) -> dict:
        """Active swap (MiB, devices) and, for `swapfile`, its size, whether it has a signature for this
        kernel's page size (a 4K-page signature is unusable under a 64K kernel) and whether it is on."""
        lines = (self.read("/proc/swaps") or "").splitlines()[1:]
        active_kib = sum(int(line.split()[2]) for line in lines if len(line.split()) >= 3)
        names = [line.split()[0] for line in lines if line.strip()]
        info: dict = {"active_mib": active_kib // 1024, "devices": names, "swapfile": swapfile}
        if swapfile:
            try:
                with open(self.path(swapfile), "rb") as fh:
                    fh.seek(self.page_size() - len(SWAP_SIGNATURE))
                    info["swapfile_signature"] = fh.read(len(SWAP_SIGNATURE)) == SWAP_SIGNATURE
                info["swapfile_mib"] = os.stat(self.path(swapfile)).st_size >> 20
            except OSError:
                info["swapfile_signature"] = False
                info["swapfile_mib"] = None
            info["swapfile_active"] = swapfile in names
        return info

    def reboot_required(self) -> dict:
        """What packages asked for a reboot (/run/reboot-required and its .pkgs list)."""
        return {
            "required": self.read("/run/reboot-required") is not None,
            "packages": (self.read("/run/reboot-required.pkgs") or "").split(),
        }

    def listening(self, ports: list[int]) -> list[int]:
        tables = [t for t in (self.read("/proc/net/tcp"), self.read("/proc/net/tcp6")) if t]
        return listening_ports(tables, ports)

    def container(self, module, tool: str = "systemd-detect-virt") -> dict:
        """{container (bool), how (what decided), missing (what could not be read, '' when nothing)}:
        `systemd-detect-virt --container` where it runs, else the files container runtimes leave
        (CONTAINER_MARKS, and container= in PID 1's environment)."""
        path = module.get_bin_path(tool)
        missing = f"{tool} not found"
        if path:
            rc, out, err = module.run_command([path, "--container"])
            if rc in (0, 1):  # 0: a container (its name printed), 1: none
                return {
                    "container": rc == 0,
                    "how": f"{tool} --container: {out.strip() or 'none'}",
                    "missing": "",
                }
            missing = f"{tool} --container failed (exit {rc}): {(err or out).strip()[-200:]}"
        marks = [m for m in CONTAINER_MARKS if os.path.lexists(self.path(m))]
        environ = (self.read("/proc/1/environ") or "").split("\0")
        marks += [
            f"{e} in /proc/1/environ" for e in environ if e.startswith("container=") and e != "container="
        ]
        how = (
            f"a container by {', '.join(marks)}"
            if marks
            else f"not a container (none of {', '.join(CONTAINER_MARKS)}, no container= in /proc/1/environ)"
        )
        return {"container": bool(marks), "how": how, "missing": missing}

    def kernel_config(self, release: str | None = None) -> dict[str, str] | None:
        """The build options of a kernel (default the running one) from /boot/config-<release>."""
        return parse_kernel_config(self.read(f"/boot/config-{release or self.kernel_release()}"))

    # ---- the hardware and its drivers -------------------------------------------------------------
    def bios_version(self) -> str | None:
        value = self.read("/sys/class/dmi/id/bios_version")
        return value.strip() if value and value.strip() else None

    def board_firmware(self, module, fwupdmgr: str = "fwupdmgr") -> dict:
        """{versions: {soc, ec, pd}, error}: the board firmware fwupd reports (no root needed)."""
        path = module.get_bin_path(fwupdmgr)
        if path is None:
            return {"versions": {}, "error": f"{fwupdmgr} not found"}
        timeout = module.get_bin_path("timeout")
        argv = [*([timeout, "60"] if timeout else []), path, "get-devices", "--json"]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            return {
                "versions": {},
                "error": f"{fwupdmgr} get-devices failed (exit {rc}): {(err or out).strip()[-300:]}",
            }
        return {"versions": parse_fwupd_devices(out), "error": ""}

    def cx7_firmware(self, sysfs_root: str = "/sys") -> dict[str, str]:
        """RDMA device -> firmware version (fw_ver) under `sysfs_root` (the lab's RDMA stand-in: its own)."""
        out = {}
        base = sysfs_root.rstrip("/") or ""
        for path in self.glob(f"{base}/class/infiniband/*/fw_ver"):
            text = read_text(path)
            if text is not None:
                out[os.path.basename(os.path.dirname(path))] = text.strip()
        return out

    def nvidia_uvm_loaded(self) -> bool:
        return os.path.isdir(self.path("/sys/module/nvidia_uvm"))

    def memory_saver(self) -> bool | None:
        """The patched nvidia-uvm's uvm_pack_sysmem_leaf_tables (None: a stock module without it)."""
        value = self.read(MEMORY_SAVER)
        return None if value is None else value.strip() in ("Y", "1")

    def driver_version(self, module, nvidia_smi: str = "nvidia-smi") -> str | None:
        """The NVIDIA kernel module's version, else what nvidia-smi reports; None without a driver."""
        return self.driver(module, nvidia_smi)["version"]

    def driver(self, module, nvidia_smi: str = "nvidia-smi") -> dict:
        """{version (None without a driver), missing: what could not be read ('' when it was)}."""
        text = self.read("/sys/module/nvidia/version")
        if text and text.strip():
            return {"version": text.strip(), "missing": ""}
        missing = "/sys/module/nvidia/version missing (the nvidia module is not loaded)"
        path = module.get_bin_path(nvidia_smi)
        if not path:
            return {"version": None, "missing": f"{missing}, and {nvidia_smi} not found"}
        rc, out, err = module.run_command([path, "--query-gpu=driver_version", "--format=csv,noheader"])
        if rc == 0 and out.strip():
            return {"version": out.strip().splitlines()[0], "missing": ""}
        return {
            "version": None,
            "missing": f"{missing}, and {nvidia_smi} failed (exit {rc}): {(err or out).strip()[-200:]}",
        }

    def gpus(self, module, nvidia_smi: str = "nvidia-smi") -> dict:
        """{ok, gpus (nvidia-smi -L lines), error, compute_processes}."""
        gpu: dict = {"ok": False, "gpus": [], "error": "", "compute_processes": []}
        smi = module.get_bin_path(nvidia_smi)
        if smi is None:
            gpu["error"] = f"{nvidia_smi} not found in PATH"
            return gpu
        rc, out, err = module.run_command([smi, "-L"])
        gpu["gpus"] = [ln.strip() for ln in out.splitlines() if ln.startswith("GPU ")]
        gpu["ok"] = rc == 0 and bool(gpu["gpus"])
        gpu["error"] = "" if gpu["ok"] else (err or out or f"exit {rc}").strip()[-500:]
        if gpu["ok"]:
            rc, out, _err = module.run_command(
                [smi, "--query-compute-apps=pid,process_name", "--format=csv,noheader"]
            )
            if rc == 0:
                gpu["compute_processes"] = [ln.strip() for ln in out.splitlines() if ln.strip()]
        return gpu

    def docker(self, module, docker: str = "docker", engine_container: str = "") -> dict:
        """{ok, version, error, engine_running}: the daemon answers, and whether `engine_container` runs."""
        state = {"ok": False, "version": "", "error": "", "engine_running": False}
        path = module.get_bin_path(docker)
        if path is None:
            state["error"] = f"{docker} not found in PATH"
            return state
        rc, out, err = module.run_command([path, "version", "--format", "{{.Server.Version}}"])
        state.update(ok=rc == 0 and bool(out.strip()), version=out.strip(), error=(err or out).strip()[-500:])
        if state["ok"]:
            state["error"] = ""
            if engine_container:
                rc, out, _err = module.run_command(
                    [path, "inspect", "--format", "{{.State.Running}}", engine_container]
                )
                state["engine_running"] = rc == 0 and out.strip() == "true"
        return state

    # ---- what sparkfleet recorded -----------------------------------------------------------------
    def clock_caps(
        self, state_dir: str = clock_state.STATE_DIR, run_dir: str = clock_state.RUN_DIR
    ) -> dict[str, int | None]:
        """gpu_configured, gpu_applied, cpu_configured (clock_state's files; None = never)."""
        return clock_state.read_caps(state_dir, run_dir, root=self.root)
