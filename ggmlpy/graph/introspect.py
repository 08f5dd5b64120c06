"""Pointer-level questions about tensors and ops that ggml answers without computing: element sizes, strides,
shape and layout predicates, op names and symbols.
"""
from __future__ import annotations

from collections.abc import Callable

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..errors import GgmlTypeError, GgmlValueError
from .objects import as_tensor, Tensor


def is_padded_1d(p: CData) -> bool:
    """ggml_is_padded_1d of tensor pointer ``p``."""
    return int(p.nb[0]) == int(lib.ggml_type_size(p.type)) and int(p.nb[2]) == int(p.nb[1]) * int(p.ne[1]) \
        and int(p.nb[3]) == int(p.nb[2]) * int(p.ne[2])


_OP_COUNT = int(lib.GGML_OP_COUNT)
_UNARY_OP_COUNT = int(lib.GGML_UNARY_OP_COUNT)


_OP_UNARY = next(i for i in range(_OP_COUNT) if ffi.string(lib.ggml_op_name(i)) == b"UNARY")


def ggml_element_size(tensor: Tensor) -> int:
    """Bytes of one element (block) of a tensor's type.

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_element_size(ggml_new_tensor_1d(ctx, GGML_TYPE_F16, 8))
        2
    """
    return int(lib.ggml_element_size(as_tensor(tensor, "ggml_element_size(tensor)").ptr))


def ggml_nrows(tensor: Tensor) -> int:
    """The number of rows of a tensor: ``ne1 * ne2 * ne3``.

    Arguments:
        tensor: a Tensor.

    Value: an int.

    Example:
        >>> ggml_nrows(ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 4, 3, 2))
        6
    """
    return int(lib.ggml_nrows(as_tensor(tensor, "ggml_nrows(tensor)").ptr))


def ggml_tensor_nb(tensor: Tensor) -> tuple[int, int, int, int]:
    """The byte strides ``(nb0, nb1, nb2, nb3)`` of a tensor (a view's differ from its shape's).

    Arguments:
        tensor: a Tensor.

    Value: a tuple of four ints.

    Example:
        >>> ggml_tensor_nb(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2))
        (4, 12, 24, 24)
    """
    t = as_tensor(tensor, "ggml_tensor_nb(tensor)").ptr
    return (int(t.nb[0]), int(t.nb[1]), int(t.nb[2]), int(t.nb[3]))


def _pair(fn: str, a: Tensor, b: Tensor) -> tuple[CData, CData]:
    return as_tensor(a, f"{fn}(a)").ptr, as_tensor(b, f"{fn}(b)").ptr


