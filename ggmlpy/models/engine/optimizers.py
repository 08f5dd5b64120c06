"""Optimizer objects: ``ggml_optimizer_adam`` / ``_sgd`` / ``_rmsprop`` / ``_adagrad`` build one optimizer with its
settings, checked where it is made, for ``ggml_compile(model, optimizer=...)``. ggmlR's flat form
(``ggml_compile(model, optimizer="sgd", momentum=0.9)``) resolves to the same object here, so both forms share
one set of rules."""
from __future__ import annotations

from dataclasses import dataclass

from ...core.args import FLOAT32_MAX, is_int, is_real, learning_rate_arg, weight_decay_arg
from ...errors import GgmlValueError
from ...opt.constants import OPTIMIZER_ADAMW, OPTIMIZER_SGD
from ...opt.rules import OPTIMIZER_SETTINGS, optimizer_spec, OptimizerSpec


# the names ggml_compile takes -> the rule (opt.rules)
OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd", "rmsprop": "rmsprop", "adagrad": "adagrad"}
# ggmlR's flat keywords of ggml_compile that set the optimizer (learning_rate and weight_decay included)
FLAT_SETTINGS = ("learning_rate", "weight_decay", "beta_1", "beta_2", "epsilon") + OPTIMIZER_SETTINGS
_ADAM_DEFAULTS = (0.9, 0.999, 1e-8)  # ggml's beta_1, beta_2, epsilon


@dataclass(frozen=True)
class Optimizer:
    """One optimizer and its settings, checked: what ``ggml_compile`` trains with.

    Made by ``ggml_optimizer_adam``, ``ggml_optimizer_sgd``, ``ggml_optimizer_rmsprop`` and
    ``ggml_optimizer_adagrad`` (or by ``ggml_compile`` from its flat keywords). Immutable: one object can
    compile several models. ``get_config()`` gives back the settings that differ from the defaults."""
    name: str                      # as given: "adam", "adamw", "sgd", "rmsprop", "adagrad"
    spec: OptimizerSpec            # the rule with Keras' settings and the clipping (opt.rules)
    learning_rate: float | None    # None: ggml's 1e-3
    weight_decay: float            # decoupled, in [0, 1]
    adam: tuple[float, float, float] | None  # Adam's (beta_1, beta_2, epsilon); None: ggml's defaults

    def get_config(self) -> dict:
        """The optimizer's name and its settings that differ from the defaults, as ``ggml_compile``'s keywords:
        ``ggml_compile(model, **opt.get_config())`` compiles the same optimizer."""
        config: dict = {"optimizer": self.name}
        if self.learning_rate is not None:
            config["learning_rate"] = self.learning_rate
        if self.weight_decay:
            config["weight_decay"] = self.weight_decay
        if self.adam is not None:
            config.update((k, v) for k, v, d in zip(("beta_1", "beta_2", "epsilon"), self.adam, _ADAM_DEFAULTS)
                          if v != d)
        return {**config, **self.spec.settings()}

    def __repr__(self) -> str:
        config = self.get_config()
        name = config.pop("optimizer")
        return f"Optimizer({name!r}{''.join(f', {k}={v!r}' for k, v in config.items())})"


def resolve_optimizer(optimizer: object, settings: dict, fn: str) -> Optimizer:
    """The ``Optimizer`` named by ``optimizer`` (a name or a ``ggml_opt_optimizer_type_*()`` constant) with the
    flat ``settings`` (``FLAT_SETTINGS`` keywords, None: the default), every one checked."""
    if is_int(optimizer):
        name = {OPTIMIZER_ADAMW: "adamw", OPTIMIZER_SGD: "sgd"}.get(int(optimizer))
    else:
        name = optimizer.lower() if isinstance(optimizer, str) else None
    if name not in OPTIMIZERS:
        raise GgmlValueError(f"{fn}: unknown optimizer {optimizer!r}; expected one of "
                             f"{', '.join(map(repr, OPTIMIZERS))}, a ggml_opt_optimizer_type_*() constant or an "
                             "object from ggml_optimizer_adam / _sgd / _rmsprop / _adagrad")
    unknown = sorted(set(settings) - set(FLAT_SETTINGS))
    if unknown:
        raise GgmlValueError(f"{fn}: unknown optimizer settings {unknown}; expected some of {', '.join(FLAT_SETTINGS)}")
    rule = OPTIMIZERS[name]
    spec = optimizer_spec(rule, {k: settings.get(k) for k in OPTIMIZER_SETTINGS + ("epsilon",)}, fn)
    lr = settings.get("learning_rate")
    weight_decay = settings.get("weight_decay")
    return Optimizer(name, spec, None if lr is None else learning_rate_arg("learning_rate", lr),
                     weight_decay_arg(0.0 if weight_decay is None else weight_decay),
                     _adam_settings(fn, rule, settings.get("beta_1"), settings.get("beta_2"), settings.get("epsilon")))


