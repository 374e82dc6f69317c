"""The VM lab's guest disk: Debian trixie, partitioned, with GRUB and real kernels, built offline and cached.

Built from Debian's packages only (debootstrap from the mirror apt reaches), on a loop device: one MBR
partition (ext4), GRUB for BIOS boot, the kernels of packages.txt, the lab's overlay (node identity from qemu
fw_cfg, the management netplan for NetworkManager, the GPU simulator). The result is a qcow2 in the lab's work
directory (/var/tmp/sparkfleet-lab/vm, or under SPARKFLEET_LAB_WORKDIR: kept across checkouts, as Docker keeps
the container lab's images), named by a hash of everything that goes into it: an unchanged input reuses it, a
changed one (a package, an overlay file, the simulator, this procedure) builds a new one. Each VM runs on its
own copy-on-write overlay of it, so the cached disk is never written by a guest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from sparkfleet_lab import image as container_image

HERE = Path(__file__).resolve().parent
OVERLAY = HERE / "overlay"
SIM_DIR = HERE.parent / "sim"
SUITE = container_image.SUITE
MIRROR = container_image.MIRROR
BUILDER_VERSION = "2"  # bump when the build procedure below changes (it is part of the content key)
DISK_GIB = 4
PART_START = 2048  # sectors: the first partition at 1 MiB, GRUB's core image in the gap before it
NODE_USER = "spark"
# The guest's kernel command line as the distribution sets it (/etc/default/grub): the serial console the lab
# logs, and the kernel's own interface names (eth0, ...) that the identity unit renames to a Spark's.
GRUB_DEFAULTS = {
    "GRUB_TIMEOUT": "1",
    "GRUB_CMDLINE_LINUX_DEFAULT": "",
    "GRUB_CMDLINE_LINUX": "console=ttyS0,115200 net.ifnames=0 splash",
    "GRUB_TERMINAL": "serial",
    "GRUB_SERIAL_COMMAND": "serial --unit=0 --speed=115200",
    "GRUB_DISABLE_OS_PROBER": "true",
}


def packages() -> list[str]:
    lines = (HERE / "packages.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def image_tag() -> str:
    h = hashlib.sha256()
    h.update(f"{BUILDER_VERSION}|{SUITE}|{MIRROR}|{DISK_GIB}|".encode())
    h.update(" ".join(packages()).encode())
    h.update(repr(sorted(GRUB_DEFAULTS.items())).encode())
    container_image._hash_tree(h, OVERLAY)
    container_image._hash_tree(h, SIM_DIR)
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    return container_image.WORK_ROOT / "vm"


def image_path() -> Path:
    return cache_dir() / f"debian-{SUITE}-amd64-{image_tag()}.qcow2"


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def _chroot(root: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    return _run(["chroot", str(root), *cmd], env=env)


def ensure_image(say=container_image._log) -> Path:
    """The cached guest disk for the current inputs, built if missing."""
    out = image_path()
    if out.exists():
        return out
    for tool in ("debootstrap", "qemu-img", "sfdisk", "losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: run scripts/ensure-vm-host.sh")
    if os.geteuid() != 0:
        raise RuntimeError("building the VM image needs root (loop devices, debootstrap, chroot)")
    out.parent.mkdir(parents=True, exist_ok=True)
    container_image.WORK_ROOT.mkdir(parents=True, exist_ok=True)
    rootfs = _ensure_rootfs(say)
    with tempfile.TemporaryDirectory(dir=container_image.WORK_ROOT, prefix="vm-") as tmp:
        raw = Path(tmp) / "disk.raw"
        root = Path(tmp) / "root"
        root.mkdir()
        with ExitStack() as stack:
            _run(["truncate", "-s", f"{DISK_GIB}G", str(raw)])
            _run(["sfdisk", "-q", str(raw)], input=f"label: dos\nstart={PART_START},type=L,bootable\n")
            # The whole disk and its partition as two loop devices (the partition by offset: a kernel
            # without loop partition scanning, as in a container, shows no loopNp1).
            disk = _run(["losetup", "--find", "--show", str(raw)]).stdout.strip()
            stack.callback(subprocess.run, ["losetup", "-d", disk], check=False, capture_output=True)
            part = _run(
                ["losetup", "--find", "--show", "--offset", str(PART_START * 512), str(raw)]
            ).stdout.strip()
            stack.callback(subprocess.run, ["losetup", "-d", part], check=False, capture_output=True)
            _run(["mkfs.ext4", "-q", "-L", "sparkfleet-root", part])
            uuid = _run(["blkid", "-s", "UUID", "-o", "value", part]).stdout.strip()
            _run(["mount", part, str(root)])
            stack.callback(subprocess.run, ["umount", "-R", str(root)], check=False, capture_output=True)
            say("copying the guest's root file system onto the disk")
            _run(["cp", "-a", f"{rootfs}/.", str(root)])
            for sub in ("dev", "proc", "sys"):
                _run(["mount", "--rbind", f"/{sub}", str(root / sub)])
                _run(["mount", "--make-rslave", str(root / sub)])
            _configure(root, uuid)
            say(f"GRUB (BIOS) on {disk}")
            _install_grub(root, disk)
            _bootstrap_grub_cfg(root, uuid)
            _run(["umount", "-R", str(root)])
        tmp_out = out.with_suffix(".partial")
        say(f"qemu-img convert to {out}")
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(tmp_out)])
        tmp_out.replace(out)
    return out


def _ensure_rootfs(say) -> Path:
    """debootstrap of packages.txt, kept (by the packages' hash): a failed disk assembly does not redo it."""
    h = hashlib.sha256(f"{SUITE}|{MIRROR}|{' '.join(packages())}".encode()).hexdigest()[:12]
    rootfs = container_image.WORK_ROOT / f"vm-rootfs-{h}"
    if (rootfs / ".sparkfleet-complete").exists():
        return rootfs
    shutil.rmtree(rootfs, ignore_errors=True)
    log = container_image.WORK_ROOT / f"debootstrap-vm-{h}.log"
    say(f"debootstrap {SUITE} with {len(packages())} packages for the VM disk; log {log}")
    container_image._run_logged(
        ["debootstrap", "--variant=minbase", f"--include={','.join(packages())}", SUITE, str(rootfs), MIRROR],
        log,
        "debootstrap (VM)",
    )
    _chroot(rootfs, "apt-get", "clean")
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / ".sparkfleet-complete").write_text("")
    return rootfs


