"""Everything a reader is sent to is in the clone: no pointer to the team's notes outside the repository
(SPEC.md, STYLE.md, DESIGN.md, the research notes and recipe texts beside it). What the code cites from
them is in docs/recipes.md, docs/style.md and docs/design.md."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".cache", ".lab", ".collections", ".ruff_cache", ".pytest_cache", "artifacts",
             "__pycache__", "node_modules"}  # fmt: skip
SUFFIXES = {".py", ".yml", ".yaml", ".md", ".j2", ".toml", ".cfg", ".sh", ".txt", ".mmd", ".json", ".service"}
OUTSIDE = re.compile(
    r"\b(?:SPEC|STYLE|DESIGN)\.md\b|\bSPEC\b(?!_)|\bSTYLE item|\.\./shared/(?:research|seeds|fixtures)"
    r"|/work/shared|\bseeds/0\d\d|real-engine-facts|tp3-public-analogs|field-lessons"
)


def text_files():
    for top, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            path = Path(top) / name
            if path.suffix in SUFFIXES or name in {"Makefile", "Dockerfile"}:
                yield path


def test_no_pointer_leaves_the_clone():
    me = Path(__file__).resolve()
    found = []
    for path in text_files():
        if path.resolve() == me:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, "pointers to files a clone lacks (cite docs/ instead):\n" + "\n".join(found)


def test_the_cited_docs_are_in_the_clone():
    for name in ("recipes.md", "style.md", "design.md"):
        assert (ROOT / "docs" / name).is_file(), name
