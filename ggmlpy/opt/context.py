"""The opt context (``OptContext``): ggml-opt's graphs and buffers for one model, its state machine
(prepared, allocated, stepping), and the checks on a model before it is built.
"""
from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from types import TracebackType

import numpy as np

from .._ffi import CData, ffi, lib
from ..compute.checks import check_graph_memory, check_nodes_supported, check_static_memory
from ..compute.sched import sched_hash_size, Scheduler
from ..compute.staging import Reads
from ..compute.threads import count_forward
from ..core.args import is_real
from ..core.handle import compute_locks, computing, Handle, memory_epoch, unique_handles, unwrap, using
from ..errors import GgmlInUseError, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.backward import check_backward_nodes
from ..graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ..graph.indices import check_index_inputs, index_inputs
from ..graph.nodes import tensor_label
from ..graph.objects import as_tensor, Context, Tensor
from ..graph.tensor import input_leaf
from . import losses as L
from .constants import BUILD_FORWARD, BUILD_OPT, ggml_opt_optimizer_name, STATIC_GRAPH_NODES
from .params import LrUserdata, OptimizerParams
from .result import OptResult
from .tallies import DeviceTally, TallySource


def training_graph_nodes(outputs: Tensor | Sequence[Tensor], build_type: int = BUILD_OPT) -> int:
    """An upper bound on the nodes and leafs of the graphs ggml-opt builds from ``outputs`` (one tensor, or the
    outputs and extra outputs): the backward pass adds at most ~3 nodes per forward op, each parameter a
    gradient accumulator, two moments, an optimizer step and, when accumulating, the step's zeroing of the
    accumulator (patches/0052; measured: ~2.6 per op, ~5.5 per parameter without it), ggml-opt's loss a few more."""
    roots = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    n_nodes, params, n_leafs = count_forward(roots, with_leafs=True)
    if build_type == BUILD_FORWARD:
        return n_nodes + n_leafs + 32
    return 4 * (n_nodes - len(params)) + 7 * len(params) + n_leafs + 64


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
    n_nodes, params = count_forward([*outputs, *side_outputs])
    if not params:
        raise GgmlValueError(f"nothing to train: no tensor reachable from {what} is marked with ggml_set_param")
    for p in params:
        if p.type != lib.GGML_TYPE_F32:
            raise GgmlTypeError(f"trainable tensors must be F32 (ggml's optimizer steps are F32-only); "
                                f"{tensor_label(p)} is not; create it as GGML_TYPE_F32")
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

    @property
    def pending_batches(self) -> int:
        """How many batches of the current logical batch (``opt_period``) were evaluated since the last
        optimizer step: 0 at a step boundary."""
        return self._opt_i

    def __init__(self, sched: Scheduler, heads: list[L.Head], optimizer: int, opt_period: int,
                 ctx_compute: Context | None, inputs: Tensor | None, build_type: int = BUILD_OPT,
                 lr_ud: LrUserdata | None = None, loss_mask_ne0: int | None = None,
                 extra_outputs: Sequence[Tensor] = (), penalties: Sequence[L.Penalty] = (),
                 tallies: TallySource | None = None) -> None:
        self.sched = sched
        self.optimizer = optimizer
        self.opt_period = opt_period
        self.build_type = build_type
        self.static = ctx_compute is not None
        self.lr_ud = lr_ud or LrUserdata()
        self.opt_pars_owner: OptimizerParams | None = None  # ggml_opt_init(params): the struct ggml reads
        self.inputs = inputs
        self.user_ctx = ctx_compute
        # static graphs (and only they) have a loss graph
        tallies = tallies if self.static and build_type != BUILD_FORWARD and tallies is not None and tallies.device \
            else None
        loss = L.build_loss_graph(heads, sched, loss_mask_ne0, force_composite=tallies is not None,
                                  penalties=penalties) if self.static else None
        self.loss = loss
        # the training steps' statistics summed on the device (a fit's compiled metrics), where they can be built
        self.tally: DeviceTally | None = None
        if loss is not None and tallies is not None:
            try:
                self.tally = DeviceTally(tallies, sched, [h.outputs for h in loss.heads],
                                         [h.labels for h in loss.heads])
            except BaseException:
                loss.free()
                raise
            if not self.tally.active:  # the source sums on the host
                self.tally.free()
                self.tally = None
        # static graphs: what every eval computes besides the loss (ggml-opt's extra outputs, patches/0017): the
        # caller's side outputs (batch-norm statistics), the loss graph's own (argmax counts) and the tallies' sums
        self.extra_outputs = [*extra_outputs, *loss.extra_outputs, *(self.tally.updates if self.tally else [])] \
            if loss is not None else []
        self._extra_array: np.ndarray | None = None
        self._graph_ctx: Context | None = None
        self._opt_i = 0          # mirrors ggml-opt's accumulation phase
        self.pending_alloc: str | None = None     # None, "forward" or "backward": an alloc waiting for its eval
        self.prepared = False   # dynamic mode: prepare_alloc called since the last eval
        self.step_ctx: Context | None = None   # dynamic mode: the ctx_compute of the last prepare_alloc
        self._step = _DynamicStep()  # dynamic mode: what this step's graph tensors are valid for
        self.param_layout: list | None = None  # dynamic mode: (node index, shape) of the first graph's params
        self._running: str | None = None  # the loop driving this context now (ggml_opt_epoch, a fit)
        self._leaf_data: list = []  # static graphs: (leaf, its data) as ggml-opt's graph copy holds them
        self._memory_epoch = -1
        self._heads_read: Reads | None = None   # static graphs: the reads of the loss heads, made at the first eval
        self._eval_pending: tuple[OptResult | None, Reads | None] | None = None  # eval_submit's, until eval_finish
        self.rng = np.random.default_rng(5489)  # dataset shuffles; mt19937's default seed, as ggml's
        self.labels_offs = [0]
        try:
            params, parents = self._params(sched, heads, build_type, optimizer, opt_period, ctx_compute, inputs)
        except BaseException:
            if self.loss is not None:
                self.loss.free()  # refused before ggml-opt was called: release the loss graph's buffer now
            if self.tally is not None:
                self.tally.free()
            raise
        self.heads = heads
        # ggml aborts on an out-of-range ggml_get_rows index: those inputs are checked before each eval.
        self._index_inputs = index_inputs([loss.opt_outputs, *self.extra_outputs]) if loss is not None else []
        super().__init__(lib.ggml_opt_init(params), lib.ggml_opt_free, parents=parents)
        if self.static:
            sched.opt_users.add(self)
        sched.opt_contexts.add(self)

    @property
    def keepers(self) -> tuple[Handle, ...]:
        """Every handle an evaluation needs: this context, what it depends on, the buffers of those contexts
        (each once; recomputed when a context got another buffer)."""
        stamp = tuple(id(b) for h in self.parents for b in getattr(h, "buffers", ()) if b.alive)
        cached = self.__dict__.get("_keepers")
        if cached is None or cached[0] != stamp:
            hs = [self, *self.parents]
            for h in self.parents:
                hs.extend(b for b in getattr(h, "buffers", ()) if b.alive)
            if self.loss is not None:
                hs.extend(self.loss.owned)
            if self.tally is not None:
                hs.extend(self.tally.owned)
            cached = self.__dict__["_keepers"] = (stamp, tuple(unique_handles(hs)))
        return cached[1]

    @property
    def _locks(self) -> tuple[threading.RLock, ...]:
        locks = self.__dict__.get("_compute_locks")
        if locks is None:
            locks = self.__dict__["_compute_locks"] = compute_locks(self.sched.backends)
        return locks

    @property
    def _on_rpc(self) -> bool:
        return any(getattr(b, "is_rpc", False) for b in self.sched.backends)

    def _in_use(self, what: str, result: OptResult | None = None) -> AbstractContextManager[None]:
        """Mark what one C call needs in use; nothing to do when a running loop (an epoch, a fit) has marked
        it all already (the per-batch calls stay cheap)."""
        if self.users and (result is None or result.users):
            return contextlib.nullcontext()
        return using((*self.keepers, result), what)

    def running(self, what: str) -> _Running:
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
                how = "has no memory any more" if t.data == ffi.NULL else "was given new memory"
                raise GgmlStateError(f"{tensor_label(t)} {how} since this opt context was built (its buffer, "
                                     "context or allocator was freed); ggml-opt's graphs still point at the old "
                                     "memory. Free this opt context and build a new one after allocating the tensor "
                                     "again")
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
            n_nodes = 2 * count_forward(roots)[0] + 16
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
        self._eval_pending = None  # ggml_opt_free waits for a step still queued
        super().free()
        if self._heads_read is not None:
            self._heads_read.free()
            self._heads_read = None
        if self.loss is not None:
            self.loss.free()
        if self.tally is not None:
            self.tally.free()
        if self._graph_ctx is not None:
            self._graph_ctx.free()

    # ---- tensors
    def tensor(self, ptr: CData) -> Tensor | None:
        """A tensor of the opt context's own memory (accumulators, moments; static graphs: everything)."""
        return Tensor(ptr, self) if ptr != ffi.NULL else None

    def step_tensor(self, ptr: CData) -> Tensor | None:
        """A tensor of the graph of this step: with dynamic graphs it lives in the ctx_compute given to
        ggml_opt_prepare_alloc and is valid until the next ggml_opt_alloc (ggml-opt rebuilds labels, loss and
        predictions then), so it refuses use once that context is freed or the next step is allocated."""
        if self.static or self.step_ctx is None or ptr == ffi.NULL:
            return self.tensor(ptr)
        return Tensor(ptr, self.step_ctx, deps=(self, self._step))

    def _check_step_ctx(self, fn: str) -> None:
        """Dynamic graphs: ggml-opt reads the graph in the ctx_compute of ggml_opt_prepare_alloc (freed memory
        would crash it)."""
        if not self.static and self.step_ctx is not None and not self.step_ctx.alive:
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
        self.eval_finish()  # a step still queued ends first (ggml-opt asserts)
        self._check_memory()
        if self.pending_alloc is not None:
            raise GgmlStateError("ggml_opt_alloc was already called for the next eval; call ggml_opt_eval first")
        if backward and self.build_type == BUILD_FORWARD:
            raise GgmlStateError("this opt context was built forward-only (build type FORWARD): it cannot "
                                 "allocate a backward pass")
        if not self.static and not self.prepared:
            raise GgmlStateError("dynamic graphs: call ggml_opt_prepare_alloc before every ggml_opt_alloc")
        self._check_step_ctx("ggml_opt_alloc")
        if not self.static:
            self._step.alive = False  # the last step's labels, loss and predictions go
            self._step = _DynamicStep()
        self.sched.release()  # ggml-opt resets the scheduler: what it allocated for other graphs goes
        with self._in_use("ggml_opt_alloc"), computing(locks=self._locks, rpc=self._on_rpc):
            lib.ggml_opt_alloc(ptr, bool(backward))
        if backward and not self.static and self._opt_i == 0:
            # ggml-opt never zeroes the accumulators of dynamic graphs (ggml-internals 1.2): do it here.
            lib.ggml_opt_reset(ptr, False)
        self.pending_alloc = "backward" if backward else "forward"

    def eval(self, result: OptResult | None = None, reads: Reads | None = None,
             then: Callable[[], None] | None = None, written: dict[int, np.ndarray] | None = None) -> None:
        """ggml_opt_eval, waiting for the device once (patches/0052): ``eval_submit`` then ``eval_finish``."""
        self.eval_submit(result, reads, then, written)
        self.eval_finish()

    def eval_submit(self, result: OptResult | None = None, reads: Reads | None = None,
                    then: Callable[[], None] | None = None, written: dict[int, np.ndarray] | None = None,
                    send: Callable[[], None] | None = None) -> None:
        """The first half of ggml_opt_eval: ``send()`` (the caller's uploads of this step's batch), the computation,
        the reads of the loss heads and of ``reads``, then ``then()`` (more work on the device: a graph optimizer's
        step) are queued, and none is waited for; ``eval_finish`` waits once for them all (at once here when one of
        them raises). Every check comes first: nothing is queued for a step that is refused. ``written``: what
        ``send`` queues into the inputs, by tensor (``ptr_key``): index inputs are checked on it."""
        ptr = self.ptr
        if self.pending_alloc is None:
            raise GgmlStateError("ggml_opt_eval needs a preceding ggml_opt_alloc")
        if self.pending_alloc == "backward":
            if (self._opt_i + 1) % self.opt_period == 0:  # this eval runs the optimizer step
                self.lr_ud.refresh()
            self.lr_ud.validate()
        if self._index_inputs:
            check_index_inputs(self._index_inputs, written)
        self._check_memory()
        self._check_step_ctx("ggml_opt_eval")
        res_ptr = ffi.NULL
        if result is not None:
            res_ptr = unwrap(result, OptResult, "ggml_opt_eval(result)")
            self.check_result(result)
        heads = self._head_reads() if result is not None else None
        with self._in_use("ggml_opt_eval", result), computing(locks=self._locks, rpc=self._on_rpc):
            # marked before the C call: a finish without a submit does nothing, a submit never finished would wait
            # in the next alloc (patches/0052), so an interruption between the two leaves nothing to abort on
            self._eval_pending = (result, heads)
            try:
                if send is not None:
                    send()
                lib.ggml_opt_eval_submit(ptr, res_ptr)
                status = int(lib.ggml_opt_eval_status(ptr))
                if status != int(lib.GGML_STATUS_SUCCESS):   # nothing computed or advanced (patches/0059)
                    raise GgmlValueError(
                        "ggml_opt_eval: a backend could not allocate what this step needs to compute (status "
                        f"{status}; ggml's CPU backend: its work buffer, which ops with a large scratch need, such "
                        "as attention's backward pass over very long sequences); nothing was computed and the "
                        "weights are as they were: use a smaller batch or shorter sequences")
                self._opt_i = (self._opt_i + 1) % self.opt_period
                self.pending_alloc = None
                self.prepared = False
                for r in (heads, reads):
                    if r is not None:
                        r.queue()
                if then is not None:
                    then()
            except BaseException:
                self._settle()
                raise

    def read_behind(self, reads: Reads) -> None:
        """Queue ``reads`` behind the step ``eval_submit`` queued: its ``eval_finish`` waits for them too."""
        if self._eval_pending is None:
            raise GgmlStateError("internal: a read queued behind a step when none is queued; please report it")
        with computing(locks=self._locks, rpc=self._on_rpc):
            reads.queue()

    def _settle(self) -> None:
        """After a step failed half-way: wait for what it queued (uploads, the computation), so that nothing runs
        later on memory that may be freed by then; its values are dropped."""
        lib.ggml_opt_eval_finish(self.ptr)
        lib.ggml_backend_sched_synchronize(self.sched.ptr)
        self._eval_pending = None

    def eval_finish(self) -> None:
        """The second half of ggml_opt_eval: wait for the step ``eval_submit`` queued and add its loss, predictions,
        correct count and heads to its result (nothing to do when no step is queued). The step stays marked until
        the wait has returned: interrupted before, the next call waits for it."""
        pending = self._eval_pending
        if pending is None:
            return
        result, heads = pending
        with self._in_use("ggml_opt_eval", result), computing(locks=self._locks, rpc=self._on_rpc):
            lib.ggml_opt_eval_finish(self.ptr)
            self._eval_pending = None
        if heads is not None and result is not None and self.loss is not None:
            result.record_heads(self.loss.heads, heads.values())

    def _head_reads(self) -> Reads | None:
        """The reads of each loss head's value and correct count (static graphs with a loss built from ggml ops)."""
        if self.loss is None or not self.loss.composite:
            return None
        if self._heads_read is None:
            tensors = [t for h in self.loss.heads for t in (h.value, h.ncorrect) if t is not None]
            self._heads_read = Reads(tensors, self.sched.backends)
        return self._heads_read

    def check_result(self, result: OptResult) -> None:
        """A result only ever sees one batch size, loss kind and period (ggml asserts it)."""
        out = self.loss.opt_outputs if self.loss is not None else self.heads[0].outputs  # static graphs: the loss
        kind = self.loss.ggml_loss_type if self.loss is not None else self.heads[0].loss_type
        result.check_batch(int(out.ptr.ne[1]), (kind, self.opt_period))

    def _describe(self) -> str:
        names = "+".join(L.LOSS_NAMES[h.loss_type] for h in self.heads)
        return f" {names} {ggml_opt_optimizer_name(self.optimizer)} period={self.opt_period}"


