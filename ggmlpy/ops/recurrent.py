"""Recurrent cells fused into one op on the CPU: an LSTM or GRU time step and its backward (patches/0031), and a
whole LSTM (patches/0035) or GRU (patches/0037) sequence and its backward."""
from __future__ import annotations

from .._ffi import lib
from ..core.args import fail
from ..core.types import GGML_TYPE_F32
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from . import base as _base
from .base import contiguous, make_op, operand


def _matrix_of_gates(fn: str, x: object, gates: int) -> tuple[Tensor, int, int]:
    """``x`` checked as a contiguous F32 ``[gates * units, batch]``: (x, units, batch)."""
    x = operand(fn, x, "x")
    _base.types(fn, x, {GGML_TYPE_F32}, "x")
    contiguous(fn, x, "x")
    rows, batch, *rest = x.shape
    if any(d != 1 for d in rest) or rows % gates:
        fail(fn, f"x must be a matrix [{gates} * units, batch], got shape {list(x.shape)}")
    return x, rows // gates, batch


def _like(fn: str, t: object, what: str, shape: tuple, text: str) -> Tensor:
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


def _sequence_operands(fn: str, x: object, u: object, gates: int, reverse: object) -> tuple:
    """A whole recurrence's projections ``x`` (contiguous F32 ``[gates * units, batch, steps]``), recurrent kernel
    ``u`` (``[units, gates * units]``) and ``reverse`` checked: (x, u, units, batch, steps)."""
    x = operand(fn, x, "x")
    _base.types(fn, x, {GGML_TYPE_F32}, "x")
    contiguous(fn, x, "x")
    rows, batch, steps, rest = x.shape
    if rest != 1 or rows % gates:
        fail(fn, f"x must be [{gates} * units, batch, steps], got shape {list(x.shape)}")
    units = rows // gates
    u = _like(fn, u, "u", (units, rows, 1, 1), f"shape [{units}, {rows}] (units, {gates} * units) for x of shape "
                                                 f"{list(x.shape[:3])}")
    if not isinstance(reverse, bool):
        fail(fn, f"reverse must be True or False, got {reverse!r}", GgmlTypeError)
    return x, u, units, batch, steps


def _initial_state(fn: str, s: object, what: str, x: Tensor, units: int, batch: int) -> Tensor | None:
    return None if s is None else _like(fn, s, what, (units, batch, 1, 1), f"shape [{units}, {batch}] (units, batch) "
                                                                           f"for x of shape {list(x.shape[:3])}")


def ggml_lstm_seq(ctx: Context, x: Tensor, u: Tensor, h0: Tensor | None = None, c0: Tensor | None = None,
                  reverse: bool = False) -> Tensor:
    """A whole LSTM recurrence over ``T`` steps in one node (and one node backward), on the CPU and Vulkan.

    ``x`` holds every step's input projection ``x_t W + b`` (the four gates stacked in Keras' order input,
    forget, cell, output); each step adds the recurrent product ``h_{t-1} U`` and computes
    ``c_t = f * c_{t-1} + i * g`` and ``h_t = o * tanh(c_t)`` (``i, f, o`` sigmoids, ``g`` a tanh). The CPU's
    threads each take a block of the batch and run every step on it, products included, without waiting for
    each other; the backward pass gives every step's gate gradient in one node, and the gradient of ``u`` is
    then one matrix product over all steps (``sum_t h_{t-1} dz_t^T``) instead of one per step. An LSTM unrolled
    into ``ggml_lstm_cell`` steps makes three matrix products, a cell and their joins per step, each ending at
    a wait of the threads.

    Differentiable in ``x``, ``u``, ``h0`` and ``c0``. The CPU (patches/0035) and Vulkan (patches/0049: one dispatch
    each way, a workgroup per batch column; up to 512 units) compute it; for another device (CUDA) build the steps
    from ``ggml_mul_mat`` and the element-wise ops, which every backend has.

    Arguments:
        ctx: [glossary]
        x: F32 contiguous ``[4 * units, batch, steps]`` (ggml order), the projections time-major.
        u: F32 contiguous ``[units, 4 * units]``, the recurrent kernel as ``ggml_mul_mat(ctx, u, h)`` takes it.
        h0: F32 contiguous ``[units, batch]``, the initial hidden state, or None for zeros.
        c0: F32 contiguous ``[units, batch]``, the initial cell state, or None for zeros.
        reverse: True processes the steps last to first (Keras' ``go_backwards``); the results stay in time
            order (``h_t`` at step ``t``), so the last state processed is step 0's.

    Value: a new F32 Tensor ``[units, batch, steps, 6]``: plane 0 holds ``h_t`` and plane 1 ``c_t`` of every
    step, in time order; planes 2 to 5 keep the gates for the backward pass and are not a result (their
    gradient is ignored). Take the hidden states with ``ggml_view_3d(ctx, seq, units, batch, steps,
    units * 4, units * batch * 4, 0)``.

    Example:
        >>> seq = ggml_lstm_seq(ctx, proj, u_kernel)           # proj [256, 32, 40]: 64 units, batch 32
        >>> last_h = ggml_view_2d(ctx, seq, 64, 32, 64 * 4, 39 * 64 * 32 * 4)
    """
    fn = "ggml_lstm_seq"
    x, u, units, batch, steps = _sequence_operands(fn, x, u, 4, reverse)
    h0, c0 = (_initial_state(fn, s, what, x, units, batch) for what, s in (("h0", h0), ("c0", c0)))
    return make_op(fn, ctx, lib.ggml_lstm_seq, (x, u, h0, c0), (units, batch, steps, 6), (reverse,))


