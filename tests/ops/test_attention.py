"""Transformer ops (ggmlpy/ops/attention.py, and the group/L2 norms, mul_mat_id, windows and backward ops
in ops/reduce.py, ops/linalg.py, ops/resize.py and ops/backward.py) against numpy float64 references written from their
definitions; the gradients of rope against central finite differences; ops without a backward pass
refused in trainable graphs; misuse raising instead of aborting; rope and flash attention on Vulkan.

Arrays are in ggml layout (numpy shape = reversed ne); ``compute`` returns 4-D (ne3, ne2, ne1, ne0).
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import lib
from tests.helpers.compute import compute, compute_grad, nd4, new_tensor_like
from tests.helpers.gradients import fd_grad
from tests.helpers.subprocesses import (
    assert_refused_naming_op,
    backward_refusal_script,
    run_cases_in_subprocess,
    run_in_subprocess,
)


F32_TOL = dict(rtol=2e-5, atol=2e-6)


def f64(a):
    return np.asarray(a, dtype=np.float64)


def u32(rng, *shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape).astype(np.float32)


def assert_close(out, ref, **tol):
    ref = nd4(ref)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    np.testing.assert_allclose(out.astype(np.float64), ref, **(tol or F32_TOL))


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


# ---------------------------------------------------------------- numpy references

def rope_ref(a, pos, n_dims, mode, base=10000.0, freq_scale=1.0, attn_factor=1.0, ff=None):
    """a (B, T, H, D); token t rotated by angles pos[t] * base**(-2i/n_dims) (/ ff[i], * freq_scale)."""
    a = f64(nd4(a))
    out = a.copy()
    h = n_dims // 2
    i = np.arange(h)
    for t, p in enumerate(pos):
        th = p * base ** (-2.0 * i / n_dims)
        if ff is not None:
            th = th / f64(ff[:h])
        th = th * freq_scale
        cos, sin = np.cos(th) * attn_factor, np.sin(th) * attn_factor
        i0, i1 = (2 * i, 2 * i + 1) if mode == G.GGML_ROPE_TYPE_NORM else (i, i + h)
        x0, x1 = a[:, t][..., i0], a[:, t][..., i1]
        row = out[:, t]
        row[..., i0] = x0 * cos - x1 * sin
        row[..., i1] = x0 * sin + x1 * cos
    return out


def rope_multi_ref(a, pos, n_dims, sections, mode, base=10000.0):
    """ggml's M-RoPE (one angle sequence, NEOX pairs) and vision RoPE (angles restart per section,
    pairs (i, i + n_dims) over the whole row); pos holds the t, h, w, e blocks of T positions each."""
    a = f64(nd4(a))
    out = a.copy()
    T, D = a.shape[1], a.shape[3]
    s = list(sections)
    starts = [0, s[0], s[0] + s[1], s[0] + s[1] + s[2]]
    total = sum(s)
    vision = mode == G.GGML_ROPE_TYPE_VISION
    n_pairs = D // 2 if vision else n_dims // 2
    for t in range(T):
        p4 = [pos[t + k * T] for k in range(4)]
        th = np.zeros(n_pairs)
        for i in range(n_pairs):
            sector = i % total
            k = 3 if sector >= starts[3] else 2 if sector >= starts[2] else 1 if sector >= starts[1] else 0
            steps = sector - starts[k] if vision else i
            th[i] = p4[k] * base ** (-2.0 * steps / n_dims)
        i = np.arange(n_pairs)
        i0, i1 = (i, i + n_dims) if vision else (i, i + n_dims // 2)
        row = out[:, t]
        x0, x1 = a[:, t][..., i0], a[:, t][..., i1]
        row[..., i0] = x0 * np.cos(th) - x1 * np.sin(th)
        row[..., i1] = x0 * np.sin(th) + x1 * np.cos(th)
    return out


def timestep_ref(t, dim, max_period):
    half = dim // 2
    freqs = np.exp(-math.log(max_period) * np.arange(half) / half)
    args = f64(t)[:, None] * freqs[None, :]
    emb = np.concatenate([np.cos(args), np.sin(args)], axis=1)
    if dim % 2:
        emb = np.concatenate([emb, np.zeros((len(t), 1))], axis=1)
    return emb


def alibi_slope(h, n_head, max_bias):
    if max_bias <= 0:
        return 1.0
    n_log2 = 2 ** int(math.floor(math.log2(n_head)))
    m0, m1 = 2.0 ** (-max_bias / n_log2), 2.0 ** (-(max_bias / 2.0) / n_log2)
    return m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1)


def attention_ref(q, k, v, mask, scale, max_bias=0.0, softcap=0.0):
    """q (B, H, Nq, Dk), k (B, Hkv, Nkv, Dk), v (B, Hkv, Nkv, Dv), mask (M3, M2, >=Nq, >=Nkv) or None
    -> (B, Nq, H, Dv): softmax(scale q.k (soft-capped) + slope * mask) v, ggml's permuted result."""
    q, k, v = f64(nd4(q)), f64(nd4(k)), f64(nd4(v))
    B, H, Nq, _ = q.shape
    Hkv, Nkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = np.zeros((B, Nq, H, Dv))
    for b in range(B):
        for h in range(H):
            kh = h // (H // Hkv)
            s = scale * q[b, h] @ k[b, kh].T                            # (Nq, Nkv)
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if mask is not None:
                m = f64(nd4(mask))
                s = s + alibi_slope(h, H, max_bias) * m[b % m.shape[0], h % m.shape[1], :Nq, :Nkv]
            e = np.exp(s - s.max(-1, keepdims=True))
            out[b, :, h] = (e / e.sum(-1, keepdims=True)) @ v[b, kh]
    return out


