"""The `tensorfold` command line of each engine version: the real parser's flags, types, choices and defaults.

Flag names, types, choices, defaults and actions are the real parser's (versions.Version.checked_against:
src/tensorfold/cli_args.py); the help texts are this double's own. argparse keeps its prefix matching
(`--cont` is `--context`), as the real parser does, and an unknown flag or a choice the version lacks
exits 2 with argparse's own message.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from . import versions

Handler = Callable[[argparse.Namespace], int]


def snapshot_dir_default() -> str:
    return str(Path.home() / ".cache" / "tensorfold" / "prefix-snapshots")


def _serve(commands, v: versions.Version) -> argparse.ArgumentParser:  # noqa: PLR0915 - one flag a line, as the real parser
    serve = commands.add_parser(
        "serve",
        help="serve one rank of a model behind an OpenAI-compatible endpoint",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    serve.add_argument("model", help="a model directory (or a Hugging Face repo id)")

    endpoint = serve.add_argument_group("endpoint")
    endpoint.add_argument("--host", default="127.0.0.1", help="listen address (rank 0)")
    endpoint.add_argument("--port", type=int, default=8080, help="listen port (rank 0)")
    endpoint.add_argument("--name", default="", help="the model id clients use (empty: the model's name)")
    endpoint.add_argument("--alias", action="append", default=[], help="one more model id (repeatable)")
    if v.name_priority:
        endpoint.add_argument(
            "--name-priority",
            action="append",
            default=[],
            metavar="ID=background",
            help="requests for ID run at background priority (repeatable)",
        )
    if v.api_keys:
        endpoint.add_argument(
            "--api-key", action="append", default=[], help="an accepted API key (repeatable)"
        )
        endpoint.add_argument("--api-key-file", help="a file of keys, 'label: key' or a bare key per line")
        endpoint.add_argument("--metrics-open", action="store_true", help="serve /metrics without a key")
    endpoint.add_argument(
        "--vision", action="store_true", help="accept images (families with a vision tower)"
    )
    endpoint.add_argument("--vision-urls", action="store_true", help="with --vision: also http(s) image URLs")
    endpoint.add_argument("--vision-offload", action="store_true", help="with --vision: tower in host memory")
    endpoint.add_argument(
        "--vision-max-images", type=int, default=None, help="with --vision: images a request"
    )
    endpoint.add_argument(
        "--vision-image-tokens", type=int, default=None, help="with --vision: visual tokens"
    )

    gen = serve.add_argument_group("generation defaults (a request's own values win)")
    gen.add_argument("--context", type=int, default=None, help="prompt plus reply window in tokens")
    gen.add_argument("--max-tokens", type=int, default=4096, help="reply tokens of a request that sets none")
    gen.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    gen.add_argument("--top-p", type=float, default=None, help="nucleus sampling")
    gen.add_argument("--top-k", type=int, default=None, help="top-k sampling")
    gen.add_argument("--min-p", type=float, default=None, help="min-p sampling")
    gen.add_argument(
        "--thinking", action=argparse.BooleanOptionalAction, default=True, help="think unless a request says"
    )
    gen.add_argument(
        "--reasoning-effort", choices=("low", "medium", "high", "xhigh"), default=None, help="default effort"
    )
    gen.add_argument("--thinking-budget", type=int, default=0, help="thinking tokens at most (0: no limit)")

    speed = serve.add_argument_group("drafting and caches")
    speed.add_argument("--no-drafts", action="store_true", help="decode one token a round")
    speed.add_argument("--drafter", default="auto", help="a separate draft model (auto, none, or a model)")
    speed.add_argument("--drafter-bits", type=int, default=4, help="draft model quantization")
    speed.add_argument("--mtp-drafts", type=int, default=None, help="MTP drafts a round")
    speed.add_argument(
        "--mtp-confidence", type=float, default=None, help="stop drafting under this confidence"
    )
    speed.add_argument("--lane-kernels", choices=("auto", "on", "off"), default="auto", help="lane kernels")
    speed.add_argument(
        "--prompt-cache-gib", type=float, default=None, help="memory for cached prompt prefixes"
    )
    speed.add_argument("--checkpoint-slots", type=int, default=None, help="cached prefixes kept in memory")
    speed.add_argument(
        "--spill-gib", type=float, default=0.0, help="disk for evicted prefixes (--snapshot-dir)"
    )
    speed.add_argument("--snapshot-dir", default=snapshot_dir_default(), help="where prefix snapshots go")
    speed.add_argument("--max-snapshots", type=int, default=3, help="snapshots loaded at start")
    speed.add_argument("--parallel", default="auto", help="requests decoded together (a number or auto)")
    speed.add_argument("--decode-share", type=float, default=None, help="decode's share while prompts fill")
    speed.add_argument("--prefill-pass", type=int, default=8, help="Mac: prompt chunks a forward")
    speed.add_argument("--pass-cache-gib", type=float, default=16.0, help="Mac: buffer cache during a pass")
    speed.add_argument("--mlx-cache-gib", type=float, default=8.0, help="Mac: buffer cache")
    speed.add_argument(
        "--ssd-experts", type=float, default=None, metavar="GIB", help="stream experts from disk"
    )
    speed.add_argument("--ple-on-ssd", action="store_true", help="read n-gram tables from disk")
    speed.add_argument("--no-update-check", action="store_true", help="do not look for a newer release")

    cuda = serve.add_argument_group("NVIDIA GPUs")
    cuda.add_argument("--backend", choices=("auto", "mlx", "cuda"), default="auto", help="engine backend")
    cuda.add_argument("--tp", type=int, choices=v.tp_choices, default=1, help="GPUs (one a machine)")
    cuda.add_argument("--rank", type=int, choices=v.rank_choices, default=0, help="this machine's rank")
    cuda.add_argument("--master", default="", help="rank 0's address on the link between the machines")
    cuda.add_argument("--master-port", type=int, default=29551, help="rank 0's rendezvous port")
    cuda.add_argument("--kv-dtype", choices=("bf16", "int8", "int4"), default="bf16", help="KV cache format")
    cuda.add_argument(
        "--prefill-fp8",
        action=argparse.BooleanOptionalAction,
        default=argparse.SUPPRESS,
        help="FP8 activations in prompt matmuls",
    )
    cuda.add_argument(
        "--precision", choices=("checkpoint", "full"), default=argparse.SUPPRESS, help="activation math"
    )
    return serve


def build_parser(handlers: dict[str, Handler]) -> argparse.ArgumentParser:
    """The `tensorfold` parser of this build's engine version, each subcommand bound to `handlers[name]`: the
    real function's name and signature (src/tensorfold/cli_args.py), which sparkfleet's engine_args module
    calls in the image to parse a rank's new command line before anything is stopped."""
    from ._build import ENGINE

    return parser_of(ENGINE, handlers)


