"""ggmlR's graph idiom (compute/run.py): ggml_build_forward_expand(ctx, tensor) and ggml_graph_compute on a
context's own memory, ggml_graph_compute_with_ctx and its threads, against numpy; misuse raises ggmlpy's errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


F32 = G.GGML_TYPE_F32


@pytest.fixture
def hctx():
    c = G.ggml_init(4 << 20)
    yield c
    G.ggml_free(c)


# ---------------------------------------------------------------- ggmlR's graph idiom

def test_ggmlr_compute_idiom(hctx):
    """test-ggml.R: (a + b) * c with ggml_set_f32 / ggml_build_forward_expand(ctx, .) / ggml_graph_compute."""
    a, b, c = (G.ggml_new_tensor_1d(hctx, F32, 3) for _ in range(3))
    G.ggml_set_f32(a, [1, 2, 3])
    G.ggml_set_f32(b, [4, 5, 6])
    G.ggml_set_f32(c, [2, 2, 2])
    result = G.ggml_mul(hctx, G.ggml_add(hctx, a, b), c)
    graph = G.ggml_build_forward_expand(hctx, result)
    assert isinstance(graph, G.graph.objects.Graph) and G.ggml_graph_n_nodes(graph) == 2
    assert G.ggml_graph_compute(hctx, graph) is None
    np.testing.assert_array_equal(G.ggml_get_f32(result), [10, 14, 18])
    # a second call makes a second graph; ggml's (graph, tensor) form still expands in place
    g2 = G.ggml_build_forward_expand(hctx, G.ggml_relu(hctx, result))
    assert g2 is not graph and G.ggml_graph_n_nodes(g2) == 3
    gf = G.ggml_new_graph(hctx)
    assert G.ggml_build_forward_expand(gf, result) is gf


def test_graph_compute_with_ctx_and_threads(hctx, rng):
    x = rng.standard_normal((64, 48)).astype(np.float32)
    w = rng.standard_normal((32, 48)).astype(np.float32)
    tx, tw = G.ggml_new_tensor_2d(hctx, F32, 48, 64), G.ggml_new_tensor_2d(hctx, F32, 48, 32)
    G.ggml_set_f32(tx, x)
    G.ggml_set_f32(tw, w)
    out = G.ggml_mul_mat(hctx, tw, tx)                     # [32, 64]: numpy (64, 32) = x @ w.T
    graph = G.ggml_build_forward_expand(hctx, out)
    for n in (0, 1, 2):
        G.ggml_set_f32(out, 0.0)
        G.ggml_graph_compute_with_ctx(hctx, graph, n_threads=n)
        np.testing.assert_allclose(G.ggml_get_f32(out).reshape(64, 32), x.astype(np.float64) @ w.T, rtol=1e-4,
                                   atol=1e-4)
    for bad in (-1, 1.5, None):
        with pytest.raises(G.GgmlpyError):
            G.ggml_graph_compute_with_ctx(hctx, graph, n_threads=bad)


def test_build_forward_expand_ctx_form_grows_beyond_the_default_size():
    ctx = G.ggml_init(3000 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(4096) + (1 << 16))
    try:
        x = G.ggml_new_tensor_1d(ctx, F32, 1)
        G.ggml_set_f32(x, 1.0)
        y = x
        for _ in range(2100):
            y = G.ggml_add(ctx, y, x)
        graph = G.ggml_build_forward_expand(ctx, y)
        assert G.ggml_graph_n_nodes(graph) == 2100
        G.ggml_graph_compute(ctx, graph)
        assert G.ggml_get_f32(y)[0] == 2101.0
    finally:
        ctx.free()


def test_graph_compute_on_a_no_alloc_context(backend):
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    try:
        a = G.ggml_new_tensor_1d(ctx, F32, 4)
        graph = G.ggml_build_forward_expand(ctx, G.ggml_sqr(ctx, a))
        with pytest.raises(G.GgmlStateError, match="no_alloc=True"):
            G.ggml_graph_compute(ctx, graph)
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)   # now every tensor has CPU memory
        G.ggml_set_f32(a, [1, -2, 3, -4])
        G.ggml_graph_compute(ctx, graph)
        np.testing.assert_array_equal(G.ggml_get_f32(G.ggml_graph_node(graph, -1)), [1, 4, 9, 16])
        with pytest.raises(G.GgmlTypeError):
            G.ggml_graph_compute(ctx, "graph")
        buf.free()
    finally:
        ctx.free()
