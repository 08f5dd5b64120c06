"""Recurrent cells fused into one op (patches/0031): an LSTM time step and its backward on the CPU."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import fail
from ..core.types import GGML_TYPE_F32
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import contiguous, make_op, operand


def ggml_lstm_cell(ctx: Context, z: Tensor, c_prev: Tensor | None = None) -> Tensor:
    """One LSTM time step, its gates' activations and products in one node (and one node backward).

    From the pre-activations ``z`` (``x W + h U + b`` of the step, the four gates stacked in Keras' order:
    input, forget, cell, output) and the previous cell state, computes ``c = f * c_prev + i * g`` and
    ``h = o * tanh(c)`` with ``i, f, o`` sigmoids and ``g`` a tanh of their rows of ``z``. Differentiable in
    ``z`` and ``c_prev``. The same step built from ``ggml_sigmoid``, ``ggml_tanh``, views, ``ggml_mul`` and
    ``ggml_add`` is about 36 nodes forward and backward, each a pass over memory and a wait of the CPU's
    threads; this is one node each way.

    Only the CPU backend computes it (patches/0031): on a Vulkan or CUDA scheduler it would run on the CPU,
    so for a GPU build the step from the element-wise ops, which every backend has.

    Arguments:
        ctx: [glossary]
        z: F32 contiguous matrix ``[4 * units, batch]`` (ggml order: the gates' rows first).
        c_prev: F32 contiguous ``[units, batch]``, or None for a zero state (the first step).

    Value: a new F32 Tensor ``[units, batch, 2]``: plane 0 is ``h``, plane 1 is ``c``; take them with
    ``ggml_view_2d(ctx, cell, units, batch, units * 4, k * units * batch * 4)`` for ``k`` 0 and 1.

    Example:
        >>> cell = ggml_lstm_cell(ctx, ggml_add(ctx, x_proj, ggml_mul_mat(ctx, u_kernel, h)), c)
        >>> h = ggml_view_2d(ctx, cell, 64, 32, 64 * 4, 0)
    """
    fn = "ggml_lstm_cell"
    z = operand(fn, z, "z")
    _base.types(fn, z, {GGML_TYPE_F32}, "z")
    contiguous(fn, z, "z")
    rows, batch, *rest = z.shape
    if any(d != 1 for d in rest) or rows % 4:
        fail(fn, f"z must be a matrix [4 * units, batch], got shape {list(z.shape)}")
    units = rows // 4
    if c_prev is not None:
        c_prev = operand(fn, c_prev, "c_prev")
        _base.types(fn, c_prev, {GGML_TYPE_F32}, "c_prev")
        contiguous(fn, c_prev, "c_prev")
        if tuple(c_prev.shape) != (units, batch, 1, 1):
            fail(fn, f"c_prev must have shape [{units}, {batch}] (units, batch) for z of shape {list(z.shape[:2])}, "
                     f"got {list(c_prev.shape)}")
    return make_op(fn, ctx, lib.ggml_lstm_cell, (z, c_prev), (units, batch, 2))
