#!/usr/bin/env bash
# Make this machine able to run the VM lab (`sparkfleet lab up --vm`): qemu (TCG: no KVM needed), qemu-img,
# the partitioning and loop-device tools the offline disk build uses, debootstrap and an SSH client.
# --arm64 (`make test-vm-arm64`, `sparkfleet lab up --vm --arch arm64`): also qemu-system-aarch64, its UEFI
# firmware (AAVMF), mkfs.vfat and mtools (the ESP is written without mounting it), dpkg-scanpackages, and qemu-user-static registered in binfmt_misc (mounted if it
# is not: a container-like host may not mount it) with the F flag, so the arm64 disk's debootstrap runs its
# second stage and chroot steps on this host.
# Idempotent; installs only what is missing. Needs root (or sudo) for the first run.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v qemu-img >/dev/null 2>&1 || need+=(qemu-utils)
command -v sfdisk >/dev/null 2>&1 || need+=(fdisk)
command -v losetup >/dev/null 2>&1 || need+=(mount)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ssh >/dev/null 2>&1 || need+=(openssh-client)
arm64=false
[ "${1:-}" = "--arm64" ] && arm64=true
if $arm64; then
  command -v qemu-system-aarch64 >/dev/null 2>&1 || need+=(qemu-system-arm)
  [ -e /usr/share/AAVMF/AAVMF_CODE.fd ] || need+=(qemu-efi-aarch64)
  command -v mkfs.vfat >/dev/null 2>&1 || need+=(dosfstools)
  command -v mcopy >/dev/null 2>&1 || need+=(mtools)
  command -v dpkg-scanpackages >/dev/null 2>&1 || need+=(dpkg-dev)
  command -v qemu-aarch64-static >/dev/null 2>&1 || need+=(qemu-user-static)
  command -v update-binfmts >/dev/null 2>&1 || need+=(binfmt-support)
fi
if [ "${#need[@]}" -gt 0 ]; then
  echo "ensure-vm-host: installing ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
if $arm64; then
  if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
    echo "ensure-vm-host: mounting binfmt_misc"
    $SUDO mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  fi
  if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
    echo "ensure-vm-host: registering qemu-aarch64 in binfmt_misc"
    $SUDO update-binfmts --enable qemu-aarch64
  fi
  grep -q '^flags: .*F' /proc/sys/fs/binfmt_misc/qemu-aarch64 || {
    echo "ensure-vm-host: qemu-aarch64 is registered without the F flag: a chroot cannot find its interpreter" >&2
    exit 1
  }
fi
