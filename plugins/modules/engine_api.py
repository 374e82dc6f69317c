#!/usr/bin/python3
# sparkfleet: the engine's OpenAI-compatible API seen from the head (stdlib only; runs on the node).
from __future__ import annotations

DOCUMENTATION = r"""
module: engine_api
short_description: Probe, wait for, or verify the engine's OpenAI-compatible API with real requests
description:
  - >-
    C(probe) reads C(/health) and C(/v1/models) once. Ready means C(/health) answers 200 with C({"ok": true})
    (C({"status": "ok"}) with API keys on) and C(/v1/models) lists the served model (TensorFold opens its
    port only once the model is loaded, so a closed port while the container runs means C(loading)).
  - >-
    C(wait) probes until the API is ready or I(wait_s) passed; it reports what it waits for in
    C(sparkfleet_progress) (while loading, C(loading, N min of the ~M the first start takes) and rank 0's
    latest log line) and fails at once (C(fatal)) when rank 0's container stopped, with the engine's own
    message from its log. Use it in an C(until) loop for long waits with progress.
  - >-
    C(verify) sends real requests and times each one; I(checks) are the engine profile's - C(models),
    C(auth) (a request without the key gets the engine's 401), C(chat) (17x19 = 323, thinking off),
    C(stream), C(tool) and C(json_schema) (a forced tool call and a JSON-schema output, checked against
    their schemas), C(tool_refused) and C(json_schema_refused) (an engine that refuses them answers 400).
  - >-
    The API key is read from I(api_key_file) on the node and never returned.
options:
  action: {type: str, choices: [probe, wait, verify], default: probe, description: What to do.}
  url: {type: str, required: true, description: "Base URL of the API, e.g. http://127.0.0.1:8888 (no /v1)."}
  model: {type: str, required: true, description: Served model name.}
  api_key_file: {type: path, description: File of accepted keys; the first one is sent as the bearer token.}
  timeout: {type: float, default: 120, description: Seconds per request.}
  wait_s: {type: float, default: 30, description: "action=wait: how long this call waits before it returns."}
  interval_s: {type: float, default: 2, description: "action=wait: seconds between probes."}
  container: {type: str, description: "action=wait: rank 0's container; its exit ends the wait at once."}
  unit: {type: str, description: "action=wait: rank 0's systemd unit; its failure ends the wait at once."}
  docker: {type: str, default: docker, description: The docker CLI (for I(container)).}
  log_rules: {type: dict, default: {}, description: "The engine profile's log lines (engine_node's option)."}
  first_start_minutes: {type: int, default: 15, description: "How long a first start takes (progress)."}
  checks:
    type: list
    elements: str
    default: [models, chat, stream]
    description: Which verify checks to run, in order (the engine profile's C(verify)).
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Wait for the API to be ready (one call waits up to wait_s; loop for longer)
  sparkfleet.cluster.engine_api:
    action: wait
    url: http://127.0.0.1:18002
    model: deepseek-v4.1-flash
    api_key_file: /etc/sparkfleet/api-keys
    wait_s: 60
    container: sparkfleet-engine
  register: api
  until: api.ready
  retries: 30

- name: Send the verify requests
  sparkfleet.cluster.engine_api:
    action: verify
    url: http://127.0.0.1:18002
    model: deepseek-v4.1-flash
    api_key_file: /etc/sparkfleet/api-keys
"""

RETURN = r"""
ready: {description: /health is 200 with ok true and the model is listed, type: bool, returned: probe, wait}
state: {description: "ok, loading, down, unauthorized or error", type: str, returned: probe, wait}
detail: {description: What the API (or rank 0's log) said, type: str, returned: probe, wait}
health: {description: The /health document, type: dict, returned: probe, wait}
models: {description: Model ids from /v1/models, type: list, returned: probe, wait}
log: {description: "rank 0's log summary (engine_node's C(log))", type: dict, returned: wait}
checks:
  description: "verify: one entry per check: name, ok, latency_ms, result, detail"
  type: list
  returned: verify
table: {description: "verify: the checks as printable lines", type: list, returned: verify}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_checks import CHECKS, table, verify
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_client import (
    ApiError,
    Client,
    read_key,
)
from ansible_collections.sparkfleet.cluster.plugins.module_utils.engine_ready import Rank0, probe, wait
from ansible_collections.sparkfleet.cluster.plugins.module_utils.json_schema import schema_errors

# The HTTP client (module_utils/engine_client.py), the readiness wait (engine_ready.py), the checks
# (engine_checks.py) and the JSON-schema subset (json_schema.py) are module_utils; tests import them here.
__all__ = ["CHECKS", "Client", "Rank0", "main", "probe", "schema_errors", "table", "verify", "wait"]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["probe", "wait", "verify"], "default": "probe"},
            "url": {"type": "str", "required": True},
            "model": {"type": "str", "required": True},
            "api_key_file": {"type": "path"},
            "timeout": {"type": "float", "default": 120},
            "wait_s": {"type": "float", "default": 30},
            "interval_s": {"type": "float", "default": 2},
            "container": {"type": "str"},
            "unit": {"type": "str"},
            "docker": {"type": "str", "default": "docker"},
            "log_rules": {"type": "dict", "default": {}},
            "first_start_minutes": {"type": "int", "default": 15},
            "checks": {"type": "list", "elements": "str", "default": ["models", "chat", "stream"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    unknown = [c for c in p["checks"] if c not in CHECKS]
    if unknown:
        module.fail_json(msg=f"unknown checks {unknown}; known: {list(CHECKS)}")
    try:
        key = read_key(p["api_key_file"])
    except (OSError, ApiError) as exc:
        why = f"cannot read the API key file: {exc}"
        module.fail_json(msg=why, fatal=True, ready=False, state="error", detail=why)
    client = Client(p["url"], key, p["timeout"])
    if p["action"] == "probe":
        module.exit_json(changed=False, **probe(client, p["model"]))
    if p["action"] == "wait":
        docker = module.get_bin_path(p["docker"]) or p["docker"]
        rank0 = Rank0(docker, p["container"], p["unit"], p["log_rules"], p["first_start_minutes"])
        state = wait(client, p["model"], wait_s=p["wait_s"], interval_s=p["interval_s"], rank0=rank0)
        module.exit_json(changed=False, msg=state["sparkfleet_progress"], **state)
    checks = verify(client, p["model"], p["checks"])
    lines = table(checks)
    module.exit_json(
        changed=False,
        checks=checks,
        table=lines,
        passed=sum(c["ok"] for c in checks),
        failed_checks=[c["name"] for c in checks if not c["ok"]],
        msg=lines[-1],
    )


if __name__ == "__main__":
    main()
