"""Custom losses: a function of ggml tensors ``fn(ctx, y_true, y_pred)`` as a loss type (``CustomLoss``, loss type
13 carrying its function), the check of what it returns, and its value on host arrays for evaluation (computed
with the same function on the CPU)."""
from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from ..backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ..compute.run import ggml_graph_compute_with_ctx
from ..core.types import GGML_TYPE_F32, type_name
from ..errors import GgmlpyError, GgmlTypeError, GgmlValueError
from ..graph.backward import check_backward_graph
from ..graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ..graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ..graph.objects import Context, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_set_loss, ggml_set_param
from ..ops.reduce import ggml_sum


LOSS_CUSTOM = 13
# fn(ctx, y_true, y_pred) -> the loss tensor (its result is checked when the loss is built)
LossFunction = Callable[[Context, Tensor, Tensor], object]


class CustomLoss(int):
    """Loss type CUSTOM (13) carrying its function ``fn(ctx, y_true, y_pred) -> tensor`` and a name: everything
    that reads loss types as ints sees 13, and the loss builder calls ``fn``."""
    fn: LossFunction
    name: str

    def __new__(cls, fn: LossFunction, name: str) -> CustomLoss:
        obj = super().__new__(cls, LOSS_CUSTOM)
        obj.fn, obj.name = fn, name
        return obj

    def __repr__(self) -> str:
        return f"<custom loss {self.name}>"

    def __reduce__(self) -> tuple:
        return CustomLoss, (self.fn, self.name)


def ggml_opt_loss_custom(fn: LossFunction, name: str | None = None) -> CustomLoss:
    """A loss written with ggmlpy ops: ``fn(ctx, y_true, y_pred)`` returns a tensor, and the loss is the mean of
    its elements (Keras' reduction of a custom loss: per-sample or per-element values, averaged).

    ``y_pred`` is the outputs tensor in ggml's layout (``[features, batch]``, or more axes with the batch
    last), ``y_true`` the labels in the same shape, ``ctx`` the context to build ops in (``ggml_sub``,
    ``ggml_sqr``, ``ggml_log``, ...). ggml's autodiff gives the gradient, so every op between the outputs
    and the result needs a backward pass (refused before training if one has none). The result either keeps
    the batch as its last axis (per-sample or per-element values: sample weights apply per sample) or is a
    scalar (the batch's loss; sample weights are then refused). ``fn`` runs once when a training or
    evaluation graph is built, not per step. Loss type 13 for the fit functions and ``ggml_opt_init``; the
    model layer takes the function itself (``ggml_compile(loss=fn)``).

    Arguments:
        fn: the function; exceptions it raises reach the caller with the loss's name.
        name: what histories and errors call it (default ``fn.__name__``).

    Value: a loss type (an int subclass holding ``fn``) for ``loss_type=`` / ``loss_types=``.

    Example:
        >>> def log_cosh(ctx, y, p):   # Keras' LogCosh with ggml ops
        ...     e = ggml_sub(ctx, p, y)
        ...     cosh2 = ggml_add(ctx, ggml_exp(ctx, e), ggml_exp(ctx, ggml_neg(ctx, e)))
        ...     return ggml_log(ctx, ggml_scale(ctx, cosh2, 0.5))
        >>> ggml_fit_opt_gen(sched, ctx, x, out, gen, loss_type=ggml_opt_loss_custom(log_cosh))
    """
    if not callable(fn):
        raise GgmlTypeError(f"ggml_opt_loss_custom: fn must be a function fn(ctx, y_true, y_pred) -> tensor, got "
                            f"{type(fn).__name__}")
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        raise GgmlTypeError(f"ggml_opt_loss_custom: fn is called as fn(ctx, y_true, y_pred), but its signature is "
                            f"{inspect.signature(fn)}") from None
    except ValueError:  # a builtin: its call will tell
        pass
    if name is None:
        name = getattr(fn, "__name__", "custom_loss")
    if not isinstance(name, str) or not name:
        raise GgmlTypeError(f"ggml_opt_loss_custom: name must be a non-empty str, got {name!r}")
    return CustomLoss(fn, name)