def ggml_are_same_shape(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same ``ne`` (type and strides aside).

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_shape(x, y)
    """
    return bool(lib.ggml_are_same_shape(*_pair("ggml_are_same_shape", a, b)))


def ggml_are_same_layout(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same type, shape ``ne`` and byte strides ``nb``: the same memory layout,
    so that the bytes of one can be copied into the other as they are.

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_layout(x, ggml_dup_tensor(ctx, x))
        True
    """
    pa, pb = _pair("ggml_are_same_layout", a, b)
    return pa.type == pb.type and bool(lib.ggml_are_same_shape(pa, pb)) and bool(lib.ggml_are_same_stride(pa, pb))


def ggml_are_same_stride(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors have the same byte strides ``nb``.

    Arguments:
        a, b: Tensors.

    Value: a bool.

    Example:
        >>> ggml_are_same_stride(x, ggml_transpose(ctx, x))
        False
    """
    return bool(lib.ggml_are_same_stride(*_pair("ggml_are_same_stride", a, b)))


def ggml_can_repeat(a: Tensor, b: Tensor) -> bool:
    """Whether ``a`` can be broadcast (repeated) to the shape of ``b``: each ``b.ne[k]`` a multiple of ``a.ne[k]``.

    Arguments:
        a: the smaller Tensor. b: the target Tensor.

    Value: a bool.

    Example:
        >>> ggml_can_repeat(ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4), ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8))
        True
    """
    return bool(lib.ggml_can_repeat(*_pair("ggml_can_repeat", a, b)))


def _predicate(name: str, summary: str, example: str) -> Callable[[Tensor], bool]:
    c_fn = getattr(lib, name)

    def predicate(tensor: Tensor) -> bool:
        return bool(c_fn(as_tensor(tensor, f"{name}(tensor)").ptr))

    predicate.__name__ = predicate.__qualname__ = name
    predicate.__doc__ = f"""{summary}

    Arguments:
        tensor: a Tensor.

    Value: a bool.

    Example:
        >>> {example}
    """
    return predicate


ggml_is_contiguous = _predicate(
    "ggml_is_contiguous", "Whether a tensor's elements are stored densely in ggml order (no gaps, not permuted).",
    "ggml_is_contiguous(ggml_transpose(ctx, x))")
ggml_is_contiguous_0 = _predicate(
    "ggml_is_contiguous_0", "Whether a tensor is contiguous (the same as ``ggml_is_contiguous``).",
    "ggml_is_contiguous_0(x)")
ggml_is_contiguous_1 = _predicate(
    "ggml_is_contiguous_1", "Whether a tensor is contiguous in dimensions >= 1 (rows may have gaps between them).",
    "ggml_is_contiguous_1(ggml_view_2d(ctx, x, 2, 3, 16, 0))")
ggml_is_contiguous_2 = _predicate(
    "ggml_is_contiguous_2", "Whether a tensor is contiguous in dimensions >= 2 (matrices may have gaps between them).",
    "ggml_is_contiguous_2(x)")
ggml_is_contiguous_channels = _predicate(
    "ggml_is_contiguous_channels", "Whether a tensor's channels (dimension 2) are innermost in memory (a "
    "channels-last layout from a permutation).", "ggml_is_contiguous_channels(x)")
ggml_is_contiguous_rows = _predicate(
    "ggml_is_contiguous_rows", "Whether each row of a tensor (its ne0 elements) is stored densely.",
    "ggml_is_contiguous_rows(x)")
ggml_is_contiguously_allocated = _predicate(
    "ggml_is_contiguously_allocated", "Whether a tensor's bytes form one gap-free block (possibly permuted).",
    "ggml_is_contiguously_allocated(ggml_permute(ctx, x, 1, 0, 2, 3))")
ggml_is_permuted = _predicate(
    "ggml_is_permuted", "Whether a tensor's dimensions are permuted (its strides are not increasing).",
    "ggml_is_permuted(ggml_permute(ctx, x, 1, 0, 2, 3))")
ggml_is_transposed = _predicate(
    "ggml_is_transposed", "Whether a tensor is transposed (its ne0 stride is larger than its ne1 stride).",
    "ggml_is_transposed(ggml_transpose(ctx, x))")


# ---------------------------------------------------------------- ops

def make_op(fn: str, op: object, count: int, what: str) -> int:
    if not is_int(op):
        raise GgmlTypeError(f"{fn}: op must be an int ({what}), got {op!r}")
    if not 0 <= int(op) < count:
        raise GgmlValueError(f"{fn}: op must be in [0, {count}) ({what}), got {op}")
    return int(op)


def ggml_op_name(op: int) -> str:
    """The name of a ggml operation number, e.g. ``"ADD"``, ``"MUL_MAT"``.

    Arguments:
        op: an operation number in ``[0, GGML_OP_COUNT)`` (a tensor's ``op``).

    Value: a str.

    Example:
        >>> ggml_op_name(0)
        'NONE'
    """
    return ffi.string(lib.ggml_op_name(make_op("ggml_op_name", op, _OP_COUNT, "a ggml_op"))).decode()


def ggml_op_symbol(op: int) -> str:
    """The symbol of a ggml operation number, e.g. ``"x+y"`` for ADD, ``"X*Y"`` for MUL_MAT.

    Arguments:
        op: an operation number in ``[0, GGML_OP_COUNT)``.

    Value: a str.

    Example:
        >>> ggml_op_symbol(0)
        'none'
    """
    return ffi.string(lib.ggml_op_symbol(make_op("ggml_op_symbol", op, _OP_COUNT, "a ggml_op"))).decode()


def ggml_unary_op_name(op: int) -> str:
    """The name of a unary operation number, e.g. ``"RELU"``, ``"GELU"``.

    Arguments:
        op: a unary operation number in ``[0, GGML_UNARY_OP_COUNT)`` (``ggml_get_unary_op``).

    Value: a str.

    Example:
        >>> ggml_unary_op_name(ggml_get_unary_op(ggml_relu(ctx, x)))
        'RELU'
    """
    return ffi.string(lib.ggml_unary_op_name(make_op("ggml_unary_op_name", op, _UNARY_OP_COUNT,
                                                  "a ggml_unary_op"))).decode()


def ggml_op_desc(tensor: Tensor) -> str:
    """What computes a tensor: its op name, or the unary / GLU op's name for those (``"RELU"``, not ``"UNARY"``).

    Arguments:
        tensor: a Tensor.

    Value: a str (``"NONE"`` for a leaf).

    Example:
        >>> ggml_op_desc(ggml_relu(ctx, x))
        'RELU'
    """
    return ffi.string(lib.ggml_op_desc(as_tensor(tensor, "ggml_op_desc(tensor)").ptr)).decode()


def ggml_get_unary_op(tensor: Tensor) -> int:
    """The unary operation number of a tensor made by a unary op (``ggml_relu``, ``ggml_gelu``, ...).

    Arguments:
        tensor: the result of a unary op (else GgmlValueError: ggml asserts it).

    Value: an int (name it with ``ggml_unary_op_name``).

    Example:
        >>> ggml_get_unary_op(ggml_relu(ctx, x))
    """
    t = as_tensor(tensor, "ggml_get_unary_op(tensor)").ptr
    if int(t.op) != _OP_UNARY:
        raise GgmlValueError(f"ggml_get_unary_op: the tensor is made by {ggml_op_desc(tensor)}, not by a unary op "
                             "(ggml_relu, ggml_gelu, ...); check ggml_op_desc first")
    return int(lib.ggml_get_unary_op(t))
