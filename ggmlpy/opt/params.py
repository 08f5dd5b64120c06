"""Optimizer hyperparameters (``OptimizerParams``) and the learning rate each step reads (``LrUserdata``,
``ggml_opt_set_lr``/``ggml_opt_get_lr``).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .._ffi import CData, ffi, lib
from ..core.args import FLOAT32_MAX, learning_rate_arg, weight_decay_arg
from ..core.handle import raise_type
from ..errors import GgmlTypeError, GgmlValueError


class _Fields:
    """One optimizer's parameters inside an ``OptimizerParams`` (``.adamw`` or ``.sgd``): public, checked fields."""
    __slots__ = ("_owner", "_c", "_name")
    _RULES: dict = {}

    def __init__(self, owner: OptimizerParams, c: CData, name: str) -> None:
        object.__setattr__(self, "_owner", owner)  # keeps the struct alive
        object.__setattr__(self, "_c", c)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key: str) -> float:
        if key not in self._RULES:
            raise AttributeError(f"{self._name} optimizer parameters are {', '.join(self._RULES)}; got {key!r}")
        return float(getattr(self._c, key))

    def __setattr__(self, key: str, value: object) -> None:
        rule = self._RULES.get(key)
        if rule is None:
            raise AttributeError(f"{self._name} optimizer parameters are {', '.join(self._RULES)}; cannot set {key!r}")
        what = f"{self._name}.{key}"
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not math.isfinite(value):
            raise GgmlValueError(f"{what} must be a finite number, got {value!r}")
        with np.errstate(over="ignore"):
            stored = float(np.float32(value))  # what ggml will see (a float)
        low, high, low_open, high_open, text = rule
        if not math.isfinite(stored) or stored < low or (low_open and stored <= low) or stored > high \
                or (high_open and stored >= high):
            as_f32 = f" ({stored:g} as a 32-bit float)" if stored != value else ""
            raise GgmlValueError(f"{what} must be {text}, got {value!r}{as_f32}")
        setattr(self._c, key, stored)

    def as_dict(self) -> dict:
        return {k: float(getattr(self._c, k)) for k in self._RULES}

    def __repr__(self) -> str:
        return f"{self._name}({', '.join(f'{k}={v:g}' for k, v in self.as_dict().items())})"


_INF = float("inf")


class ADAMW_FIELDS(_Fields):
    __slots__ = ()
    # (low, high, low open, high open, the rule in words)
    _RULES = {"alpha": (0.0, _INF, True, False, "> 0 (the learning rate)"),
              "beta1": (0.0, 1.0, False, True, "in [0, 1) (1 divides by zero in AdamW's bias correction)"),
              "beta2": (0.0, 1.0, False, True, "in [0, 1) (1 divides by zero in AdamW's bias correction)"),
              "eps": (0.0, _INF, False, False, ">= 0"),
              "wd": (0.0, 1.0, False, False, "in [0, 1] (decoupled weight decay)")}


class SGD_FIELDS(_Fields):
    __slots__ = ()
    _RULES = {"alpha": (0.0, _INF, True, False, "> 0 (the learning rate)"),
              "wd": (0.0, 1.0, False, False, "in [0, 1] (decoupled weight decay)")}


# ggmlR's flat parameter names -> (optimizer, field)
FLAT_NAMES = {"adamw_lr": ("adamw", "alpha"), "adamw_beta1": ("adamw", "beta1"), "adamw_beta2": ("adamw", "beta2"),
              "adamw_eps": ("adamw", "eps"), "adamw_wd": ("adamw", "wd"), "sgd_lr": ("sgd", "alpha"),
              "sgd_wd": ("sgd", "wd")}


