"""patches/0056: attention's backward pass, recomputed a query row at a time (FLASH_ATTN_BACK), checked against
numpy float64 and central finite differences of the unfused attention.

Two entry points: the backward pass ``ggml_build_backward_expand`` builds for ``ggml_flash_attn_ext`` (its layout:
v ``[Dv, M, Hkv, B]``, output ``[Dv, H, N, B]``, an F16 mask) and ggmlR's ``ggml_flash_attn_back`` (ggml's older
layout: v transposed, causal flag, scale 1/sqrt(D)). Cases: no mask, causal, padding (with a fully masked query row,
whose output is 0 and passes no gradient), key length != query length, grouped heads, head dims 32-128, Dv != D.

The reference (``attention_grads``) is the textbook backward of softmax attention in float64, itself checked against
finite differences on a small case. Tolerance: ggml computes in float32 (sums of D and M products, a softmax):
|error| <= 2e-5 * max|gradient| + 1e-6, about 100 float32 ulps of the largest value; the errors measured on the
CPU are 1e-7 to 1e-6 of it.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.attention_refs import attention, attention_grads
from tests.helpers.compute import compute, compute_grad
from tests.helpers.devices import require_gpu


def make_mask(kind, n, m, rng):
    if kind is None:
        return None
    mask = np.zeros((n, m))
    if kind in ("causal", "both"):
        mask[np.triu_indices(n, k=m - n + 1, m=m)] = -np.inf
    if kind in ("padding", "both"):
        mask[:, rng.random(m) < 0.3] = -np.inf     # padded keys
        mask[0, :] = -np.inf                       # a query row that sees nothing
    return mask


CASES = {   # B, H, Hkv, N, M, D, Dv, mask
    "small-causal": (2, 4, 2, 5, 7, 8, 6, "causal"),
    "d32-none": (2, 2, 2, 9, 9, 32, 32, None),
    "d64-padding": (1, 4, 2, 6, 11, 64, 48, "padding"),
    "d128-both": (2, 2, 1, 7, 10, 128, 128, "both"),
    "long-keys": (1, 2, 2, 3, 40, 32, 32, "padding"),
    # more query rows than the CPU kernel's block of 32 (patches/0062): a partial last block, a causal span that
    # grows across blocks, keys past the queries
    "blocks-causal": (1, 2, 1, 70, 75, 32, 16, "causal"),
    "blocks-both": (2, 2, 2, 40, 33, 64, 64, "both"),
}


def _inputs(case, seed=0):
    b, h, hkv, n, m, d, dv, kind = CASES[case]
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, h, n, d)).astype(np.float32)
    k = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    v = rng.normal(size=(b, hkv, m, dv)).astype(np.float32)
    r = rng.normal(size=(b, n, h, dv)).astype(np.float32)
    return q, k, v, r, make_mask(kind, n, m, rng), 0.7 / np.sqrt(d)


def _grads_by_ggml(q, k, v, r, mask, scale, backend):
    """ggml's gradients of sum(flash_attn_ext(q, k, v, mask) * r) with respect to q, k and v."""
    n, m = q.shape[2], k.shape[2]
    out = {}
    for which in "qkv":
        rest = [a for name, a in zip("qkv", (q, k, v)) if name != which]
        extra = [] if mask is None else [mask.astype(np.float32)]

        def build(ctx, x, *others, which=which):
            others = list(others)
            mask16 = None if mask is None else G.ggml_cpy(ctx, others.pop(), G.ggml_new_tensor_2d(
                ctx, G.GGML_TYPE_F16, m, n))
            t = {which: x}
            for name in "qkv":
                if name != which:
                    t[name] = others.pop(0)
            return G.ggml_flash_attn_ext(ctx, t["q"], t["k"], t["v"], mask16, scale)
        loss, grad = compute_grad(build, {"q": q, "k": k, "v": v}[which], r, *rest, *extra, backend=backend)
        out[which] = grad
    return loss, out


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * np.abs(want).max() + 1e-6)


