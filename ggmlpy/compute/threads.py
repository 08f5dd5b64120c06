"""The thread policy: how much work a graph is (``StepWork``, for a forward pass and for a training step
with its optimizer), and how the user's threads are split between ggml's CPU backend and BLAS for it
(measured thresholds in docs/guide/threads.md).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, overload

from .._ffi import CData, ffi, lib
from ..backend.backend import (
    Backend,
    blas_device,
    ggml_get_n_threads,
    is_blas,
    set_backend_threads,
    threads_set_by_user,
)
from ..backend.device import Device
from ..core import openblas
from ..core.library import uses_openmp
from ..graph.graph import walk_graph
from ..graph.objects import Tensor


# ---------------------------------------------------------------- the work of a graph

@overload
def count_forward(outputs: Sequence[Tensor], with_leafs: Literal[False] = False) -> tuple[int, list[CData]]: ...
@overload
def count_forward(outputs: Sequence[Tensor], with_leafs: Literal[True]) -> tuple[int, list[CData], int]: ...
def count_forward(outputs: Sequence[Tensor],
                  with_leafs: bool = False) -> tuple[int, list[CData]] | tuple[int, list[CData], int]:
    """Forward nodes reachable from the outputs, and the trainable leafs among them (and the other leafs)."""
    params: list[CData] = []
    n_nodes = n_leafs = 0
    flag = int(lib.GGML_TENSOR_FLAG_PARAM)
    for t in walk_graph(o.ptr for o in outputs):
        if t.flags & flag:
            params.append(t)
        if t.op != lib.GGML_OP_NONE or t.flags & flag:
            n_nodes += 1
        else:
            n_leafs += 1
    return (n_nodes, params, n_leafs) if with_leafs else (n_nodes, params)


def _op_code(name: bytes) -> int:
    return next(i for i in range(int(lib.GGML_OP_COUNT)) if ffi.string(lib.ggml_op_name(i)) == name)


_MUL_MAT = _op_code(b"MUL_MAT")
_LSTM_SEQ = _op_code(b"LSTM_SEQ")   # patches/0035: a whole recurrence, its products inside ggml's CPU pool
_CONV_2D_TILED = _op_code(b"CONV_2D_TILED")   # patches/0036: a convolution's product inside ggml's CPU pool
_GRU_SEQ = _op_code(b"GRU_SEQ")     # patches/0037: as LSTM_SEQ, with three gates


def forward_flops(outputs: Sequence[Tensor]) -> float:
    """A rough count of the floating-point operations of one forward pass to ``outputs``: 2 per
    multiply-add of a matrix product, one per result element of any other op."""
    return forward_work(outputs).flops


def _blas_takes(t: CData, blas: Device | None) -> bool:
    """Whether ggml's BLAS device (``blas``, None without one) takes this MUL_MAT, as it answers (patches/0010:
    F32, at least 32^3 multiply-adds; patches/0062: none where the CPU backend computes F32 products itself)."""
    return blas is not None and bool(lib.ggml_backend_dev_supports_op(blas.ptr, t))


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
    dev = blas_device()
    for t in walk_graph(o.ptr for o in outputs):
        if t.op == lib.GGML_OP_NONE:
            continue
        n = float(lib.ggml_nelements(t))
        if t.op == _MUL_MAT:
            product = 2.0 * n * int(t.src[0].ne[0])
            flops += product
            blas += product if _blas_takes(t, dev) else 0.0
        elif t.op in (_LSTM_SEQ, _GRU_SEQ):   # every step's recurrent product [units, G units] x [units, batch]
            units, batch, steps = int(t.ne[0]), int(t.ne[1]), int(t.ne[2])
            flops += 2.0 * (4 if t.op == _LSTM_SEQ else 3) * units * units * batch * steps + n
        elif t.op == _CONV_2D_TILED:   # every output element: a product over the kernel's KW KH Cin taps
            kernel = t.src[0]
            flops += 2.0 * n * int(kernel.ne[0]) * int(kernel.ne[1]) * int(kernel.ne[2])
        else:
            flops += n
    return StepWork(flops, blas, flops - blas)


def training_step_work(outputs: Sequence[Tensor], opt_period: int = 1) -> StepWork:
    """The work of one training step (forward and backward: 3x the forward pass) of ``outputs``, with the
    optimizer stepping every ``opt_period`` steps."""
    forward = forward_work(outputs)
    n_params = sum(float(lib.ggml_nelements(p)) for p in count_forward(outputs)[1])
    per_param = OPTIMIZER_ELEMENTS_PER_PARAM / max(1, opt_period) + (1.0 if opt_period > 1 else 0.0)
    return StepWork(3.0 * forward.flops, 3.0 * forward.blas_flops,
                    3.0 * forward.pool_elements + n_params * per_param)


# ---------------------------------------------------------------- the split

# The thresholds come from alternated runs on this project's 2 shared cores; the measurements behind each
# are in docs/guide/threads.md ("Where the rules come from"). Below SMALL_GRAPH_FLOPS per compute one thread
# is faster (the pool's barrier after every node costs more than a second thread saves).
SMALL_GRAPH_FLOPS = 50e6
BLAS_PARALLEL_FLOPS = SMALL_GRAPH_FLOPS  # OpenBLAS's products per step, at least
BLAS_FLOPS_PER_POOL_ELEMENT = 75.0  # ... and at least this many product flops per element op of the pool
POOL_PARALLEL_ELEMENTS = 20e6  # ggml's pool next to OpenBLAS: element ops per step for a second thread


def threads_for(backend: Backend, flops: float) -> int:
    """Give a CPU backend the threads a graph of ``flops`` per compute runs best with: the user's count if
    they set one with ``ggml_set_n_threads``, else one thread for a small graph and the default for others.
    Returns the count it had before (to restore it)."""
    if not backend.is_cpu:
        return 0
    before = backend.n_threads
    if backend.threads_chosen:   # the user's count for this backend (ggml_backend_cpu_set_n_threads)
        return before
    n = ggml_get_n_threads() if threads_set_by_user() or flops >= SMALL_GRAPH_FLOPS else 1
    if n != before:
        lib.ggmlpy_cpu_set_n_threads(backend.ptr, n)
        backend.n_threads = n
    return before


def blas_shares_cpu_pool() -> bool:
    """Whether ggml's BLAS backend runs its products on the CPU backend's own threads: OpenBLAS built on
    OpenMP, as ggml's CPU backend is. Then both may take every thread, as neither pool waits beside the other."""
    return openblas.threading_model() == "openmp" and uses_openmp()