def group_norm_ref(x, n_groups, eps):
    x = f64(nd4(x))                                                 # (N, C, H, W)
    N, C = x.shape[:2]
    per = -(-C // n_groups)
    out = np.empty_like(x)
    for n in range(N):
        for g0 in range(0, C, per):
            blk = x[n, g0:g0 + per]
            out[n, g0:g0 + per] = (blk - blk.mean()) / np.sqrt(blk.var() + eps)
    return out


def softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---------------------------------------------------------------- rope forward

@pytest.mark.parametrize("mode", [0, 2], ids=["norm", "neox"])
@pytest.mark.parametrize("n_dims", [8, 4])
def test_rope_matches_definition(rng, mode, n_dims):
    a = u32(rng, 2, 5, 3, 8)                                        # [8, 3 heads, 5 tokens, 2]
    pos = np.array([0, 1, 4, 9, 100], np.int32)
    (out,) = compute(lambda c, t, p: G.ggml_rope(c, t, p, n_dims, mode), a, pos)
    assert_close(out, rope_ref(a, pos, n_dims, mode), rtol=1e-5, atol=2e-5)
    if n_dims < 8:  # the values past n_dims are copied unchanged
        np.testing.assert_array_equal(out[..., n_dims:], a[..., n_dims:])


def test_rope_is_not_the_identity_and_modes_differ(rng):
    """A test that could pass with a no-op or a swapped mode must not: the two modes give different
    rotations, and both differ from the input."""
    a = u32(rng, 4, 2, 8)
    pos = np.arange(1, 5, dtype=np.int32)
    o_norm, o_neox = compute(lambda c, t, p: (G.ggml_rope(c, t, p, 8, 0), G.ggml_rope(c, t, p, 8, 2)), a, pos)
    assert np.abs(o_norm - nd4(a)).max() > 0.1
    assert np.abs(o_norm - o_neox).max() > 0.1


def test_rope_ext_options_match_definition(rng):
    a = u32(rng, 4, 2, 10)
    pos = np.array([3, 0, 7, 12], np.int32)
    ff = rng.uniform(0.5, 2.0, 4).astype(np.float32)
    (out,) = compute(lambda c, t, p, f: G.ggml_rope_ext(c, t, p, f, 8, G.GGML_ROPE_TYPE_NEOX, 0, 500.0, 0.5, 0.0,
                                                        1.5, 32.0, 1.0), a, pos, ff)
    rope_ext_ref = rope_ref(a, pos, 8, 2, base=500.0, freq_scale=0.5, attn_factor=1.5, ff=ff)
    assert_close(out, rope_ext_ref, rtol=1e-5, atol=2e-5)
    # defaults: ggml_rope_ext(..., n_dims, mode) equals ggml_rope
    (ext, plain) = compute(lambda c, t, p: (G.ggml_rope_ext(c, t, p, None, 8, 0), G.ggml_rope(c, t, p, 8, 0)), a, pos)
    np.testing.assert_allclose(ext, plain, rtol=0, atol=1e-6)
    assert np.abs(nd4(rope_ext_ref) - plain).max() > 0.1  # the options do change the result


@pytest.mark.parametrize("fn", ["ggml_rope_inplace", "ggml_rope_ext_inplace"])
def test_rope_inplace_overwrites_a(rng, fn):
    a = u32(rng, 3, 2, 6)
    pos = np.array([1, 2, 5], np.int32)

    def build(c, t, p):
        r = G.ggml_rope_inplace(c, t, p, 6, 2) if fn == "ggml_rope_inplace" else \
            G.ggml_rope_ext_inplace(c, t, p, None, 6, 2)
        assert r.ptr.view_src == t.ptr      # a view of a: no memory of its own
        return r, t
    out, a_after = compute(build, a, pos)
    assert_close(out, rope_ref(a, pos, 6, 2), rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(a_after, out)


def test_inplace_result_follows_the_lifetime_of_a():
    """The in-place result views a: once a's context is freed, using it raises instead of crashing."""
    ca = G.ggml_init(1 << 20)
    cb = G.ggml_init(1 << 20, no_alloc=True)
    a = G.ggml_new_tensor_3d(ca, G.GGML_TYPE_F32, 4, 2, 3)
    pos = G.ggml_new_tensor_1d(ca, G.GGML_TYPE_I32, 3)
    r = G.ggml_rope_inplace(cb, a, pos, 4)
    n = G.ggml_l2_norm_inplace(cb, a)
    assert r.shape == n.shape == (4, 2, 3, 1)
    ca.free()
    for t in (r, n):
        with pytest.raises(G.GgmlStateError):
            _ = t.shape
    cb.free()


@pytest.mark.parametrize("mode, ne0, n_dims, sections", [
    (G.GGML_ROPE_TYPE_MROPE, 12, 8, [2, 1, 1, 0]),
    (G.GGML_ROPE_TYPE_MROPE, 8, 8, [1, 2, 0, 1]),
    (G.GGML_ROPE_TYPE_VISION, 8, 4, [2, 2, 0, 0]),
], ids=["mrope", "mrope_extra_section", "vision"])
def test_rope_multi_matches_definition(rng, mode, ne0, n_dims, sections):
    T = 3
    a = u32(rng, T, 2, ne0)
    pos = rng.integers(0, 20, 4 * T).astype(np.int32)
    (out,) = compute(lambda c, t, p: G.ggml_rope_multi(c, t, p, None, n_dims, sections, mode), a, pos)
    assert_close(out, rope_multi_ref(a, pos, n_dims, sections, mode), rtol=1e-5, atol=2e-5)


def test_rope_multi_takes_numpy_sections(rng):
    a = u32(rng, 2, 2, 8)
    pos = rng.integers(0, 9, 8).astype(np.int32)
    (out,) = compute(lambda c, t, p: G.ggml_rope_multi(c, t, p, None, np.int64(8), np.array([2, 1, 1, 0]),
                                                       np.int32(G.GGML_ROPE_TYPE_MROPE)), a, pos)
    assert_close(out, rope_multi_ref(a, pos, 8, [2, 1, 1, 0], G.GGML_ROPE_TYPE_MROPE), rtol=1e-5, atol=2e-5)


def test_rope_multi_with_plain_mode_is_rope_ext(rng):
    a = u32(rng, 3, 2, 8)
    pos = np.array([4, 1, 0], np.int32)
    multi, ext = compute(lambda c, t, p: (G.ggml_rope_multi(c, t, p, None, 8, [1, 1, 1, 1], 2),
                                          G.ggml_rope_ext(c, t, p, None, 8, 2)), a, pos)
    np.testing.assert_array_equal(multi, ext)


def test_rope_multi_inplace(rng):
    a = u32(rng, 2, 2, 8)
    pos = rng.integers(0, 9, 8).astype(np.int32)
    out, a_after = compute(lambda c, t, p: (G.ggml_rope_multi_inplace(c, t, p, None, 4, [2, 2, 0, 0],
                                                                      G.GGML_ROPE_TYPE_VISION), t), a, pos)
    assert_close(out, rope_multi_ref(a, pos, 4, [2, 2, 0, 0], G.GGML_ROPE_TYPE_VISION), rtol=1e-5, atol=2e-5)
    np.testing.assert_array_equal(a_after, out)


def test_rope_constants():
    assert (G.GGML_ROPE_TYPE_NORM, G.GGML_ROPE_TYPE_NEOX, G.GGML_ROPE_TYPE_MROPE, G.GGML_ROPE_TYPE_VISION) == \
        (0, 2, 8, 24)


# ---------------------------------------------------------------- rope backward

ROPE_GRADS = {
    "rope_norm": (lambda c, x, p: G.ggml_rope(c, x, p, 8, 0), lambda x, p: rope_ref(x, p, 8, 0), 8),
    "rope_neox_partial": (lambda c, x, p: G.ggml_rope(c, x, p, 4, 2), lambda x, p: rope_ref(x, p, 4, 2), 8),
    "rope_ext_scaled": (lambda c, x, p: G.ggml_rope_ext(c, x, p, None, 6, 0, 0, 100.0, 0.25, 0.0, 0.8),
                        lambda x, p: rope_ref(x, p, 6, 0, base=100.0, freq_scale=0.25, attn_factor=0.8), 8),
    "rope_multi_mrope": (lambda c, x, p: G.ggml_rope_multi(c, x, p, None, 8, [2, 1, 1, 0], G.GGML_ROPE_TYPE_MROPE),
                         lambda x, p: rope_multi_ref(x, p, 8, [2, 1, 1, 0], G.GGML_ROPE_TYPE_MROPE), 10),
}


@pytest.mark.parametrize("name", sorted(ROPE_GRADS))
def test_rope_gradient_matches_finite_differences(name):
    build, f, ne0 = ROPE_GRADS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = u32(rng, 3, 2, ne0)
    n_pos = 12 if "multi" in name else 3
    pos = rng.integers(0, 30, n_pos).astype(np.int32)
    r = u32(rng, 3, 2, ne0)
    loss, grad = compute_grad(build, x, r, pos)
    fd = fd_grad(lambda z: f(z, pos)[0], x, f64(r))
    np.testing.assert_allclose(loss, float(np.sum(f(x, pos)[0] * f64(r))), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grad, fd, rtol=1e-3, atol=1e-4)
    assert np.abs(grad - f64(r)).max() > 1e-2  # not the identity: the gradient is rotated back


# ---------------------------------------------------------------- timestep embedding

@pytest.mark.parametrize("dim, max_period", [(8, 10000), (7, 100)])
def test_timestep_embedding(rng, dim, max_period):
    t = np.array([0.0, 1.0, 17.5, 999.0], np.float32)
    (out,) = compute(lambda c, x: G.ggml_timestep_embedding(c, x, dim, max_period), t)
    assert_close(out, timestep_ref(t, dim, max_period), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- flash attention

def _causal_mask(n_q, n_kv, rows, cols, offset):
    m = np.zeros((rows, cols), np.float32)
    for i in range(n_q):
        m[i, offset + i + 1:] = -np.inf
    return m.astype(np.float16)


@pytest.mark.parametrize("case", ["plain", "gqa_mask", "alibi_softcap", "f32_kv", "tiled", "tiled_f32_gqa_softcap"])
def test_flash_attn_ext_matches_attention(rng, case):
    B, H, Hkv, Nq, Nkv, Dk, Dv = 1, 2, 2, 3, 5, 8, 8
    kv_type = np.float16
    max_bias, softcap, mask = 0.0, 0.0, None
    if case == "gqa_mask":
        B, H, Hkv, Nq, Nkv, Dk, Dv = 2, 4, 2, 4, 6, 16, 8
    if case == "alibi_softcap":
        H, Hkv, max_bias, softcap = 3, 1, 2.0, 1.0
    if case == "f32_kv":
        kv_type = np.float32
    if case == "tiled":                     # >= 64 queries: the CPU's tiled kernel
        H, Hkv, Nq, Nkv, Dk, Dv = 1, 1, 70, 70, 16, 16
    if case == "tiled_f32_gqa_softcap":     # its F32 path (patches/0065): two heads per K/V head, a partial tile of
        B, H, Hkv, Nq, Nkv, Dk, Dv = 2, 4, 2, 70, 75, 32, 24   # queries and of keys, a mask, the soft cap, ALiBi
        kv_type, max_bias, softcap = np.float32, 2.0, 1.0
    q = u32(rng, B, H, Nq, Dk)
    k = u32(rng, B, Hkv, Nkv, Dk).astype(kv_type)
    v = u32(rng, B, Hkv, Nkv, Dv).astype(kv_type)
    if case in ("gqa_mask", "alibi_softcap", "tiled", "tiled_f32_gqa_softcap"):
        # padded beyond n_kv and n_q (ggml reads only the first n_kv x n_q entries), one plane per batch
        planes = B if case in ("gqa_mask", "tiled_f32_gqa_softcap") else 1
        mask = np.stack([_causal_mask(Nq, Nkv, Nq + 3, Nkv + 2, Nkv - Nq - b) for b in range(planes)])
        mask = mask.reshape(planes, 1, Nq + 3, Nkv + 2)
        if case in ("alibi_softcap", "tiled_f32_gqa_softcap"):
            mask = (rng.uniform(-1, 0, mask.shape) + mask.astype(np.float32)).astype(np.float16)
    scale = 1.5 if softcap else 1 / math.sqrt(Dk)   # scores beyond the soft cap's linear range
    ins = [q, k, v] + ([mask] if mask is not None else [])
    (out,) = compute(lambda c, tq, tk, tv, *tm: G.ggml_flash_attn_ext(c, tq, tk, tv, tm[0] if tm else None, scale,
                                                                      max_bias, softcap), *ins)
    ref = attention_ref(q, k, v, mask, scale, max_bias, softcap)
    # F16 keys/values: q is rounded to F16 for the dot products and, on some paths, values accumulate in F16
    tol = dict(rtol=2e-5, atol=2e-5) if kv_type == np.float32 else dict(rtol=2e-3, atol=2e-3)
    assert_close(out, ref, **tol)
    # the options matter: without the mask, the ALiBi slopes or the soft cap the result is different
    if mask is not None:
        assert np.abs(ref - attention_ref(q, k, v, None, scale, 0.0, softcap)).max() > 1e-2
    if max_bias:
        assert np.abs(ref - attention_ref(q, k, v, mask, scale, 0.0, softcap)).max() > 1e-2
    if softcap:
        assert np.abs(ref - attention_ref(q, k, v, mask, scale, max_bias, 0.0)).max() > 1e-2


# ---------------------------------------------------------------- group and L2 norms

@pytest.mark.parametrize("C, n_groups", [(6, 3), (5, 2), (4, 4), (3, 1)])
def test_group_norm(rng, C, n_groups):
    x = u32(rng, 2, C, 3, 4, lo=-2, hi=3)                   # [W=4, H=3, C, N=2]
    (out,) = compute(lambda c, t: G.ggml_group_norm(c, t, n_groups, 1e-6), x)
    assert_close(out, group_norm_ref(x, n_groups, 1e-6), rtol=1e-4, atol=1e-4)


def test_group_norm_default_eps_and_inplace(rng):
    x = u32(rng, 1, 4, 2, 3)
    out, x_after = compute(lambda c, t: (G.ggml_group_norm_inplace(c, t, 2), t), x)
    assert_close(out, group_norm_ref(x, 2, 1e-5), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(x_after, out)


def test_l2_norm(rng):
    x = u32(rng, 2, 3, 5)
    x[0, 1] = 0.0                                            # a zero row stays zero (divided by eps)
    ref = f64(x) / np.maximum(np.linalg.norm(f64(x), axis=-1, keepdims=True), 1e-5)
    out, out_t, out_in, x_after = compute(lambda c, t: (G.ggml_l2_norm(c, t, 1e-5),
                                                         G.ggml_l2_norm(c, G.ggml_transpose(c, t)),
                                                         G.ggml_l2_norm_inplace(c, G.ggml_cont(c, t)),
                                                         t), x)
    assert_close(out, ref)
    assert_close(out_in, ref)
    # a strided view: each of its rows (a's columns) is normalised
    xt = np.swapaxes(f64(x), -1, -2)
    assert_close(out_t, xt / np.linalg.norm(xt, axis=-1, keepdims=True))
    np.testing.assert_array_equal(x_after, nd4(x))          # l2_norm (not in place) leaves a alone


def test_l2_norm_eps_bounds_small_rows():
    x = np.array([[3e-3, 4e-3], [3.0, 4.0]], np.float32)     # norms 5e-3 and 5
    (out,) = compute(lambda c, t: G.ggml_l2_norm(c, t, 0.1), x)
    assert_close(out, np.array([[3e-2, 4e-2], [0.6, 0.8]]))


# ---------------------------------------------------------------- relative positions, windows

def test_get_rel_pos(rng):
    kh, C = 4, 3
    a = u32(rng, 2 * kh - 1, C).astype(np.float16)
    (out,) = compute(lambda c, t: G.ggml_get_rel_pos(c, t, kh, kh), a)
    ref = np.array([[a[q - k + kh - 1] for k in range(kh)] for q in range(kh)])   # (qh, kh, C)
    assert_close(out, f64(ref), rtol=0, atol=0)


def test_add_rel_pos(rng):
    K, Q1, Q2, B = 3, 2, 2, 2
    a = u32(rng, B, Q1 * Q2, K * K)
    pw, ph = u32(rng, B, Q2, Q1, K), u32(rng, B, Q2, Q1, K)
    (out,) = compute(lambda c, ta, tw, th: G.ggml_add_rel_pos(c, ta, tw, th), a, pw, ph)
    Q = Q1 * Q2
    ref = f64(a).reshape(B, Q, K, K) + f64(ph).reshape(B, Q, K)[..., :, None] + f64(pw).reshape(B, Q, K)[..., None, :]
    assert_close(out, ref.reshape(B, Q, K * K))


@pytest.mark.parametrize("H, W, w", [(4, 6, 2), (5, 7, 3), (3, 3, 3)])
def test_win_part_and_unpart(rng, H, W, w):
    C = 2
    x = u32(rng, H, W, C)                                       # [C, W, H]
    win, back = compute(lambda c, t: (lambda p: (p, G.ggml_win_unpart(c, p, W, H, w)))(G.ggml_win_part(c, t, w)), x)
    npx, npy = -(-W // w), -(-H // w)
    padded = np.zeros((npy * w, npx * w, C))
    padded[:H, :W] = x
    ref = np.stack([padded[py * w:(py + 1) * w, px * w:(px + 1) * w] for py in range(npy) for px in range(npx)])
    assert_close(win, ref, rtol=0, atol=0)
    assert_close(back, x, rtol=0, atol=0)


# ---------------------------------------------------------------- mixture of experts

@pytest.mark.parametrize("b1, as_type", [(1, np.float32), (2, np.float32), (1, np.float16)])
def test_mul_mat_id_selects_experts(rng, b1, as_type):
    E, M, K, T, U = 4, 5, 6, 3, 2
    experts = u32(rng, E, M, K).astype(as_type)               # [K, M, E]
    x = u32(rng, T, b1, K)                                    # [K, b1, T]
    ids = np.array([[3, 0], [1, 1], [2, 3]], np.int32)        # [U, T]
    (out,) = compute(lambda c, ta, tb, ti: G.ggml_mul_mat_id(c, ta, tb, ti), experts, x, ids)
    ref = np.array([[f64(experts[ids[t, e]]) @ f64(x[t, e % b1]) for e in range(U)] for t in range(T)])
    tol = F32_TOL if as_type == np.float32 else dict(rtol=5e-3, atol=5e-3)
    assert_close(out, ref, **tol)


# ---------------------------------------------------------------- explicit backward ops

def test_silu_back(rng):
    x, dy = u32(rng, 3, 7, lo=-4, hi=4), u32(rng, 3, 7)
    (out,) = compute(lambda c, a, b: G.ggml_silu_back(c, a, b), dy, x)
    s = 1 / (1 + np.exp(-f64(x)))
    assert_close(out, f64(dy) * s * (1 + f64(x) * (1 - s)), rtol=1e-5, atol=1e-6)


def test_rms_norm_back(rng):
    n, eps = 6, 1e-3
    x, dy = u32(rng, 4, n, lo=-2, hi=2), u32(rng, 4, n)
    (out,) = compute(lambda c, a, b: G.ggml_rms_norm_back(c, a, b, eps), dy, x)
    xx, d = f64(x), f64(dy)
    r = 1 / np.sqrt((xx * xx).mean(-1, keepdims=True) + eps)
    ref = r * d - xx * r ** 3 * (xx * d).mean(-1, keepdims=True)       # J^T dy of y = x r(x)
    assert_close(out, ref, rtol=1e-5, atol=1e-6)
    fd = fd_grad(lambda z: z / np.sqrt((z * z).mean(-1, keepdims=True) + eps), x, d)
    np.testing.assert_allclose(ref, fd, rtol=1e-6, atol=1e-8)          # the reference is the derivative


@pytest.mark.parametrize("inplace", [False, True])
def test_soft_max_ext_back(rng, inplace):
    scale = 0.7
    y = softmax(scale * f64(u32(rng, 2, 3, 5, lo=-2, hi=2))).astype(np.float32)
    dy = u32(rng, 2, 3, 5)
    fn = G.ggml_soft_max_ext_back_inplace if inplace else G.ggml_soft_max_ext_back
    out, dy_after = compute(lambda c, a, b: (fn(c, a, b, scale), a), dy, y)
    yy, d = f64(y), f64(dy)
    assert_close(out, scale * yy * (d - (yy * d).sum(-1, keepdims=True)), rtol=1e-5, atol=1e-6)
    if inplace:
        np.testing.assert_array_equal(dy_after, out)
    else:
        np.testing.assert_array_equal(dy_after, nd4(dy))


@pytest.mark.parametrize("a_type", [np.float32, np.float16])
def test_get_rows_back_accumulates_repeated_rows(rng, a_type):
    n_embd, n_rows = 3, 5
    idx = np.array([4, 0, 4, 2, 4, 1], np.int32)
    grad = u32(rng, len(idx), n_embd).astype(a_type)
    table = np.zeros((n_rows, n_embd), np.float32)
    (out,) = compute(lambda c, a, b, t: G.ggml_get_rows_back(c, a, b, t), grad, idx, table)
    ref = np.zeros((n_rows, n_embd))
    np.add.at(ref, idx, f64(grad))
    assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert not np.any(out[0, 0, 3])  # row 3 was never picked


# ---------------------------------------------------------------- no backward pass: refused, never aborted

_NO_BACKWARD = backward_refusal_script('x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 4, 2)')

NO_BACKWARD = {
    # q = x [8, 4 queries, 2 heads]; F16 keys/values [8, 6, 1]: its backward pass (patches/0056) takes F32 only
    "flash_attn_ext_f16": ("G.ggml_flash_attn_ext(ctx, x, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F16, 8, 6, 1), "
                       "G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F16, 8, 6, 1), None, 0.35)", "FLASH_ATTN_EXT"),
    "group_norm": ("G.ggml_group_norm(ctx, x, 2)", "GROUP_NORM"),
    "l2_norm": ("G.ggml_l2_norm(ctx, x)", "L2_NORM"),
    "win_part": ("G.ggml_win_part(ctx, x, 2)", "WIN_PART"),
    "mul_mat_id": ("G.ggml_mul_mat_id(ctx, x, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 1, 3), "
                   "G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 1, 3))", "MUL_MAT_ID"),
    "timestep_embedding": ("G.ggml_timestep_embedding(ctx, G.ggml_reshape_1d(ctx, x, 64), 4)", "TIMESTEP_EMBEDDING"),
    "flash_attn_ext_softcap": ("G.ggml_flash_attn_ext(ctx, x, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 6, 1), "
                               "G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 6, 1), None, 0.35, logit_softcap=30.0)",
                               "FLASH_ATTN_EXT"),
}


@pytest.fixture(scope="module")
def no_backward_results():
    """Every case in one fresh interpreter: ggml would abort the process on each of them."""
    return run_cases_in_subprocess(_NO_BACKWARD, NO_BACKWARD)


@pytest.mark.parametrize("key", sorted(NO_BACKWARD))
def test_op_without_backward_is_refused_in_a_trainable_graph(no_backward_results, key):
    assert_refused_naming_op(no_backward_results, NO_BACKWARD, key)


def test_flash_attn_ext_tiled_propagates_a_nan_key(rng):
    """patches/0065: the tiled kernel's row maxima are NaN where a score is NaN. With a causal mask the first query
    sees only key 0; a NaN there made its scores [NaN, -inf, ...], whose scalar running maximum ended at -inf: the
    row was skipped and gave 0. Every query sees key 0, so numpy's attention is NaN everywhere."""
    q = u32(rng, 1, 1, 70, 16)
    k = u32(rng, 1, 1, 70, 16)
    v = u32(rng, 1, 1, 70, 16)
    k[0, 0, 0, 3] = np.nan
    mask = np.stack([_causal_mask(70, 70, 70, 70, 0)]).reshape(1, 1, 70, 70)
    (out,) = compute(lambda c, tq, tk, tv, tm: G.ggml_flash_attn_ext(c, tq, tk, tv, tm, 0.25), q, k, v, mask)
    assert np.isnan(attention_ref(q, k, v, mask, 0.25, 0.0, 0.0)).all()
    assert np.isnan(out).all()


def test_flash_attn_ext_off_the_gradient_path_is_fine(rng):
    """Forward-only (F16 keys and values) means: not between a parameter and the loss. A graph that trains
    something else and also computes such flash attention on data builds its backward pass."""
    ctx = G.ggml_init(8 << 20, no_alloc=True)
    try:
        w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 4))
        q = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 4, 1)
        kv = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F16, 8, 5, 1)
        att = G.ggml_flash_attn_ext(ctx, q, kv, kv, None, 0.3)            # [8, 1, 4, 1]
        loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, w)))
        g = G.ggml_new_graph_custom(ctx, 256, True)
        G.ggml_build_forward_expand(g, att)
        G.ggml_build_forward_expand(g, loss)
        G.ggml_build_backward_expand(ctx, g)
        assert G.ggml_graph_get_grad(g, w) is not None
    finally:
        ctx.free()


