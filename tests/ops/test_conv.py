"""ggmlpy/ops/conv.py, resize.py and layout.py: transposed, depthwise and direct convolutions, padding, upscaling,
rolling, writes into tensors and diagonals.

Forward values against numpy float64 references written from each op's definition, gradients against
central finite differences where ggml has a backward pass, refusal (never an abort) where it has none,
misuse raising ggmlpy errors before C is called, and a few ops on Vulkan when a device is there.
Inputs are numpy arrays in ggml layout (numpy shape = reversed ne); ``compute`` returns 4-D arrays.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import lib
from tests.helpers.compute import compute, compute_grad, nd4
from tests.helpers.gradients import fd_grad
from tests.helpers.subprocesses import (
    assert_refused_naming_op,
    backward_refusal_script,
    run_cases_in_subprocess,
    run_in_subprocess,
)


COVERED: set[str] = set()


def covers(*names):
    COVERED.update(names)
    return lambda fn: fn


def r32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def f16r(a):
    """The values after rounding to F16 (what ggml's F16 paths compute with)."""
    return f64(np.asarray(a, dtype=np.float32).astype(np.float16))


def assert_close(out, ref, rtol=2e-5, atol=2e-6):
    ref = nd4(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- numpy references

def conv1d_ref(X, K, s=1, p=0, d=1):
    """Plain strided 1-D convolution: X (Cin, L), K (Cin, Cout, KL) -> (Cout, OL): the map whose adjoint is
    the transposed convolution with the same kernel."""
    cin, L = X.shape
    KL = K.shape[-1]
    Xp = np.pad(X, ((0, 0), (p, p)))
    OL = (L + 2 * p - d * (KL - 1) - 1) // s + 1
    out = np.zeros((K.shape[1], OL))
    for o in range(OL):
        for k in range(KL):
            out[:, o] += Xp[:, o * s + k * d] @ K[:, :, k]
    return out


def conv_transpose_1d_ref(b, a, s):
    """Scatter-add: b (Cin, L), a (Cin, Cout, K) -> (Cout, (L - 1) s + K)."""
    cin, L = b.shape
    _, cout, K = a.shape
    out = np.zeros((cout, (L - 1) * s + K))
    for i in range(L):
        for k in range(K):
            out[:, i * s + k] += b[:, i] @ a[:, :, k]
    return out


def conv_transpose_2d_ref(b, a, s):
    """Scatter-add: b (Cin, H, W), a (Cin, Cout, KH, KW) -> (Cout, (H - 1) s + KH, (W - 1) s + KW)."""
    cin, H, W = b.shape
    _, cout, KH, KW = a.shape
    out = np.zeros((cout, (H - 1) * s + KH, (W - 1) * s + KW))
    for y in range(H):
        for x in range(W):
            out[:, y * s:y * s + KH, x * s:x * s + KW] += np.einsum("c,cokl->okl", b[:, y, x], a)
    return out


def conv2d_ref(X, K, s0=1, s1=1, p0=0, p1=0, d0=1, d1=1, groups=1):
    """X (N, C, H, W), K (O, C / groups, KH, KW) -> (N, O, OH, OW); groups == C is a depthwise convolution."""
    N, C, H, W = X.shape
    O, cg, KH, KW = K.shape
    Xp = np.pad(X, ((0, 0), (0, 0), (p1, p1), (p0, p0)))
    OH = (H + 2 * p1 - d1 * (KH - 1) - 1) // s1 + 1
    OW = (W + 2 * p0 - d0 * (KW - 1) - 1) // s0 + 1
    out = np.zeros((N, O, OH, OW))
    og = O // groups
    for g in range(groups):
        xs = Xp[:, g * cg:(g + 1) * cg]
        for ky in range(KH):
            for kx in range(KW):
                patch = xs[:, :, ky * d1:ky * d1 + s1 * (OH - 1) + 1:s1, kx * d0:kx * d0 + s0 * (OW - 1) + 1:s0]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, K[g * og:(g + 1) * og, :, ky, kx])
    return out


def conv1d_dw_ref(b, a, s, p, d):
    """b (C, L), a (C, 1, K) -> (C, OL), channel c convolved with kernel c."""
    C, L = b.shape
    K = a.shape[-1]
    bp = np.pad(b, ((0, 0), (p, p)))
    OL = (L + 2 * p - d * (K - 1) - 1) // s + 1
    out = np.zeros((C, OL))
    for o in range(OL):
        for k in range(K):
            out[:, o] += a[:, 0, k] * bp[:, o * s + k * d]
    return out


def upscale_ref(x, sf, mode):
    """x (..., H, W) upscaled by sf along the last two axes, pixel centres aligned (align_corners=False)."""
    *lead, H, W = x.shape
    if mode == "nearest":
        return np.repeat(np.repeat(x, sf, axis=-2), sf, axis=-1)
    if mode == "bilinear":
        def axis_weights(n_in):
            src = np.maximum((np.arange(n_in * sf) + 0.5) / sf - 0.5, 0.0)
            i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
            i1 = np.minimum(i0 + 1, n_in - 1)
            w = src - i0
            m = np.zeros((n_in * sf, n_in))
            np.add.at(m, (np.arange(n_in * sf), i0), 1 - w)
            np.add.at(m, (np.arange(n_in * sf), i1), w)
            return m
    else:  # bicubic, Keys' kernel with a = -0.75, indices clamped to the image
        def cubic(t, a=-0.75):
            t = abs(t)
            if t <= 1:
                return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
            if t < 2:
                return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
            return 0.0

        def axis_weights(n_in):
            m = np.zeros((n_in * sf, n_in))
            for o in range(n_in * sf):
                src = (o + 0.5) / sf - 0.5
                base = int(np.floor(src))
                for off in (-1, 0, 1, 2):
                    m[o, min(max(base + off, 0), n_in - 1)] += cubic(src - (base + off))
            return m
    my, mx = axis_weights(H), axis_weights(W)
    return np.einsum("yh,...hw,xw->...yx", my, x, mx)


def set_ref(a, b, nb1, nb2, nb3, offset, esize=4):
    """a with b's elements written at byte offset + i0 esize + i1 nb1 + i2 nb2 + i3 nb3 (ggml indices)."""
    out = np.array(a, copy=True).reshape(-1)
    b4 = nd4(b)
    for i3, i2, i1, i0 in np.ndindex(b4.shape):
        out[(offset + i0 * esize + i1 * nb1 + i2 * nb2 + i3 * nb3) // esize] = b4[i3, i2, i1, i0]
    return out.reshape(np.shape(a))


# ---------------------------------------------------------------- transposed convolutions

@covers("ggml_conv_transpose_1d")
@pytest.mark.parametrize("s0", [1, 2, 3])
@pytest.mark.parametrize("kernel_type", [np.float32, np.float16])
def test_conv_transpose_1d_is_the_adjoint_of_conv(rng, s0, kernel_type):
    a = r32(rng, 3, 4, 5).astype(kernel_type)  # (Cin, Cout, K) = ne [5, 4, 3]
    b = r32(rng, 3, 7)                           # (Cin, L) = ne [7, 3]
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_transpose_1d(c, ta, tb, s0), a, b)
    ad, bd = f64(a), (f16r(b) if kernel_type == np.float16 else f64(b))
    ref = conv_transpose_1d_ref(bd, ad, s0)
    # the reference is the adjoint of the strided convolution: <T b, y> == <b, conv(y)>
    y = rng.uniform(-1, 1, ref.shape)
    np.testing.assert_allclose(np.sum(ref * y), np.sum(bd * conv1d_ref(y, np.transpose(ad, (1, 0, 2)), s0)))
    tol = dict(rtol=2e-5, atol=2e-5) if kernel_type == np.float32 else dict(rtol=2e-3, atol=2e-3)
    assert_close(out, ref, **tol)


@pytest.mark.parametrize("s0, expected", [
    (1, [18, 45, 59, 37, 24, 61, 83, 51, 30, 77, 107, 65]),
    (2, [18, 21, 24, 29, 30, 37, 24, 27, 34, 39, 44, 51, 30, 33, 44, 49, 58, 65]),
    (3, [18, 21, 0, 24, 29, 0, 30, 37, 24, 27, 0, 34, 39, 0, 44, 51, 30, 33, 0, 44, 49, 0, 58, 65]),
])
def test_conv_transpose_1d_upstream_values(s0, expected):
    """ggml's own test case: data 0..5 as [3, 2], F16 kernel 0..11 as [2, 3, 2]."""
    b = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = np.arange(12, dtype=np.float16).reshape(2, 3, 2)
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_transpose_1d(c, ta, tb, s0), a, b)
    np.testing.assert_allclose(out.ravel(), expected)


