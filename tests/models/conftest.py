"""Fixtures shared by the model-layer tests."""
from __future__ import annotations

import pytest

import ggmlpy as g


DEVICES = {"cpu": "cpu", "vulkan": "Vulkan0", "cuda": "CUDA0"}


@pytest.fixture(params=sorted(DEVICES))
def each_device(request):
    """"cpu", "Vulkan0" or "CUDA0" for ggml_compile(backend=): a GPU skipped, saying why, when its backend is not
    built in this installation or the machine has no such device (CI runs Vulkan on Mesa's lavapipe)."""
    family = request.param
    if family == "cpu":
        return "cpu"
    if family not in g.ggml_backends_built():
        pytest.skip(f"the {family} backend is not built in this installation (GGMLPY_BACKENDS)")
    if g.ggml_backend_dev_by_name(DEVICES[family]) is None:
        pytest.skip(f"the {family} backend is built but this machine has no {DEVICES[family]} device")
    return DEVICES[family]


@pytest.fixture
def device(each_device):
    """``each_device``, by the name the layer tests give their backend argument."""
    return each_device


@pytest.fixture(scope="module")
def one_cpu_thread():
    """Tiny models on a shared 2-core machine: one CPU thread for the module (ggml's per-node thread barriers made
    one step of a 150-layer test model take ~1 s instead of ~0.05 s under load). Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_cpu_thread")``."""
    before = g.ggml_get_n_threads()
    g.ggml_set_n_threads(1)
    yield
    g.ggml_set_n_threads(before)
