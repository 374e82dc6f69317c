"""The deepseek_v41 family's startup rules, as sfxnz/TensorFold states and checks them.

Sources (read at the commits versions.py names, and the family page docs/recipes/deepseek-v4.1-flash.md):
src/tensorfold/cli.py (cmd_serve, _serve_cuda: --master, --rank, --tp 4, --context, --parallel),
src/tensorfold/serve_options.py (--vision*, --decode-share, --kv-dtype, --prefill-fp8, --mtp-confidence),
src/tensorfold/families/deepseek_v41/__init__.py (check, cuda_engine: two ranks, --master, no separate
--drafter, --mtp-drafts 0-5), families/deepseek_v41/cuda/protocol.py (the settings the ranks compare).
Refusals are ValueError (the command prints `tensorfold: <message>` and exits 1, as cli.main does); a
settings mismatch is RuntimeError (a traceback, exit 1), as protocol.agree raises it. The messages are
the double's own words.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from .versions import Version

TITLE = "DeepSeek-V4.1-Flash"
MODEL_TYPE = "deepseek_v41"
MODELS = ("sfxnz/DeepSeek-V4.1-Flash-EXL3",)
BLOCK = 5  # DSpark drafts a round at most
DEFAULT_DRAFTS = 3
MAX_ROWS = 6  # a verify window: the target token and BLOCK drafts
PREFILL_ROWS = 2048
RING = 128
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# the ranks' agreement vector (protocol.SETTINGS), with the double's whole-snapshot layout in place of the
# Engram layout digest, and the lanes (--parallel) the ranks plan together
SETTINGS = (
    "start_error",
    "dspark_loaded",
    "capacity",
    "prefill_rows",
    "max_rows",
    "ring",
    "drafts",
    "confidence_ppm",
    "layers",
    "world",
    "lanes",
    "weights_layout",
)


def read_config(model_dir: Path) -> dict:
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{model_dir} has no config.json") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a JSON object")
    return config


def model_dir_of(model: str) -> Path:
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if not REPO_ID.fullmatch(model):
        raise FileNotFoundError(f"{model} is neither a directory nor a Hugging Face repo id (owner/name)")
    raise FileNotFoundError(
        f"{model}: not in the local Hugging Face cache, and this engine downloads nothing here"
    )


def native_context(config: dict) -> int:
    text = config.get("text_config") or config
    limit = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    return int(limit) if isinstance(limit, int) and limit > 0 else 0


def check_config(config: dict) -> None:
    """What the family refuses from config.json (the double's subset: model type and quantization)."""
    kind = config.get("model_type") or (config.get("text_config") or {}).get("model_type")
    if kind != MODEL_TYPE:
        raise ValueError(f"no model family here serves model_type {kind!r} (this engine's: {MODEL_TYPE})")
    method = str((config.get("quantization_config") or {}).get("quant_method", "")).lower()
    if method != "exl3":
        raise ValueError(
            f"{TITLE}'s CUDA engine reads EXL3 routed experts and DeepSeek FP8 elsewhere ({MODELS[0]}); "
            f"this checkpoint's quantization is {method or 'none'}"
        )


def parallel(value: str) -> int:
    """--parallel: auto is one stream on CUDA; anything else a number."""
    text = str(value).strip().lower()
    if text == "auto":
        return 1
    try:
        return max(1, int(text))
    except ValueError:
        raise SystemExit(f"--parallel takes a number or auto, not {value!r}") from None


def check_options(args, v: Version) -> None:
    """serve_options.check and cmd_serve's own refusals, before anything loads."""
    if args.ssd_experts is not None:
        raise ValueError(
            f"--ssd-experts streams a family's routed experts from disk; {TITLE} has no such path"
        )
    if args.ple_on_ssd:
        raise ValueError(f"--ple-on-ssd: {TITLE} has no n-gram (PLE) tables to read from disk")
    if args.backend == "mlx":
        raise ValueError(f"{TITLE} runs on NVIDIA GPUs only (docs/recipes)")
    if args.vision_urls and not args.vision:
        raise ValueError("--vision-urls needs --vision")
    if args.vision_max_images is not None and (args.vision_max_images < 1 or not args.vision):
        raise ValueError("--vision-max-images is a positive number of images and needs --vision")
    if args.vision_image_tokens is not None and (
        not 1 <= args.vision_image_tokens <= 65536 or not args.vision
    ):
        raise ValueError("--vision-image-tokens is 1 to 65,536 tokens and needs --vision")
    if args.vision_offload and not args.vision:
        raise ValueError("--vision-offload needs --vision")
    if args.vision:
        raise ValueError(f"--vision: {TITLE} has no image tower in this engine (images are refused)")
    if args.decode_share is not None and args.decode_share < 0:
        raise ValueError(f"--decode-share is 0 (whole prompts first) or more, not {args.decode_share}")
    if args.kv_dtype != "bf16":
        raise ValueError(f"{TITLE} on CUDA keeps a bf16 KV cache, not --kv-dtype {args.kv_dtype}")
    if getattr(args, "prefill_fp8", None):
        raise ValueError(
            f"--prefill-fp8: {TITLE} has no FP8 prompt kernels (its prompts run bf16 activations)"
        )
    if args.mtp_confidence is not None and not 0.0 <= args.mtp_confidence <= 1.0:
        raise ValueError(f"--mtp-confidence is a probability from 0 to 1, not {args.mtp_confidence}")


def check_ranks(args, v: Version) -> None:
    """_serve_cuda's checks of --tp / --rank / --master."""
    if args.tp > 1 and not args.master:
        raise ValueError(f"--tp {args.tp} needs --master: rank 0's address on the link between the ranks")
    if args.tp == 1 and args.rank != 0:
        raise ValueError(f"--rank {args.rank} needs --tp {v.world} or more")
    if args.rank >= args.tp:
        raise ValueError(f"--rank {args.rank} needs --tp {args.rank + 1} or more")
    if args.tp == 4 and v.world != 4:
        raise ValueError(f"--tp 4: {TITLE} runs on one or two GPUs on CUDA")


@dataclass(frozen=True)
class Policy:
    drafts: int
    confidence: float | None
    dspark: bool  # the draft stages are loaded
    lanes: int


def engine_policy(args, v: Version, lanes: int) -> Policy:
    """cuda_engine's refusals: the family's rank count, --master, no separate drafter, drafts and lanes."""
    if args.tp != v.world:
        raise ValueError(
            f"{TITLE} runs on exactly {v.world} GPUs, one a machine: start the same `tensorfold serve` with "
            f"--tp {v.world} --rank R --master ADDRESS on every machine (the others before rank 0)"
        )
    if not args.master:
        raise ValueError(f"--tp {v.world} needs --master: rank 0's address on the link between the machines")
    drafter = "" if args.no_drafts or args.drafter in ("", "auto", "none") else args.drafter
    if drafter:
        raise ValueError(
            f"{TITLE} drafts with its own DSpark stages: a separate draft model (--drafter) does not apply"
        )
    drafts = DEFAULT_DRAFTS if args.mtp_drafts is None else int(args.mtp_drafts)
    if not 0 <= drafts <= BLOCK:
        raise ValueError(
            f"--mtp-drafts {drafts}: {TITLE} takes 0 (serial decoding) to {BLOCK} drafts a round"
        )
    if lanes > v.max_parallel:
        raise ValueError(f"--parallel {lanes}: {TITLE} decodes 1 to {v.max_parallel} requests together")
    return Policy(drafts, args.mtp_confidence, dspark=drafts > 0 and not args.no_drafts, lanes=lanes)


def settings(
    *, start_error: bool, policy: Policy, capacity: int, layers: int, world: int, layout: str
) -> list:
    confidence = -1 if policy.confidence is None else round(policy.confidence * 1e6)
    return [
        int(start_error),
        int(policy.dspark),
        capacity,
        min(PREFILL_ROWS, capacity),
        MAX_ROWS,
        RING,
        policy.drafts,
        confidence,
        layers,
        world,
        policy.lanes,
        layout,
    ]


def agree(table: dict[int, list]) -> None:
    """Refuse ranks started with different settings, naming each setting and every rank's value."""
    ranks = sorted(table)
    differ = []
    for i, name in enumerate(SETTINGS):
        values = [table[r][i] for r in ranks]
        if len(set(map(str, values))) > 1:
            differ.append(f"{name} " + ", ".join(f"rank {r} {table[r][i]}" for r in ranks))
    if differ:
        raise RuntimeError(
            "the ranks were started with different settings (" + "; ".join(differ) + "): give every rank the "
            "same flags, --context and TF_DSV41_* variables, and the same checkpoint files"
        )


def startup_note(v: Version) -> str | None:
    """The line the family's check prints on every rank (none known for the TP3 recipe's engine)."""
    if v.world != 2:
        return None
    return (
        f"[tensorfold] {TITLE} needs two NVIDIA GPUs with 128 GB each (two DGX Sparks): the whole "
        "snapshot on both, and --tp 2 on both (docs/recipes/deepseek-v4.1-flash.md)"
    )
