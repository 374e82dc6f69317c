#!/usr/bin/python3
# sparkfleet: a rank's new command line through the engine image's own parser, before anything is stopped.
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_args
short_description: Parse a rank's new command line with the engine image's own argument parser
description:
  - Runs the engine's own parser over the command line a rank is about to be started with, in a throw-away
    container of the engine image (C(docker run --rm --network none)), and reports whether the engine would
    accept it. Nothing else runs; the parser is built and C(parse_args) is called, no model is loaded, no GPU
    or weights are touched.
  - Role engine_service runs it before it writes a new unit or stops a running rank, so that a flag value the
    engine refuses (argparse exits 2 and the rank dies at once) fails the play while the running engine keeps
    serving. The inventory checks (preflight) judge every setting's kind first, this is the engine's own word.
  - TensorFold's parser is C(tensorfold.cli_args.build_parser(handlers)) (its C(main) builds it with the
    subcommands' handlers and calls C(parse_args)); the handlers are not called here.
  - A command line that is not TensorFold's (the profile's command does not start with C(tensorfold)), an
    image whose Python cannot import the parser, or Docker refusing the container gives C(state=unchecked)
    with the reason, never C(ok).
  - Read-only, in check mode too; the container is removed when the parser returns.
options:
  image: {type: str, required: true, description: "The engine image: its ID, as the rank's container has it."}
  argv:
    type: list
    elements: str
    required: true
    description: The rank's command as the container runs it, program name first (C(tensorfold serve ...)).
  parser:
    type: str
    default: tensorfold.cli_args:build_parser
    description: The C(module:function) that builds the engine's parser from a mapping of subcommand handlers.
  program:
    type: str
    default: tensorfold
    description: The program name the parser stands for (I(argv)'s first word must be it).
  python: {type: str, default: python3, description: The image's Python.}
  docker: {type: str, default: docker, description: The docker CLI.}
  timeout: {type: int, default: 120, description: Seconds the parse may take (a cold import of the engine).}
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Would the engine accept rank 0's new command line?
  sparkfleet.cluster.engine_args:
    image: sha256:4f5e...
    argv: [tensorfold, serve, /weights, --tp, "2", --rank, "0", --port, "8000"]
  register: args
"""

RETURN = r"""
state:
  description: C(ok) the parser accepts it; C(refused) the engine would exit at once (C(problem) says why);
    C(unchecked) the parse could not be run (C(problem) says why).
  type: str
  returned: always
problem: {description: "The engine's own message (argparse's last line), or why it could not be checked.",
          type: str, returned: always}
exit_code:
  description: "The exit status of the parse (null when it did not run). Not C(rc): Ansible fails a task
    whose result has a non-zero C(rc), and a refusal is this module's answer, not its failure."
  type: int
  returned: always
"""

import shlex

from ansible.module_utils.basic import AnsibleModule

# Builds the parser as the engine's main does, with handlers it never calls, and parses; argparse prints its
# usage and message and exits 2 on a refusal. Exit 3: the parser could not be imported or built.
SCRIPT = """
import collections, importlib, sys
where, _, name = sys.argv[1].partition(":")
try:
    build = getattr(importlib.import_module(where), name)
    parser = build(collections.defaultdict(lambda: None))
except Exception as exc:
    print(f"cannot build the engine's parser {sys.argv[1]}: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(3)
parser.parse_args(sys.argv[2:])
"""
ARGPARSE_REFUSED = 2
NO_PARSER = 3
TIMED_OUT = 124


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def judge(rc: int | None, err: str, docker_cmd: list[str]) -> dict:
    """One parse's verdict: docker's own failures (125-127) and a missing parser are not the engine's word."""
    if rc == 0:
        return {"state": "ok", "problem": "", "exit_code": rc}
    if rc == ARGPARSE_REFUSED:
        return {"state": "refused", "problem": last_line(err) or "exit 2 without a message", "exit_code": rc}
    what = last_line(err) or f"exit {rc}"
    if rc == NO_PARSER:
        return {"state": "unchecked", "problem": what, "exit_code": rc}
    return {"state": "unchecked", "problem": f"{shlex.join(docker_cmd[:6])} ...: {what}", "exit_code": rc}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "argv": {"type": "list", "elements": "str", "required": True},
            "parser": {"type": "str", "default": "tensorfold.cli_args:build_parser"},
            "program": {"type": "str", "default": "tensorfold"},
            "python": {"type": "str", "default": "python3"},
            "docker": {"type": "str", "default": "docker"},
            "timeout": {"type": "int", "default": 120},
        },
        supports_check_mode=True,
    )
    p = module.params
    argv = p["argv"]
    if not argv or argv[0].rsplit("/", 1)[-1] != p["program"]:
        module.exit_json(
            changed=False,
            state="unchecked",
            exit_code=None,
            problem=f"the command {shlex.join(argv[:3])} ... is not {p['program']}'s: its parser is unknown",
        )
    cmd = [p["docker"], "run", "--rm", "--network", "none", "--entrypoint", p["python"], p["image"]]
    cmd += ["-c", SCRIPT, p["parser"], *argv[1:]]
    # coreutils' timeout: run_command has none; 124 when it struck
    rc, _out, err = module.run_command(["timeout", str(p["timeout"]), *cmd])
    if rc == TIMED_OUT:
        err = f"the parse did not finish in {p['timeout']} s"
    module.exit_json(changed=False, **judge(rc, err, cmd))


if __name__ == "__main__":
    main()
