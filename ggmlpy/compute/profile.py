"""Where the time of a graph's compute goes, node by node.

Two timers, one result (``NodeTime`` per node, ``Profile`` aggregated by op and backend):

- ``GraphNodeTimer``, for computes on the CPU alone: ggml's CPU backend (patches/0079) notes the
  time at which its threads have all finished each node, inside the one graph it computes as usual. The times are
  those of the plain compute: the same barriers between nodes, the same fused ops (a ReLU's backward ``STEP`` and
  ``MUL`` computed in one pass is one entry, ``STEP+MUL``), nothing launched per node.
- ``NodeTimer``, for any scheduler (a GPU's, the BLAS backend's): it watches the computes through ggml's eval
  callback, as ``PlacementRecorder`` does, but asks for every node that does work, so the scheduler computes each
  such node as a graph of its own and reports back after it; the time between the two calls is that node's
  compute. That changes the compute being measured: every node pays a graph launch (the thread pool's start and
  end, a few to some tens of microseconds) instead of one barrier, and no ops are fused, so the nodes add up to
  more than the plain step.

``node_timer(sched)`` picks the first where it applies.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend
from ..errors import GgmlStateError
from .placement import NO_WORK_OPS, SchedWatcher
from .sched import Scheduler


if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass
class NodeTime:
    """One node of one compute: its op, the backend that ran it, its shape (ggml's ``ne``), its sources' shapes,
    the seconds its compute took and its first four ggml op parameters (int32, e.g. a convolution's strides;
    what they mean is the op's own). Ops a backend computed as one (``GraphNodeTimer`` only) are one entry: ``op``
    names the first and the last (``"STEP+MUL"``), ``nodes`` counts them, the shape is the last one's and the
    sources and parameters the first one's."""
    op: str
    backend: str
    shape: tuple
    sources: tuple
    seconds: float
    params: tuple = ()
    nodes: int = 1


@dataclass
class Profile:
    """Node timings of one or more computes of the same graph (``ggml_model_profile``'s result).

    Attributes:
        what: what was computed, e.g. ``"training step of 'cnn', batch 100"``.
        steps: how many computes the node times add up over.
        nodes: every ``NodeTime`` of every compute, in the order they ran.
        step_seconds: the best time of one plain compute (not split per node), when it was measured.
    """
    what: str
    steps: int
    nodes: list[NodeTime] = field(default_factory=list)
    step_seconds: float | None = None
    method: str = "node by node"

    @property
    def nodes_per_step(self) -> int:
        """Nodes that do work in one compute (views, reshapes and permutes not counted; fused ones each)."""
        return sum(n.nodes for n in self.nodes) // max(self.steps, 1)

    @property
    def entries_per_step(self) -> int:
        """Timed entries of one compute: its nodes, fused ones counted once."""
        return len(self.nodes) // max(self.steps, 1)

    @property
    def node_seconds(self) -> float:
        """The nodes' compute times added up, per step."""
        return sum(n.seconds for n in self.nodes) / max(self.steps, 1)

    def by_op(self) -> list[tuple[str, str, int, float]]:
        """``(op, backend, entries per step, seconds per step)`` for each op and backend, slowest first (ops a
        backend fused are one entry, ``"STEP+MUL"``)."""
        count: dict = defaultdict(int)
        seconds: dict = defaultdict(float)
        for n in self.nodes:
            count[(n.op, n.backend)] += 1
            seconds[(n.op, n.backend)] += n.seconds
        s = max(self.steps, 1)
        rows = [(op, be, count[(op, be)] // s, seconds[(op, be)] / s) for (op, be) in count]
        return sorted(rows, key=lambda r: -r[3])

    def slowest(self, k: int = 10) -> list[NodeTime]:
        """The ``k`` slowest nodes of one step (the node times averaged over the steps)."""
        per = self.entries_per_step
        if per == 0:
            return []
        avg = []
        for i in range(per):
            same = self.nodes[i::per]
            avg.append(NodeTime(same[0].op, same[0].backend, same[0].shape, same[0].sources,
                                sum(n.seconds for n in same) / len(same), same[0].params, same[0].nodes))
        return sorted(avg, key=lambda n: -n.seconds)[:k]

    def __str__(self) -> str:
        total = self.node_seconds
        head = f"{self.what}: {self.nodes_per_step} nodes per step, {total * 1e3:.2f} ms per step {self.method}"
        if self.step_seconds is not None:
            head += f" ({self.step_seconds * 1e3:.2f} ms as one graph)"
        lines = [head, f"  {'op':24} {'backend':8} {'count':>5} {'ms/step':>8} {'share':>6}"]
        for op, be, n, sec in self.by_op():
            lines.append(f"  {op:24} {be:8} {n:5} {sec * 1e3:8.3f} {sec / total if total else 0:6.1%}")
        lines.append("  slowest nodes:")
        for node in self.slowest(8):
            srcs = ", ".join("x".join(map(str, s)) for s in node.sources)
            shape = "x".join(map(str, node.shape))
            lines.append(f"    {node.op:22} {node.backend:6} {node.seconds * 1e3:7.3f} ms  {shape} <- {srcs}")
        return "\n".join(lines)


def _shape(t: CData) -> tuple[int, ...]:
    ne = [int(t.ne[i]) for i in range(4)]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne)


def _op(t: CData) -> str:
    return ffi.string(lib.ggml_op_desc(t)).decode()


def _node_time(first: CData, backend: str, seconds: float, last: CData | None = None, nodes: int = 1) -> NodeTime:
    """The ``NodeTime`` of node ``first`` (of a fused group ``first`` .. ``last`` of ``nodes`` nodes)."""
    last = first if last is None else last
    op = _op(first) if nodes == 1 else f"{_op(first)}+{_op(last)}"
    sources = tuple(_shape(s) for s in first.src[0:int(lib.GGML_MAX_SRC)] if s != ffi.NULL)
    return NodeTime(op, backend, _shape(last), sources, seconds, tuple(int(first.op_params[i]) for i in range(4)),
                    nodes)


def _is_cpu(backend: Backend) -> bool:
    return int(lib.ggml_backend_dev_type(lib.ggml_backend_get_device(backend.ptr))) == int(
        lib.GGML_BACKEND_DEVICE_TYPE_CPU)


class NodeTimer(SchedWatcher):
    """Times every node a scheduler computes while it is entered (``with NodeTimer(sched):``).

    Only one watcher (this or a ``PlacementRecorder``) is on a scheduler at a time; leaving the block removes
    the callback. The computes inside run node by node, so they are slower than without it."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched)
        self.nodes: list[NodeTime] = []
        self._started = 0.0

    def _on_eval(self, t: CData, ask: bool) -> bool:
        if not ask:  # the node asked for last has been computed
            self.nodes.append(_node_time(t, self.backend_of(t), time.perf_counter() - self._started))
            return True  # go on with the graph
        if _op(t) in NO_WORK_OPS:
            return False  # computed with the next node that does work
        self._started = time.perf_counter()
        return True


class GraphNodeTimer:
    """Times every node of the CPU graph computes that this thread makes while it is entered (``with
    GraphNodeTimer(sched):``), inside each graph as it is computed (patches/0079). For computes that run on the
    CPU alone (``node_timer`` checks): nodes another backend computes are not seen. The computes are unchanged.
    Each block appends its computes' nodes to ``nodes``; the entries are read when the block ends, so the graphs it
    computed must still be allocated then. An inner timer entered on the same thread takes the computes until it
    ends, then the outer one goes on. Raises ``GgmlStateError`` on entering where the CPU backend has no such
    timer, and on leaving where the computes had more entries than it holds."""

    CAPACITY = 1 << 16   # entries (32 bytes each) a block can time: its computes' nodes and one per compute

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.nodes: list[NodeTime] = []
        self._times = ffi.new("struct ggmlpy_cpu_node_time[]", self.CAPACITY)
        self._timer = ffi.new("struct ggmlpy_cpu_node_timer *", {"times": self._times, "capacity": self.CAPACITY})
        self._previous: CData | None = None   # while entered: the thread's timer before this one (or NULL)
        self._backend = next((ffi.string(lib.ggml_backend_name(b.ptr)).decode() for b in sched.backends
                              if _is_cpu(b)), "CPU")

    def __enter__(self) -> Self:
        if self._previous is not None:
            raise GgmlStateError("GraphNodeTimer: this timer is already entered; use a new one for a nested block")
        self._timer.count = 0
        previous = ffi.new("struct ggmlpy_cpu_node_timer **")
        if not lib.ggmlpy_cpu_node_timer_set(self._timer, previous):
            raise GgmlStateError("GraphNodeTimer: this ggml's CPU backend has no node timer (patches/0079); "
                                 "use NodeTimer, which times nodes through the scheduler's eval callback")
        self._previous = previous[0]
        return self

    def __exit__(self, *exc: object) -> None:
        # first, before anything can raise: the thread's timer is the one this block replaced
        lib.ggmlpy_cpu_node_timer_set(self._previous if self._previous is not None else ffi.NULL, ffi.NULL)
        self._previous = None
        count = int(self._timer.count)
        if count > self.CAPACITY and exc[0] is None:
            raise GgmlStateError(f"GraphNodeTimer: the computes inside the block had {count} timed entries, more "
                                 f"than the {self.CAPACITY} it holds; time fewer computes per block")
        started = 0
        for e in self._times[0:min(count, self.CAPACITY)]:
            if e.first == ffi.NULL:   # a compute began
                started = int(e.ns)
                continue
            self.nodes.append(_node_time(e.first, self._backend, (int(e.ns) - started) * 1e-9, e.last, int(e.nodes)))
            started = int(e.ns)


def node_timer(sched: Scheduler, used: list[str] | None = None) -> GraphNodeTimer | NodeTimer:
    """The timer for the computes of ``sched``: ``GraphNodeTimer`` (nodes timed inside the plain compute) where
    the backends that compute (the names in ``used``, e.g. a ``Placement``'s ``devices``; default: all of the
    scheduler's) are the CPU and its timer is there, else ``NodeTimer`` (node by node)."""
    names = {ffi.string(lib.ggml_backend_name(b.ptr)).decode(): b for b in sched.backends}
    computing = [names.get(name) for name in (used if used is not None else names)]
    if computing and all(b is not None and _is_cpu(b) for b in computing):
        if lib.ggmlpy_cpu_node_timer_available():
            return GraphNodeTimer(sched)
    return NodeTimer(sched)
