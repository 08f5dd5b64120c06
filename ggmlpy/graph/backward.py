"""What ggml can differentiate: a graph's nodes are checked before ``ggml_build_backward_expand`` (which aborts
on an op without a backward pass, or on an in-place op in the way of a gradient).
"""
from __future__ import annotations

import os

from .._ffi import CData, ffi, lib
from ..core.handle import unwrap
from ..core.sysmem import physical_memory
from ..core.types import GGML_TYPE_F32, type_name
from ..errors import expect, GgmlTypeError, GgmlValueError
from .introspect import is_padded_1d
from .nodes import op_label, op_param_f32, ptr_key, tensor_label
from .objects import as_tensor, Context, Graph, Tensor


_BACKWARD_OPS = {
    "NONE", "DUP", "ADD", "ADD1", "ACC", "SUB", "MUL", "DIV", "SQR", "SQRT", "LOG", "SIN", "COS", "SCALE",
    "SUM", "SUM_ROWS", "MEAN", "REPEAT", "REPEAT_BACK", "RMS_NORM", "MUL_MAT", "SET", "CPY", "CONT",
    "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE", "GET_ROWS", "DIAG_MASK_INF", "DIAG_MASK_ZERO", "SOFT_MAX",
    "ROPE", "IM2COL", "POOL_2D", "CROSS_ENTROPY_LOSS", "NORM", "CONCAT", "DROPOUT", "LSTM_CELL",
    "GRU_CELL", "LSTM_SEQ", "CONV_2D_TILED", "GRU_SEQ", "CLAMP", "FLASH_ATTN_EXT",
}
# SIGMOID, TANH, GELU and NORM come from our patch 0004, CONCAT from 0006 (ggml 0.25.3 has no backward for them),
# DROPOUT (the op itself) from 0018, LSTM_CELL and GRU_CELL from 0031, LSTM_SEQ from 0035, CONV_2D_TILED from 0036,
# GRU_SEQ from 0037, CLAMP from 0055, FLASH_ATTN_EXT (F32 q, k, v, no ALiBi, soft-cap or sinks) from 0056.
_BACKWARD_UNARY = {"ABS", "SGN", "NEG", "STEP", "RELU", "SILU", "EXP", "EXPM1", "SOFTPLUS", "SIGMOID", "TANH", "GELU"}
_COMPOSITE_HINT = {
    "LEAKY_RELU": "use ggml_relu, or x - slope*relu(-x) built from ggml_relu/ggml_scale/ggml_sub",
    "ELU": "use ggml_silu or ggml_softplus",
}


def check_backward_graph(graph: Graph) -> None:
    """Refuse graphs whose backward pass ggml cannot build (it would abort), naming the op."""
    g = graph.ptr
    nodes = [lib.ggml_graph_node(g, i) for i in range(lib.ggml_graph_n_nodes(g))]
    flags_loss = int(lib.GGML_TENSOR_FLAG_LOSS)
    if not any(n.flags & flags_loss for n in nodes):
        raise GgmlValueError("the graph has no loss: mark a scalar F32 tensor with ggml_set_loss")
    check_backward_nodes(nodes, [n for n in nodes if n.flags & flags_loss])


