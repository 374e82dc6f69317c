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
import json
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
ARCHES = ("amd64", "arm64")
# arm64 (`--arch arm64`, one node: README "The 64K kernel"): UEFI (AAVMF), GPT with an EFI system partition
# of ESP_MIB and the root file system after it, GRUB arm64-efi at the removable path; the stock 4K-page kernel
# boots, the 16K-page flavour (Debian has no 64K one) waits in the image's local apt repository (ARM64_REPO).
ESP_MIB = 64
ARM64_REPO = "/opt/sparkfleet-lab/apt"
ARM64_16K_META = "linux-image-arm64-16k"
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


# arm64: the PL011 serial console (ttyAMA0) and GRUB on the firmware's console (qemu's -serial under UEFI)
GRUB_DEFAULTS_ARM64 = {
    **GRUB_DEFAULTS,
    "GRUB_CMDLINE_LINUX": "console=ttyAMA0,115200 net.ifnames=0 splash",
    "GRUB_TERMINAL": "console",
}
GRUB_DEFAULTS_ARM64.pop("GRUB_SERIAL_COMMAND")
# amd64 (qemu's `pc` machine): the drivers of emulated PC devices that a DGX Spark has no counterpart of (the
# floppy controller, the parallel port, the PC speaker, the empty CD-ROM, VGA and VMware's VMCI, the nested
# virtualisation that `-cpu max` offers) are blacklisted, so udev's coldplug does not load them at every boot;
# and the generic kernel's initramfs holds only the root file system's and the NICs' drivers (initramfs-tools'
# MODULES=list), 11 MB where MODULES=most made 37 MB for GRUB to read and the kernel to unpack. Under TCG each
# of those costs seconds of CPU per boot, and the VM scenario boots every guest twice (README "The VM lab").
AMD64_BLACKLIST = (
    "floppy",
    "parport_pc",
    "ppdev",
    "pcspkr",
    "sr_mod",
    "vga16fb",
    "vmw_vmci",
    "vmw_vsock_vmci_transport",
    "kvm",
    "kvm_amd",
    "kvm_intel",
)
# the root file system's drivers and the NICs' (early, as MODULES=most had them; the identity unit renames)
AMD64_INITRAMFS_MODULES = ("virtio_pci", "virtio_blk", "ext4", "virtio_net")


def grub_defaults(arch: str = "amd64") -> dict[str, str]:
    return GRUB_DEFAULTS_ARM64 if arch == "arm64" else GRUB_DEFAULTS


def _check_arch(arch: str) -> None:
    if arch not in ARCHES:
        raise ValueError(f"arch {arch!r}: expected one of {', '.join(ARCHES)}")


