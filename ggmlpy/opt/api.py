"""An opt context's accessors (inputs, outputs, labels, loss, gradients, heads) and its step:
``ggml_opt_prepare_alloc``, ``ggml_opt_alloc``, ``ggml_opt_eval``.
"""
from __future__ import annotations

from .._ffi import CData, lib
from ..compute.checks import check_opt_heads
from ..compute.threads import count_forward
from ..core.handle import free_handle, raise_type, unwrap, using
from ..errors import GgmlStateError, GgmlValueError
from ..graph.backward import backward_need
from ..graph.objects import as_tensor, Context, Graph, Tensor
from ..graph.tensor import input_leaf
from . import losses as L
from .constants import BUILD_FORWARD
from .context import check_trainable, OptContext
from .result import OptResult


def opt_ptr(opt_ctx: object, fn: str) -> CData:
    return unwrap(opt_ctx, OptContext, f"{fn}(opt_ctx)")


def ggml_opt_free(opt_ctx: OptContext) -> None:
    """Free an opt context, its graphs and optimizer state (the model's own tensors stay).

    Idempotent; using the context afterwards raises GgmlStateError. The scheduler can then serve a new
    opt context.

    Arguments:
        opt_ctx: [glossary]

    Value: None.

    Example:
        >>> ggml_opt_free(opt_ctx)
    """
    free_handle(opt_ctx, OptContext, "ggml_opt_free(opt_ctx)")