def test_trainable_rope_frequency_factors_are_refused():
    # ggml has no gradient for them: ggml_build_backward_expand would abort (GGML_ASSERT in ggml.c)
    code = """
import ggmlpy as G
ctx = G.ggml_init(1 << 20, no_alloc=True)
x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 2, 3)
pos = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 3)
f = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2))
try:
    G.ggml_rope_ext(ctx, x, pos, G.ggml_scale(ctx, f, 2.0), 4)
except ValueError as e:
    print("VALUEERROR", e)
"""
    rc, out, err = run_in_subprocess(code)
    assert rc == 0, err[-2000:]
    assert "VALUEERROR" in out and "frequency factors" in out, out


# Checks of the shared graph checks (ggmlpy/ops/base.py and graph/) for the ops of this module: each case aborted or
# corrupted memory inside ggml before the check existed, so each runs in a subprocess.

_INPLACE_ON_GRADIENT_PATH = """
import ggmlpy as G
ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
x = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 2, 3))
pos = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 3)
y = G.ggml_rope_inplace(ctx, G.ggml_scale(ctx, x, 2.0), pos, 8)
loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, y)))
g = G.ggml_new_graph_custom(ctx, 256, True)
G.ggml_build_forward_expand(g, loss)
try:
    G.ggml_build_backward_expand(ctx, g)
except ValueError as e:
    print("VALUEERROR", e)
"""


