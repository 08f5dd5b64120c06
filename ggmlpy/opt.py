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

import math
from typing import Any, Sequence

import numpy as np

from . import losses as L
from ._checks import check_backward_nodes, check_index_inputs, index_inputs
from ._ffi import ffi, lib
from ._handle import Handle, free_handle, raise_type, unwrap
from .context import Context, Graph, Tensor, as_tensor, ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from .errors import GgmlStateError, GgmlTypeError, GgmlValueError, expect
from .opt_result import OptResult
from .sched import Scheduler, sched_hash_size

OPTIMIZER_ADAMW = int(lib.GGML_OPT_OPTIMIZER_TYPE_ADAMW)
OPTIMIZER_SGD = int(lib.GGML_OPT_OPTIMIZER_TYPE_SGD)
BUILD_FORWARD = int(lib.GGML_OPT_BUILD_TYPE_FORWARD)
BUILD_GRAD = int(lib.GGML_OPT_BUILD_TYPE_GRAD)
BUILD_OPT = int(lib.GGML_OPT_BUILD_TYPE_OPT)
STATIC_GRAPH_NODES = int(lib.GGML_DEFAULT_GRAPH_SIZE)
LR_FLOOR = 1e-12  # ggml aborts on lr <= 0, so schedules are clamped here


def ggml_opt_optimizer_type_adamw() -> int: return OPTIMIZER_ADAMW
def ggml_opt_optimizer_type_sgd() -> int: return OPTIMIZER_SGD
def ggml_opt_build_type_forward() -> int: return BUILD_FORWARD
def ggml_opt_build_type_grad() -> int: return BUILD_GRAD
def ggml_opt_build_type_opt() -> int: return BUILD_OPT


def check_optimizer(optimizer: Any) -> int:
    if isinstance(optimizer, bool) or optimizer not in (OPTIMIZER_ADAMW, OPTIMIZER_SGD):
        raise GgmlValueError("optimizer: expected ggml_opt_optimizer_type_adamw() or "
                             f"ggml_opt_optimizer_type_sgd(), got {optimizer!r}")
    return int(optimizer)


def ggml_opt_optimizer_name(optimizer_type: int) -> str:
    return ffi.string(lib.ggml_opt_optimizer_name(check_optimizer(optimizer_type))).decode()


# ---------------------------------------------------------------- learning-rate userdata

