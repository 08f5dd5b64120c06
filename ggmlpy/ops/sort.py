"""Sorting and ranges: argsort, top_k, arange."""
from __future__ import annotations

import math

import numpy as np

from .._ffi import lib
from ..core.args import c_int_arg, fail, float_arg, INT32_MAX, is_int
from ..core.types import GGML_TYPE_F32, GGML_TYPE_I32
from ..errors import GgmlTypeError
from ..graph.objects import Context, Tensor
from .base import contiguous, make_op, operand, types


GGML_SORT_ORDER_ASC = int(lib.GGML_SORT_ORDER_ASC)
GGML_SORT_ORDER_DESC = int(lib.GGML_SORT_ORDER_DESC)


def _sortable(fn: str, a: Tensor) -> Tensor:
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})  # the CPU kernels sort F32 rows only (they abort otherwise)
    contiguous(fn, a)  # they read each row as consecutive floats, rows one after the other
    if a.shape[0] > INT32_MAX:  # ggml asserts it: the indices are int32
        fail(fn, f"rows longer than {INT32_MAX} values cannot be indexed by I32, got ne[0] = {a.shape[0]}")
    return a


def ggml_argsort(ctx: Context, a: Tensor, order: int = GGML_SORT_ORDER_ASC) -> Tensor:
    """The indices that sort each row of ``a``: for every row (the ``ne[0]`` values at fixed ne[1], ne[2],
    ne[3]), the 0-based positions of its values in sorted order.

    ``GGML_SORT_ORDER_ASC`` puts the position of the smallest value first, ``GGML_SORT_ORDER_DESC`` that
    of the largest. Equal values come in an unspecified order, and so do rows holding NaN (which
    compares false with everything). Not differentiable (an I32 result: a side output next to a
    trainable graph is fine). Pass the result to ``ggml_get_rows`` to gather values in sorted order.

    Arguments:
        ctx: [glossary: room]
        a: F32 tensor, contiguous (apply ``ggml_cont`` to a view first).
        order: ``GGML_SORT_ORDER_ASC`` (the default, 0) or ``GGML_SORT_ORDER_DESC`` (1).

    Value: a new I32 Tensor of a's shape. Raises GgmlTypeError for other types, GgmlValueError for a
    strided view or an unknown order.

    Example:
        >>> idx = ggml_argsort(ctx, scores, GGML_SORT_ORDER_DESC)   # [3, 1, 4] -> [2, 0, 1]
    """
    fn = "ggml_argsort"
    a = _sortable(fn, a)
    if not is_int(order):
        fail(fn, f"order must be GGML_SORT_ORDER_ASC or GGML_SORT_ORDER_DESC (an int), got {order!r}",
                 GgmlTypeError)
    if int(order) not in (GGML_SORT_ORDER_ASC, GGML_SORT_ORDER_DESC):  # the CPU kernel aborts on others
        fail(fn, f"order must be GGML_SORT_ORDER_ASC ({GGML_SORT_ORDER_ASC}) or GGML_SORT_ORDER_DESC "
                     f"({GGML_SORT_ORDER_DESC}), got {order}")
    return make_op(fn, ctx, lib.ggml_argsort, (a,), a.shape, (int(order),), GGML_TYPE_I32)


def ggml_top_k(ctx: Context, a: Tensor, k: int) -> Tensor:
    """The positions of the ``k`` largest values of each row of ``a`` (over ne[0]), in no particular order.

    For every row the result holds ``k`` 0-based indices into it: those of its ``k`` largest values.
    As in ggml, their order within the row is unspecified (ggml even swaps the first two on purpose);
    sort them with ``ggml_argsort`` of the gathered values if the order matters, or use
    ``ggml_argsort(ctx, a, GGML_SORT_ORDER_DESC)`` and keep the first ``k``. Ties are broken
    arbitrarily; NaN values give an unspecified selection. Not differentiable (an I32 result).

    Arguments:
        ctx: [glossary: room]
        a: F32 tensor ``[n, ...]``, contiguous (apply ``ggml_cont`` to a view first).
        k: the number of indices per row, an int with ``1 <= k <= n`` (else GgmlValueError).

    Value: a new I32 Tensor ``[k, ne1, ne2, ne3]``.

    Example:
        >>> top5 = ggml_top_k(ctx, logits, 5)       # logits [vocab, batch] -> [5, batch]
    """
    fn = "ggml_top_k"
    a = _sortable(fn, a)
    k = c_int_arg(fn, "k", k, 1)
    if k > a.shape[0]:  # ggml asserts k <= ne[0]
        fail(fn, f"k must be at most the row length a.ne[0] = {a.shape[0]}, got k = {k}")
    return make_op(fn, ctx, lib.ggml_top_k, (a,), (k,) + a.shape[1:], (k,), GGML_TYPE_I32)


def ggml_arange(ctx: Context, start: float, stop: float, step: float = 1) -> Tensor:
    """A 1-D F32 tensor of evenly spaced values: ``start, start + step, ...`` up to ``stop`` (excluded).

    Like ``numpy.arange`` but in float32, as ggml computes it: ``start``, ``stop`` and ``step`` are
    rounded to float32, the length is ``ceil((stop - start) / step)`` evaluated in float32, and value
    ``i`` is ``start + step * i`` in float32. Only increasing ranges exist (``step > 0`` and
    ``stop > start``). The tensor has no operands: it is computed when the graph runs (include it in
    a graph, e.g. as an operand of another op). Not differentiable (it depends on nothing).

    Arguments:
        ctx: [glossary: room]
        start: the first value (a finite number).
        stop: the end, excluded (a finite number greater than ``start``).
        step: the spacing, a finite number > 0 (default 1).

    Value: a new F32 Tensor ``[n]``, ``n = ceil((stop - start) / step)``. Raises GgmlValueError for an
    empty or decreasing range, a step <= 0 or a non-finite argument.

    Example:
        >>> pos = ggml_arange(ctx, 0, 10)           # [0, 1, ..., 9]
    """
    fn = "ggml_arange"
    f32 = np.float32
    values = []
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        values.append(f32(float_arg(fn, name, v, finite=True)))  # C floats: beyond float32 would be inf
    s0, s1, st = values
    if not s1 > s0:  # ggml asserts stop > start (after rounding to float32)
        fail(fn, f"stop must be greater than start, got start={start!r}, stop={stop!r}"
                     + (" (equal as float32 values)" if s1 == s0 and float(start) != float(stop) else "")
                     + "; ggml_arange only counts upwards")
    if not st > 0:
        fail(fn, f"step must be > 0, got {step!r}")
    with np.errstate(all="ignore"):
        q = f32(s1 - s0) / st  # what ggml computes, in float32
    if not math.isfinite(float(q)) or float(q) >= 2.0 ** 62:
        fail(fn, f"the range [{start!r}, {stop!r}) with step {step!r} has too many values ({float(q):.4g})")
    n = int(math.ceil(float(q)))
    if n < 1:
        fail(fn, f"the range [{start!r}, {stop!r}) with step {step!r} is empty in float32")
    return make_op(fn, ctx, lib.ggml_arange, (), (n, 1, 1, 1), (float(s0), float(s1), float(st)), GGML_TYPE_F32)