def test_the_reference_gradients_match_finite_differences():
    """The float64 reference itself, on the small grouped causal case, against central differences."""
    q, k, v, r, mask, scale = (np.asarray(a, np.float64) if isinstance(a, np.ndarray) else a
                               for a in _inputs("small-causal"))
    want = attention_grads(q, k, v, r.transpose(0, 2, 1, 3), mask, scale)
    for i, x in enumerate((q, k, v)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q.copy(), k.copy(), v.copy()]
            args[i][idx] += 1e-6
            up = np.sum(attention(*args, mask, scale)[0].transpose(0, 2, 1, 3) * r)
            args[i][idx] -= 2e-6
            fd[idx] = (up - np.sum(attention(*args, mask, scale)[0].transpose(0, 2, 1, 3) * r)) / 2e-6
        np.testing.assert_allclose(want[i], fd, rtol=0, atol=1e-7)


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_attention_trains_with_the_unfused_gradients(case, device):
    if device != "cpu":
        require_gpu(device)
    q, k, v, r, mask, scale = _inputs(case)
    backend = G.ggml_backend_cpu_init() if device == "cpu" else G.ggml_backend_init_by_name(device)
    try:
        loss, got = _grads_by_ggml(q, k, v, r, mask, scale, backend)
    finally:
        backend.free()
    out, _ = attention(q, k, v, mask, scale)
    assert loss == pytest.approx(float(np.sum(out.transpose(0, 2, 1, 3) * r)), rel=1e-5, abs=1e-5)
    want = attention_grads(q, k, v, r.transpose(0, 2, 1, 3), mask, scale)
    for name, w in zip("qkv", want):
        _close(got[name].reshape(w.shape), w)


@pytest.mark.parametrize("masked", [True, False])
def test_ggmlr_flash_attn_back_gives_the_three_gradients(masked):
    """ggml's layout: q, d [D, N, H, B] (numpy [B, H, N, D]), k [D, M, Hkv, B], v transposed [M, D, Hkv, B]
    (numpy [B, Hkv, D, M]); computed on a host context."""
    rng = np.random.default_rng(5)
    b, h, hkv, n, m, d = 2, 4, 2, 5, 8, 16
    q = rng.normal(size=(b, h, n, d)).astype(np.float32)
    k = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    v = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    grad_out = rng.normal(size=(b, h, n, d)).astype(np.float32)     # d, in q's layout
    mask = make_mask("causal" if masked else None, n, m, rng)
    want_q, want_k, want_v = attention_grads(q, k, v, grad_out, mask, 1 / np.sqrt(d))
    ctx = G.ggml_init(64 * 1024 * 1024)
    try:
        tensors = []
        for a in (q, k, np.ascontiguousarray(v.transpose(0, 1, 3, 2)), grad_out):
            t = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, *a.shape[::-1])
            G.ggml_set_f32(t, a)
            tensors.append(t)
        qt, kt, vt, dt = tensors
        res = G.ggml_flash_attn_back(ctx, qt, kt, vt, dt, masked=masked)
        graph = G.ggml_new_graph(ctx)
        G.ggml_build_forward_expand(graph, res)
        G.ggml_graph_compute_with_ctx(ctx, graph, 2)
        flat = np.array(G.ggml_tensor_to_numpy(res), np.float64).reshape(-1)
        offs = G.ggml_flash_attn_back_offsets(qt, kt, vt)
        got_q = flat[offs[0] // 4:offs[0] // 4 + q.size].reshape(q.shape)
        got_k = flat[offs[1] // 4:offs[1] // 4 + k.size].reshape(k.shape)
        got_vt = flat[offs[2] // 4:offs[2] // 4 + v.size].reshape(b, hkv, d, m)
    finally:
        ctx.free()
    _close(got_q, want_q)
    _close(got_k, want_k)
    _close(got_vt.transpose(0, 1, 3, 2), want_v)


def test_ggml_flash_attn_back_checks_its_operands():
    ctx = G.ggml_init(16 * 1024 * 1024)
    try:
        q = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 4, 2, 1)
        k = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 6, 2, 1)
        vt = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 6, 8, 2, 1)
        d = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 4, 2, 1)
        with pytest.raises(G.GgmlValueError, match=r"v must be the transposed values \[M, D, Hkv, B\]"):
            G.ggml_flash_attn_back(ctx, q, k, k, d)
        with pytest.raises(G.GgmlValueError, match="must have q's shape"):
            G.ggml_flash_attn_back(ctx, q, k, vt, k)
        with pytest.raises(G.GgmlValueError, match="at least as many keys as queries"):
            G.ggml_flash_attn_back(ctx, k, q, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 4, 8, 2, 1),
                                   G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 6, 2, 1))
        with pytest.raises(G.GgmlTypeError, match="F16|f16"):
            G.ggml_flash_attn_back(ctx, q, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F16, 8, 6, 2, 1), vt, d)
        with pytest.raises(G.GgmlTypeError, match="masked must be True or False"):
            G.ggml_flash_attn_back(ctx, q, k, vt, d, masked="yes")
        assert G.ggml_flash_attn_back(ctx, q, k, vt, d).shape[0] * 4 == G.ggml_flash_attn_back_offsets(q, k, vt)[4]
    finally:
        ctx.free()


