"""Layout ops: reshape, views, permute, transpose, copies, ``get_rows``, padding, writing into tensors
(``ggml_set*``) and diagonals.
"""
from __future__ import annotations

from typing import Callable

from .._ffi import ffi, lib
from ..core.args import c_int_arg, fail, int_arg
from ..core.types import checked_type, FLOAT_TYPES, GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ..errors import GgmlTypeError
from ..graph.indices import check_computed_indices
from ..graph.nodes import tensor_label, tensor_memory
from ..graph.objects import Context, Tensor
from .base import contiguous, make_op, operand, permutation, reshape, rows_contiguous, types, view
from .conv import element_size, INT32_LIMIT, strides_of


def ggml_reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """A view of ``a`` with the shape of ``b`` (no copy; only b's shape is used).

    Arguments:
        ctx: [glossary]
        a: a contiguous tensor (apply ``ggml_cont`` to a transposed/permuted view first).
        b: a tensor with as many elements as a (else GgmlValueError).

    Value: a Tensor of a's type and b's shape sharing a's data. Differentiable.

    Example:
        >>> flat = ggml_reshape(ctx, images, template)   # template: any tensor of the wanted shape
    """
    a, b = operand("ggml_reshape", a), operand("ggml_reshape", b, "b")
    reshape("ggml_reshape", a, b.shape)
    return make_op("ggml_reshape", ctx, lib.ggml_reshape, (a, b), None, out_type=a.type)


def _reshape(n: int) -> Callable:
    name = f"ggml_reshape_{n}d"
    c_fn = getattr(lib, name)

    def op(ctx: Context, a: Tensor, *ne: int) -> Tensor:
        a = operand(name, a)
        if len(ne) != n:
            fail(name, f"expected {n} sizes, got {len(ne)}", GgmlTypeError)
        reshape(name, a, ne)
        return make_op(name, ctx, c_fn, (a,), None, tuple(ne), a.type)  # a view: no data of its own
    op.__name__ = op.__qualname__ = name
    sizes = ", ".join(f"ne{i}" for i in range(n))
    op.__doc__ = f"""A {n}-D view of ``a`` with shape ``[{sizes}]`` (no copy): ``{name}(ctx, a, {sizes})``.

    The elements keep their ggml order (ne[0] fastest); only the shape changes, as numpy's ``reshape``
    does on the reversed shape. Differentiable.

    Arguments:
        ctx: the context the result tensor is created in.
        a: a contiguous tensor (apply ``ggml_cont`` to a transposed/permuted view first).
        {sizes}: the new sizes (ints >= 1), exactly {n} of them, whose product is a's element count.

    Value: a Tensor of a's type and the new shape sharing a's data. Raises GgmlValueError when the
    counts differ or a is not contiguous.

    Example:
        >>> y = {name}(ctx, x, {", ".join(str(v) for v in (12, 2, 3, 1)[:n])})
    """
    return op


ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d = (_reshape(n) for n in (1, 2, 3, 4))


def ggml_view_1d(ctx: Context, a: Tensor, ne0: int, offset: int = 0) -> Tensor:
    """A 1-D view of ``ne0`` consecutive elements of ``a``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to view.
        ne0: the number of elements (>= 1).
        offset: the start, in **bytes** from the start of a's data (default 0); the view must end
            within a (else GgmlValueError).

    Value: a Tensor ``[ne0]`` of a's type viewing a's data.

    Example:
        >>> first_row = ggml_view_1d(ctx, m, m_ne0, 0)
    """
    a = operand("ggml_view_1d", a)
    view("ggml_view_1d", a, (ne0,), (), offset)
    return make_op("ggml_view_1d", ctx, lib.ggml_view_1d, (a,), None, (ne0, offset), a.type)