class OptimizerParams:
    """ggml's ``ggml_opt_optimizer_params``: the hyper-parameters of both optimizers, as public fields.

    ``.adamw.alpha`` (learning rate), ``.adamw.beta1``, ``.adamw.beta2``, ``.adamw.eps``, ``.adamw.wd``
    (decoupled weight decay) and ``.sgd.alpha``, ``.sgd.wd``. Each assignment is checked against what
    ggml asserts at an optimizer step (alpha > 0, wd in [0, 1], eps >= 0, finite) and against betas of 1,
    which make every weight NaN (AdamW's bias correction divides by 1 - beta^t): betas in [0, 1), as the
    32-bit float ggml receives (0.99999999 is 1 there). ``ggml_opt_get_default_optimizer_params()`` gives ggml's
    defaults.
    """

    def __init__(self, c: CData | None = None) -> None:
        if c is None:
            c = ffi.new("struct ggml_opt_optimizer_params *")
            c[0] = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
        self._c = c
        self.adamw = ADAMW_FIELDS(self, c.adamw, "adamw")
        self.sgd = SGD_FIELDS(self, c.sgd, "sgd")

    @property
    def c_struct(self) -> CData:
        """The ``struct ggml_opt_optimizer_params *`` these fields live in (what ggml reads at each step)."""
        return self._c

    def as_dict(self) -> dict:
        """``{"adamw": {...}, "sgd": {...}}`` with the current values."""
        return {"adamw": self.adamw.as_dict(), "sgd": self.sgd.as_dict()}

    def copy(self) -> OptimizerParams:
        out = OptimizerParams()
        out._c[0] = self._c[0]
        return out

    def update(self, values: object, what: str = "optimizer parameters") -> None:
        """Set fields from another OptimizerParams, a dict ``{"adamw": {...}, "sgd": {...}}``, or a dict of
        ggmlR's flat names (``adamw_lr``, ``adamw_beta1``, ``adamw_beta2``, ``adamw_eps``, ``adamw_wd``,
        ``sgd_lr``, ``sgd_wd``, as ``ggml_opt_set_lr`` takes); all are checked before any is written."""
        if isinstance(values, OptimizerParams):
            self._c[0] = values._c[0]
            return
        if isinstance(values, dict) and values and set(values) <= set(FLAT_NAMES):
            nested: dict = {}
            for key, value in values.items():
                group, field = FLAT_NAMES[key]
                nested.setdefault(group, {})[field] = value
            values = nested
        if not isinstance(values, dict) or not set(values) <= {"adamw", "sgd"} or \
                not all(isinstance(v, dict) for v in values.values()):
            raise GgmlTypeError(f"{what}: expected an OptimizerParams (ggml_opt_get_default_optimizer_params()) or a "
                                f"dict {{'adamw': {{'alpha': ...}}, 'sgd': {{...}}}} or of ggmlR's flat names "
                                f"({', '.join(FLAT_NAMES)}), "
                                f"got {values!r:.120}")
        trial = self.copy()
        for group, fields in values.items():
            for key, value in fields.items():
                setattr(getattr(trial, group), key, value)
        self._c[0] = trial._c[0]

    def __repr__(self) -> str:
        return f"<OptimizerParams {self.adamw!r} {self.sgd!r}>"


def ggml_opt_get_default_optimizer_params() -> OptimizerParams:
    """ggml's default optimizer hyper-parameters, as an object whose fields can be changed.

    AdamW: ``alpha`` (learning rate) 1e-3, ``beta1`` 0.9, ``beta2`` 0.999, ``eps`` 1e-8, ``wd`` 0; SGD:
    ``alpha`` 1e-3, ``wd`` 0. Set fields (checked) and give the object to ``ggml_opt_default_params``'s
    ``opt_pars``, or return it from a ``get_opt_pars`` callback (``ggml_opt_fit``, ``ggml_opt_init``).

    Value: an OptimizerParams.

    Example:
        >>> p = ggml_opt_get_default_optimizer_params()
        >>> p.adamw.alpha = 1.0; p.adamw.beta1 = 0.0; p.sgd.alpha = 1.0
    """
    return OptimizerParams()


