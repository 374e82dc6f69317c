#!/usr/bin/env bash
# Make this machine able to run the VM lab (`sparkfleet lab up --vm`): qemu (TCG: no KVM needed), qemu-img,
# the partitioning and loop-device tools the offline disk build uses, debootstrap and an SSH client.
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
if [ "${#need[@]}" -gt 0 ]; then
  echo "ensure-vm-host: installing ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
