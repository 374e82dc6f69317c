"""The lab's stand-in model repos, generated on the controller for the hub to serve.

`generate(data_dir, topology, size_mb)` writes, under `data_dir/hf/`:
- the model repo of the topology (TP2: like LibertAIDAI's EXL3 2.9 bpw repo; TP3: like the 3.84 bpw
  TP3 release with `tp3/rank<N>.keys` and a `SHA256SUMS` release manifest that also lists the
  rank files' SHA-256), with real safetensors shards (real headers, random tensor bytes), the
  index, config, quantization config, tokenizer files and the chat template;
- an Engram-like second repo (like deepseek-ai/DeepSeek-V4.1-Flash-1017): 48 shards of which
  files 47 and 48 carry the "Engram tables" and 1-46 are tiny, its index and config.
Each repo has two commits, as on the real hub: the weights commit (the one pinned) and a later
`main` that holds only the card. Everything is deterministic: the same inputs give the same bytes,
the same commit ids and so the same pins.

On-disk layout the hub's hfserver reads (one directory per repo):
  hf/<org>/<name>/repo.json              {"id", "private", "refs": {"main": <commit>}, "commits": [...]}
  hf/<org>/<name>/commits/<commit>.json  [{"path", "size", "sha256", "git_oid", "lfs", "pointer_oid",
                                            "pointer_size"}] sorted by path
  hf/<org>/<name>/blobs/<sha256>         file contents, by SHA-256

The rank files' SHA-256 in SHA256SUMS are computed here by an implementation of the rank-file
format (roles/model_weights/README.md, "Rank files") that is independent of the role's builder,
so the lab checks the builder against the spec, not against itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ORG = "sparkfleet-lab"
REPOS = {
    "tp2": f"{ORG}/DeepSeek-V4.1-Flash-1017-EXL3-2.9bpw-tiny",
    "tp3": f"{ORG}/DeepSeek-V4.1-Flash-1017-EXL3-3.84bpw-TP3-tiny",
}
ENGRAM_REPO = f"{ORG}/DeepSeek-V4.1-Flash-1017-tiny"
LAYERS = 12
SHARDS = 6
HIDDEN = 256
VOCAB = 512
TP3_RANKS = 3
ENGRAM_SHARDS = 48
ENGRAM_FILES = (47, 48)
LFS_SUFFIXES = (".safetensors", ".bin")
LFS_MIN_SIZE = 10 << 20
DTYPE_SIZE = {"BF16": 2, "F16": 2, "I16": 2, "F32": 4, "U8": 1}

# The chat template line the TP2 fix (roles/model_weights/files/chat_template-thinking-off.patch)
# changes, with the context lines the patch carries.
CHAT_TEMPLATE = """\
{#- DeepSeek V4.1 Flash chat template (sparkfleet lab stand-in) -#}
{%- if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- set thinking = enable_thinking if enable_thinking is defined else true -%}
{%- set ns = namespace(system_prompt='') -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- set ns.system_prompt = ns.system_prompt + message['content'] -%}
  {%- endif -%}
{%- endfor -%}
{{- bos_token }}{{ ns.system_prompt -}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {{- '<|User|>' + message['content'] -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|Assistant|>' + message['content'] + '<|end_of_sentence|>' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|Assistant|>' -}}
  {%- if thinking -%}{{- '<think>' -}}{%- else -%}{{- '</think>' -}}{%- endif -%}
{%- endif -%}
"""


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[int]

    @property
    def nbytes(self) -> int:
        n = DTYPE_SIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


@dataclass
class RepoBuilder:
    root: Path
    repo_id: str
    files: dict[str, dict] = field(default_factory=dict)  # path -> entry
    # where each tensor's bytes are: name -> (blob path, absolute offset, Tensor)
    tensors: dict[str, tuple[Path, int, Tensor]] = field(default_factory=dict)

    @property
    def repo_dir(self) -> Path:
        return self.root / "hf" / self.repo_id

    def add_bytes(self, path: str, data: bytes) -> dict:
        sha = hashlib.sha256(data).hexdigest()
        self._store(sha, data)
        return self._entry(path, len(data), sha, _git_oid(data))

    def add_safetensors(self, path: str, tensors: list[Tensor], seed: str) -> dict:
        """Write a real .safetensors file: header (sorted names) then each tensor's bytes."""
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for t in sorted(tensors, key=lambda t: t.name):
            header[t.name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.nbytes]}
            offset += t.nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * ((8 - (8 + len(blob)) % 8) % 8)
        head = struct.pack("<Q", len(blob)) + blob
        rng = random.Random(f"{self.repo_id}/{path}/{seed}")  # noqa: S311 - reproducible filler bytes, not secrets
        blobs = self.repo_dir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256()
        git = hashlib.sha1(b"blob %d\0" % (len(head) + offset), usedforsecurity=False)
        fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".gen-")
        positions = {}
        with os.fdopen(fd, "wb") as fh:
            for part in (head,):
                fh.write(part)
                sha.update(part)
                git.update(part)
            pos = len(head)
            for t in sorted(tensors, key=lambda t: t.name):
                data = rng.randbytes(t.nbytes)
                fh.write(data)
                sha.update(data)
                git.update(data)
                positions[t.name] = (pos, t)
                pos += t.nbytes
        digest = sha.hexdigest()
        final = blobs / digest
        if final.exists():
            os.unlink(tmp)
        else:
            os.replace(tmp, final)
        for name, (pos, t) in positions.items():
            self.tensors[name] = (final, pos, t)
        return self._entry(path, len(head) + offset, digest, git.hexdigest())

    def _store(self, sha: str, data: bytes) -> None:
        blobs = self.repo_dir / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        final = blobs / sha
        if not final.exists():
            fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".gen-")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, final)

    def _entry(self, path: str, size: int, sha: str, git_oid: str) -> dict:
        lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
        entry = {"path": path, "size": size, "sha256": sha, "git_oid": git_oid, "lfs": lfs}
        if lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
            entry["pointer_oid"] = _git_oid(pointer)
            entry["pointer_size"] = len(pointer)
        self.files[path] = entry
        return entry

    def commit(self, paths: list[str], parent: str | None, message: str) -> str:
        listing = sorted((self.files[p] for p in paths), key=lambda e: e["path"])
        ident = json.dumps(
            {
                "repo": self.repo_id,
                "parent": parent,
                "message": message,
                "files": [[e["path"], e["sha256"]] for e in listing],
            },
            sort_keys=True,
        ).encode()
        commit = hashlib.sha1(ident, usedforsecurity=False).hexdigest()
        cdir = self.repo_dir / "commits"
        cdir.mkdir(parents=True, exist_ok=True)
        _write_if_changed(cdir / f"{commit}.json", json.dumps(listing, indent=1, sort_keys=True) + "\n")
        return commit

    def write_repo(self, commits: list[dict], main: str) -> None:
        data = {"id": self.repo_id, "private": False, "refs": {"main": main}, "commits": commits}
        _write_if_changed(self.repo_dir / "repo.json", json.dumps(data, indent=1, sort_keys=True) + "\n")


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _write_if_changed(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(text)
    tmp.replace(path)


def _json(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=False) + "\n").encode()


