# The engine's API key file (TensorFold's --api-key-file), read the way the engine reads it: one key a
# line, `label: key` or the key alone, `#` comments and blank lines ignored; keys have no white space.
# engine_api_key writes and checks it, engine_api sends its first key. Standard library only.
from __future__ import annotations

import re

LABEL = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class KeyFileError(ValueError):
    pass


def parse_key_file(text: str) -> list[tuple[str, str]]:
    """(label, key) per key line; a line without a label gets `file-N` (N counts the keys), as in the
    engine. KeyFileError for a bad label or a key with white space."""
    keys: list[tuple[str, str]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        label, colon, key = line.partition(":")
        if colon:
            label, key = label.strip(), key.strip()
            if not LABEL.fullmatch(label):
                raise KeyFileError(
                    f"line {n}: a label needs 1-64 letters, digits, dots, underscores or hyphens"
                )
        else:
            label, key = f"file-{len(keys) + 1}", line
        if not key or any(c.isspace() or ord(c) < 32 for c in key):
            raise KeyFileError(f"line {n}: a key must be non-empty text without white space")
        keys.append((label, key))
    return keys