@covers("ggml_conv_transpose_2d_p0")
@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("kernel_type", [np.float32, np.float16])
def test_conv_transpose_2d_p0_is_the_adjoint_of_conv(rng, stride, kernel_type):
    a = r32(rng, 3, 2, 2, 3).astype(kernel_type)  # (Cin, Cout, KH, KW) = ne [3, 2, 2, 3]
    b = r32(rng, 1, 3, 4, 5)                        # (1, Cin, H, W) = ne [5, 4, 3, 1]
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_transpose_2d_p0(c, ta, tb, stride), a, b)
    ad, bd = f64(a), (f16r(b) if kernel_type == np.float16 else f64(b))
    ref = conv_transpose_2d_ref(bd[0], ad, stride)[None]
    y = rng.uniform(-1, 1, ref.shape)   # adjoint of the strided convolution with kernel (Cin, Cout, ...)
    np.testing.assert_allclose(np.sum(ref * y), np.sum(bd * conv2d_ref(y, ad, stride, stride)))
    tol = dict(rtol=2e-5, atol=2e-5) if kernel_type == np.float32 else dict(rtol=2e-3, atol=2e-3)
    assert_close(out, ref, **tol)


def test_conv_transpose_2d_p0_upstream_values():
    """ggml's own test case (stride 1): data 0..11 as [3, 2, 2, 1], F16 kernel 0..23 as [2, 2, 3, 2]."""
    b = np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 2, 2)
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_transpose_2d_p0(c, ta, tb, 1), a, b)
    expected = [72, 162, 188, 106, 192, 430, 490, 274, 132, 292, 326, 180,
                96, 218, 260, 146, 264, 590, 682, 378, 180, 396, 446, 244,
                120, 274, 332, 186, 336, 750, 874, 482, 228, 500, 566, 308]
    np.testing.assert_allclose(out.ravel(), expected)


# ---------------------------------------------------------------- depthwise and direct convolutions

@covers("ggml_conv_1d_dw")
@pytest.mark.parametrize("s0, p0, d0", [(1, 0, 1), (1, 1, 1), (2, 1, 1), (1, 2, 2)])
@pytest.mark.parametrize("kernel_type", [np.float32, np.float16])
def test_conv_1d_dw(rng, s0, p0, d0, kernel_type):
    a = r32(rng, 4, 1, 3).astype(kernel_type)  # (C, 1, K) = ne [3, 1, 4]
    b = r32(rng, 4, 11)                          # (C, L) = ne [11, 4]
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_1d_dw(c, ta, tb, s0, p0, d0), a, b)
    ref = conv1d_dw_ref(f16r(b), f16r(a), s0, p0, d0)  # F16 patches: both operands rounded
    assert_close(out, ref[None], rtol=1e-3, atol=1e-3)
    assert np.abs(ref).max() > 0.1


@covers("ggml_conv_2d_dw")
@pytest.mark.parametrize("s0, s1, p0, p1, d0, d1", [(1, 1, 0, 0, 1, 1), (1, 1, 1, 1, 1, 1), (2, 1, 1, 0, 1, 2)])
def test_conv_2d_dw(rng, s0, s1, p0, p1, d0, d1):
    a = r32(rng, 3, 1, 3, 2).astype(np.float16)   # (C, 1, KH, KW) = ne [2, 3, 1, 3]
    b = r32(rng, 2, 3, 6, 7)                        # (N, C, H, W)
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_2d_dw(c, ta, tb, s0, s1, p0, p1, d0, d1), a, b)
    ref = conv2d_ref(f16r(b), f64(a), s0, s1, p0, p1, d0, d1, groups=3)
    assert_close(out, ref, rtol=1e-3, atol=1e-3)


def test_conv_2d_dw_bf16_kernel_and_channel_last_kernel_shape(rng):
    a, b = r32(rng, 3, 1, 3, 3), r32(rng, 2, 3, 6, 7)

    def bf16_kernel(c, ta, tb):
        kb = G.ggml_cpy(c, ta, G.ggml_new_tensor_4d(c, G.GGML_TYPE_BF16, 3, 3, 1, 3))
        return G.ggml_conv_2d_dw(c, kb, tb, 1, 1, 1, 1)
    (out,) = compute(bf16_kernel, a, b)          # BF16 kernels make F32 patches
    assert_close(out, conv2d_ref(f64(b), f64(a), 1, 1, 1, 1, groups=3), rtol=2e-2, atol=2e-2)
    a16 = a.astype(np.float16).reshape(1, 3, 3, 3)  # ne [3, 3, 3, 1]: the kernels along ne[2]
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_2d_dw(c, ta, tb, 1, 1, 1, 1), a16, b)
    assert_close(out, conv2d_ref(f16r(b), f64(a16).reshape(3, 1, 3, 3), 1, 1, 1, 1, groups=3), rtol=1e-3, atol=1e-3)


@covers("ggml_conv_2d_dw_direct")
@pytest.mark.parametrize("s0, s1, p0, p1, d0, d1", [(1, 1, 0, 0, 1, 1), (2, 2, 1, 1, 1, 1), (1, 2, 2, 1, 2, 1)])
@pytest.mark.parametrize("kernel_type", [np.float32, np.float16])
def test_conv_2d_dw_direct(rng, s0, s1, p0, p1, d0, d1, kernel_type):
    a = r32(rng, 5, 1, 3, 3).astype(kernel_type)
    b = r32(rng, 2, 5, 7, 8)
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_2d_dw_direct(c, ta, tb, s0, s1, p0, p1, d0, d1), a, b)
    ref = conv2d_ref(f64(b), f64(a), s0, s1, p0, p1, d0, d1, groups=5)
    assert_close(out, ref, rtol=1e-5, atol=1e-5)


@covers("ggml_conv_2d_direct")
@pytest.mark.parametrize("s0, s1, p0, p1, d0, d1", [(1, 1, 0, 0, 1, 1), (1, 1, 1, 1, 1, 1), (2, 1, 1, 2, 1, 2)])
@pytest.mark.parametrize("kernel_type", [np.float32, np.float16])
def test_conv_2d_direct(rng, s0, s1, p0, p1, d0, d1, kernel_type):
    a = r32(rng, 4, 3, 3, 2).astype(kernel_type)   # (Cout, Cin, KH, KW)
    b = r32(rng, 2, 3, 6, 7)                         # (N, Cin, H, W)
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_2d_direct(c, ta, tb, s0, s1, p0, p1, d0, d1), a, b)
    if kernel_type == np.float16:
        assert_close(out, conv2d_ref(f16r(b), f64(a), s0, s1, p0, p1, d0, d1), rtol=2e-3, atol=2e-3)
    else:
        assert_close(out, conv2d_ref(f64(b), f64(a), s0, s1, p0, p1, d0, d1), rtol=1e-5, atol=1e-5)


def test_conv_2d_direct_matches_conv_2d(rng):
    a, b = r32(rng, 4, 2, 3, 3), r32(rng, 1, 2, 9, 8)
    direct, im2col = compute(lambda c, ta, tb: (G.ggml_conv_2d_direct(c, ta, tb, 2, 1, 1, 0),
                                                G.ggml_conv_2d(c, ta, tb, 2, 1, 1, 0)), a, b)
    np.testing.assert_allclose(direct, im2col, rtol=5e-3, atol=5e-3)  # conv_2d's patches are F16


