"""The `tensorfold serve` flags of each engine version an engine profile names, and a parser built from them.

Transcribed by hand from sfxnz/TensorFold src/tensorfold/cli_args.py at
2258b00d1bbd74cae23d227f6cf41de946e49451 (engine 0.6.4) and at
dc971a2c47b9d29622e0b7f69b0708418694d700 (0.6.6): every serve flag in the real order, with its action,
type, choices and default. The TP3 recipe's engine is not public: its table is 0.6.6's with --tp 1,2,3
and --rank 0-2 (an assumption, README "Profiles").

Preflight parses each rank's command line (the profile's flags from the settings, then
engine_service_extra_args) with `argv_problems` before any node is touched, with argparse itself, so the
engine's own rules hold: unknown flags, values of the wrong type, choices, missing values, and argparse's
prefix matching (`--cont` is `--context`; an ambiguous prefix is refused). The engine's own parser in the
image has the last word before a restart (module engine_args). The lab's engine double is tested against
these tables (tests/unit/test_engine_double_parser.py). Standard library only.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping
from pathlib import Path

from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_profile import SETTING_VARS, rank_args

S = argparse.SUPPRESS
BOOL = "BooleanOptionalAction"
SNAPSHOTS = str(Path.home() / ".cache" / "tensorfold" / "prefix-snapshots")

# (flag, action, type, choices, default)
COMMON_HEAD = [
    ("model", "store", None, None, None),
    ("--host", "store", None, None, "127.0.0.1"),
    ("--port", "store", int, None, 8080),
    ("--name", "store", None, None, ""),
    ("--alias", "append", None, None, []),
]
KEYS_066 = [
    ("--name-priority", "append", None, None, []),
    ("--api-key", "append", None, None, []),
    ("--api-key-file", "store", None, None, None),
    ("--metrics-open", "store_true", None, None, False),
]
COMMON_TAIL = [
    ("--vision", "store_true", None, None, False),
    ("--vision-urls", "store_true", None, None, False),
    ("--vision-offload", "store_true", None, None, False),
    ("--vision-max-images", "store", int, None, None),
    ("--vision-image-tokens", "store", int, None, None),
    ("--context", "store", int, None, None),
    ("--max-tokens", "store", int, None, 4096),
    ("--temperature", "store", float, None, None),
    ("--top-p", "store", float, None, None),
    ("--top-k", "store", int, None, None),
    ("--min-p", "store", float, None, None),
    ("--thinking", BOOL, None, None, True),
    ("--reasoning-effort", "store", None, ("low", "medium", "high", "xhigh"), None),
    ("--thinking-budget", "store", int, None, 0),
    ("--no-drafts", "store_true", None, None, False),
    ("--drafter", "store", None, None, "auto"),
    ("--drafter-bits", "store", int, None, 4),
    ("--mtp-drafts", "store", int, None, None),
    ("--mtp-confidence", "store", float, None, None),
    ("--lane-kernels", "store", None, ("auto", "on", "off"), "auto"),
    ("--prompt-cache-gib", "store", float, None, None),
    ("--checkpoint-slots", "store", int, None, None),
    ("--spill-gib", "store", float, None, 0.0),
    ("--snapshot-dir", "store", None, None, SNAPSHOTS),
    ("--max-snapshots", "store", int, None, 3),
    ("--parallel", "store", None, None, "auto"),
    ("--decode-share", "store", float, None, None),
    ("--prefill-pass", "store", int, None, 8),
    ("--pass-cache-gib", "store", float, None, 16.0),
    ("--mlx-cache-gib", "store", float, None, 8.0),
    ("--ssd-experts", "store", float, None, None),
    ("--ple-on-ssd", "store_true", None, None, False),
    ("--no-update-check", "store_true", None, None, False),
    ("--backend", "store", None, ("auto", "mlx", "cuda"), "auto"),
]


def _cuda(tp: tuple, rank: tuple) -> list[tuple]:
    return [
        ("--tp", "store", int, tp, 1),
        ("--rank", "store", int, rank, 0),
        ("--master", "store", None, None, ""),
        ("--master-port", "store", int, None, 29551),
        ("--kv-dtype", "store", None, ("bf16", "int8", "int4"), "bf16"),
        ("--prefill-fp8", BOOL, None, None, S),
        ("--precision", "store", None, ("checkpoint", "full"), S),
    ]


SERVE_FLAGS = {
    "0.6.4": COMMON_HEAD + COMMON_TAIL + _cuda((1, 2), (0, 1)),
    "0.6.6": COMMON_HEAD + KEYS_066 + COMMON_TAIL + _cuda((1, 2, 4), (0, 1, 2, 3)),
    "tp3-recipe": COMMON_HEAD + KEYS_066 + COMMON_TAIL + _cuda((1, 2, 3), (0, 1, 2)),
}
# stand-ins where any value parses alike: rank 0's fabric address (the plan's), where rank 0 reads the keys
MASTER = "192.0.2.1"
KEY_FILE = "/run/sparkfleet/api-keys/keys"


class Refused(Exception):
    """argparse's refusal of a command line, in its own words."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage and exit 2
        raise Refused(f"{self.prog}: error: {message}")


