"""ggmlpy/ops/activation.py: activations, rounding, add1 and the GLU family against numpy float64.

Inputs are numpy arrays in ggml layout (shape (..., ne1, ne0)); see tests/helpers/compute.py. Where ggml's
CPU kernel reads an F16 table (gelu_quick and its GLU form; gelu itself is float32 since patches/0019),
the reference emulates that table: the input rounded to float16, the exact function, the result rounded
to float16.
"""
from __future__ import annotations

from math import erf

import numpy as np
import pytest

import ggmlpy as G
import ggmlpy.ops.activation as act_module
from tests.helpers.compute import compute, compute_grad, nd4
from tests.helpers.subprocesses import assert_refused_naming_op, backward_refusal_script, run_cases_in_subprocess


F32_TOL = dict(rtol=2e-5, atol=2e-6)


def r32(rng, *shape, lo=-3.0, hi=3.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def assert_close(out, ref, **tol):
    ref = nd4(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    np.testing.assert_allclose(out.astype(np.float64), ref, **(tol or F32_TOL))


# ---------------------------------------------------------------- numpy references (from the definitions)

_erf = np.vectorize(erf)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def gelu_erf(x):
    return 0.5 * x * (1 + _erf(x / np.sqrt(2)))


def gelu_quick(x):
    with np.errstate(over="ignore"):  # exp overflows to inf for large negative x: the limit, -0, is right
        return x / (1 + np.exp(-1.702 * x))


def silu(x):
    return x / (1 + np.exp(-x))


def relu(x):
    return np.maximum(x, 0)


def hardsigmoid(x):
    return np.clip((x + 3) / 6, 0, 1)


def round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def f16_table(fn, x):
    """What ggml's CPU computes for F32 x through an F16 lookup table of ``fn``."""
    return f64(fn(f64(np.asarray(x, np.float32).astype(np.float16))).astype(np.float16))


def gelu_cpu(x):
    """ggml's CPU gelu on F32: the tanh form in float32 (patches/0019; it was an F16 table)."""
    return gelu_tanh(f64(np.asarray(x, np.float32)))


# ---------------------------------------------------------------- constants

def test_glu_constants_are_ggmls_and_ggmlrs():
    from ggmlpy._ffi import lib
    names = ["REGLU", "GEGLU", "SWIGLU", "SWIGLU_OAI", "GEGLU_ERF", "GEGLU_QUICK"]
    for value, name in enumerate(names):  # ggmlR: 0L .. 5L
        assert getattr(G, f"GGML_GLU_OP_{name}") == value == int(getattr(lib, f"GGML_GLU_OP_{name}"))
        assert type(getattr(G, f"GGML_GLU_OP_{name}")) is int


# ---------------------------------------------------------------- element-wise activations and rounding

EDGES = np.float32([-2.5, -1.5, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, -3.0, 3.0, 0.49, -0.49, 1e-30, 6e4, -6e4])

UNARY = {
    # name: (reference on F32 inputs (CPU), input range, tolerance)
    "ggml_gelu_erf": (gelu_erf, (-6, 6), dict(rtol=1e-5, atol=1e-6)),
    "ggml_hardsigmoid": (hardsigmoid, (-5, 5), F32_TOL),
    "ggml_floor": (np.floor, (-5, 5), dict(rtol=0, atol=0)),
    "ggml_ceil": (np.ceil, (-5, 5), dict(rtol=0, atol=0)),
    "ggml_round": (round_half_away, (-5, 5), dict(rtol=0, atol=0)),
    # an F16 table on the CPU (GGML_GELU_QUICK_FP16): half-precision results
    "ggml_gelu_quick": (lambda x: f16_table(gelu_quick, x), (-8, 8), dict(rtol=1e-3, atol=1e-6)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_forward(rng, name):
    ref_fn, (lo, hi), tol = UNARY[name]
    x = np.concatenate([r32(rng, 2 * 3 * 17 - EDGES.size, lo=lo, hi=hi), EDGES]).reshape(2, 3, 17)
    (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x)
    assert_close(out, ref_fn(f64(x)), **tol)


def test_gelu_quick_differs_from_the_other_gelus(rng):
    x = r32(rng, 200, lo=-4, hi=4)
    (out,) = compute(lambda ctx, t: G.ggml_gelu_quick(ctx, t), x)
    # 1.702 x sigmoid: up to ~2e-2 away from the exact form, far beyond the F16 table's error
    assert np.abs(out.ravel() - gelu_erf(f64(x))).max() > 1e-2
    (exact,) = compute(lambda ctx, t: G.ggml_gelu_erf(ctx, t), x)
    assert np.abs(exact.ravel() - gelu_tanh(f64(x))).max() > 1e-5  # erf, not the tanh approximation


def test_gelu_quick_cpu_table_beyond_f16_range():
    """Documented CPU behaviour: the F16 table has no entry beyond +-65504 (inf as F16): NaN / inf there."""
    x = np.float32([-1e6, -7e4, -6e4, 6e4, 7e4])
    (out,) = compute(lambda ctx, t: G.ggml_gelu_quick(ctx, t), x)
    assert np.isnan(out.ravel()[:2]).all() and np.isinf(out.ravel()[4])
    np.testing.assert_allclose(out.ravel()[2:4], [0.0, 6e4], rtol=1e-3)


def test_round_halves_go_away_from_zero():
    x = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5])
    (out,) = compute(lambda ctx, t: G.ggml_round(ctx, t), x)
    np.testing.assert_array_equal(out.ravel(), [-3, -2, -1, 1, 2, 3])  # np.round would give [-2, -2, -0, 0, 2, 2]


@pytest.mark.parametrize("name,ref", [("ggml_round", round_half_away), ("ggml_floor", np.floor),
                                      ("ggml_hardsigmoid", hardsigmoid), ("ggml_gelu_erf", gelu_erf)])
def test_unary_f16(rng, name, ref):
    x = r32(rng, 3, 8).astype(np.float16)
    (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x)
    assert_close(f64(out), f64(ref(f64(x))).astype(np.float16), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["ggml_gelu_quick", "ggml_gelu_erf", "ggml_hardsigmoid", "ggml_floor", "ggml_ceil",
                                  "ggml_round"])
def test_unary_misuse(ctx, name):
    fn = getattr(G, name)
    with pytest.raises(G.GgmlTypeError, match=name):
        fn(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 4, 3))
    with pytest.raises(G.GgmlValueError, match="contiguous"):
        fn(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)))
    with pytest.raises(G.GgmlTypeError):
        fn(ctx, np.zeros(3, np.float32))
    if name in ("ggml_gelu_quick", "ggml_gelu_erf"):  # the CPU kernels implement F32 and F16 only
        with pytest.raises(G.GgmlTypeError, match="(?i)bf16"):
            fn(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_BF16, 4))


