#!/usr/bin/python3
# sparkfleet: the engine's API key, generated once on the head (stdlib only; runs on the node).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_api_key
short_description: Generate the engine's API key once and keep it (and an optional credentials file) at 0600
description:
  - >-
    The key file holds accepted bearer keys, one C(label: key) per line (TensorFold's --api-key-file, which
    refuses a file group or others can read). When it holds no key, one is generated with the C(secrets)
    module on this node and written as C(I(label): <key>); an existing key is never replaced.
  - >-
    Optionally writes a credentials file C(VAR=<first key>) for clients on the head (the TP3 recipe's
    C(~/ds1017/api/credentials.env) with C(SPARK_API_KEY)), mode 0600, in a 0700 directory. An existing
    credentials file that sparkfleet did not write (its first line is not sparkfleet's header) is never
    replaced: the module fails naming it.
  - >-
    A missing directory of either file is made (with its missing parents) 0700 with the file's owner; an
    existing directory is left as it is (it may be someone else's, e.g. a home directory).
  - >-
    The key is never returned; C(fingerprint) is the first 12 hex digits of its SHA-256.
options:
  path: {type: path, required: true, description: The key file.}
  owner: {type: str, default: root, description: Owner of the key file.}
  group: {type: str, default: root, description: Group of the key file.}
  prefix: {type: str, default: sk-sparkfleet-, description: Prefix of a generated key.}
  nbytes: {type: int, default: 32, description: Random bytes in a generated key.}
  label: {type: str, default: sparkfleet, description: "The label of a generated key (logged by the engine)."}
  credentials_file: {type: path, description: Also write VAR=key here (empty = none).}
  credentials_var: {type: str, default: SPARK_API_KEY, description: Variable name in the credentials file.}
  credentials_owner: {type: str, description: Owner of the credentials file and its directory.}
  credentials_group: {type: str, description: Group of the credentials file and its directory.}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: The engine's API key, and the TP3 recipe's credentials file for the admin
  sparkfleet.cluster.engine_api_key:
    path: /etc/sparkfleet/api-keys
    credentials_file: /home/spark/ds1017/api/credentials.env
    credentials_owner: spark
  no_log: true
"""

RETURN = r"""
generated: {description: a new key was generated in this run, type: bool, returned: always}
fingerprint: {description: first 12 hex digits of the key's SHA-256, type: str, returned: always}
keys: {description: how many keys the file holds, type: int, returned: always}
"""

import grp
import hashlib
import os
import pwd
import secrets

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.api_keys import (
    LABEL,
    KeyFileError,
    parse_key_file,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import read_text, write_atomic

MIN_KEY_LENGTH = 16


def new_key(prefix: str, nbytes: int) -> str:
    return prefix + secrets.token_urlsafe(nbytes)


CREDENTIALS_HEADER = (
    "# Written by sparkfleet (engine_service): the engine's API key. Load: set -a; . <this file>; set +a"
)


def credentials_text(var: str, key: str) -> str:
    return f"{CREDENTIALS_HEADER}\n{var}={key}\n"


def _ids(owner: str | None, group: str | None) -> tuple[int, int]:
    uid = pwd.getpwnam(owner).pw_uid if owner else os.getuid()
    gid = grp.getgrnam(group).gr_gid if group else (pwd.getpwuid(uid).pw_gid if owner else os.getgid())
    return uid, gid


def needs_fix(path: str, uid: int, gid: int, mode: int = 0o600) -> bool:
    st = os.stat(path)
    return (st.st_mode & 0o777) != mode or st.st_uid != uid or st.st_gid != gid


def ensure_dir(path: str, uid: int, gid: int, mode: int, check: bool) -> bool:
    """Make a missing directory (and its missing parents) with this owner and mode. An existing one is left
    as it is: it may be someone else's (a home directory, a directory an admin pointed the file into)."""
    if os.path.isdir(path):
        return False
    if not check:
        parent = os.path.dirname(path)
        if parent and not os.path.isdir(parent):
            ensure_dir(parent, uid, gid, mode, check)
        os.mkdir(path, mode)
        os.chown(path, uid, gid)
    return True


def ensure_credentials(module: AnsibleModule, key: str) -> bool:
    p = module.params
    cpath = p["credentials_file"]
    try:
        cuid, cgid = _ids(p["credentials_owner"], p["credentials_group"])
    except KeyError as exc:
        module.fail_json(msg=f"unknown owner/group for {cpath}: {exc}")
    check = module.check_mode
    want = credentials_text(p["credentials_var"], key)
    have = read_text(cpath)
    if (have is not None or os.path.lexists(cpath)) and not (have or "").startswith(CREDENTIALS_HEADER):
        module.fail_json(
            msg=f"{cpath} exists and was not written by sparkfleet (its first line is not sparkfleet's "
            "header): it is not replaced; move it away or set engine_service_credentials_file to another file"
        )
    changed = ensure_dir(os.path.dirname(cpath), cuid, cgid, 0o700, check)
    if have != want:
        if not check:
            write_atomic(cpath, want, 0o600, uid=cuid, gid=cgid)
        return True
    if needs_fix(cpath, cuid, cgid):
        if not check:
            os.chmod(cpath, 0o600)
            os.chown(cpath, cuid, cgid)
        return True
    return changed


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "prefix": {"type": "str", "default": "sk-sparkfleet-"},
            "nbytes": {"type": "int", "default": 32},
            "label": {"type": "str", "default": "sparkfleet"},
            "credentials_file": {"type": "path"},
            "credentials_var": {"type": "str", "default": "SPARK_API_KEY"},
            "credentials_owner": {"type": "str"},
            "credentials_group": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    check = module.check_mode
    path = p["path"]
    if not LABEL.fullmatch(p["label"]):
        module.fail_json(msg=f"label {p['label']!r}: 1-64 letters, digits, dots, underscores or hyphens")
    if p["nbytes"] < 16:
        module.fail_json(msg="nbytes must be at least 16 (128 bits)")
    try:
        uid, gid = _ids(p["owner"], p["group"])
    except KeyError as exc:
        module.fail_json(msg=f"unknown owner/group for {path}: {exc}")
    changed = False
    generated = False
    try:
        keys = [key for _label, key in parse_key_file(read_text(path) or "")]
    except KeyFileError as exc:
        module.fail_json(msg=f"{path}: {exc}")
    short = [i for i, k in enumerate(keys, 1) if len(k) < MIN_KEY_LENGTH]
    if short:
        module.fail_json(msg=f"{path}: key(s) {short} are shorter than {MIN_KEY_LENGTH} characters")
    changed |= ensure_dir(os.path.dirname(path), uid, gid, 0o700, check)
    if not keys:
        key = new_key(p["prefix"], p["nbytes"])
        generated = changed = True
        if not check:
            text = f"# API keys of the sparkfleet engine, `label: key` a line\n{p['label']}: {key}\n"
            write_atomic(path, text, 0o600, uid=uid, gid=gid)
        keys = [key]
    elif needs_fix(path, uid, gid):
        changed = True
        if not check:
            os.chmod(path, 0o600)
            os.chown(path, uid, gid)

    if p["credentials_file"]:
        changed |= ensure_credentials(module, keys[0])

    fingerprint = hashlib.sha256(keys[0].encode()).hexdigest()[:12]
    module.exit_json(changed=changed, generated=generated, fingerprint=fingerprint, keys=len(keys), path=path)


if __name__ == "__main__":
    main()
