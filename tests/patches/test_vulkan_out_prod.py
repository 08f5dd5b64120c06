"""patches/0043-0045: Vulkan's backward matrix products (OUT_PROD) on ggml's tiled matmul shaders or on our blocked
kernel (4 x 4 outputs per invocation, long sums cut into slices), F32 operands of the general product staged as F32,
and forward products of a few columns of short sums on the tiled shaders.

OUT_PROD(a, b) runs as MUL_MAT(a^T, b^T) for products large enough on a GPU, on out_prod_blocked.comp otherwise and
on a CPU device (lavapipe); ``GGMLPY_VK_OUT_PROD=matmul``, ``=blocked`` or ``=sliced`` (blocked, every sum in
slices) forces one, ``=naive`` keeps upstream's out_prod.comp. Every path is checked against numpy float64 and
against ggml's CPU kernel on random shapes: src1 contiguous, transposed (the gradient of a product's second
operand is ``out_prod(src0, transpose(grad))``) and permuted, src0 broadcast along dims 2 and 3, thin and wide
products. The environment variable is read once per process, so each mode runs in its own interpreter.

Tolerance, per device: the terms are float32 products summed in float32 in another order than numpy's float64 sum,
so an element is within 1e-5 of the terms' magnitude (the square root of the sum of squared terms), the CPU's kernel
included; for sums of more than ~4000 terms within 4 u sqrt(K) of it (u = 2^-24: rounding errors of a K-term float32
sum add up like a random walk, and the CPU's sequential sum of 78400 terms is 1.7e-5 off); on lavapipe and on GPU
drivers alike (no approximate operation is involved: multiply and add only, no F16 rounding since F16 arithmetic is
off in ggmlpy by default).
"""
from __future__ import annotations

import json
import textwrap

import pytest

import ggmlpy as g
from tests.helpers.subprocesses import run_in_subprocess


pytestmark = pytest.mark.vulkan  # every case computes on Vulkan0

# (M outputs along ne0, N along ne1, K terms, a's dims 2 and 3, b's dims 2 and 3, src1's layout)
CASES = [
    (5, 7, 3, (1, 1), (1, 1), "contiguous"),        # thin: out_prod.comp by default
    (64, 98, 32, (1, 1), (1, 1), "transposed"),     # a product's second-operand gradient
    (96, 33, 40, (1, 1), (1, 1), "contiguous"),     # a weight gradient: out_prod(x, grad)
    (17, 129, 65, (1, 1), (1, 1), "permuted"),
    (48, 40, 24, (2, 1), (4, 1), "contiguous"),     # src0 broadcast along dim 2
    (32, 24, 16, (1, 2), (3, 2), "transposed"),     # batched along dims 2 and 3
    (300, 700, 90, (1, 1), (1, 1), "transposed"),   # many tiles
    (8, 8, 512, (1, 1), (1, 1), "contiguous"),      # long sums: split-k
    (6, 5, 9, (3, 2), (3, 2), "permuted"),          # odd blocks on every edge, batched
]
# sums longer than lavapipe's 65535 loop iterations (a convolution kernel's gradient over 100 x 28 x 28 positions):
# upstream's out_prod.comp (GGMLPY_VK_OUT_PROD=naive) stops there on lavapipe, so those run on the other kernels
LONG = [
    (9, 8, 78400, (1, 1), (1, 1), "transposed"),
    (3, 1, 70001, (1, 1), (1, 1), "contiguous"),
    (40, 16, 66000, (1, 1), (1, 1), "transposed"),
    (3, 3, 2_100_000, (1, 1), (1, 1), "contiguous"),   # 14000 slices: the reduce's 4 loops stay under the limit
]

SCRIPT = textwrap.dedent("""
    import json, numpy as np, ggmlpy as g
    from tests.helpers.compute import compute
    vk, cpu = g.ggml_backend_init_by_name("Vulkan0"), g.ggml_backend_cpu_init()
    out = []
    for m, n, k, (a2, a3), (b2, b3), layout in {cases}:
        rng = np.random.default_rng(m * n + k)
        a = rng.normal(size=(a3, a2, k, m)).astype(np.float32)          # ggml [m, k, a2, a3]
        b = rng.normal(size=(b3, b2, k, n)).astype(np.float32)          # ggml [n, k, b2, b3], as the op reads it
        if layout == "transposed":                                       # stored [k, n]: transpose gives [n, k]
            stored = np.ascontiguousarray(np.swapaxes(b, 2, 3))
            build = lambda ctx, ta, tb: g.ggml_out_prod(ctx, ta, g.ggml_transpose(ctx, tb))
        elif layout == "permuted":                                       # stored [b2, n, k]: permuted to [n, k, b2]
            stored = np.ascontiguousarray(np.transpose(b, (0, 2, 3, 1)))
            build = lambda ctx, ta, tb: g.ggml_out_prod(ctx, ta, g.ggml_permute(ctx, tb, 2, 0, 1, 3))
        else:
            stored = b
            build = lambda ctx, ta, tb: g.ggml_out_prod(ctx, ta, tb)
        (got,) = compute(build, a, stored, backend=vk)
        (on_cpu,) = compute(build, a, stored, backend=cpu)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        ra, rb = b3 // a3, b2 // a2
        want = np.empty((b3, b2, n, m))
        scale = np.empty_like(want)
        for i3 in range(b3):
            for i2 in range(b2):
                x, y = a64[i3 // ra, i2 // rb], b64[i3, i2]                # [k, m], [k, n]
                want[i3, i2] = y.T @ x
                scale[i3, i2] = np.sqrt((y.T ** 2) @ (x ** 2))
        bound = max(1e-5, 4 * 2.0 ** -24 * np.sqrt(k)) * scale + 1e-6
        got, on_cpu = got.reshape(want.shape), on_cpu.reshape(want.shape)
        out.append([float(np.max(np.abs(got - want) / bound)), float(np.max(np.abs(on_cpu - want) / bound)),
                    float(np.max(np.abs(got - on_cpu) / bound))])
    print("RESULT" + json.dumps(out))
""")


