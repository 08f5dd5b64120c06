"""ggml-alloc: a graph allocated by a Gallocr and computed on one backend, against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


def test_gallocr_allocates_and_the_graph_computes(backend):
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    a = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))
    b = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2))
    out = G.ggml_relu(ctx, G.ggml_mul_mat(ctx, a, b))          # [4, 2]
    graph = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(graph, out)
    galloc = G.ggml_gallocr_new(backend)
    G.ggml_gallocr_reserve(galloc, graph)
    assert G.ggml_gallocr_get_buffer_size(galloc) > 0
    G.ggml_gallocr_alloc_graph(galloc, graph)
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(4, 3)), rng.normal(size=(2, 3))
    G.ggml_backend_tensor_set_data(a, A)
    G.ggml_backend_tensor_set_data(b, B)
    G.ggml_backend_graph_compute(backend, graph)
    np.testing.assert_allclose(G.ggml_tensor_to_numpy(out), np.maximum(B @ A.T, 0), rtol=1e-5, atol=1e-6)
    G.ggml_gallocr_free(galloc)
    G.ggml_gallocr_free(galloc)  # idempotent
    with pytest.raises(RuntimeError, match="freed"):
        G.ggml_gallocr_alloc_graph(galloc, graph)
    with pytest.raises(TypeError):
        G.ggml_gallocr_alloc_graph(galloc, "not a graph")
    ctx.free()
