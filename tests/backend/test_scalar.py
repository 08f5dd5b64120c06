"""ggmlR's scalar helpers (backend/scalar.py): one element or a whole tensor read and written as ggml's C helpers
do, in context memory and in a backend buffer, against numpy (values, strides, views); values that do not fit the
type, unallocated and quantized tensors are refused with ggmlpy's errors.
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


# ---------------------------------------------------------------- scalar helpers

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
