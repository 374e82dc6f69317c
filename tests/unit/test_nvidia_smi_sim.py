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
        python, sim = sys.executable, SIM
        if user is not None:
            python = UNPRIVILEGED_PYTHON
            # the checkout may sit in a directory only root can enter (a clone under mktemp -d): the user
            # runs a copy of the same file from the test's own 0755 directory (the simulator is one file)
            sim = top / SIM.name
            if not sim.exists():
                shutil.copy2(SIM, sim)
                sim.chmod(0o755)
            pw = pwd.getpwnam(user)

            def drop() -> None:
                os.setgid(pw.pw_gid)
                os.setuid(pw.pw_uid)

            kwargs["preexec_fn"] = drop
        argv = [python, "-S", str(sim), *args]  # -S: standard library only, as on a node's own Python
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, **kwargs)
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


# ---- clock state: idle, load, power-capped load, latched under load ------------------------------------
IDLE = 345  # the simulator's idle clock: the H200 recording's (query-idle-and-load.txt)
LOAD = 2418  # under load without a lock: GB10's applications clock, in the reported 2359-2520 MHz
CLOCK_QUERY = (
    "--query-gpu=clocks.sm,clocks_event_reasons.active,utilization.gpu,pstate",
    "--format=csv,noheader,nounits",
)


def clocks(smi) -> tuple[int, int, int, str]:
    """(SM MHz, clock event reason bits, utilization %, pstate) as the real tool prints them."""
    sm, reasons, util, pstate = (v.strip() for v in smi(*CLOCK_QUERY).stdout.split(","))
    assert re.fullmatch(r"0x[0-9A-F]{16}", reasons), reasons
    return int(sm), int(reasons, 16), int(util), pstate


def switch(smi, name: str, content: str = "") -> None:
    smi.state.mkdir(parents=True, exist_ok=True)
    (smi.state / name).write_text(content)


def test_idle_drops_the_clock_and_says_gpu_idle(smi):
    assert clocks(smi) == (IDLE, 0x1, 0, "P8")  # a public GB10 table: P8, 0 % idle
    assert "Idle                                           : Active" in smi("-q", "-d", "PERFORMANCE").stdout
    smi("-lgc", "0,2300")  # a lock does not raise an idle clock
    assert clocks(smi) == (IDLE, 0x1, 0, "P8")
    switch(smi, "idle-mhz", "968\n")  # GB10's own idle clock is not recorded: the switch tries others
    assert clocks(smi)[:2] == (968, 0x1)
    switch(smi, "idle-mhz", "2502\n")
    sm, reasons, _util, _pstate = clocks(smi)
    assert 2270 <= sm < 2300 and reasons == 0x1 | 0x2  # an idle clock above the cap is held by the lock


def test_load_runs_at_the_power_capped_clock_and_counts_the_capping(smi):
    switch(smi, "load")
    assert clocks(smi) == (LOAD, 0x4, 96, "P0")  # the H200 recording under load: reason 0x4 SW power cap
    time.sleep(0.05)
    q = smi("-q", "-d", "PERFORMANCE").stdout
    assert "SW Power Cap                                   : Active" in q
    capping = int(re.search(r"SW Power Capping\s+: (\d+) us", q).group(1))
    assert capping > 0  # the cumulative counter grows while the power budget holds the clock
    (smi.state / "load").unlink()
    assert clocks(smi) == (IDLE, 0x1, 0, "P8")
    assert "SW Power Capping                               : 0 us" in smi("-q", "-d", "PERFORMANCE").stdout


def test_power_capped_load_holds_the_clock_under_a_higher_cap(smi):
    switch(smi, "load", "1500\n")  # the H200 recording: 1485-1500 MHz under a matmul, reason 0x4
    assert clocks(smi)[:2] == (1500, 0x4)
    smi("-lgc", "0,2100")  # the power budget holds it lower than the lock
    assert clocks(smi)[:2] == (1500, 0x4)
    smi("-lgc", "0,1300")  # now the lock does: applications clocks setting
    assert clocks(smi)[:2][1] == 0x2 and 1270 <= clocks(smi)[0] < 1300


