"""ggml_lstm_cell and ggml_gru_cell (patches/0031), the fused LSTM and GRU steps, and ggml_lstm_seq and ggml_gru_seq
(patches/0035, 0037), whole LSTM and GRU recurrences: forward and backward passes against numpy float64 and finite
differences, on one and two CPU threads, units across the kernels' 64-unit chunks and the SIMD width."""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad
from tests.helpers.gradients import f64, fd_grad


# the op builders this file tests (test_ops.py's coverage check reads it)
COVERED = {"ggml_lstm_cell", "ggml_gru_cell", "ggml_lstm_seq", "ggml_gru_seq"}


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def lstm_step(z, c_prev=None):
    """numpy float64 reference: z (batch, 4 units) in Keras' gate order i, f, g, o -> (h, c), (batch, units)."""
    units = z.shape[-1] // 4
    i, f, g, o = (z[..., k * units:(k + 1) * units] for k in range(4))
    c = sigmoid(i) * np.tanh(g) + (0.0 if c_prev is None else sigmoid(f) * c_prev)
    return sigmoid(o) * np.tanh(c), c


def cell(ctx, z, c_prev=None):
    return G.ggml_lstm_cell(ctx, z, c_prev=c_prev)


def split_cell(ctx, x, r, c_prev=None):
    """z handed over as x + r, the layer's form: the op adds them."""
    return G.ggml_lstm_cell(ctx, x, r, c_prev)


def cpu(threads):
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, threads)
    return b


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def backend(request):
    b = cpu(request.param)
    yield b
    b.free()