# ---- the model repo -------------------------------------------------------------------------------
def _layer_tensors(layer: int, big_bytes: int) -> list[Tensor]:
    p = f"model.layers.{layer}"
    rows = max(1, big_bytes // (2 * 64))
    return [
        Tensor(f"{p}.input_layernorm.weight", "BF16", [HIDDEN]),
        Tensor(f"{p}.self_attn.wo_b.weight", "BF16", [HIDDEN, 64]),
        Tensor(f"{p}.mlp.experts.gate_up.trellis", "I16", [rows, 64]),
        Tensor(f"{p}.mlp.experts.gate_up.suh", "F16", [3]),  # 6 bytes: the next tensor is unaligned
        Tensor(f"{p}.mlp.shared_experts.w2.trellis", "I16", [max(1, rows // 8), 64]),
    ]


def _model_tensors(size_mb: int) -> list[list[Tensor]]:
    """Tensors per shard: SHARDS shards of LAYERS/SHARDS layers each, about 80% of size_mb."""
    budget = max(1, size_mb) * (1 << 20) * 8 // 10
    per_layer = budget // LAYERS
    big = per_layer * 8 // 9
    shards: list[list[Tensor]] = [[] for _ in range(SHARDS)]
    for layer in range(LAYERS):
        shards[layer * SHARDS // LAYERS].extend(_layer_tensors(layer, big))
    shards[0].append(Tensor("model.embed_tokens.weight", "BF16", [VOCAB, HIDDEN]))
    shards[-1].append(Tensor("model.norm.weight", "BF16", [HIDDEN]))
    shards[-1].append(Tensor("lm_head.weight", "BF16", [VOCAB, HIDDEN]))
    return shards


def _rank_keys(shards: list[list[Tensor]]) -> list[list[str]]:
    """Ordered tensor lists per TP3 rank: norms on every rank, the big tensors spread round robin.

    Layer order is numeric (10 and 11 after 9), so the order is not the index's sorted order.
    """
    names = {t.name for shard in shards for t in shard}
    ranks: list[list[str]] = [[] for _ in range(TP3_RANKS)]
    ranks[0].append("model.embed_tokens.weight")
    for layer in range(LAYERS):
        p = f"model.layers.{layer}"
        for r in range(TP3_RANKS):
            ranks[r].append(f"{p}.input_layernorm.weight")
        ranks[(layer + 1) % TP3_RANKS].append(f"{p}.self_attn.wo_b.weight")
        ranks[layer % TP3_RANKS] += [f"{p}.mlp.experts.gate_up.trellis", f"{p}.mlp.experts.gate_up.suh"]
        ranks[(layer + 2) % TP3_RANKS].append(f"{p}.mlp.shared_experts.w2.trellis")
    for r in range(TP3_RANKS):
        ranks[r].append("model.norm.weight")
    ranks[TP3_RANKS - 1].append("lm_head.weight")
    assert all(k in names for rank in ranks for k in rank)
    return ranks


def rank_file_sha256(builder: RepoBuilder, rank: int, keys_text: str, keys: list[str]) -> tuple[str, int]:
    """SHA-256 and size of the rank file the spec defines for these keys (streamed, not written)."""
    header: dict = {
        "__metadata__": {
            "format": "pt",
            "rank": str(rank),
            "keys_sha256": hashlib.sha256(keys_text.encode()).hexdigest(),
        }
    }
    offset = 0
    for key in keys:
        _, _, t = builder.tensors[key]
        header[key] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    blob += b" " * ((8 - (8 + len(blob)) % 8) % 8)
    h = hashlib.sha256(struct.pack("<Q", len(blob)) + blob)
    for key in keys:
        path, pos, t = builder.tensors[key]
        with path.open("rb") as fh:
            fh.seek(pos)
            h.update(fh.read(t.nbytes))
    return h.hexdigest(), 8 + len(blob) + offset


def _card(title: str, body: str) -> bytes:
    return f"---\nlicense: mit\n---\n# {title}\n\n{body}\n".encode()


def _build_model(root: Path, topology: str, size_mb: int) -> dict:
    repo_id = REPOS[topology]
    b = RepoBuilder(root, repo_id)
    shards = _model_tensors(size_mb)
    weight_map = {}
    paths = []
    for i, tensors in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{SHARDS:05d}.safetensors"
        b.add_safetensors(name, tensors, seed="v1")
        paths.append(name)
        for t in tensors:
            weight_map[t.name] = name
    total = sum(b.files[p]["size"] for p in paths)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    bpw = "2.9" if topology == "tp2" else "3.84"
    config = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "vocab_size": VOCAB,
        "max_position_embeddings": 1048576,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "exl3", "bits": float(bpw)},
    }
    small = {
        "model.safetensors.index.json": _json(index),
        "config.json": _json(config),
        "quantization_config.json": _json({"quant_method": "exl3", "bits": float(bpw), "head_bits": 6}),
        "tokenizer.json": _json(
            {
                "version": "1.0",
                "model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(64)}, "merges": []},
            }
        ),
        "tokenizer_config.json": _json(
            {
                "bos_token": "<|begin_of_sentence|>",
                "eos_token": "<|end_of_sentence|>",
                "model_max_length": 1048576,
            }
        ),
        "chat_template.jinja": CHAT_TEMPLATE.encode(),
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }
    for path, data in small.items():
        b.add_bytes(path, data)
        paths.append(path)
    if topology == "tp3":
        ranks = _rank_keys(shards)
        sums = {}
        for r, keys in enumerate(ranks):
            text = "".join(k + "\n" for k in keys)
            path = f"tp3/rank{r}.keys"
            b.add_bytes(path, text.encode())
            paths.append(path)
            sums[f"tp3/rank{r}.safetensors"] = rank_file_sha256(b, r, text, keys)[0]
        for p in paths:
            sums[p] = b.files[p]["sha256"]
        lines = "".join(f"{sums[p]}  {p}\n" for p in sorted(sums))
        b.add_bytes("SHA256SUMS", lines.encode())
        paths.append("SHA256SUMS")
    card = _card(
        f"{repo_id} (sparkfleet lab stand-in)", f"EXL3 {bpw} bpw, {SHARDS} shards of random tensors."
    )
    b.add_bytes("README.md", card)
    weights = b.commit([*paths, "README.md"], None, "Upload weights")
    b.add_bytes("README.md", card + b"\nThe weights are at an earlier commit.\n")
    main = b.commit(["README.md", ".gitattributes"], weights, "Card only")
    b.write_repo([weights, main], main)
    return {"repo": repo_id, "revision": weights[:8], "commit": weights}


def _build_engram(root: Path, size_mb: int) -> dict:
    b = RepoBuilder(root, ENGRAM_REPO)
    table_bytes = max(1, size_mb) * (1 << 20) // 10  # each of the two Engram files: ~10% of size_mb
    weight_map = {}
    paths = []
    for i in range(1, ENGRAM_SHARDS + 1):
        name = f"model-{i:05d}-of-{ENGRAM_SHARDS:05d}.safetensors"
        if i in ENGRAM_FILES:
            rows = max(1, table_bytes // (2 * 128))
            tensors = [
                Tensor(f"model.engram.{i}.table", "BF16", [rows, 128]),
                Tensor(f"model.engram.{i}.scale", "F32", [128]),
            ]
        else:
            tensors = [Tensor(f"model.layers.{i - 1}.fp8.weight", "U8", [64, 64])]
        b.add_safetensors(name, tensors, seed="v1")
        paths.append(name)
        for t in tensors:
            weight_map[t.name] = name
    total = sum(b.files[p]["size"] for p in paths)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    config = {
        "architectures": ["DeepseekV41ForCausalLM"],
        "model_type": "deepseek_v41",
        "engram_files": list(ENGRAM_FILES),
    }
    for path, data in {
        "model.safetensors.index.json": _json(index),
        "config.json": _json(config),
        "tokenizer.json": _json({"version": "1.0"}),
        ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
    }.items():
        b.add_bytes(path, data)
        paths.append(path)
    card = _card(
        f"{ENGRAM_REPO} (sparkfleet lab stand-in)",
        "The original release; files 47 and 48 hold the Engram tables.",
    )
    b.add_bytes("README.md", card)
    weights = b.commit([*paths, "README.md"], None, "Upload the 1017 release")
    b.add_bytes("README.md", card + b"\nThe weights are at an earlier commit.\n")
    main = b.commit(["README.md", ".gitattributes"], weights, "Card only")
    b.write_repo([weights, main], main)
    return {"repo": ENGRAM_REPO, "revision": weights[:8], "commit": weights}


def generate(data_dir: Path, topology: str, size_mb: int = 48) -> dict:
    """Write the stand-in repos for `topology` under data_dir/hf; return their pins (short revisions)."""
    if topology not in REPOS:
        raise ValueError(f"topology {topology!r}: expected one of {', '.join(REPOS)}")
    data_dir = Path(data_dir)
    model = _build_model(data_dir, topology, size_mb)
    engram = _build_engram(data_dir, size_mb)
    return {
        "model": {"repo": model["repo"], "revision": model["revision"]},
        "engram": {"repo": engram["repo"], "revision": engram["revision"]},
    }