def test_conv_2d_direct_reads_strided_images(rng):
    a, b = r32(rng, 2, 2, 3, 3), r32(rng, 1, 2, 5, 6)   # b ne [6, 5, 2, 1], transposed to [5, 6, 2, 1]
    (out,) = compute(lambda c, ta, tb: G.ggml_conv_2d_direct(c, ta, G.ggml_transpose(c, tb), 1, 1, 1, 0), a, b)
    assert_close(out, conv2d_ref(np.swapaxes(f64(b), -1, -2), f64(a), 1, 1, 1, 0), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- padding, upscaling, rolling

@covers("ggml_pad_reflect_1d")
@pytest.mark.parametrize("p0, p1", [(0, 0), (2, 3), (5, 1), (0, 5)])
def test_pad_reflect_1d(rng, p0, p1):
    x = r32(rng, 2, 3, 6)
    (out,) = compute(lambda c, t: G.ggml_pad_reflect_1d(c, t, p0, p1), x)
    assert_close(out, np.pad(f64(x), ((0, 0), (0, 0), (p0, p1)), mode="reflect"), rtol=0, atol=0)


@covers("ggml_pad_ext")
def test_pad_ext(rng):
    x = r32(rng, 2, 3, 4, 5)
    (out,) = compute(lambda c, t: G.ggml_pad_ext(c, t, 1, 2, 0, 3, 2, 0, 1, 1), x)
    assert_close(out, np.pad(f64(x), ((1, 1), (2, 0), (0, 3), (1, 2))), rtol=0, atol=0)


def test_pad_ext_of_a_transposed_view(rng):
    x = r32(rng, 3, 4)
    (out,) = compute(lambda c, t: G.ggml_pad_ext(c, G.ggml_transpose(c, t), 1, 0, 0, 2), x)
    assert_close(out, np.pad(f64(x).T, ((0, 2), (1, 0))), rtol=0, atol=0)


@covers("ggml_upscale", "GGML_SCALE_MODE_NEAREST", "GGML_SCALE_MODE_BILINEAR", "GGML_SCALE_MODE_BICUBIC")
@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
@pytest.mark.parametrize("sf", [2, 3])
def test_upscale(rng, mode, sf):
    x = r32(rng, 2, 3, 4, 5)
    const = {"nearest": G.GGML_SCALE_MODE_NEAREST, "bilinear": G.GGML_SCALE_MODE_BILINEAR,
             "bicubic": G.GGML_SCALE_MODE_BICUBIC}[mode]
    (out,) = compute(lambda c, t: G.ggml_upscale(c, t, sf, const), x)
    assert_close(out, upscale_ref(f64(x), sf, mode), rtol=1e-5, atol=1e-5)


def test_upscale_of_a_transposed_view(rng):
    x = r32(rng, 3, 4)
    (out,) = compute(lambda c, t: G.ggml_upscale(c, G.ggml_transpose(c, t), 2, G.GGML_SCALE_MODE_BILINEAR), x)
    assert_close(out, upscale_ref(f64(x).T, 2, "bilinear"), rtol=1e-5, atol=1e-5)


def test_upscale_default_mode_is_nearest(rng):
    x = r32(rng, 3, 4)
    (out,) = compute(lambda c, t: G.ggml_upscale(c, t, 2), x)
    assert_close(out, np.repeat(np.repeat(f64(x), 2, 0), 2, 1), rtol=0, atol=0)
    assert (G.GGML_SCALE_MODE_NEAREST, G.GGML_SCALE_MODE_BILINEAR, G.GGML_SCALE_MODE_BICUBIC) == (0, 1, 2)


@covers("ggml_roll")
@pytest.mark.parametrize("shifts", [(1, 0, 0, 0), (-2, 1, 0, 0), (3, -2, 1, 1), (0, 0, -1, 0)])
def test_roll(rng, shifts):
    x = r32(rng, 2, 3, 4, 5)
    (out,) = compute(lambda c, t: G.ggml_roll(c, t, *shifts), x)
    assert_close(out, np.roll(f64(x), shifts[::-1], axis=(0, 1, 2, 3)), rtol=0, atol=0)


# ---------------------------------------------------------------- writing into tensors

@covers("ggml_set", "ggml_set_1d", "ggml_set_2d")
def test_set_writes_a_block_and_keeps_the_rest(rng):
    a, b = r32(rng, 5, 6), r32(rng, 2, 3)  # a ne [6, 5], b ne [3, 2]
    off = 4 * (1 * 6 + 2)                   # row 1, column 2
    out2, out, out1 = compute(lambda c, ta, tb: (
        G.ggml_set_2d(c, ta, tb, 6 * 4, off),
        G.ggml_set(c, ta, tb, 6 * 4, 6 * 4 * 5, 6 * 4 * 5, off),
        G.ggml_set_1d(c, ta, G.ggml_reshape_1d(c, tb, 6), 4 * 20)), a, b)
    ref = f64(a).copy()
    ref[1:3, 2:5] = b
    assert_close(out2, ref, rtol=0, atol=0)
    assert_close(out, ref, rtol=0, atol=0)
    ref1 = f64(a).copy().reshape(-1)
    ref1[20:26] = b.reshape(-1)
    assert_close(out1, ref1.reshape(5, 6), rtol=0, atol=0)


def test_set_3d_block_with_strides_and_i32(rng):
    a = rng.integers(-50, 50, (3, 4, 5)).astype(np.int32)   # ne [5, 4, 3]
    b = rng.integers(100, 200, (2, 2, 3)).astype(np.int32)  # ne [3, 2, 2]
    nb1, nb2, nb3, off = 5 * 4, 5 * 4 * 4, 5 * 4 * 4 * 3, 4 * (1 * 20 + 1 * 5 + 2)
    (out,) = compute(lambda c, ta, tb: G.ggml_set(c, ta, tb, nb1, nb2, nb3, off), a, b)
    ref = set_ref(a, b, nb1, nb2, nb3, off)
    np.testing.assert_array_equal(out, nd4(ref))
    assert (out != nd4(a)).sum() > 0 and (ref == a).sum() == a.size - b.size


def test_set_1d_of_a_matrix_uses_the_destination_row_stride(rng):
    a, b = r32(rng, 4, 5), r32(rng, 2, 3)
    (out,) = compute(lambda c, ta, tb: G.ggml_set_1d(c, ta, tb, 4 * 6), a, b)
    assert_close(out, set_ref(f64(a), f64(b), 5 * 4, 20 * 4, 20 * 4, 4 * 6), rtol=0, atol=0)


@covers("ggml_set_zero")
def test_set_zero_host_and_backend_memory(rng, host_ctx, backend):
    t = G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 4, 3)
    G.ggml_backend_tensor_set_data(t, np.ones(12, np.float32))
    assert G.ggml_set_zero(t) is None
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), np.zeros(12))
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        u = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 9)
        v = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 5)
        with pytest.raises(G.GgmlStateError, match="memory"):
            G.ggml_set_zero(u)                      # no memory yet: refused, not an abort
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        G.ggml_backend_tensor_set_data(u, np.arange(9, dtype=np.float32) + 1)
        G.ggml_backend_tensor_set_data(v, np.full(5, 7, np.float32))
        G.ggml_set_zero(u)
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(u), np.zeros(9))
        np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(v), np.full(5, 7))  # the neighbour is kept
        buf.free()
    finally:
        ctx.free()


def test_set_zero_refuses_a_strided_view(host_ctx):
    t = G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 4, 3)
    G.ggml_backend_tensor_set_data(t, np.ones(12, np.float32))
    column = G.ggml_view_2d(host_ctx, t, 1, 3, 16, 0)
    with pytest.raises(G.GgmlValueError, match="contiguous"):
        G.ggml_set_zero(column)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), np.ones(12))


# ---------------------------------------------------------------- views and diagonals

