"""The lab's double of TensorFold's `tensorfold serve` (deepseek_v41 family on CUDA), without GPU or model.

Which real version it behaves as is fixed by `_build.ENGINE` (one git branch per version in the lab's
repository); `versions.py` says what each version is and which public source it was checked against.
"""

from ._build import ENGINE, REVISION
from .versions import get as _get


def _version() -> str:
    base = _get(ENGINE).version
    if not REVISION:
        return base
    return f"{base}.lab{REVISION}" if "+" in base else f"{base}+lab{REVISION}"


__version__ = _version()
