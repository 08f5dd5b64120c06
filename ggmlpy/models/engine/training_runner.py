"""The step runner of one fit or trainer of a compiled model (``training_runner``), with its training graph(s) and
scheduler(s): ggml-opt's own step on one device (``training.loop.NativeRunner``), an optimizer ggml-opt lacks
(RMSprop, Adagrad, momentum, clipping: ``OptimizerSpec.fused`` False) on one device
(``training.graph_steps.GraphOptimizerRunner``), or one replica per device for a model compiled with several
backends (``training.replicas.ReplicaRunner``), the replicas' weights copied from the first replica's first. The
runner owns what is built for it here: it frees the graphs and schedulers when it closes. A model with variable
sizes gets one such runner per size of its batches, under a ``sized_runner.SizedRunner`` (``sized_runner``).
"""
from __future__ import annotations

import math

from ...backend.backend import Backend, is_software_device
from ...compute.placement import is_host_backend
from ...errors import GgmlValueError
from ...training.config import StepOptions, TrainingGraph
from ...training.graph_steps import GraphOptimizerRunner
from ...training.loop import NativeRunner
from ...training.replicas import ReplicaRunner, split_counts
from ...training.runner import StepRunner
from ..layers.regularizers import regularized_weights
from ..network.model import Model
from .compile import build_training_graph, CompileConfig
from .device_metrics import BUDGET_BYTES
from .graphs import InputShapes
from .metrics import HeadMetrics
from .runtime import make_scheduler
from .sized_runner import SizedRunner


def computes_on_host(backend: Backend) -> bool:
    """Whether ``backend``'s computations run on the host's cores: the CPU (and BLAS) or a GPU API emulated there."""
    return is_host_backend(backend) or is_software_device(backend.device)


def compiled_metrics(cfg: CompileConfig) -> HeadMetrics | None:
    """The sums of a fit's compiled metrics over its training steps (None: none compiled)."""
    return HeadMetrics(cfg.heads, cfg.head_metrics, graph_outputs=True) if any(cfg.head_metrics) else None


