"""What one fit or trainer of a compiled model runs on: its training graph(s), scheduler(s) and session, built
for one device or, for a model compiled with several backends, one replica per device (``ReplicaSession``);
the replicas' weights are copied from the first replica's first. An optimizer ggml-opt does not step itself
(RMSprop, momentum, clipping: ``OptimizerSpec.fused``) runs in a ``ReplicaSession`` of one replica.
"""
from __future__ import annotations

import math
from typing import Any

from ...compute.threads import restore_threads, split_threads, training_step_work
from ...errors import GgmlValueError
from ...training.config import StepOptions, TrainingGraph
from ...training.loop import TrainingSession
from ...training.replicas import ReplicaSession, split_counts
from ..layers.regularizers import regularized_weights
from ..network.model import Model
from .compile import build_training_graph, CompileConfig
from .metrics import HeadMetrics
from .runtime import make_scheduler


class TrainingSetup:
    """The training graph(s), scheduler(s) and session of one fit or trainer for ``batch`` samples per step,
    ``period`` steps per optimizer step. ``free()`` releases them, the session first."""

    def __init__(self, model: Model, cfg: CompileConfig, batch: int, period: int = 1,
                 sample_weighted: bool = False) -> None:
        runtime = model.runtime
        stores = runtime.stores()
        self._owned: list[Any] = []
        self.work: list = []
        self.train_nodes = 0
        counts = [batch] if len(stores) == 1 else split_counts(batch, runtime.shares)
        if len(stores) > 1 and min(counts) < 1:
            shares = runtime.shares
            need = math.ceil(sum(shares) / min(shares) - 1e-9)  # the smallest share gets a sample from here
            raise GgmlValueError(f"a batch of {batch} samples split over {len(stores)} replicas by shares {shares} "
                                 f"gives {counts} samples: each replica needs at least one; use batch_size >= {need} "
                                 "(or shares closer to each other)")
        # the compiled metrics of the training steps: one sum for all replicas
        metrics = HeadMetrics(cfg.heads, cfg.head_metrics, graph_outputs=True) if any(cfg.head_metrics) else None
        try:
            graphs, steps = [], []
            runtime.sync_replicas()
            for store in stores[1:]:
                store.mark_trainable()  # as the caller marked the model's own
            for store, n in zip(stores, counts):
                inst = build_training_graph(model, cfg, n, store)
                self._owned.insert(0, inst)
                self.train_nodes = max(self.train_nodes, inst.train_nodes)  # a bound on each replica's graphs
                sched = make_scheduler(store.backend, inst.train_nodes)
                self._owned.insert(0, sched)
                graphs.append(TrainingGraph(sched, inst.ctx, inst.inputs, inst.outputs,
                                            [h.loss_type for h in cfg.heads], cfg.loss_weights(),
                                            sample_weighted=sample_weighted, side_outputs=inst.side_outputs,
                                            head_names=[h.name for h in cfg.heads] if len(cfg.heads) > 1 else None,
                                            output_copies=inst.output_copies,
                                            penalties=[(store.tensor(layer, spec.name), reg.l1, reg.l2)
                                                       for layer, spec, reg in regularized_weights(store)]))
                steps.append(StepOptions(cfg.optimizer_type, period, cfg.weight_decay, cfg.learning_rate, inst.hooks,
                                         n, adam=cfg.adam, metrics=metrics, rule=cfg.optimizer_spec))
                # replicas accumulate gradients only: their optimizer step runs on replica 0's device
                self.work.append((sched, training_step_work(inst.outputs, period if len(stores) == 1 else 2)))
            if len(stores) == 1 and cfg.optimizer_spec.fused:
                self.session: Any = TrainingSession(graphs[0], steps[0])
            else:
                self.session = ReplicaSession(graphs, steps, stores[0].backend,
                                              [runtime.opt_state.trainable(s) for s in stores],
                                              [s.synced_tensors() for s in stores], runtime.device_names)
            self._owned.insert(0, self.session)
        except BaseException:
            self.free()
            raise

    def split_threads(self) -> list:
        """Give each scheduler's CPU backends the threads of its step (a prediction in between may have
        changed them); returns what ``restore_threads`` puts back."""
        before: list = []
        for sched, work in self.work:
            before += split_threads(sched.backends, work)
        return before

    @staticmethod
    def restore_threads(before: list) -> None:
        restore_threads(before)

    def free(self) -> None:
        for h in self._owned:
            h.close()
        self._owned.clear()

    close = free
