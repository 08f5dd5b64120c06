"""patches/0058's CUDA kernels for FLASH_ATTN_BACK (ggml-cuda/flash-attn-back.cu), run on the host: the kernels'
source compiled as C++ (a thread per row needs no barrier or shared memory: the grid is walked thread by thread),
against ggml's CPU kernel of patches/0056 on the same operands, for both of the op's layouts (the backward pass of
``ggml_flash_attn_ext`` with an F16 mask, and ggml's older ``ggml_flash_attn_back`` with its causal flag), grouped
heads, key length != query length and a fully masked query row. This checks the kernels' arithmetic and indexing
on a machine without a GPU; ``test_flash_attn_back.py`` runs the op on CUDA0 where one is present (the CUDA
compiler's code, the launches themselves).

Tolerance (rtol 1e-5, atol 2e-6 of values of order 1): the same sums in another order, and the softmax normalised
through a log-sum-exp where the CPU divides by the sum.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.ops.attention import flash_attn_ext_back
from tests.helpers import ROOT
from tests.helpers.compute import compute
from tests.helpers.cuda_host import host_library


SOURCE = ROOT / "vendor" / "ggml" / "src" / "ggml-cuda" / "flash-attn-back.cu"

SHIM = """
#include <math.h>
#include <cstdint>
#include <cstring>
struct dim3 { unsigned x, y, z; };
static dim3 blockIdx, threadIdx, blockDim;
#define __global__
#define __device__
struct half { uint16_t bits; };
static float __half2float(half h) {   // IEEE 754 binary16 -> binary32
    const uint32_t sign = (uint32_t) (h.bits >> 15) << 31, exp = (h.bits >> 10) & 31, man = h.bits & 1023;
    float f;
    if (exp == 31) {
        uint32_t u = sign | 0x7f800000u | (man << 13);
        memcpy(&f, &u, 4);
    } else if (exp == 0) {
        f = ldexpf((float) man, -24);
        if (sign) f = -f;
    } else {
        uint32_t u = sign | ((exp + 112) << 23) | (man << 13);
        memcpy(&f, &u, 4);
    }
    return f;
}
"""

LAUNCHER = """
template <typename F> static void emu_grid(int64_t threads, F body) {
    blockDim = {128, 1, 1};
    for (int64_t t = 0; t < threads; ++t) {
        blockIdx = {(unsigned) (t / 128), 0, 0};
        threadIdx = {(unsigned) (t % 128), 0, 0};
        body();
    }
}
extern "C" void emu_flash_attn_back(const float * q, const float * k, const float * v, const float * d,
                                    const uint16_t * mask, float * out, const int64_t * a, float scale, int causal,
                                    int64_t off_k, int64_t off_v, int64_t off_stats) {
    fab_params p;
    int64_t * f = &p.D;   // the struct's int64 fields, in order
    for (int i = 0; i < 31; ++i) f[i] = a[i];
    p.scale = scale;
    p.causal = causal;
    const half * m = (const half *) mask;
    emu_grid(p.N*p.H*p.B, [&] { flash_attn_back_rows_f32(q, k, v, d, m, out, out + off_stats, p); });
    emu_grid(p.M*p.Hkv*p.B, [&] {
        flash_attn_back_keys_f32(q, k, v, d, m, out + off_k, out + off_v, out + off_stats, p);
    });
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    dll = host_library(tmp_path_factory.mktemp("cuda_emu"), SOURCE, "struct fab_params", "// the end of the kernels",
                       SHIM, LAUNCHER)
    dll.emu_flash_attn_back.restype = None
    dll.emu_flash_attn_back.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_void_p, ctypes.c_float, ctypes.c_int,
                                                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    return dll


def _p(a):
    return None if a is None else a.ctypes.data_as(ctypes.c_void_p)


def _offsets(q, k, v):
    """ggml_flash_attn_back_offsets in floats, for numpy operands of ggml shapes reversed."""
    ctx = G.ggml_init(1 << 16, no_alloc=True)
    try:
        ts = [G.ggml_new_tensor(ctx, G.GGML_TYPE_F32, a.ndim, a.shape[::-1]) for a in (q, k, v)]
        return [o // 4 for o in G.ggml_flash_attn_back_offsets(*ts)]
    finally:
        ctx.free()


def _strides(a):
    """Element strides of a C-contiguous numpy array in ggml's order (ne0 first), padded to 4."""
    s = [st // a.itemsize for st in a.strides[::-1]]
    return s + [int(np.prod(a.shape))] * (4 - len(s))


@pytest.mark.parametrize("layout", ["ext", "legacy"])
@pytest.mark.parametrize("b, h, hkv, n, m, dim, dv, masked", [
    (2, 4, 2, 5, 7, 8, 6, True), (1, 2, 2, 9, 9, 32, 32, False), (2, 2, 1, 6, 11, 16, 16, True)])
def test_cuda_kernels_match_the_cpu_op(emu, layout, b, h, hkv, n, m, dim, dv, masked):
    rng = np.random.default_rng(n * m + dim)
    if layout == "legacy":
        dv = dim
    q = rng.normal(size=(b, h, n, dim)).astype(np.float32)          # ggml [D, N, H, B]
    k = rng.normal(size=(b, hkv, m, dim)).astype(np.float32)        # ggml [D, M, Hkv, B]
    scale = 0.3 if layout == "ext" else 1 / np.sqrt(dim)
    mask = None
    if layout == "ext":
        v = rng.normal(size=(b, hkv, m, dv)).astype(np.float32)     # ggml [Dv, M, Hkv, B]
        d = rng.normal(size=(b, n, h, dv)).astype(np.float32)       # ggml [Dv, H, N, B]
        if masked:
            mask = np.zeros((n, m), np.float32)
            mask[:, rng.random(m) < 0.3] = -np.inf
            mask[np.triu_indices(n, k=m - n + 1, m=m)] = -np.inf
            mask[1, :] = -np.inf                                      # a query row that sees nothing

        def build(ctx, tq, tk, tv, td, *tm):
            m16 = G.ggml_cpy(ctx, tm[0], G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, m, n)) if tm else None
            return flash_attn_ext_back(ctx, tq, tk, tv, m16, td, scale)
        arrays = (q, k, v, d) + ((mask,) if mask is not None else ())
        causal = 0
    else:
        v = rng.normal(size=(b, hkv, dim, m)).astype(np.float32)    # ggml [M, D, Hkv, B]: transposed
        d = rng.normal(size=(b, h, n, dim)).astype(np.float32)      # ggml [D, N, H, B]

        def build(ctx, tq, tk, tv, td):
            return G.ggml_flash_attn_back(ctx, tq, tk, tv, td, masked=masked)
        arrays = (q, k, v, d)
        causal = int(masked)
    (cpu,) = compute(build, *arrays)
    cpu = cpu.reshape(-1)
    offs = _offsets(q, k, v)
    out = np.full(offs[4], np.nan, np.float32)
    vs, ds = _strides(v), _strides(d)
    if layout == "ext":   # (dim, row, head, batch) strides of v [Dv, M, Hkv, B] and d [Dv, H, N, B]
        v_str, d_str, gv = [vs[0], vs[1], vs[2], vs[3]], [ds[0], ds[2], ds[1], ds[3]], [1, dv]
    else:                 # v [M, D, Hkv, B] transposed, d [D, N, H, B]
        v_str, d_str, gv = [vs[1], vs[0], vs[2], vs[3]], ds, [m, 1]
    m16 = None if mask is None else np.ascontiguousarray(mask.astype(np.float16)).view(np.uint16)
    args = np.array([dim, dv, n, m, h, hkv, b, m - n, *_strides(q), *_strides(k), *v_str, *d_str,
                     m if mask is not None else 0, 0, 0, 1, 1, *gv], np.int64)
    emu.emu_flash_attn_back(_p(q), _p(k), _p(v), _p(d), _p(m16), _p(out), _p(args), scale, causal,
                            offs[1], offs[2], offs[3])
    for lo, hi, what in ((offs[0], offs[0] + q.size, "grad_q"), (offs[1], offs[1] + k.size, "grad_k"),
                         (offs[2], offs[2] + v.size, "grad_v")):
        np.testing.assert_allclose(out[lo:hi], cpu[lo:hi], rtol=1e-5, atol=2e-6, err_msg=what)