def packages(arch: str = "amd64") -> list[str]:
    _check_arch(arch)
    name = "packages.txt" if arch == "amd64" else f"packages-{arch}.txt"
    lines = (HERE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def image_tag(arch: str = "amd64") -> str:
    h = hashlib.sha256()
    h.update(f"{BUILDER_VERSION}|{SUITE}|{MIRROR}|{DISK_GIB}|".encode())
    h.update(" ".join(packages(arch)).encode())
    h.update(repr(sorted(grub_defaults(arch).items())).encode())
    if arch == "amd64":  # arm64's key stays what it was (its cached disk stays valid)
        h.update(f"|{' '.join(AMD64_BLACKLIST)}|{' '.join(AMD64_INITRAMFS_MODULES)}".encode())
    else:
        h.update(f"|{arch}|{ARM64_BUILDER_VERSION}|{ESP_MIB}|{ARM64_REPO}|{ARM64_16K_META}".encode())
    container_image._hash_tree(h, OVERLAY)
    container_image._hash_tree(h, SIM_DIR)
    return h.hexdigest()[:12]


ARM64_BUILDER_VERSION = "3"  # bump when the arm64 steps below change


def cache_dir() -> Path:
    return container_image.WORK_ROOT / "vm"


def image_path(arch: str = "amd64") -> Path:
    return cache_dir() / f"debian-{SUITE}-{arch}-{image_tag(arch)}.qcow2"


def image_info(arch: str = "amd64") -> dict:
    """What the build found and recorded beside the disk (arm64: the 16K kernel's release and version)."""
    side = image_path(arch).with_suffix(".json")
    return json.loads(side.read_text()) if side.exists() else {}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc


def _chroot(root: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
    return _run(["chroot", str(root), *cmd], env=env)


def ensure_image(say=container_image._log, arch: str = "amd64") -> Path:
    """The cached guest disk for the current inputs, built if missing."""
    out = image_path(arch)
    if out.exists():
        return out
    tools = ["debootstrap", "qemu-img", "sfdisk", "losetup", "mkfs.ext4"]
    if arch == "arm64":
        tools += ["mkfs.vfat", "mcopy", "dpkg-scanpackages"]
    for tool in tools:
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is missing: run scripts/ensure-vm-host.sh")
    if os.geteuid() != 0:
        raise RuntimeError("building the VM image needs root (loop devices, debootstrap, chroot)")
    out.parent.mkdir(parents=True, exist_ok=True)
    container_image.WORK_ROOT.mkdir(parents=True, exist_ok=True)
    if arch == "arm64" and not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        raise RuntimeError(
            "arm64 binaries do not run here (no qemu-aarch64 in binfmt_misc): run scripts/ensure-vm-host.sh"
        )
    rootfs = _ensure_rootfs(say, arch)
    if arch == "arm64":
        return _assemble_arm64(rootfs, out, say)
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
            _trim_amd64_boot(root)
            say(f"GRUB (BIOS) on {disk}")
            _install_grub(root, disk)
            _bootstrap_grub_cfg(root, uuid)
            _run(["umount", "-R", str(root)])
        tmp_out = out.with_suffix(".partial")
        say(f"qemu-img convert to {out}")
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(tmp_out)])
        tmp_out.replace(out)
    return out


def _ensure_rootfs(say, arch: str = "amd64") -> Path:
    """debootstrap of packages.txt, kept (by the packages' hash): a failed disk assembly does not redo it. A
    foreign arch (arm64) runs its second stage under qemu-user (binfmt_misc: scripts/ensure-vm-host.sh)."""
    key = f"{SUITE}|{MIRROR}|{' '.join(packages(arch))}" + ("" if arch == "amd64" else f"|{arch}")
    h = hashlib.sha256(key.encode()).hexdigest()[:12]
    rootfs = container_image.WORK_ROOT / f"vm-rootfs-{h}"
    if (rootfs / ".sparkfleet-complete").exists():
        return rootfs
    shutil.rmtree(rootfs, ignore_errors=True)
    log = container_image.WORK_ROOT / f"debootstrap-vm-{h}.log"
    say(f"debootstrap {SUITE} ({arch}) with {len(packages(arch))} packages for the VM disk; log {log}")
    foreign = [] if arch == "amd64" else [f"--arch={arch}"]
    container_image._run_logged(
        [
            "debootstrap",
            *foreign,
            "--variant=minbase",
            f"--include={','.join(packages(arch))}",
            SUITE,
            str(rootfs),
            MIRROR,
        ],
        log,
        f"debootstrap (VM, {arch})",
    )
    if arch == "arm64":
        _fetch_16k_kernel(rootfs, say)
    _chroot(rootfs, "apt-get", "clean")
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / ".sparkfleet-complete").write_text("")
    return rootfs


def _fetch_16k_kernel(rootfs: Path, say) -> None:
    """The 16K-page kernel's .deb (the version linux-image-arm64-16k depends on now) into the image's local
    apt repository, with its Packages index: the guest installs it offline, at that exact version."""
    depends = _chroot(rootfs, "apt-cache", "depends", "--no-recommends", ARM64_16K_META).stdout
    names = [ln.split(":", 1)[1].strip() for ln in depends.splitlines() if ln.strip().startswith("Depends:")]
    image = [n for n in names if n.startswith("linux-image-") and n.endswith("-arm64-16k")]
    if len(image) != 1:
        raise RuntimeError(f"{ARM64_16K_META} depends on {names}: expected one linux-image-*-arm64-16k")
    repo = rootfs / ARM64_REPO.lstrip("/")
    repo.mkdir(parents=True, exist_ok=True)
    say(f"downloading {image[0]} into the image's local apt repository {ARM64_REPO}")
    _chroot(rootfs, "sh", "-c", f"cd {ARM64_REPO} && apt-get download {image[0]}")
    _run_local_index(repo)


