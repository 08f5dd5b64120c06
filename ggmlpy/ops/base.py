"""What every op builder shares: the operand rules (types, broadcasting, products, reshapes, views) checked
before ggml is called, and the helpers that unwrap operands and wrap the result.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Callable

from .._ffi import CData, ffi, lib
from ..core import args as chk
from ..core.args import fail, INT32_MAX, int_arg, is_int, Shape
from ..core.handle import unwrap
from ..core.types import FLOAT_TYPES, GGML_TYPE_F16, GGML_TYPE_F32, type_name
from ..errors import GgmlTypeError
from ..graph.objects import as_tensor, Context, Tensor


def types(fn: str, t: Tensor, allowed: Iterable[int], what: str = "a") -> None:
    allowed = set(allowed)
    if t.type not in allowed:
        names = "/".join(sorted(type_name(x) for x in allowed))
        fail(fn, f"{what} must be {names}, got {type_name(t.type)}", GgmlTypeError)


def floating(fn: str, *named: tuple[str, Tensor]) -> None:
    for what, t in named:
        types(fn, t, FLOAT_TYPES, what)


def can_repeat(small: Shape, big: Shape) -> bool:
    return all(s > 0 and b % s == 0 for s, b in zip(small, big))


def broadcast_into(fn: str, a: Tensor, b: Tensor) -> Shape:
    """b must repeat into a (ggml broadcasts the second operand only)."""
    if not can_repeat(b.shape, a.shape):
        fail(fn, f"b {list(b.shape)} cannot be broadcast to a {list(a.shape)} (each dimension of a must be a "
                 "multiple of b's; ggml broadcasts the second operand only, so swap them or use ggml_repeat)")
    return a.shape


def same_shape(fn: str, a: Tensor, b: Tensor) -> Shape:
    if a.shape != b.shape:
        fail(fn, f"a and b must have the same shape, got {list(a.shape)} and {list(b.shape)}")
    return a.shape


def contiguous(fn: str, t: Tensor, what: str = "a") -> None:
    if not lib.ggml_is_contiguous(t.ptr):
        fail(fn, f"{what} must be contiguous (apply ggml_cont first), got a strided view")


def padded_1d(fn: str, t: Tensor, what: str = "a") -> None:
    """ggml's ggml_is_padded_1d, which some op constructors assert (ggml_scale): contiguous elements and
    ne[1]-rows stacked without gaps. Stricter than ggml_is_contiguous, which skips dimensions of size 1 (a
    transposed [1, n] tensor is contiguous but not padded-1d)."""
    p = t.ptr
    ok = int(p.nb[0]) == int(lib.ggml_type_size(p.type)) and int(p.nb[2]) == int(p.nb[1]) * int(p.ne[1]) \
        and int(p.nb[3]) == int(p.nb[2]) * int(p.ne[2])
    if not ok:
        fail(fn, f"{what} must be laid out contiguously (apply ggml_cont first), got a view with strides "
                 f"{[int(p.nb[i]) for i in range(4)]} for shape {[int(p.ne[i]) for i in range(4)]}")


def rows_contiguous(fn: str, t: Tensor, what: str = "a") -> None:
    p = t.ptr
    if int(p.nb[0]) != int(lib.ggml_type_size(p.type)):
        fail(fn, f"{what} must have contiguous rows (apply ggml_cont first), got a transposed/strided view")


def not_transposed(fn: str, t: Tensor, what: str = "a") -> None:
    if lib.ggml_is_transposed(t.ptr):
        fail(fn, f"{what} must not be transposed (apply ggml_cont to the transpose first)")


def mul_mat(fn: str, a: Tensor, b: Tensor) -> Shape:
    (a0, a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a0 != b0:
        fail(fn, f"a and b must share ne[0] (the reduced dimension), got a {list(a.shape)} and b {list(b.shape)}")
    if b2 % a2 or b3 % a3:
        fail(fn, f"b's ne[2], ne[3] must be multiples of a's, got a {list(a.shape)} and b {list(b.shape)}")
    if lib.ggml_is_transposed(a.ptr):
        fail(fn, "a must not be transposed (apply ggml_cont to the transpose first)")
    return (a1, b1, b2, b3)


def out_prod(fn: str, a: Tensor, b: Tensor) -> Shape:
    (a0, a1, a2, a3), (b0, b1, b2, b3) = a.shape, b.shape
    if a1 != b1:
        fail(fn, f"a and b must share ne[1], got a {list(a.shape)} and b {list(b.shape)}")
    if b2 % a2 or b3 % a3:
        fail(fn, f"b's ne[2], ne[3] must be multiples of a's, got a {list(a.shape)} and b {list(b.shape)}")
    return (a0, b0, b2, b3)


def pad4(ne: tuple[int, ...]) -> Shape:
    """A shape of 1 to 4 dimensions as ggml's four (the missing ones 1)."""
    full = list(ne) + [1] * (4 - len(ne))
    return full[0], full[1], full[2], full[3]


