"""ggmlpy/ops/sort.py: argsort, top_k and arange against numpy."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad, nd4


def distinct(rng, *shape):
    """Values without ties (the order of equal values is unspecified), float32."""
    n = int(np.prod(shape))
    return (rng.permutation(n).astype(np.float32) * 0.37 - 5.0).reshape(shape)


def test_sort_order_constants():
    from ggmlpy._ffi import lib
    assert G.GGML_SORT_ORDER_ASC == 0 == int(lib.GGML_SORT_ORDER_ASC)
    assert G.GGML_SORT_ORDER_DESC == 1 == int(lib.GGML_SORT_ORDER_DESC)


# ---------------------------------------------------------------- argsort

@pytest.mark.parametrize("shape", [(7,), (4, 9), (2, 3, 5), (2, 2, 3, 4)])
@pytest.mark.parametrize("order", ["asc", "desc", "default"])
def test_argsort(rng, shape, order):
    x = distinct(rng, *shape)
    if order == "default":
        (out,) = compute(lambda ctx, t: G.ggml_argsort(ctx, t), x)
        ref = np.argsort(x, axis=-1)
    else:
        o = G.GGML_SORT_ORDER_ASC if order == "asc" else G.GGML_SORT_ORDER_DESC
        (out,) = compute(lambda ctx, t: G.ggml_argsort(ctx, t, o), x)
        ref = np.argsort(x if order == "asc" else -x, axis=-1)
    np.testing.assert_array_equal(out, nd4(ref))
    assert out.dtype == np.int32


def test_argsort_ggmlr_example():
    # ggmlR's example: c(3, 1, 4, 1, 5) ascending -> positions of 1, 1, 3, 4, 5; the two 1s in either order
    (out,) = compute(lambda ctx, t: G.ggml_argsort(ctx, t), np.float32([3, 1, 4, 1, 5]))
    out = out.ravel().tolist()
    assert sorted(out[:2]) == [1, 3] and out[2:] == [0, 2, 4]


def test_argsort_feeds_get_rows(rng):
    """Gather values in sorted order: get_rows of the argsort indices."""
    x = distinct(rng, 6)

    def build(ctx, t):
        idx = G.ggml_argsort(ctx, t, G.GGML_SORT_ORDER_DESC)
        return G.ggml_reshape_1d(ctx, G.ggml_get_rows(ctx, G.ggml_reshape_2d(ctx, t, 1, 6), idx), 6)
    (out,) = compute(build, x)
    np.testing.assert_array_equal(out.ravel(), np.sort(x)[::-1])


def test_argsort_misuse(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 3)
    for bad in (2, -1):
        with pytest.raises(G.GgmlValueError, match="order"):
            G.ggml_argsort(ctx, a, bad)
    for bad in ("asc", 0.0, None, True):
        with pytest.raises(G.GgmlTypeError, match="order"):
            G.ggml_argsort(ctx, a, bad)
    for t in (G.GGML_TYPE_F16, G.GGML_TYPE_I32):  # the CPU kernel sorts F32 only
        with pytest.raises(G.GgmlTypeError):
            G.ggml_argsort(ctx, G.ggml_new_tensor_2d(ctx, t, 5, 3))
    with pytest.raises(G.GgmlValueError, match="contiguous"):
        G.ggml_argsort(ctx, G.ggml_transpose(ctx, a))
    with pytest.raises(G.GgmlTypeError):
        G.ggml_argsort(ctx, np.zeros(3, np.float32))


# ---------------------------------------------------------------- top_k

@pytest.mark.parametrize("shape,k", [((10,), 1), ((10,), 3), ((4, 9), 9), ((2, 3, 7), 4), ((2, 2, 3, 6), 2)])
def test_top_k_holds_the_k_largest(rng, shape, k):
    x = distinct(rng, *shape)
    (out,) = compute(lambda ctx, t: G.ggml_top_k(ctx, t, k), x)
    assert out.shape == nd4(x).shape[:-1] + (k,) and out.dtype == np.int32
    ref = np.argsort(-x, axis=-1)[..., :k]
    # the order within a row is unspecified: compare as sets
    np.testing.assert_array_equal(np.sort(out, axis=-1), nd4(np.sort(ref, axis=-1)))


def test_top_k_misuse(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 3)
    for bad in (0, -2):
        with pytest.raises(G.GgmlValueError, match="k"):
            G.ggml_top_k(ctx, a, bad)
    with pytest.raises(G.GgmlValueError, match="at most"):  # ggml asserts k <= ne[0]
        G.ggml_top_k(ctx, a, 6)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_top_k(ctx, a, 2.0)
    with pytest.raises(G.GgmlValueError):
        G.ggml_top_k(ctx, a, 2 ** 40)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_top_k(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 5, 3), 2)
    with pytest.raises(G.GgmlValueError, match="contiguous"):
        G.ggml_top_k(ctx, G.ggml_view_2d(ctx, a, 4, 3, 20, 0), 2)


# ---------------------------------------------------------------- arange

@pytest.mark.parametrize("args", [(0, 10), (0, 10, 1), (-3, 4, 2), (1.5, 3.0, 0.25), (0, 1, 0.1), (5, 5.5, 1)])
def test_arange(args):
    start, stop = args[:2]
    step = args[2] if len(args) > 2 else 1

    def build(ctx):
        return G.ggml_arange(ctx, *args)
    (out,) = compute(build)
    f32 = np.float32
    n = int(np.ceil(f32(f32(stop) - f32(start)) / f32(step)))
    ref = f32(start) + f32(step) * np.arange(n, dtype=np.float32)  # ggml: start + step * i in float32
    np.testing.assert_array_equal(out.ravel(), ref)
    # and these are numpy's values to float32 accuracy
    np.testing.assert_allclose(out.ravel(), np.arange(start, stop, step), rtol=1e-6, atol=1e-6)


def test_arange_as_an_operand(rng):
    x = rng.uniform(-1, 1, (3, 5)).astype(np.float32)
    (out,) = compute(lambda ctx, t: G.ggml_add(ctx, t, G.ggml_arange(ctx, 0, 5)), x)
    np.testing.assert_allclose(out, nd4(x + np.arange(5)), rtol=1e-6)


def test_arange_misuse(ctx):
    for bad in [(3, 3), (4, 2), (0, 10, 0), (0, 10, -1), (0, float("inf")), (float("nan"), 1), (0, 1e39),
                (1.0, 1.0 + 1e-9)]:  # the last: equal once rounded to float32, which ggml would assert on
        with pytest.raises(G.GgmlValueError):
            G.ggml_arange(ctx, *bad)
    for bad in [("0", 1), (0, None), (0, 1, True)]:
        with pytest.raises(G.GgmlTypeError):
            G.ggml_arange(ctx, *bad)
    with pytest.raises(G.GgmlValueError, match="too many"):
        G.ggml_arange(ctx, 0, 1e30, 1e-30)


def test_arange_shape(ctx):
    t = G.ggml_arange(ctx, 0, 1, 0.3)      # 0, 0.3, 0.6, 0.9
    assert G.ggml_tensor_shape(t) == (4, 1, 1, 1) and G.ggml_tensor_type(t) == G.GGML_TYPE_F32


# ---------------------------------------------------------------- next to a trainable graph

def test_sort_outputs_of_a_trainable_tensor_do_not_block_training():
    """argsort/top_k give I32 results, which ggml never differentiates: they may read a trainable tensor in a
    graph that is trained (here their indices even pick rows of a constant table that joins the loss)."""
    rng = np.random.default_rng(9)
    x, r = distinct(rng, 3, 4), rng.uniform(-1, 1, (3, 4)).astype(np.float32)

    def build(c, t):
        table = G.ggml_reshape_2d(c, G.ggml_arange(c, 0, 4), 1, 4)          # rows 0..3 hold 0..3
        picked = G.ggml_get_rows(c, table, G.ggml_reshape_1d(c, G.ggml_argsort(c, t), 12))   # [1, 12]
        top = G.ggml_get_rows(c, table, G.ggml_reshape_1d(c, G.ggml_top_k(c, t, 2), 6))      # [1, 6]
        extra = G.ggml_add(c, G.ggml_reshape_2d(c, picked, 4, 3),
                           G.ggml_repeat(c, G.ggml_sum(c, top), G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 4, 3)))
        return G.ggml_add(c, G.ggml_sqr(c, t), extra)
    loss, grad = compute_grad(build, x, r)
    xd = x.astype(np.float64)
    extra = np.argsort(x, axis=-1) + np.sort(np.argsort(-x, axis=-1)[:, :2]).sum()
    np.testing.assert_allclose(loss, np.sum((xd ** 2 + extra) * r), rtol=1e-5)
    np.testing.assert_allclose(grad, 2 * xd * r, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- Vulkan

@pytest.fixture(scope="module")
def vulkan():
    if "vulkan" not in [b.lower() for b in G.ggml_backends_built()]:
        pytest.skip("this ggmlpy is built without the Vulkan backend")
    if G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan device (for lavapipe, set GGML_VK_VISIBLE_DEVICES=0 before starting the tests)")
    b = G.ggml_backend_init_by_name("Vulkan0")
    yield b
    b.free()


def test_vulkan_argsort_top_k_arange(vulkan, rng):
    x = distinct(rng, 3, 12)
    outs = compute(lambda ctx, t: (G.ggml_argsort(ctx, t, G.GGML_SORT_ORDER_DESC), G.ggml_top_k(ctx, t, 4),
                                   G.ggml_add(ctx, t, G.ggml_arange(ctx, -6, 6))), x, backend=vulkan)
    np.testing.assert_array_equal(outs[0], nd4(np.argsort(-x, axis=-1)))
    np.testing.assert_array_equal(np.sort(outs[1], axis=-1), nd4(np.sort(np.argsort(-x, axis=-1)[:, :4], axis=-1)))
    np.testing.assert_allclose(outs[2], nd4(x + np.arange(-6, 6)), rtol=1e-6)
