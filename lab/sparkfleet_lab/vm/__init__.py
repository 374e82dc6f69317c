"""The VM lab: Debian guests under qemu (TCG): real kernel, GRUB, reboots, NetworkManager and soft-RoCE."""
