"""Backward passes through sources an op passes no gradient to (patches/0029).

IM2COL reads only its kernel's shape, CPY overwrites its destination, SGN and STEP are piecewise constant: none
gives its source a gradient. When that source needs one anyway (it is, or is computed from, a parameter), ggml
read the shape of the missing gradient and segfaulted in ``ggml_build_backward_expand`` -- whenever the op was
the first of the source's users in the backward order, e.g. ``ggml_mul_mat(reshape(K), cols)`` with
``cols = ggml_im2col(K, x)`` and a kernel ``K`` computed from a weight. These graphs now build and their gradients
are checked against central finite differences in numpy float64; the source gets its gradient from its other
users, or none.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute_grad, ctx_size, default_backend, graph_inputs
from tests.helpers.devices import assert_ran_on
from tests.helpers.gradients import f64
from tests.helpers.gradients import fd_grad as weighted_fd_grad


def fd_grad(f, x, h=1e-5):
    """Central differences of the scalar f at x, in float64 (test_gradients' differences with weight 1)."""
    return weighted_fd_grad(f, x, 1.0, h)


def grads(build, arrays, params, r, graph_size=512):
    """loss = sum(build(ctx, *tensors) * r) with ``arrays[i]`` for i in ``params`` marked parameters: the loss
    and each parameter's gradient (None where ggml built none), from ggml's autodiff on the CPU."""
    backend = default_backend()
    with graph_inputs([*arrays, r], backend, ctx_size(4 * graph_size, graph_size, True)) as (ts, ctx, owned):
        for i in params:
            G.ggml_set_param(ts[i])
        loss = G.ggml_sum(ctx, G.ggml_mul(ctx, build(ctx, *ts[:-1]), ts[-1]))
        G.ggml_set_loss(loss)
        graph = G.ggml_new_graph_custom(ctx, graph_size, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)  # segfaulted before patch 0029
        sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=graph_size)
        owned.append(sched)
        G.ggml_backend_sched_alloc_graph(sched, graph)
        G.ggml_graph_reset(graph)
        G.ggml_backend_sched_graph_compute(sched, graph)
        out = []
        for i in params:
            g = G.ggml_graph_get_grad(graph, ts[i])
            out.append(None if g is None else
                       G.ggml_backend_tensor_get_data(g).astype(np.float64).reshape(arrays[i].shape))
        return float(G.ggml_backend_tensor_get_data(loss)[0]), out


# ---------------------------------------------------------------- im2col with a kernel that needs a gradient

N, CIN, H, W, COUT, KH, KW, RANK, PAD = 2, 2, 4, 5, 3, 2, 3, 2, 1
CKK = CIN * KH * KW
OH, OW = H + 2 * PAD - KH + 1, W + 2 * PAD - KW + 1


def _conv2d(X, K, p):
    """X (N, C, H, W), K (O, C, KH, KW) -> (N, O, OH, OW), stride 1, zero padding p."""
    Xp = np.pad(X, ((0, 0), (0, 0), (p, p), (p, p)))
    oh, ow = Xp.shape[2] - K.shape[2] + 1, Xp.shape[3] - K.shape[3] + 1
    return sum(np.einsum("nchw,oc->nohw", Xp[:, :, ky:ky + oh, kx:kx + ow], K[:, :, ky, kx])
               for ky in range(K.shape[2]) for kx in range(K.shape[3]))


def _kernel(ctx, w, basis):
    """K [KW, KH, CIN, COUT] = reshape(basis-weighted weight): a kernel computed from the parameter w [RANK, COUT]
    (numpy: K_flat (COUT, CKK) = w @ basis.T, basis (CKK, RANK) a constant)."""
    return G.ggml_reshape_4d(ctx, G.ggml_mul_mat(ctx, basis, w), KW, KH, CIN, COUT)


def _cols(ctx, k, x):
    return G.ggml_reshape_2d(ctx, G.ggml_im2col(ctx, k, x, 1, 1, PAD, PAD, 1, 1, True, G.GGML_TYPE_F32),
                             CKK, OW * OH * N)


def _kernel_np(w, basis):
    return (w @ basis.T).reshape(COUT, CIN, KH, KW)


def _conv_np(x, k):
    """The product mul_mat(reshape(K), cols) in numpy: (N*OH*OW, COUT)."""
    return _conv2d(x, k, PAD).transpose(0, 2, 3, 1).reshape(-1, COUT)


