#!/usr/bin/env python3
"""Lab stand-in for a DGX Spark's installed kernels: /boot/vmlinuz-<release> and the NVIDIA modules of each.

A lab node is a container and boots no kernel, so its /boot and /lib/modules are empty and sparkfleet's
"next kernel" check says n/a there. This puts the files a real Spark has (and only their names: the files
are empty) so the check, and the refusal of a reboot into a kernel without an NVIDIA module, run against
the same layout as on a Spark:

- the kernel: /boot/vmlinuz-<release> (GRUB's default 0 boots the newest one);
- its NVIDIA modules, where DGX OS's prebuilt package linux-modules-nvidia-580-open-<release> puts them:
  /lib/modules/<release>/kernel/nvidia-580-open/{nvidia,nvidia-uvm,nvidia-modeset,nvidia-drm,nvidia-peermem}.ko
  (a published `modinfo nvidia` of a Spark: filename /lib/modules/6.17.0-1014-nvidia/kernel/nvidia-580-open/
  nvidia.ko). `--without-nvidia` leaves them out: the state an `apt upgrade` leaves when it installs a new
  kernel and holds the driver's module package back (the kernel and the driver are separate phased updates).

  kernels.py install RELEASE [--without-nvidia] [--root DIR]
  kernels.py remove RELEASE [--root DIR]       (only what `install` made: the vmlinuz file, the module tree)
  kernels.py list [--root DIR]

Standard library only: this runs on the node's Python.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

MODULE_DIR = "kernel/nvidia-580-open"
MODULES = ("nvidia", "nvidia-uvm", "nvidia-modeset", "nvidia-drm", "nvidia-peermem")
MARK = ".sparkfleet-lab"  # in /lib/modules/<release>: this tree is the stand-in's


def install(root: Path, release: str, nvidia: bool) -> None:
    (root / "boot").mkdir(parents=True, exist_ok=True)
    (root / "boot" / f"vmlinuz-{release}").touch()
    tree = root / "lib/modules" / release
    tree.mkdir(parents=True, exist_ok=True)
    (tree / MARK).touch()
    if nvidia:
        (tree / MODULE_DIR).mkdir(parents=True, exist_ok=True)
        for name in MODULES:
            (tree / MODULE_DIR / f"{name}.ko").touch()


def remove(root: Path, release: str) -> None:
    tree = root / "lib/modules" / release
    if (tree / MARK).exists():
        shutil.rmtree(tree)
        (root / "boot" / f"vmlinuz-{release}").unlink(missing_ok=True)


def listing(root: Path) -> str:
    out = []
    for vmlinuz in sorted((root / "boot").glob("vmlinuz-*")):
        release = vmlinuz.name[len("vmlinuz-") :]
        has = (root / "lib/modules" / release / MODULE_DIR / "nvidia.ko").exists()
        out.append(f"{release} {'nvidia' if has else 'no-nvidia'}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernels.py")
    parser.add_argument("action", choices=["install", "remove", "list"])
    parser.add_argument("release", nargs="?")
    parser.add_argument("--without-nvidia", action="store_true")
    parser.add_argument("--root", default="/")
    args = parser.parse_args(argv)
    root = Path(args.root)
    if args.action != "list" and not args.release:
        parser.error(f"{args.action} needs a RELEASE")
    if args.action == "install":
        install(root, args.release, not args.without_nvidia)
    elif args.action == "remove":
        remove(root, args.release)
    else:
        print(listing(root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