@covers("ggml_view_tensor")
def test_view_tensor_shares_the_data(rng, host_ctx):
    x = r32(rng, 3, 4)
    (out,) = compute(lambda c, t: G.ggml_add(c, G.ggml_view_tensor(c, t), t), x)
    assert_close(out, 2 * f64(x))
    t = G.ggml_new_tensor_2d(host_ctx, G.GGML_TYPE_F32, 4, 3)
    v = G.ggml_view_tensor(host_ctx, t)
    assert G.ggml_tensor_shape(v) == (4, 3, 1, 1) and G.ggml_tensor_type(v) == G.GGML_TYPE_F32
    G.ggml_backend_tensor_set_data(v, x)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(t), x.ravel())


def test_view_tensor_keeps_its_source_context_alive():
    src_ctx = G.ggml_init(1 << 20)
    t = G.ggml_new_tensor_1d(src_ctx, G.GGML_TYPE_F32, 4)
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        v = G.ggml_view_tensor(ctx, t)
        src_ctx.free()
        with pytest.raises(G.GgmlStateError):
            G.ggml_tensor_shape(v)                  # its source is gone: an error, not a dangling read
    finally:
        ctx.free()


@covers("ggml_diag")
def test_diag(rng):
    x = r32(rng, 2, 3, 1, 4)  # ne [4, 1, 3, 2]
    (out,) = compute(lambda c, t: G.ggml_diag(c, t), x)
    ref = np.zeros((2, 3, 4, 4))
    for i, j in np.ndindex(2, 3):
        ref[i, j] = np.diag(f64(x)[i, j, 0])
    assert_close(out, ref, rtol=0, atol=0)


@covers("ggml_diag_mask_zero")
@pytest.mark.parametrize("n_past", [0, 2])
def test_diag_mask_zero(rng, n_past):
    x = r32(rng, 2, 5, 6)
    (out,) = compute(lambda c, t: G.ggml_diag_mask_zero(c, t, n_past), x)
    assert_close(out, np.tril(f64(x), n_past), rtol=0, atol=0)


# ---------------------------------------------------------------- gradients vs central differences (fd_grad)


def _u(*shape, dtype=np.float32):
    return lambda rng: rng.uniform(-1, 1, shape).astype(dtype)