@pytest.mark.parametrize("units, batch", [(1, 1), (5, 3), (67, 4), (130, 9)])
@pytest.mark.parametrize("with_state", [True, False])
def test_forward_matches_numpy_float64(units, batch, with_state, backend):
    rng = np.random.default_rng(units * 10 + batch)
    z = rng.normal(scale=2.0, size=(batch, 4 * units)).astype(np.float32)
    c_prev = rng.normal(size=(batch, units)).astype(np.float32)
    arrays = (z, c_prev) if with_state else (z,)
    (out,) = compute(cell, *arrays, backend=backend)
    h, c = lstm_step(f64(z), f64(c_prev) if with_state else None)
    assert out.shape == (1, 2, batch, units)
    np.testing.assert_allclose(out[0, 0], h, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(out[0, 1], c, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("units, batch", [(3, 2), (66, 2)])
@pytest.mark.parametrize("with_state", [True, False])
def test_gradient_of_z_matches_finite_differences(units, batch, with_state, backend):
    rng = np.random.default_rng(units + batch)
    z = rng.normal(scale=1.5, size=(batch, 4 * units)).astype(np.float32)
    c_prev = rng.normal(size=(batch, units)).astype(np.float32)
    r = rng.uniform(-1, 1, size=(2, batch, units)).astype(np.float32)   # weights h and c differently
    others = (c_prev,) if with_state else ()
    _, grad = compute_grad(cell, z, r, *others, backend=backend)

    def f(zz):
        return np.stack(lstm_step(zz, f64(c_prev) if with_state else None))
    np.testing.assert_allclose(grad, fd_grad(f, z, f64(r)), rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("units, batch", [(3, 2), (65, 3)])
def test_the_split_pre_activations_add_inside_and_both_get_the_gradient(units, batch, backend):
    """x + r formed by the op: the forward of z = x + r, and the gradients of x and of r each that of z."""
    rng = np.random.default_rng(units * 7 + batch)
    x = rng.normal(size=(batch, 4 * units)).astype(np.float32)
    rr = rng.normal(size=(batch, 4 * units)).astype(np.float32)
    c_prev = rng.normal(size=(batch, units)).astype(np.float32)
    (out,) = compute(split_cell, x, rr, c_prev, backend=backend)
    h, c = lstm_step(f64(x) + f64(rr), f64(c_prev))
    np.testing.assert_allclose(out[0], np.stack([h, c]), rtol=1e-5, atol=2e-6)
    w = rng.uniform(-1, 1, size=(2, batch, units)).astype(np.float32)
    fd = fd_grad(lambda xx: np.stack(lstm_step(xx + f64(rr), f64(c_prev))), x, f64(w))
    _, gx = compute_grad(split_cell, x, w, rr, c_prev, backend=backend)
    _, gr = compute_grad(lambda ctx, rt, xt, ct: G.ggml_lstm_cell(ctx, xt, rt, ct), rr, w, x, c_prev, backend=backend)
    np.testing.assert_allclose(gx, fd, rtol=1e-4, atol=2e-5)
    np.testing.assert_allclose(gr, fd, rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("units", [4, 65])
def test_gradient_of_the_previous_state_matches_finite_differences(units, backend):
    rng = np.random.default_rng(units)
    z = rng.normal(size=(3, 4 * units)).astype(np.float32)
    c_prev = rng.normal(size=(3, units)).astype(np.float32)
    r = rng.uniform(-1, 1, size=(2, 3, units)).astype(np.float32)
    _, grad = compute_grad(lambda ctx, c, zt: G.ggml_lstm_cell(ctx, zt, c_prev=c), c_prev, r, z, backend=backend)
    fd = fd_grad(lambda cc: np.stack(lstm_step(f64(z), cc)), c_prev, f64(r))
    np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=2e-5)
    assert np.abs(fd).max() > 0.1


def test_two_chained_steps_train_a_shared_recurrent_weight(backend):
    """Gradients through h and c of a step into the next one and into a weight used by both (the layer's use)."""
    rng = np.random.default_rng(7)
    units, batch = 6, 4
    w = rng.normal(scale=0.5, size=(4 * units, units)).astype(np.float32)     # ggml [U, 4U]: mul_mat gives w^T h
    x = rng.normal(size=(2, batch, 4 * units)).astype(np.float32)
    r = rng.uniform(-1, 1, size=(batch, units)).astype(np.float32)
    nbytes = units * batch * 4

    def build(ctx, wt, xt):
        x0 = G.ggml_view_2d(ctx, xt, 4 * units, batch, 4 * units * 4, 0)
        x1 = G.ggml_view_2d(ctx, xt, 4 * units, batch, 4 * units * 4, 4 * units * batch * 4)
        first = G.ggml_lstm_cell(ctx, G.ggml_cont(ctx, x0))
        h0 = G.ggml_view_2d(ctx, first, units, batch, units * 4, 0)
        c0 = G.ggml_view_2d(ctx, first, units, batch, units * 4, nbytes)
        second = G.ggml_lstm_cell(ctx, G.ggml_cont(ctx, x1), G.ggml_mul_mat(ctx, wt, h0), G.ggml_cont(ctx, c0))
        return G.ggml_view_2d(ctx, second, units, batch, units * 4, 0)

    def f(ww):
        h0, c0 = lstm_step(f64(x[0]))
        return lstm_step(f64(x[1]) + h0 @ ww.T, c0)[0]
    _, grad = compute_grad(build, w, r, x, backend=backend)
    np.testing.assert_allclose(grad, fd_grad(f, w, f64(r)), rtol=1e-4, atol=2e-5)


def test_operands_are_checked_before_ggml():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        z = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 3)
        with pytest.raises(ValueError, match=r"x must be a matrix \[4 \* units, batch\], got shape \[6, 3, 1, 1\]"):
            G.ggml_lstm_cell(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 3))
        with pytest.raises(ValueError, match=r"c_prev must have shape \[2, 3\]"):
            G.ggml_lstm_cell(ctx, z, c_prev=G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2))
        with pytest.raises(ValueError, match=r"r must have x's shape \[8, 3\], got \[8, 2, 1, 1\]"):
            G.ggml_lstm_cell(ctx, z, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 2))
        with pytest.raises(ValueError, match="contiguous"):
            G.ggml_lstm_cell(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 8)))
        with pytest.raises(TypeError, match="x must be f32, got f16"):
            G.ggml_lstm_cell(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 8, 3))
    finally:
        ctx.free()


def gru_step(x, hp, h_prev=None):
    """numpy float64 reference of Keras' GRU step (reset_after=True): x, hp (batch, 3 units), gates z, r, c."""
    units = x.shape[-1] // 3
    part = lambda a, k: a[..., k * units:(k + 1) * units]   # noqa: E731
    z, r = sigmoid(part(x, 0) + part(hp, 0)), sigmoid(part(x, 1) + part(hp, 1))
    c = np.tanh(part(x, 2) + r * part(hp, 2))
    return z * (0.0 if h_prev is None else h_prev) + (1 - z) * c


