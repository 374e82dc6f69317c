#!/usr/bin/env python3
"""Lab stand-in for `nvidia-smi` on a DGX Spark: one NVIDIA GB10 on driver 580.

Installed on lab nodes as /usr/bin/nvidia-smi. It answers in the output formats of the real tool (the real
recordings in tests/unit/fixtures/nvidia-smi/) and keeps the clock state that sparkfleet changes. What it
models, from which recording or public report, and what is not known about a real GB10: README.md beside it.

- idle (no compute process, no `load` switch) the SM clock drops to an idle clock and the clock event reason
  is 0x1 "GPU idle" (the H200 recording: 345 MHz idle);
- under load (an engine process, or the `load` switch) it runs at the power-capped clock with reason 0x4
  "SW power cap" (the H200 recording: 1500 MHz under a matmul; GB10 reports ~2359-2520 MHz; the sim uses
  GB10's 2418 MHz), or at its lock when the lock holds it lower (reason 0x2);
- `clocks.max.sm` is 3003 MHz whatever the lock, no query reports the lock range, memory and power-limit
  fields answer [N/A] (GB10);
- `-pm 0|1`, `-lgc MIN,MAX`, `-lgc N`, `-rgc` change the state and need root, like the real tool; a lock
  lands slightly below the request (2100 -> 2080 MHz on a real GB10);
- the state lives under /run/nvidia-sim (a tmpfs): a node restart loses it like a reboot does;
- compute processes are the processes on this node whose program is `tensorfold`.

Switches (files in /run/nvidia-sim, like the state):
  `load`        the GPU is under load; the file may hold the power-capped clock in MHz (default 2418);
  `latched`     under load the SM clock sticks at 855 MHz whatever is asked (a latched GB10, which needs an
                AC power cycle); idle it looks idle;
  `ignore-lock` `-lgc` answers success but does not pin the clock (GB10 accepts and records it);
  `idle-mhz`    the idle clock in MHz (default 345: what a real GB10 idles at is not recorded);
  `driver-version` the driver this node runs, e.g. 580.126.09 or 590.44.01 (default 580.159.04): a node on
                another driver than its peers;
  `replay`      the path of a recordings directory: every query is answered with the recorded output,
                verbatim, and anything not recorded is refused (README.md: replay).

SPARKFLEET_NVIDIA_SIM_DIR overrides the state directory and SPARKFLEET_NVIDIA_SIM_PROC the /proc that
is scanned for engine processes (tests, so that a machine's other processes do not count).
Standard library only: this runs on the node's Python (3.11-3.13).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

# Every call of nvidia-smi is a Python process of its own (the boot unit, each Ansible task, every test
# query), so what is imported at start counts: socket and uuid are imported where the UUID and serial are
# made, and the four record classes are plain classes (dataclasses and its inspect import were about a
# third of a call's start).

DRIVER_VERSION = "580.159.04"
CUDA_VERSION = "13.0"
PRODUCT = "NVIDIA GB10"
BUS_ID = "0000000F:01:00.0"
VBIOS = "9A.0B.00.00.05"
MAX_SM_MHZ = 3003  # GB10's clocks.max.sm, also after a lock
MIN_SM_MHZ = 208
IDLE_SM_MHZ = 345  # the H200 recording's idle clock (query-idle-and-load.txt); GB10's own is not recorded
LOAD_SM_MHZ = 2418  # under load without a lock: GB10's applications clock, inside the reported 2359-2520 MHz
# The clock generator's grid and guard band: a requested ceiling lands on the grid point at least
# GUARD_MHZ below it (observed: -lgc 0,2100 runs at ~2080 MHz).
GRID_MHZ = 13
GUARD_MHZ = 15
LATCHED_SM_MHZ = 855  # reported latched GB10s: 500-890 MHz under load
LATCHED_POWER_W = 12.0  # reported: 10-14 W under load
VIDEO_MHZ = 1500
ENGINE_MARK = "tensorfold"

# NVML return codes, as nvidia-smi's exit status (nvidia-smi(1) "RETURN VALUE").
RC_OK = 0
RC_INVALID_ARG = 2
RC_NOT_SUPPORTED = 3
RC_NO_PERMISSION = 4
RC_NOT_FOUND = 6

USAGE_HINT = "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"

# Clock event reason bits (nvml.h nvmlClocksEventReason*).
REASONS = [
    (0x1, "gpu_idle", "Idle"),
    (0x2, "applications_clocks_setting", "Applications Clocks Setting"),
    (0x4, "sw_power_cap", "SW Power Cap"),
    (0x8, "hw_slowdown", "HW Slowdown"),
    (0x10, "sync_boost", "Sync Boost"),
    (0x20, "sw_thermal_slowdown", "SW Thermal Slowdown"),
    (0x40, "hw_thermal_slowdown", "HW Thermal Slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    (0x100, "display_clock_setting", "Display Clock Setting"),
]
SUPPORTED_REASONS = 0x1EF  # everything above except sync boost and display clock


class SmiError(Exception):
    def __init__(self, message: str, rc: int) -> None:
        super().__init__(message)
        self.message = message
        self.rc = rc


# ---- state ---------------------------------------------------------------------------------------
def state_dir() -> Path:
    return Path(os.environ.get("SPARKFLEET_NVIDIA_SIM_DIR", "/run/nvidia-sim"))


class GpuState:
    __slots__ = ("lock", "persistence")

    def __init__(self, persistence: bool = False, lock: list[int] | None = None) -> None:
        self.persistence = persistence
        self.lock = lock  # [min, max] MHz as requested

    @classmethod
    def load(cls, path: Path) -> GpuState:
        try:
            data = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return cls()
        lock = data.get("lock")
        return cls(persistence=bool(data.get("persistence")), lock=list(lock) if lock else None)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"persistence": self.persistence, "lock": self.lock}) + "\n")
        tmp.replace(path)


@contextlib.contextmanager
def locked_state(write: bool):
    """The GPU state under a file lock: concurrent calls (the boot unit, Ansible) see one truth."""
    directory = state_dir()
    path = directory / "state.json"
    if not write:
        yield GpuState.load(path)
        return
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "state.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = GpuState.load(path)
        yield state
        state.save(path)


DRIVER_VERSION_FORM = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2})?$")  # 580.159.04, 580.142, 590.44.01


def driver_version() -> str:
    """The `driver-version` switch's version (a node on another driver), else DRIVER_VERSION."""
    try:
        text = (state_dir() / "driver-version").read_text().strip()
    except OSError:
        return DRIVER_VERSION
    return text if DRIVER_VERSION_FORM.match(text) else DRIVER_VERSION


