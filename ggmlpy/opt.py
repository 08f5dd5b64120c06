"""ggml-opt: optimizer contexts, results, alloc/eval, learning rates (ggml-opt.h).

An ``OptContext`` owns a ``ggml_opt_context_t`` plus what it needs to live: a private
compute context for its graphs (ggml-opt never returns that memory, so it must not
come out of the user's context), the optimizer-parameter struct that the C callback
reads at every optimizer step (``lr_ud``), and the loss graph of losses ggml-opt
does not build itself. Python mirrors ggml-opt's counters so misuse that would abort
inside C (alloc twice, eval without alloc, a backward pass on a forward-only context)
raises instead.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import losses as L
from ._checks import (FLOAT32_MAX, check_graph_memory, is_real, list_arg, check_backward_nodes, check_index_inputs, check_nodes_supported, check_opt_heads,
                      check_static_memory, index_inputs)
from ._ffi import ffi, lib
from ._handle import Handle, _unique, compute_locks, computing, free_handle, memory_epoch, raise_type, unwrap, using
from .context import (Context, Graph, Tensor, as_tensor, input_leaf, ggml_graph_overhead, ggml_init, ggml_tensor_overhead,
                      walk_graph)
from .errors import GgmlInUseError, GgmlStateError, GgmlTypeError, GgmlValueError, expect
from .opt_result import OptResult
from .sched import Scheduler, sched_hash_size

OPTIMIZER_ADAMW = int(lib.GGML_OPT_OPTIMIZER_TYPE_ADAMW)
OPTIMIZER_SGD = int(lib.GGML_OPT_OPTIMIZER_TYPE_SGD)
BUILD_FORWARD = int(lib.GGML_OPT_BUILD_TYPE_FORWARD)
BUILD_GRAD = int(lib.GGML_OPT_BUILD_TYPE_GRAD)
BUILD_OPT = int(lib.GGML_OPT_BUILD_TYPE_OPT)
STATIC_GRAPH_NODES = int(lib.GGML_DEFAULT_GRAPH_SIZE)
LR_FLOOR = 1e-12  # ggml aborts on lr <= 0, so schedules are clamped here


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

    Offered for completeness: ggml aborts when an opt context is built with it, so ``ggml_opt_init``
    refuses it with a GgmlValueError. Use ``ggml_opt_build_type_opt()`` or ``..._forward()``.

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


def check_optimizer(optimizer: Any) -> int:
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


# ---------------------------------------------------------------- learning-rate userdata

class _Fields:
    """One optimizer's parameters inside an ``OptimizerParams`` (``.adamw`` or ``.sgd``): public, checked fields."""
    __slots__ = ("_owner", "_c", "_name")
    _RULES: dict = {}

    def __init__(self, owner: "OptimizerParams", c: Any, name: str) -> None:
        object.__setattr__(self, "_owner", owner)  # keeps the struct alive
        object.__setattr__(self, "_c", c)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key: str) -> float:
        if key not in self._RULES:
            raise AttributeError(f"{self._name} optimizer parameters are {', '.join(self._RULES)}; got {key!r}")
        return float(getattr(self._c, key))

    def __setattr__(self, key: str, value: Any) -> None:
        rule = self._RULES.get(key)
        if rule is None:
            raise AttributeError(f"{self._name} optimizer parameters are {', '.join(self._RULES)}; cannot set {key!r}")
        what = f"{self._name}.{key}"
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(value):
            raise GgmlValueError(f"{what} must be a finite number, got {value!r}")
        with np.errstate(over="ignore"):
            stored = float(np.float32(value))  # what ggml will see (a float)
        low, high, low_open, high_open, text = rule
        if not math.isfinite(stored) or stored < low or (low_open and stored <= low) or stored > high \
                or (high_open and stored >= high):
            as_f32 = f" ({stored:g} as a 32-bit float)" if stored != value else ""
            raise GgmlValueError(f"{what} must be {text}, got {value!r}{as_f32}")
        setattr(self._c, key, stored)

    def as_dict(self) -> dict:
        return {k: float(getattr(self._c, k)) for k in self._RULES}

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(f'{k}={v:g}' for k, v in self.as_dict().items())})"


_INF = float("inf")


class _AdamW(_Fields):
    __slots__ = ()
    # (low, high, low open, high open, the rule in words)
    _RULES = {"alpha": (0.0, _INF, True, False, "> 0 (the learning rate)"),
              "beta1": (0.0, 1.0, False, True, "in [0, 1) (1 divides by zero in AdamW's bias correction)"),
              "beta2": (0.0, 1.0, False, True, "in [0, 1) (1 divides by zero in AdamW's bias correction)"),
              "eps": (0.0, _INF, False, False, ">= 0"),
              "wd": (0.0, 1.0, False, False, "in [0, 1] (decoupled weight decay)")}


class _SGD(_Fields):
    __slots__ = ()
    _RULES = {"alpha": (0.0, _INF, True, False, "> 0 (the learning rate)"),
              "wd": (0.0, 1.0, False, False, "in [0, 1] (decoupled weight decay)")}


class OptimizerParams:
    """ggml's ``ggml_opt_optimizer_params``: the hyper-parameters of both optimizers, as public fields.

    ``.adamw.alpha`` (learning rate), ``.adamw.beta1``, ``.adamw.beta2``, ``.adamw.eps``, ``.adamw.wd``
    (decoupled weight decay) and ``.sgd.alpha``, ``.sgd.wd``. Each assignment is checked against what
    ggml asserts at an optimizer step (alpha > 0, wd in [0, 1], eps >= 0, finite) and against betas of 1,
    which make every weight NaN (AdamW's bias correction divides by 1 - beta^t): betas in [0, 1), as the
    32-bit float ggml receives (0.99999999 is 1 there). ``ggml_opt_get_default_optimizer_params()`` gives ggml's defaults.
    """

    def __init__(self, c: Any = None) -> None:
        if c is None:
            c = ffi.new("struct ggml_opt_optimizer_params *")
            c[0] = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
        self._c = c
        self.adamw = _AdamW(self, c.adamw, "adamw")
        self.sgd = _SGD(self, c.sgd, "sgd")

    def as_dict(self) -> dict:
        """``{"adamw": {...}, "sgd": {...}}`` with the current values."""
        return {"adamw": self.adamw.as_dict(), "sgd": self.sgd.as_dict()}

    def copy(self) -> "OptimizerParams":
        out = OptimizerParams()
        out._c[0] = self._c[0]
        return out

    def update(self, values: Any, what: str = "optimizer parameters") -> None:
        """Set fields from another OptimizerParams or a dict ``{"adamw": {...}, "sgd": {...}}`` (all checked
        before any is written)."""
        if isinstance(values, OptimizerParams):
            self._c[0] = values._c[0]
            return
        if not isinstance(values, dict) or not set(values) <= {"adamw", "sgd"} or \
                not all(isinstance(v, dict) for v in values.values()):
            raise GgmlTypeError(f"{what}: expected an OptimizerParams (ggml_opt_get_default_optimizer_params()) or a "
                                f"dict {{'adamw': {{'alpha': ...}}, 'sgd': {{...}}}}, got {values!r:.120}")
        trial = self.copy()
        for group, fields in values.items():
            for key, value in fields.items():
                setattr(getattr(trial, group), key, value)
        self._c[0] = trial._c[0]

    def __repr__(self) -> str:
        return f"<OptimizerParams {self.adamw!r} {self.sgd!r}>"


def ggml_opt_get_default_optimizer_params() -> OptimizerParams:
    """ggml's default optimizer hyper-parameters, as an object whose fields can be changed.

    AdamW: ``alpha`` (learning rate) 1e-3, ``beta1`` 0.9, ``beta2`` 0.999, ``eps`` 1e-8, ``wd`` 0; SGD:
    ``alpha`` 1e-3, ``wd`` 0. Set fields (checked) and give the object to ``ggml_opt_default_params``'s
    ``opt_pars``, or return it from a ``get_opt_pars`` callback (``ggml_opt_fit``, ``ggml_opt_init``).

    Value: an OptimizerParams.

    Example:
        >>> p = ggml_opt_get_default_optimizer_params()
        >>> p.adamw.alpha = 1.0; p.adamw.beta1 = 0.0; p.sgd.alpha = 1.0
    """
    return OptimizerParams()


