"""Naming graph nodes in messages, and where a tensor's data lives (context memory, a backend buffer, none)."""
from __future__ import annotations

import re
from collections.abc import Iterable

from .._ffi import CData, ffi, lib
from ..core.types import type_name
from ..errors import GgmlStateError


def ptr_key(p: CData) -> int:
    """A hashable identity for a cffi tensor pointer."""
    return int(ffi.cast("uintptr_t", p))


# op_params (int32[16]) lies between ``op`` and ``flags`` in struct ggml_tensor; the cdef does not declare it
_OP_PARAMS_AT = ffi.offsetof("struct ggml_tensor", "op") + 4
assert ffi.offsetof("struct ggml_tensor", "flags") - _OP_PARAMS_AT == int(lib.GGML_MAX_OP_PARAMS) \
    if hasattr(lib, "GGML_MAX_OP_PARAMS") else True


def op_param_f32(p: CData, i: int) -> float:
    """Float op parameter ``i`` of tensor pointer ``p`` (as ggml_get_op_params_f32)."""
    return float(ffi.cast("float *", ffi.cast("char *", p) + _OP_PARAMS_AT)[i])


def op_label(p: CData) -> str:
    name = ffi.string(lib.ggml_op_name(p.op)).decode()
    if name == "UNARY":
        return ffi.string(lib.ggml_op_desc(p)).decode()
    if name == "GLU":  # 'GLU (SWIGLU)': the GLU family shares one op
        return f"GLU ({ffi.string(lib.ggml_glu_op_name(lib.ggml_get_glu_op(p))).decode()})"
    return name


_GGML_NAMES = re.compile(r"^(leaf|node)_\d+$")


def tensor_label(t: CData) -> str:
    """How an error names tensor pointer ``t``: its user-given name, type and shape ('leaf_3' and the like
    are names ggml gives unnamed tensors while building a graph: said so)."""
    name = ffi.string(t.name).decode("utf-8", "replace")
    ne = [int(t.ne[i]) for i in range(4)]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    what = f"{type_name(t.type).upper()} {ne}"
    if not name:
        return f"an unnamed {what} tensor (name it with ggml_set_name)"
    if name.startswith(" ("):  # ggml names a view/copy of an unnamed tensor ' (view)', ' (copy)'
        return f"an unnamed {what} tensor ({name.strip(' ()')} of an unnamed one; name it with ggml_set_name)"
    if _GGML_NAMES.match(name):
        return f"an unnamed {what} tensor ('{name}' is the name ggml gave it; name it with ggml_set_name)"
    return f"tensor '{name}' ({what})"


NO_MEMORY_FIX = ("allocate it first: ggml_backend_alloc_ctx_tensors for its context, ggml_backend_sched_alloc_graph "
                 "or ggml_gallocr_alloc_graph for a graph (or create its context with no_alloc=False); memory goes "
                 "when the buffer, scheduler or graph allocator that gave it is freed or reset")


def tensor_memory(t: CData, what: str | None = None) -> str:
    """Where tensor pointer ``t`` has its data: 'backend' (a backend buffer) or 'host' (context memory).

    Raises GgmlStateError when it has none: never allocated, or its buffer, scheduler or graph allocator
    has since been freed or reset (ggml would read a NULL or dangling pointer). A view follows the tensor
    it views (its ``view_src``): when that one got new memory since the view was made, the view is pointed
    at it (what ggml_backend_view_init does), instead of at the memory it had."""
    root = t.view_src if t.view_src != ffi.NULL else None
    if root is None:
        if t.data == ffi.NULL:
            raise GgmlStateError(f"{what or tensor_label(t)} has no memory: {NO_MEMORY_FIX}")
        return "backend" if t.buffer != ffi.NULL else "host"
    if root.data == ffi.NULL:
        raise GgmlStateError(f"{what or tensor_label(t)} is a view of {tensor_label(root)}, which has no memory: "
                             f"{NO_MEMORY_FIX}")
    want = ffi.cast("char *", root.data) + int(t.view_offs)
    if t.data != want:
        t.data = want
    if t.buffer != ffi.NULL and t.buffer != root.buffer:  # (a view without buffer is placed by ggml each time)
        t.buffer = root.buffer
    return "backend" if root.buffer != ffi.NULL else "host"


# sources an op reads only for their shape (or writes into): a leaf used only there needs no values
# (IM2COL_BACK reads the gradient, src 0, and takes only the shape of the kernel, src 1: ggml.h names them the
# other way round)
_SHAPE_ONLY_SRCS = {"CPY": (1,), "IM2COL": (0,), "IM2COL_BACK": (1,)}


def value_read(nodes: Iterable[CData]) -> set[int]:
    """Keys of the tensors some node of ``nodes`` reads the values of (not only the shape, or as the
    destination of a copy); reading a view reads the tensor it views."""
    read: set[int] = set()
    for p in nodes:
        skip = _SHAPE_ONLY_SRCS.get(ffi.string(lib.ggml_op_name(p.op)).decode(), ())
        for j, src in enumerate(p.src):
            if src != ffi.NULL and j not in skip:
                read.add(ptr_key(src))
                if src.view_src != ffi.NULL:
                    read.add(ptr_key(src.view_src))
    return read


def graph_tensor_ptrs(g: CData) -> tuple[list[CData], list[CData]]:
    """(nodes, every tensor) of graph pointer ``g``: its nodes in order, then the sources they read that
    are not nodes (the leafs), each once."""
    nodes = [lib.ggml_graph_node(g, i) for i in range(int(lib.ggml_graph_n_nodes(g)))]
    tensors = list(nodes)
    seen = {ptr_key(p) for p in nodes}
    for p in nodes:
        for s in p.src:
            if s != ffi.NULL:
                k = ptr_key(s)
                if k not in seen:
                    seen.add(k)
                    tensors.append(s)
    return nodes, tensors


def describe_node(p: CData) -> str:
    """'CPY of tensor 'y' (result I8; operands F32, I8)': what a node computes, from which types."""
    srcs = ", ".join(type_name(s.type).upper() for s in p.src if s != ffi.NULL)
    return (f"{op_label(p)} of {tensor_label(p)} (result {type_name(p.type).upper()}"
            + (f"; operands {srcs})" if srcs else ")"))
