"""Fixtures of the arm64 VM lab's scenario (molecule/vm_arm64; SPARKFLEET_LAB names a lab of
`sparkfleet lab up --vm --arch arm64`): the VmLab and what its disk recorded of the 16K kernel."""

from __future__ import annotations

import os

import pytest
from sparkfleet_lab.vm import image
from sparkfleet_lab.vm.lab import VmLab, is_vm_lab


@pytest.fixture(scope="session")
def lab() -> VmLab:
    name = os.environ.get("SPARKFLEET_LAB")
    if not name:
        pytest.skip("SPARKFLEET_LAB is not set: these tests need `sparkfleet lab up --vm --arch arm64`")
    if not is_vm_lab(name):
        pytest.skip(f"{name!r} is not a VM lab (sparkfleet lab up --vm --arch arm64 --name {name})")
    lab = VmLab(name=name)
    if lab.arch != "arm64":
        pytest.skip(f"{name!r} is an {lab.arch} VM lab, not arm64")
    lab.wait_ssh("spark1")
    return lab


@pytest.fixture(scope="session")
def kernel_16k() -> dict:
    """{release, package, version} of the 16K kernel in the image's local apt repository."""
    return image.image_info("arm64")["kernel_16k"]