class LrUserdata:
    """The optimizer parameters a context reads at each optimizer step; mutate to schedule the LR.

    ``provider`` (None, or a function of no arguments returning an OptimizerParams or a dict) is asked for
    the parameters before every optimizer step, as ggml calls its ``get_opt_pars`` callback."""

    def __init__(self, weight_decay: float = 0.0, params: Any = None) -> None:
        self.provider: Any = None
        if params is not None:  # shared with an OptimizerParams: changing its fields changes the next steps
            self.params = params
            return
        self.params = ffi.new("struct ggml_opt_optimizer_params *")
        self.params[0] = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
        check_weight_decay(weight_decay)
        self.params.adamw.wd = weight_decay
        self.params.sgd.wd = weight_decay

    def refresh(self) -> None:
        """Ask ``provider`` for the parameters of the coming optimizer step (ggml's get_opt_pars)."""
        if self.provider is None:
            return
        values = self.provider()
        target = OptimizerParams()  # unset fields are ggml's defaults, as in ggml's callbacks
        target.update(values, "get_opt_pars")
        self.params[0] = target._c[0]

    def get(self) -> dict:
        return {"adamw": float(self.params.adamw.alpha), "sgd": float(self.params.sgd.alpha)}

    def set(self, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
        for name, value in (("adamw_lr", adamw_lr), ("sgd_lr", sgd_lr)):
            if value is not None and (not is_real(value) or not 0 <= value <= FLOAT32_MAX):
                raise GgmlValueError(f"ggml_opt_set_lr: {name} must be a finite number >= 0 (ggml keeps it as a "
                                     f"float32: at most {FLOAT32_MAX:.4g}), got {value!r}")
        if adamw_lr is not None:
            self.params.adamw.alpha = max(float(adamw_lr), LR_FLOOR)
        if sgd_lr is not None:
            self.params.sgd.alpha = max(float(sgd_lr), LR_FLOOR)

    def validate(self) -> None:
        """The conditions ggml_opt_eval asserts, checked before the step."""
        p = self.params
        problems = []
        if not 0 < p.adamw.alpha <= FLOAT32_MAX or not 0 < p.sgd.alpha <= FLOAT32_MAX:
            problems.append(f"learning rates must be > 0 (adamw {p.adamw.alpha}, sgd {p.sgd.alpha})")
        if not (0 <= p.adamw.beta1 < 1 and 0 <= p.adamw.beta2 < 1):
            problems.append(f"betas must be in [0, 1) (got {p.adamw.beta1}, {p.adamw.beta2}; 1 divides by zero in "
                            "the bias correction)")
        if not p.adamw.eps >= 0:
            problems.append(f"eps must be >= 0 (got {p.adamw.eps})")
        if not (0 <= p.adamw.wd <= 1 and 0 <= p.sgd.wd <= 1):
            problems.append(f"weight decay must be in [0, 1] (got {p.adamw.wd}, {p.sgd.wd})")
        if problems:
            raise GgmlValueError("invalid optimizer parameters: " + "; ".join(problems))

    def __repr__(self) -> str:
        return f"<LrUserdata adamw={self.params.adamw.alpha:g} sgd={self.params.sgd.alpha:g}>"


def check_weight_decay(weight_decay: Any) -> float:
    if not is_real(weight_decay) or not 0 <= weight_decay <= 1:
        raise GgmlValueError(f"weight_decay must be a number in [0, 1], got {weight_decay!r}")
    return float(weight_decay)


def ggml_opt_set_lr(lr_ud: LrUserdata, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
    """Change the learning rate an opt context uses from its next optimizer step on.

    ``lr_ud`` holds both optimizers' rates; set one or both (the other is left alone). The built-in LR
    schedules call this between epochs; call it from your own callback (``state.lr_ud``) or between
    ``ggml_opt_eval`` calls. A rate of 0 is clamped to 1e-12 (ggml aborts on a rate <= 0).

    Arguments:
        lr_ud: the learning-rate handle: ``ggml_opt_init_for_fit(...)["lr_ud"]``, or ``state.lr_ud``
            inside a fit's callbacks.
        adamw_lr: the new AdamW learning rate (a finite number >= 0), or None (the default) to keep it.
        sgd_lr: the new SGD learning rate (a finite number >= 0), or None (the default) to keep it.

    Value: None. Raises GgmlValueError for a negative or non-finite rate.

    Example:
        >>> fit = ggml_opt_init_for_fit(sched, ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x, outputs=out)
        >>> ggml_opt_set_lr(fit["lr_ud"], adamw_lr=1e-4)
    """
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_set_lr(lr_ud)", "LrUserdata", lr_ud)
    lr_ud.set(adamw_lr, sgd_lr)


def ggml_opt_get_lr(lr_ud: LrUserdata) -> dict:
    """The learning rates an opt context currently uses.

    Arguments:
        lr_ud: the learning-rate handle (``ggml_opt_init_for_fit(...)["lr_ud"]`` or ``state.lr_ud``).

    Value: a dict ``{"adamw": float, "sgd": float}``.

    Example:
        >>> ggml_opt_get_lr(fit["lr_ud"])
        {'adamw': 0.001, 'sgd': 0.001}
    """
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_get_lr(lr_ud)", "LrUserdata", lr_ud)
    return lr_ud.get()


# ---------------------------------------------------------------- opt context

def _count_forward(outputs: Sequence[Tensor], with_leafs: bool = False) -> Any:
    """Forward nodes reachable from the outputs, and the trainable leafs among them (and the other leafs)."""
    params, n_nodes, n_leafs = [], 0, 0
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    for t in walk_graph(o.ptr for o in outputs):
        if t.flags & flag:
            params.append(t)
        if t.op != lib.GGML_OP_NONE or t.flags & flag:
            n_nodes += 1
        else:
            n_leafs += 1
    return (n_nodes, params, n_leafs) if with_leafs else (n_nodes, params)


_MUL_MAT = next(i for i in range(int(lib.GGML_OP_COUNT)) if ffi.string(lib.ggml_op_name(i)) == b"MUL_MAT")


def forward_flops(outputs: Sequence[Tensor]) -> float:
    """A rough count of the floating-point operations of one forward pass to ``outputs``: 2 per
    multiply-add of a matrix product, one per result element of any other op."""
    return forward_work(outputs).flops


def _blas_takes(t: Any) -> bool:
    """Whether ggml's BLAS backend takes this MUL_MAT (F32, at least 32^3 multiply-adds: patch 0010)."""
    return int(t.ne[0]) * int(t.ne[1]) * int(t.src[1].ne[0]) >= 32 ** 3 \
        and t.src[0].type == lib.GGML_TYPE_F32 and t.src[1].type == lib.GGML_TYPE_F32


# ggml-opt's per-parameter work, in element-op units of ``StepWork.pool_elements``: AdamW reads a gradient,
# two moments and the weight and writes three of them (memory-bound, about four element ops' time);
# accumulating a gradient across a logical batch is one addition.
OPTIMIZER_ELEMENTS_PER_PARAM = 4.0


@dataclass(frozen=True)
class StepWork:
    """What one step computes, for splitting the CPU threads between ggml's pool and OpenBLAS.

    ``flops``: all of it, as ``forward_flops`` counts. ``blas_flops``: the matrix products ggml's BLAS
    backend takes (2 per multiply-add). ``pool_elements``: what ggml's CPU pool is left with, one per
    result element of its ops (its own small products at 2 per multiply-add), in training the optimizer's
    pass over the parameters included."""
    flops: float
    blas_flops: float
    pool_elements: float


def forward_work(outputs: Sequence[Tensor]) -> StepWork:
    """The work of one forward pass to ``outputs`` (inference)."""
    flops = blas = 0.0
    for t in walk_graph(o.ptr for o in outputs):
        if t.op == lib.GGML_OP_NONE:
            continue
        n = float(lib.ggml_nelements(t))
        if t.op == _MUL_MAT:
            product = 2.0 * n * int(t.src[0].ne[0])
            flops += product
            blas += product if _blas_takes(t) else 0.0
        else:
            flops += n
    return StepWork(flops, blas, flops - blas)


def training_step_work(outputs: Sequence[Tensor], opt_period: int = 1) -> StepWork:
    """The work of one training step (forward and backward: 3x the forward pass) of ``outputs``, with the
    optimizer stepping every ``opt_period`` steps."""
    forward = forward_work(outputs)
    n_params = sum(float(lib.ggml_nelements(p)) for p in _count_forward(outputs)[1])
    per_param = OPTIMIZER_ELEMENTS_PER_PARAM / max(1, opt_period) + (1.0 if opt_period > 1 else 0.0)
    return StepWork(3.0 * forward.flops, 3.0 * forward.blas_flops,
                    3.0 * forward.pool_elements + n_params * per_param)


def training_graph_nodes(outputs: Tensor | Sequence[Tensor], build_type: int = BUILD_OPT) -> int:
    """An upper bound on the nodes and leafs of the graphs ggml-opt builds from ``outputs`` (one tensor, or the
    outputs and extra outputs): the backward pass adds at most ~3 nodes per forward op, each parameter a
    gradient accumulator, two moments and an optimizer step (measured: ~2.6 per op, ~5.5 per parameter),
    ggml-opt's loss a few more."""
    roots = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    n_nodes, params, n_leafs = _count_forward(roots, with_leafs=True)
    if build_type == BUILD_FORWARD:
        return n_nodes + n_leafs + 32
    return 4 * (n_nodes - len(params)) + 6 * len(params) + n_leafs + 64


def static_graph_size(outputs: Tensor | Sequence[Tensor], build_type: int = BUILD_OPT) -> int:
    """The node capacity to give ggml-opt's static graphs: ggml's default, or more for large models."""
    return max(STATIC_GRAPH_NODES, training_graph_nodes(outputs, build_type))


def check_sched_room(sched: Scheduler, outputs: Tensor | Sequence[Tensor], build_type: int) -> None:
    """The scheduler's hash set must hold the nodes and leafs of the graphs ggml-opt allocates on it, or
    ggml aborts in ggml_opt_alloc."""
    need = training_graph_nodes(outputs, build_type)
    room = sched_hash_size(sched.graph_size)
    if need > room:
        what = "forward" if build_type == BUILD_FORWARD else "training"
        raise GgmlValueError(f"the scheduler is too small for this model's {what} graph: about {need} nodes and "
                             f"leafs, room for {room} (graph_size {sched.graph_size}); create it with "
                             f"ggml_backend_sched_new(..., graph_size={need}) or more")


def check_trainable(outputs: Sequence[Tensor], what: str = "outputs", accumulating: bool = False,
                    side_outputs: Sequence[Tensor] = ()) -> int:
    """ggml could build and run the backward pass of these outputs (it would abort otherwise), with
    ``side_outputs`` in the same graph (computed, no gradient: ggml-opt's extra outputs); returns the number of
    forward nodes."""
    n_nodes, params = _count_forward([*outputs, *side_outputs])
    if not params:
        raise GgmlValueError(f"nothing to train: no tensor reachable from {what} is marked with ggml_set_param")
    for p in params:
        if p.type != lib.GGML_TYPE_F32:
            from ._checks import _tensor_label
            raise GgmlTypeError(f"trainable tensors must be F32 (ggml's optimizer steps are F32-only); "
                                f"{_tensor_label(p)} is not; create it as GGML_TYPE_F32")
    # The graph ggml-opt will build, in a scratch context: its node order is ggml's own.
    scratch = ggml_init(ggml_graph_overhead(2 * n_nodes + 16) + 1024, no_alloc=True)
    try:
        graph = lib.ggml_new_graph_custom(scratch.ptr, 2 * n_nodes + 16, False)
        for o in [*outputs, *side_outputs]:
            lib.ggml_build_forward_expand(graph, o.ptr)
        nodes = [lib.ggml_graph_node(graph, i) for i in range(lib.ggml_graph_n_nodes(graph))]
        check_backward_nodes(nodes, [o.ptr for o in outputs], accumulating)
    finally:
        scratch.free()
    return n_nodes


class OptContext(Handle):
    kind = "opt context"

    def __init__(self, sched: Scheduler, heads: list[L.Head], optimizer: int, opt_period: int,
                 ctx_compute: Context | None, inputs: Tensor | None, build_type: int = BUILD_OPT,
                 lr_ud: LrUserdata | None = None, loss_mask_ne0: int | None = None,
                 extra_outputs: Sequence[Tensor] = ()) -> None:
        self.sched = sched
        self.optimizer = optimizer
        self.opt_period = opt_period
        self.build_type = build_type
        self.static = ctx_compute is not None
        self.lr_ud = lr_ud or LrUserdata()
        self.inputs = inputs
        self.user_ctx = ctx_compute
        self.loss = L.build_loss_graph(heads, sched, loss_mask_ne0) if self.static else None
        # static graphs: what every eval computes besides the loss (ggml-opt's extra outputs, patches/0017): the
        # caller's side outputs (batch-norm statistics) and the loss graph's own (argmax counts)
        self.extra_outputs = [*extra_outputs, *self.loss.extra_outputs] if self.static else []
        self._extra_array: Any = None
        self._graph_ctx = None
        self._opt_i = 0          # mirrors ggml-opt's accumulation phase
        self._pending = None     # None, "forward" or "backward": an alloc waiting for its eval
        self._prepared = False   # dynamic mode: prepare_alloc called since the last eval
        self._step_ctx: Any = None   # dynamic mode: the ctx_compute of the last prepare_alloc
        self._step = _DynamicStep()  # dynamic mode: what this step's graph tensors are valid for
        self._param_layout: list | None = None  # dynamic mode: (node index, shape) of the first graph's params
        self._running: str | None = None  # the loop driving this context now (ggml_opt_epoch, a fit)
        self._leaf_data: list = []  # static graphs: (leaf, its data) as ggml-opt's graph copy holds them
        self._memory_epoch = -1
        self.rng = np.random.default_rng(5489)  # dataset shuffles; mt19937's default seed, as ggml's
        self.labels_offs = [0]
        try:
            params, parents = self._params(sched, heads, build_type, optimizer, opt_period, ctx_compute, inputs)
        except BaseException:
            if self.loss is not None:
                self.loss.free()  # refused before ggml-opt was called: release the loss graph's buffer now
            raise
        self.heads = heads
        # ggml aborts on an out-of-range ggml_get_rows index: those inputs are checked before each eval.
        self._index_inputs = index_inputs([self.loss.opt_outputs, *self.extra_outputs]) if self.static else []
        super().__init__(lib.ggml_opt_init(params), lib.ggml_opt_free, parents=parents)
        if self.static:
            sched._opt_users.add(self)
        sched._opt_any.add(self)

    @property
    def keepers(self) -> tuple:
        """Every handle an evaluation needs: this context, what it depends on, the buffers of those contexts
        (each once; recomputed when a context got another buffer)."""
        stamp = tuple(id(b) for h in self._parents for b in getattr(h, "_buffers", ()) if b.alive)
        cached = self.__dict__.get("_keepers")
        if cached is None or cached[0] != stamp:
            hs = [self, *self._parents]
            for h in self._parents:
                hs.extend(b for b in getattr(h, "_buffers", ()) if b.alive)
            if self.loss is not None:
                hs.extend(self.loss.owned)
            cached = self.__dict__["_keepers"] = (stamp, tuple(_unique(hs)))
        return cached[1]

    @property
    def _locks(self) -> tuple:
        locks = self.__dict__.get("_compute_locks")
        if locks is None:
            locks = self.__dict__["_compute_locks"] = compute_locks(self.sched.backends)
        return locks

    def _in_use(self, what: str, result: Any = None) -> Any:
        """Mark what one C call needs in use; nothing to do when a running loop (an epoch, a fit) has marked
        it all already (the per-batch calls stay cheap)."""
        if self._users and (result is None or result._users):
            return contextlib.nullcontext()
        return using((*self.keepers, result), what)

    def running(self, what: str) -> "_Running":
        """``with opt_ctx.running("ggml_opt_epoch"):`` the loop drives this context: the public per-batch
        calls (``ggml_opt_alloc``/``eval``/``reset``, another epoch) refuse meanwhile, and the handles it
        needs cannot be freed."""
        return _Running(self, what)

    def refuse_if_running(self, fn: str) -> None:
        if self._running is not None:
            raise GgmlInUseError(f"{fn}: this opt context is in use by {self._running} (this call comes from one of "
                                 "its callbacks, or from another thread); the loop allocates and evaluates it "
                                 "itself. Call it after that call has returned")

    def _check_memory(self) -> None:
        """Static graphs: ggml-opt computes a copy of the graph that keeps the leafs' data pointers; a leaf
        whose memory went (or moved) since would be read and written through a dangling pointer."""
        if not self._leaf_data or self._memory_epoch == memory_epoch():
            return
        for t, data in self._leaf_data:
            if t.data != data:
                from ._checks import _tensor_label
                how = "has no memory any more" if t.data == ffi.NULL else "was given new memory"
                raise GgmlStateError(f"{_tensor_label(t)} {how} since this opt context was built (its buffer, "
                                     "context or allocator was freed); ggml-opt's graphs still point at the old memory. "
                                     "Free this opt context and build a new one after allocating the tensor again")
        self._memory_epoch = memory_epoch()

    def _params(self, sched, heads, build_type, optimizer, opt_period, ctx_compute, inputs):
        """Check the model and fill ggml-opt's parameters (static graphs: a private graph context)."""
        params = lib.ggml_opt_default_params(sched.ptr, heads[0].loss_type if not self.static
                                             else self.loss.ggml_loss_type)
        params.build_type = build_type
        params.opt_period = opt_period
        params.optimizer = optimizer
        params.get_opt_pars = lib.ggml_opt_get_constant_optimizer_params
        params.get_opt_pars_ud = self.lr_ud.params
        parents = [sched]
        if self.static:
            extra = self.extra_outputs
            roots = [self.loss.opt_outputs, *extra]
            if build_type != BUILD_FORWARD:
                check_trainable([self.loss.opt_outputs], accumulating=opt_period > 1, side_outputs=extra)
            # every op must run on the scheduler's backends, every leaf have memory ggml-opt's copy can keep
            n_nodes = 2 * _count_forward(roots)[0] + 16
            with _graph_nodes(self.loss.opt_outputs, n_nodes, backward=build_type != BUILD_FORWARD,
                              side_outputs=extra) as nodes:
                check_nodes_supported(nodes, sched.backends, "ggml_opt_init")
                # ggml-opt ignores a failed allocation of its graphs (the next step crashes): a tensor or a node's
                # operands beyond the backends' memory are refused here, as for any graph
                check_graph_memory(nodes, nodes + [s for n in nodes for s in n.src if s != ffi.NULL],
                                   sched.backends, "ggml_opt_init")
            self._leaf_data = check_static_memory([t.ptr for t in roots], "ggml_opt_init")
            self._memory_epoch = memory_epoch()
            # ggml-opt's static graphs (forward, +backward, +optimizer step) all have one size; ggml's default
            # of 2048 nodes is raised for larger models (patches/0005 adds the graph_size field).
            graph_size = static_graph_size(roots, build_type)
            check_sched_room(sched, roots, build_type)
            # A private context: ggml-opt puts three graphs and all backward tensors here and never frees them.
            self._graph_ctx = ggml_init(3 * ggml_graph_overhead(graph_size, True)
                                        + 6 * graph_size * ggml_tensor_overhead(), no_alloc=True)
            params.graph_size = graph_size
            params.ctx_compute = self._graph_ctx.ptr
            params.inputs = inputs.ptr
            params.outputs = self.loss.opt_outputs.ptr
            if extra:
                self._extra_array = ffi.new("struct ggml_tensor *[]", [t.ptr for t in extra])
                params.n_extra_outputs = len(extra)
                params.extra_outputs = self._extra_array
            # the graphs read tensors of these contexts: the context goes when one of them is freed
            parents += [ctx_compute, self._graph_ctx, *inputs.keepers, *self.loss.opt_outputs.keepers,
                        *(h.outputs.keepers[0] for h in heads), *(k for t in extra for k in t.keepers)]
        return params, parents

    def free(self) -> None:
        if self._ptr is None:
            return
        super().free()
        if self.loss is not None:
            self.loss.free()
        if self._graph_ctx is not None:
            self._graph_ctx.free()

    # ---- tensors
    def tensor(self, ptr: Any) -> Tensor | None:
        """A tensor of the opt context's own memory (accumulators, moments; static graphs: everything)."""
        return Tensor(ptr, self) if ptr != ffi.NULL else None

    def step_tensor(self, ptr: Any) -> Tensor | None:
        """A tensor of the graph of this step: with dynamic graphs it lives in the ctx_compute given to
        ggml_opt_prepare_alloc and is valid until the next ggml_opt_alloc (ggml-opt rebuilds labels, loss and
        predictions then), so it refuses use once that context is freed or the next step is allocated."""
        if self.static or self._step_ctx is None or ptr == ffi.NULL:
            return self.tensor(ptr)
        return Tensor(ptr, self._step_ctx, deps=(self, self._step))

    def _check_step_ctx(self, fn: str) -> None:
        """Dynamic graphs: ggml-opt reads the graph in the ctx_compute of ggml_opt_prepare_alloc (freed memory
        would crash it)."""
        if not self.static and self._step_ctx is not None and not self._step_ctx.alive:
            raise GgmlStateError(f"{fn}: the ctx_compute given to ggml_opt_prepare_alloc has been freed, and the "
                                 "graph ggml-opt would run lives in it; build the step's graph again and call "
                                 "ggml_opt_prepare_alloc before ggml_opt_alloc")

    def labels(self, head: int = 0) -> Tensor | None:
        if self.loss is not None and self.loss.composite:
            return self.loss.heads[head].labels
        return self.step_tensor(lib.ggml_opt_labels(self.ptr)) if head == 0 else None

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    # ---- the per-batch protocol, checked
    def alloc(self, backward: bool) -> None:
        ptr = self.ptr
        self._check_memory()
        if self._pending is not None:
            raise GgmlStateError("ggml_opt_alloc was already called for the next eval; call ggml_opt_eval first")
        if backward and self.build_type == BUILD_FORWARD:
            raise GgmlStateError("this opt context was built forward-only (build type FORWARD): it cannot "
                                 "allocate a backward pass")
        if not self.static and not self._prepared:
            raise GgmlStateError("dynamic graphs: call ggml_opt_prepare_alloc before every ggml_opt_alloc")
        self._check_step_ctx("ggml_opt_alloc")
        if not self.static:
            self._step.alive = False  # the last step's labels, loss and predictions go
            self._step = _DynamicStep()
        self.sched.release()  # ggml-opt resets the scheduler: what it allocated for other graphs goes
        with self._in_use("ggml_opt_alloc"), computing(locks=self._locks):
            lib.ggml_opt_alloc(ptr, bool(backward))
        if backward and not self.static and self._opt_i == 0:
            # ggml-opt never zeroes the accumulators of dynamic graphs (ggml-internals 1.2): do it here.
            lib.ggml_opt_reset(ptr, False)
        self._pending = "backward" if backward else "forward"

    def eval(self, result: OptResult | None = None) -> None:
        ptr = self.ptr
        if self._pending is None:
            raise GgmlStateError("ggml_opt_eval needs a preceding ggml_opt_alloc")
        if self._pending == "backward":
            if (self._opt_i + 1) % self.opt_period == 0:  # this eval runs the optimizer step
                self.lr_ud.refresh()
            self.lr_ud.validate()
        if self._index_inputs:
            check_index_inputs(self._index_inputs)
        self._check_memory()
        self._check_step_ctx("ggml_opt_eval")
        res_ptr = ffi.NULL
        if result is not None:
            res_ptr = unwrap(result, OptResult, "ggml_opt_eval(result)")
            result.check_batch(self)
        with self._in_use("ggml_opt_eval", result), computing(locks=self._locks):
            lib.ggml_opt_eval(ptr, res_ptr)
        if self.static and self.loss.composite and result is not None:
            result.record_heads(self.loss.heads)
        self._opt_i = (self._opt_i + 1) % self.opt_period
        self._pending = None
        self._prepared = False

    def _describe(self) -> str:
        names = "+".join(L.LOSS_NAMES[h.loss_type] for h in self.heads)
        return f" {names} {ggml_opt_optimizer_name(self.optimizer)} period={self.opt_period}"


class _Running:
    """What ``OptContext.running`` returns: marks the context (and what it needs) in use by a loop."""

    def __init__(self, opt: OptContext, what: str) -> None:
        self.opt, self.what = opt, what
        self._using: Any = None

    def __enter__(self) -> OptContext:
        self.opt.refuse_if_running(self.what)
        self._using = using(self.opt.keepers, self.what)
        self._using.__enter__()
        self.opt._running = self.what
        return self.opt

    def __exit__(self, *exc: Any) -> None:
        self.opt._running = None
        self._using.__exit__(*exc)


class _DynamicStep:
    """One step of a dynamic opt context: its graph tensors (labels, loss, predictions) are valid until the
    next ggml_opt_alloc, which ends it."""
    kind = "step of a dynamic opt context (ggml_opt_alloc made new labels, loss and predictions since)"

    def __init__(self) -> None:
        self.alive = True


@contextlib.contextmanager
def _graph_nodes(outputs: Tensor, size: int, backward: bool, side_outputs: Sequence[Tensor] = ()) -> Any:
    """The nodes of the graph ggml-opt will run for ``outputs`` (and its extra outputs), built in a scratch
    context: the forward pass, and with ``backward`` the gradient ops ggml adds for a loss on them (ggml-opt's
    own graphs are not reachable; the backward ops of the model are the same whatever the loss). Valid inside
    the block."""
    size = 4 * size + 64 if backward else size
    scratch = ggml_init(ggml_graph_overhead(size, backward) + (3 * size + 16) * ggml_tensor_overhead() + 4096,
                        no_alloc=True)
    try:
        graph = lib.ggml_new_graph_custom(scratch.ptr, size, backward)
        root = outputs.ptr
        if backward:
            root = lib.ggml_sum(scratch.ptr, root)  # a scalar F32 loss (the outputs are F32: checked before)
            lib.ggml_set_loss(root)
        lib.ggml_build_forward_expand(graph, root)
        for t in side_outputs:
            lib.ggml_build_forward_expand(graph, t.ptr)
        if backward:
            lib.ggml_build_backward_expand(scratch.ptr, graph, ffi.NULL)
        yield [lib.ggml_graph_node(graph, i) for i in range(lib.ggml_graph_n_nodes(graph))]
    finally:
        scratch.free()


def _heads_from(outputs: Any, loss_types: Any, loss_weights: Any = None, sample_weighted: bool = False) \
        -> list[L.Head]:
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    types = list(loss_types) if isinstance(loss_types, (list, tuple)) else [loss_types] * len(outs)
    weights = [1.0] * len(outs) if loss_weights is None else list(loss_weights) \
        if isinstance(loss_weights, (list, tuple, np.ndarray)) else [loss_weights]
    if not outs:
        raise GgmlValueError("outputs: expected at least one output tensor")
    if len(types) != len(outs) or len(weights) != len(outs):
        raise GgmlValueError(f"expected one loss type and one loss weight per output head ({len(outs)}), got "
                             f"{len(types)} loss types and {len(weights)} weights")
    heads = []
    for i, (o, t, w) in enumerate(zip(outs, types, weights)):
        o = as_tensor(o, f"outputs[{i}]")
        L.check_loss_type(t, f"loss_types[{i}]")
        if not is_real(w) or not math.isfinite(w) or w < 0:
            raise GgmlValueError(f"loss_weights[{i}] must be a finite number >= 0, got {w!r}")
        heads.append(L.Head(int(t), o, float(w), sample_weighted=sample_weighted))
    return heads


def _check_static(sched: Scheduler, ctx_compute: Any, inputs: Any, outputs: Any) -> None:
    if ctx_compute is None:
        if inputs is not None or outputs is not None:
            raise GgmlValueError("ctx_compute, inputs and outputs go together: pass all three (static graphs) or "
                                 "none (dynamic graphs with ggml_opt_prepare_alloc)")
        return
    unwrap(ctx_compute, Context, "ctx_compute")
    t = input_leaf("ggml_opt_init", as_tensor(inputs, "inputs"), "inputs")
    if t.ptr.data == ffi.NULL:
        raise GgmlStateError("inputs must be allocated before the opt context is built: allocate its context "
                             "with ggml_backend_alloc_ctx_tensors")
    for other in list(sched._opt_users):
        if other.alive:
            raise GgmlStateError("this scheduler already serves a live opt context with static graphs; ggml-opt "
                                 "contexts must not share a scheduler (one would silently stop training). "
                                 "Free the other context or create another scheduler")


class OptParams:
    """ggml's ``struct ggml_opt_params`` (``ggml_opt_default_params``), to fill in and pass to ``ggml_opt_init``.

    Public fields, as in C: ``sched``, ``loss_type``, ``build_type``, ``opt_period``, ``optimizer``,
    ``ctx_compute``, ``inputs``, ``outputs``, ``get_opt_pars``, ``get_opt_pars_ud``, plus ``opt_pars``: the
    optimizer hyper-parameters used when ``get_opt_pars`` is None (an OptimizerParams; ``params.adamw`` and
    ``params.sgd`` are shortcuts to its fields). ggmlR's list form works too: ``params["loss_type"]``,
    ``params["build_type"]``, ``params["opt_period"]``, ``params["optimizer"]``.
    """
    _KEYS = ("loss_type", "build_type", "opt_period", "optimizer")

    def __init__(self, sched: Any, loss_type: int) -> None:
        self.sched = sched
        self.loss_type = loss_type
        self.build_type = BUILD_OPT
        self.opt_period = 1
        self.optimizer = OPTIMIZER_ADAMW
        self.ctx_compute: Context | None = None
        self.inputs: Tensor | None = None
        self.outputs: Tensor | None = None
        self.opt_pars = OptimizerParams()
        self.get_opt_pars: Any = None
        self.get_opt_pars_ud: Any = None

    @property
    def adamw(self) -> _AdamW:
        return self.opt_pars.adamw

    @property
    def sgd(self) -> _SGD:
        return self.opt_pars.sgd

    def __getitem__(self, key: str) -> Any:
        if key not in self._KEYS and key not in ("ctx_compute", "inputs", "outputs", "opt_pars", "get_opt_pars",
                                                 "get_opt_pars_ud", "sched"):
            raise KeyError(key)
        return getattr(self, key)

    def keys(self) -> tuple:
        return self._KEYS

    def as_dict(self) -> dict:
        """ggmlR's list: ``{"loss_type", "build_type", "opt_period", "optimizer"}``."""
        return {k: getattr(self, k) for k in self._KEYS}

    def __repr__(self) -> str:
        return (f"<OptParams loss_type={self.loss_type} build_type={self.build_type} opt_period={self.opt_period} "
                f"optimizer={self.optimizer} {self.opt_pars.adamw!r} {self.opt_pars.sgd!r}"
                f"{' get_opt_pars=' + getattr(self.get_opt_pars, '__name__', '?') if self.get_opt_pars else ''}>")


def ggml_opt_default_params(sched: Scheduler, loss_type: int) -> OptParams:
    """ggml's default parameters of an opt context, to adjust and pass to ``ggml_opt_init(params)``.

    The fields are ggml's (see OptParams): build type OPT, ``opt_period`` 1, optimizer AdamW, no
    ``ctx_compute``/``inputs``/``outputs`` (dynamic graphs until set), and ggml's default optimizer
    hyper-parameters in ``opt_pars``, changed through public, checked fields (``params.adamw.alpha``,
    ``.beta1``, ``.beta2``, ``.eps``, ``.wd``; ``params.sgd.alpha``, ``.wd``). Instead of constants,
    ``get_opt_pars`` may be a function ``f(get_opt_pars_ud)`` returning the parameters (an
    OptimizerParams or a dict ``{"adamw": {...}, "sgd": {...}}``) before every optimizer step, as ggml's
    callback. ggmlR returns the list ``loss_type, build_type, opt_period, optimizer``: index the object
    with those names (``params["opt_period"]``) or call ``params.as_dict()``.

    Arguments:
        sched: the Scheduler the context will run on.
        loss_type: a loss type constant (``ggml_opt_loss_type_mse()``, ...).

    Value: an OptParams.

    Example:
        >>> params = ggml_opt_default_params(sched, ggml_opt_loss_type_mse())
        >>> params.ctx_compute, params.inputs, params.outputs = ctx, x, out
        >>> params.adamw.alpha = 0.01; params.adamw.beta1 = 0.5
        >>> opt_ctx = ggml_opt_init(params)
    """
    unwrap(sched, Scheduler, "ggml_opt_default_params(sched)")
    L.check_loss_type(loss_type, "ggml_opt_default_params(loss_type)")
    return OptParams(sched, int(loss_type))


def ggml_opt_init(sched: Scheduler | OptParams, loss_type: int | None = None, optimizer: int = OPTIMIZER_ADAMW,
                  opt_period: int = 1, ctx_compute: Context | None = None, inputs: Tensor | None = None,
                  outputs: Tensor | None = None, build_type: int = BUILD_OPT) -> OptContext:
    """An optimization context: the forward, backward and optimizer graphs for training a model.

    The low-level training API (ggml-opt): per batch, write the inputs and labels, then call
    ``ggml_opt_alloc`` and ``ggml_opt_eval``. The fit functions do all of this for you. With
    ``ctx_compute``, ``inputs`` and ``outputs`` the graphs are built once (static graphs, the usual
    case); without them the graph is supplied before every ``ggml_opt_alloc`` with
    ``ggml_opt_prepare_alloc`` (dynamic graphs, ggml's own losses only). The context uses ggml's
    default optimizer parameters (AdamW lr 1e-3); ``ggml_opt_init_for_fit`` returns a handle to change
    the learning rate. The model is checked first: no trainable tensor, ops without a backward pass,
    a scheduler too small or already serving another static opt context raise before ggml is called.

    ggml's own form ``ggml_opt_init(params)`` takes an OptParams from ``ggml_opt_default_params`` instead
    (every setting, the optimizer hyper-parameters and a ``get_opt_pars`` callback included, comes from its
    fields; the other arguments must then be left out). The context reads ``params.opt_pars`` at every
    optimizer step, so changing its fields later changes the following steps.

    Arguments:
        sched: the Scheduler the graphs run on (``ggml_backend_sched_new``), or an OptParams (ggml's form).
        loss_type: a loss type constant (``ggml_opt_loss_type_mse()``, ``..._cross_entropy()`` (logits),
            ...); with several outputs, a list of them, one per output. Required unless ``sched`` is an
            OptParams.
        optimizer: ``ggml_opt_optimizer_type_adamw()`` (the default) or ``..._sgd()``.
        opt_period: gradient accumulation: the optimizer steps once every ``opt_period`` evals
            (default 1: every batch).
        ctx_compute: the Context holding the model graph (default None: dynamic graphs).
        inputs: the input Tensor of the model, already allocated (default None).
        outputs: the output Tensor the loss is computed from (default None); a list for several heads.
        build_type: ``ggml_opt_build_type_opt()`` (the default: train) or ``..._forward()`` (evaluate
            only); ``..._grad()`` is refused.

    Value: an OptContext handle (a context manager; freed with ``ggml_opt_free``). Its labels tensor
    (``ggml_opt_labels``) receives the labels of each batch.

    Example:
        >>> opt = ggml_opt_init(sched, ggml_opt_loss_type_cross_entropy(), ctx_compute=ctx, inputs=x,
        ...                     outputs=logits)
        >>> ggml_backend_tensor_set_data(x, xb); ggml_backend_tensor_set_data(ggml_opt_labels(opt), yb)
        >>> ggml_opt_alloc(opt, True); ggml_opt_eval(opt, res)
    """
    if isinstance(sched, OptParams):
        p = sched
        given = [name for name, value, default in (
            ("loss_type", loss_type, None), ("optimizer", optimizer, OPTIMIZER_ADAMW), ("opt_period", opt_period, 1),
            ("ctx_compute", ctx_compute, None), ("inputs", inputs, None), ("outputs", outputs, None),
            ("build_type", build_type, BUILD_OPT)) if value is not default and value != default]
        if given:
            raise GgmlValueError(f"ggml_opt_init: with an OptParams, every setting comes from its fields; set "
                                 f"params.{given[0]} instead of passing {', '.join(given)}")
        if p.get_opt_pars is not None and not callable(p.get_opt_pars):
            raise GgmlTypeError(f"ggml_opt_init: params.get_opt_pars must be None or a function "
                                f"f(get_opt_pars_ud) returning the optimizer parameters, got {p.get_opt_pars!r}")
        if not isinstance(p.opt_pars, OptimizerParams):
            raise GgmlTypeError("ggml_opt_init: params.opt_pars must be an OptimizerParams "
                                f"(ggml_opt_get_default_optimizer_params()), got {p.opt_pars!r}")
        lr_ud = LrUserdata(params=p.opt_pars._c)
        if p.get_opt_pars is not None:
            fn, ud = p.get_opt_pars, p.get_opt_pars_ud
            lr_ud.provider = lambda: fn(ud)
        opt = _opt_init(p.sched, p.loss_type, p.optimizer, p.opt_period, p.ctx_compute, p.inputs, p.outputs,
                        p.build_type, lr_ud)
        opt._opt_pars_owner = p.opt_pars  # the struct ggml reads lives as long as the context
        return opt
    if loss_type is None:
        raise GgmlTypeError("ggml_opt_init: loss_type is required (or pass an OptParams from "
                            "ggml_opt_default_params as the only argument)")
    return _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type)


def _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type=BUILD_OPT,
              lr_ud=None, loss_mask_ne0=None, loss_weights=None, sample_weighted=False,
              extra_outputs=()) -> OptContext:
    unwrap(sched, Scheduler, "sched")
    check_optimizer(optimizer)
    expect(isinstance(opt_period, int) and not isinstance(opt_period, bool) and 1 <= opt_period < 1 << 31,
           f"opt_period must be an int in [1, 2**31 - 1], got {opt_period!r}")
    if build_type not in (BUILD_FORWARD, BUILD_OPT):
        raise GgmlValueError("build_type must be ggml_opt_build_type_forward() or ggml_opt_build_type_opt(); "
                             "ggml's GRAD build type aborts in ggml_opt_init")
    def busy(other: str) -> str:
        return (f"this scheduler is in use by {other} (in this thread or another); build the opt context after "
                "that call has returned, or on another scheduler")
    # "serves no opt context" and building one are one step: two threads cannot both pass; and no other call may
    # run the scheduler meanwhile (marked exclusively: a compute on it is refused until the build is done)
    with sched.opt_lock, using([sched], "ggml_opt_init", exclusive=[sched], busy=busy):
        return _opt_init_locked(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type,
                                lr_ud, loss_mask_ne0, loss_weights, sample_weighted, extra_outputs)


