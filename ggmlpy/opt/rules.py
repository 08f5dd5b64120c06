"""Optimizers as ggml graphs: what an ``OptimizerSpec`` names (Keras' optimizers and gradient clipping), checked
once, and the ops of one optimizer step built from it, so every rule runs on every backend.

AdamW and plain SGD are ggml's own fused step ops (what ggml-opt runs); SGD with momentum (and Nesterov),
RMSprop and Adagrad are element-wise ops with Keras 3's update rules (``w`` a weight, ``g`` its gradient)::

    SGD, momentum mu:  m = mu*m - lr*g;  w += m         (Nesterov: w += mu*m - lr*g)
    RMSprop:           v = rho*v + (1-rho)*g^2;  d = v + eps
                       (centered: a = rho*a + (1-rho)*g;  d = v - a^2 + eps)
                       s = lr*g / sqrt(d);  w -= s      (momentum mu: m = mu*m + s;  w -= m)
    Adagrad:           acc += g^2;  w -= lr*g / sqrt(acc + eps)   (acc starts at initial_accumulator_value)

Decoupled weight decay comes first, as in Keras and ggml: ``w *= 1 - lr*wd``. Gradients are clipped before the
rule (Keras' order; one kind at a time): ``clipnorm`` scales each weight's gradient to an L2 norm of at most
``c``, ``global_clipnorm`` all of them together by their joint norm, ``clipvalue`` clamps every element to
``[-c, c]``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .._ffi import CData, lib
from ..core.args import FLOAT32_MAX, is_real
from ..errors import GgmlValueError
from ..graph.objects import Context, Tensor
from ..ops.elementwise import (
    ggml_add,
    ggml_clamp,
    ggml_div,
    ggml_mul,
    ggml_scale,
    ggml_scale_bias,
    ggml_sqr,
    ggml_sqrt,
    ggml_sub,
)
from ..ops.layout import ggml_cpy, ggml_view_1d
from ..ops.reduce import ggml_sum
from .constants import OPTIMIZER_ADAMW, OPTIMIZER_SGD


OPTIMIZER_NAMES = ("adamw", "sgd", "rmsprop", "adagrad")
# Keras' defaults of the settings this module reads; epsilon None: Adam's comes from ggml's parameters
_DEFAULTS = {"momentum": 0.0, "nesterov": False, "rho": 0.9, "centered": False, "epsilon": None,
             "initial_accumulator_value": 0.1, "clipnorm": None, "global_clipnorm": None, "clipvalue": None}
OPTIMIZER_SETTINGS = tuple(k for k in _DEFAULTS if k != "epsilon")  # ggml_compile's keywords (epsilon is Adam's too)
_USED_BY = {"momentum": ("sgd", "rmsprop"), "nesterov": ("sgd",), "rho": ("rmsprop",), "centered": ("rmsprop",),
            "initial_accumulator_value": ("adagrad",)}
_CLIPS = ("clipnorm", "global_clipnorm", "clipvalue")


@dataclass(frozen=True)
class OptimizerSpec:
    """One optimizer with its settings (Keras' names and defaults) and its gradient clipping."""
    name: str = "adamw"
    momentum: float = 0.0
    nesterov: bool = False
    rho: float = 0.9
    centered: bool = False
    epsilon: float | None = None   # RMSprop's and Adagrad's (default 1e-7); Adam's lives in ggml's parameters
    initial_accumulator_value: float = 0.1
    clipnorm: float | None = None
    global_clipnorm: float | None = None
    clipvalue: float | None = None

    @property
    def ggml_type(self) -> int:
        """The ggml-opt optimizer type a context of this optimizer is made with (the others run outside it)."""
        return OPTIMIZER_ADAMW if self.name == "adamw" else OPTIMIZER_SGD

    @property
    def fused(self) -> bool:
        """ggml-opt's own step does it (AdamW or plain SGD, no clipping); otherwise this module's graph does."""
        return self.name in ("adamw", "sgd") and not self.momentum and not self.clipping

    @property
    def clipping(self) -> str | None:
        return next((k for k in _CLIPS if getattr(self, k) is not None), None)

    @property
    def eps(self) -> float:
        return 1e-7 if self.epsilon is None else self.epsilon

    @property
    def slots(self) -> tuple[str, ...]:
        """The state tensors kept per weight, by name (AdamW's are ggml's ``m`` and ``v``)."""
        if self.name == "adamw":
            return ("m", "v")
        if self.name == "adagrad":
            return ("accumulator",)
        slots = ("velocity",) + (("average_gradient",) if self.centered else ()) if self.name == "rmsprop" else ()
        return slots + (("momentum",) if self.momentum else ())

    def initial(self, slot: str) -> float:
        """The value a slot starts from."""
        return self.initial_accumulator_value if slot == "accumulator" else 0.0

    def settings(self) -> dict:
        """The settings that differ from Keras' defaults (what ``ggml_compile`` takes back)."""
        return {k: v for k, v in asdict(self).items() if k != "name" and v != _DEFAULTS[k]}


def optimizer_spec(name: str, settings: dict, fn: str) -> OptimizerSpec:
    """``name`` ("adamw", "sgd", "rmsprop", "adagrad") with Keras' settings (None: the default), each checked:
    a setting the optimizer does not read, or more than one kind of clipping, is refused rather than ignored."""
    if name not in OPTIMIZER_NAMES:
        raise GgmlValueError(f"{fn}: unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZER_NAMES)}")
    given = {k: v for k, v in settings.items() if v is not None}
    unknown = sorted(set(given) - set(_DEFAULTS))
    if unknown:
        raise GgmlValueError(f"{fn}: unknown optimizer settings {unknown}")
    for key, users in _USED_BY.items():
        if key in given and name not in users:
            raise GgmlValueError(f"{fn}: {key}= is a setting of {' and '.join(users)}, but the optimizer is {name!r}; "
                                 "leave it out or choose that optimizer")
    clips = [k for k in _CLIPS if k in given]
    if len(clips) > 1:
        raise GgmlValueError(f"{fn}: set one of clipnorm, global_clipnorm and clipvalue, got {' and '.join(clips)} "
                             "(Keras allows one kind of clipping at a time)")

    def number(key: str, low: float, high: float, open_low: bool, open_high: bool, rule: str) -> None:
        v = given.get(key)
        if v is None:
            return
        if not is_real(v) or not low <= v <= high or open_low and v == low or open_high and v == high:
            raise GgmlValueError(f"{fn}: {key} must be {rule}, got {v!r}")
        given[key] = float(v)
    number("momentum", 0.0, 1.0, False, True, "a number in [0, 1)")
    number("rho", 0.0, 1.0, False, True, "a number in [0, 1) (the decay of the squared gradients' average)")
    number("initial_accumulator_value", 0.0, FLOAT32_MAX, False, False, "a finite number >= 0")
    for key in _CLIPS:  # from 1e-30: a clip's reciprocal (the norms' scale) must be a finite float32
        number(key, 1e-30, FLOAT32_MAX, False, False, "a finite number >= 1e-30")
    if "epsilon" in given and name in ("rmsprop", "adagrad"):
        number("epsilon", 0.0, FLOAT32_MAX, False, False, "a finite number >= 0")
    elif "epsilon" in given:
        given.pop("epsilon")  # Adam's epsilon is ggml's parameter (compile's beta/epsilon check); SGD has none
    for key in ("nesterov", "centered"):
        if key in given and not isinstance(given[key], (bool, np.bool_)):
            raise GgmlValueError(f"{fn}: {key} must be True or False, got {given[key]!r}")
        if key in given:
            given[key] = bool(given[key])
    if given.get("nesterov") and not given.get("momentum"):
        raise GgmlValueError(f"{fn}: nesterov=True needs a momentum > 0 (Nesterov's momentum of 0 is plain SGD)")
    if name == "adagrad" and given.get("initial_accumulator_value", 0.1) == 0 and given.get("epsilon", 1e-7) == 0:
        raise GgmlValueError(f"{fn}: Adagrad with initial_accumulator_value=0 and epsilon=0 divides 0 by 0 at the "
                             "first step of any weight whose gradient is 0 (NaN weights while the loss stays "
                             "finite); keep one of them > 0")
    if name == "rmsprop" and given.get("epsilon", 1e-7) == 0:
        raise GgmlValueError(f"{fn}: RMSprop with epsilon=0 divides 0 by 0 for any weight whose gradient is 0 (an "
                             "unused embedding row): NaN weights while the loss stays finite; keep epsilon > 0")
    return OptimizerSpec(name, **given)


# ---------------------------------------------------------------- the step's ops

# the element-wise rules' parameters tensor: [1, learning rate * weight decay, learning rate]; its first two are
# ggml's SGD step op's (alpha 1, decay lr * wd), which applies each rule's step and the decoupled weight decay in
# one pass: w = w * (1 - lr * wd) - step
HPARAMS = 3


def step_hparams(spec: OptimizerSpec, params: CData, step: int) -> np.ndarray:
    """The parameters tensor of step number ``step`` (from 1) for ``params`` (ggml's optimizer parameters, as
    ggml_opt_eval fills its step ops': AdamW's float32 bias corrections included)."""
    if spec.name == "adamw":
        p = params.adamw
        one = np.float32(1.0)
        beta1h = one / (one - np.power(np.float32(p.beta1), np.float32(step)))
        beta2h = one / (one - np.power(np.float32(p.beta2), np.float32(step)))
        return np.array([p.alpha, p.beta1, p.beta2, p.eps, p.wd, beta1h, beta2h], np.float32)
    sgd = params.sgd
    if spec.name == "sgd" and not spec.momentum:
        return np.array([sgd.alpha, sgd.wd], np.float32)
    return np.array([1.0, np.float32(sgd.alpha) * np.float32(sgd.wd), sgd.alpha], np.float32)


def hparams_size(spec: OptimizerSpec) -> int:
    return 7 if spec.name == "adamw" else 2 if spec.name == "sgd" and not spec.momentum else HPARAMS


def clip_gradients(ctx: Context, spec: OptimizerSpec, grads: Sequence[Tensor]) -> list[Tensor]:
    """The gradients after Keras' clipping: ``g / max(|g| / c, 1)`` per weight (clipnorm) or with the joint norm
    of all (global_clipnorm), or each element clamped to [-c, c] (clipvalue)."""
    if spec.clipvalue is not None:
        value = spec.clipvalue
        return [ggml_clamp(ctx, g, -value, value) for g in grads]
    norm = spec.clipnorm if spec.clipnorm is not None else spec.global_clipnorm
    if norm is None or not grads:
        return list(grads)
    c = norm

    def over(sum_sq: Tensor) -> Tensor:  # max(norm / c, 1): 1 keeps a gradient within the norm as it is
        return ggml_clamp(ctx, ggml_scale(ctx, ggml_sqrt(ctx, sum_sq), 1.0 / c), 1.0, FLOAT32_MAX)
    if spec.clipnorm is not None:
        return [ggml_div(ctx, g, over(ggml_sum(ctx, ggml_sqr(ctx, g)))) for g in grads]
    total = ggml_sum(ctx, ggml_sqr(ctx, grads[0]))
    for g in grads[1:]:
        total = ggml_add(ctx, total, ggml_sum(ctx, ggml_sqr(ctx, g)))
    factor = over(total)
    return [ggml_div(ctx, g, factor) for g in grads]


def step_ops(ctx: Context, spec: OptimizerSpec, param: Tensor, grad: Tensor, slots: dict[str, Tensor],
             hparams: Tensor) -> list[Tensor]:
    """The ops that update ``param`` and its ``slots`` in place from ``grad``: what a graph of the step expands."""
    if spec.name == "adamw":
        ptr = lib.ggml_opt_step_adamw(ctx.ptr, param.ptr, grad.ptr, slots["m"].ptr, slots["v"].ptr, hparams.ptr)
        return [Tensor(ptr, ctx, sources=(param, grad, slots["m"], slots["v"], hparams))]
    if spec.name == "sgd" and not spec.momentum:
        ptr = lib.ggml_opt_step_sgd(ctx.ptr, param.ptr, grad.ptr, hparams.ptr)
        return [Tensor(ptr, ctx, sources=(param, grad, hparams))]
    sgd_params = ggml_view_1d(ctx, hparams, 2, 0)   # [1, lr * wd]
    lr = ggml_view_1d(ctx, hparams, 1, 8)
    ops: list[Tensor] = []

    def update(slot: str, value: Tensor) -> Tensor:
        ops.append(ggml_cpy(ctx, value, slots[slot]))
        return value

    def apply(step: Tensor) -> list[Tensor]:  # w = w * (1 - lr * wd) - step, in place, in one pass
        ptr = lib.ggml_opt_step_sgd(ctx.ptr, param.ptr, step.ptr, sgd_params.ptr)
        return ops + [Tensor(ptr, ctx, sources=(param, step, sgd_params))]
    lr_g = ggml_mul(ctx, grad, lr)
    if spec.name == "sgd":  # with momentum: w += m (Nesterov: w += mu * m - lr * g)
        m = update("momentum", ggml_sub(ctx, ggml_scale(ctx, slots["momentum"], spec.momentum), lr_g))
        return apply(ggml_sub(ctx, lr_g, ggml_scale(ctx, m, spec.momentum)) if spec.nesterov else
                     ggml_scale(ctx, m, -1.0))
    if spec.name == "rmsprop":
        rho = spec.rho
        v = update("velocity", ggml_add(ctx, ggml_scale(ctx, slots["velocity"], rho),
                                        ggml_scale(ctx, ggml_sqr(ctx, grad), 1.0 - rho)))
        if spec.centered:
            a = update("average_gradient", ggml_add(ctx, ggml_scale(ctx, slots["average_gradient"], rho),
                                                    ggml_scale(ctx, grad, 1.0 - rho)))
            v = ggml_sub(ctx, v, ggml_sqr(ctx, a))
        step = ggml_div(ctx, lr_g, ggml_sqrt(ctx, ggml_scale_bias(ctx, v, 1.0, spec.eps)))
        if spec.momentum:
            step = update("momentum", ggml_add(ctx, ggml_scale(ctx, slots["momentum"], spec.momentum), step))
    else:  # adagrad
        acc = update("accumulator", ggml_add(ctx, slots["accumulator"], ggml_sqr(ctx, grad)))
        step = ggml_div(ctx, lr_g, ggml_sqrt(ctx, ggml_scale_bias(ctx, acc, 1.0, spec.eps)))
    return apply(step)
