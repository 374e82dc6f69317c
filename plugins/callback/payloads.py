"""Callback plugin `sparkfleet.cluster.payloads`: the module payloads one run built, kept for the next run.

Why: before a module runs on a node, the worker of that task builds its payload (AnsiballZ: the module and
every module_utils file it imports, found by parsing them, zipped). ansible-core caches each payload in the
run's own temporary directory, which goes when the run ends, so every run builds every module it uses again:
on a no-op TP3 `site.yml` that was about a tenth of the controller's CPU (`py-spy` over one run: 291 of 3028
samples in `recursive_finder`, mostly parsing module_utils), and a short run (`sparkfleet status`) pays it for
each of its few modules.

What it does: at the start of a playbook it copies the payloads a previous run left in its cache directory
into the run's temporary payload cache (where ansible-core looks first); at the end it copies back the ones
this run built. The directory is named by a key over everything a payload is made of, so a payload is only
ever reused for the same code:
  - the versions of ansible-core, of the `ansible` package (the collections it ships) and of Python;
  - the content (SHA-256) of every module and module_utils file of every collection under the configured
    collections paths (this collection's own plugins/modules and plugins/module_utils among them), and of
    every file in the module_utils directories outside ansible-core (configured, or beside a playbook or a
    role), which a module's `ansible.module_utils` imports can reach.
Payloads of modules outside a collection and ansible-core (a `library/` beside a playbook or in a role:
ansible-core names them `ansible.legacy.<name>`, by name alone) are never kept: the key does not cover them.
Any change to one of those makes a new key and so an empty directory: the run builds as before. The four
newest keys' directories are kept (about 8 MB each for this collection's modules), older ones are removed:
only directories this plugin made (a 16-hex name and its mark file), never anything else in the directory.

Safety: the directory (default `~/.cache/sparkfleet/payloads`) is made private (0700) and is used only when
it is owned by the user running Ansible and is not writable by others, since a payload is code that runs on
the nodes. Nothing runs on a node, nothing is printed (`-vvv`: how many payloads were loaded and saved, and
why the cache was not used); any failure only leaves the run building its payloads, as without this plugin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from ansible import constants as C
from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import module_utils_loader
from ansible.release import __version__ as ANSIBLE_CORE_VERSION
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: payloads
short_description: Keeps the module payloads a run built for the next run with the same code
description:
  - At the start of a playbook, copies the module payloads (AnsiballZ) kept by an earlier run into this run's
    temporary payload cache, where ansible-core looks before it builds one; at the end, keeps the payloads
    this run built.
  - The kept payloads are in a directory named by a key over the versions of ansible-core, the C(ansible)
    package and Python and the SHA-256 of every module and module_utils file of the collections under the
    configured collections paths and of every file in the module_utils directories outside ansible-core, so a
    payload is reused only for the same code. Payloads of modules outside a collection and ansible-core
    (C(ansible.legacy.<name>)) are never kept. The four newest keys' directories are kept; only key
    directories this plugin made (with its mark file) are ever removed.
  - Prints nothing and changes no result. The cache is used only when its directory is owned by the user
    running Ansible and not writable by group or others; on any error the run builds its payloads as
    without this plugin.
type: aggregate
requirements:
  - enabled in C(callbacks_enabled) (sparkfleet's ansible.cfg enables it)
options:
  cache_dir:
    description: Where the payloads are kept (one subdirectory per key).
    type: path
    default: ~/.cache/sparkfleet/payloads
    env:
      - name: SPARKFLEET_PAYLOAD_CACHE
    ini:
      - section: callback_payloads
        key: cache_dir
author: sparkfleet developers
version_added: 2.0.0
"""

display = Display()
KEEP = 4  # key directories kept (the newest by modification time)
SUFFIXES = (".py", ".ps1", ".psm1", ".cs")  # what a module or module_utils file of a collection can be


def _ansible_version() -> str:
    try:
        return metadata.version("ansible")
    except metadata.PackageNotFoundError:
        return "none"


