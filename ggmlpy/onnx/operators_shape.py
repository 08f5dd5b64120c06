"""ONNX's shape operators: reshapes, transposes, concatenation, splitting, slicing, gathering, casts, and the values
known when the graph is built (Shape, Constant, ConstantOfShape, Range), which numpy computes."""
from __future__ import annotations

import numpy as np

from ..core.types import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32
from ..ops import elementwise as E
from ..ops.activation import ggml_floor
from ..ops.layout import ggml_cast, ggml_get_rows, ggml_permute, ggml_view_4d
from ..ops.reduce import ggml_concat, ggml_repeat
from .protobuf import np_dtype
from .registry import axis_of, const_arg, op
from .values import Build, ne_of, Value


def transpose_tensor(b: Build, t, rank: int, perm: list[int]):
    """``t`` (ONNX rank ``rank``) transposed as numpy's ``transpose(perm)``, contiguous."""
    if list(perm) == list(range(rank)):
        return t
    axes = [0, 1, 2, 3]
    for j, p in enumerate(perm):   # ONNX input axis p becomes output axis j; in ggml's order, reversed
        axes[rank - 1 - p] = rank - 1 - j
    return E.ggml_cont(b.ctx, ggml_permute(b.ctx, t, *axes))


def _shape_arg(node, xs, name: str = "shape"):
    return [int(d) for d in np.asarray(xs[1].const if isinstance(xs[1], Value) else xs[1]).reshape(-1)]


def _reshape_target(shape_in: tuple[int, ...], spec: list[int], allowzero: bool) -> tuple[int, ...]:
    out = [shape_in[i] if d == 0 and not allowzero and i < len(shape_in) else d for i, d in enumerate(spec)]
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = int(np.prod(shape_in, dtype=np.int64)) // max(known, 1)
    return tuple(out)


@op("Reshape", static=(1,), attrs=("allowzero",), fold=lambda node, xs, opset: [np.reshape(
    xs[0], _reshape_target(np.shape(xs[0]), [int(d) for d in np.asarray(xs[1]).reshape(-1)],
                           bool(node.attrs.get("allowzero", 0))))])
def _reshape(b: Build, node, xs, opset):
    spec = [int(d) for d in const_arg(b, xs[1], "shape").reshape(-1)]
    shape = _reshape_target(xs[0].shape, spec, bool(node.attrs.get("allowzero", 0)))
    if int(np.prod(shape, dtype=np.int64)) != int(np.prod(xs[0].shape, dtype=np.int64)):
        raise b.fail(f"cannot reshape {xs[0].shape} to {spec}")
    return [Value(shape, b.reshaped(xs[0], shape))]


def _flatten_shape(shape, axis):
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))


@op("Flatten", attrs=("axis",), fold=lambda node, xs, opset: [np.reshape(
    xs[0], _flatten_shape(np.shape(xs[0]), int(node.attrs.get("axis", 1)) % max(np.ndim(xs[0]), 1)
                          if int(node.attrs.get("axis", 1)) != np.ndim(xs[0]) else np.ndim(xs[0])))])
def _flatten(b: Build, node, xs, opset):
    rank = len(xs[0].shape)
    axis = int(node.attrs.get("axis", 1))
    axis = rank if axis == rank else axis_of(b, axis, rank)
    shape = _flatten_shape(xs[0].shape, axis)
    return [Value(shape, b.reshaped(xs[0], shape))]


def _axes(b: Build | None, node, xs, opset, rank: int) -> list[int] | None:
    if "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    elif len(xs) > 1 and xs[1] is not None:
        axes = [int(a) for a in np.asarray(xs[1].const if isinstance(xs[1], Value) else xs[1]).reshape(-1)]
    else:
        return None
    return [a % rank for a in axes]


def _squeeze_shape(shape, axes):
    return tuple(d for i, d in enumerate(shape) if (i not in axes if axes is not None else d != 1))


def _unsqueeze_shape(shape, axes_raw):
    rank = len(shape) + len(axes_raw)
    axes = sorted(a % rank for a in axes_raw)
    out, it = [], iter(shape)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return tuple(out)


