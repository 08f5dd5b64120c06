"""Tensors (``Tensor``): creating them in a context, marking parameters, inputs, outputs and the loss, names,
shape and size queries.
"""
from __future__ import annotations

import numpy as np

from .._ffi import ffi, lib
from ..core.args import c_string, INT64_MAX, is_int
from ..core.handle import unwrap
from ..core.types import GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, PLAIN_TYPES, type_name
from ..errors import expect, GgmlTypeError, GgmlValueError
from .objects import as_tensor, Context, Tensor


def _check_type(t: object, what: str) -> int:
    if not is_int(t) or t not in PLAIN_TYPES:
        names = ", ".join(sorted(f"GGML_TYPE_{type_name(x).upper()}" for x in PLAIN_TYPES))
        raise GgmlTypeError(f"{what}: expected one of {names}, got {t!r}")
    return int(t)


def new_tensor(ctx: Context, type: int, ne: tuple[int, ...]) -> Tensor:
    ctx_ptr = unwrap(ctx, Context, f"ggml_new_tensor_{len(ne)}d(ctx)")
    _check_type(type, f"ggml_new_tensor_{len(ne)}d(type)")
    for i, n in enumerate(ne):
        if not is_int(n):
            raise GgmlTypeError(f"ggml_new_tensor_{len(ne)}d: ne{i} must be an int >= 1, got {n!r}")
        expect(n >= 1, f"ggml_new_tensor_{len(ne)}d: ne{i} must be an int >= 1, got {n!r}")
    ne = tuple(int(n) for n in ne)  # numpy ints too
    count = 1
    for n in ne:
        count *= n
    nbytes = count * int(lib.ggml_type_size(type)) // int(lib.ggml_blck_size(type))
    expect(count <= INT64_MAX and nbytes <= INT64_MAX,
           f"ggml_new_tensor_{len(ne)}d: the shape {list(ne)} has {count} elements ({nbytes} bytes), beyond ggml's "
           f"64-bit sizes (at most {INT64_MAX}); use smaller dimensions")
    ctx.reserve(count * int(lib.ggml_type_size(type)))
    fn = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)[len(ne) - 1]
    return Tensor(fn(ctx_ptr, type, *ne), ctx)


def new_quantized_tensor(ctx: Context, type: int, ne: tuple[int, ...]) -> Tensor:
    """A tensor of a quantized type (``GGML_TYPE_Q8_0``, ...) whose rows (``ne[0]``) are whole blocks: a model's
    weight kept quantized, or one only to be written to a file (``ggml_new_tensor`` refuses these types, which
    few ops take)."""
    block = int(lib.ggml_blck_size(type))
    if not lib.ggml_is_quantized(type) or not ne or ne[0] % block or len(ne) > 4:
        raise GgmlValueError(f"a {type_name(type)} tensor's rows must be whole blocks of {block} values, got ne "
                             f"{list(ne)}")
    rows = 1
    for n in ne[1:]:
        rows *= int(n)
    ctx.reserve(int(lib.ggml_row_size(type, int(ne[0]))) * rows)
    fn = (lib.ggml_new_tensor_1d, lib.ggml_new_tensor_2d, lib.ggml_new_tensor_3d, lib.ggml_new_tensor_4d)[len(ne) - 1]
    return Tensor(fn(ctx.ptr, type, *(int(n) for n in ne)), ctx)


def ggml_new_tensor_1d(ctx: Context, type: int, ne0: int) -> Tensor:
    """A new 1-D tensor ``[ne0]`` in ``ctx``.

    Arguments:
        ctx: [glossary: owner]
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0: the number of elements (an int >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, 1, 1, 1]``.

    Example:
        >>> b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 128)
    """
    return new_tensor(ctx, type, (ne0,))


def ggml_new_tensor_2d(ctx: Context, type: int, ne0: int, ne1: int) -> Tensor:
    """A new 2-D tensor ``[ne0, ne1]`` in ``ctx`` (ne0 is the fastest dimension).

    In ggml layout a batch of N samples of F features is ``[F, N]``; its numpy twin is an ``(N, F)``
    array (see ``ggml_backend_tensor_set_data``).

    Arguments:
        ctx: [glossary: owner]
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0: the size of dimension 0 (features; an int >= 1). ne1: the size of dimension 1 (>= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, 1, 1]``.

    Example:
        >>> x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32)     # 32 samples of 784 features
    """
    return new_tensor(ctx, type, (ne0, ne1))