class _Running:
    """What ``OptContext.running`` returns: marks the context (and what it needs) in use by a loop."""

    def __init__(self, opt: OptContext, what: str) -> None:
        self.opt, self.what = opt, what
        self._using: AbstractContextManager[None] | None = None

    def __enter__(self) -> OptContext:
        self.opt.refuse_if_running(self.what)
        self._using = using(self.opt.keepers, self.what)
        self._using.__enter__()
        self.opt._running = self.what
        return self.opt

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.opt._running = None
        if self._using is not None:
            self._using.__exit__(exc_type, exc, tb)


class _DynamicStep:
    """One step of a dynamic opt context: its graph tensors (labels, loss, predictions) are valid until the
    next ggml_opt_alloc, which ends it."""
    kind = "step of a dynamic opt context (ggml_opt_alloc made new labels, loss and predictions since)"

    def __init__(self) -> None:
        self.alive = True


@contextlib.contextmanager
def _graph_nodes(outputs: Tensor, size: int, backward: bool,
                 side_outputs: Sequence[Tensor] = ()) -> Iterator[list[CData]]:
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


def heads_from(outputs: Tensor | Sequence[Tensor], loss_types: int | Sequence[int],
               loss_weights: float | Sequence[float] | np.ndarray | None = None,
               sample_weighted: bool = False) -> list[L.Head]:
    outs: list[object] = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    types: list[object] = list(loss_types) if isinstance(loss_types, (list, tuple)) else [loss_types] * len(outs)
    weights: list[object] = [1.0] * len(outs) if loss_weights is None else list(loss_weights) \
        if isinstance(loss_weights, (list, tuple, np.ndarray)) else [loss_weights]
    if not outs:
        raise GgmlValueError("outputs: expected at least one output tensor")
    if len(types) != len(outs) or len(weights) != len(outs):
        raise GgmlValueError(f"expected one loss type and one loss weight per output head ({len(outs)}), got "
                             f"{len(types)} loss types and {len(weights)} weights")
    heads = []
    for i, (o, t, w) in enumerate(zip(outs, types, weights)):
        out = as_tensor(o, f"outputs[{i}]")
        loss_type = L.check_loss_type(t, f"loss_types[{i}]")
        if not is_real(w) or not math.isfinite(w) or w < 0:
            raise GgmlValueError(f"loss_weights[{i}] must be a finite number >= 0, got {w!r}")
        heads.append(L.Head(int(loss_type), out, float(w), sample_weighted=sample_weighted,
                            custom=t if isinstance(t, L.CustomLoss) else None))
    return heads


def check_static(sched: Scheduler, ctx_compute: Context | None, inputs: Tensor | None,
                 outputs: Tensor | Sequence[Tensor] | None) -> None:
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
    for other in list(sched.opt_users):
        if other.alive:
            raise GgmlStateError("this scheduler already serves a live opt context with static graphs; ggml-opt "
                                 "contexts must not share a scheduler (one would silently stop training). "
                                 "Free the other context or create another scheduler")