class LrUserdata:
    """The optimizer parameters a context reads at each optimizer step; mutate to schedule the LR."""

    def __init__(self, weight_decay: float = 0.0) -> None:
        self.params = ffi.new("struct ggml_opt_optimizer_params *")
        self.params[0] = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
        check_weight_decay(weight_decay)
        self.params.adamw.wd = weight_decay
        self.params.sgd.wd = weight_decay

    def get(self) -> dict:
        return {"adamw": float(self.params.adamw.alpha), "sgd": float(self.params.sgd.alpha)}

    def set(self, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
        for name, value in (("adamw_lr", adamw_lr), ("sgd_lr", sgd_lr)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise GgmlValueError(f"ggml_opt_set_lr: {name} must be a finite number >= 0, got {value!r}")
        if adamw_lr is not None:
            self.params.adamw.alpha = max(float(adamw_lr), LR_FLOOR)
        if sgd_lr is not None:
            self.params.sgd.alpha = max(float(sgd_lr), LR_FLOOR)

    def validate(self) -> None:
        """The conditions ggml_opt_eval asserts, checked before the step."""
        p = self.params
        problems = []
        if not p.adamw.alpha > 0 or not p.sgd.alpha > 0:
            problems.append(f"learning rates must be > 0 (adamw {p.adamw.alpha}, sgd {p.sgd.alpha})")
        if not (0 <= p.adamw.beta1 <= 1 and 0 <= p.adamw.beta2 <= 1):
            problems.append(f"betas must be in [0, 1] (got {p.adamw.beta1}, {p.adamw.beta2})")
        if not p.adamw.eps >= 0:
            problems.append(f"eps must be >= 0 (got {p.adamw.eps})")
        if not (0 <= p.adamw.wd <= 1 and 0 <= p.sgd.wd <= 1):
            problems.append(f"weight decay must be in [0, 1] (got {p.adamw.wd}, {p.sgd.wd})")
        if problems:
            raise GgmlValueError("invalid optimizer parameters: " + "; ".join(problems))

    def __repr__(self) -> str:
        return f"<LrUserdata adamw={self.params.adamw.alpha:g} sgd={self.params.sgd.alpha:g}>"


def check_weight_decay(weight_decay: Any) -> float:
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not 0 <= weight_decay <= 1:
        raise GgmlValueError(f"weight_decay must be a number in [0, 1], got {weight_decay!r}")
    return float(weight_decay)


def ggml_opt_set_lr(lr_ud: LrUserdata, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_set_lr(lr_ud)", "LrUserdata", lr_ud)
    lr_ud.set(adamw_lr, sgd_lr)


def ggml_opt_get_lr(lr_ud: LrUserdata) -> dict:
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_get_lr(lr_ud)", "LrUserdata", lr_ud)
    return lr_ud.get()


# ---------------------------------------------------------------- opt context

def _count_forward(outputs: Sequence[Tensor], with_leafs: bool = False) -> Any:
    """Forward nodes reachable from the outputs, and the trainable leafs among them (and the other leafs)."""
    seen, params, stack, n_nodes, n_leafs = set(), [], [o.ptr for o in outputs], 0, 0
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    while stack:
        t = stack.pop()
        key = int(ffi.cast("uintptr_t", t))
        if key in seen:
            continue
        seen.add(key)
        if t.flags & flag:
            params.append(t)
        if t.op != lib.GGML_OP_NONE or t.flags & flag:
            n_nodes += 1
        else:
            n_leafs += 1
        stack.extend(s for s in t.src if s != ffi.NULL)
    return (n_nodes, params, n_leafs) if with_leafs else (n_nodes, params)


def training_graph_nodes(outputs: Tensor, build_type: int = BUILD_OPT) -> int:
    """An upper bound on the nodes and leafs of the graphs ggml-opt builds from ``outputs``: the backward
    pass adds at most ~3 nodes per forward op, each parameter a gradient accumulator, two moments and an
    optimizer step (measured: ~2.6 per op, ~5.5 per parameter), ggml-opt's loss a few more."""
    n_nodes, params, n_leafs = _count_forward([outputs], with_leafs=True)
    if build_type == BUILD_FORWARD:
        return n_nodes + n_leafs + 32
    return 4 * (n_nodes - len(params)) + 6 * len(params) + n_leafs + 64


def static_graph_size(outputs: Tensor, build_type: int = BUILD_OPT) -> int:
    """The node capacity to give ggml-opt's static graphs: ggml's default, or more for large models."""
    return max(STATIC_GRAPH_NODES, training_graph_nodes(outputs, build_type))


def check_sched_room(sched: Scheduler, outputs: Tensor, build_type: int) -> None:
    """The scheduler's hash set must hold the nodes and leafs of the graphs ggml-opt allocates on it, or
    ggml aborts in ggml_opt_alloc."""
    need = training_graph_nodes(outputs, build_type)
    room = sched_hash_size(sched.graph_size)
    if need > room:
        what = "forward" if build_type == BUILD_FORWARD else "training"
        raise GgmlValueError(f"the scheduler is too small for this model's {what} graph: about {need} nodes and "
                             f"leafs, room for {room} (graph_size {sched.graph_size}); create it with "
                             f"ggml_backend_sched_new(..., graph_size={need}) or more")


def check_trainable(outputs: Sequence[Tensor], what: str = "outputs", accumulating: bool = False) -> int:
    """ggml could build and run the backward pass of these outputs (it would abort otherwise);
    returns the number of forward nodes."""
    n_nodes, params = _count_forward(outputs)
    if not params:
        raise GgmlValueError(f"nothing to train: no tensor reachable from {what} is marked with ggml_set_param")
    for p in params:
        if p.type != lib.GGML_TYPE_F32:
            name = ffi.string(p.name).decode() or "?"
            raise GgmlTypeError(f"trainable tensors must be F32 (ggml's optimizer steps are F32-only); "
                                f"'{name}' is {ffi.string(lib.ggml_type_name(p.type)).decode()}")
    # The graph ggml-opt will build, in a scratch context: its node order is ggml's own.
    scratch = ggml_init(ggml_graph_overhead(2 * n_nodes + 16) + 1024, no_alloc=True)
    try:
        graph = lib.ggml_new_graph_custom(scratch.ptr, 2 * n_nodes + 16, False)
        for o in outputs:
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
                 lr_ud: LrUserdata | None = None, loss_mask_ne0: int | None = None) -> None:
        self.sched = sched
        self.optimizer = optimizer
        self.opt_period = opt_period
        self.build_type = build_type
        self.static = ctx_compute is not None
        self.lr_ud = lr_ud or LrUserdata()
        self.inputs = inputs
        self.user_ctx = ctx_compute
        self.loss = L.build_loss_graph(heads, sched, loss_mask_ne0) if self.static else None
        self._graph_ctx = None
        self._opt_i = 0          # mirrors ggml-opt's accumulation phase
        self._pending = None     # None, "forward" or "backward": an alloc waiting for its eval
        self._prepared = False   # dynamic mode: prepare_alloc called since the last eval
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
        self._index_inputs = index_inputs([self.loss.opt_outputs]) if self.static else []
        super().__init__(lib.ggml_opt_init(params), lib.ggml_opt_free, parents=parents)
        if self.static:
            sched._opt_users.add(self)

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
            if build_type != BUILD_FORWARD:
                check_trainable([self.loss.opt_outputs], accumulating=opt_period > 1)
            # ggml-opt's static graphs (forward, +backward, +optimizer step) all have one size; ggml's default
            # of 2048 nodes is raised for larger models (patches/0005 adds the graph_size field).
            graph_size = static_graph_size(self.loss.opt_outputs, build_type)
            check_sched_room(sched, self.loss.opt_outputs, build_type)
            # A private context: ggml-opt puts three graphs and all backward tensors here and never frees them.
            self._graph_ctx = ggml_init(3 * ggml_graph_overhead(graph_size, True)
                                        + 6 * graph_size * ggml_tensor_overhead(), no_alloc=True)
            params.graph_size = graph_size
            params.ctx_compute = self._graph_ctx.ptr
            params.inputs = inputs.ptr
            params.outputs = self.loss.opt_outputs.ptr
            parents += [ctx_compute, self._graph_ctx]
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
        return Tensor(ptr, self) if ptr != ffi.NULL else None

    def labels(self, head: int = 0) -> Tensor | None:
        if self.loss is not None and self.loss.composite:
            return self.loss.heads[head].labels
        return self.tensor(lib.ggml_opt_labels(self.ptr)) if head == 0 else None

    @property
    def n_heads(self) -> int:
        return len(self.heads)

    # ---- the per-batch protocol, checked
    def alloc(self, backward: bool) -> None:
        ptr = self.ptr
        if self._pending is not None:
            raise GgmlStateError("ggml_opt_alloc was already called for the next eval; call ggml_opt_eval first")
        if backward and self.build_type == BUILD_FORWARD:
            raise GgmlStateError("this opt context was built forward-only (build type FORWARD): it cannot "
                                 "allocate a backward pass")
        if not self.static and not self._prepared:
            raise GgmlStateError("dynamic graphs: call ggml_opt_prepare_alloc before every ggml_opt_alloc")
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
            self.lr_ud.validate()
        if self._index_inputs:
            check_index_inputs(self._index_inputs)
        res_ptr = ffi.NULL
        if result is not None:
            res_ptr = unwrap(result, OptResult, "ggml_opt_eval(result)")
            result.check_batch(self)
        lib.ggml_opt_eval(ptr, res_ptr)
        if self.static and self.loss.composite:
            self.loss.count_correct()
        self._opt_i = (self._opt_i + 1) % self.opt_period
        self._pending = None
        self._prepared = False

    def _describe(self) -> str:
        names = "+".join(L.LOSS_NAMES[h.loss_type] for h in self.heads)
        return f" {names} {ggml_opt_optimizer_name(self.optimizer)} period={self.opt_period}"


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
        if isinstance(w, bool) or not isinstance(w, (int, float, np.floating)) or not math.isfinite(w) or w < 0:
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
    t = as_tensor(inputs, "inputs")
    if t.ptr.data == ffi.NULL:
        raise GgmlStateError("inputs must be allocated before the opt context is built: allocate its context "
                             "with ggml_backend_alloc_ctx_tensors")
    for other in list(sched._opt_users):
        if other.alive:
            raise GgmlStateError("this scheduler already serves a live opt context with static graphs; ggml-opt "
                                 "contexts must not share a scheduler (one would silently stop training). "
                                 "Free the other context or create another scheduler")


def ggml_opt_init(sched: Scheduler, loss_type: int, optimizer: int = OPTIMIZER_ADAMW, opt_period: int = 1,
                  ctx_compute: Context | None = None, inputs: Tensor | None = None,
                  outputs: Tensor | None = None, build_type: int = BUILD_OPT) -> OptContext:
    """An opt context with ggml's default optimizer parameters (see ``ggml_opt_init_for_fit`` for an LR handle)."""
    return _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type)


def _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type=BUILD_OPT,
              lr_ud=None, loss_mask_ne0=None, loss_weights=None, sample_weighted=False) -> OptContext:
    unwrap(sched, Scheduler, "sched")
    check_optimizer(optimizer)
    expect(isinstance(opt_period, int) and not isinstance(opt_period, bool) and opt_period >= 1,
           f"opt_period must be an int >= 1, got {opt_period!r}")
    if build_type not in (BUILD_FORWARD, BUILD_OPT):
        raise GgmlValueError("build_type must be ggml_opt_build_type_forward() or ggml_opt_build_type_opt(); "
                             "ggml's GRAD build type aborts in ggml_opt_init")
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
    if loss_mask_ne0 is not None:
        expect(isinstance(loss_mask_ne0, int) and loss_mask_ne0 >= 0,
               f"loss_mask_ne0 must be None or an int >= 0, got {loss_mask_ne0!r}")
    return OptContext(sched, heads, optimizer, opt_period, ctx_compute, inputs, build_type, lr_ud,
                      loss_mask_ne0 or None)


