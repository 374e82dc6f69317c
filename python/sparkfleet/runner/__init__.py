"""Run one playbook through ansible-runner and reduce its events to a `RunResult`.

One module per concern:
  project    the checkout, the playbook and inventories in it, one private data dir per run
  run        one run: environment, ansible-playbook options, ansible-runner's invocation
  events     ansible-runner events -> per-host stats, failures, timings, set_stats data
  interrupt  Ctrl-C: ask ansible to stop, then have it killed; stop what it left running
  secrets    what never reaches the artifacts: secret extravars and environment, passwords
  result     RunResult and its parts, the --json document, exit codes
"""

from sparkfleet.runner.events import Collector
from sparkfleet.runner.interrupt import INTERRUPT_GRACE_S, Interrupt
from sparkfleet.runner.project import (
    DEFAULT_KEEP_RUNS,
    find_project,
    is_project,
    keep_runs,
    make_run_dir,
    new_run_dir,
    prune_runs,
    run_name,
    runs_root,
)
from sparkfleet.runner.result import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    SCHEMA_FILE,
    SCHEMA_ID,
    SCHEMA_VERSION,
    STATUS_BY_EXIT,
    Failure,
    HostStats,
    RunnerError,
    RunResult,
    TaskTiming,
    exit_code_for,
)
from sparkfleet.runner.run import (
    LISTING_FLAGS,
    STRATEGIES,
    AnsibleOptions,
    fact_cache_env,
    run_playbook,
    runner_env,
    strategy_env,
)
from sparkfleet.runner.secrets import (
    REDACTED,
    SECRET_ENV_RE,
    SECRET_NAME_RE,
    Passwords,
    redact_tree,
    scrub_command_file,
    secret_values,
    secret_vars_file,
    split_secrets,
)

__all__ = [
    "DEFAULT_KEEP_RUNS",
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNREACHABLE",
    "INTERRUPT_GRACE_S",
    "LISTING_FLAGS",
    "REDACTED",
    "SCHEMA_FILE",
    "SCHEMA_ID",
    "SCHEMA_VERSION",
    "SECRET_ENV_RE",
    "SECRET_NAME_RE",
    "STATUS_BY_EXIT",
    "STRATEGIES",
    "AnsibleOptions",
    "Collector",
    "Failure",
    "HostStats",
    "Interrupt",
    "Passwords",
    "RunResult",
    "RunnerError",
    "TaskTiming",
    "exit_code_for",
    "fact_cache_env",
    "find_project",
    "is_project",
    "keep_runs",
    "make_run_dir",
    "new_run_dir",
    "prune_runs",
    "redact_tree",
    "run_name",
    "run_playbook",
    "runner_env",
    "runs_root",
    "scrub_command_file",
    "secret_values",
    "secret_vars_file",
    "split_secrets",
    "strategy_env",
]