def ggml_opt_reset(opt_ctx: OptContext, optimizer: bool = False) -> None:
    """Zero the accumulated gradients and the loss; optionally also reset the optimizer.

    Arguments:
        opt_ctx: [glossary]
        optimizer: False (the default) keeps the optimizer state; True also zeroes AdamW's moments and
            its step count (a fresh start with the current weights).

    Value: None.

    Example:
        >>> ggml_opt_reset(opt_ctx, True)
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_reset")
    opt_ctx.refuse_if_running("ggml_opt_reset")
    with using(opt_ctx.keepers, "ggml_opt_reset"):
        lib.ggml_opt_reset(ptr, bool(optimizer))


def ggml_opt_static_graphs(opt_ctx: OptContext) -> bool:
    """Whether an opt context was built with static graphs (``ctx_compute``/``inputs``/``outputs`` given).

    Arguments:
        opt_ctx: [glossary]

    Value: a bool; False for dynamic graphs (``ggml_opt_prepare_alloc`` before each alloc).

    Example:
        >>> ggml_opt_static_graphs(opt_ctx)
        True
    """
    return bool(lib.ggml_opt_static_graphs(opt_ptr(opt_ctx, "ggml_opt_static_graphs")))


def ggml_opt_context_optimizer_type(opt_ctx: OptContext) -> int:
    """The optimizer type an opt context was built with.

    Arguments:
        opt_ctx: [glossary]

    Value: an int, ``ggml_opt_optimizer_type_adamw()`` or ``ggml_opt_optimizer_type_sgd()``.

    Example:
        >>> ggml_opt_optimizer_name(ggml_opt_context_optimizer_type(opt_ctx))
    """
    return int(lib.ggml_opt_context_optimizer_type(opt_ptr(opt_ctx, "ggml_opt_context_optimizer_type")))


def ggml_opt_inputs(opt_ctx: OptContext) -> Tensor | None:
    """The input tensor of an opt context: write each batch's data into it.

    Arguments:
        opt_ctx: [glossary]

    Value: a Tensor (for dynamic graphs the one given to the last ``ggml_opt_prepare_alloc``), or None.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_inputs(opt_ctx), xb)
    """
    ptr = lib.ggml_opt_inputs(opt_ptr(opt_ctx, "ggml_opt_inputs"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_outputs(opt_ctx: OptContext) -> Tensor | None:
    """The output tensor of an opt context (of its first head): the tensor the model computes.

    With dynamic graphs (``ggml_opt_prepare_alloc``) it holds the predictions after an eval. With static
    graphs (the usual case) ggml evaluates copies of the graph, so this tensor has no memory of its own and
    reading it raises GgmlStateError: read the predictions from an OptResult instead
    (``ggml_opt_result_pred``), or the predicted classes of a cross-entropy context (``ggml_opt_pred``).

    Arguments:
        opt_ctx: [glossary]

    Value: a Tensor, or None (a dynamic context before its first ``ggml_opt_prepare_alloc``).

    Example:
        >>> ggml_opt_outputs(opt_ctx).shape
    """
    opt_ptr(opt_ctx, "ggml_opt_outputs")
    if opt_ctx.static:
        return opt_ctx.heads[0].outputs
    return opt_ctx.step_tensor(lib.ggml_opt_outputs(opt_ctx.ptr))


def ggml_opt_labels(opt_ctx: OptContext) -> Tensor | None:
    """The labels tensor of an opt context (of its first head): write each batch's labels into it.

    It has the outputs' layout. Loss types without labels (mean, sum) have none.

    Arguments:
        opt_ctx: [glossary]

    Value: a Tensor, or None.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_labels(opt_ctx), yb)
    """
    opt_ptr(opt_ctx, "ggml_opt_labels")
    return opt_ctx.labels(0)


def ggml_opt_loss(opt_ctx: OptContext) -> Tensor | None:
    """The scalar loss tensor ggml-opt minimises; read it after ``ggml_opt_eval``.

    For ggmlpy-built losses (MAE, Huber, BCE, weighted MSE) and multi-head contexts it holds the
    weighted total. With ``opt_period > 1`` ggml scales per-datapoint losses by ``1/opt_period``.

    Arguments:
        opt_ctx: [glossary]

    Value: an F32 Tensor with one element, or None (a dynamic context before its first alloc).

    Example:
        >>> float(ggml_backend_tensor_get_data(ggml_opt_loss(opt_ctx))[0])
    """
    ptr = lib.ggml_opt_loss(opt_ptr(opt_ctx, "ggml_opt_loss"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_pred(opt_ctx: OptContext) -> Tensor | None:
    """The predicted classes of the last batch (argmax of the outputs), for cross-entropy contexts.

    Arguments:
        opt_ctx: [glossary]

    Value: an I32 Tensor ``[batch]``, or None for other loss types and multi-head contexts.

    Example:
        >>> ggml_backend_tensor_get_data(ggml_opt_pred(opt_ctx))
    """
    ptr = lib.ggml_opt_pred(opt_ptr(opt_ctx, "ggml_opt_pred"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_ncorrect(opt_ctx: OptContext) -> Tensor | None:
    """The number of correct predictions in the last batch, for a single cross-entropy head.

    Arguments:
        opt_ctx: [glossary]

    Value: an I64 Tensor with one element, or None for other loss types (see ``ggml_opt_ncorrect_i``
    for multi-head contexts).

    Example:
        >>> int(ggml_backend_tensor_get_data(ggml_opt_ncorrect(opt_ctx))[0])
    """
    ptr = lib.ggml_opt_ncorrect(opt_ptr(opt_ctx, "ggml_opt_ncorrect"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_grad_acc(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
    """The gradient accumulator of a node of the forward graph (typically a parameter).

    Gradients of the ``opt_period`` batches of one logical batch are summed here before the optimizer
    step. For dynamic graphs it is only valid between ``ggml_opt_alloc`` and ``ggml_opt_eval`` (else
    GgmlStateError).

    Arguments:
        opt_ctx: [glossary]
        node: a Tensor of the model, e.g. a weight marked with ``ggml_set_param``.

    Value: a Tensor of node's shape, or None when the node has no gradient.

    Example:
        >>> g = ggml_backend_tensor_get_data(ggml_opt_grad_acc(opt_ctx, w))
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_grad_acc")
    if not opt_ctx.static and opt_ctx.pending_alloc is None:
        raise GgmlStateError("dynamic graphs: ggml_opt_grad_acc is only valid between ggml_opt_alloc and ggml_opt_eval")
    return opt_ctx.tensor(lib.ggml_opt_grad_acc(ptr, as_tensor(node, "ggml_opt_grad_acc(node)").ptr))