def test_inplace_rope_on_the_gradient_path_is_refused():
    rc, out, err = run_in_subprocess(_INPLACE_ON_GRADIENT_PATH)
    assert rc == 0 and "VALUEERROR" in out, f"rc={rc}: {(out + err)[-1500:]}"


_OUT_OF_RANGE_INDEX_INPUT = """
import numpy as np, ggmlpy as G
be = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
{build}
buf = G.ggml_backend_alloc_ctx_tensors(ctx, be)
G.ggml_backend_tensor_set_data(idx, np.array({values}, np.int32))
g = G.ggml_new_graph_custom(ctx, 64, False)
G.ggml_build_forward_expand(g, out)
try:
    G.ggml_backend_graph_compute(be, g)
except ValueError as e:
    print("VALUEERROR", e)
else:
    print("COMPUTED")
"""
_INDEX_CASES = {
    "get_rows_back": ("a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2)\n"
                      "idx = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2)\n"
                      "out = G.ggml_get_rows_back(ctx, a, idx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 4))",
                      [1, 9]),
    "mul_mat_id": ("ex = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 2)\n"
                   "idx = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 1, 2)\n"
                   "out = G.ggml_mul_mat_id(ctx, ex, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 1, 2), idx)",
                   [0, 7]),
}


@pytest.mark.parametrize("case", sorted(_INDEX_CASES))
def test_out_of_range_index_inputs_are_refused_before_compute(case):
    build, values = _INDEX_CASES[case]
    rc, out, err = run_in_subprocess(_OUT_OF_RANGE_INDEX_INPUT.format(build=build, values=values))
    assert rc == 0 and "VALUEERROR" in out, f"rc={rc}: {(out + err)[-1500:]}"


