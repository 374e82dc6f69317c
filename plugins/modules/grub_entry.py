#!/usr/bin/python
"""Ansible module: find the GRUB menu entry that boots a given kernel release."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: grub_entry
short_description: The GRUB menu entry id path (for grub-reboot and GRUB_DEFAULT) of a kernel release
description:
  - Reads the generated grub.cfg and returns the id path of the normal (not recovery) entry whose
    C(linux) line boots C(vmlinuz-<release>), e.g.
    C(gnulinux-advanced-UUID>gnulinux-6.11.0-1016-nvidia-64k-advanced-UUID).
  - Of several such entries, the one whose id names the release (the Advanced options submenu's), then one
    inside a submenu, then the first. update-grub's top-level C(gnulinux-simple-UUID) entry boots whichever
    kernel sorts newest, so a GRUB_DEFAULT pinned to it would follow the next kernel update.
  - Fails, listing the kernels it found, when there is no such entry (run update-grub first).
  - Also reads grubenv's one-time C(next_entry) (what C(grub-reboot) set) and the kernel it boots. GRUB
    clears it when it boots it, unless its C(save_env) cannot write grubenv (on LVM, RAID, ZFS or btrfs, the
    GRUB manual says); then every later boot takes that entry over GRUB_DEFAULT.
  - Read-only.
options:
  release:
    description: The kernel release (C(uname -r) of that kernel).
    type: str
    required: true
  grub_cfg:
    description: The generated GRUB configuration.
    type: path
    default: /boot/grub/grub.cfg
  grubenv:
    description: GRUB's environment block (C(grub-reboot) writes C(next_entry) there); by default C(grubenv)
      beside O(grub_cfg).
    type: path
author: sparkfleet developers
"""

RETURN = r"""
entry: {description: The id path to give grub-reboot / GRUB_DEFAULT., type: str, returned: success}
kernels: {description: Every kernel release with a normal menu entry., type: list, returned: always}
grubenv: {description: The environment block read (for grub-editenv)., type: str, returned: success}
next_entry:
  description: grubenv's one-time entry (empty when none is pending).
  type: str
  returned: success
next_entry_release:
  description: The kernel release O(grubenv)'s next_entry boots (empty when none, or when it names no entry).
  type: str
  returned: success
"""

EXAMPLES = r"""
- name: Find the 64K kernel's menu entry
  sparkfleet.cluster.grub_entry:
    release: 6.11.0-1016-nvidia-64k
  register: entry
"""


import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.boot import menu, parse_grubenv, resolve


def entries(text: str) -> dict[str, str]:
    """Kernel release -> id path of the normal entry (recovery entries aside) that stays that release's, from
    grub.cfg's menu as module_utils/boot.py reads it (the same parser says which kernel GRUB boots next).

    update-grub's first, top-level entry (`gnulinux-simple-<uuid>`) boots the newest kernel: its id names no
    release, so GRUB_DEFAULT pinned to it boots whichever kernel sorts newest after the next kernel update.
    An entry whose id names the release (the Advanced options submenu's `gnulinux-<release>-advanced-<uuid>`)
    is preferred, then one inside a submenu, then the first that boots the release."""
    found: dict[str, tuple[int, str]] = {}

    def walk(nodes: list[dict], path: list[str]) -> None:
        for node in nodes:
            if not node["id"]:  # an entry without an id cannot be named: its children keep the path
                walk(node["children"], path)
                continue
            here = [*path, node["id"]]
            release = node["release"]
            if node["kind"] == "menuentry" and release and "recovery" not in node["id"]:
                rank = 0 if release in node["id"] else 1 if path else 2
                if release not in found or rank < found[release][0]:
                    found[release] = (rank, ">".join(here))
            walk(node["children"], here)

    walk(menu(text), [])
    return {release: entry for release, (_rank, entry) in found.items()}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "release": {"type": "str", "required": True},
            "grub_cfg": {"type": "path", "default": "/boot/grub/grub.cfg"},
            "grubenv": {"type": "path"},
        },
        supports_check_mode=True,
    )
    try:
        with open(module.params["grub_cfg"], encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as err:
        module.fail_json(msg=f"cannot read {module.params['grub_cfg']}: {err}", kernels=[])
    found = entries(text)
    grubenv = module.params["grubenv"] or os.path.join(os.path.dirname(module.params["grub_cfg"]), "grubenv")
    try:
        with open(grubenv, encoding="utf-8", errors="replace") as fh:
            pending = parse_grubenv(fh.read()).get("next_entry", "")
    except FileNotFoundError:
        pending = ""  # grub-editenv creates it at the first write
    except OSError as err:
        module.fail_json(msg=f"cannot read {grubenv}: {err}", kernels=sorted(found))
    release = module.params["release"]
    if release not in found:
        module.fail_json(
            msg=f"no GRUB menu entry boots {release} (run update-grub); kernels with entries: "
            + (", ".join(sorted(found)) or "none"),
            kernels=sorted(found),
        )
    module.exit_json(
        changed=False,
        entry=found[release],
        kernels=sorted(found),
        grubenv=grubenv,
        next_entry=pending,
        next_entry_release=(resolve(menu(text), pending) or "") if pending else "",
    )


if __name__ == "__main__":
    main()
