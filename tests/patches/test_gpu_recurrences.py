"""patches/0049 (Vulkan) and 0053 (CUDA): the whole LSTM and GRU recurrences (GGML_OP_LSTM_SEQ, GGML_OP_GRU_SEQ)
and their backward passes on a GPU, one dispatch each (a workgroup, or a CUDA block, per batch column runs every
step), where the CPU's ops were the only ones and a GPU model unrolled the recurrence into an element-wise chain
per step (1,449 dispatches per training step for an LSTM(64) over 40 steps).

Checked as the CPU ops are (tests/ops/test_recurrent.py's numpy float64 references and finite differences), on
Vulkan0 and CUDA0: the forward planes (LSTM h and c, GRU h), and the gradients of every operand (LSTM x, u, h0, c0;
GRU x, u, b, h0) through every step's state, forward and reverse, with and without initial states (and the GRU's
bias), units across the 256 invocations of a workgroup or threads of a block (1 to 300); and that both ops ran on
the device. Tolerance as the CPU's on both devices (rtol 1e-5 forward, 1e-4 against finite differences): float32
products of n terms in another order, and exp-based sigmoid and tanh within a few ulp of numpy's (CUDA builds with
-use_fast_math, whose expf is __expf: 2 + 1.16 |x| ulp, a few ulp at the gates' arguments here).
"""
from __future__ import annotations

import numpy as np
import pytest

import ggmlpy as G
from tests.helpers.compute import compute
from tests.helpers.devices import require_gpu
from tests.helpers.gradients import f64
from tests.ops.test_recurrent import (
    check_sequence_gradients,
    gru_case,
    gru_op,
    gru_seq_op,
    gru_seq_planes,
    gru_sequence,
    gru_weights,
    lstm_seq_op,
    lstm_seq_planes,
    lstm_sequence,
    seq_case,
    seq_op,
    seq_weights,
)


@pytest.fixture(scope="module", params=["Vulkan0", "CUDA0"])
def gpu(request):
    """The device's backend and the CPU's (a scheduler's backends), and the device's name."""
    require_gpu(request.param)
    dev, cpu = G.ggml_backend_init_by_name(request.param), G.ggml_backend_cpu_init()
    yield request.param, [dev, cpu]
    dev.free()
    cpu.free()


def _on_device(name, where, *ops):
    for op in ops:
        assert where.op_counts(name)[op] == 1 and op not in where.cpu_ops, (op, where)


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (64, 8, 6), (67, 5, 3), (300, 2, 2),
                                                 (3, 1, 5)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_forward_matches_numpy_float64_on_gpu(units, batch, steps, with_state, reverse, gpu):
    x, u, h0, c0 = seq_case(units, batch, steps, units * 100 + batch * 10 + steps)
    states = (h0, c0) if with_state else ()
    places: list = []
    (out,) = compute(seq_op(reverse), x, u, *states, backend=gpu[1], placements=places)
    h, c = lstm_sequence(f64(x), f64(u), *map(f64, states), reverse=reverse)
    assert out.shape == (6, steps, batch, units)
    np.testing.assert_allclose(out[0], h, rtol=1e-5, atol=3e-6)
    np.testing.assert_allclose(out[1], c, rtol=1e-5, atol=3e-6)
    _on_device(gpu[0], places[-1], "LSTM_SEQ")


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2), (260, 1, 2)])
@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_sequence_gradients_match_finite_differences_on_gpu(units, batch, steps, with_state, reverse, gpu):
    """The gradients of x, u (one product over all steps), h0 and c0, through h and c of every step; for a large
    kernel only x's against finite differences (every weight's would be slow), all computed on the device."""
    x, u, h0, c0 = seq_case(units, batch, steps, units + batch + steps)
    w = seq_weights(np.random.default_rng(units), steps, batch, units)
    check_sequence_gradients(lstm_seq_op(reverse), lstm_seq_planes(reverse), dict(x=x, u=u, h0=h0, c0=c0),
                             ["x", "u"] + (["h0", "c0"] if with_state else []), w, gpu[1],
                             fd_names=["x"] if units > 100 else None,
                             placed=lambda p: _on_device(gpu[0], p, "LSTM_SEQ", "LSTM_SEQ_BACK"))


@pytest.mark.parametrize("units, batch, steps", [(1, 1, 1), (5, 3, 4), (64, 8, 6), (67, 5, 3), (300, 2, 2), (3, 1, 5)])
@pytest.mark.parametrize("with_b, with_h0", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_forward_matches_numpy_float64_on_gpu(units, batch, steps, with_b, with_h0, reverse, gpu):
    x, u, b, h0 = gru_case(units, batch, steps, units * 100 + batch * 10 + steps)
    extra = ([b] if with_b else []) + ([h0] if with_h0 else [])
    places: list = []
    (out,) = compute(gru_op(reverse, with_b, with_h0), x, u, *extra, backend=gpu[1], placements=places)
    want = gru_sequence(f64(x), f64(u), f64(b) if with_b else None, f64(h0) if with_h0 else None, reverse)
    assert out.shape == (5, steps, batch, units)
    np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=3e-6)
    _on_device(gpu[0], places[-1], "GRU_SEQ")


@pytest.mark.parametrize("units, batch, steps", [(3, 2, 3), (2, 3, 4), (17, 1, 2), (260, 1, 2)])
@pytest.mark.parametrize("with_h0", [True, False])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_gru_sequence_gradients_match_finite_differences_on_gpu(units, batch, steps, with_h0, reverse, gpu):
    """The gradients of x, u (one product over all steps), b (one sum) and h0, through every step's h."""
    x, u, b, h0 = gru_case(units, batch, steps, units + batch + steps)
    check_sequence_gradients(gru_seq_op(reverse), gru_seq_planes(reverse, steps, batch, units),
                             dict(x=x, u=u, b=b, h0=h0), ["x", "u", "b"] + (["h0"] if with_h0 else []),
                             gru_weights(units, batch, steps), gpu[1], fd_names=["x"] if units > 100 else None,
                             placed=lambda p: _on_device(gpu[0], p, "GRU_SEQ", "GRU_SEQ_BACK"))
