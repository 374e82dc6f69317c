"""The lab's nvidia-smi simulator, driven as a subprocess like the real tool, against the fixtures."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "lab/sparkfleet_lab/sim/nvidia_smi.py"
FIXTURES = Path(
    os.environ.get(
        "SPARKFLEET_NVIDIA_FIXTURES", ROOT / "tests/unit/fixtures/nvidia-smi/h200-driver-580.159.04"
    )
)
FIXTURE_QUERY = (
    "index,name,uuid,persistence_mode,clocks.sm,clocks.max.sm,clocks.gr,clocks.max.gr,"
    "clocks_event_reasons.active,clocks_event_reasons.sw_power_cap,power.draw,temperature.gpu,driver_version"
)
# A Python an unprivileged user can run (the test venv may live under /root).
UNPRIVILEGED_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"fixtures not found at {FIXTURES}")


@pytest.fixture
def smi():
    # Not under pytest's tmp_path (mode 0700): the unprivileged-user tests must reach it too.
    top = Path(tempfile.mkdtemp(prefix="nvidia-sim-test-"))
    top.chmod(0o755)
    state = top / "nvidia-sim"
    no_procs = top / "proc"  # engine processes of this machine's other users must not count
    no_procs.mkdir()

    def run(
        *args: str, user: str | None = None, check: bool = True, proc: Path | None = None
    ) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "SPARKFLEET_NVIDIA_SIM_DIR": str(state),
            "SPARKFLEET_NVIDIA_SIM_PROC": str(proc or no_procs),
        }
        kwargs = {}
        python = sys.executable
        if user is not None:
            python = UNPRIVILEGED_PYTHON
            pw = pwd.getpwnam(user)

            def drop() -> None:
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)

            kwargs["preexec_fn"] = drop
        proc = subprocess.run(
            [python, str(SIM), *args], env=env, capture_output=True, text=True, check=False, **kwargs
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"nvidia-smi {' '.join(args)} -> {proc.returncode}: {proc.stdout}{proc.stderr}"
            )
        return proc

    run.state = state
    yield run
    shutil.rmtree(top, ignore_errors=True)


def sm_clock(smi) -> int:
    return int(smi("--query-gpu=clocks.sm", "--format=csv,noheader,nounits").stdout)


def _kv_paths(text: str) -> list[tuple[str, ...]]:
    """Key paths of a `-q` report below the GPU line: ('Clocks', 'SM'), ..."""
    paths: list[tuple[str, ...]] = []
    stack: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.startswith("GPU "):
            inside = True
            continue
        if not inside or not line.strip():
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 4
        key = line.split(" : ")[0].strip() if " : " in line else line.strip()
        stack[depth - 1 :] = [key]
        paths.append(tuple(stack))
    return paths


# ---- shapes against the real tool ----------------------------------------------------------------
@needs_fixtures
def test_summary_table_has_the_real_layout(smi):
    real = (FIXTURES / "nvidia-smi.txt").read_text().splitlines()
    sim = smi().stdout.splitlines()
    assert len(sim) == len(real)
    for ours, theirs in zip(sim, real, strict=True):
        assert len(ours) == len(theirs), (ours, theirs)
        # borders and column separators sit in the same places
        assert [i for i, c in enumerate(ours) if c in "|+"] == [i for i, c in enumerate(theirs) if c in "|+"]
    assert sim[4:8] == real[4:8]  # column headings
    assert "NVIDIA GB10" in sim[8] and "Not Supported" in sim[9]
    assert re.match(r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}", sim[0])


@needs_fixtures
def test_csv_query_matches_the_fixture_header_and_shape(smi):
    real_header, real_row, real_short = (FIXTURES / "query-csv.txt").read_text().splitlines()
    out = smi(f"--query-gpu={FIXTURE_QUERY}", "--format=csv").stdout.splitlines()
    assert out[0] == real_header  # e.g. clocks.sm is spelled clocks.current.sm [MHz]
    row = out[1].split(", ")
    assert len(row) == len(real_row.split(", "))
    assert row[1] == "NVIDIA GB10"
    assert re.fullmatch(r"GPU-[0-9a-f-]{36}", row[2])
    assert row[5] == "3003 MHz"  # GB10 max SM clock
    assert re.fullmatch(r"0x[0-9A-F]{16}", row[8])
    assert re.fullmatch(r"\d+\.\d\d W", row[10])
    short = smi(
        "--query-gpu=clocks.sm,clocks.max.sm,persistence_mode", "--format=csv,noheader,nounits"
    ).stdout
    assert re.fullmatch(r"\d+, \d+, (Enabled|Disabled)\n", short)
    assert len(short.split(", ")) == len(real_short.split(", "))


@needs_fixtures
def test_q_clock_report_has_the_fixture_keys_in_order(smi):
    real = _kv_paths((FIXTURES / "nvidia-smi-q-clock.txt").read_text())
    sim = _kv_paths(smi("-q", "-d", "CLOCK,PERFORMANCE,SUPPORTED_CLOCKS").stdout)
    cut = real.index(("Supported Clocks",))
    assert sim[: cut + 1] == real[: cut + 1]
    assert smi("-q", "-d", "CLOCK").stdout.count("SM Clock Samples") == 1


@needs_fixtures
def test_full_q_report_uses_only_real_keys_with_aligned_colons(smi):
    real = set(_kv_paths((FIXTURES / "nvidia-smi-q.txt").read_text()))
    text = smi("-q").stdout
    sim = _kv_paths(text)
    assert ("Product Name",) in sim and ("Clocks", "SM") in sim
    assert [p for p in sim if p not in real] == []
    for line in text.splitlines():
        if " : " in line:
            assert line.index(" : ") == 54, line  # the value column of the real tool
    assert "Supported Clocks" not in text  # only with -d SUPPORTED_CLOCKS, like the real tool


def test_gb10_identity_and_unified_memory(smi):
    assert re.fullmatch(r"GPU 0: NVIDIA GB10 \(UUID: GPU-[0-9a-f-]{36}\)\n", smi("-L").stdout)
    mem = smi("--query-gpu=memory.total,memory.used", "--format=csv").stdout
    assert mem == "memory.total [MiB], memory.used [MiB]\n[N/A], [N/A]\n"
    assert "Product Architecture                               : Blackwell" in smi("-q").stdout


# ---- clock state -------------------------------------------------------------------------------------
STOCK = 2418  # GB10's SM clock without a lock (receipts: the simulator's docstring)


def test_lock_lands_slightly_below_the_request_and_reset_restores_stock(smi):
    assert sm_clock(smi) == STOCK
    out = smi("-lgc", "0,2100").stdout
    assert 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2100)"' in out
    assert 2060 <= sm_clock(smi) < 2100
    smi("-lgc", "0,2300")
    assert 2270 <= sm_clock(smi) < 2300
    reasons = smi("--query-gpu=clocks_event_reasons.active", "--format=csv,noheader").stdout.strip()
    assert int(reasons, 16) & 0x2  # a lock shows as an applications clocks setting
    assert smi("-rgc").stdout == "All done.\n"
    assert sm_clock(smi) == STOCK
    smi("-lgc", "1500")  # a single value locks min = max
    assert 1470 <= sm_clock(smi) < 1500
    assert int(smi("--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits").stdout) == 3003


def test_a_ceiling_above_the_stock_clock_changes_nothing(smi):
    smi("-lgc", "3003,3003")  # accepted, as on a real GB10, and the clock keeps floating
    assert sm_clock(smi) == STOCK
    reasons = smi("--query-gpu=clocks_event_reasons.active", "--format=csv,noheader").stdout.strip()
    assert not int(reasons, 16) & 0x2


def test_a_gpu_that_ignores_the_lock_answers_success_and_keeps_its_clock(smi):
    smi.state.mkdir(parents=True)
    (smi.state / "ignore-lock").touch()
    out = smi("-lgc", "0,2300")
    assert out.returncode == 0 and 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2300)"' in out.stdout
    assert sm_clock(smi) == STOCK  # above the cap: -lgc reported success without pinning
    (smi.state / "ignore-lock").unlink()
    assert sm_clock(smi) < 2300  # the recorded lock holds once the GPU honours it


def test_persistence_mode_and_state_across_calls(smi):
    query = ("--query-gpu=persistence_mode", "--format=csv,noheader")
    assert smi(*query).stdout == "Disabled\n"
    assert smi("-pm", "1").stdout == "Enabled persistence mode for GPU 0000000F:01:00.0.\nAll done.\n"
    assert "already Enabled" in smi("-pm", "ENABLED").stdout
    assert smi(*query).stdout == "Enabled\n"
    assert "  On  |" in smi().stdout.splitlines()[8]
    smi("-pm", "0")
    assert smi(*query).stdout == "Disabled\n"


def test_state_is_lost_when_run_is_emptied_like_a_reboot(smi):
    smi("-pm", "1")
    smi("-lgc", "0,2300")
    assert sm_clock(smi) < 2300
    shutil.rmtree(smi.state)  # /run is a tmpfs: a restart empties it
    assert sm_clock(smi) == STOCK
    assert smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout == "Disabled\n"


def test_latched_gpu_sticks_under_1000_mhz(smi):
    smi.state.mkdir(parents=True)
    (smi.state / "latched").touch()
    assert sm_clock(smi) < 1000
    smi("-rgc")
    assert sm_clock(smi) < 1000  # a reset does not help: it needs an AC power cycle
    (smi.state / "latched").unlink()
    assert sm_clock(smi) == STOCK


# ---- errors and exit codes like the real tool -------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "rc", "message"),
    [
        (
            ("--query-gpu=clocks.bogus", "--format=csv"),
            2,
            'Field "clocks.bogus" is not a valid field to query.',
        ),
        (("--query-gpu=clocks.sm",), 2, "Invalid combination of input arguments"),
        (("--query-gpu=clocks.sm", "--format=json"), 2, "is not a valid format"),
        (("-lgc", "fast"), 2, "Invalid clock value"),
        (("-lgc", "2300,100"), 2, "greater than the maximum"),
        (("-pm", "2"), 2, "Invalid combination"),
        (("-i", "3", "-L"), 6, "No devices were found"),
        (("--frobnicate",), 2, "Invalid combination"),
        (("-q", "-d", "NOPE"), 2, "is not a valid display type"),
    ],
)
def test_bad_input_fails_like_the_real_tool(smi, args, rc, message):
    proc = smi(*args, check=False)
    assert proc.returncode == rc
    assert message in proc.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(SIM, os.R_OK), reason="needs root to drop to an unprivileged user"
)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-pm", "1"), "Insufficient Permissions"),
        (("-lgc", "0,2300"), "does not have permission to change clocks"),
        (("-rgc",), "does not have permission to change clocks"),
    ],
)
def test_changes_need_root(smi, args, message):
    smi.state.mkdir(parents=True)
    smi.state.chmod(0o777)
    proc = smi(*args, user="nobody", check=False)
    assert proc.returncode == 4
    assert message in proc.stdout
    assert "Terminating early due to previous errors." in proc.stdout
    assert (
        smi("--query-gpu=clocks.sm,persistence_mode", "--format=csv,noheader").stdout
        == f"{STOCK} MHz, Disabled\n"
    )
    assert smi("-L", user="nobody").returncode == 0  # queries do not need root


def test_as_unprivileged_user_when_not_root(smi):
    if os.geteuid() == 0:
        pytest.skip("covered by test_changes_need_root")
    proc = smi("-lgc", "0,2300", check=False)
    assert proc.returncode == 4


# ---- compute processes: the engine -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        (["tensorfold", "serve", "/w"], True),
        (["/usr/bin/python3", "/usr/local/bin/tensorfold", "serve", "/w"], True),  # a console script
        (["python3", "-u", "-m", "tensorfold", "serve"], True),
        (["/sbin/docker-init", "--", "tensorfold", "serve"], False),
        (["/usr/bin/earlyoom", "--prefer", "(^|/)(tensorfold)$"], False),
        (["docker", "run", "img", "tensorfold", "serve"], False),
        (["sh", "-c", "tensorfold serve"], False),
        (["python3", "-c", "import tensorfold"], False),
        ([], False),
    ],
)
def test_what_counts_as_the_engine(argv, engine):
    sys.path.insert(0, str(SIM.parent))
    import nvidia_smi

    assert nvidia_smi.runs_engine(argv) is engine


def test_engine_processes_are_the_gpu_compute_apps(smi, tmp_path):
    engine = tmp_path / "tensorfold"
    shutil.copy("/bin/sleep", engine)
    wrapper = subprocess.Popen(["sh", "-c", f"exec sleep 30 # {engine}"])
    proc = subprocess.Popen([str(engine), "30"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            out = smi(
                "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader",
                proc=Path("/proc"),
            ).stdout
            if str(proc.pid) in out:
                break
            time.sleep(0.1)
        assert f"{proc.pid}, {engine}, [N/A]\n" in out
        assert str(wrapper.pid) not in out  # a shell or docker CLI naming it is not a GPU process
        table = smi(proc=Path("/proc")).stdout
        row = next(line for line in table.splitlines() if f" {proc.pid}      C   " in line)
        assert "tensorfold" in row and row.endswith("N/A |") and len(row) == 91
        assert "No running processes found" not in table
        busy = smi(
            "--query-gpu=clocks_event_reasons.gpu_idle,pstate", "--format=csv,noheader", proc=Path("/proc")
        ).stdout
        assert busy == "Not Active, P0\n"
    finally:
        proc.kill()
        wrapper.kill()
        proc.wait()
        wrapper.wait()
    header = smi("--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv").stdout
    assert header == "pid, process_name, used_gpu_memory [MiB]\n"