# ---------------------------------------------------------------- add1

@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_add1(rng, shape):
    a, b = r32(rng, *shape), np.float32([1.75])
    (out,) = compute(lambda ctx, ta, tb: G.ggml_add1(ctx, ta, tb), a, b)
    assert_close(out, f64(a) + 1.75)


def test_add1_misuse(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
    with pytest.raises(G.GgmlValueError, match="scalar"):
        G.ggml_add1(ctx, a, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))
    with pytest.raises(G.GgmlValueError, match="scalar"):
        G.ggml_add1(ctx, a, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 3))
    with pytest.raises(G.GgmlTypeError):
        G.ggml_add1(ctx, a, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 1))
    with pytest.raises(G.GgmlTypeError, match="ggml_add1: b must be"):
        G.ggml_add1(ctx, a, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F16, 1))  # F32 a: b F32 only
    with pytest.raises(G.GgmlValueError, match="ggml_add1: a must have contiguous rows"):
        G.ggml_add1(ctx, G.ggml_transpose(ctx, a), G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1))
    with pytest.raises(G.GgmlTypeError):
        G.ggml_add1(ctx, a, 2.0)


def _fd(f, x, r, h=1e-5):
    x = f64(x)
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        g[i] = (np.sum(f(xp) * r) - np.sum(f(xm) * r)) / (2 * h)
    return g


