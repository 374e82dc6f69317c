"""scripts/failure-digest.sh: what CI shows of a failed molecule scenario (CI removes the labs and keeps only
the end of its output). Run on logs shaped as molecule, Ansible's yaml callback and pytest print them."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "failure-digest.sh"

BOX = "  \u2502 "  # molecule's frame around a playbook's output
ESC = "\x1b[0;31m"


def digest(tmp_path: Path, text: str) -> str:
    log = tmp_path / "tp2.log"
    log.write_text(text)
    return subprocess.run([str(SCRIPT), str(log)], capture_output=True, text=True, check=True).stdout


def test_a_failed_task_shows_its_result_but_not_its_command_times_or_copies(tmp_path):
    out = digest(
        tmp_path,
        "".join(
            f"{BOX}{ln}\n"
            for ln in [
                "TASK [Boot the lab's VMs]",
                f"{ESC}fatal: [localhost]: FAILED! => changed=true\x1b[0m",
                "  cmd:",
                "  - sparkfleet",
                "  delta: '0:10:02'",
                "  msg: non-zero return code",
                "  rc: 2",
                "  stderr: |-",
                "    sparkfleet lab: spark1: no SSH within 1800 s; the last 2 lines of its console (/x):",
                "      [  OK  ] Started a.",
                "  stderr_lines: <omitted>",
                "",
                "PLAY RECAP",
            ]
        )
        + "CRITICAL Ansible return code was 2\n",
    )
    lines = out.splitlines()
    assert lines[0].startswith("--- tp2: what failed")
    assert lines[1:] == [
        "fatal: [localhost]: FAILED! => changed=true",
        "  msg: non-zero return code",
        "  rc: 2",
        "  stderr: |-",
        "    sparkfleet lab: spark1: no SSH within 1800 s; the last 2 lines of its console (/x):",
        "      [  OK  ] Started a.",
        "CRITICAL Ansible return code was 2",
    ]


def test_retries_and_ignored_failures_are_left_out_and_failed_tests_kept(tmp_path):
    out = digest(
        tmp_path,
        f"{BOX}FAILED - RETRYING: [spark1]: Wait for the copies (720 retries left).\n"
        f"{BOX}fatal: [spark2]: FAILED! => changed=false\n"
        f"{BOX}  msg: expected by the test\n"
        f"{BOX}...ignoring\n"
        f"{BOX}TASK [next]\n"
        "FAILED tests/lab/test_engine.py::test_rank1_killed - AssertionError: assert 'failed' in 'active'\n"
        "==== 1 failed, 54 passed in 2300.00s ====\n",
    )
    assert out.splitlines()[1:] == [
        "FAILED tests/lab/test_engine.py::test_rank1_killed - AssertionError: assert 'failed' in 'active'",
        "==== 1 failed, 54 passed in 2300.00s ====",
    ]


def test_a_passing_log_gives_nothing_but_its_heading(tmp_path):
    out = digest(
        tmp_path,
        f"{BOX}FAILED - RETRYING: [spark1]: Wait until the API is ready (3 retries left).\n"
        "INFO     tp2 \u279c verify: Executed: Successful\n"
        "==== 55 passed, 27 skipped in 2329.00s ====\n",
    )
    assert out.splitlines()[1:] == []


def test_a_failed_test_line_folded_by_molecules_frame_is_joined_back(tmp_path):
    out = digest(
        tmp_path,
        f"{BOX}FAILED\n"
        f"{BOX}  ../../tests/lab/test_engine.py::test_a_restarted_w\n"
        f"{BOX}  orker_node_is_explained_then_recovered - assert False\n"
        f"{BOX}================= 1 failed, 54 passed, 27 skipped in 2328.07s (0:38:48)\n"
        f"{BOX}  ==================\n",
    )
    assert out.splitlines()[1:] == [
        "FAILED ../../tests/lab/test_engine.py::test_a_restarted_worker_node_is_explained_then_recovered"
        " - assert False",
        "================= 1 failed, 54 passed, 27 skipped in 2328.07s (0:38:48)",
    ]


def test_a_recorded_failed_verify_names_the_test_its_error_and_its_place(tmp_path):
    # tests/unit/fixtures/molecule/earlyoom-verify-failed.log: molecule's real output (colours, frame, folds)
    # of the earlyoom scenario's verify with one test made to fail on purpose (`assert 1 == 2, '...'`),
    # recorded from scripts/run-molecule.sh's .cache/molecule/earlyoom.log (the checkout's path replaced)
    recorded = Path(__file__).parent / "fixtures" / "molecule" / "earlyoom-verify-failed.log"
    out = digest(tmp_path, recorded.read_text())
    assert out.splitlines()[1:6] == [
        "test_earlyoom_runs_enabled_with_the_configured_arguments:",
        "E       AssertionError: a deliberately failing test for the failure digest:"
        " this message is long enough to be folded",
        "E       assert 1 == 2",
        "../../tests/roles/test_earlyoom.py:12: AssertionError",
        "FAILED ../../tests/roles/test_earlyoom.py::test_earlyoom_runs_enabled_with_the_configured_arguments",
    ]
    assert "CRITICAL Verifier tests failed" in out