def test_a_lock_lands_slightly_below_the_request_under_load_and_reset_restores_the_power_clock(smi):
    switch(smi, "load")
    out = smi("-lgc", "0,2100").stdout
    assert 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2100)"' in out
    sm, reasons, _util, _pstate = clocks(smi)
    assert 2060 <= sm < 2100 and reasons == 0x2  # a lock shows as an applications clocks setting
    smi("-lgc", "0,2300")
    assert 2270 <= clocks(smi)[0] < 2300
    assert smi("-rgc").stdout == "All done.\n"
    assert clocks(smi)[:2] == (LOAD, 0x4)
    smi("-lgc", "1500")  # a single value locks min = max
    assert 1470 <= clocks(smi)[0] < 1500
    (smi.state / "load").unlink()
    assert clocks(smi)[:2] == (IDLE, 0x1)  # the lower end raises nothing (not recorded on a GB10)


def test_a_ceiling_above_the_power_clock_changes_nothing(smi):
    switch(smi, "load")
    smi("-lgc", "3003,3003")  # accepted, as on a real GB10 (colonel-otto's -lgc 3003,3003), and ignored
    assert clocks(smi)[:2] == (LOAD, 0x4)


def test_max_clock_is_3003_whatever_the_state_and_the_lock_range_is_never_reported(smi):
    smi("-lgc", "1187,2157")
    lock_range = re.compile(r"(?<![\w-])(1187|2157)(?![\w-])")  # either end, not inside a uuid or serial
    for state in ("idle", "load", "latched"):
        if state != "idle":
            switch(smi, state)
        assert smi("--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits").stdout == "3003\n"
        everything = ",".join(sorted(n for n in nvidia_smi_fields() if n != "timestamp"))
        texts = [smi(f"--query-gpu={everything}", "--format=csv").stdout, smi("-q").stdout, smi().stdout]
        texts.append(smi("-q", "-d", "CLOCK,PERFORMANCE,SUPPORTED_CLOCKS").stdout)
        for text in texts:
            assert not lock_range.search(text), (state, lock_range.search(text))


def nvidia_smi_fields() -> list[str]:
    sys.path.insert(0, str(SIM.parent))
    import nvidia_smi

    return list(nvidia_smi.GPU_FIELDS)


def test_memory_and_power_limits_answer_not_available_as_gb10_does(smi):
    fields = "memory.total,memory.used,memory.free,power.limit,enforced.power.limit,power.max_limit"
    assert smi(f"--query-gpu={fields}", "--format=csv,noheader").stdout == ", ".join(["[N/A]"] * 6) + "\n"
    assert smi("--query-gpu=clocks.mem", "--format=csv,noheader").stdout == "[N/A]\n"


def test_a_gpu_that_ignores_the_lock_answers_success_and_keeps_its_clock(smi):
    switch(smi, "load")
    switch(smi, "ignore-lock")
    out = smi("-lgc", "0,2300")
    assert out.returncode == 0 and 'GPU clocks set to "(gpuClkMin 0, gpuClkMax 2300)"' in out.stdout
    assert clocks(smi)[:2] == (LOAD, 0x4)  # above the cap: -lgc reported success without pinning
    (smi.state / "ignore-lock").unlink()
    assert clocks(smi)[0] < 2300  # the recorded lock holds once the GPU honours it


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
    switch(smi, "load")
    assert clocks(smi)[0] < 2300
    shutil.rmtree(smi.state)  # /run is a tmpfs: a restart empties it (the lock and the load switch)
    assert clocks(smi)[:2] == (IDLE, 0x1)
    assert smi("--query-gpu=persistence_mode", "--format=csv,noheader").stdout == "Disabled\n"


def test_latched_is_a_low_clock_under_load_and_idle_it_looks_idle(smi):
    switch(smi, "latched")
    assert clocks(smi) == (IDLE, 0x1, 0, "P8")  # idle, a latched GPU is not told from a healthy one
    switch(smi, "load")
    sm, reasons, util, pstate = clocks(smi)
    assert sm == 855 and not reasons & 0x1 and util == 96 and pstate == "P0"  # busy, and stuck low
    assert float(smi("--query-gpu=power.draw", "--format=csv,noheader,nounits").stdout) == 12.0  # 10-14 W
    smi("-rgc")
    smi("-lgc", "0,2300")
    assert clocks(smi)[0] == 855  # neither a reset nor a lock helps: it needs an AC power cycle
    (smi.state / "latched").unlink()
    assert 2270 <= clocks(smi)[0] < 2300