_SET_OFF = 4 * (1 * 6 + 2)
GRAD_CASES = {
    # name: (build(ctx, x, *others), numpy f(x, *others), make_x, make_others, tolerance)
    "set_2d_destination": (lambda c, x, b: G.ggml_set_2d(c, x, b, 24, _SET_OFF),
                           lambda x, b: set_ref(x, b, 24, 120, 120, _SET_OFF), _u(5, 6), [_u(2, 3)], None),
    "set_2d_block": (lambda c, x, a: G.ggml_set_2d(c, a, x, 24, _SET_OFF),
                     lambda x, a: set_ref(a, x, 24, 120, 120, _SET_OFF), _u(2, 3), [_u(5, 6)], None),
    "set_block": (lambda c, x, a: G.ggml_set(c, a, x, 24, 96, 96, 4),
                  lambda x, a: set_ref(a, x, 24, 96, 96, 4), _u(2, 2, 3), [_u(3, 4, 6)], None),
    "set_1d_destination": (lambda c, x, b: G.ggml_set_1d(c, x, b, 12),
                           lambda x, b: set_ref(x, b, 28, 28, 28, 12), _u(7), [_u(3)], None),
    "diag_mask_zero": (lambda c, x: G.ggml_diag_mask_zero(c, x, 1), lambda x: np.tril(x, 1), _u(2, 4, 5), [], None),
    # im2col with F16 patches: the forward pass rounds the operands, hence the looser tolerance
    "conv_1d_dw_kernel": (lambda c, x, b: G.ggml_conv_1d_dw(c, x, b, 1, 1, 1),
                          lambda x, b: conv1d_dw_ref(b, x, 1, 1, 1), _u(3, 1, 3), [_u(3, 8)],
                          dict(rtol=2e-2, atol=2e-2)),
    "conv_1d_dw_data": (lambda c, x, a: G.ggml_conv_1d_dw(c, a, x, 2, 1, 1),
                        lambda x, a: conv1d_dw_ref(x, a, 2, 1, 1), _u(3, 9), [_u(3, 1, 3)],
                        dict(rtol=2e-2, atol=2e-2)),
    "conv_2d_dw_data": (lambda c, x, a: G.ggml_conv_2d_dw(c, a, x, 1, 1, 1, 1),
                        lambda x, a: conv2d_ref(x, a, 1, 1, 1, 1, groups=2), _u(1, 2, 4, 5),
                        [_u(2, 1, 3, 3, dtype=np.float16)], dict(rtol=2e-2, atol=2e-2)),
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradient_matches_finite_differences(name):
    build, f, make_x, make_others, tol = GRAD_CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = make_x(rng)
    others = [m(rng) for m in make_others]
    ref_out = f(f64(x), *map(f64, others))
    r = rng.uniform(-1, 1, np.shape(ref_out)).astype(np.float32)
    loss, grad = compute_grad(build, x, r, *others)
    fd = fd_grad(lambda z: f(z, *map(f64, others)), x, f64(r))
    tol = tol or dict(rtol=1e-3, atol=1e-4)
    scale = max(1.0, float(np.abs(fd).max()))
    np.testing.assert_allclose(loss, float(np.sum(ref_out * f64(r))), rtol=tol["rtol"], atol=tol["atol"] * scale)
    np.testing.assert_allclose(grad, fd, rtol=tol["rtol"], atol=tol["atol"] * scale)
    assert np.abs(fd).max() > 0


def test_set_gradient_of_the_destination_is_zero_under_the_block():
    rng = np.random.default_rng(5)
    a, b = r32(rng, 5, 6), r32(rng, 2, 3)
    r = np.ones((5, 6), np.float32)
    _, grad = compute_grad(lambda c, x, tb: G.ggml_set_2d(c, x, tb, 24, _SET_OFF), a, r, b)
    expected = np.ones((5, 6))
    expected[1:3, 2:5] = 0
    np.testing.assert_array_equal(grad, expected)


_NO_BACKWARD = backward_refusal_script('F32 = G.GGML_TYPE_F32\nx = G.ggml_new_tensor_2d(ctx, F32, 4, 3)',
                                       'img = G.ggml_reshape_4d(ctx, x, 4, 3, 1, 1)')

NO_BACKWARD = {
    "conv_transpose_1d": ("G.ggml_conv_transpose_1d(ctx, G.ggml_new_tensor_3d(ctx, F32, 2, 5, 3), x, 2)",
                          "CONV_TRANSPOSE_1D"),
    "conv_transpose_1d_kernel": ("G.ggml_conv_transpose_1d(ctx, G.ggml_reshape_3d(ctx, x, 4, 1, 3), "
                                 "G.ggml_new_tensor_2d(ctx, F32, 6, 3))", "CONV_TRANSPOSE_1D"),
    "conv_transpose_2d_p0": ("G.ggml_conv_transpose_2d_p0(ctx, G.ggml_new_tensor_4d(ctx, F32, 2, 2, 2, 1), img, 2)",
                             "CONV_TRANSPOSE_2D"),
    "conv_2d_dw_direct": ("G.ggml_conv_2d_dw_direct(ctx, G.ggml_new_tensor_4d(ctx, F32, 2, 2, 1, 1), img)",
                          "CONV_2D_DW"),
    "conv_2d_direct": ("G.ggml_conv_2d_direct(ctx, G.ggml_new_tensor_4d(ctx, F32, 2, 2, 1, 3), img)", "CONV_2D"),
    "pad_reflect_1d": ("G.ggml_pad_reflect_1d(ctx, x, 1, 2)", "PAD_REFLECT_1D"),
    "pad_ext": ("G.ggml_pad_ext(ctx, x, 1, 1, 1, 0)", "PAD"),
    "upscale": ("G.ggml_upscale(ctx, x, 2, G.GGML_SCALE_MODE_BILINEAR)", "UPSCALE"),
    "roll": ("G.ggml_roll(ctx, x, 1, 1)", "ROLL"),
    "diag": ("G.ggml_diag(ctx, G.ggml_reshape_4d(ctx, x, 12, 1, 1, 1))", "DIAG"),
}


@pytest.fixture(scope="module")
def no_backward_results():
    """Every case in one fresh interpreter: were a refusal missing, ggml would abort it, not pytest."""
    return run_cases_in_subprocess(_NO_BACKWARD, NO_BACKWARD)


@pytest.mark.parametrize("key", sorted(NO_BACKWARD))
def test_op_without_backward_is_refused_naming_it(no_backward_results, key):
    assert_refused_naming_op(no_backward_results, NO_BACKWARD, key)


# ---------------------------------------------------------------- misuse: errors before ggml is called

def _t(ctx, *ne, type=G.GGML_TYPE_F32):
    return G.ggml_new_tensor(ctx, type, len(ne), list(ne))


F16, I32 = G.GGML_TYPE_F16, G.GGML_TYPE_I32
MISUSE = {
    # name: (call(ctx), exception, message fragment)
    "ct1_bf16_kernel": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4, type=G.GGML_TYPE_BF16), _t(c, 5, 4)),
                        G.GgmlTypeError, "F16/F32"),
    "ct1_f16_data": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 4, type=F16)), G.GgmlTypeError,
                     "F32"),
    "ct1_channels": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 3)), G.GgmlValueError,
                     "channels"),
    "ct1_padding": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 4), 1, 1), G.GgmlValueError,
                    "p0 = 0"),
    "ct1_dilation": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 4), 1, 0, 2), G.GgmlValueError,
                     "d0 = 1"),
    "ct1_stride": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 4), 0), G.GgmlValueError, "s0"),
    "ct1_batched_data": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4), _t(c, 5, 4, 2)), G.GgmlValueError,
                         "matrix"),
    "ct1_4d_kernel": (lambda c: G.ggml_conv_transpose_1d(c, _t(c, 2, 3, 4, 2), _t(c, 5, 4)), G.GgmlValueError, "3-D"),
    "ct2_channels": (lambda c: G.ggml_conv_transpose_2d_p0(c, _t(c, 2, 2, 3, 4), _t(c, 5, 5, 3)), G.GgmlValueError,
                     "channels"),
    "ct2_batch": (lambda c: G.ggml_conv_transpose_2d_p0(c, _t(c, 2, 2, 3, 4), _t(c, 5, 5, 4, 2)), G.GgmlValueError,
                  "one image"),
    "ct2_stride": (lambda c: G.ggml_conv_transpose_2d_p0(c, _t(c, 2, 2, 3, 4), _t(c, 5, 5, 4), -1), G.GgmlValueError,
                   "stride"),
    "ct2_strided_kernel": (lambda c: G.ggml_conv_transpose_2d_p0(c, G.ggml_transpose(c, _t(c, 2, 3, 3, 4)),
                                                                 _t(c, 5, 5, 4)), G.GgmlValueError, "contiguous"),
    "ct2_i32_data": (lambda c: G.ggml_conv_transpose_2d_p0(c, _t(c, 2, 2, 3, 4), _t(c, 5, 5, 4, type=I32)),
                     G.GgmlTypeError, "F32"),
    "dw1_kernel_shape": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 3, 2, 4), _t(c, 10, 4)), G.GgmlValueError, "[K, 1, C]"),
    "dw1_channels": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 3, 1, 4), _t(c, 10, 5)), G.GgmlValueError, "channels"),
    "dw1_batch": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 3, 1, 4), _t(c, 10, 4, 2)), G.GgmlValueError, "one sample"),
    "dw1_too_short": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 5, 1, 4), _t(c, 3, 4)), G.GgmlValueError, "length"),
    "dw1_bf16_kernel": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 3, 1, 4, type=G.GGML_TYPE_BF16), _t(c, 10, 4)),
                        G.GgmlTypeError, "F16/F32"),
    "dw1_strided_data": (lambda c: G.ggml_conv_1d_dw(c, _t(c, 3, 1, 4), G.ggml_transpose(c, _t(c, 4, 10))),
                         G.GgmlValueError, "contiguous"),
    "dw2_f32_kernel": (lambda c: G.ggml_conv_2d_dw(c, _t(c, 3, 3, 1, 4), _t(c, 8, 8, 4)), G.GgmlTypeError,
                       "ggml_conv_2d_dw_direct"),
    "dw2_channels": (lambda c: G.ggml_conv_2d_dw(c, _t(c, 3, 3, 1, 4, type=F16), _t(c, 8, 8, 3)), G.GgmlValueError,
                     "one kernel per channel"),
    "dw2_dilation": (lambda c: G.ggml_conv_2d_dw(c, _t(c, 3, 3, 1, 4, type=F16), _t(c, 8, 8, 4), 1, 1, 0, 0, 0, 1),
                     G.GgmlValueError, "d0"),
    "dw2d_kernel_shape": (lambda c: G.ggml_conv_2d_dw_direct(c, _t(c, 3, 3, 4, 1), _t(c, 8, 8, 4)), G.GgmlValueError,
                          "[KW, KH, 1, C]"),
    "dw2d_f16_images": (lambda c: G.ggml_conv_2d_dw_direct(c, _t(c, 3, 3, 1, 4), _t(c, 8, 8, 4, type=F16)),
                        G.GgmlTypeError, "F32"),
    "dw2d_permuted_images": (lambda c: G.ggml_conv_2d_dw_direct(c, _t(c, 3, 3, 1, 4),
                                                                G.ggml_permute(c, _t(c, 4, 8, 8), 2, 0, 1, 3)),
                             G.GgmlValueError, "contiguous"),
    "dw2d_too_small": (lambda c: G.ggml_conv_2d_dw_direct(c, _t(c, 5, 5, 1, 4), _t(c, 3, 8, 4)), G.GgmlValueError,
                       "width"),
    "c2d_channels": (lambda c: G.ggml_conv_2d_direct(c, _t(c, 3, 3, 2, 4), _t(c, 8, 8, 3)), G.GgmlValueError,
                     "channels"),
    "c2d_f16_images": (lambda c: G.ggml_conv_2d_direct(c, _t(c, 3, 3, 2, 4), _t(c, 8, 8, 2, type=F16)),
                       G.GgmlTypeError, "F32"),
    "c2d_huge_patch": (lambda c: G.ggml_conv_2d_direct(c, _t(c, 64, 64, 1100, 1), _t(c, 64, 64, 1100)),
                       G.GgmlValueError, "scratch"),
    "c2d_negative_padding": (lambda c: G.ggml_conv_2d_direct(c, _t(c, 3, 3, 2, 4), _t(c, 8, 8, 2), 1, 1, -1),
                             G.GgmlValueError, "p0"),
    "reflect_too_long": (lambda c: G.ggml_pad_reflect_1d(c, _t(c, 4, 3), 4, 0), G.GgmlValueError, "shorter"),
    "reflect_negative": (lambda c: G.ggml_pad_reflect_1d(c, _t(c, 4, 3), 1, -1), G.GgmlValueError, "p1"),
    "reflect_strided": (lambda c: G.ggml_pad_reflect_1d(c, G.ggml_transpose(c, _t(c, 4, 3)), 1, 1), G.GgmlValueError,
                        "contiguous"),
    "reflect_f16": (lambda c: G.ggml_pad_reflect_1d(c, _t(c, 4, 3, type=F16), 1, 1), G.GgmlTypeError, "F32"),
    "pad_ext_negative": (lambda c: G.ggml_pad_ext(c, _t(c, 4, 3), -1), G.GgmlValueError, "lp0"),
    "pad_ext_float": (lambda c: G.ggml_pad_ext(c, _t(c, 4, 3), 1.5), G.GgmlTypeError, "lp0"),
    "upscale_factor_1": (lambda c: G.ggml_upscale(c, _t(c, 4, 3), 1), G.GgmlValueError, ">= 2"),
    "upscale_mode": (lambda c: G.ggml_upscale(c, _t(c, 4, 3), 2, 3), G.GgmlValueError, "GGML_SCALE_MODE"),
    "upscale_f16": (lambda c: G.ggml_upscale(c, _t(c, 4, 3, type=F16), 2), G.GgmlTypeError, "F32"),
    "roll_too_far": (lambda c: G.ggml_roll(c, _t(c, 4, 3), 4), G.GgmlValueError, "shift0"),
    "roll_negative_too_far": (lambda c: G.ggml_roll(c, _t(c, 4, 3), 0, -3), G.GgmlValueError, "shift1"),
    "roll_transposed": (lambda c: G.ggml_roll(c, G.ggml_transpose(c, _t(c, 4, 3)), 1), G.GgmlValueError, "rows"),
    "set_types": (lambda c: G.ggml_set_1d(c, _t(c, 8), _t(c, 2, type=I32), 0), G.GgmlTypeError, "a's type"),
    "set_f16": (lambda c: G.ggml_set_1d(c, _t(c, 8, type=F16), _t(c, 2, type=F16), 0), G.GgmlTypeError, "F32/I32"),
    "set_past_the_end": (lambda c: G.ggml_set_1d(c, _t(c, 8), _t(c, 3), 4 * 6), G.GgmlValueError, "beyond"),
    "set_2d_past_the_end": (lambda c: G.ggml_set_2d(c, _t(c, 6, 5), _t(c, 3, 2), 24, 4 * (4 * 6 + 2)),
                            G.GgmlValueError, "beyond"),
    "set_row_overflows": (lambda c: G.ggml_set_2d(c, _t(c, 6, 5), _t(c, 3, 2), 24, 4 * (4 * 6 + 4)),
                          G.GgmlValueError, "beyond"),
    "set_unaligned_offset": (lambda c: G.ggml_set_1d(c, _t(c, 8), _t(c, 2), 2), G.GgmlValueError, "multiple"),
    "set_negative_offset": (lambda c: G.ggml_set_1d(c, _t(c, 8), _t(c, 2), -4), G.GgmlValueError, "offset"),
    "set_bigger_block": (lambda c: G.ggml_set_1d(c, _t(c, 4), _t(c, 6), 0), G.GgmlValueError, "more elements"),
    "set_strided_destination": (lambda c: G.ggml_set_1d(c, G.ggml_transpose(c, _t(c, 4, 3)), _t(c, 2), 0),
                                G.GgmlValueError, "contiguous"),
    "set_huge_stride": (lambda c: G.ggml_set(c, _t(c, 8, 4), _t(c, 2, 2), 1 << 40, 0, 0, 0), G.GgmlValueError,
                        "nb1"),
    "set_float_stride": (lambda c: G.ggml_set(c, _t(c, 8, 4), _t(c, 2, 2), 32.0, 0, 0, 0), G.GgmlTypeError, "nb1"),
    "diag_not_a_vector": (lambda c: G.ggml_diag(c, _t(c, 4, 2)), G.GgmlValueError, "ne[1] == 1"),
    "diag_i32": (lambda c: G.ggml_diag(c, _t(c, 4, type=I32)), G.GgmlTypeError, "F32"),
    "mask_negative": (lambda c: G.ggml_diag_mask_zero(c, _t(c, 4, 4), -1), G.GgmlValueError, "n_past"),
    "mask_strided": (lambda c: G.ggml_diag_mask_zero(c, G.ggml_transpose(c, _t(c, 4, 3)), 0), G.GgmlValueError,
                     "contiguous"),
    "view_not_a_tensor": (lambda c: G.ggml_view_tensor(c, np.zeros(3)), TypeError, "Tensor"),
    "set_zero_not_a_tensor": (lambda c: G.ggml_set_zero([1.0]), TypeError, "Tensor"),
}


