"""patches/0055: CLAMP's backward pass, against numpy's derivative of a clamp and central finite differences, with
finite and infinite bounds, on the CPU and on Vulkan (Vulkan's gradient against the CPU's kernel too).

The gradient is d/dx sum(clamp(x, lo, hi) * r) = r where lo < x < hi, else 0. The inputs keep away from the bounds
(by 1e-3, where finite differences of step 1e-5 cannot cross them), so both references are exact; the tolerance
is float32's rounding of r (the gradient is a copy of r or 0)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute_grad
from tests.helpers.gradients import fd_grad


def _device(name: str):
    if name == "cpu":
        return G.ggml_backend_cpu_init()
    if "vulkan" not in G.ggml_backends_built() or G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan0 device (the vulkan backend not built, or no Vulkan driver: Mesa's lavapipe in CI)")
    return G.ggml_backend_init_by_name("Vulkan0")


@pytest.mark.parametrize("device", ["cpu", "vulkan"])
@pytest.mark.parametrize("lo, hi", [(-0.5, 0.7), (-math.inf, 0.2), (-0.3, math.inf), (0.1, 0.1)])
def test_the_gradient_of_a_clamp_passes_inside_the_bounds_only(device, lo, hi):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1.5, 1.5, (5, 7)).astype(np.float32)
    for bound in (lo, hi):   # no element within 1e-3 of a finite bound
        if math.isfinite(bound):
            near = np.abs(x - bound) < 1e-3
            x[near] = bound + 2e-3
    r = rng.uniform(-1, 1, (5, 7)).astype(np.float32)
    backend = _device(device)
    try:
        loss, grad = compute_grad(lambda c, t: G.ggml_clamp(c, t, lo, hi), x, r, backend=backend)
    finally:
        backend.free()
    want = np.where((x > lo) & (x < hi), r, 0.0)
    np.testing.assert_allclose(grad, want, rtol=0, atol=1e-7)
    np.testing.assert_allclose(grad, fd_grad(lambda z: np.clip(z, lo, hi), x, r), rtol=0, atol=1e-6)
    assert loss == pytest.approx(float(np.sum(np.clip(x.astype(np.float64), lo, hi) * r)), rel=1e-5)
