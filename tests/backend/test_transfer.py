"""Moving data between numpy and tensors: ggml layout, types, offsets, counts, errors."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G


TYPES = [
    (G.GGML_TYPE_F32, np.float32),
    (G.GGML_TYPE_F16, np.float16),
    (G.GGML_TYPE_I32, np.int32),
]


def _data(rng, dtype, shape):
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-1000, 1000, size=shape).astype(dtype)
    return rng.uniform(-3, 3, size=shape).astype(dtype)


@pytest.fixture
def alloc_ctx(backend):
    """A no_alloc context whose tensors are allocated on the CPU backend by ``alloc()``."""
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(64) + 4096, no_alloc=True)
    bufs = []

    def alloc():
        bufs.append(G.ggml_backend_alloc_ctx_tensors(ctx, backend))
    ctx.alloc = alloc
    yield ctx
    for b in bufs:
        if b is not None:
            b.free()
    ctx.free()


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("gtype,dtype", TYPES, ids=["F32", "F16", "I32"])
@pytest.mark.parametrize("where", ["backend", "host"])
def test_round_trip_in_ggml_layout(rng, alloc_ctx, host_ctx, gtype, dtype, where):
    N, F = 5, 3
    ctx = alloc_ctx if where == "backend" else host_ctx
    t = G.ggml_new_tensor_2d(ctx, gtype, F, N)          # [F, N]: N samples of F features
    if where == "backend":
        ctx.alloc()
    arr = _data(rng, dtype, (N, F))                     # the (N, F) array is already in ggml layout
    G.ggml_backend_tensor_set_data(t, arr)
    flat = G.ggml_backend_tensor_get_data(t)
    assert flat.dtype == np.dtype(dtype)
    assert flat.shape == (N * F,)
    np.testing.assert_array_equal(flat, arr.ravel())    # ggml order = C order of (N, F)
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(t), arr)
    assert G.ggml_tensor_shape(t) == (F, N, 1, 1)
    assert G.ggml_nelements(t) == N * F
    assert G.ggml_nbytes(t) == N * F * np.dtype(dtype).itemsize


def test_layout_means_ne0_is_the_fast_axis(rng, alloc_ctx, sched):
    """sum_rows of a [F, N] tensor written from an (N, F) array sums each sample's features."""
    N, F = 6, 4
    arr = _data(rng, np.float32, (N, F))
    x = G.ggml_new_tensor_2d(alloc_ctx, G.GGML_TYPE_F32, F, N)
    alloc_ctx.alloc()
    G.ggml_backend_tensor_set_data(x, arr)
    ops = G.ggml_init(8 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(16) + 1024, no_alloc=True)
    try:
        s = G.ggml_set_output(G.ggml_sum_rows(ops, x))
        g = G.ggml_new_graph_custom(ops, 16)
        G.ggml_build_forward_expand(g, s)
        G.ggml_backend_sched_alloc_graph(sched, g)
        G.ggml_backend_sched_graph_compute(sched, g)
        assert G.ggml_tensor_shape(s) == (1, N, 1, 1)
        np.testing.assert_allclose(G.ggml_backend_tensor_get_data(s), arr.astype(np.float64).sum(axis=1), rtol=1e-6)
    finally:
        ops.free()


def test_conversion_to_the_tensor_type(alloc_ctx):
    f32 = G.ggml_new_tensor_1d(alloc_ctx, G.GGML_TYPE_F32, 4)
    f16 = G.ggml_new_tensor_1d(alloc_ctx, G.GGML_TYPE_F16, 4)
    i32 = G.ggml_new_tensor_1d(alloc_ctx, G.GGML_TYPE_I32, 4)
    alloc_ctx.alloc()
    values = [0.1, -2.5, 1e-3, 3.0]
    G.ggml_backend_tensor_set_data(f32, values)                          # a list of Python floats
    G.ggml_backend_tensor_set_data(f16, np.array(values, np.float64))     # float64 -> F16
    G.ggml_backend_tensor_set_data(i32, np.array([1.0, -2.0, 7.0, 0.0]))  # integral floats -> I32
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(f32), np.float32(values))
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(f16), np.float16(values))
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(i32), [1, -2, 7, 0])
    mv = memoryview(np.arange(4, dtype=np.int32))
    G.ggml_backend_tensor_set_data(i32, mv)                             # a memoryview
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(i32), [0, 1, 2, 3])
    with pytest.raises(TypeError, match="integers"):
        G.ggml_backend_tensor_set_data(i32, [0.5, 1, 2, 3])
    with pytest.raises(TypeError):
        G.ggml_backend_tensor_set_data(f32, ["a", "b", "c", "d"])


