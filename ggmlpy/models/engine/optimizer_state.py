"""The optimizer's state of a compiled model, kept across fits and trainers (``OptimizerState``), and the lease
that lets one training session at a time step the optimizer."""
from __future__ import annotations

import threading
import warnings
import weakref

import numpy as np

from ...errors import GgmlInUseError, GgmlpyWarning, GgmlValueError
from ...graph.objects import Tensor
from ...opt.context import OptContext
from ...opt.graph_optimizer import GraphOptimizer
from ...opt.rules import OptimizerSpec
from ...opt.state import check_state, ggml_opt_get_state, ggml_opt_set_state, optimized_params
from ...opt.state import OptimizerState as OptimizerStateDict
from ..network.parameters import ParamStore, strip_leading_ones


class OptimizerState:
    """The optimizer's state of a compiled model, kept across ``ggml_fit`` calls and trainers (as Keras keeps
    it in ``model.optimizer``): AdamW's moments per trainable weight, keyed "<layer>.<weight>" (another
    optimizer's slots under ``"slots"``: a momentum, RMSprop's velocity, ...), and the step count, as numpy
    arrays (``ggml_opt_get_state``'s dict). None after ``ggml_compile``: the first fit
    starts the optimizer afresh. Each new opt context gets it before its first step (``restore``) and gives
    it back after its last (``keep``), so consecutive fits continue one trajectory."""

    def __init__(self, params: ParamStore) -> None:
        self.params = params
        self.state: OptimizerStateDict | None = None
        # the running session's optimizer (restore to keep), held weakly: the model owns no training object
        self._live: weakref.ref[OptContext | GraphOptimizer] | None = None
        self._lock = threading.Lock()
        self._holder: tuple[object, str, weakref.ref[object] | None] | None = None  # lease, who, owner

    def begin(self, who: str, fn: str | None = None, owner: object = None) -> object:
        """Take the optimizer for one training session (a fit, or a trainer from its first step until it is
        freed); returns the lease for ``end``. Two sessions on one model would each overwrite the other's
        optimizer steps, so a second one is refused with GgmlInUseError. ``owner`` (a trainer) is held
        weakly: a trainer dropped without ``free()`` gives the lease up when it is collected."""
        with self._lock:
            if self._holder is not None and self._holder[2] is not None and self._holder[2]() is None:
                self._holder = None  # its trainer was dropped without free()
            if self._holder is not None:
                raise GgmlInUseError(f"{fn or who}: this model is already being trained by {self._holder[1]}; two "
                                     "training sessions on one model would each drop the other's optimizer steps. "
                                     "Wait for the other to end (a ggml_fit), or free it first (trainer.free())")
            lease = object()
            self._holder = (lease, who, weakref.ref(owner) if owner is not None else None)
            return lease

    def end(self, lease: object) -> None:
        with self._lock:
            if self._holder is not None and self._holder[0] is lease:
                self._holder = None

    def trainable(self, store: ParamStore | None = None) -> dict[str, Tensor]:
        """The weights the optimizer updates (as ``ParamStore.mark_trainable`` flags them), in the model's
        store or in a replica's ``store``."""
        store = store or self.params
        return {f"{layer.name}.{p.name}": store.tensor(layer, p.name) for layer, p in store.specs
                if layer.trains(p)}

    def restore(self, opt_ctx: OptContext | GraphOptimizer) -> None:
        """Write the kept state into a new opt context, or a replicas' optimizer (a weight without kept
        moments starts from zero). Until ``keep``, ``current`` reads the state from it."""
        self._live = weakref.ref(opt_ctx)
        if self.state is None:
            return
        if isinstance(opt_ctx, GraphOptimizer):
            opt_ctx.set_state(self.state)
            return
        params = optimized_params(opt_ctx, self.trainable())
        if self.state["optimizer"] == "adamw":
            params = {k: t for k, t in params.items() if k in self.state["m"]}
        ggml_opt_set_state(opt_ctx, self.state, params)

    def read(self, opt_ctx: OptContext | GraphOptimizer) -> OptimizerStateDict:
        """The state of an opt context (or a replicas' optimizer) now; inside a logical batch, that of its last
        optimizer step."""
        if isinstance(opt_ctx, GraphOptimizer):
            return opt_ctx.get_state()
        return ggml_opt_get_state(opt_ctx, optimized_params(opt_ctx, self.trainable()), allow_partial=True)

    def keep(self, opt_ctx: OptContext | GraphOptimizer, warn_partial: bool = True) -> None:
        """Read the state back from an opt context after training (also after an exception). Moments of
        weights that were frozen in this run are kept from before. The state is stored before the warning
        about a partial logical batch, so a warning turned into an error (``-W error``) loses no steps."""
        try:
            self.state = self._merged(opt_ctx)
        finally:  # also when it cannot be read (a lost RPC server): the session is over, its context goes
            self._live = None
        if opt_ctx.pending_batches and warn_partial:
            warnings.warn(f"training ended {opt_ctx.pending_batches} batches into a logical batch of "
                          f"{opt_ctx.opt_period} (nbatch_logical): their gradients were not applied, and the "
                          "optimizer state kept for the next fit is that of the last optimizer step; make the number "
                          f"of steps a multiple of {opt_ctx.opt_period} to continue exactly", GgmlpyWarning,
                          stacklevel=2)

    def current(self) -> OptimizerStateDict | None:
        """The state that goes with the weights now (a snapshot's: ``ggml_save_model(include_optimizer=True)``, a
        pickle or deepcopy): while a fit or trainer runs, its optimizer's, read at once (callbacks run between
        steps); else the one kept."""
        live = self._live() if self._live is not None else None
        return self.state if live is None or not live.alive else self._merged(live)

    def _merged(self, opt_ctx: OptContext | GraphOptimizer) -> OptimizerStateDict:
        """The state of ``opt_ctx`` now, with the kept moments of weights it does not train (frozen in this run)."""
        new = _complete(self.read(opt_ctx), getattr(opt_ctx, "spec", None))
        old = self.state
        if old is not None and old["optimizer"] == new["optimizer"]:
            for key in ("m", "v"):
                new[key] = {**{k: v for k, v in old[key].items() if k not in new[key]}, **new[key]}
            old_slots, new_slots = old.get("slots") or {}, new.get("slots") or {}
            for slot in set(old_slots) & set(new_slots):
                new_slots[slot] = {**{k: v for k, v in old_slots[slot].items() if k not in new_slots[slot]},
                                   **new_slots[slot]}
        return new

    def set(self, state: object, spec: OptimizerSpec, what: str) -> None:
        """Adopt a state read from a file: checked against the weights and the compiled optimizer first."""
        if state is None:
            self.state = None
            return
        state = check_state(state, what)
        if state["optimizer"] != spec.name:
            raise GgmlValueError(f"{what}: the file holds {state['optimizer']}'s optimizer state but the model is "
                                 f"compiled with {spec.name}; compile it with optimizer='{state['optimizer']}' or load "
                                 "without include_optimizer (a warm restart)")
        slots = state.get("slots") or {}
        extra = sorted(set(slots) - set(spec.slots))
        if extra:
            raise GgmlValueError(f"{what}: the optimizer state keeps {extra} per weight, which {spec.name} as compiled "
                                 f"does not (its state: {list(spec.slots) or 'none'}); compile with the settings it "
                                 "was saved with (momentum=, centered=) or load without include_optimizer")
        shapes = {f"{layer.name}.{p.name}": tuple(reversed(p.ne)) for layer, p in self.params.specs}
        kinds = {"m": state["m"], "v": state["v"], **slots}
        for key, values in kinds.items():
            for name, value in values.items():
                if name not in shapes:
                    raise GgmlValueError(f"{what}: the optimizer state has {key} for '{name}', which this model "
                                         "does not have (another architecture?)")
                if strip_leading_ones(np.shape(value)) != strip_leading_ones(shapes[name]):
                    raise GgmlValueError(f"{what}: the optimizer state's {key} for '{name}' has shape "
                                         f"{np.shape(value)}, the weight {shapes[name]} (another architecture?)")
                value = np.asarray(value)
                positive = key in ("v", "velocity", "accumulator")  # sums of squares
                if not np.issubdtype(value.dtype, np.floating) or not np.isfinite(value).all() or \
                        positive and (value < 0).any():
                    raise GgmlValueError(f"{what}: the optimizer state's {key} for '{name}' is damaged (it must hold "
                                         "finite floats" + (", >= 0" if positive else "") + f", got {value.dtype} "
                                         "values out of that range); load without include_optimizer (a warm restart)")
        as_f32 = {key: {k: np.asarray(v, np.float32).reshape(shapes[k]) for k, v in values.items()}
                  for key, values in kinds.items()}
        self.state = {**state, "m": as_f32.pop("m"), "v": as_f32.pop("v")}
        if as_f32:
            self.state["slots"] = as_f32
        self.state = _complete(self.state, spec)


def _complete(state: OptimizerStateDict, spec: OptimizerSpec | None) -> OptimizerStateDict:
    """``state`` with every slot of ``spec`` (beyond AdamW's m/v) held for every weight any slot holds, at the
    slot's initial value where it had none: a file saved with fewer settings (RMSprop without momentum loaded
    into one with) gains the new slot for every weight, not only for those the next fit trains."""
    if spec is None or spec.name == "adamw" or not spec.slots:
        return state
    slots = {k: dict(v) for k, v in (state.get("slots") or {}).items()}
    shapes = {name: np.shape(a) for values in slots.values() for name, a in values.items()}
    for slot in spec.slots:
        values = slots.setdefault(slot, {})
        for name, shape in shapes.items():
            if name not in values:
                values[name] = np.full(shape, spec.initial(slot), np.float32)
    return {**state, "slots": slots}
