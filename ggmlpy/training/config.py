"""What a fit is made of, as three small objects instead of long parameter lists.

``TrainingGraph`` is the graph being trained (built and owned by the caller), ``StepOptions`` how each
optimizer step runs, ``EpochPlan`` how the epochs run and report. The public fit functions check their
arguments (``core.args``) and build these once; the step runners and the loop only read them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TYPE_CHECKING, Union

import numpy as np

from ..compute.sched import Scheduler
from ..graph.objects import Context, Tensor
from ..opt.loss_scale import DynamicLossScale
from ..opt.tallies import TallySource


if TYPE_CHECKING:
    from ..opt.losses import Penalty
    from ..opt.rules import OptimizerSpec


# a callback: a dict {"on_epoch_begin": f, "on_epoch_end": f} or an object with either method, each called as
# f(epoch, logs, state) (training.callbacks.CallbackList checks them when the fit starts)
Callback = Union[Mapping[str, Callable[..., object]], object]


class ModelWeights(Protocol):
    """A model's weights as callbacks keep them: ``get()`` copies them, ``set(copy)`` restores them."""
    def get(self) -> object: ...
    def set(self, snapshot: object) -> None: ...


class StepHook(Protocol):
    """Model state that lives outside ggml-opt, kept in step with each eval (the model layer's dropout seeds are
    written before it). ``before_eval`` writes with ``write(tensor, array)``, which queues the upload ahead of the
    step (no wait; ``written``: the tensors it writes); ``after_eval`` runs once the step has been waited for."""
    @property
    def written(self) -> Sequence[Tensor]: ...
    def before_eval(self, train: bool, write: Callable[[Tensor, np.ndarray], None]) -> None: ...
    def after_eval(self, train: bool) -> None: ...


class StepMetrics(TallySource, Protocol):
    """Metrics of the training steps (the model layer's): ``reset()`` at an epoch's start, ``update(outputs,
    labels)`` after each step with the graph's output copies and the batch's labels (unless they are summed on the
    device: ``TallySource.device_stats``), ``results()`` (``{log name: value}``, in the order of ``names``) at its
    end."""
    names: list[str]

    def reset(self) -> None: ...
    def update(self, outs: list[np.ndarray], labels: list[np.ndarray]) -> None: ...
    def results(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class TrainingGraph:
    """The model graph a fit trains: its scheduler and compute context, inputs and outputs (one output per
    loss head), the heads' loss types and weights, and what the graph computes besides the loss."""
    sched: Scheduler
    ctx_compute: Context
    inputs: list[Tensor]
    outputs: list[Tensor]
    loss_types: list[int]
    loss_weights: list[float] | None = None
    loss_mask_ne0: int | None = None     # weighted MSE: the leading entries of each label row are the weights
    sample_weighted: bool = False        # a per-sample weight column comes with each batch
    side_outputs: Sequence[Tensor] = ()  # updated by training steps only (batch-norm statistics)
    head_names: list[str] | None = None  # per-head history columns (multi-head fits)
    output_copies: Sequence[Tensor] = ()  # each head's outputs, readable after a step (StepOptions.metrics reads them)
    penalties: Sequence[Penalty] = ()  # (weight, l1, l2): l1 * sum|w| + l2 * sum w^2 added to the loss (regularizers)


@dataclass(frozen=True)
class StepOptions:
    """How each step runs: the optimizer (``OPTIMIZER_ADAMW``/``_SGD``), its period (physical batches per
    logical batch), weight decay, the starting learning rate (None: ggml's default), hooks run around each
    eval (dropout masks), the samples per step (for samples/s; None: the inputs' batch), and whether the context
only accumulates gradients (a data-parallel replica, whose optimizer steps outside ggml-opt)."""
    optimizer: int
    period: int = 1
    weight_decay: float = 0.0
    learning_rate: float | None = None
    hooks: Sequence[StepHook] = ()
    batch_size: int | None = None
    gradients_only: bool = False  # a data-parallel replica: accumulate gradients, the caller steps
    adam: tuple[float, float, float] | None = None  # AdamW's (beta1, beta2, eps); None: ggml's defaults
    # metrics of the training steps: reset() at an epoch's start, update(outputs, labels) after each step with the
    # graph's output_copies and the batch's labels (numpy), results() -> {log name: value} and names at its end
    metrics: StepMetrics | None = None
    # the optimizer of a runner whose step runs outside ggml-opt (opt.rules.OptimizerSpec: momentum, RMSprop,
    # Adagrad, clipping; data-parallel replicas); None: ggml-opt's own AdamW/SGD step of ``optimizer``
    rule: OptimizerSpec | None = None
    # F16 products (ggml_compile(precision="f16")): the model's dynamic loss scale (opt.loss_scale), applied by the
    # optimizer's graph; None: no loss scaling
    loss_scale: DynamicLossScale | None = None


@dataclass(frozen=True)
class EpochPlan:   # build it with keywords after epochs: its fields grow
    """How the epochs run and report: how many (after ``initial_epoch``), steps per epoch and validation
    steps (None: until the source ends), callbacks, silence, the progress bar, batches prefetched, whether
    batches are streamed (the history gets a ``steps`` column), what a non-finite loss does, and in a
    model-layer fit the model and its weights for the callbacks."""
    epochs: int
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    callbacks: Sequence[Callback] | Callback | None = None
    silent: bool = False
    prefetch: int = 0
    stream: bool = True
    on_nonfinite: str = "raise"
    model: object = None    # the model-layer fit's model, for callbacks that save it (None in the low-level fits)
    weights: ModelWeights | None = None  # its weights as callbacks snapshot and restore them: get() and set(snapshot)
    bar: bool = True     # the progress bar over an epoch's batches (on a terminal); False: the summary line only