def _head(opt_ctx: OptContext, ihead: int, fn: str) -> L.Head:
    opt_ptr(opt_ctx, fn)
    n = opt_ctx.n_heads
    if isinstance(ihead, bool) or not isinstance(ihead, int) or not 1 <= ihead <= n:
        raise GgmlValueError(f"{fn}: ihead must be an int in [1, {n}] (1-based), got {ihead!r}")
    return opt_ctx.heads[ihead - 1]


def ggml_opt_n_loss(opt_ctx: OptContext) -> int:
    """The number of output heads (losses) of an opt context: 1 unless built with ``..._multi``.

    Arguments:
        opt_ctx: [glossary]

    Value: an int >= 1.

    Example:
        >>> [ggml_opt_loss_i(opt_ctx, i) for i in range(1, ggml_opt_n_loss(opt_ctx) + 1)]
    """
    opt_ptr(opt_ctx, "ggml_opt_n_loss")
    return opt_ctx.n_heads


def ggml_opt_outputs_i(opt_ctx: OptContext, ihead: int) -> Tensor:
    """The output tensor of head ``ihead`` (1-based).

    Arguments:
        opt_ctx: [glossary]
        ihead: [glossary]

    Value: a Tensor.

    Example:
        >>> ggml_opt_outputs_i(opt_ctx, 2)
    """
    return _head(opt_ctx, ihead, "ggml_opt_outputs_i").outputs


def ggml_opt_labels_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The labels tensor of head ``ihead`` (1-based): write that head's labels of each batch into it.

    Arguments:
        opt_ctx: [glossary]
        ihead: [glossary]

    Value: a Tensor, or None for heads whose loss has no labels.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_labels_i(opt_ctx, 2), y2)
    """
    _head(opt_ctx, ihead, "ggml_opt_labels_i")
    return opt_ctx.labels(ihead - 1)


def ggml_opt_loss_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The loss of head ``ihead`` (1-based) before its head weight; read it after an eval.

    For a context with a single ggml loss this is ggml's loss tensor (``ggml_opt_loss``).

    Arguments:
        opt_ctx: [glossary]
        ihead: [glossary]

    Value: an F32 Tensor with one element, or None.

    Example:
        >>> float(ggml_backend_tensor_get_data(ggml_opt_loss_i(opt_ctx, 1))[0])
    """
    head = _head(opt_ctx, ihead, "ggml_opt_loss_i")
    return head.value if head.value is not None else ggml_opt_loss(opt_ctx)


def ggml_opt_loss_weights_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The loss-weight tensor of head ``ihead`` (1-based): weighted-MSE or per-sample weights.

    Write each batch's weights into it, ``[loss_mask_ne0, batch]`` for weighted MSE.

    Arguments:
        opt_ctx: [glossary]
        ihead: [glossary]

    Value: a Tensor, or None when the head takes no weights.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_loss_weights_i(opt_ctx, 1), w)
    """
    return _head(opt_ctx, ihead, "ggml_opt_loss_weights_i").weights


def ggml_opt_ncorrect_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The number of correct predictions of head ``ihead`` (1-based) in the last batch.

    Arguments:
        opt_ctx: [glossary]
        ihead: [glossary]

    Value: an I64 Tensor with one element for cross-entropy heads, or None.

    Example:
        >>> int(ggml_backend_tensor_get_data(ggml_opt_ncorrect_i(opt_ctx, 1))[0])
    """
    head = _head(opt_ctx, ihead, "ggml_opt_ncorrect_i")
    return head.ncorrect if opt_ctx.loss is not None and opt_ctx.loss.composite else ggml_opt_ncorrect(opt_ctx)


