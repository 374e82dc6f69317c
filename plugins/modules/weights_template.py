#!/usr/bin/python
# The TP2 recipe's patch_template step: the pinned chat template plus the role's fix, idempotently.
from __future__ import annotations

DOCUMENTATION = r"""
module: weights_template
short_description: Write the chat template with a unified-diff fix applied
description:
  - Reads C(src) (the chat template of the verified snapshot, i.e. fetched at the pinned revision),
    applies C(patch) (a unified diff, the text of a file kept in the role) and writes C(dest).
  - Idempotent. If the fix is already in C(src) (the patch applies in reverse), C(src) is written
    as is; if C(dest) already holds the result, nothing changes. If the patch applies neither way,
    the template at that revision is not the one the fix was written for, a clear error.
  - The snapshot file itself is never modified (its SHA-256 is part of the verified manifest). That is why
    not C(ansible.posix.patch), which patches a file in place and needs the C(patch) program on the node.
options:
  src: {type: path, required: true, description: the template in the snapshot}
  patch: {type: str, required: true, description: unified diff text}
  patch_name: {type: str, default: the fix, description: name for messages}
  dest: {type: path, required: true, description: where the fixed template goes}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Write the fixed chat template
  sparkfleet.cluster.weights_template:
    src: /srv/sparkfleet/models/snapshot/chat_template.jinja
    patch: "{{ lookup('ansible.builtin.file', 'chat_template-thinking-off.patch', rstrip=false) }}"
    dest: /srv/sparkfleet/models/chat_template.jinja
"""

RETURN = r"""
state:
  description: "C(applied), or C(already in the template) when the snapshot's template has the fix."
  type: str
  returned: success
path:
  description: The fixed template (I(dest)).
  type: str
  returned: success
sha256:
  description: SHA-256 of the fixed template.
  type: str
  returned: success
source_sha256:
  description: SHA-256 of the snapshot's template.
  type: str
  returned: success
"""

import hashlib
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import write_atomic
from ansible_collections.sparkfleet.cluster.plugins.module_utils.weights_main import run_module

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    pass


def parse_patch(text: str) -> list[dict]:  # noqa: PLR0912 - one branch per unified-diff line kind
    hunks: list[dict] = []
    cur = None
    if text and not text.endswith("\n"):
        text += "\n"  # a lookup may strip the final newline; the diff's last line still has one
    for line in text.splitlines(keepends=True):
        if line.startswith(("--- ", "+++ ", "diff ", "index ")) and cur is None:
            continue
        m = HUNK.match(line)
        if m:
            cur = {"old_start": int(m.group(1)), "old": [], "new": []}
            hunks.append(cur)
            continue
        if cur is None:
            continue
        if line.startswith("\\"):
            # "\ No newline at end of file": strip the newline of the previous line
            for side in ("old", "new"):
                if cur[side] and cur.get("last") in (side, "both"):
                    cur[side][-1] = cur[side][-1].rstrip("\n")
            continue
        tag, body = line[:1], line[1:]
        if tag == " ":
            cur["old"].append(body)
            cur["new"].append(body)
            cur["last"] = "both"
        elif tag == "-":
            cur["old"].append(body)
            cur["last"] = "old"
        elif tag == "+":
            cur["new"].append(body)
            cur["last"] = "new"
        elif line.strip() == "":
            cur["old"].append("\n")
            cur["new"].append("\n")
            cur["last"] = "both"
        else:
            raise PatchError(f"not a unified diff line: {line[:60]!r}")
    if not hunks:
        raise PatchError("the patch has no hunks")
    return hunks


def apply(text: str, hunks: list[dict], reverse: bool = False) -> str:
    lines = text.splitlines(keepends=True)
    offset = 0
    for n, h in enumerate(hunks, start=1):
        old, new = (h["new"], h["old"]) if reverse else (h["old"], h["new"])
        guess = max(0, h["old_start"] - 1 + offset)
        at = None
        if lines[guess : guess + len(old)] == old:
            at = guess
        else:
            found = [i for i in range(len(lines) - len(old) + 1) if lines[i : i + len(old)] == old]
            if len(found) == 1:
                at = found[0]
            elif len(found) > 1:
                raise PatchError(f"hunk {n} matches {len(found)} places")
        if at is None:
            removed = [ln.rstrip("\n") for ln in old if ln.strip()]
            kept = {x.rstrip("\n") for x in new}
            changed = [ln for ln in removed if ln not in kept]
            shown = " / ".join(repr(ln.strip()) for ln in (changed or removed)[:3])
            raise PatchError(f"hunk {n}: the template does not contain the text it fixes: {shown}")
        lines[at : at + len(old)] = new
        offset += len(new) - len(old)
    return "".join(lines)


def run(params: dict, check_mode: bool = False) -> dict:
    src, dest, name = params["src"], params["dest"], params.get("patch_name") or "the fix"
    try:
        with open(src) as fh:
            original = fh.read()
    except FileNotFoundError:
        raise PatchError(
            f"the snapshot has no chat template {src}: the revision pinned in sparkfleet_pins.model has "
            "none (model_weights_chat_template_file names it); set model_weights_chat_template_patch to '' "
            "or pin a revision with the template the fix was written for"
        ) from None
    except OSError as exc:
        raise PatchError(f"cannot read the chat template {src}: {exc}") from exc
    hunks = parse_patch(params["patch"])
    try:
        result = apply(original, hunks)
        state = "applied"
    except PatchError as forward:
        try:
            apply(original, hunks, reverse=True)
        except PatchError:
            raise PatchError(
                f"{name} does not apply to {src} ({forward}), and the template does not already contain it: "  # noqa: S608 - a message, not SQL
                "the template at the pinned revision is not the one the fix was written for. "
                "Update the patch (model_weights_chat_template_patch) for this revision, "
                "or set it to '' to serve the template as is."
            ) from None
        result = original
        state = "already in the template"
    try:
        with open(dest) as fh:
            before = fh.read()
    except OSError:
        before = None
    changed = before != result
    if changed and not check_mode:
        write_atomic(dest, result)
    out = {
        "changed": changed,
        "state": state,
        "path": dest,
        "sha256": hashlib.sha256(result.encode()).hexdigest(),
        "source_sha256": hashlib.sha256(original.encode()).hexdigest(),
        "msg": f"{dest}: {name} {state}",
    }
    if changed:
        out["diff"] = {"before": before or "", "after": result, "before_header": dest, "after_header": dest}
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "src": {"type": "path", "required": True},
            "patch": {"type": "str", "required": True},
            "patch_name": {"type": "str", "default": "the fix"},
            "dest": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    run_module(module, run, known=(PatchError,))


if __name__ == "__main__":
    main()