def _require_vulkan():
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs the Vulkan backend and a Vulkan0 device (CI: Mesa's lavapipe)")


@pytest.mark.parametrize("mode", ["default", "matmul", "naive", "blocked", "sliced"])
def test_out_prod_agrees_with_numpy_and_the_cpu_on_every_kernel(mode):
    """Every kernel (the default choice, the tiled matmul, upstream's out_prod.comp, patches/0045's blocked kernel
    with its sums whole and cut into slices) on every case; the long sums on all but upstream's kernel."""
    _require_vulkan()
    env = {} if mode == "default" else {"GGMLPY_VK_OUT_PROD": mode}
    cases = CASES if mode == "naive" else CASES + LONG
    rc, out, err = run_in_subprocess(SCRIPT.format(cases=repr(cases)), timeout=600, env=env)
    assert rc == 0, err[-2000:]
    results = json.loads(out.split("RESULT", 1)[1])
    assert len(results) == len(cases)
    for case, (vs_numpy, cpu_vs_numpy, vs_cpu) in zip(cases, results):
        # each a ratio to the bound: within it below 1
        assert vs_numpy < 1 and cpu_vs_numpy < 1 and vs_cpu < 2, (mode, case, vs_numpy, cpu_vs_numpy, vs_cpu)


PERMUTED = textwrap.dedent("""
    import numpy as np, ggmlpy as g
    from tests.helpers.compute import compute
    vk = g.ggml_backend_init_by_name("Vulkan0")
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 20, 64)).astype(np.float32)         # ggml [64, 20, 3]
    b = rng.normal(size=(12, 3, 64)).astype(np.float32)         # ggml [64, 3, 12], permuted to [64, 12, 3]
    (got,) = compute(lambda ctx, ta, tb: g.ggml_mul_mat(ctx, ta, g.ggml_permute(ctx, tb, 0, 2, 1, 3)), a, b,
                     backend=vk)
    want = np.einsum("bik,jbk->bji", a.astype(np.float64), b.astype(np.float64))
    print("ERROR", float(np.abs(got.reshape(want.shape) - want).max() / np.abs(want).max()))
""")


def test_a_product_of_a_permuted_f32_operand_stays_f32():
    """Upstream's general product rounds a permuted F32 operand to F16 on the way to its shaders (2e-4 off
    float64 here); with F16 arithmetic off it is staged as F32 and agrees with float64 as a contiguous one does."""
    _require_vulkan()
    rc, out, err = run_in_subprocess(PERMUTED, timeout=120)
    assert rc == 0, err[-2000:]
    assert float(out.split("ERROR", 1)[1]) < 2e-6, out


SHORT_SUMS = textwrap.dedent("""
    import numpy as np, ggmlpy as g
    from tests.helpers.compute import compute
    vk = g.ggml_backend_init_by_name("Vulkan0")
    worst = 0.0
    for k, m, n in [(9, 7840, 8), (9, 7840, 1), (72, 1960, 2), (255, 300, 8), (256, 300, 8), (9, 100, 9)]:
        rng = np.random.default_rng(k + m + n)
        a, b = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
        (got,) = compute(lambda ctx, ta, tb: g.ggml_mul_mat(ctx, ta, tb), a, b, backend=vk)
        want = b.astype(np.float64) @ a.astype(np.float64).T
        scale = np.sqrt((b.astype(np.float64) ** 2) @ (a.astype(np.float64) ** 2).T)
        worst = max(worst, float(np.max(np.abs(got.reshape(want.shape) - want) / (1e-5 * scale + 1e-6))))
    print("WORST", worst)
""")


def test_products_of_a_few_columns_of_short_sums_are_right():
    """patches/0044: 2 to 8 columns of sums shorter than 256 terms (a convolution's forward product) take the
    tiled product instead of the matrix-vector shaders; one column and longer sums keep them. Every case against
    numpy float64 within the float32 bound above."""
    _require_vulkan()
    rc, out, err = run_in_subprocess(SHORT_SUMS, timeout=120)
    assert rc == 0, err[-2000:]
    assert float(out.split("WORST", 1)[1]) < 1, out
