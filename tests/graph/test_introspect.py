"""The library and tensor facts of ggmlR (graph/introspect.py, and core/types.py's type facts): type sizes,
layout predicates against numpy strides, op names, context introspection, graph printing and dot files, timers,
memory estimates; references are numpy and ggml's documented constants, and misuse raises ggmlpy's errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


F32, F16, I32 = G.GGML_TYPE_F32, G.GGML_TYPE_F16, G.GGML_TYPE_I32


@pytest.fixture
def hctx():
    c = G.ggml_init(4 << 20)
    yield c
    G.ggml_free(c)


def test_type_facts_match_ggmls_formats():
    expected = {F32: ("f32", 4, 1, False), F16: ("f16", 2, 1, False), G.GGML_TYPE_Q4_0: ("q4_0", 18, 32, True),
                G.GGML_TYPE_Q8_0: ("q8_0", 34, 32, True), I32: ("i32", 4, 1, False),
                G.GGML_TYPE_BF16: ("bf16", 2, 1, False)}
    for t, (name, size, blck, quant) in expected.items():
        assert G.ggml_type_name(t) == name and G.ggml_type_size(t) == size and G.ggml_blck_size(t) == blck
        assert G.ggml_is_quantized(t) is quant and G.ggml_type_sizef(t) == size / blck
    for bad in (4, 31, 43, -1, 10 ** 9):
        with pytest.raises(G.GgmlValueError):
            G.ggml_type_name(bad)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_type_size("f32")


def test_layout_predicates_against_numpy(hctx):
    x = G.ggml_new_tensor_3d(hctx, F32, 4, 3, 2)
    arr = np.zeros((2, 3, 4), np.float32)
    assert G.ggml_tensor_nb(x) == tuple(reversed(arr.strides)) + (arr.nbytes,)
    assert G.ggml_element_size(x) == 4 and G.ggml_nrows(x) == 6
    xt = G.ggml_transpose(hctx, x)
    xp = G.ggml_permute(hctx, x, 2, 0, 1, 3)
    assert G.ggml_tensor_nb(xt)[:3] == (arr.strides[1], arr.strides[2], arr.strides[0])
    assert G.ggml_is_contiguous(x) and not G.ggml_is_contiguous(xt)
    assert G.ggml_is_transposed(xt) and not G.ggml_is_transposed(x)
    assert G.ggml_is_permuted(xp) and not G.ggml_is_permuted(x)
    assert G.ggml_is_contiguously_allocated(xp) and G.ggml_is_contiguous_0(x)
    rows = G.ggml_view_2d(hctx, G.ggml_new_tensor_2d(hctx, F32, 8, 3), 4, 3, 32, 0)   # 4 of 8 columns
    # rows dense, gaps between them: contiguous from dimension 1 on (dimension 1 itself may have gaps), not whole
    assert G.ggml_is_contiguous_rows(rows) and G.ggml_is_contiguous_1(rows) and not G.ggml_is_contiguous(rows)
    assert not G.ggml_is_contiguous_rows(xt)
    assert G.ggml_is_contiguous_2(G.ggml_new_tensor_3d(hctx, F32, 2, 2, 2))
    isinstance(G.ggml_is_contiguous_channels(x), bool)
    y = G.ggml_new_tensor_3d(hctx, F32, 4, 3, 2)
    row = G.ggml_new_tensor_1d(hctx, F32, 4)
    assert G.ggml_are_same_shape(x, y) and not G.ggml_are_same_shape(x, row)
    assert G.ggml_are_same_stride(x, y) and not G.ggml_are_same_stride(x, xt)
    assert G.ggml_can_repeat(row, x) and not G.ggml_can_repeat(x, row)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_is_contiguous(arr)


def test_op_names(hctx):
    x = G.ggml_new_tensor_1d(hctx, F32, 4)
    r, s = G.ggml_relu(hctx, x), G.ggml_add(hctx, x, x)
    assert G.ggml_op_desc(r) == "RELU" and G.ggml_op_desc(s) == "ADD" and G.ggml_op_desc(x) == "NONE"
    assert G.ggml_unary_op_name(G.ggml_get_unary_op(r)) == "RELU"
    add = int(s.ptr.op)
    assert G.ggml_op_name(add) == "ADD" and G.ggml_op_symbol(add) == "x+y"
    with pytest.raises(G.GgmlValueError, match="not by a unary op"):
        G.ggml_get_unary_op(s)
    for fn in (G.ggml_op_name, G.ggml_op_symbol, G.ggml_unary_op_name):
        with pytest.raises(G.GgmlValueError):
            fn(10 ** 6)


def test_context_introspection(hctx):
    assert G.ggml_get_mem_size(hctx) == 4 << 20 and G.ggml_get_max_tensor_size(hctx) == 0
    assert G.ggml_get_first_tensor(hctx) is None and G.ggml_tensor_num(hctx) == 0
    a = G.ggml_set_name(G.ggml_new_tensor_1d(hctx, F32, 10), "a")
    b = G.ggml_set_name(G.ggml_new_tensor_2d(hctx, F32, 10, 20), "b")
    assert [G.ggml_get_name(t) for t in _tensors(hctx)] == ["a", "b"] and G.ggml_tensor_num(hctx) == 2
    assert G.ggml_get_max_tensor_size(hctx) == 800
    G.ggml_set_no_alloc(hctx, True)
    assert G.ggml_get_no_alloc(hctx)
    c = G.ggml_new_tensor_1d(hctx, F32, 10)
    with pytest.raises(G.GgmlStateError, match="no memory"):
        G.ggml_get_f32(c)
    G.ggml_set_no_alloc(hctx, False)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_set_no_alloc(hctx, 1)
    other = G.ggml_init(1 << 16)
    foreign = G.ggml_new_tensor_1d(other, F32, 1)
    with pytest.raises(G.GgmlValueError, match="does not belong"):
        G.ggml_get_next_tensor(hctx, foreign)
    other.free()
    assert G.ggml_get_next_tensor(hctx, a) == b


def test_graph_print_and_dot(hctx, capsys, tmp_path):
    x = G.ggml_set_name(G.ggml_new_tensor_2d(hctx, F32, 3, 2), "x")
    graph = G.ggml_build_forward_expand(hctx, G.ggml_sqr(hctx, G.ggml_relu(hctx, x)))
    G.ggml_graph_print(graph)
    out = capsys.readouterr().out
    assert "n_nodes = 2" in out and "n_leafs = 1" in out and "SQR" in out and " x" in out
    dot = tmp_path / "g.dot"
    G.ggml_graph_dump_dot(graph, None, dot)
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("->") == 2 and "x^2" in text   # two edges, SQR's symbol
    with pytest.raises(G.GgmlValueError, match="cannot write"):
        G.ggml_graph_dump_dot(graph, None, tmp_path / "missing" / "g.dot")
    with pytest.raises(G.GgmlTypeError, match="filename is required"):
        G.ggml_graph_dump_dot(graph)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_graph_print(x)


def test_timers_move_forward():
    G.ggml_time_init()
    t_ms, t_us, c = G.ggml_time_ms(), G.ggml_time_us(), G.ggml_cycles()
    sum(range(200000))
    assert G.ggml_time_us() >= t_us and G.ggml_time_ms() >= t_ms and G.ggml_cycles() >= c
    assert G.ggml_cycles_per_ms() > 0


def test_estimate_memory_sizes_a_context():
    """One tensor fits a context of its estimate and not one byte less; a context of the estimates' sum holds
    them all."""
    shapes = [(G.GGML_TYPE_F32, (1000, 3)), (G.GGML_TYPE_F16, (7, 5, 3)), (G.GGML_TYPE_I8, (13, 2)),
              (G.GGML_TYPE_I32, (1,))]
    assert G.ggml_estimate_memory(G.GGML_TYPE_F32, 1000, 3) == G.ggml_tensor_overhead() + 12000 + 16
    assert G.ggml_estimate_memory(G.GGML_TYPE_Q8_0, 64, 2) == G.ggml_tensor_overhead() + 136 + 16  # 4 blocks of 34 B

    def fits(mem, tensors):
        ctx = G.ggml_init(mem)
        try:
            for t, ne in tensors:
                getattr(G, f"ggml_new_tensor_{len(ne)}d")(ctx, t, *ne)
            return True
        except G.GgmlValueError:
            return False
        finally:
            ctx.free()
    for t, ne in shapes:
        est = G.ggml_estimate_memory(t, *ne)
        assert fits(est, [(t, ne)]) and not fits(est - 1, [(t, ne)]), (t, ne)
    assert fits(sum(G.ggml_estimate_memory(t, *ne) for t, ne in shapes), shapes)
    with pytest.raises(G.GgmlValueError):
        G.ggml_estimate_memory(G.GGML_TYPE_Q8_0, 33)   # not a whole block
    with pytest.raises(G.GgmlTypeError):
        G.ggml_estimate_memory(G.GGML_TYPE_F32)        # ne0 missing


def test_are_same_layout_compares_type_shape_and_strides(host_ctx):
    a = G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 4, 3)
    assert G.ggml_are_same_layout(a, G.ggml_dup_tensor(host_ctx, a))
    assert not G.ggml_are_same_layout(a, G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F16, 4, 3))   # type
    assert not G.ggml_are_same_layout(a, G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 3, 4))   # shape
    t = G.ggml_transpose(host_ctx, G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 3, 4))      # [4, 3], strided
    assert G.ggml_are_same_shape(a, t) and not G.ggml_are_same_layout(a, t)


def test_pool_strides_default_to_the_window(host_ctx):
    """ggmlR's defaults: s0 = k0 (and s1 = k1), windows side by side."""
    x = G.ggml_new_tensor_4d(host_ctx, G.GGML_TYPE_F32, 6, 4, 2, 1)
    vals = np.random.default_rng(0).normal(size=(1, 2, 4, 6)).astype(np.float32)
    G.ggml_backend_tensor_set_data(x, vals)
    y = G.ggml_pool_2d(host_ctx, x, G.GGML_OP_POOL_MAX, 2, 2)
    z = G.ggml_pool_1d(host_ctx, x, G.GGML_OP_POOL_AVG, 3)
    g = G.ggml_build_forward_expand(host_ctx, y)
    G.ggml_build_forward_expand(g, z)
    G.ggml_graph_compute(host_ctx, g)
    assert y.shape[:2] == (3, 2) and z.shape[0] == 2
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(y).reshape(1, 2, 2, 3),
                               vals.reshape(1, 2, 2, 2, 3, 2).max(axis=(3, 5)), rtol=1e-6)
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(z).reshape(1, 2, 4, 2),
                               vals.reshape(1, 2, 4, 2, 3).mean(axis=4), rtol=1e-6)


def _tensors(ctx):
    out, t = [], G.ggml_get_first_tensor(ctx)
    while t is not None:
        out.append(t)
        t = G.ggml_get_next_tensor(ctx, t)
    return out