def _opt_init_locked(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type, lr_ud,
                     loss_mask_ne0, loss_weights, sample_weighted, extra_outputs) -> OptContext:
    _check_static(sched, ctx_compute, inputs, outputs)
    if ctx_compute is None:
        types = loss_type if isinstance(loss_type, (list, tuple)) else [loss_type]
        for t in types:
            L.check_loss_type(t)
            if t not in L.BUILTIN_LOSSES or len(types) > 1:
                raise GgmlValueError("dynamic graphs support ggml's own losses (mean, sum, cross_entropy, mse) "
                                     "with one head; pass ctx_compute/inputs/outputs for the others")
        heads = [L.Head(int(types[0]), None)]  # type: ignore[arg-type]
    else:
        heads = _heads_from(outputs, loss_type, loss_weights, sample_weighted)
        to_ggml = len(heads) == 1 and heads[0].loss_type in L.BUILTIN_LOSSES and heads[0].weight == 1.0 \
            and not sample_weighted
        check_opt_heads(heads, "ggml_opt_init", to_ggml)
    if loss_mask_ne0 is not None:
        expect(isinstance(loss_mask_ne0, int) and loss_mask_ne0 >= 0,
               f"loss_mask_ne0 must be None or an int >= 0, got {loss_mask_ne0!r}")
    return OptContext(sched, heads, optimizer, opt_period, ctx_compute, inputs, build_type, lr_ud,
                      loss_mask_ne0 or None, extra_outputs)