@pytest.mark.parametrize("where", ["backend", "host"])
def test_offsets_and_partial_reads_writes(rng, alloc_ctx, host_ctx, where):
    ctx = alloc_ctx if where == "backend" else host_ctx
    t = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    if where == "backend":
        ctx.alloc()
    base = np.arange(12, dtype=np.float32)
    G.ggml_backend_tensor_set_data(t, base)
    G.ggml_backend_tensor_set_data(t, [100, 101, 102], offset=5)
    expected = base.copy()
    expected[5:8] = [100, 101, 102]
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), expected)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t, offset=4), expected[4:])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t, offset=3, n_elements=5), expected[3:8])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t, n_elements=2), expected[:2])
    assert G.ggml_backend_tensor_get_data(t, offset=12).size == 0
    G.ggml_backend_tensor_set_data(t, [7], offset=11)                     # the last element fits
    assert G.ggml_backend_tensor_get_data(t, offset=11)[0] == 7


def test_set_f32_fills(alloc_ctx):
    t = G.ggml_new_tensor_3d(alloc_ctx, G.GGML_TYPE_F32, 2, 3, 2)
    alloc_ctx.alloc()
    G.ggml_set_f32(t, 1.5)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), np.full(12, 1.5, np.float32))


# ---------------------------------------------------------------- wrong counts and ranges

def test_too_many_elements_names_the_counts(alloc_ctx):
    t = G.ggml_new_tensor_2d(alloc_ctx, G.GGML_TYPE_F32, 4, 3)
    alloc_ctx.alloc()
    with pytest.raises(ValueError) as e:
        G.ggml_backend_tensor_set_data(t, np.zeros(13, np.float32))
    assert "12" in str(e.value) and "13" in str(e.value)
    with pytest.raises(ValueError) as e:
        G.ggml_backend_tensor_set_data(t, np.zeros(5, np.float32), offset=8)
    assert "12" in str(e.value) and "5" in str(e.value) and "8" in str(e.value)
    with pytest.raises(ValueError):
        G.ggml_backend_tensor_set_data(t, [1.0], offset=-1)


def test_reading_out_of_range_raises(alloc_ctx):
    t = G.ggml_new_tensor_1d(alloc_ctx, G.GGML_TYPE_I32, 6)
    alloc_ctx.alloc()
    for kwargs in (dict(offset=7), dict(offset=2, n_elements=5), dict(offset=-1), dict(n_elements=-2)):
        with pytest.raises(ValueError, match="6"):
            G.ggml_backend_tensor_get_data(t, **kwargs)


def test_unallocated_tensor_raises_state_error(ctx):
    t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)   # no_alloc, never allocated
    with pytest.raises(RuntimeError, match="no memory"):
        G.ggml_backend_tensor_set_data(t, np.zeros(4, np.float32))
    with pytest.raises(RuntimeError, match="no memory"):
        G.ggml_backend_tensor_get_data(t)


def test_unsupported_type_raises_type_error(alloc_ctx):
    t = G.ggml_new_tensor_1d(alloc_ctx, G.GGML_TYPE_BF16, 4)
    alloc_ctx.alloc()
    with pytest.raises(TypeError, match="BF16|bf16"):
        G.ggml_backend_tensor_set_data(t, np.zeros(4))


