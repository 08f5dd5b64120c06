"""Row indices of ``ggml_get_rows`` and friends: bounds of computed and input indices, checked before a
compute reads out of range.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._ffi import CData, ffi, lib
from ..core.args import fail
from ..errors import GgmlValueError
from .nodes import ptr_key, tensor_label
from .objects import Tensor


_DATA_MOVES = {"RESHAPE", "VIEW", "CONT", "PERMUTE", "TRANSPOSE"}


class IndexBound(int):
    """The exclusive upper bound of an index input (an int), with ``what`` the indices are, for messages."""
    what: str = "row indices for ggml_get_rows"

    def __new__(cls, value: int, what: str) -> IndexBound:
        self = super().__new__(cls, value)
        self.what = what
        return self


# ops reading an I32 source as indices: (which source, its bound from the node, what the indices are). ggml
# aborts on an index out of range (get_rows, mul_mat_id) or writes outside its memory (get_rows_back).
_INDEX_SRCS = {
    "GET_ROWS": (1, lambda t: int(t.src[0].ne[1]), "row indices for ggml_get_rows"),
    "GET_ROWS_BACK": (1, lambda t: int(t.ne[1]), "row indices for ggml_get_rows_back (rows of its result, c's ne[1])"),
    "MUL_MAT_ID": (2, lambda t: int(t.src[0].ne[2]), "expert indices for ggml_mul_mat_id (matrices of as_, its ne[2])"),
}


def index_bounds(inputs: list[Tensor] | None, outputs: list[Tensor]) -> dict[int, int]:
    """Inputs that ggml reads as indices (the rows of ggml_get_rows/ggml_get_rows_back, the experts of
    ggml_mul_mat_id; directly or through a reshape/view) and their exclusive bound (an ``IndexBound``): an
    index outside [0, bound) aborts the process inside ggml (or corrupts memory), so batches are checked.
    ``inputs=None``: every leaf tensor (not computed by an op) counts as an input. Keys are ``ptr_key``s."""
    return {key: bound for key, (_, bound) in _index_inputs(inputs, outputs).items()}


def index_inputs(outputs: Sequence[Tensor | CData]) -> list[tuple[CData, IndexBound]]:
    """(leaf tensor pointer, bound) for every leaf that ggml reads as indices (see ``index_bounds``)."""
    return list(_index_inputs(None, outputs).values())


def _index_inputs(inputs: list[Tensor] | None,
                  outputs: Sequence[Tensor | CData]) -> dict[int, tuple[CData, IndexBound]]:
    wanted = None if inputs is None else {ptr_key(t.ptr) for t in inputs}
    found: dict[int, tuple[CData, IndexBound]] = {}
    seen: set[int] = set()
    stack = [o.ptr if isinstance(o, Tensor) else o for o in outputs]  # Tensors or raw pointers
    while stack:
        t = stack.pop()
        if ptr_key(t) in seen:
            continue
        seen.add(ptr_key(t))
        stack.extend(src for src in t.src if src != ffi.NULL)
        entry = _INDEX_SRCS.get(ffi.string(lib.ggml_op_name(t.op)).decode())
        if entry is None or t.src[entry[0]] == ffi.NULL:
            continue
        idx = t.src[entry[0]]
        exact_view = False  # a contiguous view of part of an input holds exactly the indices read: check it
        while not _is_input(idx, wanted) and ffi.string(lib.ggml_op_name(idx.op)).decode() in _DATA_MOVES:
            if ffi.string(lib.ggml_op_name(idx.op)).decode() in ("VIEW", "RESHAPE") and lib.ggml_is_contiguous(idx) \
                    and idx.view_src != ffi.NULL and _is_input(idx.view_src, wanted) \
                    and lib.ggml_nelements(idx) < lib.ggml_nelements(idx.view_src):
                exact_view = True
                break
            idx = idx.src[0]
        if exact_view or _is_input(idx, wanted):
            bound = entry[1](t)
            old = found.get(ptr_key(idx))
            if old is None or bound < old[1]:
                found[ptr_key(idx)] = (idx, IndexBound(bound, entry[2]))
    return found


def check_index_inputs(leaves: list[tuple[CData, IndexBound]], written: dict[int, np.ndarray] | None = None) -> None:
    """Check the current contents of index leaves (before a compute ggml would abort). ``written``: arrays just
    queued into tensors (by ``ptr_key``) whose upload may not have run yet: a leaf in one is checked on that array,
    not read back from the device."""
    for t, bound in leaves:
        # a contiguous view of an index input is read through the input itself, at the view's offset: the view's
        # own data pointer is only set when a scheduler allocates its graph (stale before, from the last one)
        src, offset = (t.view_src, int(t.view_offs)) if t.view_src != ffi.NULL else (t, 0)
        if src.data == ffi.NULL or not lib.ggml_is_contiguous(t) or t.type != lib.GGML_TYPE_I32:
            continue
        n = int(lib.ggml_nelements(t))
        pending = written.get(ptr_key(src)) if written else None
        if pending is not None and offset + 4 * n <= pending.nbytes:
            values = np.frombuffer(np.ascontiguousarray(pending).data, dtype=np.int32, count=n, offset=offset)
        else:
            values = np.empty(n, dtype=np.int32)
            if src.buffer != ffi.NULL:
                lib.ggml_backend_tensor_get(src, ffi.from_buffer(values), offset, values.nbytes)
            else:
                ffi.memmove(ffi.from_buffer(values), ffi.cast("char *", src.data) + offset, values.nbytes)
        check_indices(values, bound, tensor_label(t))


# ops whose I32 result holds values of their first source (a bound on those is a bound on the result)
_VALUE_MOVES = _DATA_MOVES | {"REPEAT", "GET_ROWS", "CPY", "DUP"}


def computed_index_bound(t: CData, depth: int = 0) -> int | None:
    """An exclusive upper bound on the values of I32 tensor pointer ``t`` that ggml computes, when the ops
    computing it give one: ``ggml_argmax`` of ``[k, ...]`` yields values in ``[0, k)``, and reshapes, views,
    copies, repeats and row lookups keep the values of their source. None when no bound is known: a leaf
    (an input: its contents are checked before each compute instead) or values converted from floats."""
    if depth > 64 or t.type != lib.GGML_TYPE_I32:
        return None
    op = ffi.string(lib.ggml_op_name(t.op)).decode()
    if op == "ARGMAX":
        return int(t.src[0].ne[0])
    if op in _VALUE_MOVES and t.src[0] != ffi.NULL:
        return computed_index_bound(t.src[0], depth + 1)
    return None


def check_computed_indices(fn: str, table: Tensor, indices: Tensor) -> None:
    """ggml_get_rows: indices computed in the graph whose range is known must fit the table's rows (ggml
    aborts the process on an out-of-range row, and it cannot be checked once computed)."""
    bound = computed_index_bound(indices.ptr)
    rows = int(table.ptr.ne[1])
    if bound is not None and bound > rows:
        fail(fn, f"the indices b are computed in the graph (from a ggml_argmax over {bound} values), so they can be up "
                 f"to {bound - 1}, but the table a has only {rows} rows (ne[1]); ggml would abort the process on such "
                 f"an index. Give the table at least {bound} rows, or take the argmax over at most {rows} values")


def _is_input(t: CData, wanted: set[int] | None) -> bool:
    return t.op == lib.GGML_OP_NONE if wanted is None else ptr_key(t) in wanted


def check_indices(values: np.ndarray, bound: int, where: str) -> None:
    """``values`` must be in [0, bound) (``bound``: an int or an ``IndexBound``, which says what they index)."""
    if values.size and (values.min() < 0 or values.max() >= bound):
        bad = values[(values < 0) | (values >= bound)].reshape(-1)
        what = getattr(bound, "what", IndexBound.what)
        raise GgmlValueError(f"{where} holds {what}, which must be in [0, {int(bound)}); got {bad[0]}, out of range "
                             f"({bad.size} bad indices; ggml would abort or write outside its memory). Fix the "
                             "indices, or make the indexed tensor larger")