def _fold_squeeze(node, xs, opset):
    axes = _axes(None, node, xs, opset, np.ndim(xs[0]))
    return [np.squeeze(xs[0], axis=None if axes is None else tuple(axes))]


@op("Squeeze", static=(1,), attrs=("axes",), fold=_fold_squeeze)
def _squeeze(b: Build, node, xs, opset):
    if len(xs) > 1 and xs[1] is not None:
        const_arg(b, xs[1], "axes")
    shape = _squeeze_shape(xs[0].shape, _axes(b, node, xs, opset, len(xs[0].shape)))
    return [Value(shape, b.reshaped(xs[0], shape))]


def _unsqueeze_axes(node, xs):
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    return [int(a) for a in np.asarray(xs[1].const if isinstance(xs[1], Value) else xs[1]).reshape(-1)]


@op("Unsqueeze", static=(1,), attrs=("axes",), fold=lambda node, xs, opset: [np.reshape(
    xs[0], _unsqueeze_shape(np.shape(xs[0]), _unsqueeze_axes(node, xs)))])
def _unsqueeze(b: Build, node, xs, opset):
    if len(xs) > 1 and xs[1] is not None:
        const_arg(b, xs[1], "axes")
    shape = _unsqueeze_shape(xs[0].shape, _unsqueeze_axes(node, xs))
    return [Value(shape, b.reshaped(xs[0], shape))]


@op("Transpose", attrs=("perm",), fold=lambda node, xs, opset: [np.transpose(xs[0], node.attrs.get("perm"))])
def _transpose(b: Build, node, xs, opset):
    rank = len(xs[0].shape)
    perm = [int(p) for p in node.attrs.get("perm", list(reversed(range(rank))))]
    if sorted(perm) != list(range(rank)):
        raise b.fail(f"Transpose perm {perm} is not a permutation of the {rank} axes")
    b.check_rank(xs[0].shape)
    shape = tuple(xs[0].shape[p] for p in perm)
    if rank > 4:   # its size-1 axes left out (they move nowhere that matters), then its own shape again
        kept = [i for i in range(rank) if xs[0].shape[i] != 1]
        inner = [kept.index(p) for p in perm if xs[0].shape[p] != 1]
        squeezed = b.reshaped(xs[0], tuple(xs[0].shape[i] for i in kept))
        moved = transpose_tensor(b, squeezed, len(kept), inner)
        return [Value(shape, b.reshaped(Value(tuple(xs[0].shape[kept[i]] for i in inner), moved), shape))]
    return [Value(shape, transpose_tensor(b, b.tensor(xs[0]), rank, perm))]


@op("Concat", attrs=("axis",), fold=lambda node, xs, opset: [np.concatenate(
    [x for x in xs if x is not None and np.size(x)], axis=int(node.attrs["axis"]))])
def _concat(b: Build, node, xs, opset):
    parts = [x for x in xs if x is not None and int(np.prod(x.shape, dtype=np.int64))]
    rank = len(parts[0].shape)
    axis = axis_of(b, node.attrs.get("axis", 0), rank)
    out = b.tensor(parts[0])
    shape = list(parts[0].shape)
    for p in parts[1:]:
        out = ggml_concat(b.ctx, b.contiguous(out), b.contiguous(b.tensor(p)), rank - 1 - axis)
        shape[axis] += p.shape[axis]
    return [Value(tuple(shape), out)]


def slice_axis(b: Build, t, shape: tuple[int, ...], axis: int, start: int, stop: int):
    """``t`` (ONNX ``shape``) cut to ``start:stop`` along ``axis`` (a view; step 1)."""
    ne = list(ne_of(shape)) + [1] * (4 - len(ne_of(shape)))
    g = len(shape) - 1 - axis
    t = b.contiguous(t)
    nb = [int(t.ptr.nb[i]) for i in range(4)]
    ne[g] = stop - start
    view = ggml_view_4d(b.ctx, t, ne[0], ne[1], ne[2], ne[3], nb[1], nb[2], nb[3], start * nb[g])
    # a copy where the view starts inside the tensor: a GPU's kernels take operands at aligned offsets only
    return view if start == 0 else E.ggml_cont(b.ctx, view)