def nvml_version() -> str:
    """NVML's version is the driver's first two parts (580.159.04 -> 580.159, as the recording prints)."""
    return ".".join(driver_version().split(".")[:2])


def latched() -> bool:
    return (state_dir() / "latched").exists()


def ignores_lock() -> bool:
    return (state_dir() / "ignore-lock").exists()


def _switch_mhz(name: str, default: int) -> int | None:
    """A switch file that may hold a clock in MHz: None when the file is absent, else its number or the
    default (an empty file)."""
    try:
        text = (state_dir() / name).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else default


def load_switch() -> tuple[int | None, float | None]:
    """(power-capped clock, since when) of the `load` switch; (None, None) when it is off."""
    mhz = _switch_mhz("load", LOAD_SM_MHZ)
    if mhz is None:
        return None, None
    try:
        since = (state_dir() / "load").stat().st_mtime
    except OSError:
        since = None
    return mhz, since


def landed_clock(request_mhz: int) -> int:
    """Where a requested clock ceiling lands: the grid point at least GUARD_MHZ below the request."""
    if request_mhz >= MAX_SM_MHZ:
        return MAX_SM_MHZ
    target = request_mhz - GUARD_MHZ
    steps = -(-(MAX_SM_MHZ - target) // GRID_MHZ)  # ceil division
    return max(MIN_SM_MHZ, MAX_SM_MHZ - steps * GRID_MHZ)


# ---- the GPU as seen by a query --------------------------------------------------------------------
class Process:
    __slots__ = ("name", "pid")

    def __init__(self, pid: int, name: str) -> None:
        self.pid = pid
        self.name = name


class Snapshot:
    __slots__ = ("idle_mhz", "ignores_lock", "latched", "load_mhz", "load_since", "processes", "state")

    def __init__(
        self,
        state: GpuState,
        *,
        processes: list[Process] | None = None,
        latched: bool = False,
        ignores_lock: bool = False,
        load_mhz: int | None = None,  # the `load` switch's power-capped clock; None: switched off
        load_since: float | None = None,
        idle_mhz: int = IDLE_SM_MHZ,
    ) -> None:
        self.state = state
        self.processes = processes if processes is not None else []
        self.latched = latched
        self.ignores_lock = ignores_lock
        self.load_mhz = load_mhz
        self.load_since = load_since
        self.idle_mhz = idle_mhz

    @property
    def busy(self) -> bool:
        return bool(self.processes) or self.load_mhz is not None

    @property
    def natural_mhz(self) -> int:
        """Where the clock runs without a lock: the power-capped clock under load, the idle clock idle."""
        if not self.busy:
            return self.idle_mhz
        return self.load_mhz if self.load_mhz is not None else LOAD_SM_MHZ

    @property
    def ceiling(self) -> int | None:
        """The lock's ceiling where the GPU honours it."""
        if not self.state.lock or self.ignores_lock:
            return None
        return landed_clock(self.state.lock[1])

    @property
    def pinned(self) -> bool:
        """A lock that holds the clock under where it would run."""
        return not self.stuck and self.ceiling is not None and self.ceiling < self.natural_mhz

    @property
    def stuck(self) -> bool:
        """Latched, and under load: the only time a latched GPU shows."""
        return self.latched and self.busy

    @property
    def sm_mhz(self) -> int:
        if self.stuck:
            return LATCHED_SM_MHZ
        # The lock's ceiling holds the clock down; its lower end is recorded but raises nothing (what a
        # GB10 does with it is not recorded; README.md).
        return self.natural_mhz if self.ceiling is None else min(self.natural_mhz, self.ceiling)

    @property
    def power_capped(self) -> bool:
        return self.busy and not self.stuck and not self.pinned

    @property
    def reasons(self) -> int:
        if not self.busy:
            return 0x1 | (0x2 if self.pinned else 0)
        if self.stuck:
            return 0x0  # what a latched GB10 reports is not recorded: the sim reports no reason
        return 0x2 if self.pinned else 0x4

    @property
    def power_capping_us(self) -> int:
        """The cumulative SW power capping time of `-q` (counted from the `load` switch's start)."""
        if not self.power_capped or self.load_since is None:
            return 0
        return max(0, int((time.time() - self.load_since) * 1_000_000))

    @property
    def utilization(self) -> int:
        return 96 if self.busy else 0

    @property
    def power_w(self) -> float:
        if not self.busy:
            return 4.12
        if self.stuck:
            return LATCHED_POWER_W
        return round(6.0 + 40.0 * (self.sm_mhz / MAX_SM_MHZ) ** 2, 2)

    @property
    def temperature_c(self) -> int:
        return 41 if not self.busy else 44 + int(34 * self.sm_mhz / MAX_SM_MHZ)

    @property
    def pstate(self) -> str:
        return "P0" if self.busy else "P8"  # a public GB10 table: P8 idle (4 W, 0 %); P0 under load

    @property
    def uuid(self) -> str:
        return "GPU-" + str(_host_uuid("gb10."))

    @property
    def serial(self) -> str:
        return "1" + str(_host_uuid("serial.").int)[:12]


def _host_uuid(prefix: str):  # a uuid.UUID: its module is imported here, not at start
    """This node's UUID of a kind: the same on every call on a node, different between nodes."""
    import socket
    import uuid

    return uuid.uuid5(uuid.NAMESPACE_DNS, prefix + socket.gethostname())


def _cmdline(proc_root: Path, pid: int) -> list[str]:
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def runs_engine(argv: list[str]) -> bool:
    """The program itself is the engine: `tensorfold ...`, `python3 /usr/local/bin/tensorfold ...` (a
    script's shebang), `python3 -m tensorfold ...`. A process that merely names it (a shell, the docker
    CLI, docker-init, earlyoom's --prefer regex) is not a GPU process."""
    if not argv:
        return False
    program = os.path.basename(argv[0]).lower()
    if ENGINE_MARK in program:
        return True
    if not program.startswith("python"):
        return False
    rest = [a for a in argv[1:] if a not in ("-u", "-O", "-OO", "-B", "-E", "-s", "-I")]
    if rest[:1] == ["-m"]:
        rest = rest[1:]
    return bool(rest) and ENGINE_MARK in os.path.basename(rest[0]).lower()


def engine_processes(proc_root: Path = Path("/proc")) -> list[Process]:
    """Processes that run the engine: the GPU's compute processes on a Spark."""
    me = os.getpid()
    found = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        argv = _cmdline(proc_root, int(entry.name))
        if runs_engine(argv):
            found.append(Process(pid=int(entry.name), name=argv[0]))
    return sorted(found, key=lambda p: p.pid)


def snapshot() -> Snapshot:
    proc_root = Path(os.environ.get("SPARKFLEET_NVIDIA_SIM_PROC", "/proc"))
    load_mhz, load_since = load_switch()
    with locked_state(write=False) as state:
        return Snapshot(
            state=state,
            processes=engine_processes(proc_root),
            latched=latched(),
            ignores_lock=ignores_lock(),
            load_mhz=load_mhz,
            load_since=load_since,
            idle_mhz=_switch_mhz("idle-mhz", IDLE_SM_MHZ) or IDLE_SM_MHZ,
        )


# ---- --query-gpu ---------------------------------------------------------------------------------
NA = "[N/A]"


class Field:
    __slots__ = ("header", "unit", "value")

    def __init__(self, header: str, unit: str | None, value: object) -> None:
        self.header = header
        self.unit = unit
        self.value = value  # callable(Snapshot) -> str


def _mhz(fn):
    return lambda s: str(fn(s))


def _reason(bit: int):
    return lambda s: "Active" if s.reasons & bit else "Not Active"


def _build_fields() -> dict[str, Field]:
    f: dict[str, Field] = {}

    def add(names: str, header: str, unit: str | None, value) -> None:
        for name in names.split("|"):
            f[name] = Field(header, unit, value)

    add("timestamp", "timestamp", None, lambda s: time.strftime("%Y/%m/%d %H:%M:%S.000"))
    add("driver_version", "driver_version", None, lambda s: driver_version())
    add("count", "count", None, lambda s: "1")
    add("name|gpu_name", "name", None, lambda s: PRODUCT)
    add("serial|gpu_serial", "serial", None, lambda s: s.serial)
    add("uuid|gpu_uuid", "uuid", None, lambda s: s.uuid)
    add("pci.bus_id|gpu_bus_id", "pci.bus_id", None, lambda s: BUS_ID)
    add("pci.domain", "pci.domain", None, lambda s: "0x000F")
    add("pci.bus", "pci.bus", None, lambda s: "0x01")
    add("pci.device", "pci.device", None, lambda s: "0x00")
    add("pci.device_id", "pci.device_id", None, lambda s: "0x2E1210DE")
    add("index", "index", None, lambda s: "0")
    add("display_active", "display_active", None, lambda s: "Disabled")
    add("display_attached", "display_attached", None, lambda s: "No")
    add(
        "persistence_mode",
        "persistence_mode",
        None,
        lambda s: "Enabled" if s.state.persistence else "Disabled",
    )
    add("addressing_mode", "addressing_mode", None, lambda s: "ATS")
    add("vbios_version", "vbios_version", None, lambda s: VBIOS)
    add("pstate", "pstate", None, lambda s: s.pstate)
    add("fan.speed", "fan.speed", "%", lambda s: NA)
    add("compute_mode", "compute_mode", None, lambda s: "Default")
    add("compute_cap", "compute_cap", None, lambda s: "12.1")
    add("mig.mode.current", "mig.mode.current", None, lambda s: NA)
    add("mig.mode.pending", "mig.mode.pending", None, lambda s: NA)
    add(
        "clocks_event_reasons.supported|clocks_throttle_reasons.supported",
        "clocks_event_reasons.supported",
        None,
        lambda s: f"0x{SUPPORTED_REASONS:016X}",
    )
    add(
        "clocks_event_reasons.active|clocks_throttle_reasons.active",
        "clocks_event_reasons.active",
        None,
        lambda s: f"0x{s.reasons:016X}",
    )
    for bit, key, _label in REASONS:
        if key == "display_clock_setting":
            continue
        add(
            f"clocks_event_reasons.{key}|clocks_throttle_reasons.{key}",
            f"clocks_event_reasons.{key}",
            None,
            _reason(bit),
        )
    return _add_sensor_fields(f, add)


def _add_sensor_fields(f: dict[str, Field], add) -> dict[str, Field]:
    """Memory, utilization, temperature, power and clock fields."""
    for kind in ("total", "reserved", "used", "free"):
        add(f"memory.{kind}", f"memory.{kind}", "MiB", lambda s: NA)
    add("utilization.gpu", "utilization.gpu", "%", lambda s: str(s.utilization))
    add("utilization.memory", "utilization.memory", "%", lambda s: NA)
    add("temperature.gpu", "temperature.gpu", None, lambda s: str(s.temperature_c))
    add("temperature.memory", "temperature.memory", None, lambda s: NA)
    add("power.management", "power.management", None, lambda s: "Supported")
    add("power.draw", "power.draw", "W", lambda s: f"{s.power_w:.2f}")
    add("power.draw.average|gpu.power.draw.average", "power.draw.average", "W", lambda s: f"{s.power_w:.2f}")
    add("power.draw.instant|gpu.power.draw.instant", "power.draw.instant", "W", lambda s: f"{s.power_w:.2f}")
    for names, header in (
        ("power.limit|gpu.power.requested_limit", "power.limit"),
        ("enforced.power.limit|gpu.power.current_limit", "enforced.power.limit"),
        ("power.default_limit|gpu.power.default_limit", "power.default_limit"),
        ("power.min_limit|gpu.power.min_limit", "power.min_limit"),
        ("power.max_limit|gpu.power.max_limit", "power.max_limit"),
    ):
        add(names, header, "W", lambda s: NA)
    add("clocks.current.graphics|clocks.gr", "clocks.current.graphics", "MHz", _mhz(lambda s: s.sm_mhz))
    add("clocks.current.sm|clocks.sm", "clocks.current.sm", "MHz", _mhz(lambda s: s.sm_mhz))
    add("clocks.current.memory|clocks.mem", "clocks.current.memory", "MHz", lambda s: NA)
    add("clocks.current.video|clocks.video", "clocks.current.video", "MHz", _mhz(lambda s: VIDEO_MHZ))
    add(
        "clocks.applications.graphics|clocks.applications.gr",
        "clocks.applications.graphics",
        "MHz",
        lambda s: NA,
    )
    add(
        "clocks.applications.memory|clocks.applications.mem",
        "clocks.applications.memory",
        "MHz",
        lambda s: NA,
    )
    add(
        "clocks.default_applications.graphics|clocks.default_applications.gr",
        "clocks.default_applications.graphics",
        "MHz",
        lambda s: NA,
    )
    add(
        "clocks.default_applications.memory|clocks.default_applications.mem",
        "clocks.default_applications.memory",
        "MHz",
        lambda s: NA,
    )
    add("clocks.max.graphics|clocks.max.gr", "clocks.max.graphics", "MHz", _mhz(lambda s: MAX_SM_MHZ))
    add("clocks.max.sm", "clocks.max.sm", "MHz", _mhz(lambda s: MAX_SM_MHZ))
    add("clocks.max.memory|clocks.max.mem", "clocks.max.memory", "MHz", lambda s: NA)
    return f


GPU_FIELDS = _build_fields()

APP_FIELDS: dict[str, Field] = {
    "timestamp": Field("timestamp", None, lambda sp: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "gpu_name": Field("gpu_name", None, lambda sp: PRODUCT),
    "gpu_bus_id": Field("gpu_bus_id", None, lambda sp: BUS_ID),
    "gpu_serial": Field("gpu_serial", None, lambda sp: sp[0].serial),
    "gpu_uuid": Field("gpu_uuid", None, lambda sp: sp[0].uuid),
    "pid": Field("pid", None, lambda sp: str(sp[1].pid)),
    "process_name|name": Field("process_name", None, lambda sp: sp[1].name),
    "used_gpu_memory|used_memory": Field("used_gpu_memory", "MiB", lambda sp: NA),
}
APP_FIELDS = {alias: fld for names, fld in APP_FIELDS.items() for alias in names.split("|")}


def _parse_format(fmt: str | None) -> tuple[bool, bool]:
    if fmt is None:
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    opts = [o.strip() for o in fmt.split(",") if o.strip()]
    if "csv" not in opts or any(o not in {"csv", "noheader", "nounits"} for o in opts):
        raise SmiError(f'"{fmt}" is not a valid format.\n' + USAGE_HINT, RC_INVALID_ARG)
    return "noheader" in opts, "nounits" in opts


def _select(fields: dict[str, Field], query: str) -> list[Field]:
    names = [n.strip() for n in query.split(",")]
    chosen = []
    for name in names:
        if name not in fields:
            raise SmiError(f'Field "{name}" is not a valid field to query.\n\n', RC_INVALID_ARG)
        chosen.append(fields[name])
    return chosen


def _csv(chosen: list[Field], rows: list[object], noheader: bool, nounits: bool) -> str:
    out = []
    if not noheader:
        out.append(", ".join(f.header + (f" [{f.unit}]" if f.unit else "") for f in chosen))
    for row in rows:
        values = []
        for f in chosen:
            value = str(f.value(row))
            if f.unit and not nounits and value != NA:
                value = f"{value} {f.unit}" if f.unit != "%" else f"{value} %"
            values.append(value)
        out.append(", ".join(values))
    return "".join(line + "\n" for line in out)


def query_gpu(query: str, fmt: str | None) -> str:
    noheader, nounits = _parse_format(fmt)
    chosen = _select(GPU_FIELDS, query)
    return _csv(chosen, [snapshot()], noheader, nounits)


def query_apps(query: str, fmt: str | None) -> str:
    noheader, nounits = _parse_format(fmt)
    chosen = _select(APP_FIELDS, query)
    snap = snapshot()
    return _csv(chosen, [(snap, p) for p in snap.processes], noheader, nounits)


# ---- the summary table and -L ----------------------------------------------------------------------
def _now() -> str:
    return time.strftime("%a %b %e %H:%M:%S %Y")


def table() -> str:
    s = snapshot()
    bar = "+" + "-" * 89 + "+"
    grid = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    pm = "On" if s.state.persistence else "Off"

    def row(a: str, b: str, c: str) -> str:
        assert len(a) == 41 and len(b) == 24 and len(c) == 22, (a, b, c)
        return f"|{a}|{b}|{c}|"

    def wide(text: str) -> str:
        assert len(text) <= 89, text
        return f"|{text:<89}|"

    lines = [
        f"{_now()}       ",
        bar,
        wide(
            f" NVIDIA-SMI {driver_version():<23}Driver Version: {driver_version():<15}"
            f"CUDA Version: {CUDA_VERSION:<9}"
        ),
        grid,
        row(
            " GPU  Name                 Persistence-M ", " Bus-Id          Disp.A ", " Volatile Uncorr. ECC "
        ),
        row(
            " Fan  Temp   Perf          Pwr:Usage/Cap ", "           Memory-Usage ", " GPU-Util  Compute M. "
        ),
        row(
            "                                         ", "                        ", "               MIG M. "
        ),
        "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|",
        row(f"   0  {PRODUCT}{pm:>{33 - len(PRODUCT)}}  ", f"   {BUS_ID} Off ", f"{'N/A':>21} "),
        row(
            f" N/A  {s.temperature_c:>3}C    {s.pstate}{round(s.power_w):>15}W /  N/A  ",
            f" {'Not Supported':<23}",
            f"{f'{s.utilization}%':>8}      Default ",
        ),
        row(" " * 41, " " * 24, f"{'N/A':>21} "),
        grid,
        "",
        bar,
        wide(" Processes:"),
        wide("  GPU   GI   CI              PID   Type   Process name                        GPU Memory"),
        wide("        ID   ID                                                               Usage     "),
        "|" + "=" * 89 + "|",
    ]
    if not s.processes:
        lines.append(wide("  No running processes found"))
    for p in s.processes:
        name = p.name if len(p.name) <= 35 else "..." + p.name[-32:]
        lines.append(wide(f"    0   N/A  N/A  {p.pid:>15}      C   {name:<35}{'N/A':>10} "))
    lines.append(bar)
    return "\n".join(lines) + "\n"


def list_gpus() -> str:
    return f"GPU 0: {PRODUCT} (UUID: {snapshot().uuid})\n"


def version() -> str:
    return (
        f"NVIDIA-SMI version  : {driver_version()}\n"
        f"NVML version        : {nvml_version()}\n"
        f"DRIVER version      : {driver_version()}\n"
        f"CUDA Version        : {CUDA_VERSION}\n"
    )


# ---- -q --------------------------------------------------------------------------------------------
DISPLAY_TYPES = {
    "MEMORY",
    "UTILIZATION",
    "ECC",
    "TEMPERATURE",
    "POWER",
    "CLOCK",
    "COMPUTE",
    "PIDS",
    "PERFORMANCE",
    "SUPPORTED_CLOCKS",
    "PAGE_RETIREMENT",
    "ACCOUNTING",
    "ENCODER_STATS",
    "SUPPORTED_GPU_TARGET_TEMP",
    "VOLTAGE",
    "FBC_STATS",
    "ROW_REMAPPER",
    "GSP_FIRMWARE_VERSION",
    "POWER_SMOOTHING",
    "POWER_PROFILES",
}


def _kv(depth: int, key: str, value: str | None = None) -> str:
    left = "    " * depth + key
    if value is None:
        return left
    return f"{left:<55}: {value}"


def _q_sections(s: Snapshot, samples: bool) -> list[tuple[str | None, list[str]]]:
    """(display type or None for `-q` only, lines) in the order the real tool prints them."""
    reasons = [
        _kv(1, "Clocks Event Reasons"),
        *(
            _kv(2 if label not in {"HW Thermal Slowdown", "HW Power Brake Slowdown"} else 3, label, state)
            for label, state in [
                ("Idle", "Active" if s.reasons & 0x1 else "Not Active"),
                ("Applications Clocks Setting", "Active" if s.reasons & 0x2 else "Not Active"),
                ("SW Power Cap", "Active" if s.reasons & 0x4 else "Not Active"),
                ("HW Slowdown", "Not Active"),
                ("HW Thermal Slowdown", "Not Active"),
                ("HW Power Brake Slowdown", "Not Active"),
                ("Sync Boost", "Not Active"),
                ("SW Thermal Slowdown", "Not Active"),
                ("Display Clock Setting", "Not Active"),
            ]
        ),
        _kv(1, "Clocks Event Reasons Counters"),
        _kv(2, "SW Power Capping", f"{s.power_capping_us} us"),
        _kv(2, "Sync Boost", "0 us"),
        _kv(2, "SW Thermal Slowdown", "0 us"),
        _kv(2, "HW Thermal Slowdown", "0 us"),
        _kv(2, "HW Power Braking", "0 us"),
        _kv(1, "Sparse Operation Mode", "N/A"),
    ]
    sm = f"{s.sm_mhz} MHz"
    clocks = [
        _kv(1, "Clocks"),
        _kv(2, "Graphics", sm),
        _kv(2, "SM", sm),
        _kv(2, "Memory", "N/A"),
        _kv(2, "Video", f"{VIDEO_MHZ} MHz"),
        _kv(1, "Applications Clocks"),
        _kv(2, "Graphics", "N/A"),
        _kv(2, "Memory", "N/A"),
        _kv(1, "Default Applications Clocks"),
        _kv(2, "Graphics", "N/A"),
        _kv(2, "Memory", "N/A"),
        _kv(1, "Deferred Clocks"),
        _kv(2, "Memory", "N/A"),
        _kv(1, "Max Clocks"),
        _kv(2, "Graphics", f"{MAX_SM_MHZ} MHz"),
        _kv(2, "SM", f"{MAX_SM_MHZ} MHz"),
        _kv(2, "Memory", "N/A"),
        _kv(2, "Video", f"{VIDEO_MHZ} MHz"),
        _kv(1, "Max Customer Boost Clocks"),
        _kv(2, "Graphics", "N/A"),
    ]
    if samples:
        for what in ("SM Clock Samples", "Memory Clock Samples"):
            clocks.append(_kv(1, what))
            clocks.extend(
                _kv(2, k, "Not Found") for k in ("Duration", "Number of Samples", "Max", "Min", "Avg")
            )
    clocks += [_kv(1, "Clock Policy"), _kv(2, "Auto Boost", "N/A"), _kv(2, "Auto Boost Default", "N/A")]
    procs = [_kv(1, "Processes", "None")] if not s.processes else [_kv(1, "Processes")]
    for p in s.processes:
        procs += [
            _kv(2, "GPU instance ID", "N/A"),
            _kv(2, "Compute instance ID", "N/A"),
            _kv(2, "Process ID", str(p.pid)),
            _kv(3, "Type", "C"),
            _kv(3, "Name", p.name),
            _kv(3, "Used GPU Memory", "N/A"),
        ]
    return [
        (
            None,
            [
                _kv(1, "Product Name", PRODUCT),
                _kv(1, "Product Brand", "NVIDIA RTX"),
                _kv(1, "Product Architecture", "Blackwell"),
                _kv(1, "Display Mode", "Requested functionality has been deprecated"),
                _kv(1, "Display Attached", "No"),
                _kv(1, "Display Active", "Disabled"),
                _kv(1, "Persistence Mode", "Enabled" if s.state.persistence else "Disabled"),
                _kv(1, "Addressing Mode", "ATS"),
                _kv(1, "MIG Mode"),
                _kv(2, "Current", "N/A"),
                _kv(2, "Pending", "N/A"),
                _kv(1, "Accounting Mode", "Disabled"),
                _kv(1, "Accounting Mode Buffer Size", "4000"),
                _kv(1, "Driver Model"),
                _kv(2, "Current", "N/A"),
                _kv(2, "Pending", "N/A"),
                _kv(1, "Serial Number", s.serial),
                _kv(1, "GPU UUID", s.uuid),
                _kv(1, "Minor Number", "0"),
                _kv(1, "VBIOS Version", VBIOS),
                _kv(1, "MultiGPU Board", "No"),
                _kv(1, "Board ID", "0xf0100"),
                _kv(1, "GPU Part Number", "N/A"),
                _kv(1, "GPU Operation Mode"),
                _kv(2, "Current", "N/A"),
                _kv(2, "Pending", "N/A"),
                _kv(1, "GPU C2C Mode", "Enabled"),
                _kv(1, "GPU Recovery Action", "None"),
            ],
        ),
        ("GSP_FIRMWARE_VERSION", [_kv(1, "GSP Firmware Version", driver_version())]),
        (
            None,
            [
                _kv(1, "PCI"),
                _kv(2, "Bus", "0x01"),
                _kv(2, "Device", "0x00"),
                _kv(2, "Domain", "0x000F"),
                _kv(2, "Device Id", "0x2E1210DE"),
                _kv(2, "Bus Id", BUS_ID),
                _kv(1, "Fan Speed", "N/A"),
            ],
        ),
        ("PERFORMANCE", [_kv(1, "Performance State", s.pstate), *reasons]),
        (
            "MEMORY",
            [
                _kv(1, "FB Memory Usage"),
                *(_kv(2, k, "N/A") for k in ("Total", "Reserved", "Used", "Free")),
                _kv(1, "BAR1 Memory Usage"),
                *(_kv(2, k, "N/A") for k in ("Total", "Used", "Free")),
            ],
        ),
        ("COMPUTE", [_kv(1, "Compute Mode", "Default")]),
        (
            "UTILIZATION",
            [
                _kv(1, "Utilization"),
                _kv(2, "GPU", f"{s.utilization} %"),
                *(_kv(2, k, "N/A") for k in ("Memory", "Encoder", "Decoder", "JPEG", "OFA")),
            ],
        ),
        ("ECC", [_kv(1, "ECC Mode"), _kv(2, "Current", "N/A"), _kv(2, "Pending", "N/A")]),
        (
            "TEMPERATURE",
            [
                _kv(1, "Temperature"),
                _kv(2, "GPU Current Temp", f"{s.temperature_c} C"),
                _kv(2, "GPU T.Limit Temp", "N/A"),
                _kv(2, "GPU Shutdown T.Limit Temp", "N/A"),
                _kv(2, "GPU Slowdown T.Limit Temp", "N/A"),
                _kv(2, "GPU Max Operating T.Limit Temp", "N/A"),
                _kv(2, "GPU Target Temperature", "N/A"),
                _kv(2, "Memory Current Temp", "N/A"),
                _kv(2, "Memory Max Operating T.Limit Temp", "N/A"),
            ],
        ),
        (
            "POWER",
            [
                _kv(1, "GPU Power Readings"),
                _kv(2, "Average Power Draw", f"{s.power_w:.2f} W"),
                _kv(2, "Instantaneous Power Draw", f"{s.power_w:.2f} W"),
                *(
                    _kv(2, k, "N/A")
                    for k in (
                        "Current Power Limit",
                        "Requested Power Limit",
                        "Default Power Limit",
                        "Min Power Limit",
                        "Max Power Limit",
                    )
                ),
            ],
        ),
        ("CLOCK", clocks),
        ("SUPPORTED_CLOCKS", [_kv(1, "Supported Clocks", "N/A")]),
        ("PIDS", procs),
    ]


def query_full(displays: list[str] | None) -> str:
    s = snapshot()
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", _now()),
        _kv(0, "Driver Version", driver_version()),
        _kv(0, "CUDA Version", CUDA_VERSION),
        "",
        _kv(0, "Attached GPUs", "1"),
        f"GPU {BUS_ID}",
    ]
    for kind, body in _q_sections(s, samples=bool(displays and "CLOCK" in displays)):
        if displays is None:
            if kind != "SUPPORTED_CLOCKS":  # like the real tool: only on request
                lines += body
        elif kind in displays:
            lines += body
    return "\n".join(lines) + "\n\n"


# ---- device modification ------------------------------------------------------------------------
def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise SmiError(what, RC_NO_PERMISSION)


def set_persistence(value: str) -> str:
    mode = _persistence_value(value)
    word = "Enabled" if mode else "Disabled"
    _need_root(
        f"Unable to set persistence mode for GPU {BUS_ID}: Insufficient Permissions\n"
        "Terminating early due to previous errors.\n"
    )
    with locked_state(write=True) as state:
        if state.persistence == mode:
            return f"Persistence mode is already {word} for GPU {BUS_ID}.\nAll done.\n"
        state.persistence = mode
    return f"{word} persistence mode for GPU {BUS_ID}.\nAll done.\n"


def _persistence_value(value: str) -> bool:
    mode = {"0": False, "DISABLED": False, "1": True, "ENABLED": True}.get(value.upper())
    if mode is None:
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    return mode


def _lock_values(value: str) -> tuple[int, int]:
    parts = value.split(",")
    if len(parts) not in (1, 2) or not all(re.fullmatch(r"\d+", p.strip()) for p in parts):
        raise SmiError(
            f'Invalid clock value "{value}": expected <minGpuClock,maxGpuClock> or <GpuClockValue> in MHz.\n'
            + USAGE_HINT,
            RC_INVALID_ARG,
        )
    low, high = (int(parts[0]), int(parts[-1]))
    if low > high:
        raise SmiError(
            f"Invalid clock range: the minimum ({low} MHz) is greater than the maximum ({high} MHz).\n",
            RC_INVALID_ARG,
        )
    return low, high


def lock_clocks(value: str) -> str:
    low, high = _lock_values(value)
    _need_root(
        f"The current user does not have permission to change clocks for GPU {BUS_ID}.\n"
        "Terminating early due to previous errors.\n"
    )
    with locked_state(write=True) as state:
        state.lock = [low, high]
    return f'GPU clocks set to "(gpuClkMin {low}, gpuClkMax {high})" for GPU {BUS_ID}\n\nAll done.\n'


def reset_clocks() -> str:
    _need_root(
        f"The current user does not have permission to change clocks for GPU {BUS_ID}.\n"
        "Terminating early due to previous errors.\n"
    )
    with locked_state(write=True) as state:
        state.lock = None
    return "All done.\n"


# ---- command line ----------------------------------------------------------------------------------
FLAGS_WITH_VALUE = {
    "-i": "id",
    "--id": "id",
    "-d": "display",
    "--display": "display",
    "-pm": "pm",
    "--persistence-mode": "pm",
    "-lgc": "lgc",
    "--lock-gpu-clocks": "lgc",
    "-m": "mode",
    "--mode": "mode",
    "--query-gpu": "query_gpu",
    "--query-compute-apps": "query_apps",
    "--format": "format",
    "-f": "filename",
    "--filename": "filename",
}
FLAGS_BARE = {
    "-h": "help",
    "--help": "help",
    "--version": "version",
    "-L": "list",
    "--list-gpus": "list",
    "-q": "query",
    "--query": "query",
    "-rgc": "rgc",
    "--reset-gpu-clocks": "rgc",
    "--help-query-gpu": "help_query_gpu",
}


def parse(argv: list[str]) -> dict[str, str | bool]:
    opts: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, inline = arg.partition("=")
        if name in FLAGS_WITH_VALUE:
            if eq:
                value = inline
            else:
                i += 1
                if i >= len(argv):
                    raise SmiError(USAGE_HINT, RC_INVALID_ARG)
                value = argv[i]
            opts[FLAGS_WITH_VALUE[name]] = value
        elif arg in FLAGS_BARE:
            opts[FLAGS_BARE[arg]] = True
        else:
            raise SmiError(USAGE_HINT, RC_INVALID_ARG)
        i += 1
    return opts


def _check_id(opts: dict[str, str | bool]) -> None:
    target = str(opts.get("id", "0"))
    if target not in {"0", BUS_ID, "00000000:01:00.0"} and not target.startswith("GPU-"):
        raise SmiError("No devices were found\n", RC_NOT_FOUND)


def _modify(opts: dict[str, str | bool]) -> str | None:
    """Device modification options: at most one per call, like the real tool."""
    actions = [k for k in ("pm", "lgc", "rgc") if k in opts]
    if len(actions) > 1 or ("mode" in opts and "lgc" not in opts):
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    if not actions:
        return None
    if actions[0] == "pm":
        return set_persistence(str(opts["pm"]))
    if actions[0] == "lgc":
        return lock_clocks(str(opts["lgc"]))
    return reset_clocks()


def _displays(opts: dict[str, str | bool]) -> list[str] | None:
    if "display" not in opts:
        return None
    displays = [d.strip().upper() for d in str(opts["display"]).split(",") if d.strip()]
    unknown = [d for d in displays if d not in DISPLAY_TYPES]
    if unknown:
        raise SmiError(f'"{unknown[0]}" is not a valid display type.\n' + USAGE_HINT, RC_INVALID_ARG)
    return displays


def _report(opts: dict[str, str | bool]) -> str:
    fmt = opts.get("format")
    fmt = None if fmt is None else str(fmt)
    if "query_gpu" in opts:
        return query_gpu(str(opts["query_gpu"]), fmt)
    if "query_apps" in opts:
        return query_apps(str(opts["query_apps"]), fmt)
    if fmt is not None or ("display" in opts and not opts.get("query")):
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    if opts.get("list"):
        return list_gpus()
    if opts.get("query"):
        return query_full(_displays(opts))
    return table()


# ---- replay: recorded real outputs, verbatim --------------------------------------------------------
def replay_dir() -> Path | None:
    """The recordings directory the `replay` switch names; None when replay is off."""
    try:
        text = (state_dir() / "replay").read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def _refuse_like_the_real_tool(opts: dict[str, str | bool]) -> None:
    """Raise what the real tool answers to a call it refuses (bad fields, formats, values, devices)."""
    _check_id(opts)
    actions = [k for k in ("pm", "lgc", "rgc") if k in opts]
    if len(actions) > 1 or ("mode" in opts and "lgc" not in opts):
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    if "pm" in opts:
        _persistence_value(str(opts["pm"]))
    if "lgc" in opts:
        _lock_values(str(opts["lgc"]))
    fmt = opts.get("format")
    if "query_gpu" in opts or "query_apps" in opts:
        _parse_format(None if fmt is None else str(fmt))
        if "query_gpu" in opts:
            _select(GPU_FIELDS, str(opts["query_gpu"]))
        if "query_apps" in opts:
            _select(APP_FIELDS, str(opts["query_apps"]))
    elif fmt is not None or ("display" in opts and not opts.get("query")):
        raise SmiError(USAGE_HINT, RC_INVALID_ARG)
    _displays(opts)


def replay(argv: list[str], directory: Path) -> tuple[str, int]:
    """The recorded output of exactly this call, verbatim. The recordings directory's replay.json lists
    {argv, file, lines (first and last, 1-based; default the whole file), state (idle or load; default
    either), rc}; the GPU's state (the `load` switch, an engine process) picks between idle and load
    recordings. A call the real tool refuses is refused as it refuses it; anything else not recorded is
    refused too: replay never makes text up."""
    opts = parse(argv)
    _refuse_like_the_real_tool(opts)
    manifest_path = directory / "replay.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError) as err:
        raise SmiError(
            f"nvidia-smi lab simulator: replay: cannot read {manifest_path}: {err}\n", RC_NOT_SUPPORTED
        ) from err
    state = "load" if snapshot().busy else "idle"
    for rec in manifest.get("recordings", []):
        if rec.get("state", state) != state or parse(list(rec["argv"])) != opts:
            continue
        text = (directory / rec["file"]).read_text()
        if "lines" in rec:
            first, last = rec["lines"]
            text = "".join(text.splitlines(keepends=True)[first - 1 : last])
        return text, int(rec.get("rc", RC_OK))
    shown, gpu = " ".join(argv), "under load" if state == "load" else "idle"
    raise SmiError(
        f"nvidia-smi lab simulator: replay of {directory}: no recording of `nvidia-smi {shown}` while the "
        f"GPU is {gpu}\n",
        RC_NOT_SUPPORTED,
    )


def run(argv: list[str]) -> tuple[str, int]:
    recordings = replay_dir()
    if recordings is not None:
        return replay(argv, recordings)
    opts = parse(argv)
    _check_id(opts)
    if opts.get("help"):
        return f"NVIDIA System Management Interface -- v{DRIVER_VERSION} (sparkfleet lab simulator)\n", RC_OK
    if opts.get("version"):
        return version(), RC_OK
    if opts.get("help_query_gpu"):
        return "".join(f'"{name}"\n' for name in sorted(GPU_FIELDS)), RC_OK
    changed = _modify(opts)
    return (changed if changed is not None else _report(opts)), RC_OK


def main(argv: list[str] | None = None) -> int:
    try:
        out, rc = run(sys.argv[1:] if argv is None else argv)
    except SmiError as err:
        sys.stdout.write(err.message)
        return err.rc
    target = parse_filename(sys.argv[1:] if argv is None else argv)
    if target:
        Path(target).write_text(out)
    else:
        sys.stdout.write(out)
    return rc


def parse_filename(argv: list[str]) -> str | None:
    try:
        value = parse(argv).get("filename")
    except SmiError:
        return None
    return str(value) if value else None


if __name__ == "__main__":
    sys.exit(main())
