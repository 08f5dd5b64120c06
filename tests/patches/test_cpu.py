"""Our ggml patches, checked through what they make possible (the backward passes of patches 0004
and 0006 are checked against finite differences in tests/ops/test_gradients.py; 0008's optimizer state is
checked here against AdamW's formula in numpy and, for the model layer, in tests/models)."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy._ffi import ffi
from tests.helpers.devices import cpu_takes_f32_products


def test_0005_static_graphs_larger_than_ggmls_default_size_train():
    """A 500-layer linear network: forward + backward + optimizer nodes far beyond GGML_DEFAULT_GRAPH_SIZE (2048),
    which ggml-opt's static graphs were fixed to (it aborted building them)."""
    depth, width, batch = 500, 4, 8
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 1)  # 5,000 tiny nodes: thread barriers would dominate
    ctx = G.ggml_init(mem_size=(3 * depth + 16) * G.ggml_tensor_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, width, batch))
    weights = [G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, width, width)) for _ in range(depth)]
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    for w in weights:  # near-identity layers keep the signal alive through 500 layers
        G.ggml_backend_tensor_set_data(w, (np.eye(width) + rng.normal(0, 0.01, (width, width))).astype(np.float32))
    ctx_ops = G.ggml_init(mem_size=(4 * depth + 16) * G.ggml_tensor_overhead(), no_alloc=True)
    h = x
    for w in weights:
        h = G.ggml_mul_mat(ctx_ops, w, h)
    # forward + backward + optimizer: ~5 nodes per layer, well past ggml's default size
    assert 5 * depth > G.GGML_DEFAULT_GRAPH_SIZE
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=16 * depth)
    data = rng.normal(size=(32, width)).astype(np.float32)
    batches = [(data[i:i + batch], 0.5 * data[i:i + batch]) for i in range(0, 32, batch)]
    history = G.ggml_fit_opt_gen(sched, ctx_ops, x, h, batches, epochs=3, learning_rate=1e-3, silent=True)
    assert np.isfinite(history["train_loss"]).all()
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    for obj in (sched, ctx_ops, buf, ctx, backend):
        obj.free()


def _linear_regression(seed: int = 0):
    """w [4, 1] (trainable) times x [4, 8]: out [1, 8]; MSE against y. Returns the objects and the data."""
    backend = G.ggml_backend_cpu_init()
    ctx = G.ggml_init(mem_size=8 * G.ggml_tensor_overhead(), no_alloc=True)
    x = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 8))
    w = G.ggml_set_name(G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 1)), "w")
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    ctx_ops = G.ggml_init(mem_size=8 * G.ggml_tensor_overhead(), no_alloc=True)
    out = G.ggml_mul_mat(ctx_ops, w, x)
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(8, 4)).astype(np.float32)
    ys = (xs @ np.array([1.0, -2.0, 0.5, 3.0]) + 0.1 * rng.normal(size=8)).astype(np.float32)
    return backend, ctx, ctx_ops, buf, x, w, out, xs, ys


def _adamw_step(opt, x, xs, ys):
    G.ggml_opt_alloc(opt, True)
    G.ggml_backend_tensor_set_data(x, xs)
    G.ggml_backend_tensor_set_data(G.ggml_opt_labels(opt), ys.reshape(8, 1))
    G.ggml_opt_eval(opt)


def test_0008_adamw_moments_and_step_count_are_exposed():
    """After one AdamW step the moments are (1-beta1) g and (1-beta2) g^2 (numpy's gradient); the step count
    goes 1 -> 2; a step count set by hand changes the next step's bias correction as AdamW's formula says."""
    backend, ctx, ctx_ops, buf, x, w, out, xs, ys = _linear_regression()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), ctx_compute=ctx_ops, inputs=x, outputs=out)
    opt, lr = fit["opt_ctx"], 0.1
    G.ggml_opt_set_lr(fit["lr_ud"], adamw_lr=lr)
    b1, b2, eps = 0.9, 0.999, 1e-8                              # ggml's defaults
    w0 = np.array([0.5, 0.0, -0.5, 1.0], dtype=np.float32)
    G.ggml_backend_tensor_set_data(w, w0)

    def grad(wv):                                               # d mean((X w - y)^2) / dw, in float64
        return 2.0 / 8 * xs.astype(np.float64).T @ (xs.astype(np.float64) @ wv - ys)

    assert G.ggml_opt_get_iter(opt) == 1
    m_t, v_t = G.ggml_opt_grad_m(opt, w), G.ggml_opt_grad_v(opt, w)
    assert m_t.shape == w.shape and v_t.shape == w.shape
    assert not G.ggml_backend_tensor_get_data(m_t).any() and not G.ggml_backend_tensor_get_data(v_t).any()
    assert G.ggml_opt_grad_m(opt, out) is None                  # not a parameter: no moments
    _adamw_step(opt, x, xs, ys)
    g1 = grad(w0.astype(np.float64))
    m1, v1 = (1 - b1) * g1, (1 - b2) * g1 ** 2
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(m_t), m1, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(v_t), v1, rtol=1e-4, atol=1e-9)
    assert G.ggml_opt_get_iter(opt) == 2
    w1 = G.ggml_backend_tensor_get_data(w).astype(np.float64)
    np.testing.assert_allclose(w1, w0 - lr * g1 / (np.abs(g1) + eps), rtol=1e-5, atol=1e-6)  # bias-corrected

    G.ggml_opt_set_iter(opt, 5)                                 # the next step is treated as the fifth
    _adamw_step(opt, x, xs, ys)
    g2 = grad(w1)
    m2, v2 = b1 * m1 + (1 - b1) * g2, b2 * v1 + (1 - b2) * g2 ** 2
    expected = w1 - lr * (m2 / (1 - b1 ** 5)) / (np.sqrt(v2 / (1 - b2 ** 5)) + eps)
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(w), expected, rtol=1e-4, atol=1e-6)
    as_second = w1 - lr * (m2 / (1 - b1 ** 2)) / (np.sqrt(v2 / (1 - b2 ** 2)) + eps)
    assert np.abs(as_second - expected).max() > 1e-3           # iter really changed the step
    assert G.ggml_opt_get_iter(opt) == 6
    with pytest.raises(ValueError, match="iter"):
        G.ggml_opt_set_iter(opt, 0)                             # ggml would abort
    G.ggml_opt_reset(opt, True)
    assert G.ggml_opt_get_iter(opt) == 1 and not G.ggml_backend_tensor_get_data(m_t).any()
    for obj in (opt, sched, ctx_ops, buf, ctx, backend):
        obj.free()
    # SGD keeps no moments
    backend, ctx, ctx_ops, buf, x, w, out, xs, ys = _linear_regression()
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    sgd = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_sgd(), ctx_compute=ctx_ops,
                          inputs=x, outputs=out)
    assert G.ggml_opt_grad_m(sgd, w) is None and G.ggml_opt_grad_v(sgd, w) is None
    for obj in (sgd, sched, ctx_ops, buf, ctx, backend):
        obj.free()


