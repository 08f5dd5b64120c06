"""patches/0077: ReLU's backward steps on ReLU's output; the CPU computes a bias ADD and its ReLU in one pass.

ggml built ReLU's backward as ``MUL(STEP(x), dy)`` from ReLU's input x, which kept x (a dense layer's ``W h + b``)
alive for the backward pass. ``STEP(relu(x))`` holds the same 0s and 1s (relu(x) > 0 exactly where x > 0; a NaN is
neither), so the patch takes it from the output, and x's only use is the ReLU: the CPU backend then fuses
``RELU(ADD(a, b))`` (ggml-cpu's fusion hook, beside 0075's STEP + MUL), writing ``relu(a + b)`` without the sum.
The fused kernel does the unfused pair's operations per element (a float add, then ``s > 0 ? s : 0``), so its
reference is numpy's float32 ``a + b`` then the same select, bit for bit. Whether the fusion ran is seen from the
ADD node's memory: filled with 7s before the graph runs, it keeps them when the ReLU computed the sum itself.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.subprocesses import json_with_switch
from tests.patches.test_cpu_step_mul_fusion import _same_bits


SPECIAL_A = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-45, -1e-45, 2.0, -2.0, 1.5, np.inf, 3e38],
                     np.float32)
SPECIAL_B = np.array([-0.0, -0.0, 1.0, 1.0, 1.0, 0.0, 0.0, -2.0, 2.0, -1.5, -np.inf, 3e38], np.float32)


def _operands(width: int, rows: int, b_rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """a [rows, width] and b [b_rows, width] (numpy order), b_rows 1 or rows; the first row of each starts with
    special values (signed zeros, NaN, infinities, subnormals, sums of exactly 0, -0 and an overflow)."""
    rng = np.random.default_rng(seed + width * rows)
    a = rng.standard_normal((rows, width)).astype(np.float32)
    b = rng.standard_normal((b_rows, width)).astype(np.float32)
    k = min(width, len(SPECIAL_A))
    a[0, :k], b[0, :k] = SPECIAL_A[:k], SPECIAL_B[:k]
    return a, b


def _want(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        s = (a + b).astype(np.float32)
        return np.where(s > 0, s, np.float32(0.0)).astype(np.float32)


def _tensor(ctx, arr: np.ndarray):
    t = G.ggml_new_tensor(ctx, G.GGML_TYPE_F32, arr.ndim, list(reversed(arr.shape)))
    G.ggml_set_f32(t, arr)
    return t


def _run(a: np.ndarray, b: np.ndarray, threads: int, sum_used_elsewhere: bool = False, relu_in_place: bool = False,
         b_row_gap: int = 0, sum_is_output: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """RELU(ADD(a, b)) on the CPU, a and b numpy arrays of up to 4 dimensions (b tiled over a as ggml repeats it);
    the result and what the ADD node's memory holds afterwards (filled with 7s; None where the ReLU writes over
    it). ``b_row_gap``: b a view whose rows lie that many floats apart beyond their width."""
    ctx = G.ggml_init(64 * 1024 * 1024)
    try:
        at = _tensor(ctx, a)
        if b_row_gap:
            rows, width = b.shape
            big = _tensor(ctx, np.pad(b, ((0, 0), (0, b_row_gap)), constant_values=np.float32(9.0)))
            bt = G.ggml_view_2d(ctx, big, width, rows, (width + b_row_gap) * 4, 0)
        else:
            bt = _tensor(ctx, b)
        s = G.ggml_add(ctx, at, bt)
        y = G.ggml_relu_inplace(ctx, s) if relu_in_place else G.ggml_relu(ctx, s)
        if sum_is_output:
            G.ggml_set_output(s)
        graph = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(graph, y)
        if sum_used_elsewhere:
            G.ggml_build_forward_expand(graph, G.ggml_scale(ctx, s, 2.0))
        G.ggml_set_f32(s, np.full(a.size, 7.0, np.float32))
        G.ggml_graph_compute_with_ctx(ctx, graph, threads)
        out = np.array(G.ggml_get_f32(y)).reshape(a.shape)
        return out, None if relu_in_place else np.array(G.ggml_get_f32(s)).reshape(a.shape)
    finally:
        ctx.free()


def _tiled(b: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """b repeated over a's shape as ggml's ADD does (each of b's dimensions divides a's)."""
    return np.tile(b, [n // m for n, m in zip(shape, b.shape)])


@pytest.mark.parametrize("width, rows", [(1, 1), (12, 1), (13, 7), (500, 500), (1000, 3)])
@pytest.mark.parametrize("b_rows", ["one", "all"])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fused_bias_relu_is_the_unfused_pair_bit_for_bit(width, rows, b_rows, threads):
    a, b = _operands(width, rows, 1 if b_rows == "one" else rows)
    got, added = _run(a, b, threads)
    assert _same_bits(got, _want(a, b))
    assert added is not None and np.all(added == 7.0), "ADD's memory was written: the fused path did not run"


@pytest.mark.parametrize("b_shape", [(1, 3, 1, 4), (1, 1, 3, 4), (2, 3, 6, 4)])
@pytest.mark.parametrize("threads", [1, 3])
def test_four_dimensions_with_b_repeated_over_rows_planes_and_batches(b_shape, threads):
    """a [2, 3, 6, 4] (numpy order); b repeated over a's dimensions 1 to 3 where it has 1 or 3 where a has 6 (ggml
    tiles it: rows 0, 1, 2, 0, 1, 2), which the fused kernel's row index arithmetic must follow."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 3, 6, 4)).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    got, added = _run(a, b, threads)
    assert _same_bits(got, _want(a, _tiled(b, a.shape)))
    assert added is not None and np.all(added == 7.0)