# ---------------------------------------------------------------- shapes of ggml_tensor_to_numpy

@pytest.mark.parametrize("ne,shape", [
    ((7,), (7,)),
    ((4, 3), (3, 4)),
    ((4, 1), (4,)),               # a trailing ggml 1 (leading numpy axis) is dropped
    ((1, 5), (5, 1)),             # ne0 == 1 stays
    ((2, 3, 4), (4, 3, 2)),
    ((2, 3, 1, 5), (5, 1, 3, 2)),  # an inner 1 stays
    ((1, 1, 1, 1), (1,)),
])
def test_tensor_to_numpy_shapes(host_ctx, ne, shape):
    t = G.ggml_new_tensor(host_ctx, G.GGML_TYPE_F32, len(ne), ne)
    n = int(np.prod(ne))
    G.ggml_backend_tensor_set_data(t, np.arange(n, dtype=np.float32))
    out = G.ggml_tensor_to_numpy(t)
    assert out.shape == shape
    np.testing.assert_array_equal(out.ravel(), np.arange(n))
    assert G.ggml_tensor_shape(t) == tuple(ne) + (1,) * (4 - len(ne))


def test_strided_views_read_in_ggml_order(rng, host_ctx):
    arr = _data(rng, np.float32, (2, 3, 4))
    t = G.ggml_new_tensor_3d(host_ctx, G.GGML_TYPE_F32, 4, 3, 2)
    G.ggml_backend_tensor_set_data(t, arr)
    tt = G.ggml_transpose(host_ctx, t)                   # a non-contiguous view: [3, 4, 2]
    assert G.ggml_tensor_shape(tt) == (3, 4, 2, 1)
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(tt), np.swapaxes(arr, -1, -2))
    p = G.ggml_permute(host_ctx, t, 2, 0, 1, 3)          # [3, 2, 4]
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(p), np.transpose(arr, (2, 0, 1)))
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(p, offset=2, n_elements=3),
                                  np.transpose(arr, (2, 0, 1)).ravel()[2:5])
    with pytest.raises(ValueError, match="strided"):
        G.ggml_backend_tensor_set_data(tt, np.zeros(24, np.float32))   # writes stay contiguous-only


def test_view_with_offset_reads_its_window(rng, alloc_ctx):
    arr = _data(rng, np.float32, (3, 5))
    t = G.ggml_new_tensor_2d(alloc_ctx, G.GGML_TYPE_F32, 5, 3)
    v = G.ggml_view_1d(alloc_ctx, t, 4, 6 * 4)          # a contiguous view at element 6
    alloc_ctx.alloc()
    G.ggml_backend_tensor_set_data(t, arr)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(v), arr.ravel()[6:10])
    G.ggml_backend_tensor_set_data(v, [-1, -2, -3, -4])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t)[6:10], [-1, -2, -3, -4])


# ---------------------------------------------------------------- shape-aware writes (issue 9: no silent wrong result)

def _tensor(ctx, gtype, *ne):
    t = G.ggml_new_tensor(ctx, gtype, len(ne), list(ne))
    G.ggml_set_name(t, "t")
    return t


def _refused_leaves_data(t, call, exc=ValueError, match=None):
    """``call`` raises ``exc`` (matching ``match``) and the tensor keeps its values: nothing was written."""
    before = G.ggml_backend_tensor_get_data(t).copy()
    with pytest.raises(exc, match=match) as info:
        call()
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), before)
    return str(info.value)


@pytest.mark.parametrize("where", ["backend", "host"])
def test_a_transposed_array_is_refused_naming_both_shapes(rng, alloc_ctx, host_ctx, where):
    N, F = 5, 3
    ctx = alloc_ctx if where == "backend" else host_ctx
    t = _tensor(ctx, G.GGML_TYPE_F32, F, N)               # numpy shape (N, F)
    if where == "backend":
        ctx.alloc()
    arr = _data(rng, np.float32, (N, F))
    G.ggml_backend_tensor_set_data(t, arr)
    msg = _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, arr.T))  # (F, N): same count
    assert "(5, 3)" in msg and "(3, 5)" in msg and "arr.T" in msg and "'t'" in msg
    G.ggml_backend_tensor_set_data(t, arr.T.T)            # the fix the message names works
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(t), arr)