def _adam_settings(fn: str, rule: str, beta_1: object, beta_2: object,
                   epsilon: object) -> tuple[float, float, float] | None:
    """Adam's (beta_1, beta_2, epsilon), ggml's defaults where None; None when all are."""
    given = {"beta_1": beta_1, "beta_2": beta_2, "epsilon": epsilon if rule in ("adamw", "sgd") else None}
    if all(v is None for v in given.values()):
        return None
    if rule != "adamw":
        named = ", ".join(k for k, v in given.items() if v is not None)
        raise GgmlValueError(f"{fn}: {named} set Adam's moments, but the optimizer is {rule!r}; use "
                             "the adam optimizer or leave them out")
    for key in ("beta_1", "beta_2"):
        v = given[key]
        if v is not None and (not is_real(v) or not 0 <= v < 1):
            raise GgmlValueError(f"{fn}: {key} must be a number in [0, 1) (1 divides by zero in Adam's bias "
                                 f"correction), got {v!r}")
    if epsilon is not None and (not is_real(epsilon) or not 0 <= epsilon <= FLOAT32_MAX):
        raise GgmlValueError(f"{fn}: epsilon must be a finite number >= 0, got {epsilon!r}")
    values = (beta_1, beta_2, epsilon)
    return tuple(d if v is None else float(v) for v, d in zip(values, _ADAM_DEFAULTS))  # type: ignore[return-value,arg-type]


def ggml_optimizer_adam(learning_rate: float | None = None, beta_1: float | None = None,
                        beta_2: float | None = None, epsilon: float | None = None, weight_decay: float = 0.0,
                        clipnorm: float | None = None, global_clipnorm: float | None = None,
                        clipvalue: float | None = None) -> Optimizer:
    """Adam with decoupled weight decay (ggml's AdamW), for ``ggml_compile(model, optimizer=...)``.

    Arguments:
        learning_rate: the starting learning rate (None: ggml's 1e-3); a finite float32 > 0.
        beta_1, beta_2: the decays of the gradient's first and second moments, in [0, 1) (None: 0.9, 0.999).
        epsilon: added to the root of the second moment, >= 0 (None: ggml's 1e-8; Keras' is 1e-7).
        weight_decay: decoupled weight decay in [0, 1]: ``w *= 1 - lr*weight_decay`` each step (Keras' AdamW).
        clipnorm, global_clipnorm, clipvalue: Keras' gradient clipping before each step, one kind at most: each
            weight's gradient to an L2 norm of at most ``clipnorm``, all of them together to a joint norm of at
            most ``global_clipnorm``, or every element into ``[-clipvalue, clipvalue]``.

    Value: an ``Optimizer`` (immutable; its settings are checked here). Without clipping it runs ggml-opt's
    fused AdamW step; with clipping, the same rule as a graph of element-wise ops on the model's device.

    Example:
        >>> opt = g.ggml_optimizer_adam(learning_rate=3e-4, beta_2=0.98, weight_decay=0.01)
        >>> model = g.ggml_compile(model, optimizer=opt, loss="mse", backend="cpu")
    """
    return resolve_optimizer("adam", dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                                          epsilon=epsilon, weight_decay=weight_decay, clipnorm=clipnorm,
                                          global_clipnorm=global_clipnorm, clipvalue=clipvalue),
                             "ggml_optimizer_adam")