def check_backward_nodes(nodes: list, losses: list, accumulating: bool = False) -> None:
    """The check behind every trainable graph. ``nodes`` in topological order, ``losses`` the nodes the
    loss is built from; ``accumulating``: parameters get gradient accumulators (ggml-opt, period > 1).

    Mirrors ggml_build_backward_expand: I32 nodes never need a gradient, and only nodes between
    a parameter and the loss get one (side outputs such as an argmax are fine).
    """
    flags_param = int(lib.GGML_TENSOR_FLAG_PARAM)
    if not any(n.flags & flags_param for n in nodes):
        raise GgmlValueError("the graph has no trainable tensor: mark parameters with ggml_set_param")
    flags_loss = int(lib.GGML_TENSOR_FLAG_LOSS)
    needs_grad: set[int] = set()
    for n in nodes:  # nodes are in topological order
        if n.type == lib.GGML_TYPE_I32:
            continue
        # as ggml_build_backward_expand decides it: a parameter, a loss, or a node reading a tensor that needs one
        srcs = _grad_srcs(n, needs_grad)
        for s in srcs[:1]:
            # a half-precision weight of a product (mixed precision: ggml_cast of an F32 weight) passes its
            # gradient back by a product of its own type (patches/0060)
            half_weight = s.type == lib.GGML_TYPE_BF16 and op_label(n) == "MUL_MAT" and ptr_key(s) == ptr_key(n.src[0])
            if s.type not in (lib.GGML_TYPE_F32, lib.GGML_TYPE_F16) and not half_weight:
                raise GgmlTypeError(f"ggml's backward pass needs F32 or F16 tensors on the path to a trainable "
                                    f"parameter; {op_label(n)} reads a {type_name(s.type)} one (ggml_cast it into "
                                    "an F32 tensor first; for a BF16 product, reshape or view the F32 weight and "
                                    "cast last: a BF16 tensor may only be ggml_mul_mat's first operand there)")
        if not (n.flags & (flags_param | flags_loss) or srcs):
            continue
        _check_not_inplace(n, srcs)
        needs_grad.add(ptr_key(n))
    # the nodes that receive a gradient: those needing one that the loss depends on
    gets_grad: set[int] = set()
    stack = [n for n in losses if ptr_key(n) in needs_grad]
    while stack:
        t = stack.pop()
        key = ptr_key(t)
        if key in gets_grad:
            continue
        gets_grad.add(key)
        stack.extend(_grad_srcs(t, needs_grad))
    for i, n in enumerate(nodes):
        if ptr_key(n) not in gets_grad or n.flags & flags_param:
            continue
        check_node_backward(n, needs_grad)
        src = n.src[0]
        if op_label(n) == "VIEW" and ptr_key(src) in needs_grad and not src.flags & flags_loss and \
                not (accumulating and src.flags & flags_param) and (src.type != GGML_TYPE_F32 or not is_padded_1d(src)):
            # ggml adds a view's gradient into the gradient its source already has, else into a zero copy of the
            # source (ggml_scale by 0, then ggml_acc), which asserts a contiguous (padded-1d) F32 source: the
            # first to pass a gradient to the source is the last of its users in the graph
            later = [m for m in nodes[i + 1:] if ptr_key(m) in gets_grad
                     and any(ptr_key(s) == ptr_key(src) for s in _grad_srcs(m, needs_grad))]
            if not later:
                got = (f"a {type_name(src.type).upper()} one" if src.type != GGML_TYPE_F32 else
                       f"a strided one (strides {[int(src.nb[k]) for k in range(4)]})")
                fix = ("ggml_cont(ctx, x) before taking the view" if src.type == GGML_TYPE_F32 else
                       "convert it first (ggml_cpy into an F32 tensor) and view that")
                raise GgmlValueError(f"ggml cannot build the backward pass of a view ({tensor_label(n)}) of "
                                     f"{tensor_label(src)}: it expects the viewed tensor to be F32 and laid out "
                                     f"contiguously, got {got}, and would abort. Apply {fix}")
        if op_label(n) == "MEAN" and lib.ggml_nelements(n) > 1 and ptr_key(src) in gets_grad:
            # ggml adds MEAN's gradient with ADD1 (scalar only) when the input already has one,
            # i.e. when a later node also passes a gradient to it: that build aborts.
            later = [m for m in nodes[i + 1:] if ptr_key(m) in gets_grad
                     and any(s != ffi.NULL and ptr_key(s) == ptr_key(src) for s in m.src)]
            if later or (accumulating and src.flags & flags_param):
                why = (f"is also used by {op_label(later[0])}" if later else
                       "is a parameter whose gradient is accumulated")
                raise GgmlValueError(f"ggml cannot build the backward pass of MEAN ({tensor_label(n)}) when its input "
                                     f"{why}; use ggml_scale(ggml_sum_rows(x), 1/n) instead of ggml_mean")