def ggml_view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int = 0) -> Tensor:
    """A 2-D view ``[ne0, ne1]`` of ``a``, rows ``nb1`` bytes apart, starting ``offset`` bytes in.

    No copy: the view shares a's memory; elements within a row are consecutive. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to view.
        ne0, ne1: the view's shape (each >= 1).
        nb1: the distance between rows, in **bytes** (a's own row stride is ``ne0(a) * element size``).
        offset: the start, in bytes (default 0). The last element must lie within a (else
            GgmlValueError).

    Value: a Tensor ``[ne0, ne1]`` of a's type viewing a's data (possibly not contiguous).

    Example:
        >>> left = ggml_view_2d(ctx, x, 3, n, 6 * 4, 0)   # the first 3 of the 6 F32 features of x [6, n]
    """
    a = operand("ggml_view_2d", a)
    view("ggml_view_2d", a, (ne0, ne1), (nb1,), offset)
    return make_op("ggml_view_2d", ctx, lib.ggml_view_2d, (a,), None, (ne0, ne1, nb1, offset), a.type)


def ggml_view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int = 0) -> Tensor:
    """A 3-D view ``[ne0, ne1, ne2]`` of ``a`` with byte strides ``nb1``, ``nb2``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to view.
        ne0, ne1, ne2: the view's shape (each >= 1).
        nb1, nb2: the strides of dimensions 1 and 2, in **bytes**.
        offset: the start, in bytes (default 0). The view must end within a (else GgmlValueError).

    Value: a Tensor ``[ne0, ne1, ne2]`` of a's type viewing a's data.

    Example:
        >>> v = ggml_view_3d(ctx, x, 4, 5, 2, 4 * 4, 4 * 4 * 5, 0)   # F32, contiguous [4, 5, 2]
    """
    a = operand("ggml_view_3d", a)
    view("ggml_view_3d", a, (ne0, ne1, ne2), (nb1, nb2), offset)
    return make_op("ggml_view_3d", ctx, lib.ggml_view_3d, (a,), None, (ne0, ne1, ne2, nb1, nb2, offset), a.type)


def ggml_view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
                 offset: int = 0) -> Tensor:
    """A 4-D view of ``a`` with byte strides ``nb1``, ``nb2``, ``nb3``, starting ``offset`` bytes in.

    No copy: the view shares a's memory. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to view.
        ne0, ne1, ne2, ne3: the view's shape (each >= 1).
        nb1, nb2, nb3: the strides of dimensions 1-3, in **bytes**.
        offset: the start, in bytes (default 0). The view must end within a (else GgmlValueError).

    Value: a Tensor ``[ne0, ne1, ne2, ne3]`` of a's type viewing a's data.

    Example:
        >>> v = ggml_view_4d(ctx, x, 4, 5, 2, 1, 16, 80, 160, 0)      # F32 [4, 5, 2, 1]
    """
    a = operand("ggml_view_4d", a)
    view("ggml_view_4d", a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)
    return make_op("ggml_view_4d", ctx, lib.ggml_view_4d, (a,), None,
               (ne0, ne1, ne2, ne3, nb1, nb2, nb3, offset), a.type)


def ggml_permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Reorder the dimensions of ``a`` (a view, no copy): dimension i of ``a`` goes to position ``axis_i``.

    ggml's convention is the inverse of numpy's ``transpose``: ``result.ne[axis0] = a.ne[0]``,
    ``result.ne[axis1] = a.ne[1]``, and so on. The result is usually not contiguous: apply
    ``ggml_cont`` before ops that need contiguous data. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to permute.
        axis0, axis1, axis2, axis3: a permutation of 0, 1, 2, 3 (else GgmlValueError).

    Value: a Tensor of a's type viewing a's data with the permuted shape.

    Example:
        >>> y = ggml_cont(ctx, ggml_permute(ctx, x, 0, 2, 1, 3))     # swap ne[1] and ne[2]
    """
    a = operand("ggml_permute", a)
    permutation("ggml_permute", (axis0, axis1, axis2, axis3))
    return make_op("ggml_permute", ctx, lib.ggml_permute, (a,), None, (axis0, axis1, axis2, axis3), a.type)


def ggml_transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap ne[0] and ne[1] (a view, no copy; ``ggml_permute(ctx, a, 1, 0, 2, 3)``).

    The result is not contiguous: apply ``ggml_cont`` to get a transposed copy that ops needing
    contiguous rows accept. Differentiable.

    Arguments:
        ctx: [glossary]
        a: the tensor to transpose.

    Value: a Tensor ``[ne1, ne0, ne2, ne3]`` of a's type viewing a's data.

    Example:
        >>> wt = ggml_cont(ctx, ggml_transpose(ctx, w))
    """
    a = operand("ggml_transpose", a)
    return make_op("ggml_transpose", ctx, lib.ggml_transpose, (a,), None, out_type=a.type)


