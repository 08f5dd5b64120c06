"""patches/0049: the whole LSTM and GRU recurrences (GGML_OP_LSTM_SEQ, GGML_OP_GRU_SEQ) and their backward passes on
Vulkan, one dispatch each (a workgroup per batch column runs every step), where the CPU's ops were the only ones and
a Vulkan model unrolled the recurrence into an element-wise chain per step (1,449 dispatches per training step for
an LSTM(64) over 40 steps).

Checked as the CPU ops are (tests/ops/test_recurrent.py's numpy float64 references and finite differences), on
Vulkan0: the forward planes (LSTM h and c, GRU h), and the gradients of every operand (LSTM x, u, h0, c0; GRU x, u,
b, h0) through every step's state, forward and reverse, with and without initial states (and the GRU's bias), units
across the 256 invocations of a workgroup (1 to 300); and that both ops ran on the device. Tolerance as the CPU's
(rtol 1e-5 forward, 1e-4 against finite differences): float32 products of n terms in another order, and exp-based
sigmoid and tanh within a few ulp of numpy's.
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute, compute_grad
from tests.helpers.devices import require_gpu
from tests.helpers.gradients import f64, fd_grad
from tests.ops.test_recurrent import (
    gru_case,
    gru_op,
    gru_sequence,
    lstm_sequence,
    seq_case,
    seq_op,
    seq_planes,
    seq_weights,
)


pytestmark = pytest.mark.vulkan


@pytest.fixture(scope="module")
def vulkan():
    require_gpu("Vulkan0")
    vk, cpu = G.ggml_backend_init_by_name("Vulkan0"), G.ggml_backend_cpu_init()
    yield [vk, cpu]
    vk.free()
    cpu.free()


def _on_device(places, *ops):
    where = places[-1]
    for op in ops:
        assert where.op_counts("Vulkan0")[op] == 1 and op not in where.cpu_ops, (op, where)


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (64, 8, 6), (67, 5, 3), (300, 2, 2),
                                                 (3, 1, 5)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_forward_matches_numpy_float64_on_vulkan(units, batch, steps, with_state, reverse, vulkan):
    x, u, h0, c0 = seq_case(units, batch, steps, units * 100 + batch * 10 + steps)
    states = (h0, c0) if with_state else ()
    places: list = []
    (out,) = compute(seq_op(reverse), x, u, *states, backend=vulkan, placements=places)
    h, c = lstm_sequence(f64(x), f64(u), *map(f64, states), reverse=reverse)
    assert out.shape == (6, steps, batch, units)
    np.testing.assert_allclose(out[0], h, rtol=1e-5, atol=3e-6)
    np.testing.assert_allclose(out[1], c, rtol=1e-5, atol=3e-6)
    _on_device(places, "LSTM_SEQ")


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2), (260, 1, 2)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_gradients_match_finite_differences_on_vulkan(units, batch, steps, with_state, reverse, vulkan):
    """The gradients of x, u (one product over all steps), h0 and c0, through h and c of every step."""
    x, u, h0, c0 = seq_case(units, batch, steps, units + batch + steps)
    w = seq_weights(np.random.default_rng(units), steps, batch, units)
    ref = dict(x=f64(x), u=f64(u), h0=f64(h0) if with_state else None, c0=f64(c0) if with_state else None)
    names = ["x", "u"] + (["h0", "c0"] if with_state else [])
    arrays = dict(x=x, u=u, h0=h0, c0=c0)
    for name in names:
        others = [n for n in names if n != name]

        def build(ctx, target, *rest, name=name, others=others):
            t = dict(zip(others, rest), **{name: target})
            return G.ggml_lstm_seq(ctx, t["x"], t["u"], t.get("h0"), t.get("c0"), reverse=reverse)
        places: list = []
        _, grad = compute_grad(build, arrays[name], w, *(arrays[n] for n in others), backend=vulkan,
                               placements=places)
        _on_device(places, "LSTM_SEQ", "LSTM_SEQ_BACK")
        if units > 100 and name != "x":
            continue   # finite differences of every weight of a large kernel: x's gradient covers the large case
        fd = fd_grad(lambda v, name=name: seq_planes(**{**ref, name: v}, reverse=reverse), arrays[name], f64(w))
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=2e-5, err_msg=name)
        assert np.abs(fd).max() > 1e-2, name


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (64, 8, 6), (67, 5, 3), (300, 2, 2), (3, 1, 5)])
@pytest.mark.parametrize("with_b, with_h0", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_forward_matches_numpy_float64_on_vulkan(units, batch, steps, with_b, with_h0, reverse, vulkan):
    x, u, b, h0 = gru_case(units, batch, steps, units * 100 + batch * 10 + steps)
    extra = ([b] if with_b else []) + ([h0] if with_h0 else [])
    places: list = []
    (out,) = compute(gru_op(reverse, with_b, with_h0), x, u, *extra, backend=vulkan, placements=places)
    want = gru_sequence(f64(x), f64(u), f64(b) if with_b else None, f64(h0) if with_h0 else None, reverse)
    assert out.shape == (5, steps, batch, units)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=3e-6)
    _on_device(places, "GRU_SEQ")


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2), (260, 1, 2)])
@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_gradients_match_finite_differences_on_vulkan(units, batch, steps, with_h0, reverse, vulkan):
    """The gradients of x, u (one product over all steps), b (one sum) and h0, through every step's h."""
    x, u, b, h0 = gru_case(units, batch, steps, units + batch + steps)
    w = np.zeros((5, steps, batch, units), np.float32)
    w[0] = np.random.default_rng(units).uniform(-1, 1, size=(steps, batch, units))
    ref = dict(x=f64(x), u=f64(u), b=f64(b), h0=f64(h0) if with_h0 else None)
    arrays = dict(x=x, u=u, b=b, h0=h0)
    names = ["x", "u", "b"] + (["h0"] if with_h0 else [])

    def planes(x, u, b, h0=None):
        return np.concatenate([gru_sequence(x, u, b, h0, reverse)[None], np.zeros((4, steps, batch, units))])
    for name in names:
        others = [k for k in names if k != name]

        def build(ctx, target, *rest, name=name, others=others):
            t = dict(zip(others, rest), **{name: target})
            return G.ggml_gru_seq(ctx, t["x"], t["u"], t["b"], t.get("h0"), reverse=reverse)
        places: list = []
        _, grad = compute_grad(build, arrays[name], w, *(arrays[k] for k in others), backend=vulkan,
                               placements=places)
        _on_device(places, "GRU_SEQ", "GRU_SEQ_BACK")
        if units > 100 and name != "x":
            continue   # x's gradient covers the large case
        fd = fd_grad(lambda v, name=name: planes(**{**ref, name: v}), arrays[name], f64(w))
        np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=2e-5, err_msg=name)
        assert np.abs(fd).max() > 1e-2, name