def reshape(fn: str, a: Tensor, ne: tuple[int, ...]) -> Shape:
    for i, n in enumerate(ne):
        int_arg(fn, f"ne{i}", n, 1)
    count = 1
    for n in ne:
        count *= n
    if count != a.nelements():
        fail(fn, f"the new shape {list(ne)} has {count} elements, a {list(a.shape)} has {a.nelements()}")
    contiguous(fn, a)
    return pad4(ne)


def view(fn: str, a: Tensor, ne: tuple[int, ...], nb: tuple[int, ...], offset: int) -> Shape:
    for i, n in enumerate(ne):
        int_arg(fn, f"ne{i}", n, 1)
    for i, n in enumerate(nb):
        int_arg(fn, f"nb{i + 1}", n, 1)
    int_arg(fn, "offset", offset, 0)
    esize = int(lib.ggml_type_size(a.type))
    if int(lib.ggml_blck_size(a.type)) == 1:  # plain types: offsets and strides fall on whole elements
        for name, v in [("offset", offset)] + [(f"nb{i + 1}", n) for i, n in enumerate(nb)]:
            if v % esize:
                fail(fn, f"{name} is in bytes and must be a multiple of the element size {esize} "
                         f"({type_name(a.type)}), got {v}; for an element offset k pass k * {esize}")
    strides = (esize,) + tuple(nb)
    last = offset + sum((n - 1) * s for n, s in zip(ne, strides)) + esize
    if last > a.nbytes():
        fail(fn, f"the view reaches byte {last}, beyond a's {a.nbytes()} bytes")
    return pad4(ne)


def permutation(fn: str, axes: tuple[int, ...]) -> None:
    if not all(is_int(x) for x in axes) or sorted(int(x) for x in axes) != [0, 1, 2, 3]:
        fail(fn, f"the axes must be a permutation of 0, 1, 2, 3, got {list(axes)}")


def out_size(fn: str, what: str, n: int, k: int, s: int, p: int, d: int = 1) -> int:
    # ggml computes sizes in C int (32 bits): a padding, kernel or dilation that overflows there gives it a
    # negative size (an abort, or a tensor of negative shape), whatever Python's exact integers say
    for name, v in (("input + 2 * padding", n + 2 * p), ("dilation * (kernel - 1)", d * (k - 1)),
                    ("stride", s), ("padding", p)):
        if abs(v) > INT32_MAX:
            fail(fn, f"{what}: {name} is {v}, beyond ggml's 32-bit sizes ({INT32_MAX}); use a smaller padding, "
                     "kernel or dilation")
    size = (n + 2 * p - d * (k - 1) - 1) // s + 1
    if size < 1:
        fail(fn, f"the output {what} would be {size}: input {n}, kernel {k}, stride {s}, padding {p}, dilation {d}")
    return size


F32_F16 = {GGML_TYPE_F32, GGML_TYPE_F16}


def make_op(fn: str, ctx: Context, c_fn: Callable[..., CData], tensors: tuple[Tensor | None, ...],
            shape: tuple[int, ...] | None, args: tuple[object, ...] = (), out_type: int = GGML_TYPE_F32) -> Tensor:
    """Check the context, reserve room for the result, call ggml and wrap the result."""
    ctx_ptr = unwrap(ctx, Context, f"{fn}(ctx)")
    n = 1
    for d in shape or (1,):
        n *= d
    if n * int(lib.ggml_type_size(out_type)) > chk.INT64_MAX:
        chk.fail(fn, f"the result would have shape {list(shape or (1,))}: {n} elements, beyond ggml's 64-bit sizes; "
                     "use smaller operands")
    ctx.reserve(n * int(lib.ggml_type_size(out_type)), what=f"{fn} result")
    ptrs = [t.ptr if t is not None else ffi.NULL for t in tensors]
    return Tensor(c_fn(ctx_ptr, *ptrs, *args), ctx, sources=tensors)  # it depends on its operands' contexts


def operand(fn: str, x: object, what: str = "a") -> Tensor:
    return as_tensor(x, f"{fn}({what})")