# ---- replay: the real tool's recorded outputs, verbatim --------------------------------------------------
GB10_REPORTS = FIXTURES.parent / "gb10-public-reports"


def test_replay_serves_the_h200_recordings_verbatim_idle_and_under_load(smi):
    switch(smi, "replay", f"{FIXTURES}\n")
    recorded = (FIXTURES / "query-idle-and-load.txt").read_text().splitlines(keepends=True)
    query = (
        "--query-gpu=index,name,persistence_mode,clocks.sm,clocks.max.sm,clocks_event_reasons.active",
        "--format=csv,noheader,nounits",
    )
    assert smi(*query).stdout == recorded[2] == "0, NVIDIA H200, Enabled, 345, 1980, 0x0000000000000001\n"
    switch(smi, "load")
    assert smi(*query).stdout == recorded[3] == "0, NVIDIA H200, Enabled, 1500, 1980, 0x0000000000000004\n"
    (smi.state / "load").unlink()
    for args, name in (((), "nvidia-smi.txt"), (("-q",), "nvidia-smi-q.txt"), (("-h",), "help.txt")):
        assert smi(*args).stdout == (FIXTURES / name).read_text()
    csv = (FIXTURES / "query-csv.txt").read_text().splitlines(keepends=True)
    assert smi(f"--query-gpu={FIXTURE_QUERY}", "--format=csv").stdout == "".join(csv[:2])


def test_replay_refuses_what_it_has_no_recording_of_and_what_the_real_tool_refuses(smi):
    switch(smi, "replay", f"{FIXTURES}\n")
    unrecorded = smi("--query-gpu=clocks.sm", "--format=csv", check=False)
    assert (
        unrecorded.returncode == 3
        and "no recording of `nvidia-smi --query-gpu=clocks.sm" in unrecorded.stdout
    )
    switch(smi, "load")
    table = smi(check=False)  # the table was recorded idle only
    assert table.returncode == 3 and "while the GPU is under load" in table.stdout
    bad = smi("--query-gpu=clocks.bogus", "--format=csv", check=False)
    assert bad.returncode == 2 and 'Field "clocks.bogus" is not a valid field to query.' in bad.stdout
    assert smi("-lgc", "2300,100", check=False).returncode == 2
    assert smi("-i", "3", "-L", check=False).returncode == 6


def test_replay_of_the_published_gb10_outputs(smi):
    switch(smi, "replay", f"{GB10_REPORTS}\n")
    assert smi().stdout == (GB10_REPORTS / "nvidia-smi.txt").read_text()
    assert "NVIDIA GB10" in smi().stdout and "P8" in smi().stdout
    ack = smi("-lgc", "3003,3003").stdout
    assert ack.startswith('GPU clocks set to "(gpuClkMin 3003, gpuClkMax 3003)" for GPU 0000000F:01:00.0')
    (smi.state / "replay").unlink()
    assert clocks(smi)[0] == IDLE  # replay changed no state: the replayed -lgc locked nothing
    assert smi("--query-gpu=clocks.max.sm", "--format=csv,noheader,nounits").stdout == "3003\n"


def test_the_simulators_own_table_has_the_published_gb10_layout(smi):
    real = (GB10_REPORTS / "nvidia-smi.txt").read_text().splitlines()
    sim = smi().stdout.splitlines()
    for ours, theirs in zip(sim[:12], real[:12], strict=True):
        assert [i for i, c in enumerate(ours) if c in "|+"] == [i for i, c in enumerate(theirs) if c in "|+"]
    assert sim[8][:41] == real[8][:41].replace(" On ", "Off ")  # persistence mode: the sim starts Off
    assert sim[8][42:] == real[8][42:]  # bus id, Disp.A, ECC N/A
    assert sim[9][:20] == real[9][:20] and sim[9][43:] == real[9][43:]  # N/A fan, 41C, P8 ... 0 %, Default


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
        == f"{IDLE} MHz, Disabled\n"
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