@functools.cache
def parser(version: str) -> argparse.ArgumentParser:
    """`tensorfold` with the `serve` subcommand of engine `version` (a key of SERVE_FLAGS); it raises
    Refused where argparse would exit 2: `tensorfold serve: error: ...` for a refusal inside serve,
    `tensorfold: error: unrecognized arguments: ...`, as the real command says them. Built once per version
    and process (parse_args changes nothing in the parser: preflight parses every rank of every node)."""
    top = _Parser(prog="tensorfold", add_help=False)
    serve = top.add_subparsers(dest="command", required=True).add_parser("serve", add_help=False)
    for flag, action, kind, choices, default in SERVE_FLAGS[version]:
        if not flag.startswith("-"):
            serve.add_argument(flag)
            continue
        kwargs: dict = {"default": default}
        if action == BOOL:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif action != "store":
            kwargs["action"] = action
        if kind is not None:
            kwargs["type"] = kind
        if choices is not None:
            kwargs["choices"] = choices
        serve.add_argument(flag, **kwargs)
    return top


def argv_problem(version: str, argv: list[str]) -> str | None:
    """argparse's message when engine `version` refuses `serve` ARGV (the model directory first); None."""
    try:
        parser(version).parse_args(["serve", *(str(a) for a in argv)])
    except Refused as exc:
        return str(exc)
    return None


def _flag_of(message: str) -> str | None:
    """The flag argparse names in `argument --x/--no-x: ...`, else None."""
    head = message.split("error: ", 1)[-1]
    if not head.startswith("argument "):
        return None
    return head.removeprefix("argument ").split(":", 1)[0].split("/", 1)[0]


def command_line_problems(
    profile: Mapping, values: Mapping, extra: list | None, ranks: int, endpoint: Mapping
) -> list[str]:
    """Each rank's command line as the role will derive it (the profile's flags from the settings, the
    cache flags aside, then engine_service_extra_args) through the profile's engine parser; a refusal names
    the variable that set the refused flag (engine_service_extra_args for a flag the profile does not pass).
    `endpoint`: host, port, name, master_port and api_key_required, as the role passes them."""
    version = str(profile.get("engine_version"))
    if version not in SERVE_FLAGS:
        return []  # the profile check names an unknown engine_version
    flag_vars = {}
    for a in profile.get("args") or []:
        if isinstance(a, Mapping) and a.get("setting"):
            var = SETTING_VARS.get(str(a["setting"]), str(a["setting"]))
            flag_vars.update({str(f): var for f in (a.get("flag"), a.get("off_flag")) if f})
    key_file = KEY_FILE if endpoint.get("api_key_required") else None
    seen: dict[str, list[int]] = {}
    for rank in range(ranks):
        vals = {
            **values,
            "tp": ranks,
            "rank": rank,
            "master": MASTER,
            "api_key_file": key_file if rank == 0 else None,
        }
        vals.update({k: endpoint.get(k) for k in ("master_port", "host", "port", "name")})
        argv = ["/snapshot", *rank_args(profile, vals, rank), *[str(a) for a in extra or []]]
        problem = argv_problem(version, argv)
        if problem:
            seen.setdefault(problem, []).append(rank)
    out = []
    for problem, refused in seen.items():
        var = flag_vars.get(_flag_of(problem) or "", "engine_service_extra_args")
        who = "every rank" if len(refused) == ranks else "rank " + ", ".join(map(str, refused))
        out.append(
            f"{var}: the engine of this profile (tensorfold {version}) would refuse the command line of "
            f"{who} and exit at once: {problem}. Fix {var} (`tensorfold serve --help` lists what this "
            "engine takes)"
        )
    return out
