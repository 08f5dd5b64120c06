"""patches/0053's CUDA kernels for the whole LSTM and GRU recurrences (ggml-cuda/recurrence.cu), run on the host:
the kernels' source compiled as C++20, each CUDA block emulated by 256 threads meeting at a ``std::barrier`` where
the kernel calls ``__syncthreads()``, its shared memory a host array. This checks the port's arithmetic, indexing
and synchronisation against ggml's CPU ops (forward planes, and the backward ops fed the CPU's forward result) on
a machine without a GPU; ``test_gpu_recurrences.py`` runs the same kernels on CUDA0 where one is present (the
CUDA compiler's code, -use_fast_math's expf, the launch itself).

Tolerance as the Vulkan kernels' against the CPU (rtol 1e-5, atol 3e-6): products of n terms summed in another
order, and sigmoid / tanh as 1 / (1 + exp(-v)) and 1 - 2 / (exp(2v) + 1) where the CPU uses its own kernels.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import lib
from ggmlpy.graph.objects import Tensor
from tests.helpers import ROOT
from tests.helpers.compute import compute
from tests.helpers.cuda_host import host_library
from tests.ops.test_recurrent import gru_case, seq_case


SOURCE = ROOT / "vendor" / "ggml" / "src" / "ggml-cuda" / "recurrence.cu"

SHIM = """
#include <barrier>
#include <math.h>
#include <cstdint>
#include <thread>
#include <vector>
struct dim3 { unsigned x, y, z; };
static thread_local dim3 blockIdx, threadIdx;
static dim3 blockDim;
static thread_local std::barrier<> * emu_barrier;
static thread_local float * emu_smem;
#define __global__
#define __device__
#define __forceinline__ inline
#define __syncthreads() emu_barrier->arrive_and_wait()
#define GGMLPY_CUDA_RECURRENCE_MAX_UNITS 512
"""

LAUNCHERS = """
template <typename F> static void emu_launch(int blocks, int smem_floats, F body) {
    blockDim = {RECURRENCE_BLOCK, 1, 1};
    for (int b = 0; b < blocks; b++) {
        std::vector<float> smem(smem_floats);
        std::barrier<> bar(RECURRENCE_BLOCK);
        std::vector<std::thread> threads;
        for (int t = 0; t < RECURRENCE_BLOCK; t++) {
            threads.emplace_back([&, b, t] {
                blockIdx = {(unsigned) b, 0, 0}; threadIdx = {(unsigned) t, 0, 0};
                emu_barrier = &bar; emu_smem = smem.data();
                body();
            });
        }
        for (auto & th : threads) th.join();
    }
}
extern "C" void emu_lstm_seq(const float * x, const float * u, const float * h0, const float * c0, float * dst,
                             int n, int N, int T, int reverse) {
    emu_launch(N, 6 * n, [&] { lstm_seq_f32(x, u, h0, c0, dst, n, N, T, reverse); });
}
extern "C" void emu_lstm_seq_back(const float * u, const float * c0, const float * seq, const float * grad,
                                  float * dst, int n, int N, int T, int reverse, int has_h0) {
    emu_launch(N, 6 * n, [&] { lstm_seq_back_f32(u, c0, seq, grad, dst, n, N, T, reverse, has_h0); });
}
extern "C" void emu_gru_seq(const float * x, const float * u, const float * b, const float * h0, float * dst,
                            int n, int N, int T, int reverse) {
    emu_launch(N, 4 * n, [&] { gru_seq_f32(x, u, b, h0, dst, n, N, T, reverse); });
}
extern "C" void emu_gru_seq_back(const float * u, const float * h0, const float * seq, const float * grad,
                                 float * dst, int n, int N, int T, int reverse) {
    emu_launch(N, 4 * n, [&] { gru_seq_back_f32(u, h0, seq, grad, dst, n, N, T, reverse); });
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    def shared_memory(kernels: str) -> str:
        assert kernels.count("extern __shared__ float smem[];") == 4
        return kernels.replace("extern __shared__ float smem[];", "float * smem = emu_smem;")
    dll = host_library(tmp_path_factory.mktemp("cuda_emu"), SOURCE, "#define RECURRENCE_BLOCK",
                       "// the forward node of op", SHIM, LAUNCHERS, edit=shared_memory, std="c++20")
    for name in ("emu_lstm_seq", "emu_lstm_seq_back", "emu_gru_seq", "emu_gru_seq_back"):
        getattr(dll, name).restype = None
    return dll


def _p(a: np.ndarray | None):
    return None if a is None else np.ascontiguousarray(a, np.float32).ctypes.data_as(ctypes.c_void_p)


def _back(fn, back):
    """A builder of the forward op ``fn`` and its backward ``back`` (ggml's CPU kernels), the gradient the last
    operand."""
    def build(ctx, x, u, *rest):
        *operands, grad = rest
        seq = fn(ctx, x, u, *operands)
        return seq, Tensor(back(ctx.ptr, seq.ptr, grad.ptr), ctx, sources=(seq, grad))
    return build


CASES = [(1, 1, 1), (5, 3, 4), (67, 2, 3), (300, 2, 2), (3, 1, 5)]


@pytest.mark.parametrize("units, batch, steps", CASES)
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_lstm_kernels_match_the_cpu_ops(units, batch, steps, with_state, reverse, emu):
    x, u, h0, c0 = seq_case(units, batch, steps, units * 7 + batch + steps)
    grad = np.random.default_rng(units).normal(size=(6, steps, batch, units)).astype(np.float32)
    states = (h0, c0) if with_state else ()
    seq, back = compute(_back(lambda ctx, x, u, *s: G.ggml_lstm_seq(ctx, x, u, *s, reverse=reverse),
                              lib.ggml_lstm_seq_back), x, u, *states, grad)
    out = np.zeros(seq.shape, np.float32)
    emu.emu_lstm_seq(_p(x), _p(u), _p(h0 if with_state else None), _p(c0 if with_state else None), _p(out),
                     units, batch, steps, int(reverse))
    np.testing.assert_allclose(out, seq, rtol=1e-5, atol=3e-6)
    dout = np.zeros(back.shape, np.float32)
    seq32 = np.ascontiguousarray(seq, np.float32)
    emu.emu_lstm_seq_back(_p(u), _p(c0 if with_state else None), _p(seq32), _p(grad), _p(dout), units, batch, steps,
                          int(reverse), int(with_state))
    np.testing.assert_allclose(dout, back, rtol=1e-5, atol=3e-6)


@pytest.mark.parametrize("units, batch, steps", CASES)
@pytest.mark.parametrize("with_b, with_h0", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_kernels_match_the_cpu_ops(units, batch, steps, with_b, with_h0, reverse, emu):
    x, u, b, h0 = gru_case(units, batch, steps, units * 7 + batch + steps)
    grad = np.random.default_rng(units).normal(size=(5, steps, batch, units)).astype(np.float32)
    extra = ([b] if with_b else []) + ([h0] if with_h0 else [])

    def fwd(ctx, x, u, *rest):
        rest = list(rest)
        return G.ggml_gru_seq(ctx, x, u, rest.pop(0) if with_b else None, rest.pop(0) if with_h0 else None,
                              reverse=reverse)
    seq, back = compute(_back(fwd, lib.ggml_gru_seq_back), x, u, *extra, grad)
    out = np.zeros(seq.shape, np.float32)
    emu.emu_gru_seq(_p(x), _p(u), _p(b if with_b else None), _p(h0 if with_h0 else None), _p(out), units, batch,
                    steps, int(reverse))
    np.testing.assert_allclose(out, seq, rtol=1e-5, atol=3e-6)
    dout = np.zeros(back.shape, np.float32)
    seq32 = np.ascontiguousarray(seq, np.float32)
    emu.emu_gru_seq_back(_p(u), _p(h0 if with_h0 else None), _p(seq32), _p(grad), _p(dout), units, batch, steps,
                         int(reverse))
    np.testing.assert_allclose(dout, back, rtol=1e-5, atol=3e-6)