def custom_loss_tensor(ctx: Context, loss: CustomLoss, y_true: Tensor, y_pred: Tensor, batch: int) -> Tensor:
    """``loss.fn``'s result, checked: an F32 tensor, a scalar or keeping the ``batch`` samples of ``y_pred`` as
    its last axis."""
    try:
        out = loss.fn(ctx, y_true, y_pred)
    except GgmlpyError as exc:
        raise type(exc)(f"the custom loss '{loss.name}': {exc}") from exc
    if not isinstance(out, Tensor):
        raise GgmlTypeError(f"the custom loss '{loss.name}' returned {type(out).__name__}; it must return a tensor "
                            "built from y_true and y_pred with ggmlpy ops")
    if out.type != GGML_TYPE_F32:
        raise GgmlTypeError(f"the custom loss '{loss.name}' returned a {type_name(out.type)} tensor; it must be "
                            "F32 (ggml's autodiff and the loss's mean)")
    dims = [n for n in out.shape if n != 1]
    if dims and dims[-1] != batch:
        raise GgmlValueError(f"the custom loss '{loss.name}' returned shape {list(out.shape)}: expected a scalar or "
                             f"a tensor whose last axis is the batch ({batch}), as y_pred {list(y_pred.shape)}")
    return out


def returns_batch_value(loss: CustomLoss, sample_ne: tuple[int, ...]) -> bool | None:
    """Whether ``loss.fn`` returns one value for a whole batch (a scalar) rather than per-sample values, on outputs
    of one sample's ggml shape ``sample_ne``; refuses, naming the op, a loss ggml cannot train through (an op
    without a backward pass between ``y_pred`` and its result), which ``ggml_fit`` would refuse later. Built on
    stand-in tensors in a scratch context, nothing computed: a batch of a size no sample axis has, so that an axis
    mixed up with the batch shows. None where the function cannot be built on them (one that depends on the real
    batch size): ``ggml_fit`` builds it on the real batch and checks it then."""
    batch = next(n for n in range(3, 1 << 20) if n not in sample_ne)
    ne = (*sample_ne, batch)[-4:]
    nodes = 4096
    ctx = ggml_init(mem_size=ggml_graph_overhead(nodes, True) + 4 * nodes * ggml_tensor_overhead() + 4096,
                    no_alloc=True)
    try:
        y_pred = ggml_set_param(ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), ne))
        y_true = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), ne)
        try:
            out = custom_loss_tensor(ctx, loss, y_true, y_pred, batch)
        except GgmlpyError:
            return None
        total = ggml_set_loss(ggml_sum(ctx, out))
        graph = ggml_new_graph_custom(ctx, nodes, True)
        ggml_build_forward_expand(graph, total)
        try:
            check_backward_graph(graph)
        except GgmlpyError as exc:
            raise type(exc)(f"the custom loss '{loss.name}' cannot be trained through: {exc}") from None
        return out.nelements() == 1
    finally:
        ctx.free()


def evaluate_custom_loss(loss: CustomLoss, y_pred: np.ndarray, y_true: np.ndarray) -> np.ndarray:
    """Each sample's value of a custom loss on host arrays (``y_pred`` as ``(N, *sample_shape)``, ``y_true`` of
    the same size), computed with the loss's own function on the CPU: the mean of each sample's elements of
    its result, or the batch's value for every sample when it returns a scalar."""
    y_pred = np.ascontiguousarray(y_pred, np.float32)
    y_true = np.ascontiguousarray(y_true, np.float32).reshape(y_pred.shape)
    n = y_pred.shape[0]
    ne = tuple(reversed(y_pred.shape))[:4]
    nodes = 4096
    ctx = ggml_init(mem_size=ggml_graph_overhead(nodes) + 1024 * ggml_tensor_overhead() + 96 * y_pred.nbytes
                    + (1 << 20), no_alloc=False)
    try:
        yp = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), ne)
        yt = ggml_new_tensor(ctx, GGML_TYPE_F32, len(ne), ne)
        ggml_backend_tensor_set_data(yp, y_pred.reshape(-1))
        ggml_backend_tensor_set_data(yt, y_true.reshape(-1))
        result = custom_loss_tensor(ctx, loss, yt, yp, n)
        graph = ggml_new_graph_custom(ctx, nodes, False)
        ggml_build_forward_expand(graph, result)
        ggml_graph_compute_with_ctx(ctx, graph)
        values = ggml_backend_tensor_get_data(result).astype(np.float64).reshape(-1)
    finally:
        ctx.free()
    if values.size == 1:
        return np.full(n, values[0])
    return values.reshape(n, -1).mean(axis=1)