def _bootstrap_grub_cfg(root: Path, uuid: str) -> None:
    """A one-entry grub.cfg for the first boot. update-grub cannot write Debian's own here: its 10_linux
    skips a root on a loop device backed by a file (the build's); the guest runs update-grub at its first
    boot (sparkfleet-vm-grub.service), and from then on GRUB's configuration is Debian's, with every
    kernel."""
    release = _generic_kernel(root)
    args = f"{GRUB_DEFAULTS['GRUB_CMDLINE_LINUX']} {GRUB_DEFAULTS['GRUB_CMDLINE_LINUX_DEFAULT']}".strip()
    (root / "boot/grub/grub.cfg").write_text(
        "# sparkfleet-vm-bootstrap: replaced by update-grub at the guest's first boot\n"
        "serial --unit=0 --speed=115200\nterminal_input serial\nterminal_output serial\nset timeout=0\n"
        f"menuentry 'Debian GNU/Linux, {release} (first boot)' {{\n"
        "  insmod part_msdos\n  insmod ext2\n"
        f"  search --no-floppy --fs-uuid --set=root {uuid}\n"
        f"  linux /boot/vmlinuz-{release} root=UUID={uuid} ro {args}\n"
        f"  initrd /boot/initrd.img-{release}\n"
        "}\n"
    )


