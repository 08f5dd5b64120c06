"""patches/0062: the CPU's F32 products on packed panels (``ggmlpy_sgemm_f32``), for ``ggml_mul_mat`` and
``ggml_out_prod``.

The kernel computes F32 ``ggml_mul_mat`` (through llamafile_sgemm, which took tinyBLAS before) and every F32
``ggml_out_prod`` (ggml's backward of a product: the weights' gradient, and the data's with the gradient transposed)
on CPUs with AVX-512. Its reference is numpy float64 of the same operands; the only error left is F32 accumulation
(sums of k terms in the kernel's order), bounded by 1e-5 relative to the sums of the terms' absolute values. The
shapes cross every edge the kernel pads or splits: rows past a 16- or 32-row panel, columns past a 12-column block,
sums not a multiple of 16 (the 16 x 16 transposes of the packing), a single row or column, panels that two threads
split by rows or by columns, more panels than one L2-sized group, long sums cut into slices (at 512 terms where
B's rows do not lie along the sum, its columns then packed (patches/0072), 4096 where they do), batched slices with
broadcast weights, transposed or permuted (non-contiguous) operands of out_prod, and products of at most 16 rows,
which patches/0072 computes as their transpose (C written back through a tile, added to across slices). A sum runs
in the same order whatever the thread count. ``GGMLPY_NO_F32_GEMM=1`` selects ggml's own kernels
(tinyBLAS, out_prod's loops): the same reference in a subprocess (the switch is read once per process), and results
that differ somewhere from the kernel's (another summation order), which shows the kernel ran. Where the CPU lacks
AVX-512 both runs take ggml's kernels; that comparison is then skipped, saying so.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad, nd4
from tests.helpers.devices import cpu_takes_f32_products
from tests.helpers.subprocesses import cpu_flags, json_with_switch


# (m: C's contiguous rows (the weight's rows), n: columns (data rows), k: sum length)
MATMUL_SHAPES = [(32, 32, 32), (64, 2048, 64), (256, 2048, 64), (33, 47, 70), (500, 500, 784), (10, 500, 500),
                 (500, 500, 10), (7, 9, 11), (16, 300, 33), (1, 40, 17), (45, 2, 5), (98, 130, 64), (300, 13, 2000),
                 (40, 30, 9000),   # sums sliced at 4096 terms
                 (16, 32, 40),     # 0072: a transpose of one panel for two threads: computed as it is
                 (16, 64, 40), (17, 64, 30), (12, 1000, 700), (3, 100, 5000)]   # 0072's transposed products
# out_prod: (ne0 = m, ne1 = n, ne01 = k)
OUT_PROD_SHAPES = [(64, 256, 2048), (784, 500, 500), (33, 47, 70), (7, 9, 11), (1, 12, 3), (500, 10, 500),
                   (64, 64, 32), (2000, 40, 30), (20, 30, 5000),
                   (100, 7, 1300), (8, 300, 700), (16, 31, 9)]   # 0072: packed columns' slices, transposed products


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(abs(hash(key)) % (2**32))


def _backend(threads: int = 2):
    be = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(be, threads)
    return be


def _matmul(m: int, n: int, k: int, batch: int = 1, shared_weight: bool = False, threads: int = 2):
    """ggml_mul_mat of a [batch or 1, m, k] weight by [batch, n, k] data on 2 threads, numpy's, and |terms| sums."""
    rng = _rng(m, n, k, batch, shared_weight)
    a = rng.standard_normal((1 if shared_weight else batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, n, k)).astype(np.float32)
    be = _backend(threads)
    try:
        (y,) = compute(lambda c, at, bt: G.ggml_mul_mat(c, at, bt), a, b, backend=be)
    finally:
        be.free()
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = b64 @ np.swapaxes(a64, -1, -2)
    scale = np.abs(b64) @ np.swapaxes(np.abs(a64), -1, -2)
    return y, want, scale


