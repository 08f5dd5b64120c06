"""``ggml_model_placement``: where each op of a compiled model's training step (or forward pass) runs;
``ggml_model_profile``: how long each op of a training step takes."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..compute.placement import Placement, PlacementRecorder
from ..compute.profile import GraphNodeTimer, node_timer, Profile
from ..core.args import is_int
from ..errors import GgmlInUseError, GgmlValueError
from .engine.compile import CompileConfig, compiled
from .engine.inputs import model_inputs
from .engine.predict import predict_arrays
from .network.model import Model
from .trainer import step_placement, watched_steps


def ggml_model_placement(model: Model, batch_size: int | None = None, training: bool = True) -> Placement:
    """Where one training step (or one forward pass) of a compiled model runs, op by op.

    ggml's scheduler gives every op of a graph to a backend: the model's device where it has the op, else the
    CPU, with copies between the two wherever the graph crosses. On a GPU every such crossing costs a transfer
    over the bus each step, so a training step that stays on the device runs in **one split with no copies**.
    This runs one step on zeros (``training=True``: forward, backward and optimizer, as ``ggml_fit`` does; the
    weights, batch-norm statistics and optimizer state are put back afterwards) or one prediction
    (``training=False``) and reports what the scheduler did.

    Arguments:
        model: a compiled model (``ggml_compile``), on any backend.
        batch_size: the samples per step (default 32, ``ggml_fit``'s default); placement can depend on it.
            A variable size of the inputs (``ggml_input(shape=(None, ...))``) is taken as 32.
        training: True (the default) for a training step, False for an inference pass (``ggml_predict``).

    Value: a ``Placement`` with ``n_splits``; ``cpu_ops`` (the names of the ops a CPU-side backend computed, each
    once; empty when none did); ``copies`` and ``copy_bytes`` (tensors copied between backends per step);
    ``devices`` (the backends that computed something); ``splits`` (each part's backend and ops in order);
    ``op_counts()``; ``notes`` (what a layer built in a slower form than the device allows, and why: a recurrent
    layer with recurrent dropout or a padding mask steps one by one where the device has the whole-sequence op);
    ``str()`` lists it all readably. The batch's inputs and labels are written into device memory directly and are
    not counted as copies.

    Example:
        >>> model = g.ggml_compile(model, loss="sparse_categorical_crossentropy", backend="vulkan")
        >>> p = g.ggml_model_placement(model, batch_size=100)
        >>> p.n_splits, p.cpu_ops, p.copy_bytes
        (1, [], 0)
        >>> print(p)                                 # one line per split, the ops counted
    """
    fn = "ggml_model_placement"
    cfg = compiled(model, fn)
    batch = 32 if batch_size is None else batch_size
    if not is_int(batch) or batch < 1:
        raise GgmlValueError(f"{fn}: batch_size must be an int >= 1 or None, got {batch_size!r}")
    if not isinstance(training, (bool, np.bool_)):
        raise GgmlValueError(f"{fn}: training must be True or False, got {training!r}")
    batch = int(batch)
    runtime = model.runtime
    if runtime.training:
        raise GgmlInUseError(f"{fn}: a fit of this model is running (this call comes from one of its callbacks or "
                             "from another thread); ask after it returns")
    xs = _zero_inputs(model, batch)
    if training:
        return step_placement(model, batch, xs, _zero_targets(model, cfg, xs))
    recorders: list[PlacementRecorder] = []

    def watch(sched: Any) -> PlacementRecorder:
        recorders.append(PlacementRecorder(sched))
        return recorders[-1]
    predictor = runtime.predictor

    class Watched:  # the predictor's run, with the compute watched
        def run(self, arrays: list[np.ndarray], n: int) -> list[np.ndarray]:
            return predictor.run(arrays, n, watch)
    with runtime.use():
        predict_arrays(model, Watched(), model_inputs(model, xs, f"{fn}: x"), batch)
    return recorders[0].placement(f"forward pass of '{model.name}', batch {batch}")


def ggml_model_profile(model: Model, batch_size: int | None = None, steps: int = 3) -> Profile:
    """How long each op of a compiled model's training step takes, node by node, on zero data.

    It runs one unmeasured step (allocations), then ``steps`` training steps (forward, backward and optimizer,
    as ``ggml_fit`` does) with every node timed, then ``steps`` plain steps for the step's own time. On the CPU
    alone, the nodes are timed inside the step's one graph as ggml computes it (``method`` "in one graph"): ops
    the CPU computes in one pass are one entry (``"STEP+MUL"``, ``"ADD+RELU"``), and the nodes add up to the
    step's compute. Elsewhere (a GPU, ggml's BLAS backend) ggml's scheduler computes each node as a graph of its
    own to time it (``method`` "node by node"), so each node also pays a graph launch (the thread pool's start
    and end, or a device's submit) and nothing is fused: the nodes add up to more than the plain step, by about
    that launch times the node count. Use it to see which ops dominate a step and which backend runs them
    (``BLAS`` for products that ggml's BLAS backend takes, ``CPU`` for ggml's own kernels). The weights,
    batch-norm statistics and optimizer state are put back afterwards.

    Arguments:
        model: a compiled model (``ggml_compile``), on any backend.
        batch_size: the samples per step (default 32, ``ggml_fit``'s default); a variable size of the inputs is
            taken as 32.
        steps: how many timed steps the figures average over (>= 1).

    Value: a ``Profile``: ``by_op()`` gives ``(op, backend, nodes per step, seconds per step)`` slowest first,
    ``slowest(k)`` the k slowest nodes with their shapes, ``nodes_per_step``, ``node_seconds`` (the nodes'
    total per step), ``step_seconds`` (the best plain step), ``method`` and ``nodes`` (every timing); ``str()``
    is a table.

    Example:
        >>> model = g.ggml_compile(model, loss="sparse_categorical_crossentropy")
        >>> print(g.ggml_model_profile(model, batch_size=100))   # one row per op, slowest first
        >>> g.ggml_model_profile(model, batch_size=100).by_op()[0]
        ('MUL_MAT', 'BLAS', 3, 0.0021...)
    """
    fn = "ggml_model_profile"
    cfg = compiled(model, fn)
    batch = 32 if batch_size is None else batch_size
    if not is_int(batch) or batch < 1:
        raise GgmlValueError(f"{fn}: batch_size must be an int >= 1 or None, got {batch_size!r}")
    if not is_int(steps) or steps < 1:
        raise GgmlValueError(f"{fn}: steps must be an int >= 1, got {steps!r}")
    if model.runtime.training:
        raise GgmlInUseError(f"{fn}: a fit of this model is running (this call comes from one of its callbacks or "
                             "from another thread); ask after it returns")
    batch, steps = int(batch), int(steps)
    xs = _zero_inputs(model, batch)
    recorder: list[PlacementRecorder] = []

    def watcher(sched: Any) -> Any:
        # the unmeasured first step records where the step runs; on the CPU alone the others are timed inside
        # its graph
        if not recorder:
            recorder.append(PlacementRecorder(sched))
            return recorder[0]
        return node_timer(sched, recorder[0].placement("").devices)
    watched, best = watched_steps(model, batch, xs, _zero_targets(model, cfg, xs), watcher, steps + 1, timed=steps)
    timers = watched[1:]
    nodes = [n for t in timers for n in t.nodes]
    method = "in one graph" if isinstance(timers[0], GraphNodeTimer) else "node by node"
    return Profile(f"training step of '{model.name}', batch {batch}", steps, nodes, best, method)


# a variable size (None) of a model's inputs, in the step the placement and the profile run
REPORT_SIZE = 32


def _zero_inputs(model: Model, batch: int) -> list[np.ndarray]:
    return [np.zeros((batch,) + tuple(REPORT_SIZE if d is None else d for d in n.shape),
                     dtype=np.int32 if n.dtype == "int32" else np.float32)
            for n in model.graph()[0]]


def _zero_targets(model: Model, cfg: CompileConfig, xs: list[np.ndarray]) -> list[np.ndarray]:
    """Labels every loss accepts, for the outputs of inputs ``xs``: class 0 for the cross-entropies, zeros for the
    others."""
    batch = xs[0].shape[0]
    sizes = model.concrete_shapes([x.shape[1:] for x in xs])
    out: list[np.ndarray] = []
    for h, node in zip(cfg.heads, model.graph()[1]):
        shape = tuple(sizes[id(node)])
        if h.sparse:
            out.append(np.zeros((batch,) + shape[:-1], dtype=np.int64))
        elif h.classification and h.loss != "binary_crossentropy":
            y = np.zeros((batch,) + shape, dtype=np.float32)
            y[..., 0] = 1.0
            out.append(y)
        else:
            out.append(np.zeros((batch,) + shape, dtype=np.float32))
    return out
