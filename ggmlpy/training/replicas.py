"""Data-parallel training: ``ReplicaRunner``, a ``runner.StepRunner`` over K > 1 replicas of a model, each on its
own device.

Every physical batch is cut into K shards (``split_counts``: in proportion to the replicas' shares); each
replica evaluates its shard on its own gradient-only opt context, the K evaluations run at the same time (one
thread per extra replica: ggml's computes release the GIL), and at the end of each logical batch the
``GraphOptimizer`` sums the gradients on replica 0's device, steps there and sends the weights back. The fit
loop drives it as any runner: the same epochs, callbacks, history and Ctrl-C rules, written once.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backend.backend import Backend
from ..compute.placement import Placement
from ..core.handle import InterruptGuard, Lifetime
from ..errors import GgmlStateError, GgmlValueError
from ..graph.objects import Tensor
from ..opt import result as R
from ..opt.graph_optimizer import GraphOptimizer
from .adapters import BatchWriter, Target
from .config import StepOptions, TrainingGraph
from .graph_steps import gradient_runners, graph_optimizer, loss_scale_attrs
from .runner import EpochStats, opt_result_loss, Owned, Watch


def split_counts(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` samples cut in proportion to ``shares`` (largest remainders get the rest), in order; a replica
    whose share rounds to nothing gets 0."""
    weights = np.asarray(shares, dtype=np.float64)
    exact = total * weights / weights.sum()
    counts = np.floor(exact).astype(int)
    for k in np.argsort(-(exact - counts), kind="stable")[:total - int(counts.sum())]:
        counts[k] += 1
    return [int(c) for c in counts]