def _out_prod(m: int, n: int, k: int, layout: str = "plain", batch: int = 1, threads: int = 2):
    """ggml_out_prod: dst[j, i] = sum_l s0[l, i] s1[l, j]; s1 given plain, as a transposed view, or (strided) as a
    permuted view whose elements are 2 floats apart along the sum and 2k along the output; numpy's too."""
    rng = _rng(m, n, k, batch, hash(layout) % 1000)
    s0 = rng.standard_normal((batch, k, m)).astype(np.float32)        # ggml [m, k, batch]
    if layout == "transposed":
        s1t = rng.standard_normal((batch, n, k)).astype(np.float32)   # ggml [k, n]; transposed to [n, k]

        def build(c, x0, x1t):
            return G.ggml_out_prod(c, x0, G.ggml_transpose(c, x1t))

        (y,) = compute(build, s0, s1t, backend=_keep(_backend(threads)))
        s1 = np.swapaxes(s1t, -1, -2)
    elif layout == "strided":
        assert batch == 1
        s1w = rng.standard_normal((n, k, 2)).astype(np.float32)       # ggml [2, k, n]; element 0 of each pair

        def build_strided(c, x0, x1w):
            v = G.ggml_view_3d(c, x1w, 1, k, n, 2 * 4, 2 * k * 4, 0)   # [1, k, n]
            return G.ggml_out_prod(c, x0, G.ggml_permute(c, v, 2, 1, 0, 3))   # [n, k, 1]: strides 2k and 2

        (y,) = compute(build_strided, s0, s1w, backend=_keep(_backend(threads)))
        s1 = s1w[:, :, 0].T[None]
    else:
        s1 = rng.standard_normal((batch, k, n)).astype(np.float32)    # ggml [n, k]
        (y,) = compute(lambda c, x0, x1: G.ggml_out_prod(c, x0, x1), s0, s1, backend=_keep(_backend(threads)))
    a64, b64 = s0.astype(np.float64), s1.astype(np.float64)
    want = np.swapaxes(b64, -1, -2) @ a64                               # [batch, n, m]
    scale = np.swapaxes(np.abs(b64), -1, -2) @ np.abs(a64)
    return y, want, scale


_BACKENDS: list = []


def _keep(be):
    """Backends of this module freed at its end (compute reads its results before returning)."""
    _BACKENDS.append(be)
    return be


@pytest.fixture(scope="module", autouse=True)
def _free_backends():
    yield
    while _BACKENDS:
        _BACKENDS.pop().free()


def _close(y, want, scale) -> bool:
    return bool(np.all(np.abs(y - nd4(want)) <= 1e-5 * nd4(scale) + 1e-6))


@pytest.mark.parametrize("m, n, k", MATMUL_SHAPES)
def test_matmul_against_numpy(m, n, k):
    y, want, scale = _matmul(m, n, k)
    assert y.shape == nd4(want).shape
    assert _close(y, want, scale)


@pytest.mark.parametrize("shared", [False, True])
def test_batched_matmul_against_numpy(shared):
    """Attention's batched products (heads x batch slices of 64 x 64 x 32), the weight broadcast or per slice."""
    y, want, scale = _matmul(64, 64, 32, batch=6, shared_weight=shared)
    assert _close(y, want, scale)


@pytest.mark.parametrize("m, n, k", OUT_PROD_SHAPES)
@pytest.mark.parametrize("layout", ["plain", "transposed", "strided"])
def test_out_prod_against_numpy(m, n, k, layout):
    y, want, scale = _out_prod(m, n, k, layout)
    assert y.shape == nd4(want).shape
    assert _close(y, want, scale)


@pytest.mark.parametrize("layout", ["plain", "strided"])
def test_each_sum_runs_in_one_order_whatever_the_threads(layout):
    """patches/0072: a sum's slices depend on B's layout alone, not on how many panels a thread took (3 panels on 2
    threads: one thread packs B's columns, the other reads them in place): the same bits on 1, 2 and 3 threads, and
    the reference on each."""
    runs = [_out_prod(96, 40, 450, layout, threads=t) for t in (1, 2, 3)]
    assert all(_close(*run) for run in runs)
    assert all(np.array_equal(runs[0][0], run[0]) for run in runs[1:])