def test_same_count_other_layouts_are_refused_with_the_usual_fix(host_ctx):
    t3 = _tensor(host_ctx, G.GGML_TYPE_F32, 4, 3, 2)       # numpy (2, 3, 4)
    G.ggml_backend_tensor_set_data(t3, np.zeros(24))
    msg = _refused_leaves_data(t3, lambda: G.ggml_backend_tensor_set_data(t3, np.ones((2, 4, 3))))
    assert "(2, 3, 4)" in msg and "(2, 4, 3)" in msg and "swapaxes" in msg
    msg = _refused_leaves_data(t3, lambda: G.ggml_backend_tensor_set_data(t3, np.ones((4, 3, 2))))
    assert "arr.T" in msg
    msg = _refused_leaves_data(t3, lambda: G.ggml_backend_tensor_set_data(t3, np.ones((3, 2, 4))))
    assert "permuted" in msg
    msg = _refused_leaves_data(t3, lambda: G.ggml_backend_tensor_set_data(t3, np.ones((6, 4))))
    assert "(6, 4)" in msg and "(2, 3, 4)" in msg
    v = _tensor(host_ctx, G.GGML_TYPE_F32, 6)              # numpy (6,)
    G.ggml_backend_tensor_set_data(v, np.zeros(6))
    msg = _refused_leaves_data(v, lambda: G.ggml_backend_tensor_set_data(v, np.ones((6, 1))))  # a column
    assert "reshape(-1)" in msg
    inner = _tensor(host_ctx, G.GGML_TYPE_F32, 2, 3, 1, 5)  # numpy (5, 1, 3, 2): an inner 1 stays
    G.ggml_backend_tensor_set_data(inner, np.zeros(30))
    _refused_leaves_data(inner, lambda: G.ggml_backend_tensor_set_data(inner, np.ones((5, 3, 2))))


@pytest.mark.parametrize("ne,shape", [
    ((3, 5), (5, 3)),             # the numpy shape
    ((3, 5), (15,)),              # 1-D, exactly nelements
    ((3, 5), (1, 5, 3)),          # extra leading 1-axes
    ((3, 5), (1, 1, 15)),
    ((1, 5), (5,)),               # (N,) labels for a [1, N] tensor (numpy (5, 1))
    ((1, 5), (5, 1)),
    ((1, 5), (1, 5)),             # 1-D with a leading 1-axis: the same memory order
    ((5, 1), (5,)),               # numpy (5,): trailing ggml 1 dropped
    ((5, 1), (1, 5)),
    ((2, 3, 1, 5), (5, 1, 3, 2)),
    ((2, 3, 1, 5), (1, 5, 1, 3, 2)),
    ((1,), ()),                   # a scalar for one element
    ((1, 1), (1, 1, 1)),
])
def test_shapes_that_are_still_allowed(host_ctx, ne, shape):
    t = _tensor(host_ctx, G.GGML_TYPE_F32, *ne)
    n = int(np.prod(ne))
    arr = np.arange(n, dtype=np.float32).reshape(shape) + 1
    G.ggml_backend_tensor_set_data(t, arr)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), np.arange(n) + 1)


def test_a_short_array_needs_an_explicit_offset(host_ctx):
    t = _tensor(host_ctx, G.GGML_TYPE_F32, 4, 3)
    G.ggml_backend_tensor_set_data(t, np.arange(12))
    msg = _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, [1.0, 2.0, 3.0]))
    assert "12" in msg and "3" in msg and "offset=" in msg
    _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, np.ones((2, 4))))  # whole rows, no offset
    G.ggml_backend_tensor_set_data(t, [-1, -2, -3], offset=0)  # an explicit 0 is a partial write
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [-1, -2, -3] + list(range(3, 12)))
    G.ggml_backend_tensor_set_data(t, np.full(12, 5.0), offset=0)  # a full write with offset=0 is fine
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), np.full(12, 5.0))