# ---------------------------------------------------------------- misuse: an exception, never an abort

MISUSE_PRELUDE = """
import numpy as np, ggmlpy as G
ctx = G.ggml_init(256 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(256) + 4096, no_alloc=True)
F32, F16, I32, BF16 = G.GGML_TYPE_F32, G.GGML_TYPE_F16, G.GGML_TYPE_I32, G.GGML_TYPE_BF16
def T(t, *ne):
    new = [G.ggml_new_tensor_1d, G.ggml_new_tensor_2d, G.ggml_new_tensor_3d, G.ggml_new_tensor_4d][len(ne) - 1]
    return new(ctx, t, *ne)
a = T(F32, 8, 2, 3)          # [head_dim 8, 2 heads, 3 tokens]
pos = T(I32, 3)
q, k16, v16 = T(F32, 8, 4, 2), T(F16, 8, 6, 2), T(F16, 8, 6, 2)
img = T(F32, 4, 4, 6, 2)
"""

# name: (statement, expected exception: "TypeError" or "ValueError", a word the message must contain)
MISUSE = {
    "rope_odd_n_dims": ("G.ggml_rope(ctx, a, pos, 5)", "ValueError", "even"),
    "rope_n_dims_too_large": ("G.ggml_rope(ctx, a, pos, 10)", "ValueError", "n_dims"),
    "rope_n_dims_zero": ("G.ggml_rope(ctx, a, pos, 0)", "ValueError", "n_dims"),
    "rope_mode_1": ("G.ggml_rope(ctx, a, pos, 8, 1)", "ValueError", "mode"),
    "rope_mode_str": ("G.ggml_rope(ctx, a, pos, 8, 'neox')", "TypeError", "mode"),
    "rope_ext_mrope_mode": ("G.ggml_rope_ext(ctx, a, pos, None, 8, G.GGML_ROPE_TYPE_MROPE)", "ValueError",
                            "ggml_rope_multi"),
    "rope_positions_f32": ("G.ggml_rope(ctx, a, T(F32, 3), 8)", "TypeError", "I32"),
    "rope_positions_short": ("G.ggml_rope(ctx, a, T(I32, 2), 8)", "ValueError", "positions"),
    "rope_positions_2d": ("G.ggml_rope(ctx, a, T(I32, 3, 1, 1, 2), 8)", "ValueError", "positions"),
    "rope_positions_strided": ("G.ggml_rope(ctx, a, G.ggml_transpose(ctx, G.ggml_view_2d(ctx, T(I32, 6), 1, 3, 8)), 8)",
                               "ValueError", "contiguous"),
    "rope_i32_input": ("G.ggml_rope(ctx, T(I32, 8, 2, 3), pos, 8)", "TypeError", "F32"),
    "rope_transposed_input": ("G.ggml_rope(ctx, G.ggml_transpose(ctx, T(F32, 2, 8, 3)), pos, 2)", "ValueError",
                              "contiguous rows"),
    "rope_ext_n_dims_missing": ("G.ggml_rope_ext(ctx, a, pos)", "TypeError", "n_dims"),
    "rope_ext_freq_factors_f16": ("G.ggml_rope_ext(ctx, a, pos, T(F16, 4), 8)", "TypeError", "c"),
    "rope_ext_freq_factors_short": ("G.ggml_rope_ext(ctx, a, pos, T(F32, 3), 8)", "ValueError", "frequency"),
    "rope_ext_freq_base_zero": ("G.ggml_rope_ext(ctx, a, pos, None, 8, 0, 0, 0.0)", "ValueError", "freq_base"),
    "rope_ext_freq_scale_nan": ("G.ggml_rope_ext(ctx, a, pos, None, 8, 0, 0, 1e4, float('nan'))", "ValueError",
                                "freq_scale"),
    "rope_ext_n_ctx_orig_negative": ("G.ggml_rope_ext(ctx, a, pos, None, 8, 0, -1)", "ValueError", "n_ctx_orig"),
    "rope_multi_vision_n_dims": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [2, 2, 0, 0], "
                                 "G.GGML_ROPE_TYPE_VISION)", "ValueError", "n_dims"),
    "rope_multi_sections_zero": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [0, 0, 0, 4], "
                                 "G.GGML_ROPE_TYPE_MROPE)", "ValueError", "sections"),
    "rope_multi_sections_three": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [2, 1, 1], "
                                  "G.GGML_ROPE_TYPE_MROPE)", "TypeError", "sections"),
    "rope_multi_sections_negative": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [2, -1, 1, 0], "
                                     "G.GGML_ROPE_TYPE_MROPE)", "ValueError", "sections"),
    "rope_multi_sections_too_many": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [4, 4, 4, 0], "
                                     "G.GGML_ROPE_TYPE_MROPE)", "ValueError", "sections"),
    "rope_multi_one_position_per_token": ("G.ggml_rope_multi(ctx, a, pos, None, 8, [2, 1, 1, 0], "
                                          "G.GGML_ROPE_TYPE_MROPE)", "ValueError", "4 * a.ne[2]"),
    "rope_multi_mode_16": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, [2, 1, 1, 0], 16)", "ValueError", "mode"),
    "timestep_f16": ("G.ggml_timestep_embedding(ctx, T(F16, 4), 8)", "TypeError", "F32"),
    "timestep_2d": ("G.ggml_timestep_embedding(ctx, T(F32, 4, 2), 8)", "ValueError", "vector"),
    "timestep_dim_zero": ("G.ggml_timestep_embedding(ctx, T(F32, 4), 0)", "ValueError", "dim"),
    "timestep_max_period_zero": ("G.ggml_timestep_embedding(ctx, T(F32, 4), 8, 0)", "ValueError", "max_period"),
    "flash_q_f16": ("G.ggml_flash_attn_ext(ctx, T(F16, 8, 4, 2), k16, v16, None, 0.3)", "TypeError", "q"),
    "flash_v_type_differs": ("G.ggml_flash_attn_ext(ctx, q, k16, T(F32, 8, 6, 2), None, 0.3)", "TypeError", "v"),
    "flash_k_bf16": ("G.ggml_flash_attn_ext(ctx, q, T(BF16, 8, 6, 2), T(BF16, 8, 6, 2), None, 0.3)", "TypeError",
                     "k"),
    "flash_mask_f32": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, T(F32, 6, 4), 0.3)", "TypeError", "F16"),
    "flash_mask_too_few_rows": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, T(F16, 6, 3), 0.3)", "ValueError", "mask"),
    "flash_mask_too_few_keys": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, T(F16, 5, 4), 0.3)", "ValueError", "mask"),
    "flash_mask_heads_not_dividing": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, T(F16, 6, 4, 3), 0.3)", "ValueError",
                                      "mask"),
    "flash_mask_strided": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, G.ggml_transpose(ctx, T(F16, 4, 6)), 0.3)",
                           "ValueError", "contiguous"),
    "flash_key_size_differs": ("G.ggml_flash_attn_ext(ctx, q, T(F16, 4, 6, 2), T(F16, 8, 6, 2), None, 0.3)",
                               "ValueError", "ne[0]"),
    "flash_v_length_differs": ("G.ggml_flash_attn_ext(ctx, q, k16, T(F16, 8, 5, 2), None, 0.3)", "ValueError", "v"),
    "flash_heads_not_multiple": ("G.ggml_flash_attn_ext(ctx, T(F32, 8, 4, 3), k16, v16, None, 0.3)", "ValueError",
                                 "heads"),
    "flash_batch_differs": ("G.ggml_flash_attn_ext(ctx, T(F32, 8, 4, 2, 2), k16, v16, None, 0.3)", "ValueError",
                            "ne[3]"),
    "flash_scale_missing": ("G.ggml_flash_attn_ext(ctx, q, k16, v16)", "TypeError", "scale"),
    "flash_alibi_without_mask": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, None, 0.3, 8.0)", "ValueError", "mask"),
    "flash_k_transposed": ("G.ggml_flash_attn_ext(ctx, q, G.ggml_transpose(ctx, T(F16, 6, 8, 2)), v16, None, 0.3)",
                           "ValueError", "contiguous rows"),
    "group_norm_zero_groups": ("G.ggml_group_norm(ctx, img, 0)", "ValueError", "n_groups"),
    "group_norm_more_groups_than_channels": ("G.ggml_group_norm(ctx, img, 7)", "ValueError", "n_groups"),
    "group_norm_f16": ("G.ggml_group_norm(ctx, T(F16, 4, 4, 6), 2)", "TypeError", "F32"),
    "group_norm_negative_eps": ("G.ggml_group_norm(ctx, img, 2, -1.0)", "ValueError", "eps"),
    "group_norm_transposed": ("G.ggml_group_norm(ctx, G.ggml_transpose(ctx, img), 2)", "ValueError", "contiguous"),
    "group_norm_inplace_zero_groups": ("G.ggml_group_norm_inplace(ctx, img, 0)", "ValueError", "n_groups"),
    "l2_norm_f16": ("G.ggml_l2_norm(ctx, T(F16, 4))", "TypeError", "F32"),
    "l2_norm_nan_eps": ("G.ggml_l2_norm_inplace(ctx, T(F32, 4), float('nan'))", "ValueError", "eps"),
    "get_rel_pos_qh_kh_differ": ("G.ggml_get_rel_pos(ctx, T(F16, 4, 7), 4, 3)", "ValueError", "qh"),
    "get_rel_pos_wrong_rows": ("G.ggml_get_rel_pos(ctx, T(F16, 4, 6), 4, 4)", "ValueError", "2 * kh - 1"),
    "get_rel_pos_f32": ("G.ggml_get_rel_pos(ctx, T(F32, 4, 7), 4, 4)", "TypeError", "F16"),
    "get_rel_pos_bf16": ("G.ggml_get_rel_pos(ctx, T(BF16, 4, 7), 4, 4)", "TypeError", "F16"),
    "add_rel_pos_pw_ph_differ": ("G.ggml_add_rel_pos(ctx, T(F32, 9, 4, 2), T(F32, 3, 2, 2, 2), T(F32, 3, 4, 1, 2))",
                                 "ValueError", "same shape"),
    "add_rel_pos_wrong_a": ("G.ggml_add_rel_pos(ctx, T(F32, 8, 4, 2), T(F32, 3, 2, 2, 2), T(F32, 3, 2, 2, 2))",
                            "ValueError", "K*K"),
    "add_rel_pos_f16": ("G.ggml_add_rel_pos(ctx, T(F16, 9, 4, 2), T(F32, 3, 2, 2, 2), T(F32, 3, 2, 2, 2))",
                        "TypeError", "F32"),
    "win_part_w_zero": ("G.ggml_win_part(ctx, T(F32, 2, 4, 4), 0)", "ValueError", "w"),
    "win_part_4d": ("G.ggml_win_part(ctx, img, 2)", "ValueError", "3-D"),
    "win_part_f16": ("G.ggml_win_part(ctx, T(F16, 2, 4, 4), 2)", "TypeError", "F32"),
    "win_part_strided": ("G.ggml_win_part(ctx, G.ggml_transpose(ctx, T(F32, 2, 4, 4)), 2)", "ValueError",
                         "contiguous"),
    "win_unpart_count": ("G.ggml_win_unpart(ctx, T(F32, 2, 2, 2, 3), 4, 4, 2)", "ValueError", "ceil"),
    "win_unpart_window_size": ("G.ggml_win_unpart(ctx, T(F32, 2, 3, 2, 4), 4, 4, 2)", "ValueError", "ceil"),
    "win_unpart_w_zero": ("G.ggml_win_unpart(ctx, T(F32, 2, 2, 2, 4), 4, 4, 0)", "ValueError", "w"),
    "mul_mat_id_ids_f32": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4), T(F32, 6, 1, 3), T(F32, 2, 3))", "TypeError",
                           "I32"),
    "mul_mat_id_ids_tokens": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4), T(F32, 6, 1, 3), T(I32, 2, 2))",
                              "ValueError", "token"),
    "mul_mat_id_broadcast": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4), T(F32, 6, 2, 3), T(I32, 3, 3))", "ValueError",
                             "multiple"),
    "mul_mat_id_k_differs": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4), T(F32, 5, 1, 3), T(I32, 2, 3))", "ValueError",
                             "ne[0]"),
    "mul_mat_id_4d_experts": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4, 2), T(F32, 6, 1, 3), T(I32, 2, 3))",
                              "ValueError", "3-D"),
    "mul_mat_id_b_f16": ("G.ggml_mul_mat_id(ctx, T(F16, 6, 5, 4), T(F16, 6, 1, 3), T(I32, 2, 3))", "TypeError", "b"),
    "mul_mat_id_argmax_ids_too_large": ("G.ggml_mul_mat_id(ctx, T(F32, 6, 5, 4), T(F32, 6, 1, 3), "
                                        "G.ggml_reshape_2d(ctx, G.ggml_argmax(ctx, T(F32, 9, 3)), 1, 3))",
                                        "ValueError", "argmax"),
    "silu_back_shapes": ("G.ggml_silu_back(ctx, T(F32, 4, 2), T(F32, 4, 3))", "ValueError", "shape"),
    "silu_back_types": ("G.ggml_silu_back(ctx, T(F32, 4, 2), T(F16, 4, 2))", "TypeError", "b"),
    "silu_back_i32": ("G.ggml_silu_back(ctx, T(I32, 4), T(I32, 4))", "TypeError", "F32"),
    "gelu_back_shapes": ("G.ggml_gelu_back(ctx, T(F32, 4, 2), T(F32, 4, 3))", "ValueError", "shape"),
    "gelu_back_f16": ("G.ggml_gelu_back(ctx, T(F16, 4, 2), T(F16, 4, 2))", "TypeError", "F32"),
    "gelu_back_x_f16": ("G.ggml_gelu_back(ctx, T(F32, 4, 2), T(F16, 4, 2))", "TypeError", "like a: F32"),
    "gelu_back_strided": ("G.ggml_gelu_back(ctx, G.ggml_transpose(ctx, T(F32, 2, 4)), T(F32, 4, 2))", "ValueError",
                          "contiguous"),
    "norm_back_shapes": ("G.ggml_norm_back(ctx, T(F32, 4, 2), T(F32, 4, 3))", "ValueError", "shape"),
    "norm_back_f16": ("G.ggml_norm_back(ctx, T(F16, 4, 2), T(F16, 4, 2))", "TypeError", "F32"),
    "norm_back_strided": ("G.ggml_norm_back(ctx, T(F32, 4, 2), G.ggml_transpose(ctx, T(F32, 2, 4)))", "ValueError",
                          "contiguous"),
    "norm_back_eps": ("G.ggml_norm_back(ctx, T(F32, 4, 2), T(F32, 4, 2), -1.0)", "ValueError", "eps"),
    "silu_back_strided": ("G.ggml_silu_back(ctx, G.ggml_transpose(ctx, T(F32, 2, 4)), T(F32, 4, 2))", "ValueError",
                          "contiguous"),
    "rms_norm_back_f16": ("G.ggml_rms_norm_back(ctx, T(F16, 4), T(F16, 4))", "TypeError", "F32"),
    "rms_norm_back_shapes": ("G.ggml_rms_norm_back(ctx, T(F32, 4), T(F32, 5))", "ValueError", "shape"),
    "rms_norm_back_eps": ("G.ggml_rms_norm_back(ctx, T(F32, 4), T(F32, 4), -1e-5)", "ValueError", "eps"),
    "soft_max_back_alibi": ("G.ggml_soft_max_ext_back(ctx, T(F32, 4, 2), T(F32, 4, 2), 1.0, 0.5)", "ValueError",
                            "max_bias"),
    "soft_max_back_inplace_alibi": ("G.ggml_soft_max_ext_back_inplace(ctx, T(F32, 4, 2), T(F32, 4, 2), 1.0, 0.5)",
                                    "ValueError", "max_bias"),
    "soft_max_back_strided": ("G.ggml_soft_max_ext_back(ctx, G.ggml_transpose(ctx, T(F32, 2, 4)), T(F32, 4, 2))",
                              "ValueError", "contiguous"),
    "soft_max_back_shapes": ("G.ggml_soft_max_ext_back(ctx, T(F32, 4, 2), T(F32, 4, 3))", "ValueError", "shape"),
    "get_rows_back_f32_indices": ("G.ggml_get_rows_back(ctx, T(F32, 3, 4), T(F32, 4), T(F32, 3, 5))", "TypeError",
                                  "I32"),
    "get_rows_back_index_count": ("G.ggml_get_rows_back(ctx, T(F32, 3, 4), T(I32, 5), T(F32, 3, 5))", "ValueError",
                                  "one index per column"),
    "get_rows_back_row_size": ("G.ggml_get_rows_back(ctx, T(F32, 3, 4), T(I32, 4), T(F32, 2, 5))", "ValueError",
                               "ne[0]"),
    "get_rows_back_3d": ("G.ggml_get_rows_back(ctx, T(F32, 3, 4, 2), T(I32, 4), T(F32, 3, 5))", "ValueError",
                         "matri"),
    "get_rows_back_argmax_indices": ("G.ggml_get_rows_back(ctx, T(F32, 3, 4), G.ggml_argmax(ctx, T(F32, 9, 4)), "
                                     "T(F32, 3, 5))", "ValueError", "argmax"),
    "rope_n_dims_huge": ("G.ggml_rope(ctx, a, pos, 2 ** 40)", "ValueError", "n_dims"),
    "rope_n_dims_float": ("G.ggml_rope(ctx, a, pos, 8.0)", "TypeError", "n_dims"),
    "rope_mode_bool": ("G.ggml_rope(ctx, a, pos, 8, True)", "TypeError", "mode"),
    "rope_multi_sections_str": ("G.ggml_rope_multi(ctx, a, T(I32, 12), None, 8, '2110', 8)", "TypeError", "sections"),
    "group_norm_groups_float": ("G.ggml_group_norm(ctx, img, 2.0)", "TypeError", "n_groups"),
    "win_part_w_huge": ("G.ggml_win_part(ctx, T(F32, 2, 4, 4), 2 ** 33)", "ValueError", "w"),
    "flash_scale_str": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, None, '0.3')", "TypeError", "scale"),
    "flash_softcap_inf": ("G.ggml_flash_attn_ext(ctx, q, k16, v16, None, 0.3, 0.0, float('inf'))", "ValueError",
                          "logit_softcap"),
    "not_a_tensor": ("G.ggml_rope(ctx, np.zeros((3, 8), np.float32), pos, 8)", "TypeError", "Tensor"),
}


