"""ggmlpy/ops/inplace.py: the in-place ops compute what their out-of-place twins compute, into a's memory.

Each result is checked against numpy float64, and so is ``a`` itself after the compute (it was
overwritten). Also: the result is a view of ``a`` whose lifetime follows a's; the arguments are
checked like the out-of-place op's (errors name the in-place function); and in-place ops that
follow a trainable parameter are refused, since ggml aborts the process when it builds a
backward pass through one.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import ggmlpy as G
import ggmlpy.ops.inplace as inplace_module
from tests.helpers.compute import compute, nd4
from tests.helpers.subprocesses import run_in_subprocess


F32_TOL = dict(rtol=2e-5, atol=2e-6)
TESTED: set[str] = set()


def r32(rng, *shape, lo=-2.0, hi=2.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def assert_close(out, ref, **tol):
    ref = nd4(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    np.testing.assert_allclose(out.astype(np.float64), ref, **(tol or F32_TOL))


def run_inplace(fn, *arrays, backend=None):
    """Compute ``fn(ctx, *inputs)``; return (result, a after the compute)."""
    def build(ctx, a, *rest):
        return fn(ctx, a, *rest), a
    out, a_after = compute(build, *arrays, backend=backend)
    return out, a_after


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _gelu_table(x):  # ggml's CPU gelu: the tanh form in float32 (patches/0019)
    x = f64(np.asarray(x, np.float32))
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------- element-wise unary

UNARY = {
    "ggml_abs_inplace": (np.abs, (-3, 3), None),
    "ggml_dup_inplace": (lambda x: x, (-3, 3), None),
    "ggml_elu_inplace": (lambda x: np.where(x > 0, x, np.expm1(x)), (-3, 3), dict(rtol=1e-5, atol=1e-6)),
    "ggml_exp_inplace": (np.exp, (-4, 4), dict(rtol=1e-5, atol=1e-6)),
    "ggml_log_inplace": (np.log, (0.05, 5), None),
    "ggml_neg_inplace": (np.negative, (-3, 3), None),
    "ggml_gelu_inplace": (_gelu_table, (-4, 4), dict(rtol=2e-6, atol=1e-6)),
    "ggml_relu_inplace": (lambda x: np.maximum(x, 0), (-3, 3), None),
    "ggml_silu_inplace": (lambda x: x / (1 + np.exp(-x)), (-6, 6), dict(rtol=1e-5, atol=1e-6)),
    "ggml_sigmoid_inplace": (lambda x: 1 / (1 + np.exp(-x)), (-6, 6), dict(rtol=1e-5, atol=1e-6)),
    "ggml_tanh_inplace": (np.tanh, (-3, 3), dict(rtol=1e-5, atol=1e-6)),
    "ggml_softplus_inplace": (_softplus, (-6, 25), dict(rtol=1e-5, atol=1e-6)),
    "ggml_sqr_inplace": (np.square, (-3, 3), None),
    "ggml_sqrt_inplace": (np.sqrt, (0.01, 5), None),
    "ggml_ceil_inplace": (np.ceil, (-4, 4), dict(rtol=0, atol=0)),
    "ggml_floor_inplace": (np.floor, (-4, 4), dict(rtol=0, atol=0)),
    "ggml_round_inplace": (lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5), (-4, 4), dict(rtol=0, atol=0)),
}
TESTED.update(UNARY)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_inplace(rng, name):
    ref_fn, (lo, hi), tol = UNARY[name]
    x = r32(rng, 2, 3, 9, lo=lo, hi=hi)
    if name == "ggml_round_inplace":
        x.flat[:4] = [2.5, -2.5, 0.5, -1.5]
    out, a_after = run_inplace(getattr(G, name), x)
    ref = ref_fn(f64(x))
    assert_close(out, ref, **(tol or {}))
    assert_close(a_after, ref, **(tol or {}))  # a itself now holds the result


# ---------------------------------------------------------------- element-wise binary

BINARY = {"ggml_add_inplace": np.add, "ggml_sub_inplace": np.subtract, "ggml_mul_inplace": np.multiply,
          "ggml_div_inplace": np.divide}
TESTED.update(BINARY)


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("b_shape", [(2, 3, 4), (1, 1, 4), (1, 3, 1)], ids=str)
def test_binary_inplace(rng, name, b_shape):
    a = r32(rng, 2, 3, 4)
    b = r32(rng, *b_shape, lo=0.5, hi=2.0)
    out, a_after = run_inplace(getattr(G, name), a, b)
    ref = BINARY[name](f64(a), np.broadcast_to(f64(b), a.shape))
    assert_close(out, ref)
    assert_close(a_after, ref)


# ---------------------------------------------------------------- ops with parameters

TESTED.update({"ggml_clamp_inplace", "ggml_scale_inplace", "ggml_norm_inplace", "ggml_rms_norm_inplace",
               "ggml_soft_max_inplace", "ggml_soft_max_ext_inplace", "ggml_diag_mask_inf_inplace"})


def test_clamp_inplace(rng):
    x = r32(rng, 3, 5)
    out, a_after = run_inplace(lambda c, t: G.ggml_clamp_inplace(c, t, -0.25, 0.5), x)
    assert_close(out, np.clip(f64(x), -0.25, 0.5))
    assert_close(a_after, np.clip(f64(x), -0.25, 0.5))


def test_scale_inplace(rng):
    x = r32(rng, 3, 5)
    out, a_after = run_inplace(lambda c, t: G.ggml_scale_inplace(c, t, -0.75), x)
    assert_close(out, -0.75 * f64(x))
    assert_close(a_after, -0.75 * f64(x))


@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_norm_inplace(rng, eps):
    x = r32(rng, 3, 7)
    ref = (f64(x) - f64(x).mean(-1, keepdims=True)) / np.sqrt(f64(x).var(-1, keepdims=True) + eps)
    out, a_after = run_inplace(lambda c, t: G.ggml_norm_inplace(c, t, eps), x)
    assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_close(a_after, ref, rtol=1e-4, atol=1e-5)
    (default,) = compute(lambda c, t: G.ggml_norm_inplace(c, t), x)  # ggmlR's default eps = 1e-5
    assert_close(default, (f64(x) - f64(x).mean(-1, keepdims=True)) / np.sqrt(f64(x).var(-1, keepdims=True) + 1e-5),
                 rtol=1e-4, atol=1e-5)


def test_rms_norm_inplace(rng):
    x = r32(rng, 3, 7)
    ref = f64(x) / np.sqrt((f64(x) ** 2).mean(-1, keepdims=True) + 1e-6)
    out, a_after = run_inplace(lambda c, t: G.ggml_rms_norm_inplace(c, t, 1e-6), x)
    assert_close(out, ref, rtol=1e-4, atol=1e-5)
    assert_close(a_after, ref, rtol=1e-4, atol=1e-5)


def test_soft_max_inplace(rng):
    x = r32(rng, 2, 3, 6)
    out, a_after = run_inplace(lambda c, t: G.ggml_soft_max_inplace(c, t), x)
    assert_close(out, _softmax(f64(x)), rtol=1e-5, atol=1e-6)
    assert_close(a_after, _softmax(f64(x)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_mask", [False, True])
def test_soft_max_ext_inplace(rng, with_mask):
    x = r32(rng, 2, 3, 6)
    mask = np.triu(np.full((3, 6), -np.inf, np.float32), 2)   # [6, 3]: some positions excluded
    if with_mask:
        out, a_after = run_inplace(lambda c, t, m: G.ggml_soft_max_ext_inplace(c, t, m, 0.5), x, mask)
        ref = _softmax(0.5 * f64(x) + f64(mask))
    else:
        out, a_after = run_inplace(lambda c, t: G.ggml_soft_max_ext_inplace(c, t, scale=0.5), x)
        ref = _softmax(0.5 * f64(x))
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    assert_close(a_after, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n_past", [0, 2])
def test_diag_mask_inf_inplace(rng, n_past):
    x = r32(rng, 2, 4, 6)
    cols, rows = np.arange(6)[None, :], np.arange(4)[:, None]
    ref = np.where(cols > n_past + rows, -np.inf, f64(x))
    out, a_after = run_inplace(lambda c, t: G.ggml_diag_mask_inf_inplace(c, t, n_past), x)
    np.testing.assert_array_equal(out, nd4(ref))
    np.testing.assert_array_equal(a_after, nd4(ref))


# ---------------------------------------------------------------- a view of a

def test_result_is_a_view_of_a_without_data_of_its_own(host_ctx):
    a = G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 64, 16)
    before = G.ggml_used_mem(host_ctx)
    v = G.ggml_relu_inplace(host_ctx, a)
    used_inplace = G.ggml_used_mem(host_ctx) - before
    assert v.ptr.view_src == a.ptr and v.ptr.data == a.ptr.data
    before = G.ggml_used_mem(host_ctx)
    G.ggml_relu(host_ctx, a)
    used_plain = G.ggml_used_mem(host_ctx) - before
    assert used_plain - used_inplace >= 64 * 16 * 4  # the out-of-place op takes the data, the view does not
    assert G.ggml_tensor_shape(v) == (64, 16, 1, 1)


def test_result_follows_the_lifetime_of_a():
    """A view made in another context: once a's context is freed, the view is unusable (no dangling read)."""
    ctx_a = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    ctx_b = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    try:
        a = G.ggml_new_tensor_1d(ctx_a, G.GGML_TYPE_F32, 8)
        b = G.ggml_new_tensor_1d(ctx_a, G.GGML_TYPE_F32, 8)
        v = G.ggml_add_inplace(ctx_b, a, b)
        assert ctx_a in v.keepers and ctx_b in v.keepers
        ctx_a.free()
        assert not v.alive
        with pytest.raises(G.GgmlStateError, match="freed"):
            G.ggml_tensor_shape(v)
        with pytest.raises(G.GgmlStateError):
            G.ggml_relu_inplace(ctx_b, v)
    finally:
        ctx_b.free()
        ctx_a.free()