def split_threads(backends, work: StepWork) -> list:
    """Set the threads of a scheduler's CPU and BLAS backends for a training graph doing ``work`` per step
    (``opt.training_step_work``). With a BLAS backend, the thread budget ``ggml_get_n_threads()`` goes to
    OpenBLAS when the products reach BLAS_PARALLEL_FLOPS and BLAS_FLOPS_PER_POOL_ELEMENT times the pool's
    element ops, and to ggml's pool when those reach POOL_PARALLEL_ELEMENTS; each gets one thread
    otherwise. Without a BLAS backend, the CPU backends get the count ``threads_for`` picks (one thread for
    a small graph unless the user set a count). Returns [(backend, count before)] for restore_threads."""
    blas = [b for b in backends if is_blas(b) and b.alive]
    if not blas:
        return [(b, threads_for(b, work.flops)) for b in backends if b.alive and b.is_cpu]
    n = ggml_get_n_threads()
    if blas_shares_cpu_pool():
        blas_n = pool_n = n if threads_set_by_user() or work.flops >= SMALL_GRAPH_FLOPS else 1
    else:
        blas_n = n if work.blas_flops >= max(BLAS_PARALLEL_FLOPS,
                                             BLAS_FLOPS_PER_POOL_ELEMENT * work.pool_elements) else 1
        pool_n = n if work.pool_elements >= POOL_PARALLEL_ELEMENTS else 1
    before = []
    for b in backends:
        if not b.alive or not (b.is_cpu or is_blas(b)) or b.threads_chosen:
            continue
        before.append((b, b.n_threads))
        set_backend_threads(b, blas_n if is_blas(b) else pool_n)
    return before


def restore_threads(before: list) -> None:
    for b, n in before:
        if b.alive:
            set_backend_threads(b, n)


# ---------------------------------------------------------------- shared cores: timing the steps