def ggml_opt_init_for_fit(sched: Scheduler, loss_type: int, optimizer: int = OPTIMIZER_ADAMW, opt_period: int = 1,
                          ctx_compute: Context | None = None, inputs: Tensor | None = None,
                          outputs: Tensor | None = None, loss_mask_ne0: int | None = None,
                          weight_decay: float = 0.0) -> dict:
    """An opt context plus the handle that changes its learning rate: what a training loop needs.

    Like ``ggml_opt_init`` (build type OPT), with the learning rate and weight decay held in ``lr_ud``
    so that ``ggml_opt_set_lr``/``ggml_opt_get_lr`` and LR schedules can change them between steps.

    Arguments:
        sched: the Scheduler the graphs run on.
        loss_type: a loss type constant, e.g. ``ggml_opt_loss_type_mse()``; cross-entropy takes logits,
            binary cross-entropy probabilities.
        optimizer: ``ggml_opt_optimizer_type_adamw()`` (the default) or ``..._sgd()``.
        opt_period: the optimizer steps once every ``opt_period`` evals (default 1).
        ctx_compute: the Context holding the model graph (default None: dynamic graphs).
        inputs: the allocated input Tensor (default None).
        outputs: the output Tensor (default None).
        loss_mask_ne0: for weighted MSE, the width of each weight row: None or 1 (one weight per
            sample) or the outputs' ne[0] (one per element). Default None.
        weight_decay: decoupled weight decay in [0, 1] applied at every optimizer step (default 0: off).

    Value: a dict ``{"opt_ctx": OptContext, "lr_ud": LrUserdata}``.

    Example:
        >>> fit = ggml_opt_init_for_fit(sched, ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x,
        ...                             outputs=out, weight_decay=0.01)
        >>> ggml_opt_set_lr(fit["lr_ud"], adamw_lr=3e-4)
    """
    lr_ud = LrUserdata(check_weight_decay(weight_decay))
    opt = _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, BUILD_OPT, lr_ud,
                    loss_mask_ne0)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def ggml_opt_init_for_fit_multi(sched: Scheduler, loss_types: Sequence[int], loss_weights: Sequence[float] | None,
                                labels_offs: Sequence[int] | None = None, optimizer: int = OPTIMIZER_ADAMW,
                                opt_period: int = 1, ctx_compute: Context | None = None,
                                inputs: Tensor | None = None, outputs: Sequence[Tensor] | None = None,
                                weight_decay: float = 0.0) -> dict:
    """An opt context for several output heads: total loss = sum_i loss_weights[i] * loss_i.

    Each head has its own loss type and weight; every head's loss is a mean over its output elements
    (cross-entropy on logits as usual). The heads' labels sit side by side in one label row per
    sample; ``labels_offs`` says where each head's columns start. Static graphs only.

    Arguments:
        sched: the Scheduler the graphs run on.
        loss_types: one loss type constant per head.
        loss_weights: one weight (a finite number >= 0) per head, or None for all 1.
        labels_offs: the 0-based column where each head's labels start, or None (the default: heads
            back to back in the order of ``outputs``).
        optimizer: ``ggml_opt_optimizer_type_adamw()`` (the default) or ``..._sgd()``.
        opt_period: the optimizer steps once every ``opt_period`` evals (default 1).
        ctx_compute: the Context holding the model graph (required).
        inputs: the allocated input Tensor (required).
        outputs: the list of output Tensors, one per head (all with the same batch size).
        weight_decay: decoupled weight decay in [0, 1] (default 0: off).

    Value: a dict ``{"opt_ctx": OptContext, "lr_ud": LrUserdata}``. Raises GgmlValueError without
    ``ctx_compute`` or when the counts of heads, types and weights differ.

    Example:
        >>> fit = ggml_opt_init_for_fit_multi(sched, [ggml_opt_loss_type_cross_entropy(),
        ...     ggml_opt_loss_type_mse()], [1.0, 0.5], ctx_compute=ctx, inputs=x, outputs=[logits, box])
    """
    if ctx_compute is None:
        raise GgmlValueError("ggml_opt_init_for_fit_multi needs static graphs: pass ctx_compute, inputs, outputs")
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    weights = [1.0] * len(outs) if loss_weights is None else loss_weights
    lr_ud = LrUserdata(check_weight_decay(weight_decay))
    types = list_arg("ggml_opt_init_for_fit_multi", "loss_types", loss_types, "loss types, one per head")
    opt = _opt_init(sched, types, optimizer, opt_period, ctx_compute, inputs, outs, BUILD_OPT, lr_ud,
                    None, weights)
    opt.labels_offs = resolve_labels_offs(opt.heads, labels_offs)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def resolve_labels_offs(heads: list[L.Head], labels_offs: Sequence[int] | None) -> list[int]:
    widths = [h.outputs.nelements() // L.physical_batch(h.outputs) for h in heads]
    if labels_offs is None:
        return [int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]])]
    offs = list_arg("ggml_opt_init_for_fit_multi", "labels_offs", labels_offs, "ints, one per head")
    if len(offs) != len(heads) or any(isinstance(o, bool) or not isinstance(o, (int, np.integer)) or o < 0
                                      for o in offs):
        raise GgmlValueError(f"labels_offs must hold one int >= 0 per head ({len(heads)}), got {labels_offs!r}")
    return [int(o) for o in offs]


