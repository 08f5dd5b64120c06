"""Lazy ``ag_*`` values lowered to one ggml graph, cached by the graph's structure, and run.

A value is a *node*: a leaf (a ``Storage`` on the device, or host data) or an op over other nodes. To compute a set
of targets, ``evaluate`` walks back from them to values that are already known, lowers what lies between into one
ggml graph (forward, ggml's own backward where a target is a gradient, the optimizer's updates), and runs it on the
targets' device. The graph is keyed by its structure: op names, static settings, shapes, and which stored tensors it
reads; host data (a batch, a learning rate, a seed) is an input written at each run. A step that repeats the
previous one's structure therefore reuses its graph, scheduler and memory, and the only transfers are its inputs.

Results stay in the graph's memory, flagged as outputs, until the same graph runs again: a result still referenced
then is first copied to the host. A value whose inputs changed after it was made (an optimizer step) is refused
rather than computed from their new values.
"""
from __future__ import annotations

import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .._ffi import ffi, lib
from ..backend.backend import ggml_get_n_threads
from ..backend.buffer import ggml_backend_alloc_ctx_tensors
from ..compute.placement import PlacementRecorder
from ..compute.run import check_status, ggml_backend_sched_graph_compute
from ..compute.sched import Scheduler
from ..compute.threads import forward_work, split_threads, StepWork
from ..core.handle import computing
from ..errors import GgmlStateError
from ..graph.backward import check_backward_graph
from ..graph.context import ggml_graph_overhead, ggml_init, ggml_tensor_overhead
from ..graph.graph import ggml_build_forward_expand, ggml_new_graph_custom
from ..graph.objects import Context, Graph, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_set_input, ggml_set_loss, ggml_set_output
from ..models.engine.runtime import make_scheduler
from ..ops.elementwise import ggml_cont
from .device import DTYPES, Engine, next_epoch, NUMPY, recording, Storage


CACHE_SIZE = 8  # graphs kept per device (a training step, an evaluation, a few batch sizes)


class Op:
    """An op of the engine: its name (part of a graph's key) and how it becomes ggml ops. ``lower(b, xs, attrs)``
    gets the ``Builder``, the ggml tensors of the inputs and the op's static settings and returns a ggml tensor.
    ``grad``: the op is a gradient (its inputs: the loss, the leaf), lowered through ggml's backward pass.
    ``deferred``: a write the engine makes with its next compute (``Engine.effects``), which counts as made when it
    was recorded: values recorded after it read the written value, values recorded before it are stale."""

    def __init__(self, name: str, lower: Callable[..., Tensor], grad: bool = False, deferred: bool = False) -> None:
        self.name, self.lower, self.grad, self.deferred = name, lower, grad, deferred

    def __repr__(self) -> str:
        return f"Op({self.name})"


class Node(Protocol):
    """What this module reads of a value (``tensor.AgTensor``)."""
    op: Op | None
    attrs: tuple
    shape: tuple[int, ...]
    dtype: str
    engine: Engine
    created: int
    writes: tuple[Storage, ...]
    storage: Storage | None
    host: np.ndarray | None
    result: tuple | None
    group: tuple

    @property
    def tape(self) -> object: ...

    @property
    def inputs(self) -> Sequence[Node]: ...

    def drop_inputs(self) -> None: ...


def known(n: Node) -> bool:
    """Whether a value needs no compute: stored, on the host, or a result still in its graph's memory."""
    return n.storage is not None or n.host is not None or result_valid(n)


def result_valid(n: Node) -> bool:
    r = n.result
    return r is not None and r[0].generation == r[1] and r[0].alive


def fetch(n: Node) -> np.ndarray:
    """The value of a known node as a numpy array of its shape (a download, unless it is on the host)."""
    if n.host is not None:
        return n.host
    if n.storage is not None:
        return n.storage.read()
    if result_valid(n):
        entry, _, t = n.result  # type: ignore[misc]  # result_valid: not None
        n.host = entry.engine.download(t).reshape(n.shape)
        return n.host
    raise GgmlStateError("internal: fetch of a value that is not computed; please report it")


# ---------------------------------------------------------------- building a graph