class ThreadTuner:
    """The thread counts of a training loop's steps, chosen by timing them.

    On cores that another process keeps busy, ggml's pool and OpenBLAS wait at every barrier for a thread
    the OS has given away, and a step with two threads takes several times one thread's time. So the counts
    ``split_threads`` set (the *wide* choice) are checked now and then against one thread everywhere (the
    *narrow* one): a few steps are run with the other choice (the first probe after the first steps; one
    step when it is clearly slower), and the faster one is kept. After a probe that lost, the next one waits
    until the time it lost is ``PROBE_COST`` of the training in between, and at least twice the last wait
    (up to ``PROBE_EVERY_MAX`` steps), so probing costs under 5%, next to nothing on a quiet machine. A step
    much slower than the recent ones (a competitor started) probes at once; a fit that starts while other
    processes keep a core busy starts with one thread. Off when the user set a count
    (``ggml_set_n_threads``) or the wide choice is one thread already."""

    WARMUP = 2           # steps not timed (graph allocation, caches, the pool's threads starting)
    FIRST_PROBE = 3      # timed steps before the first probe
    PROBE_STEPS = 3      # steps run with the other choice per probe (the first, a switch, is not compared) ...
    LOSING = 4.0         # ... ended at the first one this many times slower than the recent median
    PROBE_EVERY = 16     # steps between probes, at least ...
    PROBE_COST = 0.05    # ... long enough that a losing probe's extra time is this share of the training ...
    PROBE_EVERY_MAX = 256  # ... and doubling after each loss in a row, up to this (a quiet machine's cost)
    GAIN = 0.9           # the other choice must be this much faster (median step time) to be kept
    JUMP = 2.5           # a step this many times the recent median probes at once
    BUSY = 0.5           # other processes keeping this many cores busy at the start: begin with one thread

    def __init__(self, backends: Sequence[Backend]) -> None:
        targets = [b for b in backends if b.alive and (b.is_cpu or is_blas(b)) and not b.threads_chosen]
        self.wide = {id(b): (b, b.n_threads) for b in targets}
        self.enabled = not threads_set_by_user() and any(n > 1 for _, n in self.wide.values())
        self.current = "wide"
        self.times: dict[str, list[float]] = {"wide": [], "narrow": []}
        self.steps = 0
        self.every = self.PROBE_EVERY
        self.since_probe = self.every - self.FIRST_PROBE
        self.probe: list[float] | None = None  # step times of the running probe
        # the machine's load, measured over the warm-up steps (no wait before the first step)
        self.load = cpu_sample() if self.enabled else None

    def _check_load(self) -> None:
        """After the warm-up steps: if other processes kept cores busy meanwhile, go narrow, and probe late."""
        busy = cores_busy_since(self.load) if self.load is not None else None
        self.load = None
        if busy is not None and busy >= self.BUSY and self.current == "wide" and self.probe is None:
            self.current = "narrow"  # the wide choice would wait for cores that are taken
            # a wide step beside a busy core can cost dozens of narrow ones: wait long before probing it
            self.every, self.since_probe = self.PROBE_EVERY_MAX, 0

    def _apply(self, choice: str) -> None:
        for b, n in self.wide.values():
            want = n if choice == "wide" else 1
            if b.alive and b.n_threads != want:
                set_backend_threads(b, want)

    @property
    def running(self) -> str:
        """The choice the next step runs with."""
        if self.probe is not None:
            return "narrow" if self.current == "wide" else "wide"
        return self.current

    def before_step(self) -> float:
        if self.enabled:
            self._apply(self.running)
        return time.perf_counter()

    def after_step(self, started: float) -> None:
        if not self.enabled:
            return
        seconds = time.perf_counter() - started
        self.steps += 1
        if self.steps <= self.WARMUP:
            if self.steps == self.WARMUP:
                self._check_load()
            return
        if self.probe is not None:
            self.probe.append(seconds)
            mine = self.times[self.current]
            if len(self.probe) >= self.PROBE_STEPS or (mine and seconds > self.LOSING * _median(mine)):
                self._end_probe()
            return
        recent = self.times[self.current]
        jump = len(recent) >= 4 and seconds > self.JUMP * _median(recent)
        if jump:
            recent.clear()  # the probe is compared with the steps as they are now
        recent.append(seconds)
        del recent[:-8]
        self.since_probe += 1
        if jump or self.since_probe >= self.every:
            self.probe = []

    def _end_probe(self) -> None:
        other = self.running
        probe, self.probe = self.probe, None
        assert probe is not None  # called while a probe runs
        if len(probe) > 1:
            probe = probe[1:]  # the first step after a switch wakes the pool's threads or lets them go
        self.since_probe = 0
        mine = self.times[self.current]
        if mine and _median(probe) < self.GAIN * _median(mine):
            # the other choice is faster now; probing back will cost what the old one loses per step
            lost = _median(mine) - _median(probe)
            self.current = other
            self.times[other] = list(probe)
            self.every = max(self.PROBE_EVERY, int(lost / self.PROBE_COST / _median(probe)))
        elif mine:  # lost: wait until its extra time is PROBE_COST of the steps in between, and longer each time
            extra = sum(probe) - len(probe) * _median(mine)
            self.every = max(min(2 * self.every, self.PROBE_EVERY_MAX), int(extra / self.PROBE_COST / _median(mine)))


def _median(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2]


CpuSample = tuple[int, int, int]   # the machine's busy and total ticks, this process's ticks (/proc)


def cpu_sample() -> CpuSample | None:
    """The counters ``cores_busy_since`` compares: None where ``/proc/stat`` is not readable (not Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields), int(own[11]) + int(own[12])  # utime + stime, in clock ticks


def cores_busy_since(before: CpuSample) -> float | None:
    """How many cores other processes kept busy since ``before`` (a ``cpu_sample``): the machine's busy time
    minus this process's, in cores. None where it cannot be read, or too little time passed to tell."""
    after = cpu_sample()
    if after is None or after[1] <= before[1]:
        return None
    import os
    cores = os.cpu_count() or 1
    return max(0.0, (after[0] - before[0] - (after[2] - before[2])) / (after[1] - before[1]) * cores)