def test_0008_a_new_opt_context_given_the_state_continues_the_same_trajectory():
    """3 steps, state read, 3 more steps; against: 3 steps, a new opt context given that state, 3 steps."""
    backend, ctx, ctx_ops, buf, x, w, out, xs, ys = _linear_regression(1)
    w0 = np.array([0.5, 0.0, -0.5, 1.0], dtype=np.float32)
    G.ggml_backend_tensor_set_data(w, w0)

    def new_ctx():
        sched = G.ggml_backend_sched_new([backend], parallel=False)
        ops = G.ggml_init(mem_size=8 * G.ggml_tensor_overhead(), no_alloc=True)
        fit = G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), ctx_compute=ops, inputs=x,
                                      outputs=G.ggml_mul_mat(ops, w, x))
        G.ggml_opt_set_lr(fit["lr_ud"], adamw_lr=0.05)
        return fit["opt_ctx"], [fit["opt_ctx"], sched, ops]

    opt, owned = new_ctx()
    for _ in range(3):
        _adamw_step(opt, x, xs, ys)
    state = G.ggml_opt_get_state(opt, [w])
    assert state["optimizer"] == "adamw" and state["iter"] == 4 and state["m"]["w"].shape == (4,)
    assert state["hparams"]["learning_rate"] == pytest.approx(0.05)
    w3 = G.ggml_backend_tensor_get_data(w)
    for _ in range(3):
        _adamw_step(opt, x, xs, ys)
    straight = G.ggml_backend_tensor_get_data(w)
    for obj in owned:
        obj.free()

    runs = {}
    for restore in (True, False):
        G.ggml_backend_tensor_set_data(w, w3)
        opt, owned = new_ctx()
        if restore:
            G.ggml_opt_set_state(opt, state, {"w": w})
            assert G.ggml_opt_get_iter(opt) == 4
        for _ in range(3):
            _adamw_step(opt, x, xs, ys)
        runs[restore] = G.ggml_backend_tensor_get_data(w)
        for obj in owned:
            obj.free()
    np.testing.assert_array_equal(runs[True], straight)
    assert np.abs(runs[False] - straight).max() > 1e-3          # a warm restart takes another path

    # refused before anything is written: another optimizer, a missing name, a wrong shape, a bad iter
    opt, owned = new_ctx()
    with pytest.raises(ValueError, match="sgd"):
        G.ggml_opt_set_state(opt, {**state, "optimizer": "sgd"}, {"w": w})
    with pytest.raises(ValueError, match="no moments for 'w'"):
        G.ggml_opt_set_state(opt, {**state, "m": {}, "v": {}}, {"w": w})
    with pytest.raises(ValueError, match="shape"):
        G.ggml_opt_set_state(opt, {**state, "m": {"w": np.zeros(3)}}, {"w": w})
    with pytest.raises(ValueError, match="iter"):
        G.ggml_opt_set_state(opt, {**state, "iter": 0}, {"w": w})
    assert G.ggml_opt_get_iter(opt) == 1
    for obj in owned:
        obj.free()
    for obj in (ctx_ops, buf, ctx, backend):
        obj.free()


def test_0008_state_is_refused_inside_an_accumulation_period():
    backend, ctx, ctx_ops, buf, x, w, out, xs, ys = _linear_regression(2)
    G.ggml_backend_tensor_set_data(w, np.ones(4, dtype=np.float32))
    sched = G.ggml_backend_sched_new([backend], parallel=False)
    opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), opt_period=2, ctx_compute=ctx_ops, inputs=x,
                          outputs=out)
    _adamw_step(opt, x, xs, ys)                                  # 1 of 2 batches: no optimizer step yet
    with pytest.raises(RuntimeError, match="1 of 2 batches"):
        G.ggml_opt_get_state(opt, [w])
    partial = G.ggml_opt_get_state(opt, [w], allow_partial=True)
    assert partial["iter"] == 1 and not partial["m"]["w"].any()
    with pytest.raises(RuntimeError, match="1 of 2 batches"):
        G.ggml_opt_set_state(opt, partial, [w])
    _adamw_step(opt, x, xs, ys)
    assert G.ggml_opt_get_state(opt, [w])["iter"] == 2
    for obj in (opt, sched, ctx_ops, buf, ctx, backend):
        obj.free()


