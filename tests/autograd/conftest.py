"""What the ag_* tests share: ``device``, each test on the CPU, on Vulkan (lavapipe in CI) and on CUDA (skipped,
saying why, where the device is missing), with that device as ag_* default for the test."""
from __future__ import annotations

import pytest

import ggmlpy as g
from tests.helpers.devices import require_gpu


@pytest.fixture(params=["cpu", "Vulkan0", "CUDA0"])
def device(request):
    if request.param != "cpu":
        require_gpu(request.param)
    before = g.ag_device(request.param)
    yield request.param
    g.ag_device(before)
