"""patches/0050: an operand that is a view starting off Vulkan's storage-buffer alignment (``ggml_view_2d(x, ...,
offset=8)``: 16 bytes on lavapipe and NVIDIA) reaches only the kernels that take such a view; the others (their
push constants carry no offset) aborted the whole process in a GGML_ASSERT (SOFT_MAX, ARGMAX, CROSS_ENTROPY_LOSS,
IM2COL and so ggml_conv_2d, POOL_2D, FLASH_ATTN_EXT, ... 21 ops in a sweep of every op) or, for ROPE's positions,
read the wrong elements. Now ggml-vulkan refuses them such a view and the CPU computes the op.

Every case runs in one subprocess (an abort fails the test, and the last case printed names the op): a view 8 bytes
into a larger input (NaN around it, so an offset read wrong shows), computed by a scheduler over Vulkan0 and the
CPU, against the same graph on the CPU alone (equal within 1e-5: float32 arithmetic in another order at most);
and where it ran: the ops that take such a view on Vulkan0 (eight of patches/0050's list), the others on the CPU.
"""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.helpers.devices import require_gpu
from tests.helpers.subprocesses import run_in_subprocess


pytestmark = pytest.mark.vulkan

SCRIPT = textwrap.dedent("""
    import json, sys, numpy as np, ggmlpy as G
    from tests.helpers.compute import compute
    vk, cpu = G.ggml_backend_init_by_name("Vulkan0"), G.ggml_backend_cpu_init()
    rng = np.random.default_rng(0)

    def shifted(arr, off=2):   # arr's values stored 2 elements into a NaN-padded buffer (I32: zero-padded)
        pad = np.zeros(off, arr.dtype) if arr.dtype == np.int32 else np.full(off, np.nan, arr.dtype)
        return np.concatenate([pad, arr.ravel(), pad])

    def view(c, t, shape, off=2):   # the view of that buffer holding arr (shape in ggml order)
        ne = list(shape) + [1] * (4 - len(shape))
        es = 4 if t.type in (G.GGML_TYPE_F32, G.GGML_TYPE_I32) else 2
        return G.ggml_view_4d(c, t, *ne, es * ne[0], es * ne[0] * ne[1], es * ne[0] * ne[1] * ne[2], es * off)

    def f(*shape):
        return rng.normal(size=shape).astype(np.float32)

    # name: (op, arrays, build(c, *views)), the views made of the arrays in order
    CASES = {
        "add": ("ADD", [f(4, 8), f(4, 8)], lambda c, a, b: G.ggml_add(c, a, b)),
        "soft_max": ("SOFT_MAX", [f(3, 8)], lambda c, a: G.ggml_soft_max(c, a)),
        "argmax": ("ARGMAX", [f(3, 8)], lambda c, a: G.ggml_argmax(c, a)),
        "count_equal": ("COUNT_EQUAL", [rng.integers(0, 3, (3, 8)).astype(np.int32)] * 2,
                        lambda c, a, b: G.ggml_count_equal(c, a, b)),
        "cross_entropy": ("CROSS_ENTROPY_LOSS", [f(3, 8), np.full((3, 8), 1 / 8, np.float32)],
                          lambda c, a, b: G.ggml_cross_entropy_loss(c, a, b)),
        "silu_back": ("SILU_BACK", [f(3, 8), f(3, 8)], lambda c, a, b: G.ggml_silu_back(c, a, b)),
        "rms_norm_back": ("RMS_NORM_BACK", [f(3, 8), f(3, 8)], lambda c, a, b: G.ggml_rms_norm_back(c, a, b, 1e-6)),
        "gelu_back": ("GELU_BACK", [f(3, 8), f(3, 8)], lambda c, a, b: G.ggml_gelu_back(c, a, b)),   # patches/0064
        "norm_back": ("NORM_BACK", [f(3, 8), f(3, 8)], lambda c, a, b: G.ggml_norm_back(c, a, b, 1e-5)),  # 0067
        "group_norm": ("GROUP_NORM", [f(4, 3, 5)], lambda c, a: G.ggml_group_norm(c, a, 2, 1e-6)),
        "pool_2d": ("POOL_2D", [f(2, 6, 6)], lambda c, a: G.ggml_pool_2d(c, a, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0)),
        "im2col": ("IM2COL", [f(2, 3, 3), f(2, 6, 6)],
                   lambda c, k, x: G.ggml_im2col(c, k, x, 1, 1, 1, 1, 1, 1, True, G.GGML_TYPE_F32)),
        "diag_mask_inf": ("DIAG_MASK_INF", [f(4, 4)], lambda c, a: G.ggml_diag_mask_inf(c, a, 0)),
        "argsort": ("ARGSORT", [f(3, 8)], lambda c, a: G.ggml_argsort(c, a, G.GGML_SORT_ORDER_ASC)),
        "conv_transpose_1d": ("CONV_TRANSPOSE_1D", [f(2, 2, 3), f(2, 7)],
                              lambda c, k, x: G.ggml_conv_transpose_1d(c, k, x, 1, 0, 1)),
        "rope_positions": ("ROPE", [f(3, 2, 8), np.arange(3, dtype=np.int32) + 5],
                           lambda c, x, p: G.ggml_rope_ext(c, x, p, None, 8, 0, 512, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0)),
    }
    CASES.update({
        "scale": ("SCALE", [f(3, 8)], lambda c, a: G.ggml_scale(c, a, 0.5)),
        "sum_rows": ("SUM_ROWS", [f(3, 8)], lambda c, a: G.ggml_sum_rows(c, a)),
        "norm": ("NORM", [f(3, 8)], lambda c, a: G.ggml_norm(c, a, 1e-5)),
        "get_rows": ("GET_ROWS", [f(5, 8), np.array([4, 0, 2], np.int32)], lambda c, a, i: G.ggml_get_rows(c, a, i)),
        "concat": ("CONCAT", [f(3, 8), f(3, 8)], lambda c, a, b: G.ggml_concat(c, a, b, 1)),
        "out_prod": ("OUT_PROD", [f(6, 8), f(6, 5)], lambda c, a, b: G.ggml_out_prod(c, a, b)),
        "mul_mat": ("MUL_MAT", [f(5, 8), f(3, 8)], lambda c, a, b: G.ggml_mul_mat(c, a, b)),
    })
    # take such a view (patches/0050's list); the others are refused it
    ON_VULKAN = {"ADD", "SCALE", "SUM_ROWS", "NORM", "GET_ROWS", "CONCAT", "OUT_PROD", "MUL_MAT"}
    out = []
    for name, (op, arrays, build) in CASES.items():
        print("case", name, file=sys.stderr, flush=True)
        stored = [shifted(a) for a in arrays]
        shapes = [a.shape[::-1] for a in arrays]
        # rope: only the positions are off the alignment (its data is taken at any offset)
        offs = [0, 2] if name == "rope_positions" else [2] * len(arrays)
        if name == "rope_positions":
            stored[0] = arrays[0].ravel()
        g = lambda c, *ts: build(c, *(view(c, t, s, o) if o else G.ggml_reshape_3d(c, t, *s) if len(s) == 3 else t
                                      for t, s, o in zip(ts, shapes, offs)))
        places = []
        (got,) = compute(g, *stored, backend=[vk, cpu], placements=places)
        (want,) = compute(g, *stored, backend=cpu)
        ok = bool(np.allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=False))
        where = places[-1]
        out.append([name, op, ok, where.op_counts("Vulkan0").get(op, 0), op in where.cpu_ops, op in ON_VULKAN])
    print("RESULT" + json.dumps(out))
""")


def test_an_op_given_a_misaligned_view_computes_it_right_and_never_aborts():
    require_gpu("Vulkan0")
    rc, out, err = run_in_subprocess(SCRIPT, timeout=300)
    assert rc == 0, err[-3000:]
    results = json.loads(out.split("RESULT", 1)[1])
    assert len(results) == 23
    for name, _op, ok, on_vulkan, on_cpu, takes_it in results:
        assert ok, name
        assert (on_vulkan == 1 and not on_cpu) if takes_it else (on_cpu and on_vulkan == 0), (name, on_vulkan, on_cpu)
