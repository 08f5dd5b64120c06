"""Fixtures of the training tests (tests/training), which run on every available backend.

``cpu`` is the backend under test (the name is historical): the CPU always, and Vulkan0 / CUDA0
where this build and machine have them; a missing one is skipped, saying why. In CI the Vulkan
device is Mesa's lavapipe (GGML_VK_VISIBLE_DEVICES=0).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


_DEVICES = {"cpu": None, "vulkan": "Vulkan0", "cuda": "CUDA0"}


@pytest.fixture(scope="session", params=list(_DEVICES))
def training_backend(request, backend):
    family = request.param
    if family == "cpu":
        yield backend
        return
    device = _DEVICES[family]
    if family not in G.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS)")
    if G.ggml_backend_dev_by_name(device) is None:
        pytest.skip(f"the {family} backend is built but this machine has no {device} device")
    b = G.ggml_backend_init_by_name(device)
    yield b
    b.free()


@pytest.fixture
def cpu(training_backend):
    """The backend under test."""
    return training_backend


@pytest.fixture
def tsched(cpu):
    s = G.ggml_backend_sched_new([cpu], parallel=False, graph_size=512)
    yield s
    s.free()


@pytest.fixture
def trng():
    return np.random.default_rng(20240607)