class Builder:
    """The ggml side of one graph: its contexts, the tensors of its nodes, its inputs and constants."""

    def __init__(self, engine: Engine, n_nodes: int) -> None:
        self.engine = engine
        self.size = max(2048, 12 * n_nodes + 256)
        self.ctx: Context = ggml_init(mem_size=ggml_graph_overhead(self.size, True) + 16 * self.size
                                      * ggml_tensor_overhead(), no_alloc=True)
        self.ctx_io: Context = ggml_init(mem_size=(2 * n_nodes + 16) * ggml_tensor_overhead(), no_alloc=True)
        self.graph: Graph = ggml_new_graph_custom(self.ctx, self.size, True)
        self.constants: list[tuple[Tensor, np.ndarray]] = []  # written once, after allocation
        self.inputs: list[Tensor] = []                         # host values written at each run, by position
        self.seed: Tensor | None = None                        # the loss's gradient (1), written at each run
        self.grads: dict[int, Tensor | None] = {}              # id(storage) -> its gradient in this graph
        self.loss: int | None = None                           # id() of the loss differentiated, while lowering
        self.storages: list[Storage] = []
        self.ends: list[Tensor] = []                           # side effects an op adds (an optimizer's copies)
        self._transposed: dict[int, Tensor] = {}

    def note_transpose(self, t: Tensor, original: Tensor) -> None:
        """``t`` is the transposed copy of the matrix ``original``."""
        self._transposed[int(ffi.cast("uintptr_t", t.ptr))] = original

    def untransposed(self, t: Tensor) -> Tensor | None:
        """The matrix ``t`` is a transposed copy of, if it is one (a product uses it directly)."""
        return self._transposed.get(int(ffi.cast("uintptr_t", t.ptr)))

    def input(self, shape: tuple[int, ...], dtype: str) -> Tensor:
        ne = tuple(reversed(shape)) or (1,)
        t = ggml_set_input(ggml_new_tensor(self.ctx_io, DTYPES[dtype], len(ne), ne))
        self.inputs.append(t)
        return t

    def constant(self, values: np.ndarray) -> Tensor:
        """An F32 (int32 values: I32, float16: F16) tensor holding ``values`` (numpy order), written once per
        graph."""
        kind = "i32" if values.dtype.kind in "iu" else "f16" if values.dtype == np.float16 else "f32"
        values = np.ascontiguousarray(values, dtype=NUMPY[kind])
        ne = tuple(reversed(values.shape)) or (1,)
        t = ggml_set_input(ggml_new_tensor(self.ctx_io, DTYPES[kind], len(ne), ne))
        self.constants.append((t, values.reshape(-1)))
        return t

    def backward(self, loss: Node, loss_t: Tensor, leaves: Sequence[Node]) -> None:
        """ggml's backward pass of ``loss`` into this graph: gradients for the stored leaves it was asked for."""
        if self.loss is not None:
            raise GgmlStateError("internal: two backward passes in one graph; please report it")
        self.loss = id(loss)
        if loss_t.ptr.op == lib.GGML_OP_NONE or loss_t.ptr.view_src != ffi.NULL:
            loss_t = Tensor(lib.ggml_scale(self.ctx.ptr, loss_t.ptr, 1.0), self.ctx, sources=(loss_t,))
        ggml_set_loss(loss_t)
        ggml_build_forward_expand(self.graph, loss_t)
        g = self.graph.ptr
        n = int(lib.ggml_graph_n_nodes(g))
        param = int(lib.GGML_TENSOR_FLAG_PARAM)
        if not any(lib.ggml_graph_node(g, i).flags & param for i in range(n)):
            return   # the loss reads no trained leaf (ag_pow(w, 0)): every gradient is 0
        check_backward_graph(self.graph)
        self.seed = self.constant(np.ones(1, np.float32))   # d loss / d loss: written once, never overwritten
        accs = ffi.new("struct ggml_tensor *[]", n)
        for i in range(n):
            if lib.ggml_graph_node(g, i) == loss_t.ptr:
                accs[i] = self.seed.ptr
        self.graph.deps.setdefault(id(self.ctx_io), self.ctx_io)
        lib.ggml_build_backward_expand(self.ctx.ptr, g, accs)
        for leaf in leaves:
            st = leaf.storage
            assert st is not None  # a trainable leaf is stored
            grad = lib.ggml_graph_get_grad(g, st.tensor.ptr)
            self.grads[id(st)] = None if grad == ffi.NULL else Tensor(grad, self.ctx, sources=(st.tensor,))


@dataclass
class Plan:
    """What one ``evaluate`` computes: the nodes in order, which are given (``bound``), which are outputs."""
    order: list[Node]
    bound: list[bool]
    outputs: list[bool]
    key: tuple


