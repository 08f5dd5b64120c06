"""A training step whose optimizer ggml-opt lacks (RMSprop, Adagrad, SGD with momentum, clipped gradients), on one
device: ``GraphOptimizerRunner``, a ``runner.StepRunner``. Each physical batch is evaluated by a gradient-only opt
context (a ``NativeRunner`` whose steps only accumulate gradients); at the end of each logical batch the
``opt.graph_optimizer.GraphOptimizer`` steps the weights as a graph of its own. ``gradient_runners`` and
``graph_optimizer`` make those two parts, for this runner and for data-parallel replicas (``replicas.py``).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..backend.backend import Backend
from ..compute.placement import Placement
from ..core.handle import InterruptGuard, Lifetime
from ..errors import GgmlStateError, GgmlValueError
from ..graph.objects import Tensor
from ..opt import result as R
from ..opt.graph_optimizer import GraphOptimizer
from ..opt.rules import OptimizerSpec
from .adapters import BatchWriter, Target
from .config import StepOptions, TrainingGraph
from .loop import NativeRunner
from .runner import EpochStats, Owned, Watch


def gradient_runners(graphs: Sequence[TrainingGraph], steps: Sequence[StepOptions],
                     owned: Sequence[Sequence[Owned]] = ()) -> list[NativeRunner]:
    """One gradient-only ``NativeRunner`` per graph (its steps accumulate gradients; the optimizer steps outside
    ggml-opt); only the first one's first training step is watched. ``owned[k]``: handles runner k frees."""
    runners: list[NativeRunner] = []
    try:
        for k, (g, step) in enumerate(zip(graphs, steps)):
            runners.append(NativeRunner(g, replace(step, period=1, gradients_only=True),
                                        owned=owned[k] if k < len(owned) else ()))
            if k:
                runners[-1].watch_first_step = False  # the first replica's step says where a step runs
    except BaseException:
        for r in reversed(runners):
            r.close()
        raise
    return runners


def graph_optimizer(runners: Sequence[NativeRunner], backend: Backend, trainable: Sequence[dict[str, Tensor]],
                    synced: Sequence[Sequence[Tensor]], counts: Sequence[int], step: StepOptions) -> GraphOptimizer:
    """The optimizer of ``step`` (``step.rule``; None: ggml's AdamW or SGD) over the runners' accumulated
    gradients, weighted by each runner's share of the batch (``counts``), stepping on ``backend``."""
    total = sum(counts)
    weights = [n / total / step.period for n in counts]
    rule = step.rule or OptimizerSpec("adamw" if step.optimizer == 0 else "sgd")
    return GraphOptimizer(backend, [r.train_ctx for r in runners], trainable, synced, weights, rule, step.period,
                          runners[0].lr_ud, step.loss_scale)


def loss_scale_attrs(optimizer: GraphOptimizer) -> dict:
    """What a fit's history says of its loss scaling (nothing without it): ``{"loss_scale": {"scale": the scale at
    its end, "skipped_steps": the steps it skipped}}``."""
    ls = optimizer.loss_scale
    return {} if ls is None else \
        {"loss_scale": {"scale": ls.scale, "skipped_steps": ls.skipped - optimizer.skipped_before}}


class GraphOptimizerRunner:
    """One device, an optimizer outside ggml-opt (see the module's docstring). ``graph``/``step``: the training
    graph and its options (``step.rule``: the optimizer); ``backend``: the device; ``trainable``/``synced``: the
    model's weights for the optimizer (see ``GraphOptimizer``); ``owned``: handles the runner frees."""

    def __init__(self, graph: TrainingGraph, step: StepOptions, backend: Backend, trainable: dict[str, Tensor],
                 synced: Sequence[Tensor], owned: Sequence[Owned] = ()) -> None:
        if step.batch_size is None:
            raise GgmlStateError("internal: a graph-optimizer step must give its batch_size; please report it")
        self.graph, self.options, self.batch_size = graph, step, step.batch_size
        self.guard = InterruptGuard()
        self.optimizer: GraphOptimizer | None = None
        [self.gradients] = gradient_runners([graph], [step], [owned])
        try:
            self.optimizer = graph_optimizer([self.gradients], backend, [trainable], [synced], [self.batch_size], step)
        except BaseException:
            self.gradients.close()
            raise
        self.lr_ud = self.gradients.lr_ud  # what callbacks and schedules change: the optimizer reads it

    @property
    def state(self) -> GraphOptimizer:
        """Where the model's optimizer state is read and written (made with the runner, gone once it closes)."""
        if self.optimizer is None:
            raise GgmlStateError("this training runner has been closed")
        return self.optimizer

    @property
    def placement(self) -> Placement | None:
        return self.gradients.placement

    def writer(self, name: str, train: bool) -> BatchWriter:
        return self.gradients.writer(name, train)

    def new_result(self) -> R.OptResult:
        return self.gradients.new_result()

    def step(self, pairs: list[tuple[Target, Any]], train: bool, result: R.OptResult,
             watch: Watch | None = None, defer: bool = False) -> None:
        """One physical batch's gradients, then the optimizer's step at the end of a logical batch, with one wait for
        both (``NativeRunner.step``'s ``then``); Ctrl-C waits for both."""
        if not train:
            raise GgmlValueError("a graph optimizer's runner trains only; validation runs on the inference graphs")
        with self.guard.step:  # the optimizer's step is queued behind the batch's, before its one wait
            self.gradients.step(pairs, True, result, watch, then=lambda: self.state.accumulated(queued=True),
                                defer=defer)

    def drain(self, final: bool = False) -> None:
        self.gradients.drain(final)

    def epoch_stats(self, result: R.OptResult, steps: int) -> EpochStats:
        return self.gradients.epoch_stats(result, steps)

    def result_loss(self, result: R.OptResult) -> float:
        return self.gradients.result_loss(result)

    def split_threads(self) -> list:
        return self.gradients.split_threads()

    def history_attrs(self) -> dict:
        """``history.attrs["loss_scale"]`` of an F16 fit: the scale at its end and the steps it skipped."""
        return loss_scale_attrs(self.state)

    def keepers(self) -> list[Lifetime]:
        return self.gradients.keepers() + (self.optimizer.keepers if self.optimizer is not None else [])

    def close(self) -> None:
        try:
            self.gradients.drain()  # a queued optimizer step reads the optimizer's memory: wait for it first
        finally:
            self.gradients.settle()
            if self.optimizer is not None:
                self.optimizer.free()
                self.optimizer = None
            self.gradients.close()