# ops that may be views of another tensor (view_src) on the gradient path: ggml asserts every other one is not
_VIEW_OPS = {"CPY", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}


def _check_not_inplace(n: CData, srcs: list[CData]) -> None:
    """ggml_build_backward_expand asserts that no node needing a gradient is an in-place op (it has a view_src
    and is not a CPY/VIEW/RESHAPE/PERMUTE/TRANSPOSE): raise instead, naming the op and the fix."""
    if n.view_src == ffi.NULL:
        return
    op = ffi.string(lib.ggml_op_name(n.op)).decode()
    if op in _VIEW_OPS:
        return
    label = op_label(n)
    if n.flags & int(lib.GGML_TENSOR_FLAG_PARAM):
        why = "it is a trainable parameter"
    elif srcs:
        why = (f"its operand {tensor_label(srcs[0])} is (or is computed from) a trainable parameter (side outputs "
               "too: ggml gives a gradient to every tensor computed from one)")
    else:
        why = "it is the loss"
    base = label.split(" ")[0].lower()
    fix = f"Use the out-of-place op (ggml_{base}, not ggml_{base}_inplace or inplace=True)"
    raise GgmlValueError(f"ggml cannot build the backward pass through the in-place op {label} ({tensor_label(n)}): "
                         f"it writes into its operand's memory, and it needs a gradient because {why}. {fix}, or "
                         "compute it in a graph without trainable parameters")


# sources ggml_build_backward_expand never differentiates (shape-only, indices, piecewise-constant ops)
IGNORED_SRCS = {"IM2COL": (0,), "IM2COL_BACK": (0,), "CPY": (1,), "GET_ROWS": (1,), "GET_ROWS_BACK": (1,),
                 "ROPE": (1,), "SGN": (0,), "STEP": (0,), "DROPOUT": (1,)}


def _grad_srcs(n: CData, needs_grad: set[int]) -> list[CData]:
    """The sources of ``n`` that a gradient flows to, as ggml decides it."""
    ignored = IGNORED_SRCS.get(op_label(n), ())
    return [s for j, s in enumerate(n.src) if s != ffi.NULL and j not in ignored and ptr_key(s) in needs_grad]


# patches/0056's CPU kernel: FLASH_ATTN_BACK_ROWS query rows at a time against chunks of FLASH_ATTN_BACK_KEYS keys
_BACK_ROWS, _BACK_KEYS = 4, 16


