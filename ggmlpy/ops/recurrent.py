"""Recurrent cells fused into one op (patches/0031): an LSTM time step and its backward on the CPU."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import fail
from ..core.types import GGML_TYPE_F32
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import contiguous, make_op, operand


def ggml_lstm_cell(ctx: Context, x: Tensor, r: Tensor | None = None, c_prev: Tensor | None = None) -> Tensor:
    """One LSTM time step, its gates' activations and products in one node (and one node backward).

    From the pre-activations ``z = x + r`` (the step's input projection ``x W + b`` plus the recurrent product
    ``h U``, the four gates stacked in Keras' order: input, forget, cell, output; the sum is formed inside the
    op) and the previous cell state, computes ``c = f * c_prev + i * g`` and ``h = o * tanh(c)`` with
    ``i, f, o`` sigmoids and ``g`` a tanh of their rows of ``z``. Differentiable in ``x``, ``r`` and
    ``c_prev``. The same step built from ``ggml_add``, ``ggml_sigmoid``, ``ggml_tanh``, views and ``ggml_mul``
    is about 36 nodes forward and backward, each a pass over memory and a wait of the CPU's threads; this is
    one node each way.

    Only the CPU backend computes it (patches/0031): on a Vulkan or CUDA scheduler it would run on the CPU,
    so for a GPU build the step from the element-wise ops, which every backend has.

    Arguments:
        ctx: [glossary]
        x: F32 contiguous matrix ``[4 * units, batch]`` (ggml order: the gates' rows first).
        r: F32 contiguous, x's shape, added to ``x``; or None (the first step, whose state is zero).
        c_prev: F32 contiguous ``[units, batch]``, or None for a zero state (the first step).

    Value: a new F32 Tensor ``[units, batch, 2]``: plane 0 is ``h``, plane 1 is ``c``; take them with
    ``ggml_view_2d(ctx, cell, units, batch, units * 4, k * units * batch * 4)`` for ``k`` 0 and 1.

    Example:
        >>> cell = ggml_lstm_cell(ctx, x_proj, ggml_mul_mat(ctx, u_kernel, h), c)
        >>> h = ggml_view_2d(ctx, cell, 64, 32, 64 * 4, 0)
    """
    fn = "ggml_lstm_cell"
    x = operand(fn, x, "x")
    _base.types(fn, x, {GGML_TYPE_F32}, "x")
    contiguous(fn, x, "x")
    rows, batch, *rest = x.shape
    if any(d != 1 for d in rest) or rows % 4:
        fail(fn, f"x must be a matrix [4 * units, batch], got shape {list(x.shape)}")
    units = rows // 4
    if r is not None:
        r = operand(fn, r, "r")
        _base.types(fn, r, {GGML_TYPE_F32}, "r")
        contiguous(fn, r, "r")
        if tuple(r.shape) != tuple(x.shape):
            fail(fn, f"r must have x's shape {list(x.shape[:2])}, got {list(r.shape)}")
    if c_prev is not None:
        c_prev = operand(fn, c_prev, "c_prev")
        _base.types(fn, c_prev, {GGML_TYPE_F32}, "c_prev")
        contiguous(fn, c_prev, "c_prev")
        if tuple(c_prev.shape) != (units, batch, 1, 1):
            fail(fn, f"c_prev must have shape [{units}, {batch}] (units, batch) for x of shape {list(x.shape[:2])}, "
                     f"got {list(c_prev.shape)}")
    return make_op(fn, ctx, lib.ggml_lstm_cell, (x, r, c_prev), (units, batch, 2))