def test_0009_gradients_of_many_views_of_one_tensor_accumulate_in_place():
    """T slices of one tensor (how an unrolled LSTM reads its time steps): each slice's gradient lands in its
    place, and ggml accumulates them with in-place ACCs into one buffer. Unpatched, every ACC copied the whole
    tensor first, so the backward pass cost O(T * size) (T = 200 steps: +50 % of an LSTM's step time)."""
    dim, steps = 64, 16
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, 1)
    ctx = G.ggml_init(mem_size=8 * G.ggml_tensor_overhead(), no_alloc=True)
    w = G.ggml_set_param(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, dim, steps))
    c = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, dim, steps))
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    rng = np.random.default_rng(0)
    coef = rng.normal(size=(steps, dim)).astype(np.float32)
    G.ggml_backend_tensor_set_data(w, rng.normal(size=(steps, dim)).astype(np.float32))
    G.ggml_backend_tensor_set_data(c, coef)
    ctx_ops = G.ggml_init(mem_size=(12 * steps + 64) * G.ggml_tensor_overhead() + 4 * G.ggml_graph_overhead(1024, True),
                      no_alloc=True)
    y = G.ggml_scale(ctx_ops, w, 2.0)   # not a parameter: its gradient is made of the views' alone
    loss = None
    for t in range(steps):
        term = G.ggml_sum(ctx_ops, G.ggml_mul(ctx_ops, G.ggml_view_1d(ctx_ops, y, dim, 4 * dim * t),
                                              G.ggml_view_1d(ctx_ops, c, dim, 4 * dim * t)))
        loss = term if loss is None else G.ggml_add(ctx_ops, loss, term)
    G.ggml_set_loss(loss)
    graph = G.ggml_new_graph_custom(ctx_ops, 1024, True)
    G.ggml_build_forward_expand(graph, loss)
    G.ggml_build_backward_expand(ctx_ops, graph)
    accs = [n for n in graph.nodes() if n.op_name == "ACC"]
    assert len(accs) == steps
    assert all(n.ptr.view_src != ffi.NULL for n in accs), "the gradient's ACCs copy the whole tensor (not in place)"
    sched = G.ggml_backend_sched_new([backend], parallel=False, graph_size=1024)
    G.ggml_backend_sched_alloc_graph(sched, graph)
    assert len({int(ffi.cast("uintptr_t", n.ptr.data)) for n in accs}) == 1   # one buffer for all of them
    G.ggml_graph_reset(graph)
    G.ggml_backend_sched_graph_compute(sched, graph)
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(G.ggml_graph_get_grad(graph, w)).reshape(steps, dim),
                                  2 * coef)
    for obj in (sched, ctx_ops, buf, ctx, backend):
        obj.free()


# ---------------------------------------------------------------- 0010: OpenBLAS threads for OUT_PROD

def _openblas():
    from ggmlpy.core.openblas import loaded_openblas
    return loaded_openblas()  # the instance ggml-blas loaded


def _skip_unless_blas_takes_f32() -> None:
    if cpu_takes_f32_products():
        pytest.skip("the CPU backend computes F32 products in this build (patches/0062), so the BLAS backend never "
                    "gets them; tests/patches/test_f32_products.py runs this test with GGMLPY_NO_F32_GEMM=1")


def test_0010_blas_out_prod_runs_with_the_backends_thread_count():
    """OUT_PROD on ggml's BLAS backend used OpenBLAS's own thread count (all cores): a one-thread backend
    still woke OpenBLAS's worker, which spun and took a core from ggml's pool."""
    _skip_unless_blas_takes_f32()
    if not any(d.name == "BLAS" for d in G.ggml_backend_devices()):
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    from ggmlpy.backend.backend import set_backend_threads
    openblas = _openblas()
    if openblas is None:
        pytest.skip("libopenblas.so.0 cannot be loaded by name here, so its thread count cannot be read")
    blas = G.ggml_backend_dev_init(next(d for d in G.ggml_backend_devices() if d.name == "BLAS"))
    cpu = G.ggml_backend_cpu_init()
    set_backend_threads(blas, 1)  # what ggmlpy gives a BLAS backend (blas_backend_init)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 64, 48)
    b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 40, 48)
    out = G.ggml_out_prod(ctx, a, b)  # [64, 40]: taken by the BLAS backend (2-D, F32, sides >= 32)
    graph = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(graph, out)
    sched = G.ggml_backend_sched_new([blas, cpu], parallel=False)
    G.ggml_backend_sched_alloc_graph(sched, graph)
    rng = np.random.default_rng(0)
    av, bv = rng.normal(size=(48, 64)).astype(np.float32), rng.normal(size=(48, 40)).astype(np.float32)
    G.ggml_backend_tensor_set_data(a, av)
    G.ggml_backend_tensor_set_data(b, bv)
    openblas.openblas_set_num_threads(2)
    G.ggml_backend_sched_graph_compute(sched, graph)
    assert openblas.openblas_get_num_threads() == 1
    np.testing.assert_allclose(G.ggml_backend_tensor_get_data(out).reshape(40, 64), bv.T @ av, rtol=1e-5, atol=1e-4)
    for obj in (sched, ctx, cpu, blas):
        obj.free()