@pytest.fixture(scope="module")
def misuse_results():
    """Every misuse case in one fresh interpreter; an abort would show as missing lines and rc -6/134."""
    lines = [MISUSE_PRELUDE, "import sys"]
    for key, (stmt, _, _) in MISUSE.items():
        lines.append(f"print('START|{key}', flush=True)\ntry:\n    {stmt}\n"
                     f"except BaseException as e:\n    print('RESULT|{key}|' + json.dumps([type(e).__name__, "
                     f"isinstance(e, TypeError), isinstance(e, ValueError), isinstance(e, G.GgmlpyError), str(e)]),"
                     f" flush=True)\nelse:\n    print('RESULT|{key}|null', flush=True)")
    rc, out, err = run_in_subprocess("import json\n" + "\n".join(lines), timeout=120)
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT|"):
            _, key, payload = line.split("|", 2)
            results[key] = json.loads(payload)
    started = [line.split("|", 1)[1] for line in out.splitlines() if line.startswith("START|")]
    return rc, results, started, err


@pytest.mark.parametrize("key", sorted(MISUSE))
def test_misuse_raises_instead_of_aborting(misuse_results, key):
    rc, results, started, err = misuse_results
    stmt, kind, word = MISUSE[key]
    if key not in results:
        crashed = started[-1] if started else "?"
        pytest.fail(f"no result for {key}: the interpreter died (rc={rc}) during case {crashed}: {err[-1500:]}")
    got = results[key]
    assert got is not None, f"{stmt} completed without an error"
    name, is_type, is_value, is_ours, message = got
    assert is_ours, f"{stmt} raised {name}, not a ggmlpy error: {message}"
    assert (is_type if kind == "TypeError" else is_value), f"{stmt} raised {name} ({message}), expected a {kind}"
    assert word.lower() in message.lower(), f"the message of {stmt} does not mention {word!r}: {message}"