@pytest.mark.parametrize("units, batch", [(1, 1), (5, 3), (67, 4)])
@pytest.mark.parametrize("with_state", [True, False])
def test_gru_forward_and_every_gradient_match_numpy(units, batch, with_state, backend):
    rng = np.random.default_rng(units * 3 + batch)
    x = rng.normal(scale=1.5, size=(batch, 3 * units)).astype(np.float32)
    hp = rng.normal(scale=1.5, size=(batch, 3 * units)).astype(np.float32)
    h_prev = rng.normal(size=(batch, units)).astype(np.float32)
    state = (h_prev,) if with_state else ()
    ref_state = f64(h_prev) if with_state else None
    (out,) = compute(lambda ctx, a, b, *h: G.ggml_gru_cell(ctx, a, b, *h), x, hp, *state, backend=backend)
    np.testing.assert_allclose(out[0, 0], gru_step(f64(x), f64(hp), ref_state), rtol=1e-5, atol=2e-6)
    if units > 5:
        return   # the finite differences below are one forward pass per element
    w = rng.uniform(-1, 1, size=(batch, units)).astype(np.float32)
    _, gx = compute_grad(lambda ctx, a, b, *h: G.ggml_gru_cell(ctx, a, b, *h), x, w, hp, *state, backend=backend)
    np.testing.assert_allclose(gx, fd_grad(lambda a: gru_step(a, f64(hp), ref_state), x, f64(w)),
                               rtol=1e-4, atol=2e-5)
    _, gh = compute_grad(lambda ctx, b, a, *h: G.ggml_gru_cell(ctx, a, b, *h), hp, w, x, *state, backend=backend)
    np.testing.assert_allclose(gh, fd_grad(lambda b: gru_step(f64(x), b, ref_state), hp, f64(w)),
                               rtol=1e-4, atol=2e-5)
    if with_state:
        _, gs = compute_grad(lambda ctx, h, a, b: G.ggml_gru_cell(ctx, a, b, h), h_prev, w, x, hp, backend=backend)
        np.testing.assert_allclose(gs, fd_grad(lambda h: gru_step(f64(x), f64(hp), h), h_prev, f64(w)),
                                   rtol=1e-4, atol=2e-5)


def test_gru_operands_are_checked_before_ggml():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        x = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 3)
        with pytest.raises(ValueError, match=r"x must be a matrix \[3 \* units, batch\], got shape \[8, 3, 1, 1\]"):
            G.ggml_gru_cell(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 3), x)
        with pytest.raises(ValueError, match=r"hp must have x's shape \[6, 3\]"):
            G.ggml_gru_cell(ctx, x, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 1))
        with pytest.raises(ValueError, match=r"h_prev must have shape \[2, 3\]"):
            G.ggml_gru_cell(ctx, x, x, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2))
    finally:
        ctx.free()


# ---------------------------------------------------------------- ggml_lstm_seq (patches/0035)

def lstm_sequence(x, u, h0=None, c0=None, reverse=False):
    """numpy float64 reference of Keras' LSTM recurrence: x (steps, batch, 4 units) the input projections, u
    (4 units, units) the recurrent kernel as ggml stores it (z = x_t + h u^T) -> h, c (steps, batch, units), in
    time order; reverse runs the steps last to first (Keras' go_backwards)."""
    steps, batch, width = x.shape
    units = width // 4
    h = np.zeros((batch, units)) if h0 is None else h0
    c = None if c0 is None else c0
    hs, cs = np.zeros((steps, batch, units)), np.zeros((steps, batch, units))
    for t in (reversed(range(steps)) if reverse else range(steps)):
        h, c = lstm_step(x[t] + h @ u.T, c)
        hs[t], cs[t] = h, c
    return hs, cs


def seq_op(reverse):
    return lambda ctx, x, u, *states: G.ggml_lstm_seq(ctx, x, u, *states, reverse=reverse)


def seq_case(units, batch, steps, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(steps, batch, 4 * units)).astype(np.float32)
    u = rng.normal(scale=0.6 / np.sqrt(units), size=(4 * units, units)).astype(np.float32)
    h0 = rng.normal(size=(batch, units)).astype(np.float32)
    c0 = rng.normal(size=(batch, units)).astype(np.float32)
    return x, u, h0, c0


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (16, 2, 1), (64, 8, 6), (67, 5, 3),
                                                 (130, 9, 2), (3, 1, 5)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_forward_matches_numpy_float64(units, batch, steps, with_state, reverse, backend):
    x, u, h0, c0 = seq_case(units, batch, steps, units * 100 + batch * 10 + steps)
    states = (h0, c0) if with_state else ()
    (out,) = compute(seq_op(reverse), x, u, *states, backend=backend)
    h, c = lstm_sequence(f64(x), f64(u), *map(f64, states), reverse=reverse)
    assert out.shape == (6, steps, batch, units)
    np.testing.assert_allclose(out[0], h, rtol=1e-5, atol=3e-6)
    np.testing.assert_allclose(out[1], c, rtol=1e-5, atol=3e-6)