def ggml_new_tensor_3d(ctx: Context, type: int, ne0: int, ne1: int, ne2: int) -> Tensor:
    """A new 3-D tensor ``[ne0, ne1, ne2]`` in ``ctx`` (ne0 is the fastest dimension).

    Arguments:
        ctx: [glossary: owner]
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0, ne1, ne2: the sizes (ints >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, ne2, 1]``.

    Example:
        >>> seq = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 64, 100, 8)  # 8 sequences of 100 steps x 64
    """
    return new_tensor(ctx, type, (ne0, ne1, ne2))


def ggml_new_tensor_4d(ctx: Context, type: int, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """A new 4-D tensor ``[ne0, ne1, ne2, ne3]`` in ``ctx`` (ne0 is the fastest dimension).

    Images in ggml layout are ``[W, H, C, N]`` (a numpy ``(N, C, H, W)`` array).

    Arguments:
        ctx: [glossary: owner]
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        ne0, ne1, ne2, ne3: the sizes (ints >= 1).

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor of shape ``[ne0, ne1, ne2, ne3]``.

    Example:
        >>> images = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 28, 28, 1, 32)
    """
    return new_tensor(ctx, type, (ne0, ne1, ne2, ne3))


def ggml_new_tensor(ctx: Context, type: int, n_dims: int, ne) -> Tensor:
    """A new tensor with ``n_dims`` dimensions whose sizes are the first ``n_dims`` values of ``ne``.

    The generic form of ``ggml_new_tensor_1d`` ... ``_4d``.

    Arguments:
        ctx: [glossary: owner]
        type: the element type: ``GGML_TYPE_F32``, ``GGML_TYPE_F16``, ``GGML_TYPE_BF16``, ``GGML_TYPE_F64``,
            ``GGML_TYPE_I8``, ``GGML_TYPE_I16``, ``GGML_TYPE_I32`` or ``GGML_TYPE_I64`` (else GgmlTypeError).
        n_dims: 1, 2, 3 or 4.
        ne: a sequence of at least ``n_dims`` sizes (ints >= 1), ne[0] first.

    With ``no_alloc=False`` the tensor gets (uninitialised) memory in the context at once; with
    ``no_alloc=True`` it has none until ``ggml_backend_alloc_ctx_tensors`` (or a graph allocator)
    places it. A context too full for it raises GgmlValueError (ggml would abort).

    Value: a Tensor; the missing dimensions are 1.

    Example:
        >>> t = ggml_new_tensor(ctx, GGML_TYPE_I32, 2, [10, 4])
    """
    if isinstance(ne, (str, bytes, dict)) or not hasattr(ne, "__iter__"):
        raise GgmlTypeError(f"ggml_new_tensor: ne must be a list of 1 to 4 ints, got {ne!r}")
    ne = tuple(ne)
    expect(is_int(n_dims) and n_dims in (1, 2, 3, 4) and len(ne) >= n_dims,
           f"ggml_new_tensor: n_dims must be 1-4 with that many ne values, got {n_dims!r}, {ne!r}")
    return new_tensor(ctx, type, ne[:n_dims])


def pending_constant(ctx: Context, values: np.ndarray, pending: list[tuple[Tensor, np.ndarray]]) -> Tensor:
    """An F32 tensor (F16 for float16 ``values``, I32 for int32 ones) in the no_alloc context ``ctx`` for
    ``values`` (numpy order: ggml's shape reversed), added to ``pending`` with its values, which its owner writes
    once the tensor has memory."""
    kind = np.asarray(values).dtype
    dtype = kind if kind in (np.float16, np.int32) else np.dtype(np.float32)
    values = np.ascontiguousarray(values, dtype=dtype)
    gtype = {np.dtype(np.float16): GGML_TYPE_F16, np.dtype(np.int32): GGML_TYPE_I32}.get(dtype, GGML_TYPE_F32)
    t = ggml_new_tensor(ctx, gtype, values.ndim, tuple(reversed(values.shape)))
    pending.append((t, values))
    return t


def ggml_dup_tensor(ctx: Context, tensor: Tensor) -> Tensor:
    """A new tensor of the same type and shape as ``tensor`` (its data is not copied).

    Arguments:
        ctx: the context that owns the new tensor (it may differ from tensor's).
        tensor: the tensor whose type and shape are copied.

    Value: a new, unnamed leaf Tensor. A context too full for it raises GgmlValueError.

    Example:
        >>> grad_buf = ggml_dup_tensor(ctx, w)
    """
    return new_tensor(ctx, as_tensor(tensor, "ggml_dup_tensor(tensor)").type,
                       tuple(n for n in tensor.shape))


def ggml_set_param(tensor: Tensor) -> Tensor:
    """Mark a leaf tensor as trainable: the optimizer computes its gradient and updates it.

    Only tensors created with ``ggml_new_tensor_*`` (not the results of ops) can be parameters, and
    they must be F32 or F16 (ggml-opt's optimizers train F32 only). Initialise the data before training.

    Arguments:
        tensor: a leaf Tensor.

    Value: the same tensor (so calls can be chained). Raises GgmlValueError for an op result,
    GgmlTypeError for another type.

    Example:
        >>> w = ggml_set_param(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 128))
    """
    t = as_tensor(tensor, "ggml_set_param(tensor)").ptr
    expect(t.op == lib.GGML_OP_NONE, f"ggml_set_param: only leaf tensors (created with ggml_new_tensor_*) can be "
                                     f"trainable, got the result of {tensor.op_name}")
    # ggml's backward pass asserts F32/F16 for every tensor a gradient flows to
    expect(t.type in (GGML_TYPE_F32, GGML_TYPE_F16),
           f"ggml_set_param: trainable tensors must be F32 or F16, got {type_name(t.type)}", GgmlTypeError)
    lib.ggml_set_param(t)
    return tensor


def set_trainable(tensor: Tensor, trainable: bool) -> None:
    """Set or clear a leaf's PARAM flag (ggml has no call to clear it; the model layer freezes weights
    this way between fits)."""
    t = as_tensor(tensor, "set_trainable(tensor)").ptr
    if trainable:
        ggml_set_param(tensor)
    else:
        t.flags = t.flags & ~int(lib.GGML_TENSOR_FLAG_PARAM)


def ggml_set_loss(tensor: Tensor) -> Tensor:
    """Mark a scalar F32 tensor as the loss that ``ggml_build_backward_expand`` differentiates.

    Needed for hand-built backward passes; ggml-opt (``ggml_opt_init``, the fit functions) builds and
    marks its own loss from ``outputs`` and the loss type.

    Arguments:
        tensor: an F32 tensor with one element (e.g. from ``ggml_sum`` or ``ggml_cross_entropy_loss``).

    Value: the same tensor. Raises GgmlValueError for any other tensor.

    Example:
        >>> loss = ggml_set_loss(ggml_cross_entropy_loss(ctx, logits, labels))
    """
    t = as_tensor(tensor, "ggml_set_loss(tensor)").ptr
    expect(t.type == GGML_TYPE_F32 and lib.ggml_nelements(t) == 1,
           f"ggml_set_loss: the loss must be a scalar F32 tensor, got {type_name(t.type)} {list(tensor.shape)}")
    lib.ggml_set_loss(t)
    return tensor


def input_leaf(fn: str, t: Tensor, what: str = "tensor") -> Tensor:
    """``t`` if it can be flagged a graph input: ggml (0.25) asserts inputs are leaves made by ggml_new_tensor*."""
    if t.ptr.op != lib.GGML_OP_NONE:
        raise GgmlValueError(f"{fn}: {what} must be a tensor made by ggml_new_tensor* to be a graph input, got the "
                             f"result of {t.op_name} ({t.name or 'unnamed'}); make the tensor you write the data "
                             f"into the input and build the {t.op_name.lower()} from it")
    return t


def ggml_set_input(tensor: Tensor) -> Tensor:
    """Flag a tensor as a graph input, so the allocators never hand its memory to intermediate results.

    Flag tensors you write data into (a batch, labels) before the graph is allocated; the fit
    functions and the model layer do it for you.

    Arguments:
        tensor: a Tensor made by ``ggml_new_tensor*`` (a leaf: not the result of an op, a view or a
            reshape; ggml 0.25 aborts otherwise, so ggmlpy raises GgmlValueError).

    Value: the same tensor.

    Example:
        >>> x = ggml_set_input(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 32))
    """
    t = input_leaf("ggml_set_input", as_tensor(tensor, "ggml_set_input(tensor)"))
    lib.ggml_set_input(t.ptr)
    return tensor


def ggml_set_output(tensor: Tensor) -> Tensor:
    """Flag a tensor as a graph output, so the allocator keeps its memory until the graph has run.

    Without it, a scheduler may reuse an intermediate result's memory for later nodes; flag every
    tensor you want to read after computing.

    Arguments:
        tensor: a Tensor.

    Value: the same tensor.

    Example:
        >>> out = ggml_set_output(ggml_soft_max(ctx, logits))
    """
    lib.ggml_set_output(as_tensor(tensor, "ggml_set_output(tensor)").ptr)
    return tensor


def ggml_set_name(tensor: Tensor, name: str) -> Tensor:
    """Give a tensor a name (used in error messages, by ``ggml_get_tensor`` and as its GGUF name).

    Arguments:
        tensor: a Tensor.
        name: a str of at most ``GGML_MAX_NAME - 1`` (63) bytes in UTF-8 (else GgmlValueError).

    Value: the same tensor.

    Example:
        >>> w = ggml_set_name(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8), "dense.weight")
    """
    t = as_tensor(tensor, "ggml_set_name(tensor)").ptr
    raw = c_string("ggml_set_name", "name", name)
    expect(len(raw) < int(lib.GGML_MAX_NAME),
           f"ggml_set_name: names are at most {int(lib.GGML_MAX_NAME) - 1} bytes, got {len(raw)}")
    lib.ggml_set_name(t, raw)
    return tensor


def ggml_get_name(tensor: Tensor) -> str:
    """The tensor's name ('' if it has none).

    Arguments:
        tensor: a Tensor.

    Value: a str.

    Example:
        >>> ggml_get_name(w)
        'dense.weight'
    """
    return as_tensor(tensor, "ggml_get_name(tensor)").name


def ggml_tensor_shape(tensor: Tensor) -> tuple[int, int, int, int]:
    """The four sizes ``(ne0, ne1, ne2, ne3)`` of a tensor, ne0 the fastest-varying.

    Unused dimensions are 1. The numpy shape of the same data is the reverse, ``(ne3, ne2, ne1, ne0)``.

    Arguments:
        tensor: a Tensor.

    Value: a tuple of four ints.

    Example:
        >>> ggml_tensor_shape(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32))
        (784, 32, 1, 1)
    """
    return as_tensor(tensor, "ggml_tensor_shape(tensor)").shape


def ggml_tensor_type(tensor: Tensor) -> int:
    """The element type of a tensor, as a ``GGML_TYPE_*`` int.

    Arguments:
        tensor: a Tensor.

    Value: an int, e.g. ``GGML_TYPE_F32``.

    Example:
        >>> ggml_tensor_type(x) == GGML_TYPE_F32
        True
    """
    return as_tensor(tensor, "ggml_tensor_type(tensor)").type


def ggml_nelements(tensor: Tensor) -> int:
    """The number of elements of a tensor (``ne0 * ne1 * ne2 * ne3``).

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nelements(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 784, 32))
        25088
    """
    return as_tensor(tensor, "ggml_nelements(tensor)").nelements()


def ggml_nbytes(tensor: Tensor) -> int:
    """The size of a tensor's data in bytes (for a view: the span of bytes it covers).

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nbytes(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 10))
        40
    """
    return as_tensor(tensor, "ggml_nbytes(tensor)").nbytes()


def ggml_n_dims(tensor: Tensor) -> int:
    """The number of dimensions of a tensor, not counting trailing sizes of 1 (at least 1).

    Arguments:
        tensor: a Tensor.

    Value: an int from 1 to 4.

    Example:
        >>> ggml_n_dims(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 5, 3, 1))
        2
    """
    return int(lib.ggml_n_dims(as_tensor(tensor, "ggml_n_dims(tensor)").ptr))


def ggml_get_tensor(ctx: Context, name: str) -> Tensor | None:
    """The tensor of ``ctx`` named ``name``, or None if there is none.

    Arguments:
        ctx: a Context.
        name: the name given with ``ggml_set_name`` (or by ggml, e.g. in a GGUF context's ``.ggml_ctx``).

    Value: a Tensor or None.

    Example:
        >>> w = ggml_get_tensor(g.ggml_ctx, "dense.weight")
    """
    ptr = lib.ggml_get_tensor(unwrap(ctx, Context, "ggml_get_tensor(ctx)"), c_string("ggml_get_tensor", "name", name))
    return ctx.wrap_tensor(ptr) if ptr != ffi.NULL else None