def test_computing_again_applies_the_op_again(host_ctx):
    a = G.ggml_new_tensor_1d(host_ctx, G.GGML_TYPE_F32, 4)
    b = G.ggml_new_tensor_1d(host_ctx, G.GGML_TYPE_F32, 4)
    G.ggml_backend_tensor_set_data(a, np.float32([1, 2, 3, 4]))
    G.ggml_backend_tensor_set_data(b, np.float32([10, 10, 10, 10]))
    v = G.ggml_add_inplace(host_ctx, a, b)
    graph = G.ggml_new_graph(host_ctx)
    G.ggml_build_forward_expand(graph, v)
    G.ggml_graph_compute_with_ctx(host_ctx, graph, 1)
    G.ggml_graph_compute_with_ctx(host_ctx, graph, 1)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(a), [21, 22, 23, 24])
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(v), [21, 22, 23, 24])


# ---------------------------------------------------------------- the out-of-place checks, naming the in-place op

def test_misuse_is_refused_like_the_out_of_place_op(ctx):
    f32 = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    i32 = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 4, 3)
    tr = G.ggml_transpose(ctx, f32)
    cases = [
        (G.GgmlTypeError, "ggml_relu_inplace", lambda: G.ggml_relu_inplace(ctx, i32)),
        (G.GgmlTypeError, "ggml_gelu_inplace",
         lambda: G.ggml_gelu_inplace(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_BF16, 4))),
        (G.GgmlValueError, "ggml_sqrt_inplace", lambda: G.ggml_sqrt_inplace(ctx, tr)),
        (G.GgmlTypeError, "ggml_round_inplace", lambda: G.ggml_round_inplace(ctx, i32)),
        (G.GgmlValueError, "ggml_ceil_inplace", lambda: G.ggml_ceil_inplace(ctx, tr)),
        (G.GgmlTypeError, "ggml_exp_inplace", lambda: G.ggml_exp_inplace(ctx, "a tensor")),
        (G.GgmlValueError, "ggml_add_inplace",
         lambda: G.ggml_add_inplace(ctx, f32, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 3))),
        (G.GgmlTypeError, "ggml_mul_inplace", lambda: G.ggml_mul_inplace(ctx, f32, i32)),
        (G.GgmlValueError, "ggml_div_inplace", lambda: G.ggml_div_inplace(ctx, tr, tr)),
        (G.GgmlValueError, "ggml_scale_inplace", lambda: G.ggml_scale_inplace(ctx, f32, float("nan"))),
        (G.GgmlValueError, "ggml_scale_inplace", lambda: G.ggml_scale_inplace(ctx, tr, 2.0)),
        (G.GgmlTypeError, "ggml_scale_inplace",
         lambda: G.ggml_scale_inplace(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F16, 4), 2.0)),
        (G.GgmlValueError, "ggml_norm_inplace", lambda: G.ggml_norm_inplace(ctx, f32, -1.0)),
        (G.GgmlValueError, "ggml_rms_norm_inplace", lambda: G.ggml_rms_norm_inplace(ctx, tr)),
        (G.GgmlValueError, "ggml_soft_max_inplace", lambda: G.ggml_soft_max_inplace(ctx, tr)),
        (G.GgmlValueError, "ggml_soft_max_ext_inplace",
         lambda: G.ggml_soft_max_ext_inplace(ctx, f32, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 3))),
        (G.GgmlValueError, "ggml_soft_max_ext_inplace", lambda: G.ggml_soft_max_ext_inplace(ctx, f32, None, 1.0, 8.0)),
        (G.GgmlValueError, "ggml_diag_mask_inf_inplace", lambda: G.ggml_diag_mask_inf_inplace(ctx, f32, -1)),
        (G.GgmlTypeError, "ggml_diag_mask_inf_inplace", lambda: G.ggml_diag_mask_inf_inplace(ctx, f32, 1.5)),
    ]
    for kind, name, call in cases:
        with pytest.raises(kind, match=name):
            call()