class Entry:
    """A built graph with its scheduler, reused while the steps repeat its structure."""

    def __init__(self, engine: Engine, builder: Builder, sched: Scheduler, tensors: list[Tensor],
                 work: StepWork) -> None:
        self.engine, self.builder, self.sched, self.tensors, self.work = engine, builder, sched, tensors, work
        self.generation = 0
        self.alive = True
        self.io_buffer: object = None  # the inputs' buffer, kept with the graph
        self.held: list[weakref.ref] = []  # the previous run's outputs (weakly)
        self.constants_written = False
        self.ran = False   # computed once through the public call (which allocated and checked it)
        self.graph_addr = int(ffi.cast("uintptr_t", builder.graph.ptr))
        self.graph_cptr = builder.graph.ptr   # the graph and scheduler the entry owns, for the direct runs
        self.sched_cptr = sched.ptr
        self.host_inputs: list[tuple[int, object]] = []   # (position in the plan, input tensor) of each host value
        self.output_positions: list[int] = []
        self.writer_positions: list[int] = []

    def preserve(self) -> None:
        """Copy the previous run's outputs that are still referenced to the host, before their memory is reused."""
        for ref in self.held:
            n = ref()
            if n is not None and n.host is None and result_valid(n):
                fetch(n)
        self.held = []

    def free(self) -> None:
        self.preserve()
        self.alive = False
        self.sched.free()