def parser_of(version: str, handlers: dict[str, Handler] | None = None) -> argparse.ArgumentParser:
    """The `tensorfold` parser of engine `version` (versions.VERSIONS), subcommands bound to `handlers`."""
    v = versions.get(version)
    handlers = handlers or {}
    parser = argparse.ArgumentParser(
        prog="tensorfold", description="TensorFold (the sparkfleet lab's double of `tensorfold serve`)."
    )
    parser.add_argument("--version", action="version", version=f"tensorfold {v.version}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = _serve(commands, v)
    serve.set_defaults(func=handlers.get("serve"))

    pull = commands.add_parser("pull", help="download models from Hugging Face")
    pull.add_argument("repos", nargs="+", help="repo ids")
    pull.set_defaults(func=handlers.get("pull"))

    models = commands.add_parser("models", help="list the model families")
    models.set_defaults(func=handlers.get("models"))

    update = commands.add_parser("update", help="install the newest release")
    update.add_argument("--check", action="store_true", help="only say whether one exists")
    update.add_argument("--force", action="store_true", help="reinstall")
    update.set_defaults(func=handlers.get("update"))

    info = commands.add_parser("info", help="which family serves a model (reads config.json)")
    info.add_argument("model", help="a model directory or repo id")
    info.set_defaults(func=handlers.get("info"))

    plan = commands.add_parser("plan", help="estimate a checkpoint against memory budgets")
    plan.add_argument("model", help="a model directory or cached repo id")
    plan.add_argument("--memory-gb", type=float, default=None, metavar="GIB", help="an explicit budget")
    plan.add_argument("--ram", type=int, action="append", default=[], metavar="GIB", help="a RAM class")
    plan.set_defaults(func=handlers.get("plan"))
    return parser


def serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `serve` subparser of a parser parser_of made."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["serve"]
    raise LookupError("no serve subcommand")