def test_add1_gradient_of_the_scalar_is_the_sum():
    """ggml's ADD1 backward would give the mean (and abort for a matrix); ggml_add1's is the sum."""
    rng = np.random.default_rng(11)
    a, b = r32(rng, 3, 4), np.float32([0.5])
    r = r32(rng, 3, 4, lo=-1, hi=1)
    loss, grad = compute_grad(lambda c, x, ta: G.ggml_add1(c, ta, x), b, r, a)
    np.testing.assert_allclose(loss, np.sum((f64(a) + 0.5) * r), rtol=1e-5)
    np.testing.assert_allclose(grad, _fd(lambda x: f64(a) + x, b, f64(r)), rtol=1e-4, atol=1e-5)
    assert abs(grad[0] - r.sum()) < 1e-4 and abs(grad[0] - r.mean()) > 1e-2


def test_add1_gradient_of_the_tensor():
    rng = np.random.default_rng(12)
    a, b = r32(rng, 3, 4), np.float32([-2.0])
    r = r32(rng, 3, 4, lo=-1, hi=1)
    _, grad = compute_grad(lambda c, x, tb: G.ggml_add1(c, x, tb), a, r, b)
    np.testing.assert_allclose(grad, _fd(lambda x: x - 2.0, a, f64(r)), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- GLU

# act on F32 inputs as the CPU computes it (tables where ggml uses them)
GLU_ACT = {
    G.GGML_GLU_OP_REGLU: (relu, F32_TOL),
    G.GGML_GLU_OP_GEGLU: (gelu_cpu, dict(rtol=2e-6, atol=1e-6)),
    G.GGML_GLU_OP_SWIGLU: (silu, dict(rtol=1e-5, atol=1e-6)),
    G.GGML_GLU_OP_GEGLU_ERF: (gelu_erf, dict(rtol=1e-5, atol=1e-6)),
    G.GGML_GLU_OP_GEGLU_QUICK: (lambda x: f16_table(gelu_quick, x), dict(rtol=2e-3, atol=1e-4)),
}
NAMED = {"ggml_reglu": G.GGML_GLU_OP_REGLU, "ggml_geglu": G.GGML_GLU_OP_GEGLU, "ggml_swiglu": G.GGML_GLU_OP_SWIGLU,
         "ggml_geglu_erf": G.GGML_GLU_OP_GEGLU_ERF, "ggml_geglu_quick": G.GGML_GLU_OP_GEGLU_QUICK}
NAMED_SPLIT = {"ggml_reglu_split": G.GGML_GLU_OP_REGLU, "ggml_geglu_split": G.GGML_GLU_OP_GEGLU,
               "ggml_swiglu_split": G.GGML_GLU_OP_SWIGLU}


def glu_ref(op, x, swapped=False):
    """ggml's convention: the activation on the first half of each row, times the second half."""
    n = x.shape[-1] // 2
    v, g = (x[..., n:], x[..., :n]) if swapped else (x[..., :n], x[..., n:])
    return GLU_ACT[op][0](v) * f64(g)


@pytest.mark.parametrize("op", sorted(GLU_ACT))
@pytest.mark.parametrize("swapped", [False, True])
def test_glu(rng, op, swapped):
    x = r32(rng, 2, 3, 10)
    (out,) = compute(lambda ctx, t: G.ggml_glu(ctx, t, op, swapped), x)
    assert_close(out, glu_ref(op, x, swapped), **GLU_ACT[op][1])


def test_glu_halves_are_value_then_gate():
    # ReGLU of [x | g] = [-2, 3 | 1, 2]: relu(x) * g = [0, 6]; swapped: relu(g) * x = [-2, 6]
    x = np.float32([-2, 3, 1, 2])
    (out,) = compute(lambda ctx, t: G.ggml_reglu(ctx, t), x)
    np.testing.assert_array_equal(out.ravel(), [0, 6])
    (out,) = compute(lambda ctx, t: G.ggml_glu(ctx, t, G.GGML_GLU_OP_REGLU, True), x)
    np.testing.assert_array_equal(out.ravel(), [-2, 6])


@pytest.mark.parametrize("name", sorted(NAMED))
def test_named_glu(rng, name):
    op = NAMED[name]
    x = r32(rng, 4, 8)
    (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x)
    assert_close(out, glu_ref(op, x), **GLU_ACT[op][1])


@pytest.mark.parametrize("name", sorted(NAMED_SPLIT))
def test_named_glu_split(rng, name):
    op = NAMED_SPLIT[name]
    a, b = r32(rng, 2, 3, 5), r32(rng, 2, 3, 5)
    (out,) = compute(lambda ctx, ta, tb: getattr(G, name)(ctx, ta, tb), a, b)
    assert_close(out, GLU_ACT[op][0](f64(a)) * f64(b), **GLU_ACT[op][1])


@pytest.mark.parametrize("op", sorted(GLU_ACT))
def test_glu_split(rng, op):
    a, b = r32(rng, 3, 6), r32(rng, 3, 6)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_glu_split(ctx, ta, tb, op), a, b)
    assert_close(out, GLU_ACT[op][0](f64(a)) * f64(b), **GLU_ACT[op][1])