def ggml_opt_prepare_alloc(opt_ctx: OptContext, ctx_compute: Context, graph: Graph, inputs: Tensor,
                           outputs: Tensor) -> None:
    """Hand a dynamic opt context the graph of the next batch (dynamic graphs only).

    For contexts built without ``ctx_compute``: call it before every ``ggml_opt_alloc``, with a forward
    graph built for this batch. ggml-opt adds its loss and backward tensors to ``ctx_compute``, which
    needs room for them.

    Arguments:
        opt_ctx: an opt context built without ``ctx_compute`` (dynamic graphs) with no alloc pending
            (else GgmlStateError).
        ctx_compute: the Context the graph and the tensors ggml-opt adds live in.
        graph: the forward Graph (``ggml_build_forward_expand`` of ``outputs``).
        inputs: the graph's input Tensor.
        outputs: the graph's output Tensor (it must be trainable unless the build type is FORWARD).

    Value: None.

    Example:
        >>> ggml_opt_prepare_alloc(opt_ctx, ctx, gf, x, out)
        >>> ggml_opt_alloc(opt_ctx, True); ggml_opt_eval(opt_ctx, res)
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_prepare_alloc")
    opt_ctx.refuse_if_running("ggml_opt_prepare_alloc")
    if opt_ctx.static:
        raise GgmlStateError("ggml_opt_prepare_alloc is for dynamic graphs; this context has static graphs")
    if opt_ctx.pending_alloc is not None:
        raise GgmlStateError("an allocation is pending: call ggml_opt_eval first")
    c = unwrap(ctx_compute, Context, "ggml_opt_prepare_alloc(ctx_compute)")
    if not isinstance(graph, Graph):
        raise_type("ggml_opt_prepare_alloc(graph)", "Graph", graph)
    i, o = input_leaf("ggml_opt_prepare_alloc", as_tensor(inputs, "inputs"), "inputs"), as_tensor(outputs, "outputs")
    check_opt_heads([L.Head(opt_ctx.heads[0].loss_type, o)], "ggml_opt_prepare_alloc", True)
    if opt_ctx.build_type != BUILD_FORWARD:
        check_trainable([o], accumulating=True)  # dynamic graphs always accumulate
    if not any(lib.ggml_graph_node(graph.ptr, k) == o.ptr for k in range(graph.n_nodes())):
        raise GgmlValueError("ggml_opt_prepare_alloc: the graph does not compute outputs (ggml-opt would abort): "
                             "build it from them, ggml_build_forward_expand(graph, outputs)")
    if opt_ctx.build_type != BUILD_FORWARD:
        # ggml-opt builds the loss, the backward pass and the optimizer steps in copies of this graph, of its
        # size: a graph without room for them aborted at ggml_opt_alloc
        added, _, _ = backward_need(graph, loss_of=o)
        need = graph.n_nodes() + added + 3 * len(count_forward([o])[1]) + 16  # + accumulation, step per weight
        if need > graph.size:
            raise GgmlValueError(f"ggml_opt_prepare_alloc: the graph (size {graph.size}, {graph.n_nodes()} nodes) has "
                                 f"no room for the loss, backward and optimizer nodes ggml-opt adds to it (about "
                                 f"{need}); create it with ggml_new_graph_custom(ctx, {2 * need}, True)")
    # ggml-opt adds its loss, the backward and optimizer tensors and two copies of the graph (with gradients)
    # to ctx_compute; without room it got NULL back and crashed
    graphs = 2 * int(lib.ggml_graph_overhead_custom(lib.ggml_graph_size(graph.ptr), True))
    ctx_compute.reserve(0, n_objects=16 + 5 * graph.n_nodes(), graph_bytes=graphs,
                        what="set of ggml-opt's loss, backward and optimizer graphs")
    _check_param_layout(opt_ctx, graph)
    lib.ggml_opt_prepare_alloc(ptr, c, graph.ptr, i.ptr, o.ptr)
    opt_ctx.heads[0].outputs = o
    opt_ctx.step_ctx = ctx_compute
    opt_ctx.prepared = True


def _check_param_layout(opt_ctx: OptContext, graph: Graph) -> None:
    """ggml-opt makes a dynamic context's gradient accumulators and moments once, for the parameters of the
    first graph, and pairs them with later graphs by node position: a later graph must have its parameters at
    the same positions with the same shapes (ggml aborted on another shape, and would pair the wrong ones)."""
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    nodes = [lib.ggml_graph_node(graph.ptr, k) for k in range(graph.n_nodes())]
    layout = [(k, tuple(int(n) for n in t.ne)) for k, t in enumerate(nodes) if t.flags & flag]
    first = opt_ctx.param_layout
    if first is None:
        opt_ctx.param_layout = layout
        return
    if layout != first:
        k = next((j for j, (was, now) in enumerate(zip(first, layout)) if was != now), min(len(first), len(layout)))
        was = f"node {first[k][0]} of ne {list(first[k][1])}" if k < len(first) else "no parameter"
        now = f"node {layout[k][0]} of ne {list(layout[k][1])}" if k < len(layout) else "no parameter"
        raise GgmlValueError("ggml_opt_prepare_alloc: a dynamic opt context keeps the gradient accumulators and "
                             "moments of its first graph's parameters, paired by node position; parameter "
                             f"{k} of this graph is {now}, of the first graph {was}. Build every step's graph the "
                             "same way (the batch size may change), or use a new opt context")


def ggml_opt_alloc(opt_ctx: OptContext, backward: bool = True) -> None:
    """Allocate the graph of the next evaluation: forward only, or forward and backward.

    Call it exactly once before every ``ggml_opt_eval``, then write the batch (inputs, labels) and
    evaluate. Calling it twice without an eval, asking for a backward pass on a FORWARD context, or
    (dynamic graphs) skipping ``ggml_opt_prepare_alloc`` raises GgmlStateError; calling it while a loop
    runs the context (from a callback of ``ggml_opt_epoch``, or another thread) raises GgmlInUseError.

    Arguments:
        opt_ctx: [glossary]
        backward: True (the default) to train on the batch (backward pass and, every ``opt_period``
            evals, an optimizer step); False to only evaluate it.

    Value: None.

    Example:
        >>> ggml_opt_alloc(opt_ctx, True)
        >>> ggml_backend_tensor_set_data(ggml_opt_inputs(opt_ctx), xb)
        >>> ggml_opt_eval(opt_ctx, res)
    """
    opt_ptr(opt_ctx, "ggml_opt_alloc")
    opt_ctx.refuse_if_running("ggml_opt_alloc")
    opt_ctx.alloc(bool(backward))


def ggml_opt_eval(opt_ctx: OptContext, result: OptResult | None = None) -> None:
    """Evaluate the allocated graph on the current batch: forward pass, then backward and step if allocated.

    Needs a preceding ``ggml_opt_alloc`` (else GgmlStateError). Row indices of ``ggml_get_rows``
    inputs and the optimizer parameters are checked first (ggml would abort). While a loop runs the
    context (``ggml_opt_epoch``, ``ggml_opt_fit``), this raises GgmlInUseError: the loop evaluates it.

    Arguments:
        opt_ctx: [glossary]
        result: an OptResult to add this batch's loss, predictions and correct count to, or None (the
            default) to record nothing.

    Value: None; read ``ggml_opt_loss``/``ggml_opt_outputs`` or the result afterwards.

    Example:
        >>> ggml_opt_alloc(opt_ctx, False); ggml_opt_eval(opt_ctx, val_res)
    """
    opt_ptr(opt_ctx, "ggml_opt_eval")
    opt_ctx.refuse_if_running("ggml_opt_eval")
    opt_ctx.eval(result)