# name -> (build(ctx, x, w, basis), numpy of the same (x, w, basis), True where w gets a gradient)
IM2COL_CASES = {
    # the product reads the kernel first: IM2COL is the first of K's users in the backward order (crashed)
    "computed_kernel_first": (
        lambda c, x, w, b: (lambda k: G.ggml_mul_mat(c, G.ggml_reshape_2d(c, k, CKK, COUT), _cols(c, k, x)))(
            _kernel(c, w, b)),
        lambda x, w, b: _conv_np(x, _kernel_np(w, b)), True),
    # ggml_conv_2d's order (cols first): built before too, kept as the reference layout
    "computed_cols_first": (
        lambda c, x, w, b: (lambda k: G.ggml_mul_mat(c, _cols(c, k, x), G.ggml_reshape_2d(c, k, CKK, COUT)))(
            _kernel(c, w, b)),
        lambda x, w, b: _conv_np(x, _kernel_np(w, b)).T, True),
    # the computed kernel gives im2col its shape only: w gets no gradient (crashed)
    "computed_kernel_shape_only": (
        lambda c, x, w, b: G.ggml_sqr(c, _cols(c, _kernel(c, w, b), x)),
        lambda x, w, b: None, False),
}


def _cols_np(x):
    """im2col of x in numpy: (N*OH*OW, CKK), the columns ordered (c, ky, kx) as ggml's."""
    Xp = np.pad(x, ((0, 0), (0, 0), (PAD, PAD), (PAD, PAD)))
    cols = np.stack([Xp[:, :, ky:ky + OH, kx:kx + OW] for ky in range(KH) for kx in range(KW)], axis=2)
    return cols.reshape(N, CIN, KH, KW, OH, OW).transpose(0, 4, 5, 1, 2, 3).reshape(-1, CKK)


@pytest.mark.parametrize("name", sorted(IM2COL_CASES))
def test_im2col_kernel_computed_from_a_parameter(name):
    build, f, w_gets_grad = IM2COL_CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.uniform(-1, 1, (N, CIN, H, W)).astype(np.float32)
    w = rng.uniform(-1, 1, (COUT, RANK)).astype(np.float32)
    basis = rng.uniform(-1, 1, (CKK, RANK)).astype(np.float32)
    if f(x, w, basis) is None:
        f = lambda x, w, b: np.square(_cols_np(x))  # noqa: E731
    r = rng.uniform(-1, 1, f(f64(x), f64(w), f64(basis)).shape).astype(np.float32)
    loss, (gx, gw) = grads(build, [x, w, basis], [0, 1], r)
    ref = lambda xx, ww: float(np.sum(f(xx, ww, f64(basis)) * f64(r)))  # noqa: E731
    np.testing.assert_allclose(loss, ref(f64(x), f64(w)), rtol=1e-4, atol=1e-4)
    fx = fd_grad(lambda xx: ref(xx, f64(w)), x)
    np.testing.assert_allclose(gx, fx, rtol=1e-3, atol=1e-4)
    assert np.abs(fx).max() > 0
    if w_gets_grad:
        fw = fd_grad(lambda ww: ref(f64(x), ww), w)
        np.testing.assert_allclose(gw, fw, rtol=1e-3, atol=1e-4)
        assert np.abs(fw).max() > 0
    else:
        assert gw is None or not np.any(gw), gw  # the output does not depend on the kernel's values