def _collection_files(root: Path) -> list[Path]:
    """Every module and module_utils file of every collection under one collections path."""
    found: list[Path] = []
    for plugins in sorted(root.glob("ansible_collections/*/*/plugins")):
        for kind in ("modules", "module_utils"):
            top = plugins / kind
            if top.is_dir():
                found += sorted(p for p in top.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    return found


def _module_utils_dirs() -> list[str]:
    """The module_utils search path outside ansible-core's own package (which its version covers)."""
    core = Path(C.__file__).resolve().parent
    dirs = [Path(p) for p in module_utils_loader.print_paths().split(os.pathsep) if p]
    return [str(d) for d in dirs if d.is_dir() and not d.resolve().is_relative_to(core)]


def cache_key(collection_roots: list[str] | None = None, module_utils_dirs: list[str] | None = None) -> str:
    """The key of the code a payload is built from (see the module docstring)."""
    h = hashlib.sha256()
    h.update(f"{ANSIBLE_CORE_VERSION}|{_ansible_version()}|{sys.version}|".encode())
    roots = C.COLLECTIONS_PATHS if collection_roots is None else collection_roots
    found: list[tuple[str, Path, Path]] = []
    for root in roots:
        base = Path(os.path.expanduser(root))
        found += [("collections", base, path) for path in _collection_files(base)]
    for extra in _module_utils_dirs() if module_utils_dirs is None else module_utils_dirs:
        base = Path(extra)
        found += [("module_utils", base, p) for p in sorted(base.rglob("*")) if p.is_file()]
    for kind, base, path in found:
        h.update(f"{kind} {base.resolve()} {path.relative_to(base)}\n".encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()[:16]


def _private(path: Path) -> bool:
    """Ours alone: owned by this user, not writable by group or others, not a symbolic link."""
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _payload_names(directory: Path) -> list[str]:
    """The payload files in a payload cache that the key covers: not ansible-core's lock files or half-written
    ones, not those of modules outside a collection or ansible-core (`ansible.legacy.<name>`), not this
    plugin's mark or its files being written (dot files)."""
    if not directory.is_dir():
        return []
    names = (p.name for p in directory.iterdir() if p.is_file())
    return sorted(
        n for n in names if not n.endswith((".lock", "-part")) and not n.startswith(("ansible.legacy.", "."))
    )


def load(store: Path, run_cache: Path) -> int:
    """Copy the kept payloads into this run's payload cache; how many."""
    run_cache.mkdir(parents=True, exist_ok=True)
    names = _payload_names(store)
    for name in names:
        shutil.copyfile(store / name, run_cache / name)
    return len(names)


MARK = ".sparkfleet-payloads"  # in every key directory this plugin made: only those are ever pruned


def _ours(path: Path) -> bool:
    """A key directory this plugin made: a 16-hex name, a real directory, with its mark."""
    name = path.name
    return (
        len(name) == 16 and all(c in "0123456789abcdef" for c in name)
        and path.is_dir() and not path.is_symlink() and (path / MARK).is_file()
    )  # fmt: skip


def save(store: Path, run_cache: Path) -> int:
    """Keep the payloads this run built that the store does not have (each written whole, then renamed); how
    many. Then remove all but the newest KEEP key directories, only ever those this plugin made (_ours): the
    cache directory may be one an admin points at with files of their own."""
    store.mkdir(mode=0o700, parents=True, exist_ok=True)
    (store / MARK).touch()
    have = set(_payload_names(store))
    saved = 0
    for name in _payload_names(run_cache):
        if name in have:
            continue
        fd, tmp = tempfile.mkstemp(dir=store, prefix=f".{name}.")
        os.close(fd)
        shutil.copyfile(run_cache / name, tmp)
        os.replace(tmp, store / name)
        saved += 1
    if saved:
        os.utime(store)
    keys = [p for p in store.parent.iterdir() if _ours(p)]
    keys.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in keys[KEEP:]:
        if old != store:
            shutil.rmtree(old, ignore_errors=True)
    return saved


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "sparkfleet.cluster.payloads"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._store: Path | None = None
        # ansible-core's payload cache of this run (module_common._find_module_utils), gone when the run ends
        self._run_cache = Path(C.DEFAULT_LOCAL_TMP) / "ansiballz_cache"

    def _note(self, what: str) -> None:
        display.vvv(f"{self.CALLBACK_NAME}: {what}")

    def v2_playbook_on_start(self, playbook: Any) -> None:
        try:
            root = Path(os.path.expanduser(self.get_option("cache_dir")))
            root.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(root):
                self._note(f"not used: {root} is not a directory of this user's alone (mode 0700)")
                return
            self._store = root / cache_key()
            self._note(f"{load(self._store, self._run_cache)} payloads loaded from {self._store}")
        except Exception as exc:  # only a lost speed-up: the workers build their payloads
            self._store = None
            self._note(f"not used: {exc}")

    def v2_playbook_on_stats(self, stats: Any) -> None:
        if self._store is None:
            return
        try:
            self._note(f"{save(self._store, self._run_cache)} new payloads kept in {self._store}")
        except Exception as exc:  # as above
            self._note(f"payloads not kept: {exc}")
