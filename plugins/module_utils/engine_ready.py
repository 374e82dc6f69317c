# Is rank 0's API serving: one look at /health and /v1/models (probe), and the wait for it, which reads rank
# 0's container, unit and log to tell loading from failed (a closed port while the container runs is loading;
# an exited container or a failed unit ends the wait with why). Used by the module engine_api. Standard
# library only.
from __future__ import annotations

import json
import subprocess
import time

from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_client import (
    ApiError,
    Client,
    error_text,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_logs import (
    Patterns,
    read_logs,
    seconds_since,
    summarize,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.text_format import minutes


def probe(client: Client, model: str) -> dict:
    """One look at /health and /v1/models: ready, state, detail. A closed port is `down` (the caller
    knows whether rank 0's container runs, i.e. whether that means loading)."""
    out = {"ready": False, "state": "down", "detail": "", "health": {}, "models": []}
    try:
        status, health = client.json("/health", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out["detail"] = f"not answering: {exc}"
        return out
    out["health"] = health if isinstance(health, dict) else {}
    # the counters body says {"ok": true, ...}; with API keys on (0.6.6) /health says only {"status": "ok"}
    # (sfxnz/TensorFold src/tensorfold/cuda/http.py @ dc971a2)
    if status != 200 or not (out["health"].get("ok") is True or out["health"].get("status") == "ok"):
        body = json.dumps(health)[:160] if isinstance(health, dict) else str(health)[:160]
        out.update(state="error", detail=f"/health answered {status}: {body}")
        return out
    try:
        status, models = client.json("/v1/models", timeout=min(client.timeout, 10))
    except ApiError as exc:
        out.update(state="error", detail=f"/v1/models: {exc}")
        return out
    if status == 401:
        out.update(state="unauthorized", detail=f"/v1/models refused the API key (401): {error_text(models)}")
        return out
    ids = [m.get("id") for m in (models.get("data") or [])] if isinstance(models, dict) else []
    out["models"] = ids
    if status != 200 or model not in ids:
        out.update(state="error", detail=f"/v1/models ({status}) lists {ids}, not {model!r}")
        return out
    busy = out["health"].get("requests_running")
    out.update(
        ready=True, state="ok", detail=f"{model} served" + (f", {busy} request(s) running" if busy else "")
    )
    return out


def container_state(docker: str, name: str) -> dict | None:
    proc = subprocess.run(
        [docker, "inspect", "--format", "{{json .State}}", name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout)


def unit_state(unit: str) -> tuple[str, str]:
    """(ActiveState, last journal lines) of a systemd unit."""
    proc = subprocess.run(["systemctl", "is-active", unit], capture_output=True, text=True, check=False)
    active = proc.stdout.strip() or "unknown"
    if active in ("active", "activating", "reloading"):
        return active, ""
    journal = subprocess.run(
        ["journalctl", "--unit", unit, "--lines", "6", "--no-pager", "--output", "cat"],
        capture_output=True,
        text=True,
        check=False,
    )
    return active, journal.stdout.strip()


class Rank0:
    """Rank 0's container and log, as the wait sees them."""

    def __init__(self, docker: str, container: str | None, unit: str | None, rules: dict, first_start: int):
        self.docker, self.container, self.unit = docker, container, unit
        self.rules = Patterns(rules) if rules else None
        self.first_start = first_start

    def log(self, running: bool | None) -> dict:
        if not (self.container and self.rules):
            return {}
        return summarize(read_logs(self.docker, self.container), self.rules, rank=0, running=running)

    def look(self, state: dict, waited_s: float) -> str:
        """Why waiting longer cannot help ('' when it can). A closed port, the container running: loading."""
        info = container_state(self.docker, self.container) if self.container else None
        if info is not None and not info.get("Running") and info.get("Status") != "created":
            log = self.log(False)
            state["log"] = log
            why = log.get("fatal") or log.get("last") or "no log line"
            status, code = info.get("Status"), info.get("ExitCode")
            return f"rank 0's container {self.container} is {status} (exit {code}): {why}"
        if info is None and self.unit:
            active, journal = unit_state(self.unit)
            if active in ("failed", "inactive") and waited_s > 5:
                return f"rank 0's unit {self.unit} is {active}; its journal:\n{journal}"
            if active in ("active", "activating") and state["state"] == "down":
                state["state"] = "starting"
                state["detail"] = f"rank 0's unit {self.unit} runs; docker is creating its container"
        if state["state"] == "down" and info is not None:
            log = self.log(True)
            state["log"] = log
            running = float(seconds_since(str(info.get("StartedAt") or "")) or 0)
            state["state"] = "loading"
            state["detail"] = (
                f"loading, {minutes(running)} of the ~{self.first_start} the first start takes"
                + (f": {log['last']}" if log.get("last") else "")
            )
        return ""


def wait(client: Client, model: str, *, wait_s: float, interval_s: float, rank0: Rank0 | None = None) -> dict:
    start = time.monotonic()
    while True:
        state = probe(client, model)
        state["fatal"] = False
        if state["ready"]:
            if rank0 is not None:
                state["log"] = rank0.log(True)
                if state["log"].get("ready"):
                    state["detail"] += f"; {state['log']['ready']}"
            break
        why = rank0.look(state, time.monotonic() - start) if rank0 is not None else ""
        if why:
            state.update(fatal=True, detail=why)
            break
        # a call lasts wait_s (the role's retries x wait_s is its timeout), also when wait_s < interval_s
        left = wait_s - (time.monotonic() - start)
        if left <= 0:
            break
        time.sleep(min(interval_s, left))
    state["waited_s"] = round(time.monotonic() - start, 1)
    first = state["detail"].splitlines()[0] if state["detail"] else ""
    state["sparkfleet_progress"] = first if state["state"] == "loading" else f"{state['state']}: {first}"
    return state