def ggml_opt_init_for_fit(sched: Scheduler, loss_type: int, optimizer: int = OPTIMIZER_ADAMW, opt_period: int = 1,
                          ctx_compute: Context | None = None, inputs: Tensor | None = None,
                          outputs: Tensor | None = None, loss_mask_ne0: int | None = None,
                          weight_decay: float = 0.0) -> dict:
    """``{"opt_ctx": ..., "lr_ud": ...}``: a context whose learning rate ``ggml_opt_set_lr`` can change."""
    lr_ud = LrUserdata(check_weight_decay(weight_decay))
    opt = _opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, BUILD_OPT, lr_ud,
                    loss_mask_ne0)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def ggml_opt_init_for_fit_multi(sched: Scheduler, loss_types: Sequence[int], loss_weights: Sequence[float] | None,
                                labels_offs: Sequence[int] | None = None, optimizer: int = OPTIMIZER_ADAMW,
                                opt_period: int = 1, ctx_compute: Context | None = None,
                                inputs: Tensor | None = None, outputs: Sequence[Tensor] | None = None,
                                weight_decay: float = 0.0) -> dict:
    """Several output heads, total loss = sum_i loss_weights[i] * loss_i; ``labels_offs`` are 0-based
    offsets of each head's labels in a concatenated label row (default: heads back to back)."""
    if ctx_compute is None:
        raise GgmlValueError("ggml_opt_init_for_fit_multi needs static graphs: pass ctx_compute, inputs, outputs")
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    weights = [1.0] * len(outs) if loss_weights is None else loss_weights
    lr_ud = LrUserdata(check_weight_decay(weight_decay))
    opt = _opt_init(sched, list(loss_types), optimizer, opt_period, ctx_compute, inputs, outs, BUILD_OPT, lr_ud,
                    None, weights)
    opt.labels_offs = resolve_labels_offs(opt.heads, labels_offs)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def resolve_labels_offs(heads: list[L.Head], labels_offs: Sequence[int] | None) -> list[int]:
    widths = [h.outputs.nelements() // L.physical_batch(h.outputs) for h in heads]
    if labels_offs is None:
        return [int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]])]
    offs = list(labels_offs)
    if len(offs) != len(heads) or any(isinstance(o, bool) or not isinstance(o, (int, np.integer)) or o < 0
                                      for o in offs):
        raise GgmlValueError(f"labels_offs must hold one int >= 0 per head ({len(heads)}), got {labels_offs!r}")
    return [int(o) for o in offs]