class LrUserdata:
    """The optimizer parameters a context reads at each optimizer step; mutate to schedule the LR.

    ``provider`` (None, or a function of no arguments returning an OptimizerParams or a dict) is asked for
    the parameters before every optimizer step, as ggml calls its ``get_opt_pars`` callback."""

    def __init__(self, weight_decay: float = 0.0, params: CData | None = None) -> None:
        self.provider: Callable[[], object] | None = None
        if params is not None:  # shared with an OptimizerParams: changing its fields changes the next steps
            self.params = params
            return
        self.params = ffi.new("struct ggml_opt_optimizer_params *")
        self.params[0] = lib.ggml_opt_get_default_optimizer_params(ffi.NULL)
        weight_decay_arg(weight_decay)
        self.params.adamw.wd = weight_decay
        self.params.sgd.wd = weight_decay

    def refresh(self) -> None:
        """Ask ``provider`` for the parameters of the coming optimizer step (ggml's get_opt_pars)."""
        if self.provider is None:
            return
        values = self.provider()
        target = OptimizerParams()  # unset fields are ggml's defaults, as in ggml's callbacks
        target.update(values, "get_opt_pars")
        self.params[0] = target._c[0]

    def get(self) -> dict:
        return {"adamw": float(self.params.adamw.alpha), "sgd": float(self.params.sgd.alpha)}

    @property
    def adamw(self) -> float:
        """AdamW's learning rate for the coming steps (set it with ``set(adamw_lr=...)``)."""
        return float(self.params.adamw.alpha)

    @property
    def sgd(self) -> float:
        """SGD's learning rate for the coming steps (set it with ``set(sgd_lr=...)``)."""
        return float(self.params.sgd.alpha)

    def set(self, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
        adamw = None if adamw_lr is None else learning_rate_arg("ggml_opt_set_lr: adamw_lr", adamw_lr, schedule=True)
        sgd = None if sgd_lr is None else learning_rate_arg("ggml_opt_set_lr: sgd_lr", sgd_lr, schedule=True)
        if adamw is not None:
            self.params.adamw.alpha = adamw
        if sgd is not None:
            self.params.sgd.alpha = sgd

    def validate(self) -> None:
        """The conditions ggml_opt_eval asserts, checked before the step."""
        p = self.params
        problems = []
        if not 0 < p.adamw.alpha <= FLOAT32_MAX or not 0 < p.sgd.alpha <= FLOAT32_MAX:
            problems.append(f"learning rates must be > 0 (adamw {p.adamw.alpha}, sgd {p.sgd.alpha})")
        if not (0 <= p.adamw.beta1 < 1 and 0 <= p.adamw.beta2 < 1):
            problems.append(f"betas must be in [0, 1) (got {p.adamw.beta1}, {p.adamw.beta2}; 1 divides by zero in "
                            "the bias correction)")
        if not p.adamw.eps >= 0:
            problems.append(f"eps must be >= 0 (got {p.adamw.eps})")
        if not (0 <= p.adamw.wd <= 1 and 0 <= p.sgd.wd <= 1):
            problems.append(f"weight decay must be in [0, 1] (got {p.adamw.wd}, {p.sgd.wd})")
        if problems:
            raise GgmlValueError("invalid optimizer parameters: " + "; ".join(problems))

    def __repr__(self) -> str:
        return f"<LrUserdata adamw={self.params.adamw.alpha:g} sgd={self.params.sgd.alpha:g}>"




def ggml_opt_set_lr(lr_ud: LrUserdata, adamw_lr: float | None = None, sgd_lr: float | None = None) -> None:
    """Change the learning rate an opt context uses from its next optimizer step on.

    ``lr_ud`` holds both optimizers' rates; set one or both (the other is left alone). The built-in LR
    schedules call this between epochs; call it from your own callback (``state.lr_ud``) or between
    ``ggml_opt_eval`` calls. A rate of 0 is clamped to 1e-12 (ggml aborts on a rate <= 0).

    Arguments:
        lr_ud: the learning-rate handle: ``ggml_opt_init_for_fit(...)["lr_ud"]``, or ``state.lr_ud``
            inside a fit's callbacks.
        adamw_lr: the new AdamW learning rate (a finite number >= 0), or None (the default) to keep it.
        sgd_lr: the new SGD learning rate (a finite number >= 0), or None (the default) to keep it.

    Value: None. Raises GgmlValueError for a negative or non-finite rate.

    Example:
        >>> fit = ggml_opt_init_for_fit(sched, ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x, outputs=out)
        >>> ggml_opt_set_lr(fit["lr_ud"], adamw_lr=1e-4)
    """
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_set_lr(lr_ud)", "LrUserdata", lr_ud)
    lr_ud.set(adamw_lr, sgd_lr)


def ggml_opt_get_lr(lr_ud: LrUserdata) -> dict:
    """The learning rates an opt context currently uses.

    Arguments:
        lr_ud: the learning-rate handle (``ggml_opt_init_for_fit(...)["lr_ud"]`` or ``state.lr_ud``).

    Value: a dict ``{"adamw": float, "sgd": float}``.

    Example:
        >>> ggml_opt_get_lr(fit["lr_ud"])
        {'adamw': 0.001, 'sgd': 0.001}
    """
    if not isinstance(lr_ud, LrUserdata):
        raise_type("ggml_opt_get_lr(lr_ud)", "LrUserdata", lr_ud)
    return lr_ud.get()