def test_partial_writes_of_whole_rows(host_ctx):
    t = _tensor(host_ctx, G.GGML_TYPE_F32, 4, 3)           # numpy (3, 4)
    G.ggml_backend_tensor_set_data(t, np.zeros((3, 4)))
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    G.ggml_backend_tensor_set_data(t, rows, offset=4)      # rows 1 and 2
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(t), np.vstack([np.zeros((1, 4)), rows]))
    G.ggml_backend_tensor_set_data(t, np.zeros((1, 1, 4)), offset=8)   # leading 1-axes are fine
    # a transposed block, a block of other rows, a misaligned block: each refused
    msg = _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, rows.T, offset=0))
    assert "(4, 2)" in msg and "ravel" in msg
    _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, np.ones((4, 2)), offset=4))
    msg = _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, np.ones((2, 4)), offset=2))
    assert "multiple of 4" in msg
    # a full-size write at an explicit offset 0 follows the whole-tensor rule
    _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, np.ones((4, 3)), offset=0), match="arr.T")
    G.ggml_backend_tensor_set_data(t, np.ones((2, 4)).ravel(), offset=2)  # the fix the message names


def test_bad_offsets_are_refused(host_ctx):
    t = _tensor(host_ctx, G.GGML_TYPE_F32, 4)
    G.ggml_backend_tensor_set_data(t, np.zeros(4))
    for offset in (True, 1.0, -1, "1"):
        _refused_leaves_data(t, lambda offset=offset: G.ggml_backend_tensor_set_data(t, [1.0], offset=offset),
                             match="offset")
    G.ggml_backend_tensor_set_data(t, [1.0], offset=np.int64(3))
    assert G.ggml_backend_tensor_get_data(t)[3] == 1.0


@pytest.mark.parametrize("gtype,values,bad", [
    (G.GGML_TYPE_I8, [1, 300], 300),
    (G.GGML_TYPE_I8, [-129, 0], -129),
    (G.GGML_TYPE_I16, [40000, 0], 40000),
    (G.GGML_TYPE_I32, [2 ** 40 + 5, 0], 2 ** 40 + 5),
    (G.GGML_TYPE_I32, np.array([2.0 ** 40 + 5, 0.0]), None),   # integral floats out of range
    (G.GGML_TYPE_I32, np.array([2.0 ** 31, 0.0]), None),       # just above int32's max
    (G.GGML_TYPE_I64, np.array([2.0 ** 63, 0.0]), None),       # float(iinfo.max) rounds up to 2**63
    (G.GGML_TYPE_I32, np.array([2 ** 31, 0], dtype=np.uint64), None),
])
def test_integer_values_that_would_wrap_are_refused(host_ctx, gtype, values, bad):
    t = _tensor(host_ctx, gtype, 2)
    G.ggml_backend_tensor_set_data(t, [7, 8])
    msg = _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, values), match="wrap")
    if bad is not None:
        assert str(bad) in msg


@pytest.mark.parametrize("gtype,dtype", [(G.GGML_TYPE_I8, np.int8), (G.GGML_TYPE_I16, np.int16),
                                         (G.GGML_TYPE_I32, np.int32), (G.GGML_TYPE_I64, np.int64)])
def test_integer_range_ends_are_allowed(host_ctx, gtype, dtype):
    info = np.iinfo(dtype)
    t = _tensor(host_ctx, gtype, 3)
    G.ggml_backend_tensor_set_data(t, [info.min, info.max, 0])          # Python ints
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [info.min, info.max, 0])
    G.ggml_backend_tensor_set_data(t, np.array([info.min, -1, 1], dtype=np.int64))
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [info.min, -1, 1])
    G.ggml_backend_tensor_set_data(t, np.array([float(info.min), 2.0, -3.0]))  # exact in float: fine
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [info.min, 2, -3])