@pytest.mark.parametrize("name", sorted(MISUSE))
def test_misuse_raises_before_ggml_is_called(ctx, name):
    call, exc, fragment = MISUSE[name]
    with pytest.raises(exc, match="(?i)" + re.escape(fragment)):
        call(ctx)


def test_misuse_never_aborts_the_interpreter():
    """The same misuse in a fresh interpreter: it survives every call (a missing check would abort it)."""
    code = ("import ggmlpy as G, numpy as np\nfrom tests.ops.test_conv import MISUSE\n"
            "ctx = G.ggml_init(16 << 20, no_alloc=True)\n"
            "for name, (call, exc, _) in MISUSE.items():\n"
            "    try:\n        call(ctx)\n    except exc:\n        pass\n    else:\n        print('NO ERROR', name)\n"
            "print('SURVIVED')\n")
    rc, out, err = run_in_subprocess(code, timeout=120)
    assert rc == 0 and "SURVIVED" in out, f"rc={rc}: {err[-2000:]}"
    assert "NO ERROR" not in out, out


# ---------------------------------------------------------------- Vulkan

VULKAN_CASES = {
    "conv_transpose_1d": (lambda c, a, b: G.ggml_conv_transpose_1d(c, a, b, 2), [(3, 4, 5), (3, 7)]),
    "conv_transpose_2d_p0": (lambda c, a, b: G.ggml_conv_transpose_2d_p0(c, a, b, 2), [(3, 2, 2, 3), (1, 3, 4, 5)]),
    "conv_2d_dw_direct": (lambda c, a, b: G.ggml_conv_2d_dw_direct(c, a, b, 1, 1, 1, 1), [(3, 1, 3, 3), (2, 3, 6, 7)]),
    "conv_2d_direct": (lambda c, a, b: G.ggml_conv_2d_direct(c, a, b, 1, 1, 1, 1), [(4, 3, 3, 3), (2, 3, 6, 7)]),
    "pad_ext": (lambda c, x: G.ggml_pad_ext(c, x, 1, 2, 0, 1), [(2, 3, 5)]),
    "upscale_bilinear": (lambda c, x: G.ggml_upscale(c, x, 2, G.GGML_SCALE_MODE_BILINEAR), [(2, 3, 5)]),
    "roll": (lambda c, x: G.ggml_roll(c, x, 2, -1), [(2, 3, 5)]),
}


@pytest.fixture(scope="module")
def vulkan():
    if "vulkan" not in G.ggml_backends_built():
        pytest.skip("the Vulkan backend is not built in this installation (GGMLPY_BACKENDS)")
    if G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("no Vulkan0 device on this machine (set GGML_VK_VISIBLE_DEVICES=0 to use lavapipe)")
    b = G.ggml_backend_init_by_name("Vulkan0")
    yield b
    b.free()


@pytest.mark.parametrize("name", sorted(VULKAN_CASES))
def test_vulkan_matches_cpu(vulkan, name):
    build, shapes = VULKAN_CASES[name]
    rng = np.random.default_rng(11)
    arrays = [r32(rng, *s) for s in shapes]
    made = []

    def build_and_check(c, *tensors):
        out = build(c, *tensors)
        made.append(bool(lib.ggml_backend_supports_op(vulkan.ptr, out.ptr)))
        return out
    (cpu,) = compute(build, *arrays)
    # the inputs live in Vulkan memory and Vulkan implements the op, so the scheduler runs it there
    (gpu,) = compute(build_and_check, *arrays, backend=vulkan)
    assert made == [True], f"Vulkan does not implement {name}"
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the tiled convolution (patches/0036)

def tiled(s0=1, s1=1, p0=0, p1=0, d0=1, d1=1):
    return lambda ctx, k, x, *b: G.ggml_conv_2d_tiled(ctx, k, x, b[0] if b else None, s0, s1, p0, p1, d0, d1)


def conv_bias_ref(X, K, b, geometry):
    out = conv2d_ref(X, K, *geometry)
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def cpu_threads(n):
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, n)
    return b