# ---------------------------------------------------------------- Vulkan

def _vulkan():
    if "vulkan" not in G.ggml_backends_built():
        pytest.skip("this ggmlpy is built without the Vulkan backend")
    if G.ggml_backend_dev_by_name("Vulkan0") is None:
        pytest.skip("the Vulkan backend is built but there is no Vulkan0 device "
                    "(set GGML_VK_VISIBLE_DEVICES=0 to use Mesa's lavapipe)")
    return G.ggml_backend_init_by_name("Vulkan0")


def _run_on(backend, build, *arrays):
    """build(ctx, *inputs) with every tensor allocated on ``backend``, computed by that backend alone
    (ggml_backend_graph_compute refuses ops the backend does not implement: no CPU fallback)."""
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(64), no_alloc=True)
    try:
        ins = [new_tensor_like(ctx, a) for a in arrays]
        out = build(ctx, *ins)
        if not lib.ggml_backend_supports_op(backend.ptr, out.ptr):
            pytest.skip(f"{backend.name} does not implement {out.op_name} for these types on this device")
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        for t, a in zip(ins, arrays):
            G.ggml_backend_tensor_set_data(t, np.ascontiguousarray(a))
        g = G.ggml_new_graph_custom(ctx, 64, False)
        G.ggml_build_forward_expand(g, out)
        G.ggml_backend_graph_compute(backend, g)
        res = G.ggml_backend_tensor_get_data(out).reshape(tuple(reversed(G.ggml_tensor_shape(out))))
        buf.free()
        return res
    finally:
        ctx.free()