def _slice_params(shape, starts, ends, axes, steps):
    rank = len(shape)
    if axes is not None and any(not -rank <= int(a) < rank for a in axes):
        raise ValueError(f"Slice axes {list(axes)} out of range for a tensor of rank {rank}")
    axes = list(range(len(starts))) if axes is None else [int(a) % rank for a in axes]
    steps = [1] * len(starts) if steps is None else [int(s) for s in steps]
    out = []
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        out.append((ax, *slice(int(st), int(en), sp).indices(shape[ax])))
    return out


def _fold_slice(node, xs, opset):
    if opset < 10:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    else:
        starts, ends = xs[1], xs[2]
        axes = xs[3] if len(xs) > 3 else None
        steps = xs[4] if len(xs) > 4 else None
    index = [slice(None)] * np.ndim(xs[0])
    for ax, st, en, sp in _slice_params(np.shape(xs[0]), list(np.ravel(starts)), list(np.ravel(ends)),
                                        None if axes is None else list(np.ravel(axes)),
                                        None if steps is None else list(np.ravel(steps))):
        index[ax] = slice(st, en, sp)
    return [np.asarray(xs[0])[tuple(index)]]


@op("Slice", static=(1, 2, 3, 4), attrs=("starts", "ends", "axes"), fold=_fold_slice)
def _slice(b: Build, node, xs, opset):
    x = xs[0]
    if opset < 10:
        starts, ends, axes, steps = node.attrs["starts"], node.attrs["ends"], node.attrs.get("axes"), None
    else:
        starts, ends = const_arg(b, xs[1], "starts"), const_arg(b, xs[2], "ends")
        axes = const_arg(b, xs[3], "axes") if len(xs) > 3 and xs[3] is not None else None
        steps = const_arg(b, xs[4], "steps") if len(xs) > 4 and xs[4] is not None else None
    t, shape = b.tensor(x), list(x.shape)
    try:
        params = _slice_params(x.shape, list(np.ravel(starts)), list(np.ravel(ends)),
                               None if axes is None else list(np.ravel(axes)),
                               None if steps is None else list(np.ravel(steps)))
    except ValueError as exc:
        raise b.fail(str(exc)) from None
    for ax, st, en, sp in params:
        if sp != 1:
            raise b.fail(f"a slice with step {sp} of data computed by the graph is not supported (step 1 is)")
        en = max(en, st)
        t = slice_axis(b, t, tuple(shape), ax, st, en)
        shape[ax] = en - st
    return [Value(tuple(shape), b.contiguous(t))]