# (N, C, H, W, O, KH, KW), (s0, s1, p0, p1, d0, d1)
TILED_CASES = [
    ((2, 3, 8, 9, 4, 3, 3), (1, 1, 1, 1, 1, 1)),
    ((1, 1, 28, 28, 8, 3, 3), (1, 1, 1, 1, 1, 1)),     # one input channel (a first layer)
    ((3, 2, 7, 6, 5, 2, 3), (2, 1, 0, 1, 1, 2)),       # strides, asymmetric padding, dilation
    ((2, 4, 10, 11, 3, 3, 3), (1, 2, 2, 0, 2, 1)),
    ((1, 2, 9, 1, 3, 3, 1), (1, 1, 0, 2, 1, 1)),       # a sequence: one-column images (Conv1D's use)
    ((2, 64, 12, 20, 40, 3, 3), (1, 1, 1, 1, 1, 1)),   # K = 576 taps: tiles of a few rows, not whole images
    ((1, 256, 3, 100, 4, 3, 3), (1, 1, 1, 1, 1, 1)),   # K = 2304: tiles of 64 positions, each across two rows
    ((2, 8, 1, 3000, 4, 1, 5), (1, 1, 2, 0, 1, 1)),    # a long sequence: tiles of part of its one row
    ((1, 3, 5, 5, 2, 5, 5), (1, 1, 0, 0, 1, 1)),       # a kernel the size of the image: one output
    # patches/0063's direct path (stride 1 along W): runs of 16 positions two at a time, 12 channels at a time
    ((2, 3, 6, 37, 29, 3, 3), (1, 1, 3, 2, 1, 1)),     # padding wider than the kernel's reach; 29 = 2 x 12 + 5
    ((1, 2, 4, 40, 3, 3, 17), (1, 1, 8, 1, 1, 1)),     # a kernel wider than 16 (0036's path before 0076)
    ((3, 5, 7, 16, 13, 3, 3), (1, 2, 1, 1, 2, 2)),     # rows of exactly 16, dilation along W
    # patches/0073: with a stride of 1 the images' gradient is a direct convolution of the output gradient by the
    # flipped kernel, and the kernel's is taken from the images in blocks of 3 taps x up to 8 output channels
    ((2, 3, 9, 20, 5, 3, 3), (1, 1, 2, 1, 2, 2)),      # dilation both ways: flipped padding 2 and 3
    ((2, 14, 6, 18, 3, 3, 3), (1, 1, 1, 1, 1, 1)),     # 14 = 12 + 2 image channels: two blocks of the flipped kernel
    ((1, 2, 5, 7, 3, 2, 4), (1, 1, 0, 5, 1, 1)),       # padding past the kernel's reach along H: flipped padding -4
    ((3, 2, 6, 33, 11, 2, 2), (1, 1, 1, 0, 1, 1)),     # 8 taps (3 + 3 + 2), 11 = 8 + 3 output channels, 3 runs a row
    # patches/0076: images copied padded (rows up to 128 wide with their masks once), runs 3 at a time times blocks
    # of 8 output channels, whole images per call
    ((1, 3, 5, 150, 9, 3, 3), (1, 1, 1, 1, 1, 1)),     # rows 152 wide padded (masks per row); 9 = 8 + 1 channels
    ((5, 2, 4, 9, 8, 3, 3), (1, 1, 1, 1, 1, 1)),       # 4 runs an image: 3 + 1; 5 images over the threads
    ((4, 3, 5, 16, 16, 3, 3), (1, 1, 2, 0, 1, 1)),     # 5 runs of 16: 3 + 2; padding only along W
    ((1, 64, 9, 20, 8, 3, 3), (1, 2, 1, 1, 1, 1)),     # stride 2 along H, tiles of 64 positions starting mid-row
    # patches/0080: the kernel's gradient with lanes over 16 output channels (output gradients transposed 16 x 16),
    # NCH channels x the taps in registers
    ((3, 8, 14, 14, 16, 3, 3), (1, 1, 1, 1, 1, 1)),    # the small CNN's conv2: channels 3 + 3 + 2, 196 = 12 x 16 + 4
    ((2, 4, 7, 9, 32, 3, 3), (1, 2, 1, 0, 1, 1)),      # two blocks of 16 channels, 3 + 1, stride 2 along H
    ((2, 2, 9, 11, 16, 5, 5), (1, 1, 2, 2, 1, 1)),     # 5 x 5 taps, one channel at a time
    ((2, 10, 5, 6, 16, 1, 1), (1, 1, 0, 0, 1, 1)),     # 1 x 1 taps: 8 + 2 channels
    ((1, 1, 28, 28, 16, 3, 3), (1, 1, 1, 1, 1, 1)),    # one input channel
    # patches/0082: where the output rows are as long as the image's (a "same" convolution, stride 1 along H) runs
    # are 16 positions of the plane across its rows, each tap's lanes outside the row masked; patches/0081: the
    # bias's gradient summed by the direct kernel gradient
    ((2, 3, 6, 5, 4, 3, 3), (1, 1, 1, 1, 1, 1)),       # rows of 5: a run across 3 or 4 rows
    ((2, 2, 7, 12, 9, 3, 3), (1, 1, 2, 1, 2, 1)),      # dilation 2 along W, padding 2: still as wide; 9 = 8 + 1
    ((1, 2, 4, 40, 3, 3, 3), (1, 1, 17, 1, 17, 1)),    # taps 17 columns left and right: past a run's 16 lanes
    ((2, 3, 5, 7, 16, 3, 3), (1, 1, 1, 1, 1, 1)),      # 16 channels (0080's kernel gradient) on rows of 7
    ((1, 2, 5, 7, 3, 3, 3), (1, 1, 1, 4, 1, 1)),       # padding 4 along H: the images' gradient flat with -2
    ((2, 2, 6, 10, 5, 2, 4), (1, 1, 3, 1, 2, 1)),      # an even kernel width: 4 columns 2 apart, padding 3
    ((2, 3, 5, 16, 4, 3, 3), (1, 1, 1, 1, 1, 1)),      # rows of 16: each run one row, both its ends masked
    ((1, 256, 30, 5, 4, 3, 3), (1, 1, 1, 1, 1, 1)),    # K = 2304: flat tiles of 64 positions over rows of 5
]


@covers("ggml_conv_2d_tiled")
@pytest.mark.parametrize("shape, geometry", TILED_CASES, ids=[str(c[0]) for c in TILED_CASES])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_tiled_convolution_matches_numpy_float64(shape, geometry, threads, with_bias):
    N, C, H, W, O, KH, KW = shape
    rng = np.random.default_rng(N * 100 + C + H)
    x, k, b = r32(rng, N, C, H, W), r32(rng, O, C, KH, KW), r32(rng, O)
    backend = cpu_threads(threads)
    try:
        (out,) = compute(tiled(*geometry), k, x, *((b,) if with_bias else ()), backend=backend)
    finally:
        backend.free()
    ref = conv_bias_ref(x.astype(np.float64), k.astype(np.float64), b.astype(np.float64) if with_bias else None,
                        geometry)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(ref).max()))


def conv_grads_ref(X, K, w, geometry):
    """The gradients of sum(conv(X, K) + b) * w) by the chain rule, written independently of the op: the kernel's
    and the images' from the same shifted patches as conv2d_ref, the bias's as the weights' sums."""
    s0, s1, p0, p1, d0, d1 = geometry
    N, C, H, W = X.shape
    O, _, KH, KW = K.shape
    OH, OW = w.shape[2:]
    Xp = np.pad(X, ((0, 0), (0, 0), (p1, p1), (p0, p0)))
    dXp, dK = np.zeros_like(Xp), np.zeros_like(K)
    for ky in range(KH):
        for kx in range(KW):
            rows = slice(ky * d1, ky * d1 + s1 * (OH - 1) + 1, s1)
            cols = slice(kx * d0, kx * d0 + s0 * (OW - 1) + 1, s0)
            dK[:, :, ky, kx] = np.einsum("nchw,nohw->oc", Xp[:, :, rows, cols], w)
            dXp[:, :, rows, cols] += np.einsum("nohw,oc->nchw", w, K[:, :, ky, kx])
    return dXp[:, :, p1:p1 + H, p0:p0 + W], dK, w.sum(axis=(0, 2, 3))