def _opt(opt_ctx: Any, fn: str) -> Any:
    return unwrap(opt_ctx, OptContext, f"{fn}(opt_ctx)")


def ggml_opt_free(opt_ctx: OptContext) -> None:
    """Free an opt context, its graphs and optimizer state (the model's own tensors stay).

    Idempotent; using the context afterwards raises GgmlStateError. The scheduler can then serve a new
    opt context.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: None.

    Example:
        >>> ggml_opt_free(opt_ctx)
    """
    free_handle(opt_ctx, OptContext, "ggml_opt_free(opt_ctx)")


def ggml_opt_reset(opt_ctx: OptContext, optimizer: bool = False) -> None:
    """Zero the accumulated gradients and the loss; optionally also reset the optimizer.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        optimizer: False (the default) keeps the optimizer state; True also zeroes AdamW's moments and
            its step count (a fresh start with the current weights).

    Value: None.

    Example:
        >>> ggml_opt_reset(opt_ctx, True)
    """
    ptr = _opt(opt_ctx, "ggml_opt_reset")
    opt_ctx.refuse_if_running("ggml_opt_reset")
    with using(opt_ctx.keepers, "ggml_opt_reset"):
        lib.ggml_opt_reset(ptr, bool(optimizer))


def ggml_opt_static_graphs(opt_ctx: OptContext) -> bool:
    """Whether an opt context was built with static graphs (``ctx_compute``/``inputs``/``outputs`` given).

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: a bool; False for dynamic graphs (``ggml_opt_prepare_alloc`` before each alloc).

    Example:
        >>> ggml_opt_static_graphs(opt_ctx)
        True
    """
    return bool(lib.ggml_opt_static_graphs(_opt(opt_ctx, "ggml_opt_static_graphs")))


