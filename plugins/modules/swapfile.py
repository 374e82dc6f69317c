#!/usr/bin/python
"""Ansible module: a swapfile of a given size, made for the running kernel's page size."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: swapfile
short_description: Ensure a swapfile exists, has the size, a swap signature for this page size, and is active
description:
  - A swap area's signature sits at the end of its first page, so a swapfile made under a 4K-page kernel is
    unusable by a 64K-page kernel. The file is (re)made when it is missing, has another size, or lacks a
    signature for I(page_size) (C(mkswap --pagesize)).
  - Only a swap area is ever replaced - a regular file with a swap signature for some page size (4K, 16K or
    64K). Anything else at I(path) (a file of someone else's, a directory, a link) is never touched, and the
    module fails naming it.
  - With I(activate=true) the file is switched on (C(swapon)) when it is not in /proc/swaps. With
    I(activate=false) (a container, where swapon would act on the host's kernel) it is made and validated
    only, and C(activation_skipped) says so.
  - No maintained module makes a swapfile; C(ansible.posix.mount) writes its line in /etc/fstab
    (role host_tuning).
  - Supports check mode.
options:
  path:
    description: The swapfile.
    type: path
    required: true
  size_mib:
    description: Its size in MiB.
    type: int
    required: true
  page_size:
    description: The kernel page size the signature is made for (default the running kernel's).
    type: int
  activate:
    description: Switch the swapfile on.
    type: bool
    default: true
  proc_swaps:
    description: Where /proc/swaps is (tests).
    type: path
    default: /proc/swaps
author: sparkfleet developers
"""

RETURN = r"""
created: {description: Whether the file was (re)made., type: bool, returned: always}
activated: {description: Whether swapon was run., type: bool, returned: always}
active: {description: Whether the file is in /proc/swaps after the run., type: bool, returned: always}
reasons: {description: Why the file was (re)made., type: list, returned: always}
"""

EXAMPLES = r"""
- name: 16 GiB of swap
  sparkfleet.cluster.swapfile:
    path: /swap.sparkfleet
    size_mib: 16384
"""

import os

from ansible.module_utils.basic import AnsibleModule

MIB = 1 << 20
SIGNATURE = b"SWAPSPACE2"


def signature_ok(path: str, page_size: int) -> bool:
    try:
        with open(path, "rb") as fh:
            fh.seek(page_size - len(SIGNATURE))
            return fh.read(len(SIGNATURE)) == SIGNATURE
    except OSError:
        return False


def is_active(proc_swaps: str, path: str) -> bool:
    try:
        with open(proc_swaps, encoding="utf-8") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return False
    real = os.path.realpath(path)
    return any(line.split()[0] in (path, real) for line in lines if line.strip())


PAGE_SIZES = (4096, 16384, 65536)


def foreign(path: str) -> str | None:
    """Why what is at `path` is not a swap area this module may replace; None when missing or a swap file."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path) or not os.path.isfile(path):
        return f"{path} exists and is not a regular file"
    if not any(signature_ok(path, size) for size in PAGE_SIZES):
        return f"{path} exists and is not a swap file (no swap signature for 4K, 16K or 64K pages)"
    return None


def problems(path: str, size: int, page_size: int) -> list[str]:
    if not os.path.exists(path):
        return [f"{path} does not exist"]
    found = []
    actual = os.stat(path).st_size
    if actual != size:
        found.append(f"{path} is {actual // MIB} MiB, {size // MIB} MiB wanted")
    if not signature_ok(path, page_size):
        found.append(f"{path} has no swap signature for {page_size}-byte pages")
    return found


def make(module: AnsibleModule, path: str, size: int, page_size: int) -> None:
    tmp = path + ".sparkfleet-new"
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:  # file systems without fallocate: write zeros
            block = bytes(MIB)
            for _ in range(size // MIB):
                os.write(fd, block)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    mkswap = module.get_bin_path("mkswap", required=True)
    rc, out, err = module.run_command([mkswap, "--pagesize", str(page_size), tmp])
    if rc != 0:
        os.unlink(tmp)
        module.fail_json(msg=f"mkswap failed on {tmp}: {(err or out).strip()}")
    os.replace(tmp, path)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "size_mib": {"type": "int", "required": True},
            "page_size": {"type": "int"},
            "activate": {"type": "bool", "default": True},
            "proc_swaps": {"type": "path", "default": "/proc/swaps"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["size_mib"] < 1:
        module.fail_json(msg=f"size_mib must be at least 1, got {p['size_mib']}")
    path, size = p["path"], p["size_mib"] * MIB
    page_size = p["page_size"] or os.sysconf("SC_PAGE_SIZE")
    why = foreign(path)
    if why:
        module.fail_json(
            msg=f"{why}: sparkfleet replaces only a swap file; choose another path (host_tuning_swapfile)"
        )
    reasons = problems(path, size, page_size)
    active = is_active(p["proc_swaps"], path)
    created = activated = False
    if reasons and not module.check_mode:
        if active:
            if not p["activate"]:
                module.fail_json(msg=f"{path} is active and must be remade, but activate is false")
            rc, out, err = module.run_command([module.get_bin_path("swapoff", required=True), path])
            if rc != 0:
                module.fail_json(msg=f"swapoff {path} failed: {(err or out).strip()}")
            active = False
        make(module, path, size, page_size)
    created = bool(reasons)
    if p["activate"] and (created or not active):
        activated = True
        if not module.check_mode:
            rc, out, err = module.run_command([module.get_bin_path("swapon", required=True), path])
            if rc != 0:
                module.fail_json(msg=f"swapon {path} failed: {(err or out).strip()}")
            active = is_active(p["proc_swaps"], path)
    # a swapfile readable by others leaks memory contents
    mode_fixed = not reasons and (os.stat(path).st_mode & 0o777) != 0o600
    if mode_fixed and not module.check_mode:
        os.chmod(path, 0o600)
    module.exit_json(
        changed=created or activated or mode_fixed,
        mode_fixed=mode_fixed,
        created=created,
        activated=activated,
        active=active,
        reasons=reasons,
        page_size=page_size,
        activation_skipped=None
        if p["activate"]
        else "in a container: swapon would switch the file on in the host's kernel; made and validated only",
    )


if __name__ == "__main__":
    main()