@pytest.mark.parametrize("limit", [0.5, 2.0, float("inf")])
def test_swiglu_clamp(rng, limit):
    a, b = r32(rng, 3, 6, lo=-3, hi=3), r32(rng, 3, 6, lo=-3, hi=3)
    (out,) = compute(lambda ctx, ta, tb: G.ggml_swiglu_clamp(ctx, ta, tb, limit), a, b)
    ref = silu(np.minimum(f64(a), limit)) * np.clip(f64(b), -limit, limit)
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    if limit < 3:  # the bounds cut into this data: plain SwiGLU differs
        assert not np.allclose(ref, silu(f64(a)) * f64(b), rtol=1e-3)


def test_swiglu_clamp_misuse(ctx):
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 3)
    for bad in (0.0, -1.0, 1e-50):
        with pytest.raises(G.GgmlValueError, match="limit must be > 0"):
            G.ggml_swiglu_clamp(ctx, a, a, bad)
    with pytest.raises(G.GgmlValueError, match="NaN"):
        G.ggml_swiglu_clamp(ctx, a, a, float("nan"))
    with pytest.raises(G.GgmlTypeError, match="gate"):
        G.ggml_swiglu_clamp(ctx, a, None, 1.0)
    with pytest.raises(G.GgmlValueError):
        G.ggml_swiglu_clamp(ctx, a, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 2), 1.0)


def test_glu_f16(rng):
    x = r32(rng, 3, 8, lo=-2, hi=2).astype(np.float16)
    (out,) = compute(lambda ctx, t: G.ggml_swiglu(ctx, t), x)
    assert_close(f64(out), silu(f64(x[:, :4])) * f64(x[:, 4:]), rtol=5e-3, atol=5e-3)
    (out,) = compute(lambda ctx, a, b: G.ggml_reglu_split(ctx, a, b), x, x[:, ::-1].copy())
    assert_close(f64(out), relu(f64(x)) * f64(x[:, ::-1]), rtol=5e-3, atol=5e-3)


def test_glu_misuse(ctx):
    f32 = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 3)
    with pytest.raises(G.GgmlValueError, match="even"):
        G.ggml_swiglu(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 7, 3))
    with pytest.raises(G.GgmlValueError, match="even"):
        G.ggml_glu(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 1), G.GGML_GLU_OP_REGLU)
    with pytest.raises(G.GgmlValueError, match="SWIGLU_OAI"):
        G.ggml_glu(ctx, f32, G.GGML_GLU_OP_SWIGLU_OAI)
    with pytest.raises(G.GgmlValueError, match="SWIGLU_OAI"):
        G.ggml_glu_split(ctx, f32, f32, G.GGML_GLU_OP_SWIGLU_OAI)
    for bad in (6, -1, 99):
        with pytest.raises(G.GgmlValueError, match="op must be"):
            G.ggml_glu(ctx, f32, bad)
    with pytest.raises(G.GgmlTypeError):
        G.ggml_glu(ctx, f32, "swiglu")
    with pytest.raises(G.GgmlTypeError):
        G.ggml_glu(ctx, f32, G.GGML_GLU_OP_REGLU, "yes")
    with pytest.raises(G.GgmlTypeError, match="(?i)bf16"):
        G.ggml_geglu(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_BF16, 8, 3))
    with pytest.raises(G.GgmlTypeError):
        G.ggml_reglu(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 8, 3))
    with pytest.raises(G.GgmlValueError, match="contiguous"):  # a transposed view: rows are not contiguous
        G.ggml_reglu(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 8)))
    with pytest.raises(G.GgmlValueError, match="contiguous"):  # 3 of 6 rows per matrix: matrices not stacked
        G.ggml_reglu(ctx, G.ggml_view_3d(ctx, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 6, 2), 8, 3, 2, 32, 192, 0))
    with pytest.raises(G.GgmlValueError, match="same shape"):
        G.ggml_swiglu_split(ctx, f32, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 2))
    with pytest.raises(G.GgmlTypeError, match="same type"):
        G.ggml_glu_split(ctx, f32, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 8, 3), G.GGML_GLU_OP_SWIGLU)
    with pytest.raises(G.GgmlTypeError, match="gate"):
        G.ggml_glu_split(ctx, f32, None, G.GGML_GLU_OP_SWIGLU)
    with pytest.raises(G.GgmlTypeError, match="gate"):
        G.ggml_geglu_split(ctx, f32, None)