@pytest.mark.parametrize("shape, geometry", TILED_CASES, ids=[str(c[0]) for c in TILED_CASES])
@pytest.mark.parametrize("threads", [1, 3])
def test_tiled_convolution_gradients_match_the_chain_rule(shape, geometry, threads):
    """The images', kernel's and bias's gradients of every case (tiles of a few rows included) against numpy."""
    N, C, H, W, O, KH, KW = shape
    rng = np.random.default_rng(N + C * 10 + H)
    x, k, b = r32(rng, N, C, H, W), r32(rng, O, C, KH, KW), r32(rng, O)
    ref_out = conv2d_ref(x.astype(np.float64), k.astype(np.float64), *geometry)
    w = r32(rng, *ref_out.shape)
    dx, dk, db = conv_grads_ref(x.astype(np.float64), k.astype(np.float64), w.astype(np.float64), geometry)
    backend = cpu_threads(threads)
    try:
        op = tiled(*geometry)
        _, gx = compute_grad(lambda ctx, xx, kk, bb: op(ctx, kk, xx, bb), x, w, k, b, backend=backend)
        _, gk = compute_grad(lambda ctx, kk, xx, bb: op(ctx, kk, xx, bb), k, w, x, b, backend=backend)
        _, gb = compute_grad(lambda ctx, bb, kk, xx: op(ctx, kk, xx, bb), b, w, k, x, backend=backend)
    finally:
        backend.free()
    for got, want, name in ((gx, dx, "images"), (gk, dk, "kernel"), (gb, db, "bias")):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()), err_msg=name)


@pytest.mark.parametrize("geometry", [(1, 1, 1, 1, 1, 1), (2, 1, 0, 1, 1, 2)])
def test_tiled_convolution_gradients_match_finite_differences(geometry):
    rng = np.random.default_rng(5)
    x, k, b = r32(rng, 2, 2, 5, 6), r32(rng, 3, 2, 3, 3), r32(rng, 3)
    w = r32(rng, *conv2d_ref(x.astype(np.float64), k.astype(np.float64), *geometry).shape)
    f64 = lambda a: a.astype(np.float64)   # noqa: E731
    op = tiled(*geometry)
    for name, arr, build, f in (
            ("images", x, lambda ctx, xx, kk, bb: op(ctx, kk, xx, bb),
             lambda v: conv_bias_ref(v, f64(k), f64(b), geometry)),
            ("kernel", k, lambda ctx, kk, xx, bb: op(ctx, kk, xx, bb),
             lambda v: conv_bias_ref(f64(x), v, f64(b), geometry))):
        others = (k, b) if name == "images" else (x, b)
        _, got = compute_grad(build, arr, w, *others)
        np.testing.assert_allclose(got, fd_grad(f, arr, f64(w)), rtol=1e-4, atol=3e-5, err_msg=name)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("out_channels", [4, 16])
def test_tiled_convolution_keeps_an_inf_and_a_nan_where_numpy_has_them(threads, out_channels):
    """An inf and a NaN in the images, and an inf in the output gradient at a row's first column, reach only the
    outputs and gradients whose sums read them (numpy float64 on the same data): the direct kernels compute lanes
    past a run from the next columns (the padded copy's, or the next row's output gradient), which must never be
    stored (the forward, the images' gradient) or summed (the kernel's gradient: those lanes masked to 0 on both
    sides). With 16 output channels the kernel's gradient takes patches/0080's lanes over channels. The geometry
    keeps the rows' width, so the runs are flat (patches/0082): a tap's lanes at a row's ends would read the
    neighbouring row's inf or NaN, and are masked."""
    rng = np.random.default_rng(21)
    geometry = (1, 1, 1, 1, 1, 1)
    x, k, b = r32(rng, 3, 2, 7, 13), r32(rng, out_channels, 2, 3, 3), r32(rng, out_channels)
    x[0, 1, 2, 12] = np.inf                      # the last column: the next row's lanes in the padded copy
    x[2, 0, 6, 0] = np.nan                       # the last row's first column
    f64 = lambda a: a.astype(np.float64)   # noqa: E731
    backend = cpu_threads(threads)
    try:
        (out,) = compute(tiled(*geometry), k, x, b, backend=backend)
        w = r32(rng, *out.shape)
        w[1, 2, 3, 0] = np.inf                   # read as a lane past the run of row 2 (13 positions)
        op = tiled(*geometry)
        _, gk = compute_grad(lambda ctx, kk, xx, bb: op(ctx, kk, xx, bb), k, w, x, b, backend=backend)
        _, gx = compute_grad(lambda ctx, xx, kk, bb: op(ctx, kk, xx, bb), x, w, k, b, backend=backend)
    finally:
        backend.free()
    ref = conv_bias_ref(f64(x), f64(k), f64(b), geometry)
    dx, dk, _ = conv_grads_ref(f64(x), f64(k), f64(w), geometry)
    assert np.isfinite(ref).sum() > ref.size // 2 and not np.isfinite(ref).all()
    assert np.isinf(dk).any() and np.isfinite(dx).sum() > dx.size // 2 and not np.isfinite(dx).all()
    for got, want, name in ((out, ref, "output"), (gk, dk, "kernel gradient"), (gx, dx, "images' gradient")):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=name)
        fin = np.isfinite(want)
        np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want[fin]).max()))


def test_tiled_convolution_with_more_threads_than_images_and_an_image_alone():
    """Two threads and one image: the backward pass gives whole images to threads, so one has none."""
    rng = np.random.default_rng(9)
    x, k, b = r32(rng, 1, 3, 6, 7), r32(rng, 4, 3, 3, 3), r32(rng, 4)
    w = r32(rng, 1, 4, 6, 7)
    dx, dk, db = conv_grads_ref(x.astype(np.float64), k.astype(np.float64), w.astype(np.float64), (1, 1, 1, 1, 1, 1))
    backend = cpu_threads(4)
    try:
        op = tiled(1, 1, 1, 1, 1, 1)
        _, gk = compute_grad(lambda ctx, kk, xx, bb: op(ctx, kk, xx, bb), k, w, x, b, backend=backend)
        _, gx = compute_grad(lambda ctx, xx, kk, bb: op(ctx, kk, xx, bb), x, w, k, b, backend=backend)
    finally:
        backend.free()
    np.testing.assert_allclose(gk, dk, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gx, dx, rtol=1e-5, atol=1e-5)


def test_tiled_convolution_operands_are_checked_before_ggml():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        k = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 2, 4)
        x = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 8, 2, 1)
        with pytest.raises(ValueError, match=r"input channels a.ne\[2\]=2 must equal the images' channels b.ne\[2\]=3"):
            G.ggml_conv_2d_tiled(ctx, k, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 8, 3, 1))
        with pytest.raises(ValueError, match=r"bias must hold one value per output channel \(4\)"):
            G.ggml_conv_2d_tiled(ctx, k, x, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3))
        with pytest.raises(TypeError, match="f32"):
            G.ggml_conv_2d_tiled(ctx, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F16, 3, 3, 2, 4), x)
        with pytest.raises(ValueError, match="contiguous"):
            G.ggml_conv_2d_tiled(ctx, k, G.ggml_permute(ctx, x, 1, 0, 2, 3))
        with pytest.raises(ValueError, match="width"):
            G.ggml_conv_2d_tiled(ctx, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 9, 3, 2, 4), x)
        with pytest.raises(ValueError, match="s0"):
            G.ggml_conv_2d_tiled(ctx, k, x, None, 0)
    finally:
        ctx.free()


# ---------------------------------------------------------------- coverage

def test_this_file_covers_its_ops():
    """tests/ops/test_ops.py checks that every op of ggmlpy.ops has a forward test, here or there."""
    assert len(COVERED) >= 19 and all(name in G.__all__ for name in COVERED)
