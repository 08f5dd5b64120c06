"""Our ggml patches, checked through what they make possible (the backward passes of patches 0004
and 0006 are checked against finite differences in test_gradients.py)."""
from __future__ import annotations

import numpy as np

import ggmlpy as G


def test_0005_static_graphs_larger_than_ggmls_default_size_train():
    """A 500-layer linear network: forward + backward + optimizer nodes far beyond GGML_DEFAULT_GRAPH_SIZE (2048),
    which ggml-opt's static graphs were fixed to (it aborted building them)."""
    depth, width, batch = 500, 4, 8
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 1)  # 5,000 tiny nodes: thread barriers would dominate
    ctx = G.ggml_init(mem_size=(3 * depth + 16) * G.ggml_tensor_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, width, batch))
    weights = [G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, width, width)) for _ in range(depth)]
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    for w in weights:  # near-identity layers keep the signal alive through 500 layers
        G.ggml_backend_tensor_set_data(w, (np.eye(width) + rng.normal(0, 0.01, (width, width))).astype(np.float32))
    ctx_ops = G.ggml_init(mem_size=(4 * depth + 16) * G.ggml_tensor_overhead(), no_alloc=True)
    h = x
    for w in weights:
        h = G.ggml_mul_mat(ctx_ops, w, h)
    # forward + backward + optimizer: ~5 nodes per layer, well past ggml's default size
    assert 5 * depth > G.GGML_DEFAULT_GRAPH_SIZE
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=16 * depth)
    data = rng.normal(size=(32, width)).astype(np.float32)
    batches = [(data[i:i + batch], 0.5 * data[i:i + batch]) for i in range(0, 32, batch)]
    history = G.ggml_fit_opt_gen(sched, ctx_ops, x, h, batches, epochs=3, learning_rate=1e-3, silent=True)
    assert np.isfinite(history["train_loss"]).all()
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    for obj in (sched, ctx_ops, buf, ctx, backend):
        obj.free()
