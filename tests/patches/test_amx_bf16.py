"""patches/0061: the CPU's BF16 products on AMX tiles, and mixed precision's vectorised conversions.

The kernel computes ``ggml_mul_mat`` of a BF16 matrix by F32 data (converted to BF16 by ggml) on the CPU backend
wherever it has at least 32^3 multiply-adds. Its reference is numpy float64 of the BF16-rounded operands: the
products of BF16 values are exact in F32, so the only error left is F32 accumulation's (the kernel sums 32 terms
per tile step in an order of its own): 1e-5 relative to the row's absolute sums. The shapes cross every edge the
kernel pads (rows of the weights and of the data past a 16- or 32-row block, sums past a 32-value chunk, products
too small for the kernel) and two threads split its panels. ``GGMLPY_NO_AMX=1`` selects ggml's own kernel
(tinyBLAS): the same reference, and results that differ from the tile kernel's (a different summation order), in
a subprocess, since the switch is read once per process. On a machine without AMX (or a build without it) both
runs take ggml's kernel: the reference still holds and the comparison between them is skipped, saying so.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, nd4
from tests.helpers.subprocesses import cpu_flags, json_with_switch
from tests.patches.test_half_products import round_to


# (m: weight rows, n: data rows, k: sum length)
SHAPES = [(32, 32, 32), (64, 64, 64), (33, 47, 70), (500, 500, 784), (100, 35, 1000), (10, 500, 500),
          (500, 500, 10), (7, 9, 11), (16, 300, 33), (300, 130, 16), (45, 3, 5), (2, 1, 7)]


def _dims(key: str) -> list[int]:
    """(m, n, k) of a worker's key "MxNxK"."""
    return [int(d) for d in key.split("x")]


def _thin(key: str) -> bool:
    """Sums of at most 16 terms: patches/0074 computes them on the F32 kernel (0062), AMX or not."""
    return _dims(key)[2] <= 16


