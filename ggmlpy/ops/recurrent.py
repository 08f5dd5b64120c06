"""Recurrent cells fused into one op (patches/0031): an LSTM or GRU time step and its backward on the CPU."""
from __future__ import annotations

from typing import Any

from .._ffi import lib
from ..core.args import fail
from ..core.types import GGML_TYPE_F32
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import contiguous, make_op, operand


def _matrix_of_gates(fn: str, x: Any, gates: int) -> tuple[Tensor, int, int]:
    """``x`` checked as a contiguous F32 ``[gates * units, batch]``: (x, units, batch)."""
    x = operand(fn, x, "x")
    _base.types(fn, x, {GGML_TYPE_F32}, "x")
    contiguous(fn, x, "x")
    rows, batch, *rest = x.shape
    if any(d != 1 for d in rest) or rows % gates:
        fail(fn, f"x must be a matrix [{gates} * units, batch], got shape {list(x.shape)}")
    return x, rows // gates, batch


def _like(fn: str, t: Any, what: str, shape: tuple, text: str) -> Tensor:
    """An F32 contiguous operand of ``shape`` (ggml order, as ``Tensor.shape``)."""
    t = operand(fn, t, what)
    _base.types(fn, t, {GGML_TYPE_F32}, what)
    contiguous(fn, t, what)
    if tuple(t.shape) != shape:
        fail(fn, f"{what} must have {text}, got {list(t.shape)}")
    return t


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
    x, units, batch = _matrix_of_gates(fn, x, 4)
    if r is not None:
        r = _like(fn, r, "r", tuple(x.shape), f"x's shape {list(x.shape[:2])}")
    if c_prev is not None:
        c_prev = _like(fn, c_prev, "c_prev", (units, batch, 1, 1),
                       f"shape [{units}, {batch}] (units, batch) for x of shape {list(x.shape[:2])}")
    return make_op(fn, ctx, lib.ggml_lstm_cell, (x, r, c_prev), (units, batch, 2))


def ggml_gru_cell(ctx: Context, x: Tensor, hp: Tensor, h_prev: Tensor | None = None) -> Tensor:
    """One GRU time step (Keras' ``reset_after=True``, its default), in one node (and one node backward).

    ``x`` is the step's input projection ``x W + b_in`` and ``hp`` the recurrent one ``h U + b_rec``, the three
    gates stacked in Keras' order: update ``z``, reset ``r``, candidate. Computes ``z = sigmoid(x_z + hp_z)``,
    ``r = sigmoid(x_r + hp_r)``, ``c = tanh(x_c + r * hp_c)`` and ``h = z * h_prev + (1 - z) * c``.
    Differentiable in ``x``, ``hp`` and ``h_prev``. Only the CPU backend computes it (patches/0031); for a GPU
    build the step from the element-wise ops.

    Arguments:
        ctx: [glossary]
        x: F32 contiguous matrix ``[3 * units, batch]``.
        hp: F32 contiguous, x's shape (for the first step, whose state is zero: the recurrent bias repeated
            over the batch, ``ggml_repeat(ctx, b_rec, x)``).
        h_prev: F32 contiguous ``[units, batch]``, or None for a zero state (the first step).

    Value: a new F32 Tensor ``[units, batch]``, the new state ``h``.

    Example:
        >>> h = ggml_gru_cell(ctx, x_proj, ggml_add(ctx, ggml_mul_mat(ctx, u_kernel, h), b_rec), h)
    """
    fn = "ggml_gru_cell"
    x, units, batch = _matrix_of_gates(fn, x, 3)
    hp = _like(fn, hp, "hp", tuple(x.shape), f"x's shape {list(x.shape[:2])}")
    if h_prev is not None:
        h_prev = _like(fn, h_prev, "h_prev", (units, batch, 1, 1),
                       f"shape [{units}, {batch}] (units, batch) for x of shape {list(x.shape[:2])}")
    return make_op(fn, ctx, lib.ggml_gru_cell, (x, hp, h_prev), (units, batch))