def test_glu_of_every_other_row(rng):
    """Rows further apart than their length (a view): allowed by ggml for GLU, and computed right."""
    x = r32(rng, 6, 8)

    def build(c, t):
        return G.ggml_swiglu(c, G.ggml_view_2d(c, t, 8, 3, 2 * 8 * 4, 0))
    (out,) = compute(build, x)
    assert_close(out, glu_ref(G.GGML_GLU_OP_SWIGLU, x[::2]), **GLU_ACT[G.GGML_GLU_OP_SWIGLU][1])


def test_glu_shapes(ctx):
    t = G.ggml_glu(ctx, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F16, 6, 2, 3, 4), G.GGML_GLU_OP_GEGLU_ERF)
    assert G.ggml_tensor_shape(t) == (3, 2, 3, 4) and G.ggml_tensor_type(t) == G.GGML_TYPE_F16
    a = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 5, 2, 3)
    assert G.ggml_tensor_shape(G.ggml_swiglu_split(ctx, a, a)) == (5, 2, 3, 1)


# ---------------------------------------------------------------- backward passes

_NO_BACKWARD = backward_refusal_script('x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)\n'
                                       'other = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)')

NO_BACKWARD = {
    "gelu_quick": ("G.ggml_gelu_quick(ctx, x)", "GELU_QUICK"),
    "gelu_erf": ("G.ggml_gelu_erf(ctx, x)", "GELU_ERF"),
    "hardsigmoid": ("G.ggml_hardsigmoid(ctx, x)", "HARDSIGMOID"),
    "floor": ("G.ggml_floor(ctx, x)", "FLOOR"),
    "ceil": ("G.ggml_ceil(ctx, G.ggml_scale(ctx, x, 2.0))", "CEIL"),
    "round": ("G.ggml_round(ctx, x)", "ROUND"),
    "reglu": ("G.ggml_reglu(ctx, x)", "GLU"),
    "geglu": ("G.ggml_geglu(ctx, x)", "GLU"),
    # ggml asserts that only the split SwiGLU has a backward pass: the fused one must be refused
    "swiglu": ("G.ggml_swiglu(ctx, x)", "GLU"),
    "geglu_erf": ("G.ggml_geglu_erf(ctx, x)", "GLU"),
    "geglu_quick": ("G.ggml_geglu_quick(ctx, x)", "GLU"),
    "glu_swapped": ("G.ggml_glu(ctx, x, G.GGML_GLU_OP_SWIGLU, True)", "GLU"),
    "reglu_split_value": ("G.ggml_reglu_split(ctx, x, other)", "GLU"),
    "geglu_split_gate": ("G.ggml_geglu_split(ctx, other, x)", "GLU"),
    "glu_split_quick": ("G.ggml_glu_split(ctx, x, other, G.GGML_GLU_OP_GEGLU_QUICK)", "GLU"),
}


@pytest.fixture(scope="module")
def no_backward_results():
    """Every case in one fresh interpreter: ggml would abort the process on each of them."""
    return run_cases_in_subprocess(_NO_BACKWARD, NO_BACKWARD)


