"""ggmlR's context calls (graph/context.py): ggml_version, ggml_init_auto sizing a context for the planned tensors,
ggml_reset invalidating the old tensors and reusing the memory; misuse raises ggmlpy's errors, never aborts.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.core.handle import using


F32, F16 = G.GGML_TYPE_F32, G.GGML_TYPE_F16


@pytest.fixture
def hctx():
    c = G.ggml_init(4 << 20)
    yield c
    G.ggml_free(c)


# ---------------------------------------------------------------- version, init_auto, reset

def test_version_is_ggmls():
    v = G.ggml_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v) and v == G.GGML_VERSION


def test_init_auto_sizes_the_context_for_the_planned_tensors():
    ctx = G.ggml_init_auto(mat1=(100, 200), mat2=[50], extra_mb=0)
    try:
        need = (100 * 200 + 50) * 4 + 2 * G.ggml_tensor_overhead()
        assert need <= G.ggml_get_mem_size(ctx) <= need + 2 * 256 + 16   # ggml rounds mem_size up to 16
        G.ggml_new_tensor_2d(ctx, F32, 100, 200)
        G.ggml_new_tensor_1d(ctx, F32, 50)          # both fit
        with pytest.raises(G.GgmlValueError, match="context is full"):
            G.ggml_new_tensor_1d(ctx, F32, 64)
    finally:
        ctx.free()
    with G.ggml_init_auto((10, 10)) as c:          # the default extra 10 MiB
        assert G.ggml_get_mem_size(c) >= 10 * 1024 * 1024 + 400
        assert not G.ggml_get_no_alloc(c)
    with G.ggml_init_auto((10, 10), type=F16, extra_mb=0, no_alloc=True) as c:
        assert G.ggml_get_no_alloc(c)
    for bad in ({"m": (1, 2, 3, 4, 5)}, {"m": (0, 2)}, {"m": "ab"}, {"extra_mb": -1}):
        with pytest.raises(G.GgmlValueError):
            G.ggml_init_auto(**bad)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_init_auto((3,), type=4)


def test_reset_invalidates_the_old_tensors_and_reuses_the_memory(hctx):
    a = G.ggml_new_tensor_1d(hctx, F32, 100)
    G.ggml_set_f32(a, 1.0)
    view = G.ggml_view_1d(hctx, a, 10, 0)
    graph = G.ggml_build_forward_expand(hctx, G.ggml_sqr(hctx, a))
    other = G.ggml_init(1 << 16)
    b_from_a = G.ggml_scale(other, a, 2.0)                   # lives in another context, reads a
    used = G.ggml_used_mem(hctx)
    G.ggml_reset(hctx)
    assert G.ggml_used_mem(hctx) == 0 and G.ggml_tensor_num(hctx) == 0
    for call in (lambda: G.ggml_get_f32(a), lambda: G.ggml_set_f32_1d(a, 0, 2.0), lambda: G.ggml_nelements(view),
                 lambda: G.ggml_graph_compute(hctx, graph), lambda: G.ggml_get_f32(b_from_a),
                 lambda: G.ggml_add(hctx, a, a)):
        with pytest.raises(G.GgmlStateError, match="ggml_reset"):
            call()
    c = G.ggml_new_tensor_1d(hctx, F32, 100)                 # the memory is handed out again
    assert G.ggml_used_mem(hctx) <= used
    G.ggml_set_f32(c, 3.0)
    np.testing.assert_array_equal(G.ggml_get_f32(c), np.full(100, 3.0))
    assert [G.ggml_nelements(t) for t in _tensors(hctx)] == [100]
    G.ggml_reset(hctx)
    G.ggml_reset(hctx)                                      # twice is fine
    other.free()


def test_reset_refuses_a_context_in_use_and_a_freed_one():
    ctx = G.ggml_init(1 << 16)
    t = G.ggml_new_tensor_1d(ctx, F32, 4)
    with using([ctx], "a computation of this test"):
        with pytest.raises(G.GgmlInUseError, match="in use"):
            G.ggml_reset(ctx)
    G.ggml_set_f32(t, 1.0)                                  # nothing was reset
    G.ggml_free(ctx)
    with pytest.raises(G.GgmlStateError, match="freed"):
        G.ggml_reset(ctx)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_reset(None)


def _tensors(ctx):
    out, t = [], G.ggml_get_first_tensor(ctx)
    while t is not None:
        out.append(t)
        t = G.ggml_get_next_tensor(ctx, t)
    return out