def _generic_kernel(root: Path) -> str:
    kernels = sorted(p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*"))
    generic = [k for k in kernels if k.endswith("-amd64") and "-cloud-" not in k]
    if not generic:
        raise RuntimeError(f"no generic amd64 kernel in the guest's /boot: {kernels}")
    return generic[-1]


def _install_grub(root: Path, disk: str) -> None:
    """What grub-install does for BIOS boot, without probing partitions the kernel may not show: the
    modules into /boot/grub/i386-pc, a core image that finds /boot/grub on the first partition, and
    boot.img + core.img written to the disk's MBR and the gap after it."""
    mods = root / "boot/grub/i386-pc"
    shutil.copytree(root / "usr/lib/grub/i386-pc", mods, dirs_exist_ok=True)
    _chroot(
        root,
        "grub-mkimage",
        "-O",
        "i386-pc",
        "-o",
        "/boot/grub/i386-pc/core.img",
        "-p",
        "(hd0,msdos1)/boot/grub",
        "biosdisk",
        "part_msdos",
        "ext2",
    )
    _chroot(root, "grub-bios-setup", "--skip-fs-probe", "-d", "/boot/grub/i386-pc", disk)


def _configure(root: Path, uuid: str) -> None:
    (root / ".sparkfleet-complete").unlink(missing_ok=True)
    (root / "etc/fstab").write_text(f"UUID={uuid} / ext4 errors=remount-ro 0 1\n")
    (root / "etc/hostname").write_text("spark\n")
    (root / "etc/machine-id").write_text("")  # each VM makes its own at first boot
    dbus_id = root / "var/lib/dbus/machine-id"
    if dbus_id.exists() or dbus_id.is_symlink():
        dbus_id.unlink()
    for key in root.glob("etc/ssh/ssh_host_*"):
        key.unlink()  # the lab gives each node its host key (fw_cfg)
    # GRUB boots the generic kernel, by its entry's id (update-grub's first entry is the highest version, and
    # cloud-amd64 sorts after it); the NVIDIA modules' stand-in (sim/kernels.py: the files DGX OS's module
    # package installs) for that kernel only, so reboot.yml's check of the next kernel sees what a Spark has
    release = _generic_kernel(root)
    default = f"gnulinux-advanced-{uuid}>gnulinux-{release}-advanced-{uuid}"
    grub = root / "etc/default/grub"
    text = grub.read_text()
    for key, value in {**GRUB_DEFAULTS, "GRUB_DEFAULT": default}.items():
        line = f'{key}="{value}"'
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key}=")]
        text = "\n".join([*lines, line]) + "\n"
    grub.write_text(text)
    shutil.copytree(OVERLAY, root, dirs_exist_ok=True, symlinks=True)
    _run([sys.executable, str(SIM_DIR / "kernels.py"), "install", release, "--root", str(root)])
    for netplan in (root / "etc/netplan").glob("*.yaml"):
        netplan.chmod(0o600)
    shutil.copytree(
        SIM_DIR,
        root / "opt/sparkfleet-lab/sim",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        dirs_exist_ok=True,
    )
    _chroot(root, "useradd", "--create-home", "--shell", "/bin/bash", "--uid", "1000", NODE_USER)
    (root / f"etc/sudoers.d/{NODE_USER}").write_text(f"{NODE_USER} ALL=(ALL) NOPASSWD:ALL\n")
    (root / f"etc/sudoers.d/{NODE_USER}").chmod(0o440)
    _chroot(
        root,
        "systemctl",
        "enable",
        "sparkfleet-vm-identity.service",
        "sparkfleet-vm-grub.service",
        "NetworkManager.service",
        "ssh.service",
    )
    _chroot(
        root,
        "systemctl",
        "mask",
        "apt-daily.timer",
        "apt-daily-upgrade.timer",
        "e2scrub_all.timer",
        "fstrim.timer",
        "man-db.timer",
        "systemd-networkd.service",
        "systemd-networkd-wait-online.service",
    )
