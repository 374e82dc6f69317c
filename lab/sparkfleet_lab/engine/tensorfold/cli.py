"""The `tensorfold` command (console script): argv as the real cli.main reads it.

`tensorfold MODEL ...` is `tensorfold serve MODEL ...` when MODEL is a directory or a repo id. A refusal
(ValueError, FileNotFoundError) prints `tensorfold: <message>` on stderr and exits 1; any other failure
is a Python traceback (exit 1); argparse's own errors exit 2 (sfxnz/TensorFold src/tensorfold/cli.py main).
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import cli_args, family, versions
from ._build import ENGINE

COMMANDS = ("serve", "pull", "models", "info", "update", "service", "tui", "plan")


def cmd_serve(args) -> int:
    from .serve import cmd_serve as serve

    return serve(args)


def cmd_models(args) -> int:
    print(f"{family.TITLE} ({family.MODEL_TYPE}; CUDA engine)")
    for repo in family.MODELS:
        print(f"  model    {repo}")
    return 0


def cmd_info(args) -> int:
    model_dir = family.model_dir_of(args.model)
    config = family.read_config(model_dir)
    print(f"model_type   {config.get('model_type')}")
    family.check_config(config)
    print(f"family       {family.TITLE} (deepseek_v41)")
    print("engine       CUDA engine")
    for key in ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings"):
        if key in config:
            print(f"{key:12s} {config[key]}" if len(key) <= 12 else f"{key} {config[key]}")
    return 0


def _offline(name: str):
    def refuse(args) -> int:
        raise ValueError(
            f"`tensorfold {name}` needs the internet or a GPU; the lab's engine double does not do it"
        )

    return refuse


HANDLERS = {
    "serve": cmd_serve,
    "models": cmd_models,
    "info": cmd_info,
    "pull": _offline("pull"),
    "update": _offline("update"),
    "plan": _offline("plan"),
}


def build_parser():
    return cli_args.build_parser(HANDLERS)


def main(argv: list[str] | None = None) -> int:
    versions.get(ENGINE)
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argv[0] if argv else "-"
    implicit = Path(first).expanduser().is_dir() or family.REPO_ID.fullmatch(first)
    if not first.startswith("-") and first not in COMMANDS and implicit:
        argv = ["serve", *argv]
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (FileNotFoundError, ValueError) as exc:
        print(f"tensorfold: {exc}", file=sys.stderr)
        return 1
