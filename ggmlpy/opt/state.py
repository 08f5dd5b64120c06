"""The optimizer state of an opt context: AdamW's moments and the step count (patches/0008).

ggml-opt keeps, per trainable tensor, AdamW's first and second moments ``m`` and ``v``, and one
step count ``iter`` (the number of the next optimizer step, 1 before the first) from which the
bias correction ``1/(1 - beta^iter)`` is computed. Reading them after training and writing them
into a new opt context before its first step continues training exactly where it stopped (the
same trajectory as a run that never stopped); without them a new context starts with zero moments
and ``iter = 1`` (a warm restart). The model layer keeps this state across ``ggml_fit`` calls and
saves it with ``ggml_save_model(..., include_optimizer=True)``.

With gradient accumulation (``opt_period > 1``) the state is consistent only at an optimizer-step
boundary: gradients accumulated since the last step are not part of it.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import cast, TypedDict

import numpy as np

from .._ffi import lib
from ..backend.transfer import (
    as_numeric,
    ggml_backend_tensor_get_data,
    ggml_backend_tensor_set_data,
    numpy_shape,
    refuse_complex,
)
from ..core.args import int_arg
from ..errors import GgmlpyWarning, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.objects import as_tensor, Tensor
from .api import opt_ptr
from .constants import BUILD_FORWARD, ggml_opt_optimizer_name, OPTIMIZER_ADAMW
from .context import OptContext
from .rules import OPTIMIZER_NAMES


class _OptimizerStateKeys(TypedDict):
    optimizer: str
    iter: int
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]


class OptimizerState(_OptimizerStateKeys, total=False):
    """What ``ggml_opt_get_state`` returns and ``ggml_opt_set_state`` takes: the optimizer's name, the number of
    the next step, AdamW's moments by weight name; ``hparams`` the settings in use, ``slots`` the state of
    another optimizer (the model layer's optimizers beyond AdamW and SGD) by slot name."""
    hparams: dict[str, float]
    slots: dict[str, dict[str, np.ndarray]]


def ggml_opt_grad_m(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
    """AdamW's first moment (the running mean of the gradients) of a trainable tensor.

    A tensor of the node's shape in the opt context's own buffer (on the scheduler's first backend),
    updated in place by every optimizer step: read it with ``ggml_backend_tensor_get_data``, write it
    with ``ggml_backend_tensor_set_data``. For dynamic graphs it is only found between
    ``ggml_opt_prepare_alloc`` and ``ggml_opt_eval`` (after the first ``ggml_opt_alloc``).

    Arguments:
        opt_ctx: [glossary]
        node: a tensor of the model marked with ``ggml_set_param``.

    Value: a Tensor, or None for a tensor that is not a trainable parameter of the context, for SGD
    (no moments) and for forward-only contexts.

    Example:
        >>> m = ggml_backend_tensor_get_data(ggml_opt_grad_m(opt_ctx, w))
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_grad_m")
    return opt_ctx.tensor(lib.ggml_opt_grad_m(ptr, as_tensor(node, "ggml_opt_grad_m(node)").ptr))


def ggml_opt_grad_v(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
    """AdamW's second moment (the running mean of the squared gradients) of a trainable tensor.

    Like ``ggml_opt_grad_m``: a tensor of the node's shape in the opt context's buffer, updated in
    place by every optimizer step.

    Arguments:
        opt_ctx: [glossary]
        node: a tensor of the model marked with ``ggml_set_param``.

    Value: a Tensor, or None for a tensor that is not a trainable parameter of the context, for SGD
    and for forward-only contexts.

    Example:
        >>> v = ggml_backend_tensor_get_data(ggml_opt_grad_v(opt_ctx, w))
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_grad_v")
    return opt_ctx.tensor(lib.ggml_opt_grad_v(ptr, as_tensor(node, "ggml_opt_grad_v(node)").ptr))


def ggml_opt_get_iter(opt_ctx: OptContext) -> int:
    """The number of the next optimizer step of an opt context (1 before the first step).

    Every optimizer step (every ``opt_period``-th training eval) uses it for AdamW's bias correction,
    ``1/(1 - beta1^iter)`` and ``1/(1 - beta2^iter)``, then adds 1. ``ggml_opt_reset(opt_ctx, True)``
    sets it back to 1.

    Arguments:
        opt_ctx: [glossary]

    Value: an int >= 1.

    Example:
        >>> ggml_opt_get_iter(opt_ctx) - 1          # optimizer steps taken so far
        20
    """
    return int(lib.ggml_opt_get_iter(opt_ptr(opt_ctx, "ggml_opt_get_iter")))


def ggml_opt_set_iter(opt_ctx: OptContext, iter: int) -> None:
    """Set the number of the next optimizer step (the bias correction of AdamW's next step).

    Together with the moments (``ggml_opt_grad_m``/``ggml_opt_grad_v``) it continues a training run in
    a new opt context; ``ggml_opt_set_state`` does all of it.

    Arguments:
        opt_ctx: [glossary]
        iter: an int >= 1 (else GgmlValueError): 1 + the number of optimizer steps already taken.

    Value: None.

    Example:
        >>> ggml_opt_set_iter(opt_ctx, 21)          # the next step is the 21st
    """
    ptr = opt_ptr(opt_ctx, "ggml_opt_set_iter")
    lib.ggml_opt_set_iter(ptr, int_arg("ggml_opt_set_iter", "iter", iter, 1, MAX_ITER))


MAX_ITER = 2 ** 62 - 1  # 1 + the optimizer steps taken: ggml computes beta ** iter in float


def _params(params: object, fn: str) -> dict[str, Tensor]:
    """name -> Tensor from a dict or a list of named tensors."""
    if isinstance(params, dict):
        out = {}
        for key, t in params.items():
            if not isinstance(key, str) or not key:
                raise GgmlTypeError(f"{fn}: params keys must be non-empty names, got {key!r}")
            out[key] = as_tensor(t, f"{fn}(params[{key!r}])")
        return out
    if isinstance(params, (list, tuple)):
        out = {}
        for i, t in enumerate(params):
            t = as_tensor(t, f"{fn}(params[{i}])")
            if not t.name:
                raise GgmlValueError(f"{fn}: params[{i}] has no name; name it with ggml_set_name or pass a dict "
                                     "name -> tensor")
            if t.name in out:
                raise GgmlValueError(f"{fn}: two tensors are named '{t.name}'; names must be unique")
            out[t.name] = t
        return out
    raise GgmlTypeError(f"{fn}: params must be a dict name -> Tensor or a list of named Tensors, "
                        f"got {type(params).__name__}")


def optimized_params(opt_ctx: OptContext, params: dict) -> dict:
    """The tensors of ``params`` (name -> Tensor) that the opt context's AdamW keeps moments for: a weight no
    loss depends on (an LSTM's recurrent kernel over one step) gets no gradient and no moments from ggml.
    Static graphs (moments are reachable at any time); SGD keeps none, so every tensor is returned."""
    if opt_ctx.optimizer != OPTIMIZER_ADAMW:
        return dict(params)
    return {k: t for k, t in params.items() if opt_ctx.tensor(lib.ggml_opt_grad_m(opt_ctx.ptr, t.ptr)) is not None}


def _check_training_ctx(opt_ctx: OptContext, fn: str) -> None:
    opt_ptr(opt_ctx, fn)
    if opt_ctx.build_type == BUILD_FORWARD:
        raise GgmlStateError(f"{fn}: this opt context was built forward-only (build type FORWARD): it has no "
                             "optimizer state")


def _moments(opt_ctx: OptContext, name: str, t: Tensor, fn: str) -> tuple[Tensor, Tensor]:
    m = opt_ctx.tensor(lib.ggml_opt_grad_m(opt_ctx.ptr, t.ptr))
    v = opt_ctx.tensor(lib.ggml_opt_grad_v(opt_ctx.ptr, t.ptr))
    if m is None or v is None:
        hint = "" if opt_ctx.static else (" (dynamic graphs: the moments are reachable between ggml_opt_alloc and "
                                          "ggml_opt_eval only)")
        raise GgmlValueError(f"{fn}: '{name}' is not a trainable tensor of this opt context (not marked with "
                             f"ggml_set_param, or not reachable from its outputs){hint}")
    return m, v


def _hparams(opt_ctx: OptContext) -> dict[str, float]:
    p = opt_ctx.lr_ud.params
    if opt_ctx.optimizer == OPTIMIZER_ADAMW:
        return {"learning_rate": float(p.adamw.alpha), "beta1": float(p.adamw.beta1), "beta2": float(p.adamw.beta2),
                "eps": float(p.adamw.eps), "weight_decay": float(p.adamw.wd)}
    return {"learning_rate": float(p.sgd.alpha), "weight_decay": float(p.sgd.wd)}


def _check_boundary(opt_ctx: OptContext, fn: str) -> None:
    if opt_ctx.pending_batches != 0:
        raise GgmlStateError(f"{fn}: {opt_ctx.pending_batches} of {opt_ctx.opt_period} batches of a logical batch are "
                             "accumulated and not yet applied; the optimizer state is consistent only at an optimizer "
                             "step: finish the logical batch first" + (" (or pass allow_partial=True to get the "
                                                                        "state of the last step)"
                                                                        if fn == "ggml_opt_get_state" else ""))


def ggml_opt_get_state(opt_ctx: OptContext, params: Mapping[str, Tensor] | Sequence[Tensor],
                       allow_partial: bool = False) -> OptimizerState:
    """The optimizer state of an opt context as numpy arrays: AdamW's moments, the step count, the settings.

    What ``ggml_opt_set_state`` writes into another opt context (of the same model, on any backend) so that
    training continues on the same trajectory instead of restarting the optimizer. SGD has no moments;
    its state is the step count only.

    Arguments:
        opt_ctx: a training opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        params: the trainable tensors to read the moments of: a dict name -> Tensor, or a list of named
            Tensors; the names key the result.
        allow_partial: with gradient accumulation (``opt_period > 1``), reading in the middle of a logical
            batch raises GgmlStateError unless True (the default False); True returns the state of the last
            optimizer step (the gradients accumulated since are not part of it).

    Value: a dict ``{"optimizer": "adamw" | "sgd", "iter": int, "m": {name: float32 array},
    "v": {name: float32 array}, "hparams": {...}}``; each array has its tensor's numpy shape;
    ``hparams`` holds the learning rate, weight decay and (AdamW) beta1, beta2 and eps in use.

    Example:
        >>> state = ggml_opt_get_state(opt_ctx, {"w": w, "b": b})    # w: ne [784, 128]
        >>> state["iter"], state["m"]["w"].shape
        (41, (128, 784))
    """
    fn = "ggml_opt_get_state"
    _check_training_ctx(opt_ctx, fn)
    named = _params(params, fn)
    if not allow_partial:
        _check_boundary(opt_ctx, fn)
    state: OptimizerState = {"optimizer": ggml_opt_optimizer_name(opt_ctx.optimizer),
                             "iter": int(lib.ggml_opt_get_iter(opt_ctx.ptr)), "m": {}, "v": {},
                             "hparams": _hparams(opt_ctx)}
    if opt_ctx.optimizer == OPTIMIZER_ADAMW:
        for name, t in named.items():
            m, v = _moments(opt_ctx, name, t, fn)
            shape = numpy_shape(t)
            state["m"][name] = ggml_backend_tensor_get_data(m).reshape(shape)
            state["v"][name] = ggml_backend_tensor_get_data(v).reshape(shape)
    return state


def check_state(state: object, fn: str) -> OptimizerState:
    """The state dict's structure (not its fit to a context)."""
    if not isinstance(state, dict) or not all(k in state for k in ("optimizer", "iter", "m", "v")):
        raise GgmlTypeError(f"{fn}: state must be a dict from ggml_opt_get_state (keys optimizer, iter, m, v), "
                            f"got {type(state).__name__}")
    if state["optimizer"] not in OPTIMIZER_NAMES:
        raise GgmlValueError(f"{fn}: state['optimizer'] must be one of {', '.join(map(repr, OPTIMIZER_NAMES))}, got "
                             f"{state['optimizer']!r}")
    int_arg(fn, "state['iter']", state["iter"], 1, MAX_ITER)
    for key in ("m", "v"):
        if not isinstance(state[key], dict):
            raise GgmlTypeError(f"{fn}: state[{key!r}] must be a dict name -> array")
    slots = state.get("slots", {})
    if not isinstance(slots, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in slots.items()):
        raise GgmlTypeError(f"{fn}: state['slots'] must be a dict slot name -> dict name -> array (an optimizer's "
                            "state beyond AdamW's m and v)")
    if set(state["m"]) != set(state["v"]):
        raise GgmlValueError(f"{fn}: state['m'] and state['v'] must hold the same names")
    return cast(OptimizerState, state)  # its keys checked above


def ggml_opt_set_state(opt_ctx: OptContext, state: OptimizerState,
                       params: Mapping[str, Tensor] | Sequence[Tensor]) -> None:
    """Write an optimizer state (from ``ggml_opt_get_state``) into an opt context: training continues from it.

    Call it before the context's first optimizer step (or at any optimizer-step boundary). Every tensor of
    ``params`` gets its moments from the state and the step count is set, so the next step is the one the
    saved run would have taken next. Checked first, nothing written on error: the optimizer must be the
    state's (AdamW moments cannot go into an SGD context: GgmlValueError), every name of ``params`` must be
    in the state with the tensor's shape, and no accumulation period may be open. Other names of the state
    are ignored. The learning rate and weight decay stay the context's; moments made with other betas only
    warn (GgmlpyWarning), as the bias correction would not match.

    Arguments:
        opt_ctx: a training opt context (from ``ggml_opt_init`` or ``ggml_opt_init_for_fit``).
        state: a dict from ``ggml_opt_get_state`` (or with the same keys).
        params: the trainable tensors to write the moments of: a dict name -> Tensor, or a list of named
            Tensors, matched to the state by name.

    Value: None.

    Example:
        >>> state = ggml_opt_get_state(old_ctx, {"w": w, "b": b})
        >>> ggml_opt_set_state(new_ctx, state, {"w": w, "b": b})
    """
    fn = "ggml_opt_set_state"
    _check_training_ctx(opt_ctx, fn)
    state = check_state(state, fn)
    named = _params(params, fn)
    _check_boundary(opt_ctx, fn)
    mine = ggml_opt_optimizer_name(opt_ctx.optimizer)
    if state["optimizer"] != mine:
        raise GgmlValueError(f"{fn}: the state is {state['optimizer']}'s but this opt context uses {mine}; "
                             "compile with the same optimizer, or start without the saved state")
    plan = []
    if opt_ctx.optimizer == OPTIMIZER_ADAMW:
        for name, t in named.items():
            if name not in state["m"]:
                raise GgmlValueError(f"{fn}: the state has no moments for '{name}' (it has: {sorted(state['m'])})")
            shape = numpy_shape(t)
            arrays = []
            for key in ("m", "v"):
                where = f"{fn}: state[{key!r}]['{name}']"
                a = as_numeric(state[key][name], where)
                refuse_complex(a, np.dtype(np.float32), where)
                if a.size != t.nelements() or tuple(d for d in a.shape if d != 1) != tuple(d for d in shape if d != 1):
                    raise GgmlValueError(f"{where} has shape {a.shape}, the tensor {shape}")
                with np.errstate(over="ignore", invalid="ignore"):
                    a = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
                if not np.isfinite(a).all() or (key == "v" and (a < 0).any()):
                    sign = " >= 0 (squared gradients)" if key == "v" else ""
                    raise GgmlValueError(f"{where} must hold finite float32 values{sign}; "
                                         "one NaN, inf or negative second moment makes the weight NaN at the next step")
                arrays.append(a)
            plan.append((name, t, arrays))
        _warn_betas(state.get("hparams"), _hparams(opt_ctx), fn)
    for name, t, (m_value, v_value) in plan:
        m, v = _moments(opt_ctx, name, t, fn)
        ggml_backend_tensor_set_data(m, m_value)
        ggml_backend_tensor_set_data(v, v_value)
    lib.ggml_opt_set_iter(opt_ctx.ptr, int(state["iter"]))


def _warn_betas(saved: object, mine: dict[str, float], fn: str) -> None:
    if not isinstance(saved, dict):
        return
    for key in ("beta1", "beta2"):
        value = saved.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value) and not math.isclose(value, mine[key],
                                                                                       rel_tol=1e-6):
            warnings.warn(f"{fn}: the moments were made with {key}={value:g}, this opt context uses "
                          f"{key}={mine[key]:g}: the bias correction will not match them", GgmlpyWarning,
                          stacklevel=3)