@pytest.mark.parametrize("threads", [3, 4])
def test_few_row_products_on_more_threads(threads):
    """Products of at most 16 rows on 3 and 4 threads (0072 transposes them only where each thread keeps panels of
    its own): the reference."""
    for m, n, k in ((10, 300, 500), (16, 64, 40), (3, 100, 5000)):
        assert _close(*_matmul(m, n, k, threads=threads))


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_short_sums_split_by_columns(threads):
    """patches/0078: sums of at most 64 terms give each thread whole columns of C (the backward of a 10-class head,
    500 x 500 x 10; 500 x 436 x 64: 37 column blocks, the last of 4 columns, over 3 and 4 threads): the reference on
    each thread count, and the same bits as one thread (a sum's order does not depend on the split)."""
    for m, n, k in ((500, 500, 10), (500, 436, 64), (33, 25, 3)):
        runs = [_out_prod(m, n, k, threads=t) for t in sorted({1, threads})]
        assert all(_close(*run) for run in runs)
        assert np.array_equal(runs[0][0], runs[-1][0])
        assert _close(*_matmul(m, n, k, threads=threads))


def test_batched_out_prod_against_numpy():
    y, want, scale = _out_prod(40, 30, 20, "transposed", batch=3)
    assert _close(y, want, scale)


def test_out_prod_broadcasts_its_first_operand():
    """dst's slices share src0 (ggml's grouped-query rule: ne2 a multiple of src0's ne2)."""
    rng = _rng(5, 6, 7)
    s0 = rng.standard_normal((1, 7, 5)).astype(np.float32)    # ggml [5, 7, 1]
    s1 = rng.standard_normal((4, 7, 6)).astype(np.float32)    # ggml [6, 7, 4]
    (y,) = compute(lambda c, x0, x1: G.ggml_out_prod(c, x0, x1), s0, s1, backend=_keep(_backend()))
    want = np.swapaxes(s1.astype(np.float64), -1, -2) @ s0.astype(np.float64)
    assert _close(y, want, np.swapaxes(np.abs(s1.astype(np.float64)), -1, -2) @ np.abs(s0.astype(np.float64)))


def test_backward_of_a_product_against_numpy():
    """ggml's backward of a product inside a graph (its out_prods, one with the gradient transposed): the gradients
    of sum((x W^T) * r) with respect to W and to x against numpy's r^T x and r W."""
    rng = _rng(11, 13)
    w = rng.standard_normal((20, 37)).astype(np.float32)      # ggml [37, 20]
    x = rng.standard_normal((29, 37)).astype(np.float32)      # ggml [37, 29]
    r = rng.standard_normal((29, 20)).astype(np.float32)      # the product's shape
    _, gw = compute_grad(lambda c, wt, xt: G.ggml_mul_mat(c, wt, xt), w, r, x, backend=_keep(_backend()))
    _, gx = compute_grad(lambda c, xt, wt: G.ggml_mul_mat(c, wt, xt), x, r, w, backend=_keep(_backend()))
    w64, x64, r64 = w.astype(np.float64), x.astype(np.float64), r.astype(np.float64)
    np.testing.assert_allclose(np.asarray(gw).reshape(20, 37), r64.T @ x64, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gx).reshape(29, 37), r64 @ w64, rtol=1e-5, atol=1e-4)


_WORKER = """
import json
from tests.patches.test_f32_products import _matmul, _out_prod, MATMUL_SHAPES, OUT_PROD_SHAPES
def entry(y, want, scale):
    return [y.ravel().tolist(), bool((abs(y.ravel() - want.ravel()) <= 1e-5 * scale.ravel() + 1e-6).all())]
out = {}
for m, n, k in MATMUL_SHAPES:
    out[f"mm{m}x{n}x{k}"] = entry(*_matmul(m, n, k))
for m, n, k in OUT_PROD_SHAPES:
    out[f"op{m}x{n}x{k}"] = entry(*_out_prod(m, n, k, "transposed"))
print(json.dumps(out))
"""


