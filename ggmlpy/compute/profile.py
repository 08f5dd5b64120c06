"""Where the time of a graph's compute goes, node by node.

``NodeTimer`` watches the computes of one scheduler through ggml's eval callback, as ``PlacementRecorder``
does, but asks for every node that does work: the scheduler then computes each such node as a graph of its
own and reports back after it, so the time between the two calls is that node's compute. That changes the
compute being measured: every node pays a graph launch (the thread pool's start and end, a few to some tens of
microseconds) instead of one barrier, so the sum of the nodes is larger than the plain step; the profile
reports both. ``Profile`` is what it saw, aggregated by op and backend.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

from .._ffi import CData, ffi, lib
from .placement import NO_WORK_OPS, SchedWatcher
from .sched import Scheduler


@dataclass
class NodeTime:
    """One node of one compute: its op, the backend that ran it, its shape (ggml's ``ne``), its sources' shapes,
    the seconds its compute took and its first four ggml op parameters (int32, e.g. a convolution's strides;
    what they mean is the op's own)."""
    op: str
    backend: str
    shape: tuple
    sources: tuple
    seconds: float
    params: tuple = ()


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

    @property
    def nodes_per_step(self) -> int:
        """Nodes that do work in one compute (views, reshapes and permutes not counted)."""
        return len(self.nodes) // max(self.steps, 1)

    @property
    def node_seconds(self) -> float:
        """The nodes' compute times added up, per step."""
        return sum(n.seconds for n in self.nodes) / max(self.steps, 1)

    def by_op(self) -> list[tuple[str, str, int, float]]:
        """``(op, backend, nodes per step, seconds per step)`` for each op and backend, slowest first."""
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
        per = self.nodes_per_step
        if per == 0:
            return []
        avg = []
        for i in range(per):
            same = self.nodes[i::per]
            avg.append(NodeTime(same[0].op, same[0].backend, same[0].shape, same[0].sources,
                                sum(n.seconds for n in same) / len(same), same[0].params))
        return sorted(avg, key=lambda n: -n.seconds)[:k]

    def __str__(self) -> str:
        total = self.node_seconds
        head = f"{self.what}: {self.nodes_per_step} nodes per step, {total * 1e3:.2f} ms per step node by node"
        if self.step_seconds is not None:
            head += f" ({self.step_seconds * 1e3:.2f} ms as one graph)"
        lines = [head, f"  {'op':24} {'backend':8} {'nodes':>5} {'ms/step':>8} {'share':>6}"]
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
            elapsed = time.perf_counter() - self._started
            sources = tuple(_shape(s) for s in t.src[0:int(lib.GGML_MAX_SRC)] if s != ffi.NULL)
            self.nodes.append(NodeTime(ffi.string(lib.ggml_op_desc(t)).decode(), self.backend_of(t), _shape(t),
                                       sources, elapsed, tuple(int(t.op_params[i]) for i in range(4))))
            return True  # go on with the graph
        if ffi.string(lib.ggml_op_desc(t)).decode() in NO_WORK_OPS:
            return False  # computed with the next node that does work
        self._started = time.perf_counter()
        return True