class GraphCache:
    """An engine's graphs by key, least recently used dropped first."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple, Entry] = OrderedDict()

    def get(self, key: tuple) -> Entry | None:
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
        return e

    def put(self, key: tuple, entry: Entry) -> None:
        self.entries[key] = entry
        while len(self.entries) > CACHE_SIZE:
            _, old = self.entries.popitem(last=False)
            old.free()

    def clear(self) -> None:
        while self.entries:
            _, old = self.entries.popitem(last=False)
            old.free()


def _stale(n: Node, newest: int) -> GgmlStateError:
    return GgmlStateError(
        f"this {n.op.name if n.op else 'value'} of shape {n.shape} was made (epoch {n.created}) before a tensor "
        f"it is computed from changed (epoch {newest}: an optimizer step or a .data assignment), and has not "
        "been computed since; computing it now would mix old and new values. Read it (.numpy(), .item()) before "
        "the step, or compute it again from the current tensors")


def plan(targets: Sequence[Node], tapes: frozenset[int] = frozenset()) -> Plan:
    """Walk back from ``targets`` to known values; nodes in an order where inputs come first. Where a target needs
    a gradient, the nodes its tape recorded (between the loss and the trained leaves) are recomputed even when
    known: the backward pass needs them (``tapes``: the ids of those tapes, found on the way; when one is found
    after a node of it was taken as known, the walk starts again knowing it). Other known values are inputs.

    This runs at every step (a repeated step's graph is found by the key it returns), so it is written for speed:
    ``known`` inlined, one pass for the order and one for staleness, the key and the outputs."""
    order: list[Node] = []
    bound: list[bool] = []
    index: dict[int, int] = {}
    found: set[int] = set(tapes)
    taken: set[int] = set()     # tapes of known nodes taken as inputs
    stack: list = [(t, False) for t in reversed(targets)]
    pop, push = stack.pop, stack.append
    while stack:
        n, expanded = pop()
        nid = id(n)
        if nid in index:
            continue
        op = n.op
        if op is not None and not expanded:
            r = n.result
            tape = n.tape
            if (n.storage is not None or n.host is not None or (r is not None and r[0].generation == r[1]
                                                                 and r[0].alive)) \
                    and (tape is None or id(tape) not in found):
                if tape is not None:
                    taken.add(id(tape))
            else:
                if op.grad:
                    found.add(id(n.inputs[0].tape))
                push((n, True))
                for x in reversed(n.inputs):
                    if id(x) not in index:
                        push((x, False))
                continue
        index[nid] = len(order)
        order.append(n)
        bound.append(not expanded)
    if taken & found and found != tapes:
        return plan(targets, frozenset(found))
    # staleness (a node computed here is newer than every stored value it reads), and the graph's key
    newest: list[int] = []
    internal = [0] * len(order)
    parts: list[tuple] = []
    for n, b in zip(order, bound):
        if b:
            st = n.storage
            if st is not None:
                newest.append(st.modified)
                parts.append(("S", st.serial, n.shape, n.dtype))
            else:
                newest.append(n.created if n.op is None else 0)
                parts.append(("H", n.shape, n.dtype))
            continue
        pos = tuple([index[id(x)] for x in n.inputs])
        m = 0
        for k in pos:
            internal[k] += 1
            if newest[k] > m:
                m = newest[k]
        if m > n.created:
            raise _stale(n, m)
        newest.append(m)
        parts.append((n.op.name, n.attrs, pos, n.shape))  # type: ignore[union-attr]  # not bound: an op
    outputs = _outputs(order, bound, internal, {id(t) for t in targets})
    return Plan(order, bound, outputs, (tuple(parts), tuple(outputs)))


def _outputs(order: list[Node], bound: list[bool], internal: list[int], wanted: set[int]) -> list[bool]:
    """Which computed nodes keep their value after the run: the targets, and every node referenced from outside
    the nodes of this graph (a variable of the caller, a leaf's ``.grad``), whose value may be read later.
    ``internal``: how many inputs of the nodes computed here each node is, by position."""
    out = []
    getrefcount = sys.getrefcount
    for i in range(len(order)):
        if bound[i]:
            out.append(False)
            continue
        n = order[i]
        # references: the list, ``n`` and getrefcount's argument, and the inputs of the nodes computed here
        out.append((id(n) in wanted or getrefcount(n) - 3 > internal[i]) and not n.writes)
    return out


def _lower(engine: Engine, p: Plan) -> Entry:
    b = Builder(engine, len(p.order))
    tensors: list[Tensor] = []
    by_id: dict[int, Tensor] = {}
    leaves = [n.inputs[1] for n, bound in zip(p.order, p.bound) if not bound and n.op is not None and n.op.grad]
    for n, bound in zip(p.order, p.bound):
        t: Tensor
        if bound:
            t = n.storage.tensor if n.storage is not None else b.input(n.shape, n.dtype)
            if n.storage is not None:
                b.storages.append(n.storage)  # kept alive while the graph that reads them is
        elif n.op is not None and n.op.grad:
            loss, leaf = n.inputs
            if b.loss is None:
                b.backward(loss, by_id[id(loss)], leaves)
            elif b.loss != id(loss):
                raise GgmlStateError("internal: gradients of two losses in one graph; please report it")
            st = leaf.storage
            assert st is not None  # a gradient's leaf is stored
            g = b.grads.get(id(st))   # none: the loss does not depend on the leaf, its gradient is 0
            t = g if g is not None else Tensor(lib.ggml_scale(b.ctx.ptr, st.tensor.ptr, 0.0), b.ctx,
                                               sources=(st.tensor,))
        else:
            assert n.op is not None
            t = n.op.lower(b, [by_id[id(x)] for x in n.inputs], n.attrs)
        by_id[id(n)] = t
        tensors.append(t)
    firsts: list[Tensor] = []
    writers: list[Tensor] = []   # in-place writes of stored tensors (updates, statistics): after every read of them
    for i, (n, bound, o) in enumerate(zip(p.order, p.bound, p.outputs)):
        if bound:
            continue
        if n.writes:
            writers.append(tensors[i])
        elif o:
            t = tensors[i]
            if t.ptr.op == lib.GGML_OP_NONE or t.ptr.view_src != ffi.NULL:
                # (a view of) a stored tensor or an input, which this run or the next overwrites: keep a copy
                t = tensors[i] = ggml_cont(b.ctx, t)
            ggml_set_output(t)
            firsts.append(t)
    ends = firsts + writers + b.ends
    for t in ends:
        ggml_build_forward_expand(b.graph, t)
    io = ggml_backend_alloc_ctx_tensors(b.ctx_io, engine.backend)
    sched = make_scheduler(engine.backend, int(lib.ggml_graph_n_nodes(b.graph.ptr)))
    entry = Entry(engine, b, sched, tensors, forward_work(ends))
    hosts = [i for i, (n, bound) in enumerate(zip(p.order, p.bound)) if bound and n.storage is None]
    entry.host_inputs = [(i, t.ptr) for i, t in zip(hosts, b.inputs)]
    entry.output_positions = [i for i, (bound, o) in enumerate(zip(p.bound, p.outputs)) if o and not bound]
    entry.writer_positions = [i for i, (n, bound) in enumerate(zip(p.order, p.bound)) if not bound and n.writes]
    entry.io_buffer = io
    engine.counters.graphs_built += 1
    return entry


def evaluate(targets: Sequence[Node], engine: Engine | None = None) -> None:
    """Compute ``targets`` (nodes of one engine) in one graph, with the writes the engine deferred; afterwards
    each is known. ``engine``: where, when ``targets`` is empty (only the deferred writes)."""
    pending = [t for t in targets if not known(t)]
    for t in list(pending):   # values best computed together (one backward's gradients)
        for ref in t.group:
            g = ref()
            if g is not None and not known(g) and all(g is not q for q in pending):
                pending.append(g)
    if not pending and (engine is None or not engine.effects):
        return
    engine = pending[0].engine if pending else engine
    assert engine is not None
    for t in pending:
        if t.engine is not engine:
            raise GgmlStateError(f"values on {engine.name} and {t.engine.name} cannot be computed in one graph; "
                                 "move one with ag_to_device")
    with engine.lock:
        effects, engine.effects = engine.effects, []
        try:
            if effects and _reads_written(pending, effects):
                _compute(engine, effects)   # a value here reads a statistic a pending effect writes: write it first
                effects = []
            _compute(engine, effects + pending)
        except BaseException:
            engine.effects = effects + engine.effects   # not computed: not lost, the next compute writes them
            raise


def flush_effects(engine: Engine) -> None:
    """Make the writes an engine defers (batch norm's running statistics) now."""
    if engine.effects:
        evaluate([], engine)


def _reads_written(targets: Sequence[Node], effects: Sequence[Node]) -> bool:
    """Whether computing ``targets`` reads a stored tensor one of ``effects`` writes."""
    written = {id(st) for e in effects for st in e.writes}
    stack, seen = list(targets), set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if n.storage is not None and id(n.storage) in written:
            return True
        if n.op is not None and not known(n):
            stack.extend(n.inputs)
    return False


def _compute(engine: Engine, nodes: list[Node]) -> None:
    if not nodes:
        return
    p = plan(nodes)
    if engine.graphs is None:
        engine.graphs = GraphCache()
    cache: GraphCache = engine.graphs  # type: ignore[assignment]
    entry = cache.get(p.key)
    if entry is None:
        entry = _lower(engine, p)
        cache.put(p.key, entry)
    _run(engine, entry, p)


def _run(engine: Engine, entry: Entry, p: Plan) -> None:
    entry.preserve()
    b = entry.builder
    if not entry.constants_written:
        for t, values in b.constants:
            engine.upload(t, values)
        entry.constants_written = True
    counters = engine.counters
    for pos, cptr in entry.host_inputs:   # host values: written at each run
        n = p.order[pos]
        arr = np.ascontiguousarray(fetch(n), dtype=NUMPY[n.dtype]).reshape(-1)
        lib.ggml_backend_tensor_set(cptr, ffi.from_buffer(arr), 0, arr.nbytes)
        counters.uploads += 1
        counters.upload_bytes += arr.nbytes
    threads = (id(entry), ggml_get_n_threads())
    if engine.threads_key != threads:   # the engine's own backends: set for this graph's work, left so while it repeats
        split_threads(entry.sched.backends, entry.work)
        engine.threads_key = threads
    try:
        if recording():
            with PlacementRecorder(entry.sched) as rec:
                ggml_backend_sched_graph_compute(entry.sched, b.graph)
            engine.counters.placements.append(rec.placement(f"ag graph of {len(p.order)} values on {engine.name}"))
        elif entry.ran and entry.sched.allocated_graph == entry.graph_addr:
            # the graph's own scheduler still holds its allocation from the first run, which the public call
            # checked: run it again directly (the entry keeps every tensor it reads alive)
            with computing(entry.sched.backends):
                status = lib.ggml_backend_sched_graph_compute(entry.sched_cptr, entry.graph_cptr)
            check_status(status, "ag_* step")
        else:
            ggml_backend_sched_graph_compute(entry.sched, b.graph)
            entry.ran = True
    except BaseException:
        engine.threads_key = None
        raise
    engine.counters.computes += 1
    entry.generation += 1
    held: list[weakref.ref] = []
    order, tensors, gen = p.order, entry.tensors, entry.generation
    for i in entry.output_positions:
        n = order[i]
        n.result = (entry, gen, tensors[i])
        n.host = None
        ref = weakref.ref(n)
        held.append(ref)
        if n.tape is None:
            n.drop_inputs()   # known, and never differentiated: what it was computed from can go
        else:
            n.tape.computed.append(ref)  # type: ignore[attr-defined]  # tensor.Tape
    if entry.writer_positions:
        now = next_epoch()   # an optimizer's writes: now; a deferred write: as of when it was recorded
        for i in entry.writer_positions:
            n = order[i]
            deferred = n.op is not None and n.op.deferred
            for st in n.writes:
                st.modified = max(st.modified, n.created) if deferred else now
    entry.held = held