def _split_sizes(b: Build | None, node, xs, opset, length: int) -> list[int]:
    if "split" in node.attrs:
        return [int(s) for s in node.attrs["split"]]
    if len(xs) > 1 and xs[1] is not None:
        arr = xs[1].const if isinstance(xs[1], Value) else xs[1]
        if arr is None and b is not None:
            const_arg(b, xs[1], "split")
        return [int(s) for s in np.asarray(arr).reshape(-1)]
    parts = int(node.attrs.get("num_outputs", len(node.outputs)))
    size = -(-length // parts)
    return [min(size, length - i * size) for i in range(parts)]


@op("Split", static=(1,), attrs=("axis", "split", "num_outputs"), fold=lambda node, xs, opset: list(np.split(
    xs[0], np.cumsum(_split_sizes(None, node, xs, opset, np.shape(xs[0])[int(node.attrs.get("axis", 0))]))[:-1],
    axis=int(node.attrs.get("axis", 0)))))
def _split(b: Build, node, xs, opset):
    x = xs[0]
    axis = axis_of(b, node.attrs.get("axis", 0), len(x.shape))
    sizes = _split_sizes(b, node, xs, opset, x.shape[axis])
    outs, start = [], 0
    for size in sizes:
        shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
        outs.append(Value(shape, b.contiguous(slice_axis(b, b.tensor(x), x.shape, axis, start, start + size))))
        start += size
    return outs


@op("Gather", attrs=("axis",), fold=lambda node, xs, opset: [np.take(
    xs[0], np.asarray(xs[1]).astype(np.int64), axis=int(node.attrs.get("axis", 0)))])
def _gather(b: Build, node, xs, opset):
    """ggml's row lookup on the data with ``axis`` moved first; indices known, or an integer input (whose values
    onnx_run checks against the axis' length, wrapping negative ones, before the compute)."""
    data, idx = xs
    rank = len(data.shape)
    axis = axis_of(b, node.attrs.get("axis", 0), rank)
    n = data.shape[axis]
    if idx.known:
        ids = np.asarray(idx.const, np.int64)
        ids = np.where(ids < 0, ids + n, ids)
        if ((ids < 0) | (ids >= n)).any():
            raise b.fail(f"Gather indices {ids.reshape(-1)[:8].tolist()} out of range for an axis of {n}")
        rows = b.tensor(Value.of(ids.astype(np.int32)), integer=True)
    elif idx.source is not None:
        rows = b.index_input(idx.source, idx.shape, n)
    else:
        raise b.fail("Gather indices computed by the graph are not supported (known ones and integer inputs are)")
    rest = data.shape[:axis] + data.shape[axis + 1:]
    inner = int(np.prod(rest, dtype=np.int64))
    moved = transpose_tensor(b, b.tensor(data), rank, [axis] + [i for i in range(rank) if i != axis])
    table = b.reshaped(Value((n,) + rest, moved), (n, inner))
    count = int(np.prod(idx.shape, dtype=np.int64))
    flat = b.reshaped(Value(idx.shape, rows), (count,)) if idx.shape != (count,) else rows
    got = Value(tuple(idx.shape) + rest, None)
    b.check_rank(got.shape)
    got.tensor = b.reshaped(Value((count, inner), ggml_get_rows(b.ctx, table, b.contiguous(flat))), got.shape)
    k = len(idx.shape)
    order = list(range(k, k + axis)) + list(range(k)) + list(range(k + axis, k + len(rest)))
    shape = data.shape[:axis] + tuple(idx.shape) + data.shape[axis + 1:]
    return [Value(shape, transpose_tensor(b, got.tensor, len(got.shape), order))]


@op("Expand", static=(1,), fold=lambda node, xs, opset: [np.asarray(xs[0]) * np.ones(np.asarray(xs[1]).astype(np.int64),
                                                                        np.asarray(xs[0]).dtype)])
def _expand(b: Build, node, xs, opset):
    target = [int(d) for d in const_arg(b, xs[1], "shape").reshape(-1)]
    shape = tuple(int(d) for d in np.broadcast_shapes(xs[0].shape, tuple(target)))
    return [Value(shape, b.broadcast(xs[0], shape))]


@op("Tile", static=(1,), fold=lambda node, xs, opset: [np.tile(xs[0], np.asarray(xs[1]).astype(np.int64))])
def _tile(b: Build, node, xs, opset):
    reps = [int(r) for r in const_arg(b, xs[1], "repeats").reshape(-1)]
    if len(reps) != len(xs[0].shape) or min(reps, default=1) < 1:
        raise b.fail(f"Tile repeats {reps} must be one int >= 1 per axis of the input {xs[0].shape}")
    shape = tuple(d * r for d, r in zip(xs[0].shape, reps))
    b.check_rank(shape)   # ggml's repeat tiles the whole tensor, as numpy's tile
    return [Value(shape, ggml_repeat(b.ctx, b.contiguous(b.tensor(xs[0])), b.shape_target(shape)))]


# ---------------------------------------------------------------- values known when the graph is built
def _fold_only(b: Build, node, xs, opset):
    raise b.fail(f"{node.op} of data computed by the graph is not supported (its inputs must be known)")


@op("Shape", attrs=("start", "end"))
def _shape_op(b: Build, node, xs, opset):
    shape = np.asarray(xs[0].shape, np.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
    return [Value.of(shape[slice(int(start), None if end is None else int(end))])]


@op("Size")
def _size(b: Build, node, xs, opset):
    return [Value.of(np.asarray(int(np.prod(xs[0].shape, dtype=np.int64)), np.int64))]


@op("Constant", attrs=("value", "value_float", "value_floats", "value_int", "value_ints"))
def _constant(b: Build, node, xs, opset):
    a = node.attrs
    if "value" in a:
        from .protobuf import onnx_package
        return [Value.of(onnx_package("onnx_load").numpy_helper.to_array(a["value"]))]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            return [Value.of(np.asarray(a[key], dtype))]
    raise b.fail("a Constant without a value")


@op("ConstantOfShape", static=(0,), attrs=("value",))
def _constant_of_shape(b: Build, node, xs, opset):
    shape = [int(d) for d in const_arg(b, xs[0], "shape").reshape(-1)]
    fill = np.zeros(1, np.float32)
    if "value" in node.attrs:
        from .protobuf import onnx_package
        fill = onnx_package("onnx_load").numpy_helper.to_array(node.attrs["value"]).reshape(-1)
    return [Value.of(np.full(shape, fill[0], fill.dtype))]


@op("Range", static=(0, 1, 2), fold=lambda node, xs, opset: [np.arange(
    np.asarray(xs[0]).item(), np.asarray(xs[1]).item(), np.asarray(xs[2]).item()).astype(np.asarray(xs[0]).dtype)])
def _range(b: Build, node, xs, opset):
    return _fold_only(b, node, xs, opset)


def _cast_dtype(node, attr: str = "to"):
    return np_dtype(int(node.attrs[attr]), f"{node.op} node '{node.name}': its {attr}")


@op("Cast", attrs=("to", "saturate", "round_mode"), fold=lambda node, xs, opset: [np.asarray(xs[0]).astype(
    _cast_dtype(node))])
def _cast(b: Build, node, xs, opset):
    dtype = _cast_dtype(node)
    t = b.tensor(xs[0])
    if dtype in (np.float32, np.float64):   # ggml computes in F32
        return [Value(xs[0].shape, t, dtype=dtype)]
    if dtype.name in ("float16", "bfloat16"):   # rounded to the type and back
        half = ggml_cast(b.ctx, b.contiguous(t), GGML_TYPE_F16 if dtype.name == "float16" else GGML_TYPE_BF16)
        return [Value(xs[0].shape, ggml_cast(b.ctx, half, GGML_TYPE_F32), dtype=dtype)]
    if dtype == np.bool_:
        return [Value(xs[0].shape, E.ggml_step(b.ctx, E.ggml_abs(b.ctx, t)), dtype=dtype)]
    if dtype.kind in "iu" and dtype.itemsize >= 1 and dtype.name in _INTEGERS:
        # truncation toward zero, kept in F32 (exact below 2^24)
        sign = E.ggml_scale_bias(b.ctx, E.ggml_step(b.ctx, t), 2.0, -1.0)
        return [Value(xs[0].shape, E.ggml_mul(b.ctx, ggml_floor(b.ctx, E.ggml_abs(b.ctx, t)), sign), dtype=dtype)]
    raise b.fail(f"Cast to {dtype.name} of data computed by the graph is not supported (float32/64, float16, "
                 "bfloat16, bool and 8- to 64-bit integers are)")


_INTEGERS = ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64")


def _eye_like(node, xs, opset):
    shape = np.asarray(xs[0]).shape
    dtype = _cast_dtype(node, "dtype") if "dtype" in node.attrs else np.asarray(xs[0]).dtype
    return [np.eye(shape[0], shape[1], int(node.attrs.get("k", 0)), dtype=dtype)]


@op("EyeLike", attrs=("dtype", "k"), fold=_eye_like)
def _eye_like_build(b: Build, node, xs, opset):
    """Ones on a diagonal of the input's (2-D) shape: known from the shape alone."""
    if len(xs[0].shape) != 2:
        raise b.fail(f"EyeLike takes a 2-D input, got shape {xs[0].shape}")
    return [Value.of(_eye_like(node, [np.zeros(xs[0].shape, np.float32)], opset)[0])]


@op("NonZero", fold=lambda node, xs, opset: [np.array(np.nonzero(xs[0]), np.int64)])
def _non_zero(b: Build, node, xs, opset):
    raise b.fail("NonZero of data the graph computes: its output's shape depends on the values (ggml's graphs have "
                 "fixed shapes); it is computed where its input is known when the graph is built")


def _scatter_targets(node, data_shape: tuple[int, ...], indices) -> tuple[np.ndarray, ...]:
    """Where each update goes (ScatterElements): the flat positions' coordinates, negative indices wrapped."""
    axis = int(node.attrs.get("axis", 0)) % len(data_shape)
    idx = np.asarray(indices, np.int64)
    if idx.ndim != len(data_shape) or any(i > d for a, (i, d) in enumerate(zip(idx.shape, data_shape)) if a != axis):
        raise IndexError(f"ScatterElements indices of shape {idx.shape} do not fit data of shape {data_shape} (the "
                         "same rank, and no larger on the other axes)")
    idx = np.where(idx < 0, idx + data_shape[axis], idx)
    if ((idx < 0) | (idx >= data_shape[axis])).any():
        raise IndexError(f"ScatterElements indices out of range for an axis of {data_shape[axis]}")
    where: list[np.ndarray] = list(np.indices(idx.shape, sparse=True))
    where[axis] = idx
    return tuple(np.broadcast_arrays(*where))


def _reduction(node) -> str:
    return str(node.attrs.get("reduction", "none"))


def _scatter_elements(node, xs, opset):
    data, updates = np.array(xs[0]), np.asarray(xs[2])
    target = _scatter_targets(node, data.shape, xs[1])
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}.get(_reduction(node))
    if ufunc is None:
        data[target] = updates
    else:
        ufunc.at(data, target, updates)
    return [data]


@op("ScatterElements", "Scatter", attrs=("axis", "reduction"), fold=_scatter_elements, static=(1,))
def _scatter_build(b: Build, node, xs, opset):
    """With the indices known (an initializer, or an input whose values pick the graph): each output element picked
    from the data or the updates by one row gather (reduction none: the last of duplicates), or (add) the data plus
    each position's first, second, ... update gathered in turn (0 where it has none), in their order: exact, and
    infinities stay where they are."""
    data, updates = xs[0], xs[2]
    reduction = _reduction(node)
    if reduction not in ("none", "add"):
        raise b.fail(f"ScatterElements with reduction '{reduction}' of data the graph computes is not supported "
                     "(none and add are)")
    try:
        target = _scatter_targets(node, data.shape, const_arg(b, xs[1], "indices"))
    except IndexError as exc:
        raise b.fail(str(exc)) from None
    if updates.shape != tuple(np.asarray(target[0]).shape):
        raise b.fail(f"ScatterElements updates of shape {updates.shape} for indices of shape "
                     f"{np.asarray(target[0]).shape}: they must be the same")
    n_out, n_up = int(np.prod(data.shape)), int(np.prod(updates.shape))
    flat = np.ravel_multi_index(target, data.shape).reshape(-1)
    ctx = b.ctx

    def rows_of(v: Value, n: int):
        return b.reshaped(v, (n, 1))   # n rows of one element
    if reduction == "none":
        pick = np.arange(n_out)
        pick[flat] = n_out + np.arange(n_up)   # the last update of a position wins
        table = ggml_concat(ctx, rows_of(data, n_out), rows_of(updates, n_up), 1)
        y = ggml_get_rows(ctx, table, b.tensor(Value.of(pick.astype(np.int32)), integer=True))
        return [Value(data.shape, b.reshaped(Value((n_out, 1), y), data.shape))]
    table = ggml_concat(ctx, b.tensor(Value.of(np.zeros((1, 1), np.float32))), rows_of(updates, n_up), 1)
    y = b.tensor(data)
    seen = np.zeros(n_out, np.int64)
    levels: list[np.ndarray] = []
    for u, p in enumerate(flat):   # the k-th update of each position goes to level k
        if seen[p] == len(levels):
            levels.append(np.zeros(n_out, np.int32))
        levels[seen[p]][p] = 1 + u
        seen[p] += 1
    for pick in levels:
        part = ggml_get_rows(ctx, table, b.tensor(Value.of(pick), integer=True))
        y = E.ggml_add(ctx, y, b.reshaped(Value((n_out, 1), part), data.shape))
    return [Value(data.shape, y)]