def ggml_gru_seq(ctx: Context, x: Tensor, u: Tensor, b: Tensor | None = None, h0: Tensor | None = None,
                 reverse: bool = False) -> Tensor:
    """A whole GRU recurrence over ``T`` steps in one node (and one node backward), on the CPU and Vulkan.

    Keras' GRU with ``reset_after=True`` (its default): ``x`` holds every step's input projection ``x_t W + b_in``
    (the three gates stacked in Keras' order update ``z``, reset ``r``, candidate); each step computes the recurrent
    projection ``hp = h_{t-1} U + b`` and ``z = sigmoid(x_z + hp_z)``, ``r = sigmoid(x_r + hp_r)``,
    ``c = tanh(x_c + r * hp_c)``, ``h_t = z * h_{t-1} + (1 - z) * c``. As ``ggml_lstm_seq``: the CPU's threads each
    run every step on their own block of the batch, and the backward pass makes the gradient of ``u`` one product
    over all steps (and ``b``'s one sum).

    Differentiable in ``x``, ``u``, ``b`` and ``h0``. The CPU (patches/0037) and Vulkan (patches/0049; up to 512 units)
    compute it; for another device (CUDA) build the steps from ``ggml_mul_mat`` and the element-wise ops.

    Arguments:
        ctx: [glossary]
        x: F32 contiguous ``[3 * units, batch, steps]`` (ggml order), the projections time-major.
        u: F32 contiguous ``[units, 3 * units]``, the recurrent kernel as ``ggml_mul_mat(ctx, u, h)`` takes it.
        b: the recurrent bias, F32 contiguous ``[3 * units]`` (or ``[3 * units, 1]``), or None for none.
        h0: F32 contiguous ``[units, batch]``, the initial state, or None for zeros.
        reverse: True processes the steps last to first (Keras' ``go_backwards``); the results stay in time
            order, so the last state processed is step 0's.

    Value: a new F32 Tensor ``[units, batch, steps, 5]``: plane 0 holds ``h_t`` of every step, in time order;
    planes 1 to 4 keep the gates for the backward pass and are not a result (their gradient is ignored).

    Example:
        >>> seq = ggml_gru_seq(ctx, proj, u_kernel, rec_bias)      # proj [192, 32, 40]: 64 units, batch 32
        >>> last_h = ggml_view_2d(ctx, seq, 64, 32, 64 * 4, 39 * 64 * 32 * 4)
    """
    fn = "ggml_gru_seq"
    x, u, units, batch, steps = _sequence_operands(fn, x, u, 3, reverse)
    if b is not None:
        b = _like(fn, b, "b", (3 * units, 1, 1, 1), f"shape [{3 * units}] (3 * units) for x of shape "
                                                     f"{list(x.shape[:3])}")
    h0 = _initial_state(fn, h0, "h0", x, units, batch)
    return make_op(fn, ctx, lib.ggml_gru_seq, (x, u, b, h0), (units, batch, steps, 5), (reverse,))
