"""ggml-opt's constants: optimizer and build types, with ggmlR's getters."""
from __future__ import annotations

from .._ffi import ffi, lib
from ..errors import GgmlValueError


OPTIMIZER_ADAMW = int(lib.GGML_OPT_OPTIMIZER_TYPE_ADAMW)
OPTIMIZER_SGD = int(lib.GGML_OPT_OPTIMIZER_TYPE_SGD)
BUILD_FORWARD = int(lib.GGML_OPT_BUILD_TYPE_FORWARD)
BUILD_GRAD = int(lib.GGML_OPT_BUILD_TYPE_GRAD)
BUILD_OPT = int(lib.GGML_OPT_BUILD_TYPE_OPT)
STATIC_GRAPH_NODES = int(lib.GGML_DEFAULT_GRAPH_SIZE)


def ggml_opt_optimizer_type_adamw() -> int:
    """Optimizer type AdamW (the default): Adam with decoupled weight decay.

    ggml's defaults: learning rate 1e-3, beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0. It keeps two
    moment tensors per parameter. Pass it as ``optimizer`` to the fit functions and ``ggml_opt_init*``.

    Value: the int constant (ggml's ``GGML_OPT_OPTIMIZER_TYPE_ADAMW``, 0).

    Example:
        >>> ggml_fit_opt(sched, ctx, x, out, ds, optimizer=ggml_opt_optimizer_type_adamw())
    """
    return OPTIMIZER_ADAMW
def ggml_opt_optimizer_type_sgd() -> int:
    """Optimizer type SGD: plain stochastic gradient descent (no momentum), optional weight decay.

    ggml's default learning rate is 1e-3 (often too small for SGD: raise it with ``learning_rate=`` or
    ``ggml_opt_set_lr(lr_ud, sgd_lr=...)``). Needs no per-parameter state, so it uses less memory than
    AdamW. Pass it as ``optimizer`` to the fit functions and ``ggml_opt_init*``.

    Value: the int constant (ggml's ``GGML_OPT_OPTIMIZER_TYPE_SGD``, 1).

    Example:
        >>> ggml_fit_opt(sched, ctx, x, out, ds, optimizer=ggml_opt_optimizer_type_sgd(), learning_rate=0.05)
    """
    return OPTIMIZER_SGD
def ggml_opt_build_type_forward() -> int:
    """Build type FORWARD: an opt context that only evaluates (no backward pass, no optimizer step).

    For ``ggml_opt_init(..., build_type=ggml_opt_build_type_forward())``: cheaper when a context only
    computes losses or predictions. ``ggml_opt_alloc(opt_ctx, backward=True)`` then raises.

    Value: the int constant (ggml's ``GGML_OPT_BUILD_TYPE_FORWARD``, 10).

    Example:
        >>> ev = ggml_opt_init(sched, loss, ctx_compute=ctx, inputs=x, outputs=out,
        ...                    build_type=ggml_opt_build_type_forward())
    """
    return BUILD_FORWARD
def ggml_opt_build_type_grad() -> int:
    """Build type GRAD: forward and backward pass without the optimizer step (ggml's constant).

    A context built with it (static graphs only) accumulates the gradients of every backward eval in its
    accumulators (``ggml_opt_grad_acc``) and never steps: the caller applies an optimizer and zeroes them
    with ``ggml_opt_reset(opt_ctx, False)``. ggmlpy's data-parallel training sums such accumulators over
    replicas (upstream ggml aborts building one; patches/0021 makes it work).

    Value: the int constant (ggml's ``GGML_OPT_BUILD_TYPE_GRAD``, 20).

    Example:
        >>> ggml_opt_build_type_grad()
        20
    """
    return BUILD_GRAD
def ggml_opt_build_type_opt() -> int:
    """Build type OPT (the default): forward pass, backward pass and optimizer step.

    Value: the int constant (ggml's ``GGML_OPT_BUILD_TYPE_OPT``, 30).

    Example:
        >>> opt = ggml_opt_init(sched, loss, ctx_compute=ctx, inputs=x, outputs=out,
        ...                     build_type=ggml_opt_build_type_opt())
    """
    return BUILD_OPT


def check_optimizer(optimizer: object) -> int:
    if isinstance(optimizer, bool) or optimizer not in (OPTIMIZER_ADAMW, OPTIMIZER_SGD):
        raise GgmlValueError("optimizer: expected ggml_opt_optimizer_type_adamw() or "
                             f"ggml_opt_optimizer_type_sgd(), got {optimizer!r}")
    return int(optimizer)


def ggml_opt_optimizer_name(optimizer_type: int) -> str:
    """The name of an optimizer type: ``"adamw"`` or ``"sgd"``.

    Arguments:
        optimizer_type: ``ggml_opt_optimizer_type_adamw()`` or ``ggml_opt_optimizer_type_sgd()`` (else
            GgmlValueError).

    Value: a str.

    Example:
        >>> ggml_opt_optimizer_name(ggml_opt_context_optimizer_type(opt_ctx))
        'adamw'
    """
    return ffi.string(lib.ggml_opt_optimizer_name(check_optimizer(optimizer_type))).decode()
