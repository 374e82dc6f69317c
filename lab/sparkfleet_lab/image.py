"""Build the lab's images offline: debootstrap + `docker import`, cached by a content tag.

No image registry is reachable from this machine, so every image the lab runs is made here:
- `sparkfleet-lab/base:<tag>`: Debian trixie from debootstrap with the node packages;
- `sparkfleet-lab/node:<tag>`: the base plus the lab's stand-ins (simulators, shims, units);
- `sparkfleet-lab/engine-base:<tag>`: trixie minbase + python3, pip, setuptools and git, the engine double's
  base image (the lab pushes it to its hub registry so that engine_image pulls it by digest). Like the
  real base (NGC PyTorch) it lets pip install into its Python: Debian's EXTERNALLY-MANAGED marker is
  removed. It is slim (no docs, man pages or translations, as Debian's -slim images): see ENGINE_BASE_STEPS.
A tag is a hash of everything that goes into the image, so an unchanged input reuses the image
and a changed one (a package, an overlay file, a simulator) builds a new one.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfleet_lab import docker as d

HERE = Path(__file__).resolve().parent
IMAGE_DIR = HERE / "image"
SIM_DIR = HERE / "sim"
SUITE = "trixie"
MIRROR = os.environ.get("SPARKFLEET_LAB_MIRROR", "http://deb.debian.org/debian")
BUILDER_VERSION = "1"  # bump when the build procedure itself changes
WORK_ROOT = Path(os.environ.get("SPARKFLEET_LAB_WORKDIR", "/var/tmp/sparkfleet-lab"))


def _packages(name: str) -> list[str]:
    lines = (IMAGE_DIR / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _hash_tree(h: hashlib._Hash, root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(root).as_posix()
        h.update(rel.encode() + b"\0" + oct(path.stat().st_mode & 0o777).encode() + b"\0")
        h.update(path.read_bytes() + b"\0")


# the engine base's Python takes pip installs, as NGC PyTorch's does (the recipes pip-install the engine);
# and it carries no documentation, man pages or translations (as Debian's -slim images): 323 -> 235 MB for
# every pull, save and load of the engine image in the lab
ENGINE_BASE_STEPS = "pip-into-system-python,slim"
# dpkg's path filters of Debian's slim images: later package installs leave these out too
SLIM_DPKG_CFG = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""


def base_tag(packages_file: str = "packages.txt", variant: str = "minbase", steps: str = "") -> str:
    h = hashlib.sha256()
    h.update(f"{BUILDER_VERSION}|{SUITE}|{MIRROR}|{variant}|".encode())
    if steps:  # only the images that have extra steps: the others keep their tags
        h.update(f"steps={steps}|".encode())
    h.update(" ".join(_packages(packages_file)).encode())
    return h.hexdigest()[:12]


def node_tag() -> str:
    h = hashlib.sha256()
    h.update(base_tag().encode())
    h.update((IMAGE_DIR / "Dockerfile").read_bytes())
    _hash_tree(h, IMAGE_DIR / "overlay")
    _hash_tree(h, SIM_DIR)
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Images:
    node: str
    engine_base: str


def _log(msg: str) -> None:
    print(f"lab: {msg}", file=sys.stderr, flush=True)


def _run_logged(cmd: list[str], log: Path, what: str) -> None:
    """Run a long command, its output to a log file, with a heartbeat line every 30 s."""
    start = time.monotonic()
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        while True:
            try:
                rc = proc.wait(timeout=30)
                break
            except subprocess.TimeoutExpired:
                last = log.read_bytes()[-200:].decode(errors="replace").strip().splitlines()
                _log(f"{what}: {int(time.monotonic() - start)} s ... {last[-1] if last else ''}")
    if rc != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{what} failed (exit {rc}); log {log}:\n{tail}")


def _slim(rootfs: Path) -> None:
    """What SLIM_DPKG_CFG filters, removed from the packages already installed (its path-includes stay)."""
    (rootfs / "etc/dpkg/dpkg.cfg.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/01-sparkfleet-slim").write_text(SLIM_DPKG_CFG)
    rules = [line.split(None, 1) for line in SLIM_DPKG_CFG.splitlines()]
    excludes = [pattern for verb, pattern in rules if verb == "path-exclude"]
    includes = [pattern for verb, pattern in rules if verb == "path-include"]
    for pattern in excludes:
        top = rootfs / pattern.lstrip("/").removesuffix("/*")
        for path in sorted(top.rglob("*"), reverse=True):  # children before their directories
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif not any(fnmatch.fnmatch("/" + path.relative_to(rootfs).as_posix(), i) for i in includes):
                path.unlink()


def _debootstrap_import(
    ref: str, packages_file: str, variant: str, pip_into_system: bool = False, slim: bool = False
) -> None:
    if os.geteuid() != 0:
        raise RuntimeError("building the lab image needs root (debootstrap); run as root or via sudo")
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is missing: run scripts/ensure-host.sh (apt-get install debootstrap)")
    WORK_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK_ROOT, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        log = WORK_ROOT / f"debootstrap-{ref.replace('/', '_').replace(':', '_')}.log"
        include = ",".join(_packages(packages_file))
        _log(f"debootstrap {SUITE} ({variant}, {len(include.split(','))} packages) for {ref}; log {log}")
        _run_logged(
            ["debootstrap", f"--variant={variant}", f"--include={include}", SUITE, str(rootfs), MIRROR],
            log,
            "debootstrap",
        )
        # Per-node identity is made at first boot, not baked into the image.
        for key in rootfs.glob("etc/ssh/ssh_host_*"):
            key.unlink()
        (rootfs / "etc/machine-id").write_text("")
        dbus_id = rootfs / "var/lib/dbus/machine-id"
        if dbus_id.exists() or dbus_id.is_symlink():
            dbus_id.unlink()
        subprocess.run(["chroot", str(rootfs), "apt-get", "clean"], check=True, capture_output=True)
        if pip_into_system:
            for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
                marker.unlink()
        if slim:
            _slim(rootfs)
        shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
        (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
        _log(f"docker import {ref}")
        tar = subprocess.Popen(
            ["tar", "-C", str(rootfs), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        imp = subprocess.run(
            ["docker", "import", "-", ref], stdin=tar.stdout, capture_output=True, check=False
        )
        tar.wait()
        if tar.returncode != 0 or imp.returncode != 0:
            raise RuntimeError(f"docker import {ref} failed: {imp.stderr.decode(errors='replace')}")


def ensure_base() -> str:
    ref = f"sparkfleet-lab/base:{base_tag()}"
    if not d.image_exists(ref):
        _debootstrap_import(ref, "packages.txt", "minbase")
    return ref


def ensure_engine_base() -> str:
    ref = f"sparkfleet-lab/engine-base:{base_tag('engine-base-packages.txt', steps=ENGINE_BASE_STEPS)}"
    if not d.image_exists(ref):
        _debootstrap_import(ref, "engine-base-packages.txt", "minbase", pip_into_system=True, slim=True)
    return ref


def ensure_node() -> str:
    ref = f"sparkfleet-lab/node:{node_tag()}"
    if d.image_exists(ref):
        return ref
    base = ensure_base()
    with tempfile.TemporaryDirectory(prefix="sparkfleet-lab-build-") as tmp:
        ctx = Path(tmp)
        shutil.copy2(IMAGE_DIR / "Dockerfile", ctx / "Dockerfile")
        shutil.copytree(IMAGE_DIR / "overlay", ctx / "overlay")
        shutil.copytree(SIM_DIR, ctx / "sim", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        _log(f"docker build {ref}")
        log = WORK_ROOT / "node-build.log"
        WORK_ROOT.mkdir(parents=True, exist_ok=True)
        _run_logged(
            ["docker", "build", "--build-arg", f"BASE={base}", "-t", ref, str(ctx)], log, "docker build"
        )
    return ref


def ensure_images() -> Images:
    return Images(node=ensure_node(), engine_base=ensure_engine_base())
