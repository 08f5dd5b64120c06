"""patches/0075: the CPU backend computes ReLU's backward as ggml builds it, ``MUL(STEP(x), dy)``, in one pass.

The fused kernel writes ``(x > 0 ? 1 : 0) * dy``: the unfused graph's product, so its reference is numpy's float32
``(x > 0) * dy`` bit for bit, special values included (0 * inf and 0 * NaN are NaN, 0 * a negative dy is -0, a NaN
or -0 in x is not above 0). Whether the fusion ran is seen from the STEP node's own memory: filled with 7s before
the graph runs, it keeps them when the MUL computed STEP's part itself, and holds 0s and 1s when STEP ran. The
fusion is taken only where STEP's result has no other use (ggml_can_fuse) and both operands are contiguous F32 of
the product's shape; ``GGML_CPU_DISABLE_FUSION=1`` (ggml's switch, read once per process) turns it off: the same
values, STEP written.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.subprocesses import json_with_switch


SPECIAL_X = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 2.0, -2.0, -1.0, -1.0, -1.0, -1.0],
                     np.float32)
SPECIAL_DY = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, np.inf, np.nan, np.inf, -np.inf, np.nan, -3.0], np.float32)


def _operands(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + n)
    x, dy = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    k = min(n, len(SPECIAL_X))
    x[:k], dy[:k] = SPECIAL_X[:k], SPECIAL_DY[:k]
    return x, dy


def _run(x: np.ndarray, dy: np.ndarray, threads: int, step_used_elsewhere: bool = False,
         dy_rows: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MUL(STEP(x), dy) on the CPU (``dy_rows``: dy a single row broadcast over x's rows); the product and what the
    STEP node's memory holds afterwards (it was filled with 7s)."""
    ctx = G.ggml_init(64 * 1024 * 1024)
    try:
        n, rows = x.size, dy_rows or 1
        xt = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, n // rows, rows)
        dt = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, n // rows, 1 if dy_rows else rows)
        G.ggml_set_f32(xt, x)
        G.ggml_set_f32(dt, dy[:n // rows] if dy_rows else dy)
        step = G.ggml_step(ctx, xt)
        y = G.ggml_mul(ctx, step, dt)
        graph = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(graph, y)
        if step_used_elsewhere:
            G.ggml_build_forward_expand(graph, G.ggml_scale(ctx, step, 2.0))
        G.ggml_set_f32(step, np.full(n, 7.0, np.float32))
        G.ggml_graph_compute_with_ctx(ctx, graph, threads)
        return np.array(G.ggml_get_f32(y)).ravel(), np.array(G.ggml_get_f32(step)).ravel()
    finally:
        ctx.free()


def _same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)))


def _want(x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return (x > 0).astype(np.float32) * dy


@pytest.mark.parametrize("n", [1, 13, 1000, 100003])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_relu_backward_is_the_products_bit_for_bit(n, threads):
    x, dy = _operands(n)
    got, step = _run(x, dy, threads)
    assert _same_bits(got, _want(x, dy))
    assert np.all(step == 7.0), "STEP's memory was written: the fused path did not run"


def test_step_with_another_use_is_computed():
    """STEP's result read by a second node: no fusion (its 0s and 1s are needed), the product still right."""
    x, dy = _operands(1000)
    got, step = _run(x, dy, 2, step_used_elsewhere=True)
    assert _same_bits(got, _want(x, dy))
    assert _same_bits(step, (x > 0).astype(np.float32))


def test_broadcast_gradient_is_not_fused():
    """dy a row broadcast over x's 4 rows (not the product's shape): ggml's own MUL, STEP written."""
    x, dy = _operands(4 * 250)
    got, step = _run(x, dy, 2, dy_rows=4)
    assert _same_bits(got, _want(x, np.tile(dy[:250], 4)))
    assert _same_bits(step, (x > 0).astype(np.float32))


_WORKER = """
import json
import numpy as np
from tests.patches.test_cpu_step_mul_fusion import _operands, _run
x, dy = _operands(1000)
got, step = _run(x, dy, 2)
print(json.dumps({"bits": got.view(np.uint32).tolist(), "step_written": bool((step != 7.0).any())}))
"""


def test_ggmls_switch_turns_the_fusion_off_with_the_same_bits():
    fused = json_with_switch(_WORKER, "GGML_CPU_DISABLE_FUSION", False)
    plain = json_with_switch(_WORKER, "GGML_CPU_DISABLE_FUSION", True)
    assert fused["bits"] == plain["bits"]
    assert not fused["step_written"] and plain["step_written"]


def test_relu_gradient_in_a_backward_graph():
    """The gradient of sum(relu(x) * w) with respect to x, through ggml's backward pass (STEP then MUL): w where
    x > 0, else 0."""
    from tests.helpers.compute import compute_grad
    rng = np.random.default_rng(3)
    x = rng.standard_normal((37, 41)).astype(np.float32)
    w = rng.standard_normal((37, 41)).astype(np.float32)
    _, gx = compute_grad(lambda ctx, t: G.ggml_relu(ctx, t), x, w)
    assert _same_bits(np.asarray(gx, dtype=np.float32).reshape(x.shape), _want(x, w))


def test_the_model_layers_relu_backward_is_a_step_then_its_mul():
    """The fusion's precondition in the model layer's training graphs (a dense net and a small CNN on the CPU):
    every STEP is followed by the MUL that reads it."""
    import ggmlpy as g
    dense = g.ggml_layer_dense(g.ggml_layer_dense(g.ggml_model_sequential(), 50, activation="relu",
                                                  input_shape=(20,)), 5, activation="softmax")
    cnn = g.ggml_model_sequential()
    cnn = g.ggml_layer_conv_2d(cnn, 4, (3, 3), activation="relu", padding="same", input_shape=(8, 8, 1))
    cnn = g.ggml_layer_max_pooling_2d(cnn, (2, 2))
    cnn = g.ggml_layer_dense(g.ggml_layer_flatten(cnn), 3, activation="softmax")
    for model in (dense, cnn):
        model = g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="cpu")
        ops = [op for _, split in g.ggml_model_placement(model).splits for op in split]
        steps = [i for i, op in enumerate(ops) if op == "STEP"]
        assert steps and all(ops[i + 1] == "MUL" for i in steps), ops