def test_ggml_kernels_meet_the_reference_and_differ_from_ours():
    ours, theirs = (json_with_switch(_WORKER, "GGMLPY_NO_F32_GEMM", baseline) for baseline in (False, True))
    assert all(ok for _, ok in ours.values()), [k for k, (_, ok) in ours.items() if not ok]
    assert all(ok for _, ok in theirs.values()), [k for k, (_, ok) in theirs.items() if not ok]
    if "avx512f" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512: both runs took ggml's own kernels, so there is nothing to tell apart")
    differ = [k for k in ours if ours[k][0] != theirs[k][0]]
    # the larger sums are the ones whose rounding differs between two summation orders
    assert "mm500x500x784" in differ and "op784x500x500" in differ, differ


def test_blas_declines_f32_products_where_the_cpu_computes_them():
    """The BLAS device declines F32 MUL_MAT and OUT_PROD where the CPU backend has the kernel (built with AVX-512):
    every product stays on the CPU, in one split."""
    from ggmlpy._ffi import lib
    dev = G.ggml_backend_dev_by_name("BLAS")
    if dev is None:
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    try:
        a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 256, 128)
        b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 256, 64)
        mm = G.ggml_mul_mat(ctx, a, b)                               # 128 x 64 x 256: large for BLAS's rule
        op = G.ggml_out_prod(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 128, 256),
                             G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 64, 256))
        takes = [bool(lib.ggml_backend_dev_supports_op(dev.ptr, t.ptr)) for t in (mm, op)]
    finally:
        ctx.free()
    assert takes == [not cpu_takes_f32_products()] * 2


# ggml's own paths that the kernel replaces, each still tested with GGMLPY_NO_F32_GEMM=1 in a subprocess: the BLAS
# backend's F32 products (patches/0010, 0024, 0028, skipped in a process where the CPU takes the products), the
# tiled convolution's simd_gemm products and FLASH_ATTN_BACK's rows-by-keys kernels (test file, -k, fewest passes)
_BASELINE_SUITES = {
    "blas": ("test_cpu.py", "blas", 15),
    "tiled-convolution": ("../ops/test_conv.py", "tiled", 50),
    "flash-attn-back": ("test_flash_attn_back.py", "cpu", 10),
}


@pytest.mark.parametrize("suite", sorted(_BASELINE_SUITES))
def test_replaced_kernels_still_pass_their_tests_with_the_switch(suite):
    """GGMLPY_NO_F32_GEMM=1 gives the products back to ggml's kernels and the BLAS backend (what machines without
    AVX-512 run): their tests run and pass in a subprocess with the switch, none skipped."""
    path, select, least = _BASELINE_SUITES[suite]
    if suite == "blas" and G.ggml_backend_dev_by_name("BLAS") is None:
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, GGMLPY_NO_F32_GEMM="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           os.path.normpath(os.path.join(here, path)), "-k", select],
                          env=env, cwd=root, capture_output=True, text=True, timeout=600)
    tail = done.stdout[-3000:]
    assert done.returncode == 0, tail
    summary = tail.strip().splitlines()[-1]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= least and "skipped" not in summary, tail


@pytest.mark.parametrize("shape, axes", [((37, 53), (1, 0)), ((64, 48), (1, 0)), ((3, 40, 33), (2, 1, 0)),
                                         ((5, 34, 17), (1, 0, 2))])
def test_transposed_copies_tile_in_registers(shape, axes):
    """4-byte copies out of a transposed or permuted view (attention's heads, the backward's transposed gradients)
    move whole 16 x 16 tiles through registers (patches/0062) and the edges element by element: every element where
    numpy's transpose puts it, bit for bit, on 2 threads."""
    x = _rng(*shape).standard_normal(shape).astype(np.float32)
    perm = [len(shape) - 1 - a for a in reversed(axes)]   # numpy axes -> ggml's permute of ne
    inverse = [perm.index(i) for i in range(len(perm))]

    def build(c, a):
        return G.ggml_cont(c, G.ggml_permute(c, a, *inverse, *range(len(inverse), 4)))
    (y,) = compute(build, x, backend=_keep(_backend()))
    want = np.transpose(x, axes)
    assert np.array_equal(y.reshape(want.shape), want)