def flash_attn_back_scratch_bytes(d: int, dv: int, m: int, threads: int) -> int:
    """Bytes of the CPU kernel's work buffer for FLASH_ATTN_BACK (``ggml_flash_attn_back_scratch`` in
    patches/0056, per thread: the task's keys and values as rows and transposed, dk and dv rows, a block's rows)."""
    mp = -(-m // _BACK_KEYS) * _BACK_KEYS
    floats = 2 * m * d + m * dv + d * mp + dv * mp + 3 * _BACK_ROWS * mp + 2 * _BACK_ROWS * d + _BACK_ROWS * dv + 16
    return 4 * floats * max(1, threads)


def check_flash_attn_back_scratch(fn: str, d: int, dv: int, m: int) -> None:
    """Refuse a FLASH_ATTN_BACK whose CPU work buffer (for every core of this machine) is beyond its memory: ggml's
    CPU backend would fail to allocate it in the middle of a compute and abort the process."""
    need = flash_attn_back_scratch_bytes(d, dv, m, os.cpu_count() or 1)
    total = physical_memory()
    if need > total:
        raise GgmlValueError(f"{fn}: attention's backward pass over {m} keys of {d} (values of {dv}) needs "
                             f"{need / 2**30:.1f} GiB of work memory on the CPU ({os.cpu_count() or 1} threads), more "
                             f"than this machine's {total / 2**30:.1f} GiB; split the keys into shorter sequences")


def _check_flash_attn_backward(n: CData, mask_needs_grad: bool) -> None:
    """ggml_flash_attn_ext's backward pass (patches/0056) takes F32 q, k and v, no ALiBi, no soft-capping and no
    sinks, and gives no gradient for the mask."""
    where = f"{op_label(n)} of ggml_flash_attn_ext ({tensor_label(n)}) on the path to a trainable parameter"
    kinds = [type_name(n.src[j].type) for j in range(3)]
    if any(t != "f32" for t in kinds):
        raise GgmlValueError(f"{where}: ggml has its backward pass for F32 q, k and v only, got {', '.join(kinds)}; "
                             "keep k and v in F32 for training (F16 k/v are for inference)")
    max_bias, softcap = op_param_f32(n, 1), op_param_f32(n, 2)
    if max_bias != 0.0 or softcap != 0.0:
        raise GgmlValueError(f"{where}: its backward pass takes max_bias=0 and logit_softcap=0, got {max_bias:g} and "
                             f"{softcap:g}; add ALiBi biases to the mask yourself, and train without soft-capping")
    if n.src[4] != ffi.NULL:
        raise GgmlValueError(f"{where}: attention sinks (ggml_flash_attn_ext_add_sinks) have no backward pass; "
                             "train without sinks")
    if mask_needs_grad:
        raise GgmlValueError(f"{where}: its mask {tensor_label(n.src[3])} is (or is computed from) a trainable "
                             "parameter; the backward pass gives the mask no gradient. Expected a mask that is data")
    check_flash_attn_back_scratch(where, int(n.src[0].ne[0]), int(n.src[2].ne[0]), int(n.src[1].ne[1]))


def check_node_backward(n: CData, needs_grad: set[int] | None = None) -> None:
    """Raise if ggml has no backward pass for node ``n``. ``needs_grad`` (keys of the tensors that
    need a gradient) refines the SUB/DIV rule; without it every broadcast SUB/DIV is refused."""
    label = op_label(n)
    op = ffi.string(lib.ggml_op_name(n.op)).decode()
    supported = label in _BACKWARD_UNARY if op == "UNARY" else op in _BACKWARD_OPS
    if op == "GLU":
        # ggml differentiates the split SwiGLU (silu(a) * b, two operands) only; the fused form aborts
        split = n.src[1] != ffi.NULL
        if int(lib.ggml_get_glu_op(n)) == int(lib.GGML_GLU_OP_SWIGLU) and split:
            return
        raise GgmlValueError(f"ggml has no backward pass for {label} ({tensor_label(n)}"
                             f"{', fused: one operand holding both halves' if not split else ''}) on the path to a "
                             "trainable parameter; expected the split SwiGLU: ggml_swiglu_split(ctx, a, b) with the "
                             "two halves as separate tensors (views of the fused input work: ggml_view_2d/ggml_cont)")
    if not supported:
        hint = _COMPOSITE_HINT.get(label, "rebuild it from ops that have one")
        raise GgmlValueError(f"ggml has no backward pass for {label} ({tensor_label(n)}) on the path to a "
                             f"trainable parameter; {hint}")
    if op in ("SUB", "DIV"):
        a, b = n.src[0], n.src[1]
        if tuple(a.ne) != tuple(b.ne) and (needs_grad is None or ptr_key(b) in needs_grad):
            raise GgmlValueError(f"{op} with a broadcast second operand has no backward pass in ggml; make the "
                                 "shapes equal with ggml_repeat(ctx, b, a) first")
    def needs(j: int) -> bool:  # source j is there and needs a gradient
        src = n.src[j]
        return src != ffi.NULL and (needs_grad is None or ptr_key(src) in needs_grad)
    if op == "SOFT_MAX" and (needs(1) or needs(2)):
        what = "mask" if needs(1) else "sinks"
        raise GgmlValueError(f"ggml has no backward pass for the {what} of ggml_soft_max_ext ({tensor_label(n)}): "
                             f"its {what} {tensor_label(n.src[1 if needs(1) else 2])} is (or is computed from) a "
                             f"trainable parameter, and ggml would abort. Expected a {what} that is data, not "
                             "trained: build it from tensors without ggml_set_param")
    if op == "ROPE" and needs(2):
        raise GgmlValueError(f"ggml has no backward pass for the frequency factors of ggml_rope_ext "
                             f"({tensor_label(n)}): {tensor_label(n.src[2])} is (or is computed from) a trainable "
                             "parameter, and ggml would abort. Expected constant frequency factors: pass data (or "
                             "None), not a tensor marked with ggml_set_param or computed from one")
    if op == "CROSS_ENTROPY_LOSS" and needs(1):
        raise GgmlValueError(f"ggml has no backward pass for the labels of ggml_cross_entropy_loss "
                             f"({tensor_label(n)}): {tensor_label(n.src[1])} is (or is computed from) a trainable "
                             "parameter, and ggml would abort. Expected labels that are data: only the logits (a) "
                             "can be trained")
    if op == "SOFT_MAX":
        max_bias = op_param_f32(n, 1)
        if max_bias != 0.0:
            raise GgmlValueError(f"ggml has no backward pass for ggml_soft_max_ext with max_bias != 0 (ALiBi; "
                                 f"{tensor_label(n)} has max_bias={max_bias}) on the path to a trainable parameter; "
                                 "use max_bias=0 and add the ALiBi biases to the mask yourself")
    if op == "FLASH_ATTN_EXT":
        _check_flash_attn_backward(n, needs(3))
    if op == "MUL_MAT" and n.src[0].type != GGML_TYPE_F32 and n.src[0].flags & int(lib.GGML_TENSOR_FLAG_PARAM):
        raise GgmlValueError("trainable mul_mat weights must be F32")
    if op == "MUL_MAT" and (needs_grad is None or ptr_key(n.src[0]) in needs_grad):
        a, b = n.src[0], n.src[1]
        if (a.ne[2], a.ne[3]) != (b.ne[2], b.ne[3]) and b.ne[3] > 1:
            # ggml's backward reduces a broadcast first operand over dimension 2 only (it asserts otherwise)
            raise GgmlValueError(f"ggml has no backward pass for MUL_MAT broadcasting a {list(a.ne)} operand over "
                                 f"the 4th dimension of {list(b.ne)}; reshape b to 3-D (or 2-D) first")


def ggml_build_backward_expand(ctx: Context, graph: Graph) -> Graph:
    """Add the backward pass of ``graph``: a gradient for every tensor between a parameter and the loss.

    The graph needs a loss (``ggml_set_loss``) and parameters (``ggml_set_param``) and must have been
    created with ``ggml_new_graph_custom(ctx, size, grads=True)``. Ops without a backward pass in ggml
    on the path from a parameter to the loss are refused with an error naming them (ggml would abort).
    Read gradients with ``ggml_graph_get_grad`` after computing; ``ggml_graph_reset`` seeds them.
    ggml-opt (``ggml_opt_init``, the fit functions) does all of this itself.

    Arguments:
        ctx: the context the gradient tensors are created in (typically the graph's).
        graph: a Graph with gradients.

    Value: the same graph. Raises GgmlValueError without a loss or parameter, or for an op that has
    no backward pass.

    Example:
        >>> gf = ggml_new_graph_custom(ctx, 1024, True)
        >>> ggml_build_forward_expand(gf, loss)
        >>> ggml_build_backward_expand(ctx, gf)
    """
    ctx_ptr = unwrap(ctx, Context, "ggml_build_backward_expand(ctx)")
    expect(isinstance(graph, Graph) and graph.grads,
           "ggml_build_backward_expand: the graph must be created with ggml_new_graph_custom(ctx, size, grads=True)")
    check_backward_graph(graph)
    check_backward_room(ctx, graph, "ggml_build_backward_expand")
    if ctx is not graph.ctx:
        graph.deps.setdefault(id(ctx), ctx)  # the gradients live in ctx
    lib.ggml_build_backward_expand(ctx_ptr, graph.ptr, ffi.NULL)
    return graph


def backward_need(graph: Graph, loss_of: Tensor | None = None) -> tuple[int, int, int]:
    """(nodes, tensors, data bytes) that building ``graph``'s backward pass adds, from a dry run on a copy of
    the graph in a scratch context (ggml asserts when the graph or the context has no room for them).
    ``loss_of``: first add a loss on that tensor (its sum), as ggml-opt adds one to a forward graph. The
    backward of every node must be supported (``check_backward_nodes``) before this is called."""
    stack = [lib.ggml_graph_node(graph.ptr, i) for i in range(graph.n_nodes())]
    seen: set[int] = set()
    while stack:  # the graph's nodes and leafs: what the copy must hold
        t = stack.pop()
        if int(ffi.cast("uintptr_t", t)) not in seen:
            seen.add(int(ffi.cast("uintptr_t", t)))
            stack.extend(src for src in t.src if src != ffi.NULL)
    size = max(4096, 16 * len(seen))  # no op's backward adds more than a few nodes per forward node
    scratch = lib.ggml_init(ffi.new("struct ggml_init_params *", {
        "mem_size": int(lib.ggml_graph_overhead_custom(size, True)) + size * int(lib.ggml_tensor_overhead()),
        "mem_buffer": ffi.NULL, "no_alloc": True})[0])
    expect(scratch != ffi.NULL, "ggml_build_backward_expand: no memory for checking the backward pass")
    try:
        copy = lib.ggml_new_graph_custom(scratch, size, True)
        lib.ggml_graph_cpy(graph.ptr, copy)
        if loss_of is not None:
            loss = lib.ggml_sum(scratch, loss_of.ptr)
            lib.ggml_set_loss(loss)
            lib.ggml_build_forward_expand(copy, loss)
        lib.ggml_build_backward_expand(scratch, copy, ffi.NULL)
        added = int(lib.ggml_graph_n_nodes(copy)) - graph.n_nodes()
        n_tensors, nbytes = 0, 0
        t = lib.ggml_get_first_tensor(scratch)
        while t != ffi.NULL:
            n_tensors += 1
            nbytes += int(lib.ggml_nbytes(t))
            t = lib.ggml_get_next_tensor(scratch, t)
        return added, n_tensors, nbytes
    finally:
        lib.ggml_free(scratch)


def check_backward_room(ctx: Context, graph: Graph, fn: str) -> None:
    """Refuse a backward build that would overflow the graph or the context (ggml asserts on both)."""
    added, n_tensors, nbytes = backward_need(graph)
    if graph.n_nodes() + added > graph.size:
        raise GgmlValueError(f"{fn}: the backward pass adds {added} nodes to the graph's {graph.n_nodes()}, "
                             f"more than its size {graph.size}; create it with ggml_new_graph_custom(ctx, "
                             f"{max(2 * (graph.n_nodes() + added), 64)}, True)")
    ctx.reserve(nbytes, n_objects=max(n_tensors, 1), what="backward pass (its gradient tensors)")


def ggml_graph_get_grad(graph: Graph, tensor: Tensor) -> Tensor | None:
    """The gradient tensor of ``tensor`` in a graph with a backward pass, or None if it has none.

    Arguments:
        graph: a Graph built with ``ggml_build_backward_expand`` (a graph without gradients raises
            GgmlValueError).
        tensor: a tensor of the graph (typically a parameter).

    Value: a Tensor of tensor's shape holding d(loss)/d(tensor) after a compute, or None.

    Example:
        >>> dw = ggml_backend_tensor_get_data(ggml_graph_get_grad(gf, w))
    """
    expect(isinstance(graph, Graph) and graph.grads, "ggml_graph_get_grad: the graph has no gradients")
    ptr = lib.ggml_graph_get_grad(graph.ptr, as_tensor(tensor, "ggml_graph_get_grad(tensor)").ptr)
    return graph.node_tensor(ptr) if ptr != ffi.NULL else None
