# The clock state sparkfleet records on a node, in one place: where it is, its format, one reader.
#
# nvidia-smi does not report a lock range, so what sparkfleet wrote is the truth for "what is configured":
#   <state_dir>/clocks/gpu.conf   GPU_CLOCK_CAP_MHZ=N  (persistent; sourced by sparkfleet-clocks at boot)
#   <state_dir>/clocks/cpu.conf   CPU_CLOCK_CAP_MHZ=N
#   <run_dir>/clocks/gpu.applied  N                    (the cap applied since this boot; /run is a tmpfs)
#   <run_dir>/clocks/gpu.verify   MIN=/CAP=/RESULT=/SM_MHZ= lines: what the SM clock did right after that
#                                 cap was applied (RESULT held, not-taken, unverified or stock): `nvidia-smi
#                                 -lgc` can answer success without pinning the clock
# 0 = stock clocks; no file = never configured (None). Standard library only (runs on the nodes).
from __future__ import annotations

import re

from ansible_collections.sparkfleet.cluster.plugins.module_utils.cluster_constants import STATE_DIR
from ansible_collections.sparkfleet.cluster.plugins.module_utils.fileio import read_text

GPU_KEY = "GPU_CLOCK_CAP_MHZ"
CPU_KEY = "CPU_CLOCK_CAP_MHZ"
RUN_DIR = "/run/sparkfleet"

HEADERS = {
    GPU_KEY: (
        "# Written by sparkfleet (role gpu_clocks); do not edit: set gpu_clocks_cap_mhz and run\n"
        "# `sparkfleet clocks set <MHz>`. The GPU clock cap this node is configured with, in MHz\n"
        "# (0 = stock clocks); sparkfleet-clocks.service re-applies it at boot.\n"
    ),
    CPU_KEY: (
        "# Written by sparkfleet (role gpu_clocks); do not edit: set gpu_clocks_cpu_cap_mhz.\n"
        "# The CPU clock cap this node is configured with, in MHz (0 = stock clocks);\n"
        "# sparkfleet-clocks.service re-applies it at boot.\n"
    ),
}


def paths(state_dir: str = STATE_DIR, run_dir: str = RUN_DIR) -> dict[str, str]:
    """The three files under sparkfleet's state and runtime directories."""
    return {
        "gpu_configured": f"{state_dir.rstrip('/')}/clocks/gpu.conf",
        "gpu_applied": f"{run_dir.rstrip('/')}/clocks/gpu.applied",
        "cpu_configured": f"{state_dir.rstrip('/')}/clocks/cpu.conf",
    }


def parse_cap(text: str | None, key: str = GPU_KEY) -> int | None:
    """The cap in a state file's text (`KEY=N`; as the boot script sources it, the last one counts) or in
    the applied marker's (the number alone). None when the text holds neither."""
    if text is None:
        return None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    found = None
    for line in lines:
        match = re.fullmatch(rf"{re.escape(key)}=([\"']?)(\d+)\1", line)
        if match:
            found = int(match.group(2))
    if found is None and len(lines) == 1 and lines[0].isdigit():
        return int(lines[0])
    return found


def read_cap(path: str | None, key: str = GPU_KEY) -> int | None:
    """The cap recorded in a state or marker file; None when the file is missing or holds none."""
    return parse_cap(read_text(path), key)


def read_caps(state_dir: str = STATE_DIR, run_dir: str = RUN_DIR, root: str = "/") -> dict[str, int | None]:
    """gpu_configured, gpu_applied, cpu_configured (root prefixes every path: tests)."""
    keys = {"gpu_configured": GPU_KEY, "gpu_applied": GPU_KEY, "cpu_configured": CPU_KEY}
    prefix = root.rstrip("/")
    return {name: read_cap(prefix + path, keys[name]) for name, path in paths(state_dir, run_dir).items()}


VERIFY_RESULTS = ("held", "not-taken", "unverified", "stock")


def verify_path(run_dir: str = RUN_DIR) -> str:
    return f"{run_dir.rstrip('/')}/clocks/gpu.verify"


def verdict(cap: int, samples: list[tuple[int, bool]]) -> str:
    """What SM clock samples (MHz, whether the GPU was busy) taken right after applying `cap` say: stock
    (no cap), not-taken (a sample above the cap: the lock did not pin the clock), held (none above it, and
    the GPU was busy for at least one: it would have run higher) or unverified (the GPU idled throughout:
    an idle GPU's clock is low whatever the cap, so it proves nothing)."""
    if cap <= 0:
        return "stock"
    if any(mhz > cap for mhz, _busy in samples):
        return "not-taken"
    return "held" if any(busy for _mhz, busy in samples) else "unverified"


def verify_text(min_mhz: int, cap: int, result: str, sm_mhz: int | None) -> str:
    return (
        "# Written by sparkfleet (role gpu_clocks): the SM clock sampled right after the cap was applied.\n"
        f"MIN={min_mhz}\nCAP={cap}\nRESULT={result}\nSM_MHZ={'' if sm_mhz is None else sm_mhz}\n"
    )


def parse_verify(text: str | None) -> dict | None:
    """{min, cap, result, sm_mhz} of a gpu.verify text; None when there is none or it is malformed."""
    if text is None:
        return None
    values = dict(
        line.strip().split("=", 1)
        for line in text.splitlines()
        if "=" in line and not line.strip().startswith("#")
    )
    try:
        out = {
            "min": int(values["MIN"]),
            "cap": int(values["CAP"]),
            "result": values["RESULT"],
            "sm_mhz": int(values["SM_MHZ"]) if values.get("SM_MHZ", "").isdigit() else None,
        }
    except (KeyError, ValueError):
        return None
    return out if out["result"] in VERIFY_RESULTS else None


def read_verify(path: str) -> dict | None:
    return parse_verify(read_text(path))


def state_text(cap: int, key: str = GPU_KEY) -> str:
    """The state file sparkfleet writes for a cap (the header says who wrote it and how to change it)."""
    return f"{HEADERS[key]}{key}={cap}\n"


def state_diff(path: str, before: int | None, after: int, key: str = GPU_KEY) -> dict:
    """Ansible's diff of a state file going from the cap `before` (None: no file) to `after`."""
    return {
        "before_header": path,
        "after_header": path,
        "before": "" if before is None else state_text(before, key),
        "after": state_text(after, key),
    }
