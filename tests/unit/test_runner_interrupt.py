"""The two-stage Ctrl-C logic (the real end-to-end Ctrl-C run is in test_cli_runs.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from sparkfleet.runner import HostStats, Interrupt, exit_code_for


def test_nothing_to_forward_cancels_at_once() -> None:
    interrupt = Interrupt(grace=60)
    assert interrupt.cancel() is False
    interrupt._handle(signal.SIGINT, None)  # no ansible-playbook child of ours is running
    assert interrupt.interrupted and not interrupt.forwarded
    assert interrupt.cancel() is True


def test_forwarded_interrupt_waits_for_grace_then_second_ctrl_c_kills() -> None:
    # A child whose command line names ansible-playbook, so the handler forwards SIGINT to it.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(30)",
            "ansible-playbook",
        ],
        start_new_session=True,
    )
    try:
        time.sleep(0.3)
        ticks: list[int] = []
        interrupt = Interrupt(grace=60, tick=lambda: ticks.append(1))
        interrupt._handle(signal.SIGINT, None)
        assert interrupt.forwarded  # SIGINT went to the child's process group
        assert interrupt.cancel() is False  # ansible gets its grace period to stop by itself
        interrupt._handle(signal.SIGINT, None)
        assert interrupt.cancel() is True  # a second Ctrl-C: ansible-runner kills it
        assert len(ticks) == 2  # the display is refreshed on every poll
        late = Interrupt(grace=0.0)
        late._handle(signal.SIGINT, None)
        time.sleep(0.01)
        assert late.forwarded and late.cancel() is True  # grace over
    finally:
        child.kill()
        child.wait()


def test_handlers_are_restored() -> None:
    before = signal.getsignal(signal.SIGINT)
    interrupt = Interrupt()
    interrupt.install()
    assert signal.getsignal(signal.SIGINT) == interrupt._handle
    interrupt.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_exit_code_precedence() -> None:
    ok, failed, dark = HostStats(ok=1), HostStats(failed=1), HostStats(unreachable=1)
    assert exit_code_for({"a": ok}, 0, interrupted=False) == 0
    assert exit_code_for({"a": ok, "b": failed}, 2, interrupted=False) == 2
    assert exit_code_for({"a": failed, "b": dark}, 4, interrupted=False) == 4  # as ansible: unreachable wins
    assert exit_code_for({"a": ok}, 4, interrupted=False) == 1  # rc 4 without unreachable: parser error
    assert exit_code_for({"a": failed}, 2, interrupted=True) == 130
    assert exit_code_for({}, 2, interrupted=False) == 2  # e.g. any_errors_fatal without a failed count