def test_a_trained_mask_or_alibi_is_refused_before_ggml_aborts():
    """The backward pass gives the mask no gradient and takes no ALiBi: ggmlpy says so instead of ggml aborting."""
    ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
    try:
        q = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 4, 2, 1))
        k = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 8, 6, 2, 1)
        m32 = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 4))
        m16 = G.ggml_cpy(ctx, m32, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 6, 4))
        for kwargs, message in (({}, "its mask .* is \\(or is computed from\\) a trainable parameter"),
                                ({"max_bias": 8.0}, "max_bias=0 and logit_softcap=0, got 8 and 0")):
            y = G.ggml_flash_attn_ext(ctx, q, k, k, m16, 0.3, **kwargs)
            loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, y)))
            graph = G.ggml_new_graph_custom(ctx, 256, True)
            G.ggml_build_forward_expand(graph, loss)
            with pytest.raises(G.GgmlValueError, match=message):
                G.ggml_build_backward_expand(ctx, graph)
    finally:
        ctx.free()


@pytest.mark.parametrize("device", ["cpu", "Vulkan0", "CUDA0"])
@pytest.mark.parametrize("pad_keys, pad_queries", [(1, 0), (9, 3), (0, 2)])
def test_a_mask_wider_or_taller_than_the_scores_is_read_right(device, pad_keys, pad_queries):
    """ggml_flash_attn_ext takes a mask [>= n_kv, >= n_q]; Vulkan's shaders read its rows with a stride of n_kv, so
    a wider mask gave wrong outputs (errors of 1.0): patches/0057 has Vulkan refuse it and the CPU computes it."""
    if device != "cpu":
        require_gpu(device)
    rng = np.random.default_rng(7)
    b, h, n, m, d = 1, 2, 5, 7, 8
    q, k, v = (rng.normal(size=(b, h, rows, d)).astype(np.float32) for rows in (n, m, m))
    mask = rng.normal(size=(n + pad_queries, m + pad_keys)).astype(np.float16).astype(np.float32)

    def build(ctx, tq, tk, tv, tm):
        m16 = G.ggml_cpy(ctx, tm, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, m + pad_keys, n + pad_queries))
        return G.ggml_flash_attn_ext(ctx, tq, tk, tv, m16, 0.4)
    backend = G.ggml_backend_cpu_init() if device == "cpu" else G.ggml_backend_init_by_name(device)
    try:
        (got,) = compute(build, q, k, v, mask, backend=backend)
    finally:
        backend.free()
    want, _ = attention(q, k, v, mask[:n, :m], 0.4)
    np.testing.assert_allclose(np.asarray(got).reshape(b, n, h, d), want.transpose(0, 2, 1, 3), rtol=0, atol=2e-6)


def test_a_backward_pass_whose_cpu_scratch_exceeds_the_machine_is_refused():
    """The CPU kernel holds O(M (D + Dv)) floats per thread: over tens of millions of keys that is beyond the
    machine, and ggml's CPU backend aborted the process (std::bad_alloc) allocating it mid-compute. Both entry
    points refuse first, from the shapes (no_alloc tensors: nothing is allocated here)."""
    from ggmlpy.core.sysmem import physical_memory
    from ggmlpy.graph.backward import flash_attn_back_scratch_bytes
    m = 1 << 26
    assert flash_attn_back_scratch_bytes(64, 64, m, 1) > physical_memory() or pytest.skip("a machine this large")
    ctx = G.ggml_init(16 * 1024 * 1024, no_alloc=True)
    try:
        q = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 64, 1, 1, 1))
        k = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 64, m, 1, 1)
        loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_flash_attn_ext(ctx, q, k, k, None, 0.1)))
        graph = G.ggml_new_graph_custom(ctx, 256, True)
        G.ggml_build_forward_expand(graph, loss)
        with pytest.raises(G.GgmlValueError, match="GiB of work memory on the CPU .* shorter sequences"):
            G.ggml_build_backward_expand(ctx, graph)
        vt = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, m, 64, 1, 1)
        with pytest.raises(G.GgmlValueError, match="ggml_flash_attn_back: .* GiB of work memory"):
            G.ggml_flash_attn_back(ctx, q, k, vt, q, masked=False)
    finally:
        ctx.free()
