"""ggmlR's core API in ggmlpy: its call forms (ggml_build_forward_expand(ctx, tensor), ggml_graph_compute),
ggml_version, ggml_init_auto, ggml_reset, the scalar helpers and the library / tensor facts (info.py).

References are numpy (values, strides, views) and ggml's documented constants (type sizes); misuse
must raise ggmlpy's errors, never abort.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.core.handle import using


F32, F16, I32 = G.GGML_TYPE_F32, G.GGML_TYPE_F16, G.GGML_TYPE_I32


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


# ---------------------------------------------------------------- scalar helpers

def _tensors(ctx):
    out, t = [], G.ggml_get_first_tensor(ctx)
    while t is not None:
        out.append(t)
        t = G.ggml_get_next_tensor(ctx, t)
    return out


@pytest.fixture(params=["context", "buffer"])
def where(request, backend):
    """Tensors in context memory, or (no_alloc) in a backend buffer: the helpers must work for both."""
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + (1 << 16), no_alloc=request.param == "buffer")
    made = []

    def new(typ, *ne):
        t = G.ggml_new_tensor(ctx, typ, len(ne), ne)
        made.append(t)
        return t

    def done():
        if request.param == "buffer":
            made.append(G.ggml_backend_alloc_ctx_tensors(ctx, backend))

    yield new, done
    for h in made[::-1]:
        if hasattr(h, "free"):
            h.free()
    ctx.free()


@pytest.mark.parametrize("typ,dtype", [(F32, np.float32), (F16, np.float16), (G.GGML_TYPE_F64, np.float64),
                                       (I32, np.int32), (G.GGML_TYPE_I8, np.int8), (G.GGML_TYPE_I16, np.int16)])
def test_get_and_set_one_element_match_numpy(where, typ, dtype, rng):
    new, done = where
    t = new(typ, 5, 3, 2)
    done()
    ref = rng.integers(-50, 50, (2, 3, 5)).astype(dtype)                # numpy shape of ne [5, 3, 2]
    G.ggml_backend_tensor_set_data(t, ref)
    flat = ref.reshape(-1)
    for i in (0, 7, 29):
        assert G.ggml_get_f32_1d(t, i) == float(flat[i])
        assert G.ggml_get_i32_1d(t, i) == int(flat[i])
    assert G.ggml_get_f32_nd(t, 4, 2, 1) == float(ref[1, 2, 4])
    assert G.ggml_get_i32_nd(t, 1) == int(ref[0, 0, 1])
    G.ggml_set_f32_1d(t, 7, 12.0)
    G.ggml_set_i32_1d(t, 8, -9)
    G.ggml_set_f32_nd(t, 0, 1, 1, value=3.0)
    G.ggml_set_i32_nd(t, 4, 2, 1, value=-7)
    ref = ref.copy()
    ref.reshape(-1)[7], ref.reshape(-1)[8], ref[1, 1, 0], ref[1, 2, 4] = 12, -9, 3, -7
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), ref.reshape(-1))
    with pytest.raises(G.GgmlValueError, match=r"\[0, 30\)"):
        G.ggml_get_f32_1d(t, 30)
    with pytest.raises(G.GgmlValueError, match=r"i1 must be in \[0, 3\)"):
        G.ggml_get_f32_nd(t, 0, 3)
    with pytest.raises(G.GgmlValueError):
        G.ggml_set_i32_1d(t, -1, 0)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_get_f32_1d(t, 1.0)


def test_views_are_read_at_their_logical_positions(hctx, rng):
    m = G.ggml_new_tensor_2d(hctx, F32, 4, 3)
    ref = rng.standard_normal((3, 4)).astype(np.float32)
    G.ggml_set_f32(m, ref)
    mt = G.ggml_transpose(hctx, m)                                  # ne [3, 4]: numpy ref.T
    for i0 in range(3):
        for i1 in range(4):
            assert G.ggml_get_f32_nd(mt, i0, i1) == ref.T[i1, i0]
    assert [G.ggml_get_f32_1d(mt, i) for i in range(12)] == list(ref.T.reshape(-1))
    G.ggml_set_f32_nd(mt, 2, 1, value=100.0)                        # writes through to m
    assert G.ggml_get_f32_nd(m, 1, 2) == 100.0
    with pytest.raises(G.GgmlValueError, match="strided view"):
        G.ggml_set_f32(mt, 0.0)


def test_values_that_do_not_fit_the_type_are_refused(hctx):
    i8 = G.ggml_new_tensor_1d(hctx, G.GGML_TYPE_I8, 4)
    h = G.ggml_new_tensor_1d(hctx, F16, 4)
    f = G.ggml_new_tensor_1d(hctx, F32, 4)
    with pytest.raises(G.GgmlValueError, match="-128, 127"):
        G.ggml_set_i32_1d(i8, 0, 300)
    with pytest.raises(G.GgmlTypeError, match="non-integral"):
        G.ggml_set_f32_1d(i8, 0, 2.5)
    with pytest.raises(G.GgmlValueError, match="inf"):
        G.ggml_set_f32_1d(h, 0, 1e6)
    with pytest.raises(G.GgmlValueError, match="32-bit"):
        G.ggml_set_i32_1d(f, 0, 2 ** 40)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_set_i32_1d(f, 0, 1.5)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_set_f32_1d(f, 0, "1")
    with pytest.raises(G.GgmlTypeError, match="value is required"):
        G.ggml_set_i32_nd(f, 0)
    G.ggml_set_f32(f, float("nan"))
    assert np.isnan(G.ggml_get_f32_1d(f, 0))
    with pytest.raises(G.GgmlValueError, match="no integer value"):
        G.ggml_get_i32_1d(f, 0)
    G.ggml_set_f32_1d(f, 1, -2.7)
    assert G.ggml_get_i32_1d(f, 1) == -2                            # truncated toward zero, as ggml's C helper


def test_unallocated_and_quantized_tensors_are_refused(tmp_path):
    ctx = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    t = G.ggml_new_tensor_1d(ctx, F32, 4)
    for call in (lambda: G.ggml_get_f32_1d(t, 0), lambda: G.ggml_set_i32_nd(t, 0, value=1), lambda: G.ggml_get_f32(t),
                 lambda: G.ggml_set_f32(t, [1, 2, 3, 4])):
        with pytest.raises(G.GgmlStateError, match="no memory"):
            call()
    with pytest.raises(G.GgmlStateError, match="no_alloc"):
        G.ggml_new_f32(ctx, 1.0)
    ctx.free()
    from tests.helpers.gguf_writer import q8_0, write_gguf
    path = tmp_path / "q.gguf"
    write_gguf(path, [], [("q", [32], 8, q8_0(np.ones(1, np.float16), np.arange(32).reshape(1, 32)))])
    with G.gguf_load(path) as g:
        q = G.ggml_get_tensor(g.ggml_ctx, "q")
        with pytest.raises(G.GgmlTypeError, match="Q8_0|q8_0"):
            G.ggml_get_f32_1d(q, 0)
        np.testing.assert_array_equal(G.gguf_tensor_data(g, "q"), np.arange(32))


def test_whole_tensor_forms_of_ggmlr(hctx):
    a = G.ggml_new_tensor_2d(hctx, F32, 3, 2)
    G.ggml_set_f32(a, np.arange(6).reshape(2, 3))                  # ggmlR's ggml_set_f32(tensor, data)
    got = G.ggml_get_f32(a)
    assert got.dtype == np.float32 and got.shape == (6,)
    np.testing.assert_array_equal(got, np.arange(6))
    G.ggml_set_f32(a, 0.5)                                          # ggml's fill
    np.testing.assert_array_equal(G.ggml_get_f32(a), np.full(6, 0.5))
    with pytest.raises(G.GgmlTypeError, match="exactly 6 values"):
        G.ggml_set_f32(a, [1, 2, 3])
    with pytest.raises(G.GgmlValueError, match="transposed"):
        G.ggml_set_f32(a, np.zeros((3, 2)))
    pos = G.ggml_new_tensor_1d(hctx, I32, 10)
    G.ggml_set_i32(pos, range(10))
    got = G.ggml_get_i32(pos)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.arange(10))
    G.ggml_set_i32(pos, 7)
    np.testing.assert_array_equal(G.ggml_get_i32(pos), np.full(10, 7))
    with pytest.raises(G.GgmlTypeError, match="non-integral"):
        G.ggml_set_i32(pos, np.linspace(0, 1, 10))
    with pytest.raises(G.GgmlTypeError, match="ggml_get_f32"):
        G.ggml_get_i32(a)
    with pytest.raises(G.GgmlTypeError, match="ggml_get_i32"):
        G.ggml_get_f32(pos)
    bf = G.ggml_new_tensor_1d(hctx, G.GGML_TYPE_BF16, 3)
    G.ggml_set_f32(bf, [1.5, -2.25, 3.0])
    np.testing.assert_array_equal(G.ggml_get_f32(bf), [1.5, -2.25, 3.0])
    G.ggml_set_f32_1d(bf, 0, 1.0 + 2 ** -9)                         # rounds to bfloat16's 8-bit mantissa
    assert G.ggml_get_f32_1d(bf, 0) == 1.0


def test_new_scalars(hctx):
    s = G.ggml_new_f32(hctx, 3.25)
    k = G.ggml_new_i32(hctx, -42)
    assert G.ggml_tensor_shape(s) == (1, 1, 1, 1) and G.ggml_tensor_type(k) == I32
    assert G.ggml_get_f32(s)[0] == 3.25 and G.ggml_get_i32(k)[0] == -42
    n = G.ggml_tensor_num(hctx)
    with pytest.raises(G.GgmlValueError):
        G.ggml_new_i32(hctx, 2 ** 31)
    with pytest.raises(G.GgmlValueError):
        G.ggml_new_f32(hctx, 1e39)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_new_f32(hctx, None)
    assert G.ggml_tensor_num(hctx) == n                             # a refused value creates nothing


# ---------------------------------------------------------------- info.py

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