@pytest.mark.parametrize("key", sorted(NO_BACKWARD))
def test_op_without_backward_is_refused_naming_it(no_backward_results, key):
    assert_refused_naming_op(no_backward_results, NO_BACKWARD, key)


def test_side_outputs_without_backward_do_not_block_training():
    """A gelu_quick/floor/argsort-like side output next to the loss path is fine (ggml skips it)."""
    rng = np.random.default_rng(5)
    x, r = r32(rng, 3, 4), r32(rng, 3, 4, lo=-1, hi=1)
    side = {}

    def build(c, t):
        side["q"] = G.ggml_floor(c, G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 4, 3))  # not fed by x
        return G.ggml_sqr(c, t)
    _, grad = compute_grad(build, x, r)
    np.testing.assert_allclose(grad, 2 * f64(x) * r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrt", ["value", "gate"])
def test_swiglu_split_gradient_matches_finite_differences(wrt):
    rng = np.random.default_rng(21)
    x, other = r32(rng, 3, 4, lo=-2, hi=2), r32(rng, 3, 4, lo=-2, hi=2)
    r = r32(rng, 3, 4, lo=-1, hi=1)
    if wrt == "value":
        build, f = (lambda c, t, o: G.ggml_swiglu_split(c, t, o)), (lambda z: silu(z) * f64(other))
    else:
        build, f = (lambda c, t, o: G.ggml_swiglu_split(c, o, t)), (lambda z: silu(f64(other)) * z)
    _, grad = compute_grad(build, x, r, other)
    np.testing.assert_allclose(grad, _fd(f, x, f64(r)), rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------- Vulkan

def _vulkan_backend():
    if "vulkan" not in [b.lower() for b in G.ggml_backends_built()]:
        pytest.skip("this ggmlpy is built without the Vulkan backend")
    if G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan device (for lavapipe, set GGML_VK_VISIBLE_DEVICES=0 before starting the tests)")
    return G.ggml_backend_init_by_name("Vulkan0")


@pytest.fixture(scope="module")
def vulkan():
    b = _vulkan_backend()
    yield b
    b.free()


# Vulkan computes in F32 (no F16 tables): the exact functions, within lavapipe's float accuracy
VULKAN_CASES = {
    "gelu_quick": (lambda c, t: G.ggml_gelu_quick(c, t), gelu_quick, 1),
    "gelu_erf": (lambda c, t: G.ggml_gelu_erf(c, t), gelu_erf, 1),
    "hardsigmoid": (lambda c, t: G.ggml_hardsigmoid(c, t), hardsigmoid, 1),
    "round": (lambda c, t: G.ggml_round(c, t), round_half_away, 1),
    "floor": (lambda c, t: G.ggml_floor(c, t), np.floor, 1),
    "swiglu": (lambda c, t: G.ggml_swiglu(c, t), lambda x: silu(x[..., :5]) * x[..., 5:], 1),
    "geglu_swapped": (lambda c, t: G.ggml_glu(c, t, G.GGML_GLU_OP_GEGLU, True),
                      lambda x: gelu_tanh(x[..., 5:]) * x[..., :5], 1),
    "reglu_split": (lambda c, a, b: G.ggml_reglu_split(c, a, b), lambda a, b: relu(a) * b, 2),
}


@pytest.mark.parametrize("key", sorted(VULKAN_CASES))
def test_vulkan_forward(vulkan, rng, key):
    build, ref, n_in = VULKAN_CASES[key]
    xs = [np.round(r32(rng, 3, 10), 2) + np.float32(0.003) for _ in range(n_in)]  # no exact .5 for round's sake
    (out,) = compute(build, *xs, backend=vulkan)
    assert_close(out, ref(*map(f64, xs)), rtol=1e-4, atol=1e-5)


def test_every_function_is_tested():
    exported = {n for n in vars(act_module) if n.startswith("ggml_") and callable(getattr(act_module, n))
                and getattr(act_module, n).__module__ == act_module.__name__}
    tested = set(UNARY) | set(NAMED) | set(NAMED_SPLIT) | {"ggml_add1", "ggml_glu", "ggml_glu_split",
                                                           "ggml_swiglu_clamp"}
    assert exported == tested, exported ^ tested
    assert all(hasattr(G, n) for n in exported)
