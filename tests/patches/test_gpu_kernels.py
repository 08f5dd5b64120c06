"""Our GPU kernels against ggml's CPU kernel, as ggml's test-backend-ops compares a backend with the CPU:
the same inputs on both, results that must agree within a tolerance stated per device, and the CPU against numpy
references of the ops' definitions (``kernel_refs``).

* patches/0016: IM2COL_BACK (a convolution's input gradient, 2-D and 1-D, strides, padding, dilation),
  POOL_2D_BACK and OUT_PROD with a transposed operand on Vulkan and CUDA. Gathers that add in the CPU's order:
  equal to the CPU, except average pooling's division on Vulkan drivers that divide approximately (below).
* patches/0038: max pooling's rule on every backend, NaN included (forward and backward, the CPU's 2x2 fast
  path and its general loops).
* patches/0018: DROPOUT's mask, the same bit for bit on every backend, strided inputs and a seed view at an
  offset included.
* patches/0040/0041: OUT_PROD layouts CUDA's kernel cannot take, and tensors past one Vulkan binding, run on the
  CPU instead of aborting or computing wrong values, and the placement report says why.

Shapes are small and fixed, then random and large enough for many workgroups and thread blocks (more than
512 x 512 elements: Vulkan's three-dimensional dispatch, CUDA's multi-block grids); indices past 2^31 and 2^32
are in test_gpu_kernels_large.py. Each case also checks that the op really ran on the device (a test of a kernel
the scheduler quietly sent to the CPU would prove nothing).

Tolerance of average pooling's backward, per device: CUDA divides with __fdiv_rn (IEEE) and adds in the CPU's
order: equal. Mesa's lavapipe divides exactly: equal. Another Vulkan driver may divide within 2.5 ulp (the
Vulkan spec's precision for x / y), so an element that adds n terms t_i is within (2.5 + n) * 2^-23 * sum |t_i|
of the CPU (each term's division, then each addition rounding a different partial sum). The same bound is stated
in docs/guide/backends.md.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers import kernel_refs as ref
from tests.helpers.compute import compute, compute_grad
from tests.helpers.devices import assert_ran_on, GPUS, is_lavapipe, require_gpu


@pytest.fixture(scope="module", params=sorted(GPUS))
def gpu(request):
    """A GPU backend: Vulkan (on Mesa's lavapipe in CI) or CUDA."""
    require_gpu(request.param)
    b = G.ggml_backend_init_by_name(request.param)
    yield b
    b.free()


def _both(build, x, r, *others, gpu, op: str):
    """d loss / d x on the CPU and on the GPU; checks that ``op`` ran on the GPU."""
    _, on_cpu = compute_grad(build, x, r, *others)
    placed: list = []
    _, on_gpu = compute_grad(build, x, r, *others, backend=gpu, placements=placed)
    assert_ran_on(gpu, op, placed)
    return on_cpu, on_gpu


def avg_pool_back_bound(gpu, magnitude: np.ndarray, n_terms: int) -> np.ndarray:
    """How far average pooling's backward on ``gpu`` may be from the CPU, per element (module docstring)."""
    if gpu.name.startswith("CUDA") or is_lavapipe(gpu.name):
        return np.zeros_like(magnitude)
    return (2.5 + n_terms) * 2.0 ** -23 * magnitude


def _im2col(s0, s1, p0, p1, d0, d1, is_2d=True):
    return lambda ctx, t, k: G.ggml_im2col(ctx, k, t, s0, s1, p0, p1, d0, d1, is_2d, G.GGML_TYPE_F32)


# ---------------------------------------------------------------- IM2COL_BACK

CONV_2D = [  # (N, C, H, W, O, KH, KW, s0, s1, p0, p1, d0, d1)
    (1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1), (2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1),
    (3, 2, 9, 8, 2, 3, 2, 2, 1, 1, 0, 1, 1), (2, 2, 8, 9, 3, 2, 3, 1, 2, 2, 1, 2, 1),
    (1, 4, 11, 7, 2, 5, 3, 3, 2, 2, 1, 1, 2), (4, 1, 6, 6, 5, 1, 1, 2, 2, 0, 0, 1, 1),
]


def _conv_out(h, w, kh, kw, s0, s1, p0, p1, d0, d1):
    return (h + 2 * p1 - d1 * (kh - 1) - 1) // s1 + 1, (w + 2 * p0 - d0 * (kw - 1) - 1) // s0 + 1


def _im2col_back_case(gpu, case, seed):
    n, c, h, w, o, kh, kw, s0, s1, p0, p1, d0, d1 = case
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c, h, w)).astype(np.float32)
    kernel = np.zeros((o, c, kh, kw), np.float32)   # shape only: im2col reads none of its values
    oh, ow = _conv_out(h, w, kh, kw, s0, s1, p0, p1, d0, d1)
    r = rng.normal(size=(n, oh, ow, c * kh * kw)).astype(np.float32)
    on_cpu, on_gpu = _both(_im2col(s0, s1, p0, p1, d0, d1), x, r, kernel, gpu=gpu, op="IM2COL_BACK")
    np.testing.assert_array_equal(on_gpu, on_cpu)
    np.testing.assert_allclose(on_cpu, ref.im2col_back(r, x.shape, kh, kw, s0, s1, p0, p1, d0, d1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CONV_2D, ids=str)
def test_im2col_back_2d_equals_the_cpu(gpu, case):
    _im2col_back_case(gpu, case, sum(case))


@pytest.mark.parametrize("case", [(2, 3, 11, 3, 1, 0, 1), (1, 2, 9, 2, 2, 1, 1), (3, 1, 12, 3, 3, 2, 2)], ids=str)
def test_im2col_back_1d_equals_the_cpu(gpu, case):
    n, c, length, k, s0, p0, d0 = case
    rng = np.random.default_rng(sum(case))
    x = rng.normal(size=(n, c, length)).astype(np.float32)
    kernel = np.zeros((2, c, k), np.float32)
    ol = (length + 2 * p0 - d0 * (k - 1) - 1) // s0 + 1
    r = rng.normal(size=(n, ol, c * k)).astype(np.float32)
    on_cpu, on_gpu = _both(_im2col(s0, 0, p0, 0, d0, 0, False), x, r, kernel, gpu=gpu, op="IM2COL_BACK")
    np.testing.assert_array_equal(on_gpu, on_cpu)


def _random_conv(rng, min_elements: int):
    """A random 2-D convolution geometry whose image has at least ``min_elements`` elements."""
    kh, kw = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    s0, s1, d0, d1 = (int(v) for v in rng.integers(1, 4, 4))
    p0, p1 = int(rng.integers(0, kw)), int(rng.integers(0, kh))
    c, n = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    side = int(np.ceil(np.sqrt(min_elements / (c * n)))) + int(rng.integers(0, 7))
    h, w = side + int(rng.integers(0, 5)), side + int(rng.integers(0, 5))
    h, w = max(h, d1 * (kh - 1) + 1), max(w, d0 * (kw - 1) + 1)
    return (n, c, h, w, 2, kh, kw, s0, s1, p0, p1, d0, d1)


@pytest.mark.parametrize("seed", range(4))
def test_im2col_back_on_random_multi_block_shapes(gpu, seed):
    rng = np.random.default_rng(100 + seed)
    case = _random_conv(rng, 300_000)    # > 512 x 512 elements: Vulkan's z dimension, many CUDA blocks
    _im2col_back_case(gpu, case, seed)


# ---------------------------------------------------------------- POOL_2D_BACK

POOLS = [(2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1), (3, 2, 2, 1, 1, 0), (2, 3, 1, 2, 0, 1), (1, 1, 1, 1, 0, 0)]


def _pool(op, k0, k1, s0, s1, p0, p1):
    gop = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    return lambda ctx, t: G.ggml_pool_2d(ctx, t, gop, k0, k1, s0, s1, p0, p1)


def _pool_back_case(gpu, op, x, rng, k0, k1, s0, s1, p0, p1):
    oh, ow = ref.pool_out_size(x.shape[-2], k1, s1, p1), ref.pool_out_size(x.shape[-1], k0, s0, p0)
    r = rng.normal(size=x.shape[:-2] + (oh, ow)).astype(np.float32)
    on_cpu, on_gpu = _both(_pool(op, k0, k1, s0, s1, p0, p1), x, r, gpu=gpu, op="POOL_2D_BACK")
    want = ref.pool_2d_back(x, r, op, k0, k1, s0, s1, p0, p1)
    if op == "max":
        np.testing.assert_array_equal(on_gpu, on_cpu)
        np.testing.assert_allclose(on_cpu, want, rtol=1e-6, atol=1e-6)
    else:
        magnitude, n_terms = ref.avg_pool_2d_back_terms(x.shape, r, k0, k1, s0, s1, p0, p1)
        assert np.all(np.abs(on_gpu - on_cpu) <= avg_pool_back_bound(gpu, magnitude, n_terms))
        np.testing.assert_allclose(on_cpu, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("k0, k1, s0, s1, p0, p1", POOLS)
def test_pool_2d_back_agrees_with_the_cpu(gpu, op, k0, k1, s0, s1, p0, p1):
    rng = np.random.default_rng(k0 * 7 + s0 * 3 + p0)
    # values from a handful of integers: windows with tied maxima, where the first must get the gradient
    x = rng.integers(-2, 3, size=(3, 2, 7, 8)).astype(np.float32)
    _pool_back_case(gpu, op, x, rng, k0, k1, s0, s1, p0, p1)


@pytest.mark.parametrize("op", ["max", "avg"])
@pytest.mark.parametrize("seed", range(3))
def test_pool_2d_back_on_random_multi_block_shapes(gpu, op, seed):
    rng = np.random.default_rng(200 + seed)
    k0, k1 = (int(v) for v in rng.integers(1, 5, 2))
    s0, s1 = (int(v) for v in rng.integers(1, 4, 2))
    p0, p1 = int(rng.integers(0, k0)), int(rng.integers(0, k1))
    planes, side = int(rng.integers(40, 90)), int(rng.integers(60, 90))
    x = rng.normal(size=(2, planes // 2, side, side + int(rng.integers(0, 9)))).astype(np.float32)
    _pool_back_case(gpu, op, x, rng, k0, k1, s0, s1, p0, p1)


def test_pool_2d_back_sends_a_tied_windows_gradient_to_its_first_maximum(gpu):
    """One 2x2 window of equal values: the CPU (and so the GPU) gives the whole gradient to the first."""
    x = np.ones((1, 1, 2, 2), np.float32)
    r = np.full((1, 1, 1, 1), 3.0, np.float32)
    on_cpu, on_gpu = _both(_pool("max", 2, 2, 2, 2, 0, 0), x, r, gpu=gpu, op="POOL_2D_BACK")
    np.testing.assert_array_equal(on_cpu.ravel(), [3, 0, 0, 0])
    np.testing.assert_array_equal(on_gpu, on_cpu)


# ---------------------------------------------------------------- the max-pool rule, NaN included (every backend)

NAN_POOLS = {"2x2 fast path": (2, 2, 2, 2, 0, 0), "3x3 stride 1 padded": (3, 3, 1, 1, 1, 1),
             "3x2 stride 2": (3, 2, 2, 1, 1, 0)}


def _with_nans(rng, shape):
    x = rng.normal(size=shape).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, x.size // 9, replace=False)] = np.nan   # some windows hold one or two
    x[0, 0, :2, :2] = np.nan                                                 # a window of NaN only
    x[0, 1, 2:4, 2:4] = -np.inf                                              # nothing above -FLT_MAX
    x[1, 0, 0, 1] = np.inf                                                   # +inf after a finite first element
    return x


@pytest.mark.parametrize("case", sorted(NAN_POOLS))
def test_max_pooling_follows_one_rule_with_nan(any_backend, case):
    """Every backend pools a window holding a NaN to NaN and gives that window's gradient to its first NaN
    (numpy's and PyTorch's max propagate NaN); else the first maximum above -FLT_MAX wins."""
    k0, k1, s0, s1, p0, p1 = NAN_POOLS[case]
    rng = np.random.default_rng(len(case))
    x = _with_nans(rng, (2, 3, 8, 10))
    want_out, _ = ref.max_pool_2d(x, k0, k1, s0, s1, p0, p1)
    placed: list = []
    (out,) = compute(_pool("max", k0, k1, s0, s1, p0, p1), x, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "POOL_2D", placed)
    np.testing.assert_array_equal(out.reshape(want_out.shape), want_out)    # NaN where numpy has NaN
    r = rng.integers(1, 9, size=want_out.shape).astype(np.float32)           # exact sums
    placed = []
    _, grad = compute_grad(_pool("max", k0, k1, s0, s1, p0, p1), x, r, backend=any_backend, placements=placed)
    assert_ran_on(any_backend, "POOL_2D_BACK", placed)
    np.testing.assert_array_equal(grad, ref.pool_2d_back(x, r, "max", k0, k1, s0, s1, p0, p1))


def test_max_pooling_1d_propagates_nan(any_backend):
    x = np.array([[[np.nan, 1.0, 3.0, 2.0, 5.0, np.nan]]], np.float32)   # a NaN first, then last in a window
    placed: list = []
    (out,) = compute(lambda ctx, t: G.ggml_pool_1d(ctx, t, G.GGML_OP_POOL_MAX, 2, 2, 0), x, backend=any_backend,
                     placements=placed)
    assert_ran_on(any_backend, "POOL_1D", placed)
    np.testing.assert_array_equal(out.ravel(), [np.nan, 3.0, np.nan])


# ---------------------------------------------------------------- OUT_PROD

@pytest.mark.parametrize("shape", [(5, 7, 3), (64, 98, 32), (16, 9, 64), (300, 700, 900)], ids=str)
def test_out_prod_with_a_transposed_operand_runs_on_the_device(gpu, shape):
    """The gradient of a matrix product's second operand is out_prod(a, transpose(grad)): a strided operand.
    The last shape has more outputs than 512 x 512 (many workgroups and blocks)."""
    k, m, n = shape
    rng = np.random.default_rng(k + m + n)
    w, x = rng.normal(size=(m, k)).astype(np.float32), rng.normal(size=(n, k)).astype(np.float32)
    r = rng.normal(size=(n, m)).astype(np.float32)
    on_cpu, on_gpu = _both(lambda ctx, t, ww: G.ggml_mul_mat(ctx, ww, t), x, r, w, gpu=gpu, op="OUT_PROD")
    want = r.astype(np.float64) @ w.astype(np.float64)
    scale = np.sqrt(np.abs(r).astype(np.float64) ** 2 @ np.abs(w).astype(np.float64) ** 2)   # |terms| in norm
    # float32 products in another order: within a few units of float32 rounding of the terms' magnitude
    assert np.all(np.abs(on_gpu - want) <= 1e-5 * scale + 1e-6), np.abs(on_gpu - want).max()
    assert np.all(np.abs(on_cpu - want) <= 1e-5 * scale + 1e-6), np.abs(on_cpu - want).max()


def _out_prod_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_out_prod(a, b) for numpy arrays in ggml layout (..., ne1, ne0): dst[i2][i1, i0] = sum_k a[i2'][k, i0]
    b[i2][k, i1], a broadcast along its third dimension."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    rep = b.shape[0] // a.shape[0]
    return np.stack([b64[i].T @ a64[i // rep] for i in range(b.shape[0])])


def test_out_prod_with_a_permuted_src1_is_computed_right(gpu):
    """CUDA's OUT_PROD asserted (aborting the process) on a src1 contiguous along neither of its first two
    dimensions: such a product now runs where it can (patches/0040; Vulkan's shader takes it) and is right."""
    rng = np.random.default_rng(7)
    m, n, k = 6, 5, 4
    a = rng.normal(size=(1, k, m)).astype(np.float32)                   # ne [m, k, 1]
    b_store = rng.normal(size=(k, n, 2)).astype(np.float32)             # ne [2, n, k], permuted to [n, k, 2]
    build = lambda ctx, ta, tb: G.ggml_out_prod(ctx, ta, G.ggml_permute(ctx, tb, 2, 0, 1, 3))  # noqa: E731
    (on_gpu,) = compute(build, a, b_store, backend=gpu)
    want = _out_prod_ref(a, np.transpose(b_store, (2, 0, 1)))           # b in ggml layout: (2, k, n)
    np.testing.assert_allclose(on_gpu.reshape(want.shape), want, rtol=1e-5, atol=1e-5)


def test_out_prod_of_a_src0_with_strided_rows_is_refused_not_misread(gpu):
    """A src0 whose rows are strided (a permuted view): CUDA's kernel read it as contiguous (silent garbage); now
    no backend claims it (ggml's CPU kernel asserts on it), so ggmlpy refuses the graph before computing."""
    rng = np.random.default_rng(8)
    a_store = rng.normal(size=(4, 6, 2)).astype(np.float32)             # ne [2, 6, 4], permuted to [6, 4, 2]
    b = rng.normal(size=(2, 4, 5)).astype(np.float32)
    build = lambda ctx, ta, tb: G.ggml_out_prod(ctx, G.ggml_permute(ctx, ta, 2, 0, 1, 3), tb)  # noqa: E731
    with pytest.raises(G.GgmlTypeError, match="OUT_PROD"):
        compute(build, a_store, b, backend=gpu)


# ---------------------------------------------------------------- DROPOUT

@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
def test_dropout_masks_are_the_same_on_the_device(gpu, p):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 5, 37)).astype(np.float32)
    seed = np.array([12345], np.int32)
    build = lambda ctx, t, s: G.ggml_dropout(ctx, t, s, p)  # noqa: E731
    (on_cpu,) = compute(build, x, seed)
    placed: list = []
    (on_gpu,) = compute(build, x, seed, backend=gpu, placements=placed)
    assert_ran_on(gpu, "DROPOUT", placed)
    np.testing.assert_array_equal(on_gpu, on_cpu)
    transposed = lambda ctx, t, s: G.ggml_dropout(ctx, G.ggml_transpose(ctx, t), s, p)  # noqa: E731
    (cpu_t,) = compute(transposed, x[0], seed)
    (gpu_t,) = compute(transposed, x[0], seed, backend=gpu)
    np.testing.assert_array_equal(gpu_t, cpu_t)


@pytest.mark.parametrize("perm", [(0, 1, 2, 3), (1, 0, 2, 3), (2, 0, 1, 3), (3, 2, 1, 0)], ids=str)
def test_dropout_of_large_strided_4d_inputs_with_a_seed_view_at_an_offset(gpu, perm):
    """A 4-D input of more than 512 x 512 elements, read through a permutation, and the seed a view 3 elements
    into an int32 tensor (not at its start, not on a 16-byte boundary): the mask of each element's logical
    index, as numpy computes it."""
    rng = np.random.default_rng(sum(perm))
    x = rng.normal(size=(5, 24, 40, 60)).astype(np.float32)
    seeds = np.array([11, 22, 33, 987654, 44], np.int32)

    def build(ctx, t, s):
        seed = G.ggml_view_1d(ctx, s, 1, 3 * 4)
        return G.ggml_dropout(ctx, G.ggml_permute(ctx, t, *perm), seed, 0.3)

    (on_cpu,) = compute(build, x, seeds)
    placed: list = []
    (on_gpu,) = compute(build, x, seeds, backend=gpu, placements=placed)
    assert_ran_on(gpu, "DROPOUT", placed)
    np.testing.assert_array_equal(on_gpu, on_cpu)
    # the logical order of the permuted view: ggml's axis i of x goes to axis perm[i] of the result
    ne = list(reversed(x.shape))
    ne_out = [0] * 4
    for i, dst in enumerate(perm):
        ne_out[dst] = ne[i]
    view = np.transpose(x, [3 - perm.index(3 - j) for j in range(4)])   # numpy axes of the permuted view
    assert view.shape == tuple(reversed(ne_out))
    keep = ref.dropout_keep(987654, x.size, 0.3).reshape(view.shape)
    scale = np.float32(1.0 / (1.0 - float(np.float32(0.3))))
    np.testing.assert_array_equal(on_cpu.reshape(view.shape), np.where(keep, view * scale, np.float32(0)))


# ---------------------------------------------------------------- past one Vulkan binding

def test_an_im2col_gradient_past_one_vulkan_binding_runs_on_the_cpu_and_says_why():
    """Vulkan binds at most maxStorageBufferRange bytes per buffer (128 MiB on lavapipe, 4 GiB on NVIDIA): an
    IM2COL_BACK whose operand is larger runs on the CPU (patches/0041), gives the CPU's result, and the
    placement report says why; ggml's scheduler no longer aborts on the large leaf held in the device's buffer."""
    require_gpu("Vulkan0")
    dev = G.ggml_backend_dev_by_name("Vulkan0")
    limit = dev.max_binding_bytes
    assert limit is not None and limit >= 1 << 26, limit
    if 2.5 * limit > dev.memory()["free"] or limit > 1 << 30:
        pytest.skip(f"Vulkan0 binds {limit} bytes at once: too much to exceed in a test ({dev.description})")
    c, kh, kw = 64, 3, 3
    side = 64
    n = int(limit // (side * side * c * kh * kw * 4)) + 1                 # im2col's gradient just past the limit
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, c, side, side)).astype(np.float32)
    kernel = np.zeros((2, c, kh, kw), np.float32)
    r = rng.normal(size=(n, side, side, c * kh * kw)).astype(np.float32)
    assert r.nbytes > limit
    vk = G.ggml_backend_init_by_name("Vulkan0")
    try:
        placed: list = []
        _, on_vk = compute_grad(_im2col(1, 1, 1, 1, 1, 1), x, r, kernel, backend=vk, placements=placed)
    finally:
        vk.free()
    _, on_cpu = compute_grad(_im2col(1, 1, 1, 1, 1, 1), x, r, kernel)
    np.testing.assert_array_equal(on_vk, on_cpu)
    p = placed[0]
    assert "IM2COL_BACK" in p.cpu_ops and "maxStorageBufferRange" in p.why["IM2COL_BACK"], p
    assert "IM2COL_BACK: Vulkan0 refuses IM2COL_BACK" in str(p)