def test_bias_rows_apart_in_memory():
    """b a view whose rows are 5 floats apart beyond their width (filled with 9s): read through its row stride."""
    a, b = _operands(37, 6, 6)
    got, added = _run(a, b, 2, b_row_gap=5)
    assert _same_bits(got, _want(a, b))
    assert added is not None and np.all(added == 7.0)


def test_relu_in_place_over_the_sum():
    """A ReLU in place over its ADD (the result in the sum's memory, which the fused kernel never writes first)."""
    a, b = _operands(333, 9, 1)
    got, _ = _run(a, b, 2, relu_in_place=True)
    assert _same_bits(got, _want(a, b))


@pytest.mark.parametrize("case", ["second use", "graph output"])
def test_sum_that_is_needed_is_computed(case):
    """The sum read by a second node, or marked a graph output: no fusion (the sum is written), the ReLU right."""
    a, b = _operands(100, 10, 1)
    got, added = _run(a, b, 2, sum_used_elsewhere=case == "second use", sum_is_output=case == "graph output")
    assert _same_bits(got, _want(a, b))
    with np.errstate(invalid="ignore", over="ignore"):
        assert _same_bits(added, (a + b).astype(np.float32))


def test_a_bias_broadcast_along_the_row_is_not_fused():
    """b of one column (its ne[0] = 1, broadcast along a's rows): ggml's own ADD, the sum written."""
    a, b = _operands(64, 8, 8)
    b = b[:, :1].copy()
    got, added = _run(a, b, 2)
    with np.errstate(invalid="ignore", over="ignore"):
        assert _same_bits(got, _want(a, np.broadcast_to(b, a.shape)))
        assert _same_bits(added, (a + b).astype(np.float32))


_WORKER = """
import json
import numpy as np
from tests.patches.test_cpu_add_relu_fusion import _operands, _run
a, b = _operands(700, 11, 1)
got, added = _run(a, b, 2)
print(json.dumps({"bits": got.view(np.uint32).ravel().tolist(), "sum_written": bool((added != 7.0).any())}))
"""


def test_ggmls_switch_turns_the_fusion_off_with_the_same_bits():
    fused = json_with_switch(_WORKER, "GGML_CPU_DISABLE_FUSION", False)
    plain = json_with_switch(_WORKER, "GGML_CPU_DISABLE_FUSION", True)
    assert fused["bits"] == plain["bits"]
    assert not fused["sum_written"] and plain["sum_written"]


def test_relu_backward_steps_on_the_relus_output():
    from tests.helpers.compute import backward_nodes
    with backward_nodes(lambda c, x: G.ggml_relu(c, G.ggml_scale(c, x, 2.0)), (6, 5)) as nodes:
        relu = next(n for n in nodes if n.op_name == "RELU")
        step = next(n for n in nodes if n.op_name == "STEP")
        assert step.ptr.src[0] == relu.ptr, "ReLU's backward took the step of its input"


def test_relu_gradient_through_a_bias_in_a_backward_graph():
    """d sum(relu(x + b) * w) / dx on the CPU, the fused forward and 0075's fused backward in one graph: w where
    x + b > 0 (float32's sum), else 0."""
    from tests.helpers.compute import compute_grad
    rng = np.random.default_rng(4)
    x = rng.standard_normal((37, 41)).astype(np.float32)
    b = rng.standard_normal((1, 41)).astype(np.float32)
    w = rng.standard_normal((37, 41)).astype(np.float32)
    loss, gx = compute_grad(lambda ctx, t, bt: G.ggml_relu(ctx, G.ggml_add(ctx, t, bt)), x, w, b)
    s = (x + b).astype(np.float32)
    assert _same_bits(np.asarray(gx, dtype=np.float32).reshape(x.shape), (s > 0).astype(np.float32) * w)
    np.testing.assert_allclose(loss, float((np.maximum(s, 0).astype(np.float64) * w).sum()), rtol=1e-5)


def test_the_model_layers_dense_relu_is_a_bias_add_then_its_relu():
    """The fusion's precondition in the model layer's training graph of a dense net on the CPU: each ReLU right
    after the ADD of its layer's bias, and each STEP right before its MUL (0075)."""
    import ggmlpy as g
    dense = g.ggml_model_sequential()
    dense = g.ggml_layer_dense(dense, 50, activation="relu", input_shape=(20,))
    dense = g.ggml_layer_dense(dense, 30, activation="relu")
    dense = g.ggml_compile(g.ggml_layer_dense(dense, 5, activation="softmax"),
                           loss="sparse_categorical_crossentropy", backend="cpu")
    ops = [op for _, split in g.ggml_model_placement(dense).splits for op in split]
    relus = [i for i, op in enumerate(ops) if op == "RELU"]
    steps = [i for i, op in enumerate(ops) if op == "STEP"]
    assert len(relus) == 2 and all(ops[i - 1] == "ADD" for i in relus), ops
    assert len(steps) == 2 and all(ops[i + 1] == "MUL" for i in steps), ops