def test_im2col_kernel_that_is_the_parameter_read_first_by_the_product():
    """The weight itself as the kernel, the product reading it before im2col (crashed without ggml-opt's
    accumulators): both gradients against finite differences."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (N, CIN, H, W)).astype(np.float32)
    k = rng.uniform(-1, 1, (COUT, CIN, KH, KW)).astype(np.float32)
    r = rng.uniform(-1, 1, (N * OH * OW, COUT)).astype(np.float32)

    def build(c, xt, kt):
        return G.ggml_mul_mat(c, G.ggml_reshape_2d(c, kt, CKK, COUT), _cols(c, kt, xt))

    loss, (gx, gk) = grads(build, [x, k], [0, 1], r)
    ref = lambda xx, kk: float(np.sum(_conv_np(xx, kk) * f64(r)))  # noqa: E731
    np.testing.assert_allclose(loss, ref(f64(x), f64(k)), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gx, fd_grad(lambda xx: ref(xx, f64(k)), x), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(gk, fd_grad(lambda kk: ref(f64(x), kk), k), rtol=1e-3, atol=1e-4)


def test_two_conv_layers_with_computed_kernels_train_with_ggml_opt():
    """ggml-opt's graphs (ggml_fit_opt_gen): the second layer's input needs a gradient and its kernel, computed
    from a weight, is read by the product before im2col. The fit segfaulted building its backward graph."""
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 1)
    ctx = G.ggml_init(mem_size=16 * G.ggml_tensor_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, W, H, CIN, N))
    w1 = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, RANK, CIN))
    w2 = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, RANK, 1))
    b1 = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, RANK, CKK)  # constant bases
    b2 = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, RANK, CKK)
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    for t, shape in ((w1, (CIN, RANK)), (w2, (1, RANK)), (b1, (CKK, RANK)), (b2, (CKK, RANK))):
        G.ggml_backend_tensor_set_data(t, rng.uniform(-0.5, 0.5, shape).astype(np.float32))
    ctx_ops = G.ggml_init(mem_size=64 * G.ggml_tensor_overhead(), no_alloc=True)

    def conv(inp, w, basis, cout, oh, ow):  # 'same' 2x3 convolution, kernel first in the product
        k = G.ggml_reshape_4d(ctx_ops, G.ggml_mul_mat(ctx_ops, basis, w), KW, KH, CIN, cout)
        cols = G.ggml_im2col(ctx_ops, k, inp, 1, 1, PAD, PAD, 1, 1, True, G.GGML_TYPE_F32)
        y = G.ggml_mul_mat(ctx_ops, G.ggml_reshape_2d(ctx_ops, k, CKK, cout),
                           G.ggml_reshape_2d(ctx_ops, cols, CKK, ow * oh * N))  # [cout, ow*oh*N]
        return G.ggml_cont(ctx_ops, G.ggml_permute(ctx_ops, G.ggml_reshape_4d(ctx_ops, y, cout, ow, oh, N),
                                                   2, 0, 1, 3))              # [ow, oh, cout, N]

    h = G.ggml_tanh(ctx_ops, conv(x, w1, b1, CIN, OH, OW))  # CIN channels again, so the second layer's CKK fits
    out = G.ggml_reshape_2d(ctx_ops, conv(h, w2, b2, 1, OH + 1, OW), (OW) * (OH + 1), N)
    data = rng.uniform(-1, 1, (4 * N, CIN, H, W)).astype(np.float32)
    target = rng.uniform(-0.5, 0.5, (4 * N, (OH + 1) * OW)).astype(np.float32)
    batches = [(data[i:i + N], target[i:i + N]) for i in range(0, 4 * N, N)]
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=1024)
    try:
        history = G.ggml_fit_opt_gen(sched, ctx_ops, x, out, batches, epochs=4, learning_rate=1e-2, silent=True)
        losses = np.asarray(history["train_loss"], dtype=np.float64)
        assert np.isfinite(losses).all()
        assert losses[-1] < losses[0]
    finally:
        for obj in (sched, ctx_ops, buf, ctx, backend):
            obj.free()


# ---------------------------------------------------------------- the other ops that pass a source no gradient

def test_cpy_into_a_destination_that_needs_a_gradient():
    """ggml_cpy(a, b) overwrites b: the result depends on a only, and b (a parameter, or computed from one)
    gets no gradient from it. Both segfaulted in ggml_build_backward_expand."""
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    d = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    r = rng.uniform(-1, 1, (3, 4)).astype(np.float32)
    for dest in (lambda c, t: t, lambda c, t: G.ggml_scale(c, t, 2.0)):
        loss, (gx, gd) = grads(lambda c, xt, dt, dest=dest: G.ggml_cpy(c, G.ggml_sqr(c, xt), dest(c, dt)),
                               [x, d], [0, 1], r)
        np.testing.assert_allclose(loss, float(np.sum(np.square(f64(x)) * r)), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(gx, 2 * f64(x) * r, rtol=1e-5, atol=1e-6)
        assert gd is None or not np.any(gd), gd


@pytest.mark.parametrize("op", ["sgn", "step"])
def test_piecewise_constant_loss_of_a_parameter(op):
    """A loss that is sgn/step of a parameter (or of a tensor computed from one): its gradient is zero and ggml
    builds none; the build segfaulted. Nothing reads the loss's gradient, so no allocator gives it memory:
    ggml_graph_reset (which would write through NULL) says so instead."""
    fn = getattr(G, f"ggml_{op}")
    for wrap in (lambda c, t: t, lambda c, t: G.ggml_scale(c, t, 3.0)):
        backend = default_backend()
        with graph_inputs([np.array([0.5], np.float32)], backend, ctx_size(64, 64, True)) as (ts, ctx, owned):
            G.ggml_set_param(ts[0])
            loss = G.ggml_set_loss(fn(ctx, wrap(ctx, ts[0])))
            graph = G.ggml_new_graph_custom(ctx, 64, True)
            G.ggml_build_forward_expand(graph, loss)
            G.ggml_build_backward_expand(ctx, graph)
            assert G.ggml_graph_get_grad(graph, ts[0]) is None
            sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=64)
            owned.append(sched)
            G.ggml_backend_sched_alloc_graph(sched, graph)
            with pytest.raises(G.GgmlStateError, match="no trainable parameter gets a gradient from the loss"):
                G.ggml_graph_reset(graph)
            G.ggml_backend_sched_graph_compute(sched, graph)  # the forward pass still runs
            assert float(G.ggml_backend_tensor_get_data(loss)[0]) == 1.0


def test_graph_reset_before_allocation_still_says_so():
    """The usual reason for an unallocated gradient keeps its message."""
    ctx = G.ggml_init(ctx_size(16, 64, True), no_alloc=True)
    try:
        x = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3))
        loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, x)))
        graph = G.ggml_new_graph_custom(ctx, 64, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)
        with pytest.raises(G.GgmlStateError, match="not allocated yet"):
            G.ggml_graph_reset(graph)
    finally:
        ctx.free()


def test_im2col_and_its_backward_read_the_kernels_shape_only():
    """IM2COL reads its kernel's shape only, and so does IM2COL_BACK (its source 1; source 0 is the gradient it
    reads, although ggml.h names them the other way round): the checks before a compute must not count the
    kernel as a tensor whose values are read (a kernel without memory would be refused), and must count the
    gradient (an unwritten one would go unnoticed)."""
    from ggmlpy.graph.nodes import graph_tensor_ptrs, ptr_key, value_read
    ctx = G.ggml_init(ctx_size(64, 256, True), no_alloc=True)
    try:
        x = G.ggml_set_param(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 5, 5, 2, 1))
        kernel = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 2, 1)
        cols = G.ggml_im2col(ctx, kernel, x, 1, 1, 0, 0, 1, 1, True, G.GGML_TYPE_F32)
        loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_sqr(ctx, cols)))
        graph = G.ggml_new_graph_custom(ctx, 256, True)
        G.ggml_build_forward_expand(graph, loss)
        G.ggml_build_backward_expand(ctx, graph)
        nodes, _ = graph_tensor_ptrs(graph.ptr)
        back = [n for n in nodes if G._ffi.ffi.string(G._ffi.lib.ggml_op_desc(n)).decode() == "IM2COL_BACK"]
        assert len(back) == 1 and back[0].src[1] == kernel.ptr
        read = value_read(back)
        assert ptr_key(back[0].src[0]) in read           # the gradient of the columns
        assert ptr_key(kernel.ptr) not in read            # the kernel: its shape only
        assert ptr_key(kernel.ptr) not in value_read(nodes)
    finally:
        ctx.free()


def test_the_gradient_of_a_view_ignores_an_inf_outside_it(any_backend):
    """patches/0071: d/dx sum(view(x * x) * r) where x * x holds an inf outside the view. The zero tensor the view's
    gradient accumulates into was ggml_scale(x * x, 0): inf * 0 put a NaN in it, and the NaN flowed back to x
    (2 x NaN). Now it is written as zeros: x's gradient is 0 outside the view and 2 x r inside, on every device."""
    x = np.linspace(0.5, 2.0, 16).astype(np.float32).reshape(2, 8)
    x[0, 0] = 1e30                                  # its square overflows to inf
    r = np.random.default_rng(1).normal(size=(2, 7)).astype(np.float32)
    placed: list = []
    _, grad = compute_grad(lambda c, t: G.ggml_view_2d(c, G.ggml_mul(c, t, t), 7, 2, 8 * 4, 4), x, r,
                           backend=any_backend, placements=placed)
    want = np.zeros((2, 8))
    want[:, 1:] = 2.0 * f64(x)[:, 1:] * f64(r)
    assert np.isfinite(grad).all(), grad
    np.testing.assert_allclose(grad, want, rtol=1e-6, atol=1e-6)
    assert_ran_on(any_backend, "FILL", placed)