@pytest.mark.parametrize("n0, n1, threads_during", [(9, 8, 1), (16, 16, 1), (64, 40, 2)])
def test_0028_blas_out_prod_with_a_tiny_output_runs_on_one_openblas_thread(n0, n1, threads_during):
    """patches/0028: an output plane of <= 256 elements on one OpenBLAS thread (two were 1.7x slower at 9 x 8 over
    78,400 positions), larger ones on the backend's count; the product matches numpy either way."""
    _skip_unless_blas_takes_f32()
    if not any(d.name == "BLAS" for d in G.ggml_backend_devices()):
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    from ggmlpy.backend.backend import set_backend_threads
    openblas = _openblas()
    if openblas is None:
        pytest.skip("libopenblas.so.0 cannot be loaded by name here, so its thread count cannot be read")
    k = 3000
    blas = G.ggml_backend_dev_init(next(d for d in G.ggml_backend_devices() if d.name == "BLAS"))
    cpu = G.ggml_backend_cpu_init()
    set_backend_threads(blas, 2)
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    a = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, n0, k))
    b_store = G.ggml_set_input(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, k, n1))  # positions first, as a gradient
    out = G.ggml_out_prod(ctx, a, G.ggml_transpose(ctx, b_store))
    graph = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(graph, out)
    sched = G.ggml_backend_sched_new([blas, cpu], parallel=False)
    try:
        G.ggml_backend_sched_alloc_graph(sched, graph)
        rng = np.random.default_rng(28)
        av, bv = rng.normal(size=(k, n0)).astype(np.float32), rng.normal(size=(n1, k)).astype(np.float32)
        G.ggml_backend_tensor_set_data(a, av)
        G.ggml_backend_tensor_set_data(b_store, bv)
        G.ggml_backend_sched_graph_compute(sched, graph)
        assert G.ggml_backend_sched_get_tensor_backend(sched, out).name == "BLAS"
        assert openblas.openblas_get_num_threads() == threads_during
        want = bv.astype(np.float64) @ av.astype(np.float64)
        np.testing.assert_allclose(G.ggml_backend_tensor_get_data(out).reshape(n1, n0), want, rtol=1e-4, atol=1e-3)
    finally:
        for obj in (sched, ctx, cpu, blas):
            obj.free()


@pytest.mark.parametrize("shape, taken", [
    ((9, 7840, 8), True),     # a 3x3 single-channel convolution's product: thin, but 0.56 M multiply-adds
    ((500, 10, 500), True),   # a classifier's last layer (10 outputs)
    ((64, 64, 64), True),     # one attention head's scores
    ((16, 16, 16), False),    # small products stay on ggml's CPU kernels, where a call costs less
    ((31, 31, 31), False),
])
def test_0010_blas_takes_f32_products_large_as_a_whole(shape, taken):
    """k x m times k x n (ggml: src0 [k, m], src1 [k, n]): the BLAS device takes it iff k*m*n >= 32^3, and never
    where the CPU backend computes F32 products itself (patches/0062)."""
    from ggmlpy._ffi import lib
    dev = next((d for d in G.ggml_backend_devices() if d.name == "BLAS"), None)
    if dev is None:
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    k, m, n = shape
    ctx = G.ggml_init(8 * G.ggml_tensor_overhead(), no_alloc=True)
    out = G.ggml_mul_mat(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, k, m),
                         G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, k, n))
    assert bool(lib.ggml_backend_dev_supports_op(dev.ptr, out.ptr)) is (taken and not cpu_takes_f32_products())
    ctx.free()


# ---------------------------------------------------------------- 0011: conv/pool kernels on several threads