class ReplicaWriter:
    """Checks a whole batch and cuts it into the replicas' shards: every array's values in C order are the
    shards one after the other (the batch is the slowest axis of a ggml-layout array), each shard checked
    and converted by its replica's own writer."""

    def __init__(self, name: str, writers: Sequence[BatchWriter], batch: int) -> None:
        self.name, self.writers, self.batch = name, list(writers), batch

    def parse(self, batch: object, own: bool = False) -> list[list[tuple[Target, np.ndarray]]]:
        xs, ys, ws = self.writers[0].split(batch)
        shards: list[dict[str, list[object]]] = [{"inputs": [], "labels": [], "weights": []} for _ in self.writers]
        for kind, values in (("inputs", xs), ("labels", ys), ("weights", ws)):
            for i, value in enumerate(values):
                found = [getattr(w, kind)[i] if i < len(getattr(w, kind)) else None for w in self.writers]
                targets: list[Target] = [t for t in found if t is not None]
                if len(targets) < len(found):
                    break  # a count mismatch: the replica's writer says what was expected
                arr = np.asarray(value)
                total = sum(t.count for t in targets)
                if arr.size != total:
                    raise GgmlValueError(f"{self.name}: {kind}[{i}] holds {arr.size} values (shape {arr.shape}); a "
                                         f"batch of {self.batch} samples takes {total} (the trained batch size, "
                                         f"split over {len(self.writers)} replicas)")
                flat = arr.reshape(-1)
                inner = arr.size // arr.shape[0] if arr.ndim > 1 and arr.shape[0] else 0
                start = 0
                for shard, t in zip(shards, targets):
                    part = flat[start:start + t.count]
                    if inner and t.count % inner == 0:
                        part = part.reshape((t.count // inner,) + arr.shape[1:])
                    shard[kind].append(part)
                    start += t.count
        return [w.parse(shard, own) for w, shard in zip(self.writers, shards)]


class ReplicaResult:
    """The per-replica results of the steps evaluated since ``reset``."""

    def __init__(self, parts: Sequence[R.OptResult]) -> None:
        self.parts = list(parts)

    def reset(self) -> None:
        for r in self.parts:
            r.reset()

    def free(self) -> None:
        for r in self.parts:
            r.free()

    close = free


class ReplicaRunner:
    """Data-parallel training over K > 1 replicas (see the module's docstring). ``graphs[k]``: replica k's
    training graph (its own scheduler, inputs for its shard); ``steps[k]``: its step options (the shard's size as
    ``batch_size``, its hooks; the optimizer and period of ``steps[0]`` apply to all); ``backend``: replica 0's
    device (where the optimizer steps); ``trainable[k]``/``synced[k]``: replica k's weights for the
    ``GraphOptimizer`` (``steps[0].rule``: its optimizer; None: ggml's of ``steps[0].optimizer``); ``owned[k]``:
    handles replica k's runner frees; ``sync()``: called before each step, brings the replicas to weights changed
    outside the steps (the model layer's ``Runtime.sync_replicas``)."""

    def __init__(self, graphs: Sequence[TrainingGraph], steps: Sequence[StepOptions], backend: Backend,
                 trainable: Sequence[dict[str, Tensor]], synced: Sequence[Sequence[Tensor]],
                 devices: Sequence[str] = (), owned: Sequence[Sequence[Owned]] = (),
                 sync: Callable[[], None] | None = None) -> None:
        self.devices = list(devices)  # their names, for the history
        # before each step: copy the model's weights to the other replicas if something changed them since the last
        # step (a callback's ggml_set_weights or load; the steps themselves keep the replicas equal)
        self.sync = sync
        step = steps[0]
        counts = [s.batch_size for s in steps]
        if any(n is None for n in counts):
            raise GgmlStateError("internal: a replica's StepOptions must give its shard's batch_size; please report it")
        self.graph, self.options, self.counts = graphs[0], step, [n for n in counts if n is not None]
        self.batch_size = sum(self.counts)
        self.guard = InterruptGuard()
        self._pool: ThreadPoolExecutor | None = None
        self.optimizer: GraphOptimizer | None = None
        self.replicas = gradient_runners(graphs, steps, owned)
        try:
            self.optimizer = graph_optimizer(self.replicas, backend, trainable, synced, self.counts, step)
            self._pool = ThreadPoolExecutor(len(self.replicas) - 1, thread_name_prefix="ggmlpy-replica")
        except BaseException:
            self.close()
            raise
        self.lr_ud = self.replicas[0].lr_ud  # what callbacks and schedules change: the optimizer reads it
        self.batch_bytes = 0  # batch shards written to the replicas since the runner began
        self.batches = 0
        self.seconds = {"replicas": 0.0, "optimizer": 0.0}  # the replicas' evaluations; the sums, steps, copies

    @property
    def state(self) -> GraphOptimizer:
        """Where the model's optimizer state is read and written (made with the runner, gone once it closes)."""
        if self.optimizer is None:
            raise GgmlStateError("this data-parallel runner has been closed")
        return self.optimizer

    @property
    def placement(self) -> Placement | None:
        return self.replicas[0].placement

    def writer(self, name: str, train: bool) -> ReplicaWriter:
        return ReplicaWriter(name, [r.writer(name, train) for r in self.replicas], self.batch_size)

    def new_result(self) -> ReplicaResult:
        return ReplicaResult([R.OptResult() for _ in self.replicas])

    def result_loss(self, result: ReplicaResult) -> float:
        return sum(n / self.batch_size * opt_result_loss(r) for n, r in zip(self.counts, result.parts))

    def drain(self, final: bool = False) -> None:
        """Nothing to wait for: no step is deferred (the replicas' metrics summed on their devices are read by
        ``epoch_stats``)."""

    def epoch_stats(self, result: ReplicaResult, steps: int) -> EpochStats:
        """The replicas' statistics weighted by their shares of the batch: the batch means a single device
        computes (each replica's loss and accuracy are means over its shard)."""
        parts = [r.epoch_stats(part, steps) for r, part in zip(self.replicas, result.parts)]
        w = [n / self.batch_size for n in self.counts]

        def mean(values: list[float]) -> float:
            return math.nan if any(math.isnan(v) for v in values) else float(sum(a * b for a, b in zip(w, values)))
        stats = EpochStats(steps=steps, samples=steps * self.batch_size, loss=mean([p.loss for p in parts]),
                           accuracy=mean([p.accuracy for p in parts]))
        stats.head_loss = [mean(list(v)) for v in zip(*(p.head_loss for p in parts))]
        stats.head_accuracy = [mean(list(v)) for v in zip(*(p.head_accuracy for p in parts))]
        return stats

    def step(self, pairs: list[list[tuple[Target, np.ndarray]]], train: bool, result: ReplicaResult,
             watch: Watch | None = None, defer: bool = False) -> None:
        """One physical batch on every replica at once (replica 0 in this thread, where a watch and Ctrl-C
        apply), then the optimizer step at the end of a logical batch. Ctrl-C waits for the whole step. ``defer``
        is not taken: the optimizer step reads every replica's gradients through the host."""
        if not train:
            raise GgmlValueError("a data-parallel runner trains only; validation runs on the inference graphs")
        with self.guard.step:
            if self.sync is not None:
                self.sync()
            self.batch_bytes += sum(a.nbytes for part in pairs for _, a in part)
            self.batches += 1
            started = time.perf_counter()
            pool = self._pool
            futures = [pool.submit(r.step, p, True, part)
                       for r, p, part in zip(self.replicas[1:], pairs[1:], result.parts[1:])] if pool else []
            first: BaseException | None = None
            try:
                self.replicas[0].step(pairs[0], True, result.parts[0], watch)
            except BaseException as exc:  # noqa: BLE001 - raised once every replica has finished
                first = exc
            for f in futures:
                first = first or f.exception()
            if first is not None:
                raise first
            computed = time.perf_counter()
            self.state.accumulated()
            self.seconds["replicas"] += computed - started
            self.seconds["optimizer"] += time.perf_counter() - computed

    def split_threads(self) -> list:
        before: list = []
        for r in self.replicas:
            before += r.split_threads()
        return before

    def history_attrs(self) -> dict:
        """``history.attrs["replicas"]``: the devices, the samples each takes per batch, the bytes moved
        through the host per optimizer step (batch shards, gradients, weights) and the seconds per step spent
        in the replicas' evaluations and in the optimizer (sums, step, copies), measured over the fit."""
        opt = self.state
        steps = max(1, opt.steps)
        return {**loss_scale_attrs(opt), "replicas": {"devices": self.devices,
                             "samples": list(self.counts),
                             "bytes_per_step": {"batch": self.batch_bytes * opt.opt_period // max(1, self.batches),
                                                "gradients": opt.bytes_moved["gradients"] // steps,
                                                "weights": opt.bytes_moved["weights"] // steps},
                             "seconds_per_step": {k: v * opt.opt_period / max(1, self.batches)
                                                  for k, v in self.seconds.items()}}}

    def keepers(self) -> list[Lifetime]:
        hs: list[Lifetime] = []
        for r in self.replicas:
            hs.extend(r.keepers())
        return hs + (self.optimizer.keepers if self.optimizer is not None else [])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.optimizer is not None:
            self.optimizer.free()
            self.optimizer = None
        for r in reversed(self.replicas):
            r.close()
        self.replicas.clear()
