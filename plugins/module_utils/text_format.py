"""How sparkfleet writes numbers and tables for a person, in one place: a duration, whole minutes, a byte
count, a fixed-width text table. Used by the modules (the weights' progress lines), the filters and action
plugins (the engine's status table, the reboot's wait) and the CLI (its progress lines and tables, through
python/sparkfleet/collection.py, which loads this file by its path).

No imports at all: this file is also loaded outside Ansible, on its own.
"""


def duration(seconds: float) -> str:
    """'4.2s' under a minute, '5m03s' under an hour, '1h02m' beyond."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    total = int(seconds)
    if total < 3600:
        return f"{total // 60}m{total % 60:02d}s"
    return f"{total // 3600}h{total % 3600 // 60:02d}m"


def minutes(seconds: object) -> str:
    """Whole minutes, '12 min' (waits counted in minutes, like an engine's first start); '?' for no number."""
    try:
        return f"{int(float(seconds) // 60)} min"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return "?"


def size(n: float) -> str:
    """A byte count in decimal units (1 GB = 10^9 bytes), as disks and hubs count them: '630.1 MB'."""
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def cell(value: object) -> str:
    """A table cell: '-' for nothing, yes/no for a boolean, else the value as text."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def text_table(headers: list[str], rows: list[list]) -> list[str]:
    """Fixed-width columns, two spaces apart, a rule under the headers; trailing blanks trimmed."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    out = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    out.append("  ".join("-" * w for w in widths))
    out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return out