def ggml_opt_context_optimizer_type(opt_ctx: OptContext) -> int:
    """The optimizer type an opt context was built with.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: an int, ``ggml_opt_optimizer_type_adamw()`` or ``ggml_opt_optimizer_type_sgd()``.

    Example:
        >>> ggml_opt_optimizer_name(ggml_opt_context_optimizer_type(opt_ctx))
    """
    return int(lib.ggml_opt_context_optimizer_type(_opt(opt_ctx, "ggml_opt_context_optimizer_type")))


def ggml_opt_inputs(opt_ctx: OptContext) -> Tensor | None:
    """The input tensor of an opt context: write each batch's data into it.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: a Tensor (for dynamic graphs the one given to the last ``ggml_opt_prepare_alloc``), or None.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_inputs(opt_ctx), xb)
    """
    ptr = lib.ggml_opt_inputs(_opt(opt_ctx, "ggml_opt_inputs"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_outputs(opt_ctx: OptContext) -> Tensor | None:
    """The output tensor of an opt context (of its first head): the tensor the model computes.

    With dynamic graphs (``ggml_opt_prepare_alloc``) it holds the predictions after an eval. With static
    graphs (the usual case) ggml evaluates copies of the graph, so this tensor has no memory of its own and
    reading it raises GgmlStateError: read the predictions from an OptResult instead
    (``ggml_opt_result_pred``), or the predicted classes of a cross-entropy context (``ggml_opt_pred``).

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: a Tensor, or None (a dynamic context before its first ``ggml_opt_prepare_alloc``).

    Example:
        >>> ggml_opt_outputs(opt_ctx).shape
    """
    _opt(opt_ctx, "ggml_opt_outputs")
    if opt_ctx.static:
        return opt_ctx.heads[0].outputs
    return opt_ctx.step_tensor(lib.ggml_opt_outputs(opt_ctx.ptr))


def ggml_opt_labels(opt_ctx: OptContext) -> Tensor | None:
    """The labels tensor of an opt context (of its first head): write each batch's labels into it.

    It has the outputs' layout. Loss types without labels (mean, sum) have none.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: a Tensor, or None.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_labels(opt_ctx), yb)
    """
    _opt(opt_ctx, "ggml_opt_labels")
    return opt_ctx.labels(0)


def ggml_opt_loss(opt_ctx: OptContext) -> Tensor | None:
    """The scalar loss tensor ggml-opt minimises; read it after ``ggml_opt_eval``.

    For ggmlpy-built losses (MAE, Huber, BCE, weighted MSE) and multi-head contexts it holds the
    weighted total. With ``opt_period > 1`` ggml scales per-datapoint losses by ``1/opt_period``.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: an F32 Tensor with one element, or None (a dynamic context before its first alloc).

    Example:
        >>> float(ggml_backend_tensor_get_data(ggml_opt_loss(opt_ctx))[0])
    """
    ptr = lib.ggml_opt_loss(_opt(opt_ctx, "ggml_opt_loss"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_pred(opt_ctx: OptContext) -> Tensor | None:
    """The predicted classes of the last batch (argmax of the outputs), for cross-entropy contexts.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: an I32 Tensor ``[batch]``, or None for other loss types and multi-head contexts.

    Example:
        >>> ggml_backend_tensor_get_data(ggml_opt_pred(opt_ctx))
    """
    ptr = lib.ggml_opt_pred(_opt(opt_ctx, "ggml_opt_pred"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_ncorrect(opt_ctx: OptContext) -> Tensor | None:
    """The number of correct predictions in the last batch, for a single cross-entropy head.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: an I64 Tensor with one element, or None for other loss types (see ``ggml_opt_ncorrect_i``
    for multi-head contexts).

    Example:
        >>> int(ggml_backend_tensor_get_data(ggml_opt_ncorrect(opt_ctx))[0])
    """
    ptr = lib.ggml_opt_ncorrect(_opt(opt_ctx, "ggml_opt_ncorrect"))  # checked before opt_ctx.tensor is looked up
    return opt_ctx.step_tensor(ptr)


def ggml_opt_grad_acc(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
    """The gradient accumulator of a node of the forward graph (typically a parameter).

    Gradients of the ``opt_period`` batches of one logical batch are summed here before the optimizer
    step. For dynamic graphs it is only valid between ``ggml_opt_alloc`` and ``ggml_opt_eval`` (else
    GgmlStateError).

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        node: a Tensor of the model, e.g. a weight marked with ``ggml_set_param``.

    Value: a Tensor of node's shape, or None when the node has no gradient.

    Example:
        >>> g = ggml_backend_tensor_get_data(ggml_opt_grad_acc(opt_ctx, w))
    """
    ptr = _opt(opt_ctx, "ggml_opt_grad_acc")
    if not opt_ctx.static and opt_ctx._pending is None:
        raise GgmlStateError("dynamic graphs: ggml_opt_grad_acc is only valid between ggml_opt_alloc and ggml_opt_eval")
    return opt_ctx.tensor(lib.ggml_opt_grad_acc(ptr, as_tensor(node, "ggml_opt_grad_acc(node)").ptr))


def _head(opt_ctx: OptContext, ihead: int, fn: str) -> L.Head:
    _opt(opt_ctx, fn)
    n = opt_ctx.n_heads
    if isinstance(ihead, bool) or not isinstance(ihead, int) or not 1 <= ihead <= n:
        raise GgmlValueError(f"{fn}: ihead must be an int in [1, {n}] (1-based), got {ihead!r}")
    return opt_ctx.heads[ihead - 1]


def ggml_opt_n_loss(opt_ctx: OptContext) -> int:
    """The number of output heads (losses) of an opt context: 1 unless built with ``..._multi``.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).

    Value: an int >= 1.

    Example:
        >>> [ggml_opt_loss_i(opt_ctx, i) for i in range(1, ggml_opt_n_loss(opt_ctx) + 1)]
    """
    _opt(opt_ctx, "ggml_opt_n_loss")
    return opt_ctx.n_heads


def ggml_opt_outputs_i(opt_ctx: OptContext, ihead: int) -> Tensor:
    """The output tensor of head ``ihead`` (1-based).

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        ihead: the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).

    Value: a Tensor.

    Example:
        >>> ggml_opt_outputs_i(opt_ctx, 2)
    """
    return _head(opt_ctx, ihead, "ggml_opt_outputs_i").outputs


def ggml_opt_labels_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The labels tensor of head ``ihead`` (1-based): write that head's labels of each batch into it.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        ihead: the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).

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
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        ihead: the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).

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
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        ihead: the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).

    Value: a Tensor, or None when the head takes no weights.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_loss_weights_i(opt_ctx, 1), w)
    """
    return _head(opt_ctx, ihead, "ggml_opt_loss_weights_i").weights


def ggml_opt_ncorrect_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """The number of correct predictions of head ``ihead`` (1-based) in the last batch.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        ihead: the head number, **1-based**, in ``[1, ggml_opt_n_loss(opt_ctx)]`` (else GgmlValueError).

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
    ptr = _opt(opt_ctx, "ggml_opt_prepare_alloc")
    opt_ctx.refuse_if_running("ggml_opt_prepare_alloc")
    if opt_ctx.static:
        raise GgmlStateError("ggml_opt_prepare_alloc is for dynamic graphs; this context has static graphs")
    if opt_ctx._pending is not None:
        raise GgmlStateError("an allocation is pending: call ggml_opt_eval first")
    c = unwrap(ctx_compute, Context, "ggml_opt_prepare_alloc(ctx_compute)")
    if not isinstance(graph, Graph):
        raise_type("ggml_opt_prepare_alloc(graph)", "Graph", graph)
    i, o = input_leaf("ggml_opt_prepare_alloc", as_tensor(inputs, "inputs"), "inputs"), as_tensor(outputs, "outputs")
    check_opt_heads([L.Head(opt_ctx.heads[0].loss_type, o)], "ggml_opt_prepare_alloc", True)
    if opt_ctx.build_type != BUILD_FORWARD:
        check_trainable([o], accumulating=True)  # dynamic graphs always accumulate
    # ggml-opt adds its loss, the backward and optimizer tensors and two copies of the graph (with gradients)
    # to ctx_compute; without room it got NULL back and crashed
    graphs = 2 * int(lib.ggml_graph_overhead_custom(lib.ggml_graph_size(graph.ptr), True))
    ctx_compute.reserve(0, n_objects=16 + 5 * graph.n_nodes(), graph_bytes=graphs,
                        what="set of ggml-opt's loss, backward and optimizer graphs")
    _check_param_layout(opt_ctx, graph)
    lib.ggml_opt_prepare_alloc(ptr, c, graph.ptr, i.ptr, o.ptr)
    opt_ctx.heads[0].outputs = o
    opt_ctx._step_ctx = ctx_compute
    opt_ctx._prepared = True


def _check_param_layout(opt_ctx: OptContext, graph: Graph) -> None:
    """ggml-opt makes a dynamic context's gradient accumulators and moments once, for the parameters of the
    first graph, and pairs them with later graphs by node position: a later graph must have its parameters at
    the same positions with the same shapes (ggml aborted on another shape, and would pair the wrong ones)."""
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    nodes = [lib.ggml_graph_node(graph.ptr, k) for k in range(graph.n_nodes())]
    layout = [(k, tuple(int(n) for n in t.ne)) for k, t in enumerate(nodes) if t.flags & flag]
    first = opt_ctx._param_layout
    if first is None:
        opt_ctx._param_layout = layout
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
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        backward: True (the default) to train on the batch (backward pass and, every ``opt_period``
            evals, an optimizer step); False to only evaluate it.

    Value: None.

    Example:
        >>> ggml_opt_alloc(opt_ctx, True)
        >>> ggml_backend_tensor_set_data(ggml_opt_inputs(opt_ctx), xb)
        >>> ggml_opt_eval(opt_ctx, res)
    """
    _opt(opt_ctx, "ggml_opt_alloc")
    opt_ctx.refuse_if_running("ggml_opt_alloc")
    opt_ctx.alloc(bool(backward))


def ggml_opt_eval(opt_ctx: OptContext, result: OptResult | None = None) -> None:
    """Evaluate the allocated graph on the current batch: forward pass, then backward and step if allocated.

    Needs a preceding ``ggml_opt_alloc`` (else GgmlStateError). Row indices of ``ggml_get_rows``
    inputs and the optimizer parameters are checked first (ggml would abort). While a loop runs the
    context (``ggml_opt_epoch``, ``ggml_opt_fit``), this raises GgmlInUseError: the loop evaluates it.

    Arguments:
        opt_ctx: an opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        result: an OptResult to add this batch's loss, predictions and correct count to, or None (the
            default) to record nothing.

    Value: None; read ``ggml_opt_loss``/``ggml_opt_outputs`` or the result afterwards.

    Example:
        >>> ggml_opt_alloc(opt_ctx, False); ggml_opt_eval(opt_ctx, val_res)
    """
    _opt(opt_ctx, "ggml_opt_eval")
    opt_ctx.refuse_if_running("ggml_opt_eval")
    opt_ctx.eval(result)