# ---------------------------------------------------------------- no backward pass through in-place ops

def test_inplace_after_a_trainable_parameter_is_refused(ctx):
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3))
    x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    h = G.ggml_mul(ctx, x, w)
    with pytest.raises(G.GgmlValueError, match="ggml_relu_inplace: a is a trainable parameter.*use ggml_relu"):
        G.ggml_relu_inplace(ctx, w)
    with pytest.raises(G.GgmlValueError, match="a is computed from a trainable parameter"):
        G.ggml_scale_inplace(ctx, G.ggml_cont(ctx, G.ggml_transpose(ctx, G.ggml_transpose(ctx, h))), 2.0)
    with pytest.raises(G.GgmlValueError, match="b is a trainable parameter"):
        G.ggml_add_inplace(ctx, x, w)
    with pytest.raises(G.GgmlValueError, match="mask is computed from"):
        G.ggml_soft_max_ext_inplace(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), h)
    # no parameter upstream: fine
    G.ggml_relu_inplace(ctx, G.ggml_mul(ctx, x, x))


_TRAIN = """
import numpy as np, ggmlpy as G
ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
{setup}
loss = G.ggml_sum(ctx, G.ggml_sqr(ctx, y))
G.ggml_set_loss(loss)
g = G.ggml_new_graph_custom(ctx, 256, True)
G.ggml_build_forward_expand(g, loss)
{side}
try:
    G.ggml_build_backward_expand(ctx, g)
except ValueError as e:
    print("VALUEERROR", e)
else:
    print("BUILT")
"""