def seq_weights(rng, steps, batch, units):
    """Loss weights on h and c of every step; none on the gate planes, which are not a result."""
    w = rng.uniform(-1, 1, size=(6, steps, batch, units)).astype(np.float32)
    w[2:] = 0
    return w


def seq_planes(x, u, h0, c0, reverse):
    h, c = lstm_sequence(x, u, h0, c0, reverse)
    return np.concatenate([np.stack([h, c]), np.zeros((4,) + h.shape)])


def check_sequence_gradients(op, planes, arrays, names, w, backend, fd_names=None, placed=None):
    """The gradient of each operand in ``names`` through ``op(ctx, **operands)`` (loss weights ``w`` on its result)
    against finite differences of the float64 reference ``planes(**operands)``; the operands not in ``names`` are
    left out (None). ``fd_names``: the operands whose gradients are compared (default all); ``placed(placement)``:
    a check of where each gradient's graph ran."""
    ref = {k: f64(arrays[k]) for k in names}
    for name in names:
        others = [k for k in names if k != name]

        def build(ctx, target, *rest, name=name, others=others):
            return op(ctx, **dict(zip(others, rest), **{name: target}))
        places: list = []
        _, grad = compute_grad(build, arrays[name], w, *(arrays[k] for k in others), backend=backend,
                               placements=places)
        if placed is not None:
            placed(places[-1])
        if fd_names is not None and name not in fd_names:
            continue
        fd = fd_grad(lambda v, name=name: planes(**{**ref, name: v}), arrays[name], f64(w))
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=2e-5, err_msg=name)
        assert np.abs(fd).max() > 1e-2, name


def lstm_seq_op(reverse):
    return lambda ctx, x, u, h0=None, c0=None: G.ggml_lstm_seq(ctx, x, u, h0, c0, reverse=reverse)


def lstm_seq_planes(reverse):
    return lambda x, u, h0=None, c0=None: seq_planes(x, u, h0, c0, reverse)


def gru_seq_op(reverse):
    return lambda ctx, x, u, b=None, h0=None: G.ggml_gru_seq(ctx, x, u, b, h0, reverse=reverse)


def gru_seq_planes(reverse, steps, batch, units):
    return lambda x, u, b=None, h0=None: np.concatenate([gru_sequence(x, u, b, h0, reverse)[None],
                                                         np.zeros((4, steps, batch, units))])


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_gradients_match_finite_differences(units, batch, steps, with_state, reverse, backend):
    """The gradients of x, u (one product over all steps), h0 and c0, through h and c of every step."""
    x, u, h0, c0 = seq_case(units, batch, steps, units + batch + steps)
    w = seq_weights(np.random.default_rng(units), steps, batch, units)
    check_sequence_gradients(lstm_seq_op(reverse), lstm_seq_planes(reverse), dict(x=x, u=u, h0=h0, c0=c0),
                             ["x", "u"] + (["h0", "c0"] if with_state else []), w, backend)


def test_sequence_gradient_of_the_last_state_alone(backend):
    """A loss on the last processed state only (the layer's return_sequences=False): the gradient flows back
    through every step."""
    units, batch, steps = 4, 3, 6
    x, u, _, _ = seq_case(units, batch, steps, 11)
    w = np.zeros((6, steps, batch, units), np.float32)
    w[0, -1] = np.random.default_rng(1).uniform(-1, 1, size=(batch, units))
    _, gx = compute_grad(seq_op(False), x, w, u, backend=backend)
    fd = fd_grad(lambda v: seq_planes(v, f64(u), None, None, False), x, f64(w))
    np.testing.assert_allclose(gx, fd, rtol=1e-4, atol=2e-5)
    assert np.abs(gx[0]).max() > 1e-3   # the first step's input reaches the last state


def test_sequence_operands_are_checked_before_ggml():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 3, 5)
        u = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 8)
        with pytest.raises(ValueError, match=r"x must be \[4 \* units, batch, steps\], got shape \[6, 3, 5, 1\]"):
            G.ggml_lstm_seq(ctx, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 6, 3, 5), u)
        with pytest.raises(ValueError, match=r"u must have shape \[2, 8\] \(units, 4 \* units\)"):
            G.ggml_lstm_seq(ctx, x, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 8, 2))
        with pytest.raises(ValueError, match=r"h0 must have shape \[2, 3\] \(units, batch\)"):
            G.ggml_lstm_seq(ctx, x, u, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 4))
        with pytest.raises(ValueError, match=r"c0 must have shape \[2, 3\]"):
            G.ggml_lstm_seq(ctx, x, u, None, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 2))
        with pytest.raises(ValueError, match="contiguous"):
            G.ggml_lstm_seq(ctx, G.ggml_permute(ctx, x, 0, 2, 1, 3), u)
        with pytest.raises(TypeError, match="reverse must be True or False"):
            G.ggml_lstm_seq(ctx, x, u, reverse=1)
        with pytest.raises(TypeError, match="u must be f32, got f16"):
            G.ggml_lstm_seq(ctx, x, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 2, 8))
    finally:
        ctx.free()


