"""patches/0057: GGML_OP_FLASH_ATTN_BACK on Vulkan (two passes: a workgroup per query row for dq and the softmax's
log-sum-exp, then a workgroup per key row for dk and dv), against ggml's CPU kernel (patches/0056: the same graph
computed on a CPU backend) and against a float64 numpy reference of attention's gradients.

Cases: no mask, causal (a mask for ggml_flash_attn_ext, the causal flag for ggml_flash_attn_back), padding (keys
hidden from some rows, and a query row that sees no key: dq 0, nothing from it into dk, dv), a mask per head and
batch with padded rows and columns, key length != query length, grouped heads (H = 4, Hkv = 2), head dims 32, 64,
128, Dv != D, batch 2, more than 64 keys and query rows (several chunks of a workgroup), operands that start 4
bytes off the storage-buffer alignment. Both entry points: the node itself (ggml_flash_attn_ext_back, layout 1;
ggml_flash_attn_back, layout 0) and the backward pass ggml_build_backward_expand builds for ggml_flash_attn_ext.
Each Vulkan run checks that FLASH_ATTN_BACK ran on Vulkan0, not on the CPU.

Tolerance: |error| <= 1e-5 * max|reference| + 1e-7 against both references. Both kernels compute in float32 with
sums of D and Dv products, a softmax and sums of up to H/Hkv * N terms, in different orders (the CPU's softmax
subtracts the row maximum and divides by the sum, Vulkan's subtracts the log-sum-exp): each result is a few
float32 roundings (6e-8 relative) of terms bounded by the largest gradient times a small factor; the measured
errors are 1e-7 to 1e-6 of the largest gradient. A query row that sees no key gets exactly 0.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import ffi, lib
from ggmlpy.ops.base import make_op
from tests.helpers.attention_refs import attention_grads
from tests.helpers.compute import compute, compute_grad
from tests.helpers.devices import is_lavapipe, require_gpu


# ---------------------------------------------------------------- the float64 reference

def test_the_reference_agrees_with_finite_differences():
    """The reference on a small grouped case with a padding mask and a fully masked row, against central
    differences of the forward attention in float64."""
    rng = np.random.default_rng(11)
    b, h, hkv, n, m, d, dv = 1, 2, 1, 3, 4, 3, 2
    q, k, v = rng.normal(size=(b, h, n, d)), rng.normal(size=(b, hkv, m, d)), rng.normal(size=(b, hkv, m, dv))
    do = rng.normal(size=(b, h, n, dv))
    mask = np.zeros((1, 1, n, m))
    mask[..., 1, 2] = -np.inf
    mask[..., 2, :] = -np.inf

    def loss(q, k, v):
        s = 0.8 * q @ np.repeat(k, h // hkv, axis=1).swapaxes(-1, -2) + mask
        top = np.max(s, axis=-1, keepdims=True)
        e = np.where(np.isfinite(top), np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
        p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
        return np.sum(p @ np.repeat(v, h // hkv, axis=1) * do)

    want = attention_grads(q, k, v, do, mask, 0.8)
    args = [q, k, v]
    for i, w in enumerate(want):
        fd = np.zeros_like(args[i])
        for idx in np.ndindex(fd.shape):
            up = [a.copy() for a in args]
            dn = [a.copy() for a in args]
            up[i][idx] += 1e-6
            dn[i][idx] -= 1e-6
            fd[idx] = (loss(*up) - loss(*dn)) / 2e-6
        np.testing.assert_allclose(w, fd, rtol=0, atol=1e-7)
    assert not want[0][0, :, 2].any()   # the row that sees no key


# ---------------------------------------------------------------- cases

CASES = {   # B, H, Hkv, N, M, D, Dv, mask kind
    "none-d32": (2, 4, 2, 8, 8, 32, 32, None),
    "causal-d64": (2, 4, 2, 9, 13, 64, 64, "causal"),
    "padding-d128-dv96": (2, 4, 2, 7, 11, 128, 96, "padding"),
    "causal-padding-d32-dv64": (2, 4, 2, 6, 6, 32, 64, "both"),
    "per-head-mask-d64": (2, 4, 2, 5, 9, 64, 32, "per-head"),
    "long-d32": (2, 4, 2, 70, 90, 32, 32, "both"),
}


def make_mask(kind, b, h, n, m, rng):
    """An additive mask [B or 1, H or 1, N, M] (0 or -inf) of ``kind``, or None."""
    if kind is None:
        return None
    mask = np.zeros((b, h, n, m) if kind == "per-head" else (1, 1, n, m), np.float32)
    if kind in ("causal", "both"):
        mask[..., np.triu(np.ones((n, m), bool), k=m - n + 1)] = -np.inf   # key j hidden when j > i + M - N
    if kind in ("padding", "both", "per-head"):
        mask[..., rng.random(m) < 0.3] = -np.inf
        mask[..., 1, :] = -np.inf   # a query row that sees no key
    if kind == "per-head":
        mask[rng.random(mask.shape) < 0.2] = -np.inf
    return mask


def inputs(case, seed=0):
    b, h, hkv, n, m, d, dv, kind = CASES[case]
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(b, h, n, d)).astype(np.float32)
    k = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    v = rng.normal(size=(b, hkv, m, dv)).astype(np.float32)
    do = rng.normal(size=(b, h, n, dv)).astype(np.float32)
    return q, k, v, do, make_mask(kind, b, h, n, m, rng), 0.9 / np.sqrt(d)


# ---------------------------------------------------------------- ggml

def _cpu():
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 2)
    return backend


def _backends(device):
    """The scheduler's backends: the CPU alone, or Vulkan0 first and the CPU for what it refuses (the placement
    says which ran FLASH_ATTN_BACK)."""
    if device == "cpu":
        return [_cpu()]
    require_gpu(device)
    return [G.ggml_backend_init_by_name(device), _cpu()]


def _offsets(q, k, v):
    offs = ffi.new("size_t[5]")
    lib.ggml_flash_attn_back_offsets(q.ptr, k.ptr, v.ptr, offs)
    return [int(o) for o in offs]


def _f16_mask(ctx, m32):
    return G.ggml_cpy(ctx, m32, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F16, *m32.shape))


def _misaligned(ctx, flat, shape):
    """A view of ``shape`` (ggml order) into ``flat`` starting one float in: 4 bytes off any binding alignment."""
    return G.ggml_view_4d(ctx, flat, *shape, 4 * shape[0], 4 * shape[0] * shape[1],
                          4 * shape[0] * shape[1] * shape[2], 4)


def _grads_of_the_node(layout, q, k, v, do, mask, scale, device, misaligned=False):
    """grad_q, grad_k, grad_v of one FLASH_ATTN_BACK node computed on ``device`` (numpy shapes of q, k, v), and the
    placement. layout 1: ggml_flash_attn_ext_back (v [Dv, M, Hkv, B], d [Dv, H, N, B], the mask as ggml's flash
    attention takes it); layout 0: ggml_flash_attn_back (v transposed [M, D, Hkv, B], d [D, N, H, B], causal
    flag for a causal mask, scale 1/sqrt(D))."""
    b, h, n, d = q.shape
    hkv, m, dv = k.shape[1], k.shape[2], v.shape[3]
    if layout == 1:
        arrays = [q, k, v, np.ascontiguousarray(do.transpose(0, 2, 1, 3))]
        if mask is not None:   # padded by 3 columns and 2 rows as ggml's flash attention allows
            arrays.append(np.pad(mask, ((0, 0), (0, 0), (0, 2), (0, 3)), constant_values=-np.inf))
    else:
        arrays = [q, k, np.ascontiguousarray(v.transpose(0, 1, 3, 2)), do]
    if misaligned:
        arrays = [np.concatenate([[7.0], a.ravel()]).astype(np.float32) if i < 4 else a
                  for i, a in enumerate(arrays)]
    shapes = [(d, n, h, b), (d, m, hkv, b), (dv, m, hkv, b) if layout == 1 else (m, d, hkv, b),
              (dv, h, n, b) if layout == 1 else (d, n, h, b)]
    holder = {}

    def build(ctx, *ts):
        ts = list(ts)
        if misaligned:
            ts[:4] = [_misaligned(ctx, t, s) for t, s in zip(ts[:4], shapes)]
        qt, kt, vt, dt = ts[:4]
        holder["offs"] = _offsets(qt, kt, vt)
        size = holder["offs"][4] // 4
        if layout == 1:
            mt = _f16_mask(ctx, ts[4]) if mask is not None else None
            return make_op("ggml_flash_attn_ext_back", ctx, lib.ggml_flash_attn_ext_back, (qt, kt, vt, mt, dt),
                           (size,), (float(scale),))
        return make_op("ggml_flash_attn_back", ctx, lib.ggml_flash_attn_back, (qt, kt, vt, dt), (size,),
                       (mask is not None,))

    backends = _backends(device)
    placed: list = []
    try:
        (flat,) = compute(build, *arrays, backend=backends, placements=placed)
    finally:
        for backend in backends:
            backend.free()
    flat, offs = flat.reshape(-1), holder["offs"]
    gq = flat[offs[0] // 4:][:q.size].reshape(q.shape)
    gk = flat[offs[1] // 4:][:k.size].reshape(k.shape)
    gv = flat[offs[2] // 4:][:v.size]
    gv = gv.reshape(v.shape) if layout == 1 else gv.reshape(b, hkv, dv, m).transpose(0, 1, 3, 2)
    return (gq, gk, gv), placed[0]


def _ran_on_vulkan(placement):
    assert placement.op_counts("Vulkan0")["FLASH_ATTN_BACK"] >= 1, placement
    assert "FLASH_ATTN_BACK" not in placement.cpu_ops, placement


def _close(got, want, what):
    """Checks the tolerance; returns the largest error relative to max|want|, for the report."""
    bound = 1e-5 * np.abs(want).max() + 1e-7
    err = np.abs(got - want).max()
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"
    return err / np.abs(want).max()


ERRORS: dict = {}   # (entry, case, against) -> the largest relative error of dq, dk, dv, for the report below


def _check(key, got, want_np, want_cpu=None):
    errs = []
    for name, g, w in zip(("dq", "dk", "dv"), got, want_np):
        errs.append(_close(g, w, f"{key} {name} vs numpy"))
    ERRORS[(*key, "numpy")] = errs
    if want_cpu is not None:
        ERRORS[(*key, "cpu")] = [_close(g, w, f"{key} {name} vs the CPU")
                                 for name, g, w in zip(("dq", "dk", "dv"), got, want_cpu)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_flash_attn_ext_back_on_vulkan(case):
    """Layout 1 (ggml_flash_attn_ext_back): Vulkan0 against the CPU kernel and numpy."""
    q, k, v, do, mask, scale = inputs(case)
    got, placed = _grads_of_the_node(1, q, k, v, do, mask, scale, "Vulkan0")
    _ran_on_vulkan(placed)
    on_cpu, _ = _grads_of_the_node(1, q, k, v, do, mask, scale, "cpu")
    want = attention_grads(q, k, v, do, mask, scale)
    _check(("ext_back", case), got, want, on_cpu)
    if CASES[case][7] in ("padding", "both", "per-head"):   # query row 1 sees no key: dq exactly 0
        assert not got[0][:, :, 1].any()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 7, 12, 64), (2, 4, 2, 66, 80, 32), (1, 2, 2, 5, 5, 128)])
def test_ggml_flash_attn_back_on_vulkan(shape, causal):
    """Layout 0 (ggml_flash_attn_back: v transposed, the causal flag, scale 1/sqrt(D))."""
    b, h, hkv, n, m, d = shape
    rng = np.random.default_rng(n * m + causal)
    q = rng.normal(size=(b, h, n, d)).astype(np.float32)
    k = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    v = rng.normal(size=(b, hkv, m, d)).astype(np.float32)
    do = rng.normal(size=(b, h, n, d)).astype(np.float32)
    mask = make_mask("causal", b, h, n, m, rng) if causal else None
    got, placed = _grads_of_the_node(0, q, k, v, do, mask, 1 / np.sqrt(d), "Vulkan0")
    _ran_on_vulkan(placed)
    on_cpu, _ = _grads_of_the_node(0, q, k, v, do, mask, 1 / np.sqrt(d), "cpu")
    _check(("back", f"{shape}-{'causal' if causal else 'none'}"), got,
           attention_grads(q, k, v, do, mask, 1 / np.sqrt(d)), on_cpu)


@pytest.mark.parametrize("layout", [0, 1])
def test_misaligned_operands_on_vulkan(layout):
    """q, k, v and d as views 4 bytes into their buffers: the push constants carry the offsets."""
    q, k, v, do, mask, scale = inputs("causal-d64")
    if layout == 0:
        v, scale = v[..., :q.shape[3]], 1 / np.sqrt(q.shape[3])
    got, placed = _grads_of_the_node(layout, q, k, v, do, mask, scale, "Vulkan0", misaligned=True)
    _ran_on_vulkan(placed)
    _check((f"misaligned-{layout}", "causal-d64"), got, attention_grads(q, k, v, do, mask, scale))


@pytest.mark.parametrize("case", ["causal-d64", "padding-d128-dv96", "per-head-mask-d64"])
def test_the_backward_of_flash_attn_ext_runs_on_vulkan(case):
    """The backward pass ggml_build_backward_expand builds for ggml_flash_attn_ext, computed on Vulkan0: the
    gradient of sum(out * r) for q, k and v in turn."""
    q, k, v, do, mask, scale = inputs(case)
    r = np.ascontiguousarray(do.transpose(0, 2, 1, 3))   # out is [Dv, H, N, B]: numpy [B, N, H, Dv]
    want = attention_grads(q, k, v, do, mask, scale)
    backends = _backends("Vulkan0")
    try:
        for i, which in enumerate("qkv"):
            others = [a for name, a in zip("qkv", (q, k, v)) if name != which]
            extra = [] if mask is None else [mask]

            def build(ctx, x, *rest, which=which):
                rest = list(rest)
                m16 = _f16_mask(ctx, rest.pop()) if mask is not None else None
                t = dict(zip([n for n in "qkv" if n != which], rest), **{which: x})
                return G.ggml_flash_attn_ext(ctx, t["q"], t["k"], t["v"], m16, scale)
            placed: list = []
            _, grad = compute_grad(build, {"q": q, "k": k, "v": v}[which], r, *others, *extra, backend=backends,
                                   placements=placed)
            _ran_on_vulkan(placed[0])
            ERRORS[("autodiff", case, which, "numpy")] = [_close(grad.reshape(want[i].shape), want[i], which)]
    finally:
        for backend in backends:
            backend.free()


@pytest.mark.parametrize("m, on_vulkan", [(5440, True), (8192, False)])
def test_lavapipes_loop_budget_on_vulkan(m, on_vulkan):
    """On lavapipe a shader may loop 60000 times per invocation (patches/0046): 5440 keys of D = 128 is about
    55,000 iterations in pass 1 and runs on Vulkan0, right; 8192 keys is past the budget and the CPU computes it."""
    require_gpu("Vulkan0")
    if not is_lavapipe("Vulkan0"):
        pytest.skip("the loop budget is lavapipe's")
    rng = np.random.default_rng(m)
    q = rng.normal(size=(1, 2, 3, 128)).astype(np.float32)
    k = rng.normal(size=(1, 1, m, 128)).astype(np.float32)
    v = rng.normal(size=(1, 1, m, 128)).astype(np.float32)
    do = rng.normal(size=(1, 2, 3, 128)).astype(np.float32)
    got, placed = _grads_of_the_node(1, q, k, v, do, None, 0.3, "Vulkan0")
    if on_vulkan:
        _ran_on_vulkan(placed)
    else:
        assert "FLASH_ATTN_BACK" in placed.cpu_ops, placed
    _check(("budget", f"M={m}"), got, attention_grads(q, k, v, do, None, 0.3))


def test_report_errors():
    """Prints the largest errors measured above (pytest -s shows them)."""
    for key, errs in sorted(ERRORS.items(), key=str):
        print(" ".join(map(str, key)), " ".join(f"{e:.2e}" for e in errs))