def training_runner(model: Model, cfg: CompileConfig, batch: int, period: int = 1,
                    sample_weighted: bool = False, input_shapes: InputShapes = None,
                    metrics: HeadMetrics | None = None) -> tuple[StepRunner, int]:
    """The runner of a fit or trainer for ``batch`` samples per step (of ``input_shapes``, where the model has
    variable sizes), ``period`` steps per optimizer step, and a bound on the nodes of its training graphs (each
    replica's). ``metrics``: the compiled metrics' sums to update (read on the host), shared by the runners of one
    fit's sizes (``sized_runner``); by default the runner's own."""
    runtime = model.runtime
    stores = runtime.stores()
    counts = [batch] if len(stores) == 1 else split_counts(batch, runtime.shares)
    if len(stores) > 1 and min(counts) < 1:
        shares = runtime.shares
        need = math.ceil(sum(shares) / min(shares) - 1e-9)  # the smallest share gets a sample from here
        raise GgmlValueError(f"a batch of {batch} sample{'s' if batch != 1 else ''} split over {len(stores)} replicas "
                             f"by shares {shares} gives {counts} samples: each replica needs at least one per step. "
                             f"Train on batches of at least {need} samples (batch_size, and at least that many "
                             "samples of data: a fit's batch is never larger than its data), give the devices "
                             "closer shares, or compile the model for one device")
    # the compiled metrics of the training steps: one sum for all replicas, summed on the devices where they fit
    shared = metrics is not None
    if not shared:
        metrics = compiled_metrics(cfg)
    # summed on the devices when the outputs live in a GPU's memory. Where the CPU's cores compute the step (the CPU,
    # a software Vulkan device such as lavapipe) the outputs cost nothing to read and numpy's bucketed AUC beats the
    # graph's comparison of every output with every threshold (measured: 0.86x on the CPU, 0.74x on lavapipe)
    on_device = not all(computes_on_host(s.backend) for s in stores)
    outputs = model.graph()[1]
    sizes = model.concrete_shapes(input_shapes) if input_shapes is not None else {id(o): o.shape for o in outputs}
    too_large = metrics is not None and on_device and not shared and \
        not metrics.device_fits(max(counts), [sizes[id(o)] for o in outputs])
    if metrics is not None:
        metrics.device = on_device and not too_large and not shared
    graphs: list[TrainingGraph] = []
    steps: list[StepOptions] = []
    owned: list[list] = []   # each replica's graph instance and scheduler, freed by its runner
    train_nodes = 0
    try:
        runtime.sync_replicas()
        for store in stores[1:]:
            store.mark_trainable()  # as the caller marked the model's own
        for store, n in zip(stores, counts):
            inst = build_training_graph(model, cfg, n, store, read_outputs=metrics is not None and not metrics.device,
                                        input_shapes=input_shapes)
            if store is stores[0]:
                runtime.graph_notes = list(inst.notes)   # for the placement report
                if too_large:
                    runtime.graph_notes.append(
                        f"the compiled metrics read the outputs back after every step: on the device they would take "
                        f"more than {BUDGET_BYTES >> 20} MiB for a batch of {n} (an AUC's thresholds times the "
                        "output's elements, or top-k's classes squared)")
            owned.append([inst])
            # the metrics' statistics on the device are computed with every step (counted as training_graph_nodes
            # counts a node: with room for its backward, which they do not have)
            nodes = inst.train_nodes + 4 * (metrics.graph_nodes() if metrics is not None else 0)
            train_nodes = max(train_nodes, nodes)  # a bound on each replica's graphs
            sched = make_scheduler(store.backend, nodes)
            owned[-1].append(sched)
            graphs.append(TrainingGraph(sched, inst.ctx, inst.inputs, inst.outputs,
                                        [h.loss_type for h in cfg.heads], cfg.loss_weights(),
                                        sample_weighted=sample_weighted, side_outputs=inst.side_outputs,
                                        head_names=[h.name for h in cfg.heads] if len(cfg.heads) > 1 else None,
                                        output_copies=inst.output_copies,
                                        penalties=[(store.tensor(layer, spec.name), reg.l1, reg.l2)
                                                   for layer, spec, reg in regularized_weights(store)]))
            steps.append(StepOptions(cfg.optimizer_type, period, cfg.weight_decay, cfg.learning_rate, inst.hooks, n,
                                     adam=cfg.adam, metrics=metrics, rule=cfg.optimizer_spec,
                                     loss_scale=runtime.loss_scale))
        # each runner frees its graph and scheduler when it closes: after its opt contexts, the scheduler before the
        # graph it computes
        frees = owned
        runner: StepRunner
        if len(stores) > 1:
            runner = ReplicaRunner(graphs, steps, stores[0].backend, [runtime.opt_state.trainable(s) for s in stores],
                                   [s.synced_tensors() for s in stores], runtime.device_names, owned=frees,
                                   sync=runtime.sync_replicas)
        elif cfg.optimizer_spec.fused and steps[0].loss_scale is None:  # loss scaling steps in the graph optimizer
            runner = NativeRunner(graphs[0], steps[0], owned=frees[0])
        else:
            runner = GraphOptimizerRunner(graphs[0], steps[0], stores[0].backend,
                                          runtime.opt_state.trainable(stores[0]), stores[0].synced_tensors(),
                                          owned=frees[0])
    except BaseException:
        for handles in reversed(owned):
            for h in reversed(handles):
                h.close()
        raise
    return runner, train_nodes


def sized_runner(model: Model, cfg: CompileConfig, batch: int, period: int, sample_weighted: bool,
                 input_shapes: InputShapes) -> SizedRunner:
    """The runner of a fit or trainer of a model with variable sizes, starting with batches of ``input_shapes``: a
    ``training_runner`` per size the batches bring (``sized_runner.SizedRunner``), one set of compiled metrics."""
    metrics = compiled_metrics(cfg)
    return SizedRunner(lambda shapes: training_runner(model, cfg, batch, period, sample_weighted, shapes, metrics)[0],
                       input_shapes, model.runtime.opt_state)