def test_rope_on_vulkan(rng):
    vk = _vulkan()
    try:
        a = u32(rng, 5, 3, 8)
        pos = np.array([0, 2, 5, 9, 31], np.int32)
        for mode in (0, 2):
            out = _run_on(vk, lambda c, t, p, mode=mode: G.ggml_rope_ext(c, t, p, None, 6, mode, 0, 100.0, 0.5), a, pos)
            assert_close(out, rope_ref(a, pos, 6, mode, base=100.0, freq_scale=0.5), rtol=1e-4, atol=1e-4)
    finally:
        vk.free()


def test_flash_attn_ext_on_vulkan(rng):
    vk = _vulkan()
    try:
        H, Hkv, Nq, Nkv, D = 4, 2, 3, 16, 16
        q = u32(rng, 1, H, Nq, D)
        k = u32(rng, 1, Hkv, Nkv, D).astype(np.float16)
        v = u32(rng, 1, Hkv, Nkv, D).astype(np.float16)
        mask = _causal_mask(Nq, Nkv, Nq + 1, Nkv, Nkv - Nq).reshape(1, 1, Nq + 1, Nkv)
        out = _run_on(vk, lambda c, tq, tk, tv, tm: G.ggml_flash_attn_ext(c, tq, tk, tv, tm, 0.25), q, k, v, mask)
        assert_close(out, attention_ref(q, k, v, mask, 0.25), rtol=1e-2, atol=1e-2)
    finally:
        vk.free()