def _opt(opt_ctx: Any, fn: str) -> Any:
    return unwrap(opt_ctx, OptContext, f"{fn}(opt_ctx)")


def ggml_opt_free(opt_ctx: OptContext) -> None:
    free_handle(opt_ctx, OptContext, "ggml_opt_free(opt_ctx)")


def ggml_opt_reset(opt_ctx: OptContext, optimizer: bool = False) -> None:
    lib.ggml_opt_reset(_opt(opt_ctx, "ggml_opt_reset"), bool(optimizer))


def ggml_opt_static_graphs(opt_ctx: OptContext) -> bool:
    return bool(lib.ggml_opt_static_graphs(_opt(opt_ctx, "ggml_opt_static_graphs")))


def ggml_opt_context_optimizer_type(opt_ctx: OptContext) -> int:
    return int(lib.ggml_opt_context_optimizer_type(_opt(opt_ctx, "ggml_opt_context_optimizer_type")))


def ggml_opt_inputs(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.tensor(lib.ggml_opt_inputs(_opt(opt_ctx, "ggml_opt_inputs")))


def ggml_opt_outputs(opt_ctx: OptContext) -> Tensor | None:
    _opt(opt_ctx, "ggml_opt_outputs")
    if opt_ctx.static:
        return opt_ctx.heads[0].outputs
    return opt_ctx.tensor(lib.ggml_opt_outputs(opt_ctx.ptr))


def ggml_opt_labels(opt_ctx: OptContext) -> Tensor | None:
    _opt(opt_ctx, "ggml_opt_labels")
    return opt_ctx.labels(0)


def ggml_opt_loss(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.tensor(lib.ggml_opt_loss(_opt(opt_ctx, "ggml_opt_loss")))


def ggml_opt_pred(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.tensor(lib.ggml_opt_pred(_opt(opt_ctx, "ggml_opt_pred")))


def ggml_opt_ncorrect(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.tensor(lib.ggml_opt_ncorrect(_opt(opt_ctx, "ggml_opt_ncorrect")))


def ggml_opt_grad_acc(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
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
    _opt(opt_ctx, "ggml_opt_n_loss")
    return opt_ctx.n_heads


def ggml_opt_outputs_i(opt_ctx: OptContext, ihead: int) -> Tensor:
    return _head(opt_ctx, ihead, "ggml_opt_outputs_i").outputs


def ggml_opt_labels_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    _head(opt_ctx, ihead, "ggml_opt_labels_i")
    return opt_ctx.labels(ihead - 1)


def ggml_opt_loss_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    """Head ``ihead``'s loss before its head weight (for a single ggml loss: ggml's loss tensor)."""
    head = _head(opt_ctx, ihead, "ggml_opt_loss_i")
    return head.value if head.value is not None else ggml_opt_loss(opt_ctx)


def ggml_opt_loss_weights_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    return _head(opt_ctx, ihead, "ggml_opt_loss_weights_i").weights


def ggml_opt_ncorrect_i(opt_ctx: OptContext, ihead: int) -> Tensor | None:
    head = _head(opt_ctx, ihead, "ggml_opt_ncorrect_i")
    return head.ncorrect if opt_ctx.loss is not None and opt_ctx.loss.composite else ggml_opt_ncorrect(opt_ctx)


def ggml_opt_prepare_alloc(opt_ctx: OptContext, ctx_compute: Context, graph: Graph, inputs: Tensor,
                           outputs: Tensor) -> None:
    ptr = _opt(opt_ctx, "ggml_opt_prepare_alloc")
    if opt_ctx.static:
        raise GgmlStateError("ggml_opt_prepare_alloc is for dynamic graphs; this context has static graphs")
    if opt_ctx._pending is not None:
        raise GgmlStateError("an allocation is pending: call ggml_opt_eval first")
    c = unwrap(ctx_compute, Context, "ggml_opt_prepare_alloc(ctx_compute)")
    if not isinstance(graph, Graph):
        raise_type("ggml_opt_prepare_alloc(graph)", "Graph", graph)
    i, o = as_tensor(inputs, "inputs"), as_tensor(outputs, "outputs")
    if opt_ctx.build_type != BUILD_FORWARD:
        check_trainable([o], accumulating=True)  # dynamic graphs always accumulate
    ctx_compute.reserve(0, n_objects=8 + 4 * graph.n_nodes(), what="loss and backward tensors")
    lib.ggml_opt_prepare_alloc(ptr, c, graph.ptr, i.ptr, o.ptr)
    opt_ctx.heads[0].outputs = o
    opt_ctx._prepared = True


def ggml_opt_alloc(opt_ctx: OptContext, backward: bool = True) -> None:
    _opt(opt_ctx, "ggml_opt_alloc")
    opt_ctx.alloc(bool(backward))


def ggml_opt_eval(opt_ctx: OptContext, result: OptResult | None = None) -> None:
    _opt(opt_ctx, "ggml_opt_eval")
    opt_ctx.eval(result)