def test_float_overflow_to_inf_is_refused(host_ctx):
    f16 = _tensor(host_ctx, G.GGML_TYPE_F16, 3)
    f32 = _tensor(host_ctx, G.GGML_TYPE_F32, 3)
    G.ggml_backend_tensor_set_data(f16, [1, 2, 3])
    G.ggml_backend_tensor_set_data(f32, [1, 2, 3])
    msg = _refused_leaves_data(f16, lambda: G.ggml_backend_tensor_set_data(f16, [1.0, 70000.0, 0.0]), match="inf")
    assert "70000" in msg and "65504" in msg
    _refused_leaves_data(f16, lambda: G.ggml_backend_tensor_set_data(f16, np.array([0, -100000, 0])), match="inf")
    _refused_leaves_data(f32, lambda: G.ggml_backend_tensor_set_data(f32, np.array([1e39, 0, 0])), match="inf")
    # the largest finite value, and inf/nan given as such, are written as they are
    G.ggml_backend_tensor_set_data(f16, [65504.0, np.inf, np.nan])
    out = G.ggml_backend_tensor_get_data(f16)
    assert out[0] == 65504 and np.isposinf(out[1]) and np.isnan(out[2])


def test_complex_data_is_refused_bool_is_fine(host_ctx):
    f32 = _tensor(host_ctx, G.GGML_TYPE_F32, 2)
    i32 = _tensor(host_ctx, G.GGML_TYPE_I32, 2)
    for t in (f32, i32):
        G.ggml_backend_tensor_set_data(t, [3, 4])
        _refused_leaves_data(t, lambda t=t: G.ggml_backend_tensor_set_data(t, np.array([1 + 2j, 3])), TypeError,
                             match="complex")
        _refused_leaves_data(t, lambda t=t: G.ggml_backend_tensor_set_data(t, np.array([1 + 0j, 3])), TypeError,
                             match="complex")           # even with no imaginary part: say what to take
        G.ggml_backend_tensor_set_data(t, np.array([True, False]))
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), [1, 0])


def test_python_ints_too_large_for_numpy_are_refused(host_ctx):
    t = _tensor(host_ctx, G.GGML_TYPE_I64, 2)
    G.ggml_backend_tensor_set_data(t, [1, 2])
    _refused_leaves_data(t, lambda: G.ggml_backend_tensor_set_data(t, [2 ** 70, 1]), TypeError, match="int64")


def test_shape_problem_is_the_one_rule(host_ctx):
    """The rule BatchWriter shares: exact numpy shape, or 1-D of nelements, leading 1-axes aside."""
    from ggmlpy.backend.transfer import numpy_shape, shape_problem
    assert numpy_shape((4, 3, 1, 1)) == (3, 4)
    assert numpy_shape((1, 1, 1, 1)) == (1,)
    assert shape_problem((3, 4), (4, 3, 1, 1)) is None
    assert shape_problem((12,), (4, 3, 1, 1)) is None
    assert shape_problem((1, 1, 3, 4), (4, 3, 1, 1)) is None
    assert "arr.T" in shape_problem((4, 3), (4, 3, 1, 1))
    assert "expects 12 values" in shape_problem((11,), (4, 3, 1, 1))
    assert shape_problem((2, 4), (4, 3, 1, 1), offset=4) is None
    assert shape_problem((2, 4), (4, 3, 1, 1)) is not None


def test_a_new_opt_dataset_is_zeroed():
    """ggml allocates a dataset's tensors uninitialised: a forgotten write must not train on garbage."""
    ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_I32, 7, 3, 500, 1)
    assert not G.ggml_backend_tensor_get_data(G.ggml_opt_dataset_data(ds)).any()
    assert not G.ggml_backend_tensor_get_data(G.ggml_opt_dataset_labels(ds)).any()
    ds.free()