def _im2col_ref(x, kh, kw, s, p, d):
    """x (N, C, H, W) -> (N, OH, OW, C*KH*KW) in float64, ggml's im2col with zero padding."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1, (w + 2 * p[0] - d[0] * (kw - 1) - 1) // s[0] + 1
    xp = np.pad(np.asarray(x, np.float64), ((0, 0), (0, 0), (p[1], p[1]), (p[0], p[0])))
    out = np.zeros((n, oh, ow, c, kh, kw))
    for ky in range(kh):
        for kx in range(kw):
            ys, xs = ky * d[1], kx * d[0]
            out[..., ky, kx] = np.transpose(
                xp[:, :, ys:ys + s[1] * (oh - 1) + 1:s[1], xs:xs + s[0] * (ow - 1) + 1:s[0]], (0, 2, 3, 1))
    return out.reshape(n, oh, ow, c * kh * kw)


def _cpu(n_threads):
    backend = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(backend, n_threads)
    return backend


IM2COL_CASES = {  # (N, C, H, W), (KH, KW), stride, padding, dilation (each as (x, y))
    "one_channel": ((3, 1, 7, 6), (3, 3), (1, 1), (1, 1), (1, 1)),
    "strided_dilated": ((2, 3, 9, 8), (2, 3), (2, 2), (1, 2), (2, 1)),
    "more_threads_than_rows": ((1, 2, 3, 4), (3, 2), (1, 1), (0, 0), (1, 1)),
}


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("case", sorted(IM2COL_CASES))
def test_0011_im2col_f32_and_its_backward_match_numpy(case, n_threads):
    from tests.helpers.gradients import fd_grad
    shape, (kh, kw), s, p, d = IM2COL_CASES[case]
    rng = np.random.default_rng(len(case) + n_threads)
    x = rng.uniform(-1, 1, shape).astype(np.float32)
    kernel = np.zeros((2, shape[1], kh, kw), np.float32)  # only its shape matters

    def build(c, xt, kt):
        return G.ggml_im2col(c, kt, xt, s[0], s[1], p[0], p[1], d[0], d[1], True, G.GGML_TYPE_F32)

    ref = _im2col_ref(x, kh, kw, s, p, d)
    r = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    backend = _cpu(n_threads)
    try:
        loss, grad = compute_grad_on(backend, build, x, r, kernel)
    finally:
        backend.free()
    np.testing.assert_allclose(loss, np.sum(ref * r), rtol=1e-5)
    expected = fd_grad(lambda z: _im2col_ref(z, kh, kw, s, p, d), x, r.astype(np.float64))
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected).max() > 0


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("op", ["max", "avg"])
def test_0011_pool_2d_and_its_backward_split_planes_between_threads(op, n_threads):
    """5 planes (not a multiple of the thread count), odd sizes: every plane pooled and back-propagated once."""
    from tests.helpers.gradients import fd_grad, pool2d
    rng = np.random.default_rng(n_threads)
    x = (rng.permutation(5 * 6 * 7).astype(np.float32).reshape(5, 1, 6, 7) / 10)  # distinct: a unique max
    pool = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    ref = pool2d(np.asarray(x, np.float64), op, 2, 2)
    r = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    backend = _cpu(n_threads)
    try:
        loss, grad = compute_grad_on(backend, lambda c, xt: G.ggml_pool_2d(c, xt, pool, 2, 2, 2, 2, 0, 0), x, r)
    finally:
        backend.free()
    np.testing.assert_allclose(loss, np.sum(ref * r), rtol=1e-5)
    expected = fd_grad(lambda z: pool2d(z, op, 2, 2), x, r.astype(np.float64), h=1e-3)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-5)


def _max_pool_ref(x, k, s, p):
    """numpy max pooling over windows that may overhang the input (the overhang ignored, as ggml does),
    and the backward that gives each output's gradient to its window's first maximum (row-major)."""
    *lead, H, W = x.shape
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    out = np.zeros((*lead, OH, OW))
    windows = {}
    for oh in range(OH):
        for ow in range(OW):
            y0, x0 = oh * s - p, ow * s - p
            ys, xs = slice(max(y0, 0), min(y0 + k, H)), slice(max(x0, 0), min(x0 + k, W))
            win = x[..., ys, xs].reshape(*lead, -1)
            out[..., oh, ow] = win.max(axis=-1)
            windows[oh, ow] = (ys, xs, win.argmax(axis=-1))
    def backward(g):
        grad = np.zeros(x.shape)
        for (oh, ow), (ys, xs, arg) in windows.items():
            w = xs.stop - xs.start
            for idx in np.ndindex(*lead):
                grad[idx + (ys.start + arg[idx] // w, xs.start + arg[idx] % w)] += g[idx + (oh, ow)]
        return grad
    return out, backward


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("k, s, p", [(3, 2, 1), (2, 1, 1), (3, 3, 0)])
def test_0011_max_pool_backward_with_overhang_overlap_and_ties(k, s, p, n_threads):
    """Windows that overhang the padded border, overlap each other, and hold equal values: each output's
    gradient goes to the first maximum of the part of its window inside the input."""
    rng = np.random.default_rng(k * 10 + s + p)
    x = rng.integers(-3, 3, (3, 2, 7, 8)).astype(np.float32)  # few distinct values: many ties
    ref, backward = _max_pool_ref(np.asarray(x, np.float64), k, s, p)
    r = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    backend = _cpu(n_threads)
    try:
        loss, grad = compute_grad_on(backend, lambda c, xt: G.ggml_pool_2d(c, xt, G.GGML_OP_POOL_MAX, k, k, s, s, p, p),
                                     x, r)
    finally:
        backend.free()
    np.testing.assert_allclose(loss, np.sum(ref * r), rtol=1e-5)
    np.testing.assert_allclose(grad, backward(r.astype(np.float64)), rtol=1e-5, atol=1e-6)


def test_0011_repeat_back_into_one_element_per_row_sums_the_rows():
    """The gradient of a per-channel bias [1, 1, C] added to [W, H, C, N] (REPEAT_BACK into ne0 = 1)."""
    rng = np.random.default_rng(3)
    bias = rng.uniform(-1, 1, (3, 4, 1, 1)).astype(np.float32)  # ggml [1, 1, 4, 3]: one element per row
    target = np.zeros((3, 4, 5, 6), np.float32)
    r = rng.uniform(-1, 1, target.shape).astype(np.float32)
    backend = _cpu(2)
    try:
        loss, grad = compute_grad_on(backend, lambda c, b, t: G.ggml_add(c, t, b), bias, r, target)
    finally:
        backend.free()
    np.testing.assert_allclose(grad, r.astype(np.float64).sum(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, np.sum((target + bias) * r), rtol=1e-5)


# ---------------------------------------------------------------- 0026: bias gradients on every thread

REPEAT_BACK_CASES = {  # source in numpy order (ne3, ne2, ne1, ne0), dst's (ne3, ne2, ne1), how the source is viewed
    "conv_bias": ((3, 4, 5, 7), (1, 4, 1), "plain"),            # rows join: one long row per channel and sample
    "long_rows": ((2, 3, 29, 37), (1, 3, 1), "plain"),          # joined rows past the 256-float blocks
    "rows_kept": ((2, 3, 4, 6), (2, 3, 4), "plain"),            # ne1 > 1: no repeat along dim 1
    "repeat_every_dim": ((4, 6, 4, 5), (2, 3, 2), "plain"),     # repeats along dims 1, 2 and 3 at once
    "strided_rows": ((2, 4, 5, 7), (1, 4, 1), "padded"),        # a view whose rows do not lie back to back
    "permuted": ((2, 5, 4, 6), (1, 5, 1), "permuted"),          # dims 1 and 2 swapped: rows out of order
    "more_threads_than_sums": ((1, 2, 3, 300), (1, 2, 1), "plain"),
}


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("case", sorted(REPEAT_BACK_CASES))
def test_0026_repeat_back_into_one_element_per_row_matches_numpy(case, n_threads):
    """patches/0026: REPEAT_BACK into ne0 = 1 split between threads, against numpy float64 sums."""
    from tests.helpers.compute import compute
    src_shape, dst_shape, view = REPEAT_BACK_CASES[case]
    rng = np.random.default_rng(26)
    s3, s2, s1, s0 = src_shape
    if view == "padded":
        stored = rng.uniform(-1, 1, (s3, s2, s1, s0 + 3)).astype(np.float32)
        src = stored[..., :s0]
    elif view == "permuted":
        stored = rng.uniform(-1, 1, (s3, s1, s2, s0)).astype(np.float32)
        src = np.swapaxes(stored, 1, 2)
    else:
        stored = src = rng.uniform(-1, 1, src_shape).astype(np.float32)
    d3, d2, d1 = dst_shape
    like = np.zeros((d3, d2, d1, 1), np.float32)

    def build(ctx, x, b):
        if view == "padded":
            x = G.ggml_view_4d(ctx, x, s0, s1, s2, s3, x.ptr.nb[1], x.ptr.nb[2], x.ptr.nb[3])
        elif view == "permuted":
            x = G.ggml_permute(ctx, x, 0, 2, 1, 3)
        return G.ggml_repeat_back(ctx, x, b)

    backend = _cpu(n_threads)
    try:
        (got,) = compute(build, stored, like, backend=backend)
    finally:
        backend.free()
    tiles = np.asarray(src, np.float64).reshape(s3 // d3, d3, s2 // d2, d2, s1 // d1, d1, s0)
    np.testing.assert_allclose(got, tiles.sum(axis=(0, 2, 4, 6))[..., None], rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- 0027: the 2x2 pool's own path

def _max_pool_2x2_grad(x, r, n_threads):
    """loss = sum(max_pool_2x2(x) * r) and its gradient with respect to x, on a CPU backend of ``n_threads``."""
    backend = _cpu(n_threads)
    try:
        return compute_grad_on(backend, lambda c, t: G.ggml_pool_2d(c, t, G.GGML_OP_POOL_MAX, 2, 2, 2, 2, 0, 0), x, r)
    finally:
        backend.free()


@pytest.mark.parametrize("n_threads", [1, 2, 3])
# (7, 9): the last row and column are in no window; patches/0070's 16 windows per step: a row of 14 (the small
# CNN's), of exactly 16, of 17 (two steps), of 33 with a column in no window
@pytest.mark.parametrize("hw", [(8, 6), (7, 9), (4, 28), (2, 32), (6, 34), (3, 67)])
def test_0027_max_pool_2x2_and_its_backward_match_numpy(hw, n_threads):
    """patches/0027: 2x2 windows, stride 2, no padding; few distinct values, so most windows hold ties."""
    rng = np.random.default_rng(hw[0] * 10 + n_threads)
    x = rng.integers(-2, 2, (3, 5, *hw)).astype(np.float32)  # 15 planes: not a multiple of the thread count
    ref, backward = _max_pool_ref(np.asarray(x, np.float64), 2, 2, 0)
    r = rng.uniform(-1, 1, ref.shape).astype(np.float32)
    loss, grad = _max_pool_2x2_grad(x, r, n_threads)
    np.testing.assert_allclose(loss, np.sum(ref * r), rtol=1e-5)
    np.testing.assert_array_equal(grad, backward(r.astype(np.float64)).astype(np.float32))


@pytest.mark.parametrize("width", [10, 28, 34, 66])
def test_0070_max_pool_2x2_backward_rows_of_many_windows_with_nan_and_inf(width):
    """patches/0070: the 2x2 backward 16 windows at a time keeps the NaN rule (a window's first NaN takes its
    gradient), the -FLT_MAX rule and ties' first maximum in every lane and across steps of 16."""
    from tests.helpers import kernel_refs as ref
    rng = np.random.default_rng(width)
    x = rng.integers(-2, 2, size=(2, 3, 6, width)).astype(np.float32)      # ties in most windows
    x.reshape(-1)[rng.choice(x.size, x.size // 9, replace=False)] = np.nan
    x[0, 0, :2, -4:] = np.nan                                              # the last windows of NaN only
    x[0, 1, 2:4, 30 % width:30 % width + 2] = -np.inf                      # nothing above -FLT_MAX
    x[1, 2, 4, 17 % width] = np.inf
    r = rng.integers(1, 9, size=(2, 3, 3, width // 2)).astype(np.float32)   # exact sums
    r[0, 2, 1, 3] = -0.0                                                   # lands as +0
    _, grad = _max_pool_2x2_grad(x, r, 2)
    want = ref.pool_2d_back(x, r, "max", 2, 2, 2, 2, 0, 0)
    np.testing.assert_array_equal(grad, want)
    assert not np.any((grad == 0) & np.signbit(grad))                     # no -0


def test_0027_max_pool_2x2_backward_windows_without_a_maximum_above_minus_flt_max_get_nothing():
    """ggml's rule: an element takes the gradient when it is above the running max, which starts at -FLT_MAX; so
    a window of -inf and -FLT_MAX passes nothing back, and of -0 and +0 the first takes it."""
    big = np.finfo(np.float32).max
    x = np.array([[[[-np.inf, -big, 1.0, 1.0],
                    [-big, -np.inf, 1.0, 1.0],
                    [-0.0, 0.0, 2.0, -1.0],
                    [0.0, -0.0, 3.0, -np.inf]]]], np.float32)
    r = np.array([[[[0.5, -0.25], [-2.0, 4.0]]]], np.float32)
    _, grad = _max_pool_2x2_grad(x, r, 1)
    want = np.zeros_like(x)
    want[0, 0, 0, 2] = -0.25  # the first of four equal maxima
    want[0, 0, 2, 0] = -2.0   # -0 before +0: equal, the first takes it
    want[0, 0, 3, 2] = 4.0
    np.testing.assert_array_equal(grad, want)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("op", ["max", "avg"])
def test_0027_pool_2x2_forward_matches_numpy(op, n_threads):
    from tests.helpers.compute import compute
    rng = np.random.default_rng(27)
    x = rng.normal(size=(2, 3, 9, 12)).astype(np.float32)
    pool = G.GGML_OP_POOL_MAX if op == "max" else G.GGML_OP_POOL_AVG
    backend = _cpu(n_threads)
    try:
        (got,) = compute(lambda c, t: G.ggml_pool_2d(c, t, pool, 2, 2, 2, 2, 0, 0), x, backend=backend)
    finally:
        backend.free()
    windows = np.asarray(x, np.float64)[:, :, :8, :].reshape(2, 3, 4, 2, 6, 2)
    want = windows.max(axis=(3, 5)) if op == "max" else windows.mean(axis=(3, 5))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- 0013: one BLAS compute at a time

def test_0013_blas_products_from_four_threads_at_once_match_numpy():
    """OpenBLAS's OpenMP build (the one the build links where it is installed) returned products off by
    ~100 when four threads computed through ggml's BLAS backend at once; the backend now takes turns."""
    import threading

    from ggmlpy.backend.backend import set_backend_threads
    if not any(d.name == "BLAS" for d in G.ggml_backend_devices()):
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    rng = np.random.default_rng(0)
    a_val = rng.normal(size=(512, 384)).astype(np.float32)
    b_val = rng.normal(size=(300, 384)).astype(np.float32)
    ref = b_val.astype(np.float64) @ a_val.astype(np.float64).T
    worst, errors = {}, []
    start = threading.Barrier(4)

    def compute(k):
        try:
            sched = G.ggml_backend_sched_new("cpu", parallel=False)
            ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
            a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 384, 512)
            b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 384, 300)
            out = G.ggml_mul_mat(ctx, a, b)
            graph = G.ggml_new_graph(ctx)
            G.ggml_build_forward_expand(graph, out)
            G.ggml_backend_sched_alloc_graph(sched, graph)
            assert sched.backends[0].device.name == "BLAS"
            G.ggml_backend_tensor_set_data(a, a_val)
            G.ggml_backend_tensor_set_data(b, b_val)
            start.wait()
            err = 0.0
            for n_threads in (1, 2):  # OpenBLAS's one-thread path (the default outside training) and parallel one
                for be in sched.backends:
                    set_backend_threads(be, n_threads)
                for _ in range(40):
                    G.ggml_backend_sched_graph_compute(sched, graph)
                    got = G.ggml_backend_tensor_get_data(out).reshape(300, 512)
                    err = max(err, float(np.abs(got - ref).max()))
            worst[k] = err
            sched.free()
            ctx.free()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=compute, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert max(worst.values()) < 1e-3, worst  # float32 products of 384 terms: ~4e-5


def compute_grad_on(backend, build, x, r, *others):
    from tests.helpers.compute import compute_grad
    return compute_grad(build, x, r, *others, backend=backend)


PATCH_0014_SCRIPT = """
import numpy as np, ggmlpy as g
np.random.seed(0)
# (a) an LSTM over 256 steps: its training graph aborted in ggml_opt_alloc ("out of free blocks")
m = g.ggml_model_sequential()
m = g.ggml_layer_lstm(m, 16, input_shape=(256, 8))
m = g.ggml_compile(g.ggml_layer_dense(m, 1), loss="mse", backend="cpu")
rng = np.random.default_rng(0)
h = g.ggml_fit(m, rng.random((16, 256, 8)), rng.random((16, 1)), batch_size=16, verbose=0)
print("lstm", bool(np.isfinite(h["train_loss"]).all()))
# (b) 600 tanh layers of varying widths, one SGD step, against float64 backpropagation in numpy
widths = [2, 3] + [1 + (i * 7) % 13 for i in range(600)] + [1]
m = g.ggml_model_sequential()
m = g.ggml_layer_dense(m, widths[1], activation="tanh", input_shape=(2,), name="d0")
for i, w in enumerate(widths[2:-1]):
    m = g.ggml_layer_dense(m, w, activation="tanh", name=f"d{i + 1}")
m = g.ggml_layer_dense(m, 1, name="out")
lr = 0.1
m = g.ggml_compile(m, loss="mse", optimizer="sgd", backend="cpu", learning_rate=lr)
x = rng.normal(size=(4, 2)).astype(np.float32); y = rng.normal(size=(4, 1)).astype(np.float32)
names = [l.name for l in m.layers]
w0 = {k: v.astype(np.float64) for k, v in g.ggml_get_weights(m).items()}
tr = g.ggml_trainer(m, batch_size=4); tr.step(x, y); tr.free()
w1 = g.ggml_get_weights(m)
acts = [x.astype(np.float64)]
for n in names:
    z = acts[-1] @ w0[n + ".weight"] + w0[n + ".bias"]
    acts.append(z if n == "out" else np.tanh(z))
grad = 2 * (acts[-1] - y) / y.size
worst = 0.0
scale = 0.0
for i in reversed(range(len(names))):
    n = names[i]
    if n != "out":
        grad = grad * (1 - acts[i + 1] ** 2)
    for part, ref in ((".weight", acts[i].T @ grad), (".bias", grad.sum(axis=0))):
        step = w1[n + part] - w0[n + part]
        worst = max(worst, float(np.abs(step + lr * ref).max()))
        scale = max(scale, float(np.abs(lr * ref).max()))
    grad = grad @ w0[n + ".weight"].T
print("mlp", worst <= 1e-3 * scale, worst, scale)
"""


def test_0014_graphs_that_fragment_the_allocators_free_list_train_correctly():
    """Many differently sized tensors fill ggml's list of 256 free blocks (it aborted the process); with the
    list full, patch 0014 forgets the smallest free block. The graphs train, and one SGD step of a 600-layer
    network of varying widths equals float64 backpropagation, so no two tensors were given the same memory."""
    from tests.helpers.subprocesses import run_in_subprocess
    rc, out, err = run_in_subprocess(PATCH_0014_SCRIPT, timeout=600)
    assert rc == 0, (rc, out, err[-2000:])
    assert "lstm True" in out and "mlp True" in out, out


@pytest.mark.parametrize("name, ref", [("ggml_tanh", np.tanh), ("ggml_sigmoid", lambda v: 1.0 / (1.0 + np.exp(-v)))])
def test_0023_vectorised_tanh_and_sigmoid_match_numpy(name, ref):
    """patches/0023: F32 tanh and sigmoid run over SIMD lanes; against numpy float64 over the whole range, the
    small-|x| series of tanh included, odd row lengths (the scalar tail) and the special values."""
    from tests.helpers.compute import compute
    rng = np.random.default_rng(23)
    x = np.concatenate([np.linspace(-30, 30, 4001), rng.normal(0, 0.1, 1000), np.logspace(-8, 0, 200),
                        -np.logspace(-8, 0, 200), [0.0, -0.0, 0.19999, 0.2, 0.20001, 88.0, -88.0, 200.0, -200.0]])
    x = x.astype(np.float32)[:-1]  # an odd length: the scalar tail runs too
    (out,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), x.reshape(1, -1))
    out, want = out.ravel().astype(np.float64), ref(x.astype(np.float64))
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-30)
    assert (np.all(np.abs(out) <= 1.0) and np.all(np.sign(out[x != 0]) == np.sign(want[x != 0]))
            or name == "ggml_sigmoid")
    (special,) = compute(lambda ctx, t: getattr(G, name)(ctx, t), np.float32([[np.inf, -np.inf, np.nan, 0.0]]))
    special = special.ravel()
    assert special[0] == 1.0 and special[1] == (-1.0 if name == "ggml_tanh" else 0.0) and np.isnan(special[2])