def _run_local_index(repo: Path) -> None:
    packages_index = _run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo).stdout
    (repo / "Packages").write_text(packages_index)


def _assemble_arm64(rootfs: Path, out: Path, say) -> Path:
    """The arm64 disk: GPT, an EFI system partition (GRUB arm64-efi at the removable path
    EFI/BOOT/BOOTAA64.EFI, so the firmware boots it without an NVRAM entry) and the root file system; then
    _arm64_specifics. Recorded beside the disk (<disk>.json): the stock and 16K kernels' releases and the 16K
    package's name and version, which the lab writes into the node's inventory."""
    esp_start = PART_START
    root_start = PART_START + ESP_MIB * 2048
    with tempfile.TemporaryDirectory(dir=container_image.WORK_ROOT, prefix="vm-") as tmp:
        raw = Path(tmp) / "disk.raw"
        root = Path(tmp) / "root"
        root.mkdir()
        with ExitStack() as stack:
            _run(["truncate", "-s", f"{DISK_GIB}G", str(raw)])
            esp_type = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
            table = (
                "label: gpt\n"
                f"start={esp_start},size={ESP_MIB * 2048},type={esp_type},name=esp\n"
                f"start={root_start},type=B921B045-1DF0-41C3-AF44-4C6F280D3FAE,name=root\n"
            )
            _run(["sfdisk", "-q", str(raw)], input=table)
            # each partition as a loop device of its own extent (the root's ends before GPT's backup header)
            parts = json.loads(_run(["sfdisk", "--json", str(raw)]).stdout)["partitiontable"]["partitions"]
            loops = {}
            for name, part in zip(("esp", "root"), parts, strict=True):
                cmd = ["losetup", "--find", "--show", "--offset", str(part["start"] * 512)]
                cmd += ["--sizelimit", str(part["size"] * 512)]
                loops[name] = _run([*cmd, str(raw)]).stdout.strip()
                stack.callback(
                    subprocess.run, ["losetup", "-d", loops[name]], check=False, capture_output=True
                )
            _run(["mkfs.vfat", "-F", "32", "-n", "ESP", loops["esp"]])
            _run(["mkfs.ext4", "-q", "-L", "sparkfleet-root", loops["root"]])
            uuid = _run(["blkid", "-s", "UUID", "-o", "value", loops["root"]]).stdout.strip()
            esp_uuid = _run(["blkid", "-s", "UUID", "-o", "value", loops["esp"]]).stdout.strip()
            _run(["mount", loops["root"], str(root)])
            stack.callback(subprocess.run, ["umount", "-R", str(root)], check=False, capture_output=True)
            say("copying the guest's root file system onto the disk")
            _run(["cp", "-a", f"{rootfs}/.", str(root)])
            (root / "boot/efi").mkdir(parents=True, exist_ok=True)
            for sub in ("dev", "proc", "sys"):
                _run(["mount", "--rbind", f"/{sub}", str(root / sub)])
                _run(["mount", "--make-rslave", str(root / sub)])
            _configure(root, uuid, "arm64")
            info = _arm64_specifics(root, esp_uuid)
            say("GRUB (arm64-efi, removable path) on the EFI system partition")
            _install_grub_efi(root, uuid, loops["esp"])
            _bootstrap_grub_cfg(root, uuid, "arm64")
            _run(["umount", "-R", str(root)])
        tmp_out = out.with_suffix(".partial")
        say(f"qemu-img convert to {out}")
        _run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(tmp_out)])
        out.with_suffix(".json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        tmp_out.replace(out)
    return out


def _arm64_specifics(root: Path, esp_uuid: str) -> dict:
    """The ESP in fstab; apt pointed at the image's local repository only (file://, the 16K kernel's .deb;
    indexed now, so the guest installs from it offline); initramfs-tools' MODULES=dep (an initramfs for the
    running machine's drivers: the guest builds the 16K kernel's under TCG, where MODULES=most takes minutes);
    the NVIDIA modules' stand-in (sim/kernels.py) for the 16K kernel too, so reboot.yml's next-kernel check
    passes as on a Spark with the module package installed (a stand-in: no GPU driver exists here)."""
    with (root / "etc/fstab").open("a") as fh:
        fh.write(f"UUID={esp_uuid} /boot/efi vfat umask=0077,nofail 0 0\n")
    for src in (root / "etc/apt").glob("sources.list.d/*"):
        src.unlink()
    (root / "etc/apt/sources.list").write_text(
        "# sparkfleet VM lab: the image's local repository only (the guest reaches no network)\n"
        f"deb [trusted=yes] file:{ARM64_REPO} ./\n"
    )
    _chroot(root, "apt-get", "update", "-q")
    conf = root / "etc/initramfs-tools/conf.d/sparkfleet-lab.conf"
    conf.write_text(
        "# sparkfleet VM lab: the guest's own drivers only (lab/sparkfleet_lab/vm/image.py)\nMODULES=dep\n"
    )
    stock = _generic_kernel(root, "arm64")
    repo = root / ARM64_REPO.lstrip("/")
    debs = sorted(repo.glob("linux-image-*-arm64-16k_*.deb"))
    if len(debs) != 1:
        raise RuntimeError(f"expected one 16K kernel .deb in {repo}: {debs}")
    package, version, _ = debs[0].name.split("_")
    version = version.replace("%3a", ":")
    release = package.removeprefix("linux-image-")
    tree = root / "lib/modules" / release
    _run([sys.executable, str(SIM_DIR / "kernels.py"), "install", release, "--root", str(root)])
    (root / "boot" / f"vmlinuz-{release}").unlink()  # the package brings the real one
    if not (tree / "kernel/nvidia-580-open/nvidia.ko").exists():
        raise RuntimeError(f"the NVIDIA modules' stand-in for {release} is missing")
    return {
        "arch": "arm64",
        "stock_release": stock,
        "kernel_16k": {"release": release, "package": package, "version": version},
        "apt_repo": ARM64_REPO,
    }


def _install_grub_efi(root: Path, uuid: str, esp: str) -> None:
    """What `grub-install --target=arm64-efi --removable` leaves, without its probing of the build's loop
    devices: the modules in /boot/grub/arm64-efi, and a GRUB image at the ESP's removable path whose early
    config finds /boot/grub on the root file system by its UUID. The image is copied onto the ESP with mtools
    (a host kernel without vfat, as in a container, cannot mount it).

    The early config only sets root and prefix, as grub-install's own does; GRUB then starts normal mode,
    which reads $prefix/arm64-efi/command.lst (the commands it loads on first use: `[`, load_env, save_env)
    and then $prefix/grub.cfg. An early config that ran `configfile $prefix/grub.cfg` itself read grub.cfg
    without that list: "can't find command `['" on every boot, so grubenv was never read or written and a
    grub-reboot entry neither chosen nor cleared (the 16K trial booted because that kernel sorted first)."""
    shutil.copytree(root / "usr/lib/grub/arm64-efi", root / "boot/grub/arm64-efi", dirs_exist_ok=True)
    early = root / "boot/grub/sparkfleet-early.cfg"
    early.write_text(f"search --no-floppy --fs-uuid --set=root {uuid}\nset prefix=($root)/boot/grub\n")
    _chroot(
        root,
        "grub-mkimage",
        "-O",
        "arm64-efi",
        "-o",
        "/boot/grub/BOOTAA64.EFI",
        "-c",
        "/boot/grub/sparkfleet-early.cfg",
        "-p",
        "/boot/grub",
        "part_gpt",
        "fat",
        "ext2",
        "search",
        "search_fs_uuid",
        "configfile",
        "normal",
        "linux",
        "echo",
    )
    early.unlink()
    _run(["mmd", "-i", esp, "::/EFI", "::/EFI/BOOT"])
    _run(["mcopy", "-i", esp, str(root / "boot/grub/BOOTAA64.EFI"), "::/EFI/BOOT/BOOTAA64.EFI"])
    (root / "boot/grub/BOOTAA64.EFI").unlink()


def _bootstrap_grub_cfg(root: Path, uuid: str, arch: str = "amd64") -> None:
    """A one-entry grub.cfg for the first boot. update-grub cannot write Debian's own here: its 10_linux
    skips a root on a loop device backed by a file (the build's); the guest runs update-grub at its first
    boot (sparkfleet-vm-grub.service), and from then on GRUB's configuration is Debian's, with every
    kernel."""
    release = _generic_kernel(root, arch)
    defaults = grub_defaults(arch)
    args = f"{defaults['GRUB_CMDLINE_LINUX']} {defaults['GRUB_CMDLINE_LINUX_DEFAULT']}".strip()
    terminal = (
        "serial --unit=0 --speed=115200\nterminal_input serial\nterminal_output serial\n"
        if arch == "amd64"
        else ""
    )
    part = "part_msdos" if arch == "amd64" else "part_gpt"
    (root / "boot/grub/grub.cfg").write_text(
        "# sparkfleet-vm-bootstrap: replaced by update-grub at the guest's first boot\n"
        f"{terminal}set timeout=0\n"
        f"menuentry 'Debian GNU/Linux, {release} (first boot)' {{\n"
        f"  insmod {part}\n  insmod ext2\n"
        f"  search --no-floppy --fs-uuid --set=root {uuid}\n"
        f"  linux /boot/vmlinuz-{release} root=UUID={uuid} ro {args}\n"
        f"  initrd /boot/initrd.img-{release}\n"
        "}\n"
    )


def _trim_amd64_boot(root: Path) -> None:
    """AMD64_BLACKLIST into modprobe.d and the generic kernel's initramfs rebuilt with MODULES=list (the
    root file system's and the NICs' drivers, AMD64_INITRAMFS_MODULES); the cloud kernel, which the lab never
    boots, keeps its own."""
    (root / "etc/modprobe.d/sparkfleet-lab-vm.conf").write_text(
        "# sparkfleet VM lab: emulated PC devices a DGX Spark lacks (lab/sparkfleet_lab/vm/image.py)\n"
        + "".join(f"blacklist {m}\n" for m in AMD64_BLACKLIST)
    )
    (root / "etc/initramfs-tools/conf.d/sparkfleet-lab.conf").write_text(
        "# sparkfleet VM lab: the root file system's and the NICs' drivers (lab/sparkfleet_lab/vm/image.py)\n"
        "MODULES=list\n"
    )
    modules = root / "etc/initramfs-tools/modules"
    kept = [ln for ln in modules.read_text().splitlines() if ln.strip() not in AMD64_INITRAMFS_MODULES]
    modules.write_text("\n".join([*kept, *AMD64_INITRAMFS_MODULES]) + "\n")
    _chroot(root, "update-initramfs", "-u", "-k", _generic_kernel(root))


def _generic_kernel(root: Path, arch: str = "amd64") -> str:
    kernels = sorted(p.name.removeprefix("vmlinuz-") for p in (root / "boot").glob("vmlinuz-*"))
    generic = [k for k in kernels if k.endswith(f"-{arch}") and "-cloud-" not in k and "-rt-" not in k]
    if not generic:
        raise RuntimeError(f"no generic {arch} kernel in the guest's /boot: {kernels}")
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


def _configure(root: Path, uuid: str, arch: str = "amd64") -> None:
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
    release = _generic_kernel(root, arch)
    default = f"gnulinux-advanced-{uuid}>gnulinux-{release}-advanced-{uuid}"
    grub = root / "etc/default/grub"
    text = grub.read_text()
    for key, value in {**grub_defaults(arch), "GRUB_DEFAULT": default}.items():
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
