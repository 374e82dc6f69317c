"""The task results of a run, collected from its events (play(..., on_event=Events())): shared by the lab
tests that read what a task said (test_host.py, test_cluster_facts.py) and the VM lab's (tests/vm, through its
conftest.py)."""

from __future__ import annotations


class Events:
    """Collects the task results of a run: results("Task name") -> {host: res}."""

    def __init__(self) -> None:
        self.items: list[dict] = []

    def __call__(self, event: dict) -> None:
        if event.get("event") in ("runner_on_ok", "runner_on_failed"):
            self.items.append(event["event_data"])

    def results(self, task: str) -> dict[str, dict]:
        return {e["host"]: e["res"] for e in self.items if e.get("task") == task}
