"""patches/0030: a matrix product on Vulkan whose weight operand is a view starting off the device's storage-buffer
offset alignment (rows k.. of a weight) is computed right, against numpy float64, on every path ggml-vulkan picks
by the number of columns (the matrix-vector shaders up to 8 columns, the general product beyond). Each case runs
in a subprocess: before the patch the vector path aborted the process."""
from __future__ import annotations

import textwrap

import pytest

import ggmlpy as g
from tests.helpers.subprocesses import run_in_subprocess


pytestmark = pytest.mark.vulkan  # every case computes on Vulkan0

CODE = textwrap.dedent("""
    import numpy as np, ggmlpy as g
    cols, first = {cols}, {first}
    be = g.ggml_backend_init_by_name("Vulkan0")
    ctx = g.ggml_init(mem_size=1 << 20, no_alloc=True)
    w, x = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, 12), g.ggml_new_tensor_2d(ctx, g.GGML_TYPE_F32, 3, cols)
    buf = g.ggml_backend_alloc_ctx_tensors(ctx, be)
    rng = np.random.default_rng(cols + first)
    W, X = rng.normal(size=(12, 3)).astype(np.float32), rng.normal(size=(cols, 3)).astype(np.float32)
    g.ggml_backend_tensor_set_data(w, W)
    g.ggml_backend_tensor_set_data(x, X)
    gctx = g.ggml_init(mem_size=1 << 20, no_alloc=True)
    rows = g.ggml_view_2d(gctx, w, 3, 3, 12, first * 12)     # rows first..first+2: 12 * first bytes in
    y = g.ggml_mul_mat(gctx, rows, x)
    gf = g.ggml_new_graph(gctx)
    g.ggml_build_forward_expand(gf, y)
    ga = g.ggml_gallocr_new(be)
    g.ggml_gallocr_alloc_graph(ga, gf)
    g.ggml_backend_graph_compute(be, gf)
    got = g.ggml_backend_tensor_get_data(y).reshape(cols, 3).astype(np.float64)
    want = X.astype(np.float64) @ W[first:first + 3].astype(np.float64).T
    print("max error", float(np.abs(got - want).max()))
""")


@pytest.mark.parametrize("cols", [1, 4, 8, 16])
@pytest.mark.parametrize("first", [1, 2, 4])
def test_a_product_of_a_misaligned_weight_view_is_right(cols, first):
    if "vulkan" not in g.ggml_backends_built() or g.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("needs the Vulkan backend and a Vulkan0 device (CI: Mesa's lavapipe)")
    rc, out, err = run_in_subprocess(CODE.format(cols=cols, first=first), timeout=120)
    assert rc == 0, err[-1500:]
    assert float(out.split("max error")[1]) < 1e-5, out