def ggml_cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy the values of ``a`` into ``b``, converting to b's type; returns a view of ``b``.

    When the graph runs, b's data is overwritten with a's elements (in ggml order); the shapes may
    differ as long as the element counts match. This is how to cast, e.g. an I32 or F16 tensor into
    an F32 one. Differentiable with respect to ``a``.

    Arguments:
        ctx: [glossary]
        a: the source tensor.
        b: the destination tensor, with as many elements as a (else GgmlValueError).

    Value: a Tensor of b's shape and type viewing b's data.

    Example:
        >>> x_f32 = ggml_cpy(ctx, x_f16, ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 8, 4))
    """
    a, b = operand("ggml_cpy", a), operand("ggml_cpy", b, "b")
    if a.nelements() != b.nelements():
        fail("ggml_cpy", f"a and b must have the same number of elements, got {a.nelements()} and {b.nelements()}")
    return make_op("ggml_cpy", ctx, lib.ggml_cpy, (a, b), None, out_type=b.type)


def ggml_cast(ctx: Context, a: Tensor, type: int) -> Tensor:
    """``a`` converted to another float type (``GGML_TYPE_F32``, ``GGML_TYPE_F16`` or ``GGML_TYPE_BF16``): a new
    tensor of a's shape, computed when the graph runs (round to nearest even; F16 saturates to +-inf beyond
    65504).

    This is how a graph computes a product in half precision while its weights stay F32: cast the weight, then
    ``ggml_mul_mat`` (the gradient flows back through the cast into the F32 weight, in F32).

    Arguments:
        ctx: [glossary]
        a: an F32, F16 or BF16 tensor.
        type: the result's type, one of the three.

    Value: a new Tensor of a's shape and type ``type``. Differentiable with respect to ``a``.

    Example:
        >>> w16 = ggml_cast(ctx, w, GGML_TYPE_BF16)
        >>> y = ggml_mul_mat(ctx, w16, x)        # BF16 products, F32 result
    """
    a = operand("ggml_cast", a)
    t = checked_type("ggml_cast", type)
    if a.type not in FLOAT_TYPES or t not in FLOAT_TYPES:
        raise GgmlTypeError(f"ggml_cast: casts between F32, F16 and BF16; got {type_name(a.type)} -> "
                            f"{type_name(t)}; for other types use ggml_cpy into a tensor of the wanted type")
    return make_op("ggml_cast", ctx, lib.ggml_cast, (a,), a.shape, (t,), out_type=t)


def ggml_get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows of ``a`` picked by the I32 indices ``b``: an embedding lookup.

    ``a [n_embd, n_rows, A2, A3]`` and indices ``b [n_idx, B1, B2]`` give ``[n_embd, n_idx, B1, B2]``:
    row ``b[i]`` of a becomes column i of the result. The shapes must fit: ``a.ne[2] == b.ne[1]``,
    ``a.ne[3] == b.ne[2]``, ``b.ne[3] == 1``. Every index must be in ``[0, a.ne[1])``. Indices held by
    an input tensor (``b`` itself, or a reshape/view of it) are checked before every compute, training
    batch and ``ggml_opt_eval`` (an out-of-range one raises GgmlValueError; ggml would abort). Indices
    computed inside the graph are checked here, where their range is known: those of ``ggml_argmax``
    over ``k`` values (through reshapes, views, copies, repeats) lie in ``[0, k)``, so a table with fewer
    than ``k`` rows raises GgmlValueError. What is not checkable: indices computed otherwise, e.g. floats
    converted with ``ggml_cpy`` into an I32 tensor, or values looked up in an I32 table; their values
    exist only while ggml computes, and an out-of-range one aborts the process inside ggml. Keep those in
    range by construction (clamp the floats before converting them, fill the table with valid rows).
    Differentiable with respect to ``a``.

    Arguments:
        ctx: [glossary]
        a: the table, rows along ne[1].
        b: I32 row indices (0-based).

    Value: a new Tensor ``[a.ne[0], b.ne[0], b.ne[1], b.ne[2]]``, F32 (I32 if a is I32).

    Example:
        >>> emb = ggml_get_rows(ctx, table, token_ids)   # table [64, vocab], ids [seq] -> [64, seq]
    """
    fn = "ggml_get_rows"
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, b, {GGML_TYPE_I32}, "b (the indices)")
    (a0, _a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a2 != b1 or a3 != b2 or b3 != 1:
        fail(fn, f"shapes do not fit: a {list(a.shape)}, b {list(b.shape)} (need a.ne[2] == b.ne[1], "
                     "a.ne[3] == b.ne[2], b.ne[3] == 1)")
    check_computed_indices(fn, a, b)
    out_type = GGML_TYPE_I32 if a.type == GGML_TYPE_I32 else GGML_TYPE_F32
    return make_op(fn, ctx, lib.ggml_get_rows, (a, b), (a0, b0, b1, b2), out_type=out_type)


def ggml_pad(ctx: Context, a: Tensor, p0: int = 0, p1: int = 0, p2: int = 0, p3: int = 0) -> Tensor:
    """Append zeros at the end of each dimension: ``ne[i]`` becomes ``ne[i] + p_i``.

    Arguments:
        ctx: [glossary]
        a: F32 tensor.
        p0, p1, p2, p3: the number of zeros appended along each dimension (ints >= 0, default 0).

    Value: a new F32 Tensor ``[ne0 + p0, ne1 + p1, ne2 + p2, ne3 + p3]``, a's values first.

    Example:
        >>> y = ggml_pad(ctx, x, 2)                 # [5, n] -> [7, n], two zeros per column
    """
    a = operand("ggml_pad", a)
    types("ggml_pad", a, {GGML_TYPE_F32})
    pads = tuple(c_int_arg("ggml_pad", f"p{i}", p, 0) for i, p in enumerate((p0, p1, p2, p3)))
    return make_op("ggml_pad", ctx, lib.ggml_pad, (a,), tuple(n + p for n, p in zip(a.shape, pads)), pads, a.type)


def _set_checks(fn: str, a: Tensor, b: Tensor, nb1: object, nb2: object, nb3: object,
                offset: object) -> tuple[int, ...]:
    """What ggml_set's constructor, CPU kernel and backward pass assert, for byte strides and offset."""
    types(fn, a, {GGML_TYPE_F32, GGML_TYPE_I32})
    if b.type != a.type:
        fail(fn, f"b must have a's type {type_name(a.type)}, got {type_name(b.type)}; convert it with "
                     "ggml_cpy first", GgmlTypeError)
    contiguous(fn, a)
    rows_contiguous(fn, b, "b")
    esize = element_size(a)
    vals = []
    for k, (name, v) in enumerate((("nb1", nb1), ("nb2", nb2), ("nb3", nb3), ("offset", offset))):
        v = int_arg(fn, name, v, 0)
        if k < 3 and b.shape[k + 1] == 1:  # a stride along a dimension of size 1 is never used
            vals.append(v)
            continue
        # ggml stores them as 32-bit ints (and asserts offset < 2**30)
        limit = (1 << 30) - 1 if name == "offset" else INT32_LIMIT
        if v > limit:
            fail(fn, f"{name} must be <= {limit} bytes (ggml keeps it in 32 bits), got {v}")
        if v % esize:
            fail(fn, f"{name} is in bytes and must be a multiple of the element size {esize}, got {v}")
        vals.append(v)
    if b.nelements() > a.nelements():
        fail(fn, f"b {list(b.shape)} has more elements than a {list(a.shape)}")
    strides = (esize, vals[0], vals[1], vals[2])
    last = vals[3] + sum((n - 1) * st for n, st in zip(b.shape, strides)) + esize
    size = a.nbytes()
    if last > size or vals[3] + b.nelements() * esize > size:
        fail(fn, f"b {list(b.shape)} placed at byte offset {vals[3]} with row strides {vals[:3]} reaches byte "
                     f"{max(last, vals[3] + b.nelements() * esize)}, beyond a's {size} bytes")
    return tuple(vals)


def ggml_set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """A copy of ``a`` with the block ``b`` written into it at a byte offset, with given byte strides.

    The element ``b[i0, i1, i2, i3]`` (ggml indices) lands at byte
    ``offset + i0 * esize + i1 * nb1 + i2 * nb2 + i3 * nb3`` of a's data (``esize`` = 4 for F32/I32);
    everything else keeps a's values. With a's own strides (``ggml_nb``-style: ``nb1 = ne0 * esize``,
    ...) this writes a sub-block. ``a`` itself is not changed. Differentiable with respect to both
    ``a`` (the gradient is zero where b was written) and ``b``.

    Arguments:
        ctx: [glossary]
        a: the destination, F32 or I32, contiguous.
        b: the block, of a's type, with contiguous rows and at most as many elements as a.
        nb1, nb2, nb3: the byte distances between b's rows, planes and 3-D blocks inside a (ints >= 0,
            multiples of the element size).
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size, below 2**30). Every element of b must land inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> # m F32 [6, 5], block [3, 2]: rows 1-2, columns 2-4 of m replaced
        >>> y = ggml_set(ctx, m, block, 6 * 4, 6 * 4 * 5, 6 * 4 * 5, (1 * 6 + 2) * 4)
    """
    fn = "ggml_set"
    a, b = operand(fn, a), operand(fn, b, "b")
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return make_op(fn, ctx, lib.ggml_set, (a, b), a.shape, (nb1, nb2, nb3, offset), a.type)


def ggml_set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """A copy of ``a`` with the elements of ``b`` written consecutively from a byte offset on.

    For a 1-D ``b`` of n elements: elements ``offset / esize`` .. ``offset / esize + n - 1`` of a (in
    ggml order) are replaced by b's values (``esize`` = 4 for F32/I32). A ``b`` with several rows is
    placed with a's own row strides. ``a`` itself is not changed. Differentiable with respect to
    both ``a`` and ``b``.

    Arguments:
        ctx: [glossary]
        a: the destination, F32 or I32, contiguous.
        b: the values, of a's type, with contiguous rows.
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size); b must end inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> y = ggml_set_1d(ctx, v, part, 3 * 4)        # v F32 [10], part [4]: elements 3..6 replaced
    """
    fn = "ggml_set_1d"
    a, b = operand(fn, a), operand(fn, b, "b")
    _, nb1, nb2, nb3 = strides_of(a)
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return make_op(fn, ctx, lib.ggml_set_1d, (a, b), a.shape, (offset,), a.type)


def ggml_set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """A copy of ``a`` with the matrix ``b`` written into it: rows ``nb1`` bytes apart from a byte offset.

    The element ``b[i0, i1]`` (ggml indices) lands at byte ``offset + i0 * esize + i1 * nb1`` of a's
    data (``esize`` = 4 for F32/I32); higher dimensions of b use a's own strides. With ``nb1`` equal to
    a's row size (``a.ne[0] * esize``) this pastes a sub-matrix. ``a`` itself is not changed.
    Differentiable with respect to both ``a`` and ``b``.

    Arguments:
        ctx: [glossary]
        a: the destination, F32 or I32, contiguous.
        b: the block, of a's type, with contiguous rows.
        nb1: the byte distance between b's rows inside a (an int >= 0, a multiple of the element size).
        offset: the byte position of b's first element in a (an int >= 0, a multiple of the element
            size); every element of b must land inside a.

    Value: a new Tensor of a's shape and type.

    Example:
        >>> y = ggml_set_2d(ctx, m, block, 6 * 4, (1 * 6 + 2) * 4)   # m F32 [6, 5], block [3, 2] at row 1, column 2
    """
    fn = "ggml_set_2d"
    a, b = operand(fn, a), operand(fn, b, "b")
    _, _, nb2, nb3 = strides_of(a)
    nb1, nb2, nb3, offset = _set_checks(fn, a, b, nb1, nb2, nb3, offset)
    return make_op(fn, ctx, lib.ggml_set_2d, (a, b), a.shape, (nb1, offset), a.type)


def ggml_set_zero(tensor: Tensor) -> None:
    """Set every element of an allocated tensor to zero, now (not a graph op).

    Works on tensors in context memory and in backend buffers (CPU or device). Handy to reset an
    accumulator or a gradient between computations.

    Arguments:
        tensor: a contiguous tensor that has memory (allocate its context with
            ``ggml_backend_alloc_ctx_tensors``, or create it in a context with ``no_alloc=False``). A
            strided view is refused: zeroing its byte span would also clear elements it does not show.

    Value: None. Raises GgmlStateError for a tensor without memory, GgmlValueError for a strided view.

    Example:
        >>> ggml_set_zero(acc)
    """
    fn = "ggml_set_zero"
    t = operand(fn, tensor, "tensor")
    p = t.ptr
    if t.nelements() == 0:
        return None
    where = tensor_memory(p, f"{fn}: {tensor_label(p)}")
    contiguous(fn, t, "tensor")
    nbytes = int(lib.ggml_nbytes(p))
    if where == "host":
        lib.ggml_set_zero(p)
        return None
    # through set_tensor, which every backend buffer implements (ggml_set_zero's memset is optional there)
    chunk = min(nbytes, 1 << 24)
    zeros = ffi.new("char[]", chunk)
    for start in range(0, nbytes, chunk):
        lib.ggml_backend_tensor_set(p, zeros, start, min(chunk, nbytes - start))
    return None


# ---------------------------------------------------------------- views and diagonals

def ggml_view_tensor(ctx: Context, src: Tensor) -> Tensor:
    """A view of the whole of ``src``: same shape, type, strides and data, no copy.

    The view is a leaf of a graph, not an op: building a graph from it does not compute ``src``
    (expand the graph with ``src`` too, or give ``src`` its values before computing), and no
    gradient flows through it to ``src``. Writing the view's data writes src's.

    Arguments:
        ctx: the context the view's header is created in.
        src: the tensor to view.

    Value: a Tensor of src's shape and type sharing src's memory.

    Example:
        >>> v = ggml_view_tensor(ctx, weights)
    """
    fn = "ggml_view_tensor"
    src = operand(fn, src, "src")
    return make_op(fn, ctx, lib.ggml_view_tensor, (src,), None, out_type=src.type)


def ggml_diag(ctx: Context, a: Tensor) -> Tensor:
    """A diagonal matrix from each row vector: ``[n, 1, ne2, ne3]`` becomes ``[n, n, ne2, ne3]``.

    ``out[..., j, i] = a[..., 0, i]`` if ``i == j`` else 0 (numpy indices): ``np.diag`` of every row.
    ggml has no backward pass for it: in a trainable graph it may not lie between a parameter and the
    loss (multiply by an identity matrix built as data instead).

    Arguments:
        ctx: [glossary]
        a: F32 tensor with ``ne[1] == 1`` and contiguous rows (``[n]`` or ``[n, 1, ne2, ne3]``).

    Value: a new F32 Tensor ``[n, n, ne2, ne3]``.

    Example:
        >>> d = ggml_diag(ctx, v)                   # v [3] -> [3, 3]
    """
    fn = "ggml_diag"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    rows_contiguous(fn, a)
    if a.shape[1] != 1:
        fail(fn, f"a must hold row vectors (ne[1] == 1), got {list(a.shape)}; reshape it with ggml_reshape_4d(ctx, "
                     f"a, n, 1, ...)")
    n = a.shape[0]
    return make_op(fn, ctx, lib.ggml_diag, (a,), (n, n, a.shape[2], a.shape[3]), out_type=a.type)


def ggml_diag_mask_zero(ctx: Context, a: Tensor, n_past: int) -> Tensor:
    """Set the elements above the (shifted) diagonal to 0: ``ggml_diag_mask_inf`` with zeros.

    In each row ``j`` (index along ne[1]) the elements at columns ``i > n_past + j`` (index along
    ne[0]) become 0, the others are copied; the same for every ne[2], ne[3]. In numpy terms
    ``np.tril(x, n_past)`` on the last two axes. Differentiable (the gradient is masked alike).

    Arguments:
        ctx: [glossary]
        a: F32 tensor, contiguous.
        n_past: how many columns beyond the diagonal each row keeps (an int >= 0; 0 keeps the lower
            triangle).

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> lower = ggml_diag_mask_zero(ctx, scores, 0)
    """
    fn = "ggml_diag_mask_zero"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F32})
    contiguous(fn, a)
    return make_op(fn, ctx, lib.ggml_diag_mask_zero, (a,), a.shape, (c_int_arg(fn, "n_past", n_past, 0),), a.type)