# ---------------------------------------------------------------- ggml_gru_seq (patches/0037)

def gru_sequence(x, u, b=None, h0=None, reverse=False):
    """numpy float64 reference of Keras' GRU recurrence (reset_after=True): x (steps, batch, 3 units) the input
    projections, u (3 units, units) the recurrent kernel as ggml stores it, b (3 units,) the recurrent bias ->
    h (steps, batch, units) in time order."""
    steps, batch, width = x.shape
    units = width // 3
    h = np.zeros((batch, units)) if h0 is None else h0
    hs = np.zeros((steps, batch, units))
    for t in (reversed(range(steps)) if reverse else range(steps)):
        h = gru_step(x[t], h @ u.T + (0.0 if b is None else b), h)
        hs[t] = h
    return hs


def gru_case(units, batch, steps, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(steps, batch, 3 * units)).astype(np.float32),
            rng.normal(scale=0.6 / np.sqrt(units), size=(3 * units, units)).astype(np.float32),
            rng.normal(scale=0.5, size=(3 * units,)).astype(np.float32),
            rng.normal(size=(batch, units)).astype(np.float32))


def gru_op(reverse, with_b, with_h0):
    def build(ctx, x, u, *rest):
        rest = list(rest)
        b = rest.pop(0) if with_b else None
        h0 = rest.pop(0) if with_h0 else None
        return G.ggml_gru_seq(ctx, x, u, b, h0, reverse=reverse)
    return build


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (16, 2, 1), (64, 8, 6), (67, 5, 3), (3, 1, 5)])
@pytest.mark.parametrize("with_b, with_h0", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_forward_matches_numpy_float64(units, batch, steps, with_b, with_h0, reverse, backend):
    x, u, b, h0 = gru_case(units, batch, steps, units * 100 + batch * 10 + steps)
    extra = ([b] if with_b else []) + ([h0] if with_h0 else [])
    (out,) = compute(gru_op(reverse, with_b, with_h0), x, u, *extra, backend=backend)
    want = gru_sequence(f64(x), f64(u), f64(b) if with_b else None, f64(h0) if with_h0 else None, reverse)
    assert out.shape == (5, steps, batch, units)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=3e-6)


def gru_weights(units, batch, steps):
    """Loss weights on every step's h; none on the gate planes, which are not a result."""
    w = np.zeros((5, steps, batch, units), np.float32)
    w[0] = np.random.default_rng(units).uniform(-1, 1, size=(steps, batch, units))
    return w


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_gradients_match_finite_differences(units, batch, steps, reverse, backend):
    """The gradients of x, u (one product over all steps), b (one sum) and h0, through every step's h."""
    x, u, b, h0 = gru_case(units, batch, steps, units + batch + steps)
    check_sequence_gradients(gru_seq_op(reverse), gru_seq_planes(reverse, steps, batch, units),
                             dict(x=x, u=u, b=b, h0=h0), ["x", "u", "b", "h0"], gru_weights(units, batch, steps),
                             backend)


def test_gru_sequence_operands_are_checked_before_ggml():
    ctx = G.ggml_init(1 << 20, no_alloc=True)
    try:
        x = G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 6, 3, 5)
        u = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 6)
        with pytest.raises(ValueError, match=r"x must be \[3 \* units, batch, steps\], got shape \[8, 3, 5, 1\]"):
            G.ggml_gru_seq(ctx, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 8, 3, 5), u)
        with pytest.raises(ValueError, match=r"u must have shape \[2, 6\] \(units, 3 \* units\)"):
            G.ggml_gru_seq(ctx, x, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 6, 2))
        with pytest.raises(ValueError, match=r"b must have shape \[6\]"):
            G.ggml_gru_seq(ctx, x, u, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 6))
        with pytest.raises(ValueError, match=r"h0 must have shape \[2, 3\]"):
            G.ggml_gru_seq(ctx, x, u, None, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 4))
        with pytest.raises(TypeError, match="reverse must be True or False"):
            G.ggml_gru_seq(ctx, x, u, reverse="yes")
    finally:
        ctx.free()