def ggml_optimizer_sgd(learning_rate: float | None = None, momentum: float = 0.0, nesterov: bool = False,
                       weight_decay: float = 0.0, clipnorm: float | None = None,
                       global_clipnorm: float | None = None, clipvalue: float | None = None) -> Optimizer:
    """Stochastic gradient descent, with momentum and Nesterov's variant (Keras 3's rule), for
    ``ggml_compile(model, optimizer=...)``.

    Arguments:
        learning_rate: the starting learning rate (None: ggml's 1e-3); a finite float32 > 0.
        momentum: in [0, 1): ``m = momentum*m - lr*g; w += m`` (0: plain SGD, ggml-opt's fused step).
        nesterov: Nesterov's momentum, ``w += momentum*m - lr*g`` (needs momentum > 0).
        weight_decay: decoupled weight decay in [0, 1], applied before the step.
        clipnorm, global_clipnorm, clipvalue: gradient clipping, one kind at most (see ``ggml_optimizer_adam``).

    Value: an ``Optimizer``. Momentum and clipping run as a graph of element-wise ops on the model's device
    after each backward pass; plain SGD is ggml's own step op.

    Example:
        >>> model = g.ggml_compile(model, optimizer=g.ggml_optimizer_sgd(0.05, momentum=0.9, nesterov=True),
        ...                        loss="categorical_crossentropy", backend="cpu")
    """
    return resolve_optimizer("sgd", dict(learning_rate=learning_rate, momentum=momentum or None,
                                         nesterov=nesterov or None, weight_decay=weight_decay, clipnorm=clipnorm,
                                         global_clipnorm=global_clipnorm, clipvalue=clipvalue),
                             "ggml_optimizer_sgd")


def ggml_optimizer_rmsprop(learning_rate: float | None = None, rho: float = 0.9, momentum: float = 0.0,
                           epsilon: float | None = None, centered: bool = False, weight_decay: float = 0.0,
                           clipnorm: float | None = None, global_clipnorm: float | None = None,
                           clipvalue: float | None = None) -> Optimizer:
    """RMSprop (Keras 3's rule and defaults), for ``ggml_compile(model, optimizer=...)``.

    Arguments:
        learning_rate: the starting learning rate (None: ggml's 1e-3); a finite float32 > 0.
        rho: in [0, 1), the decay of the squared gradients' running average ``v = rho*v + (1-rho)*g^2``.
        momentum: in [0, 1): steps accumulate as ``m = momentum*m + lr*g/sqrt(v + epsilon)``.
        epsilon: > 0, added under the root (None: Keras' 1e-7; 0 would make a weight with a zero gradient NaN).
        centered: divide by the gradient's estimated variance (``v - a^2``, ``a`` its running mean) instead.
        weight_decay: decoupled weight decay in [0, 1], applied before the step.
        clipnorm, global_clipnorm, clipvalue: gradient clipping, one kind at most (see ``ggml_optimizer_adam``).

    Value: an ``Optimizer``; the rule runs as a graph of ggml element-wise ops on the model's device, so it
    trains on every backend, with its state saved beside the weights (``ggml_save_model``).

    Example:
        >>> model = g.ggml_compile(model, optimizer=g.ggml_optimizer_rmsprop(1e-3, rho=0.95), loss="mse")
    """
    return resolve_optimizer("rmsprop", dict(learning_rate=learning_rate, rho=rho, momentum=momentum or None,
                                             epsilon=epsilon, centered=centered or None, weight_decay=weight_decay,
                                             clipnorm=clipnorm, global_clipnorm=global_clipnorm,
                                             clipvalue=clipvalue),
                             "ggml_optimizer_rmsprop")


def ggml_optimizer_adagrad(learning_rate: float | None = None, initial_accumulator_value: float = 0.1,
                           epsilon: float | None = None, weight_decay: float = 0.0, clipnorm: float | None = None,
                           global_clipnorm: float | None = None, clipvalue: float | None = None) -> Optimizer:
    """Adagrad (Keras 3's rule and defaults), for ``ggml_compile(model, optimizer=...)``.

    Arguments:
        learning_rate: the starting learning rate (None: ggml's 1e-3); a finite float32 > 0.
        initial_accumulator_value: >= 0, where each weight's sum of squared gradients starts.
        epsilon: >= 0, added under the root: ``w -= lr*g / sqrt(acc + epsilon)`` (None: Keras' 1e-7; not both
            it and the initial accumulator 0: a zero gradient would give 0/0).
        weight_decay: decoupled weight decay in [0, 1], applied before the step.
        clipnorm, global_clipnorm, clipvalue: gradient clipping, one kind at most (see ``ggml_optimizer_adam``).

    Value: an ``Optimizer``, run as a graph of element-wise ops on the model's device.

    Example:
        >>> model = g.ggml_compile(model, optimizer=g.ggml_optimizer_adagrad(0.01), loss="mse", backend="cpu")
    """
    return resolve_optimizer("adagrad", dict(learning_rate=learning_rate,
                                             initial_accumulator_value=initial_accumulator_value, epsilon=epsilon,
                                             weight_decay=weight_decay, clipnorm=clipnorm,
                                             global_clipnorm=global_clipnorm, clipvalue=clipvalue),
                             "ggml_optimizer_adagrad")