def test_inplace_reading_a_parameter_only_through_indices_is_allowed():
    """ggml differentiates neither I32 results nor row indices: an in-place op on rows picked by the argmax
    of a trainable tensor is no obstacle, and the backward pass of the graph builds (no abort)."""
    setup = ("G.ggml_set_param(w)\n"
             "table = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 4)\n"
             "side = G.ggml_relu_inplace(ctx, G.ggml_get_rows(ctx, table, G.ggml_argmax(ctx, w)))\n"
             "y = G.ggml_mul(ctx, w, x)")
    rc, out, err = run_in_subprocess(_TRAIN.format(setup=setup, side="G.ggml_build_forward_expand(g, side)"))
    assert rc == 0, f"the interpreter died (rc={rc}): {err[-2000:]}"
    assert "BUILT" in out, out


@pytest.mark.parametrize("where", ["on_the_loss_path", "side_output"])
def test_parameter_marked_after_the_inplace_op_is_refused_not_aborted(where):
    if where == "on_the_loss_path":
        setup = "y = G.ggml_relu_inplace(ctx, G.ggml_mul(ctx, w, x))\nG.ggml_set_param(w)"
        side = ""
    else:
        setup = ("side = G.ggml_relu_inplace(ctx, G.ggml_mul(ctx, w, x))\nG.ggml_set_param(w)\n"
                 "y = G.ggml_mul(ctx, w, x)")
        side = "G.ggml_build_forward_expand(g, side)"
    rc, out, err = run_in_subprocess(_TRAIN.format(setup=setup, side=side))
    assert rc == 0, f"the interpreter died (rc={rc}): {err[-1000:]}"
    assert "VALUEERROR" in out and re.search(r"in.?place", out, re.I), out


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


def test_vulkan_inplace(vulkan, rng):
    x, b = r32(rng, 3, 6), r32(rng, 1, 6)
    out, a_after = run_inplace(lambda c, t: G.ggml_relu_inplace(c, t), x, backend=vulkan)
    assert_close(out, np.maximum(f64(x), 0))
    assert_close(a_after, np.maximum(f64(x), 0))
    out, a_after = run_inplace(lambda c, t, u: G.ggml_add_inplace(c, t, u), x, b, backend=vulkan)
    assert_close(out, f64(x) + f64(b))
    assert_close(a_after, f64(x) + f64(b))
    out, a_after = run_inplace(lambda c, t: G.ggml_soft_max_inplace(c, G.ggml_scale_inplace(c, t, 2.0)), x,
                               backend=vulkan)
    assert_close(out, _softmax(2 * f64(x)), rtol=1e-5, atol=1e-6)
    assert_close(a_after, _softmax(2 * f64(x)), rtol=1e-5, atol=1e-6)


def test_every_inplace_function_is_tested():
    exported = {n for n in vars(inplace_module) if n.startswith("ggml_") and callable(getattr(inplace_module, n))
                and getattr(inplace_module, n).__module__ == inplace_module.__name__}
    assert len(exported) == 28
    assert exported == TESTED, exported ^ TESTED
    assert all(hasattr(G, n) for n in exported)