def _product(m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's BF16 product on 2 CPU threads, numpy's of the rounded operands, and the sums of the terms' sizes."""
    rng = np.random.default_rng(seed + m * 7 + n * 13 + k)
    a = rng.standard_normal((m, k)).astype(np.float32)   # ggml [k, m]: the weight
    b = rng.standard_normal((n, k)).astype(np.float32)   # ggml [k, n]: the data
    be = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(be, 2)
    try:
        (y,) = compute(lambda c, at, bt: G.ggml_mul_mat(c, G.ggml_cast(c, at, G.GGML_TYPE_BF16), bt), a, b,
                       backend=be)
    finally:
        be.free()
    ra, rb = round_to(G.GGML_TYPE_BF16, a), round_to(G.GGML_TYPE_BF16, b)
    return y, rb @ ra.T, np.abs(rb) @ np.abs(ra).T


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_bf16_products_against_numpy(m, n, k):
    y, want, scale = _product(m, n, k)
    assert np.all(np.abs(y - nd4(want)) <= 1e-5 * nd4(scale) + 1e-6)


_WORKER = """
import json
from tests.patches.test_amx_bf16 import _product, SHAPES
out = {}
for m, n, k in SHAPES:
    y, want, scale = _product(m, n, k)
    ok = bool((abs(y.ravel() - want.ravel()) <= 1e-5 * scale.ravel() + 1e-6).all())
    out[f"{m}x{n}x{k}"] = [y.ravel().tolist(), ok]
print(json.dumps(out))
"""


def test_the_tile_kernel_and_ggmls_agree_with_numpy_and_differ_from_each_other():
    tiles, plain = json_with_switch(_WORKER, "GGMLPY_NO_AMX", False), json_with_switch(_WORKER, "GGMLPY_NO_AMX", True)
    assert all(ok for _, ok in tiles.values()) and all(ok for _, ok in plain.values())
    if not {"amx_bf16", "amx_tile"} <= cpu_flags():
        pytest.skip("this CPU has no AMX-BF16: both runs took ggml's kernel (checked against numpy above)")
    large = [key for key in tiles if np.prod(_dims(key)) >= 32 ** 3 and not _thin(key)]
    # the tile kernel ran: its sums differ from tinyBLAS's in the last bits on every product it takes
    assert all(tiles[key][0] != plain[key][0] for key in large), "GGMLPY_NO_AMX changed nothing: no tile kernel"
    small = [key for key in tiles if key not in large]
    assert all(tiles[key][0] == plain[key][0] for key in small)   # too small or thin: the same kernel both times


def test_thin_products_run_on_the_f32_kernel():
    """patches/0074: a BF16 product whose sums have at most 16 terms (under mixed precision, the gradient into a
    10-class head's input) runs on 0062's F32 kernel with both operands widened exactly: the same reference holds
    (products of BF16 values are exact in F32), and with ``GGMLPY_NO_F32_GEMM=1`` (ggml's BF16 dot products) the
    sums come out in another order somewhere, which shows the path ran."""
    ours = json_with_switch(_WORKER, "GGMLPY_NO_F32_GEMM", False)
    ggml = json_with_switch(_WORKER, "GGMLPY_NO_F32_GEMM", True)
    assert all(ok for _, ok in ours.values()) and all(ok for _, ok in ggml.values())
    if "avx512f" not in cpu_flags():
        pytest.skip("this CPU has no AVX-512: both runs took ggml's kernels (checked against numpy above)")
    # thin products of many outputs (a few dozen outputs of 11 terms can come out alike in both orders)
    thin = [key for key in ours if _thin(key) and np.prod(_dims(key)) >= 100000]
    assert thin and all(ours[key][0] != ggml[key][0] for key in thin), "GGMLPY_NO_F32_GEMM changed nothing"


SPECIAL = np.array([0.0, -0.0, 1.0, -1.0, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -9, 1.0 + 3 * 2.0 ** -9,
                    3.3895314e38, -3.3895314e38, 1e-40, -1e-40, 1e-45, 1.17549435e-38, np.inf, -np.inf,
                    65504.0, 65520.0, 6e-8, 3e-8, 2.0 ** -24, 1e30], np.float32)


def _rounded(t: int, x: np.ndarray) -> np.ndarray:
    """numpy's rounding of F32 values to ``t`` and back, as F32."""
    return round_to(t, x).astype(np.float32)


@pytest.mark.parametrize("t", [G.GGML_TYPE_BF16, G.GGML_TYPE_F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layout", ["rows", "transposed"])
def test_casts_round_as_numpy_bit_for_bit(t, layout):
    """A contiguous cast converts 16 values at a time, a transposed one in 16 x 16 tiles: every value (ties,
    overflow, subnormals, infinities, signed zeros) as numpy rounds it, NaNs quiet NaNs."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((37, 53)) * 10.0 ** rng.integers(-6, 7, (37, 53))).astype(np.float32)
    x.flat[:SPECIAL.size] = SPECIAL
    x.flat[-3:] = [np.nan, -np.nan, np.float32(np.nan)]

    def build(c, a):
        src = a if layout == "rows" else G.ggml_transpose(c, a)
        return G.ggml_cast(c, G.ggml_cast(c, src, t), G.GGML_TYPE_F32)
    (y,) = compute(build, x)
    want = _rounded(t, x if layout == "rows" else x.T)
    got = y.reshape(want.shape)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


@pytest.mark.parametrize("t", [G.GGML_TYPE_BF16, G.GGML_TYPE_F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("axes", [(1, 0, 2, 3), (2, 1, 0, 3), (1, 2, 0, 3)])
def test_half_tensors_permuted_into_contiguous_copies_exactly(t, axes):
    """2-byte tensors copied out of a permuted view (a half weight transposed for the backward product) go in
    16 x 16 tiles like 4-byte ones: every element where numpy's transpose puts it, odd and tile-crossing sizes."""
    x = np.random.default_rng(9).standard_normal((5, 37, 19)).astype(np.float32)   # ggml [19, 37, 5]

    def build(c, a):
        return G.ggml_cast(c, G.ggml_cont(c, G.ggml_permute(c, G.ggml_cast(c, a, t), *axes)), G.GGML_TYPE_F32)
    (y,) = compute(build, x)
    # ggml_permute puts axis i of the source at position axes[i] (ggml order: numpy's reversed)
    ne_axes = [0, 0, 0]
    for i, a in enumerate(axes[:3]):
        ne_axes[a] = i
    want = np.transpose(_rounded(t, x), [2 - k for k in reversed(ne_axes)])
    np.testing.assert_array_equal(y.reshape(want.shape), want)
