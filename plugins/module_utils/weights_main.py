# The weights modules' main: run_module (exit_json or fail_json) and their refusal, WeightsError.
# Standard library only: it runs on the nodes (Python 3.11-3.13), inside the hub's venv too.
from __future__ import annotations

import traceback


class WeightsError(Exception):
    pass


def run_module(module, run, known: tuple[type[Exception], ...] = (WeightsError,)) -> None:
    """exit_json with what run(params, check_mode) returns, or fail_json with its message.

    An exception of `known` is an expected refusal: its first argument is the message, a dict second
    argument more result fields. Anything else is a bug: its traceback goes with the failure.
    """
    try:
        result = run(module.params, module.check_mode)
    except known as exc:
        extra = dict(exc.args[1]) if len(exc.args) > 1 and isinstance(exc.args[1], dict) else {}
        extra.pop("msg", None)
        module.fail_json(msg=str(exc.args[0]) if exc.args else type(exc).__name__, **extra)
    except Exception as exc:
        module.fail_json(msg=f"{type(exc).__name__}: {exc}", exception=traceback.format_exc())
    module.exit_json(**result)