def _out_prod_ref(a, b, dst_planes):
    """ggml_out_prod(a, b) in float64: dst[i3, i2, i1, i0] = sum_k a[i3 / r3, i2 / r2, k, i0] * b[i3, i2, k, i1]
    (numpy order of ggml's [i0, k, i2, i3] and [i1, k, i2, i3]; a is broadcast over the planes)."""
    n3, n2 = dst_planes
    r3, r2 = n3 // a.shape[0], n2 // a.shape[1]
    out = np.zeros((n3, n2, b.shape[3], a.shape[3]))
    for i3 in range(n3):
        for i2 in range(n2):
            out[i3, i2] = b[i3, i2].astype(np.float64).T @ a[i3 // r3, i2 // r2].astype(np.float64)
    return out


@pytest.mark.parametrize("a_planes, b_planes, transposed_b", [
    ((1, 1), (1, 1), False),   # a matrix (the case BLAS took before)
    ((2, 3), (2, 3), False),   # attention's per-head, per-sample products
    ((1, 2), (2, 4), False),   # a broadcast over the planes (grouped heads)
    ((2, 3), (2, 3), True),    # b a transposed view in each plane
    ((1, 1), (1, 1), "k1"),    # k = 1, b transposed: both strides of b are 4 (sgemm refused the wrong reading)
])
def test_0024_blas_takes_batched_out_prod_and_matches_numpy(a_planes, b_planes, transposed_b):
    """patches/0024: 3-D/4-D OUT_PROD on the BLAS backend (one sgemm per plane, a broadcast)."""
    _skip_unless_blas_takes_f32()
    from ggmlpy._ffi import lib
    dev = next((d for d in G.ggml_backend_devices() if d.name == "BLAS"), None)
    if dev is None:
        pytest.skip("this build has no BLAS backend (GGMLPY_BACKENDS without blas, or OpenBLAS missing)")
    k, n0, n1 = (1 if transposed_b == "k1" else 37), 48, 40
    rng = np.random.default_rng(24)
    av = rng.normal(size=(*a_planes, k, n0)).astype(np.float32)
    bv = rng.normal(size=(*b_planes, k, n1)).astype(np.float32)
    blas, cpu = G.ggml_backend_dev_init(dev), G.ggml_backend_cpu_init()
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
    a = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, n0, k, a_planes[1], a_planes[0]))
    if transposed_b:  # stored [k, n1] per plane, used as its transpose's transpose: nb[1] == 4
        b_store = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, k, n1, b_planes[1], b_planes[0]))
        b = G.ggml_transpose(ctx, b_store)
    else:
        b_store = b = G.ggml_set_input(G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, n1, k, b_planes[1], b_planes[0]))
    out = G.ggml_out_prod(ctx, a, b)
    assert bool(lib.ggml_backend_dev_supports_op(dev.ptr, out.ptr))  # the BLAS device takes it
    graph = G.ggml_new_graph(ctx)
    G.ggml_build_forward_expand(graph, out)
    sched = G.ggml_backend_sched_new([blas, cpu], parallel=False)
    try:
        G.ggml_backend_sched_alloc_graph(sched, graph)
        G.ggml_backend_tensor_set_data(a, av)
        G.ggml_backend_tensor_set_data(b_store, np.ascontiguousarray(np.swapaxes(bv, -1, -2)) if transposed_b else bv)
        G.ggml_backend_sched_graph_compute(sched, graph)
        assert G.ggml_backend_sched_get_tensor_backend(sched, out).name == "BLAS"
        got = G.ggml_backend_tensor_get_data(out).reshape(*b_planes, n1, n0)
        np.testing.assert_allclose(got, _out_prod_ref(av, bv, b_planes), rtol=1e-4, atol=1e-4)
    finally:
        for obj in (sched, ctx, cpu, blas):
            obj.free()


def test_0025_vectorised_gelu_matches_numpy():
    """patches/0025: F32 GELU (the tanh form) over SIMD lanes, against numpy float64, odd length included."""
    from tests.helpers.compute import compute
    x = np.concatenate([np.linspace(-10, 10, 2001), np.logspace(-6, 1, 300), -np.logspace(-6, 1, 300),
                        [0.0, -12.0, 12.0, -40.0, 40.0]]).astype(np.float32)[:-1]
    (out,) = compute(lambda ctx, t: G.ggml_gelu(ctx, t), x.reshape(1, -1))
    v = x.astype(np.float64)
    with np.errstate(over="ignore"):  # 0.5 v (1 + tanh u) without its cancellation for negative v
        want = v / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
    # the exp of a float32 argument up to ~90 in magnitude (x near -10) is off by |u| 2^-24 relative: 6e-6
    np.testing.assert_allclose(out.ravel(), want, rtol=1e-5, atol=1e-30)
    near = np.abs(v) < 4  # where GELU's values are of the order of x: as close as the scalar form
    np.testing.assert_allclose(out.ravel()[near], want[near], rtol=2e-6, atol=1e-12)
