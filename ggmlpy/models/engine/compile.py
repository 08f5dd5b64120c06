"""``ggml_compile``: optimizer, losses and backend of a model; its weights are drawn here."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...backend.device import Device
from ...core.args import FLOAT32_MAX, is_int, is_real
from ...errors import GgmlpyWarning, GgmlStateError, GgmlTypeError, GgmlValueError
from ...opt import losses as L
from ...opt.custom_loss import CustomLoss, ggml_opt_loss_custom, returns_batch_value
from ...opt.rules import OptimizerSpec
from ..layers import convolutional as conv
from ..layers import pooling, shaping
from ..layers.basic import Dropout, Flatten
from ..layers.masking import mask_flow
from ..network.model import Model, Node
from .graphs import build_graph, GraphInstance, InputShapes
from .heads import HeadSpec
from .metrics import resolve_metrics, spec_to_dict
from .optimizers import Optimizer, resolve_optimizer
from .precision import precision_name, PRECISIONS
from .runtime import replace_runtime, Runtime


# name -> (ggml loss type, what the labels are)
LOSSES = {
    "categorical_crossentropy": (L.LOSS_CROSS_ENTROPY, "one-hot"),
    "sparse_categorical_crossentropy": (L.LOSS_CROSS_ENTROPY, "class ids"),
    "binary_crossentropy": (L.LOSS_BINARY_CROSS_ENTROPY, "probabilities"),
    "mse": (L.LOSS_MSE, "values"), "mean_squared_error": (L.LOSS_MSE, "values"),
    "mae": (L.LOSS_MAE, "values"), "mean_absolute_error": (L.LOSS_MAE, "values"),
    "huber": (L.LOSS_HUBER, "values"), "huber_loss": (L.LOSS_HUBER, "values"),
    "kl_divergence": (L.LOSS_KL_DIVERGENCE, "distributions"), "kld": (L.LOSS_KL_DIVERGENCE, "distributions"),
    "kullback_leibler_divergence": (L.LOSS_KL_DIVERGENCE, "distributions"),
    "hinge": (L.LOSS_HINGE, "-1/1 labels"), "squared_hinge": (L.LOSS_SQUARED_HINGE, "-1/1 labels"),
    "cosine_similarity": (L.LOSS_COSINE_SIMILARITY, "values"), "cosine": (L.LOSS_COSINE_SIMILARITY, "values"),
}
_LOSS_BY_TYPE = {L.LOSS_CROSS_ENTROPY: "categorical_crossentropy", L.LOSS_MSE: "mse", L.LOSS_MAE: "mae",
                 L.LOSS_HUBER: "huber", L.LOSS_BINARY_CROSS_ENTROPY: "binary_crossentropy",
                 L.LOSS_KL_DIVERGENCE: "kl_divergence", L.LOSS_HINGE: "hinge", L.LOSS_SQUARED_HINGE: "squared_hinge",
                 L.LOSS_COSINE_SIMILARITY: "cosine_similarity",
                 L.LOSS_BINARY_CROSS_ENTROPY_LOGITS: "binary_crossentropy"}


@dataclass
class CompileConfig:
    optimizer: str
    optimizer_type: int
    heads: list[HeadSpec]
    metrics: list[str]
    backend: Any  # a name, or a list of names (data parallel)
    learning_rate: float | None = None
    weight_decay: float = 0.0
    extra: dict = field(default_factory=dict)
    adam: tuple[float, float, float] | None = None  # (beta_1, beta_2, epsilon); None: ggml's 0.9, 0.999, 1e-8
    head_metrics: list = field(default_factory=list)  # each head's metrics beyond accuracy (keras_metrics.MetricSpec)
    optimizer_spec: OptimizerSpec = field(default_factory=OptimizerSpec)  # the rule, its settings and clipping
    from_logits: list | None = None  # what ggml_compile was told per output (None: nothing)
    shares: list[float] | None = None  # data parallel: each backend's share of a batch as given (None: equal)
    precision: str = "f32"  # the matrix products' type: "f32", "bf16" or "f16" (mixed precision)

    def loss_weights(self) -> list[float] | None:
        """The heads' loss weights for the training graph (None: one head of weight 1, ggml's own loss). A single
        output's weight scales its loss too (Keras), as ggml_evaluate reports it."""
        if len(self.heads) == 1 and self.heads[0].weight == 1.0:
            return None
        return [h.weight for h in self.heads]

    def to_dict(self) -> dict:
        metrics = self.metrics if not any(self.head_metrics) else \
            [self.metrics + [spec_to_dict(s) for s in specs] for specs in self.head_metrics]
        return {"optimizer": self.optimizer, "loss": [h.loss for h in self.heads],
                "loss_weights": [h.weight for h in self.heads], "metrics": metrics, "backend": self.backend,
                "learning_rate": self.learning_rate, "weight_decay": self.weight_decay,
                **({} if self.adam is None else dict(zip(("beta_1", "beta_2", "epsilon"), self.adam))),
                **self.optimizer_spec.settings(),
                **({} if self.from_logits is None else {"from_logits": self.from_logits}),
                **({} if self.shares is None else {"shares": self.shares}),
                **({} if self.precision == "f32" else {"precision": self.precision})}


def _loss_name(loss: Any, i: int) -> str:
    if isinstance(loss, CustomLoss):
        return loss.name
    if is_int(loss) and int(loss) in _LOSS_BY_TYPE:
        return _LOSS_BY_TYPE[int(loss)]
    if not isinstance(loss, str) or loss.lower() not in LOSSES:
        raise GgmlValueError(f"unknown loss {loss!r} (output {i}); expected one of "
                             f"{', '.join(sorted(LOSSES))}, a ggml_opt_loss_type_*() constant or a function "
                             "fn(ctx, y_true, y_pred) built from ggmlpy ops")
    name = loss.lower()
    return {"mean_squared_error": "mse", "mean_absolute_error": "mae", "huber_loss": "huber", "kld": "kl_divergence",
            "kullback_leibler_divergence": "kl_divergence", "cosine": "cosine_similarity"}.get(name, name)


# layers that pass values through (reshaped, repeated, pooled or dropped in training) without a function of their
# own: a softmax before them makes the output probabilities, which the fused cross-entropy would treat as logits
_PASS_THROUGH = (Dropout, Flatten, shaping.Reshape, shaping.RepeatVector, conv.MaxPooling2D, pooling.MaxPooling1D,
                 pooling.AveragePooling1D, pooling.UpSampling2D, conv.GlobalAveragePooling2D, conv.GlobalMaxPooling2D,
                 pooling.GlobalAveragePooling1D, pooling.GlobalMaxPooling1D)


def _check_cross_entropy_output(node: Node, loss: str) -> None:
    """Cross-entropy takes logits (no activation at the end) or a softmax output, whose softmax ggml's fused
    loss applies; anything else was trained as if it were logits (a softmax of sigmoids, of a softmax)."""
    activation = getattr(node.layer, "activation", None)
    name = node.name
    if activation not in (None, "linear", "softmax"):
        raise GgmlValueError(f"{loss}: output '{name}' ends in {activation}, but the cross-entropy takes logits (no "
                             "activation) or a softmax output; for one class per sample use activation='softmax' "
                             "(or none), for independent yes/no labels use loss='binary_crossentropy' with a "
                             "sigmoid")
    inner = node
    while isinstance(inner.layer, _PASS_THROUGH) and inner.inputs:
        inner = inner.inputs[0]
    if inner is not node and getattr(inner.layer, "activation", None) == "softmax":
        raise GgmlValueError(f"{loss}: output '{name}' is a {node.layer.kind} after the softmax of "
                             f"'{inner.layer.name}', so the cross-entropy would apply a second softmax to "
                             f"probabilities; put the {node.layer.kind} before the last layer")


STAND_IN_SIZE = 5  # a variable output size (None) in the stand-in outputs a custom loss is built on at compile


def _head(node: Node, loss: str, weight: float, from_logits: bool | None, custom: Any = None) -> HeadSpec:
    activation = getattr(node.layer, "activation", None)
    name = node.name
    if node.shape[-1] is None:
        raise GgmlValueError(f"output '{name}' has samples of shape {node.shape}: its last size varies with the data "
                             "(None), where the loss and metrics read that axis as the units (the classes); end the "
                             "model in a layer with fixed units (a dense layer, a (steps, 1) output reshaped)")
    if custom is not None:
        if from_logits is not None:
            raise GgmlValueError(f"from_logits= says whether a cross-entropy takes logits, but output '{name}' is "
                                 f"trained with the custom loss '{loss}', which sees the outputs as they are")
        return HeadSpec(name, loss, custom, False, from_logits=False, fused=False, shape=node.shape, weight=weight)
    loss_type, _ = LOSSES[loss]
    if from_logits is not None and loss_type not in (L.LOSS_CROSS_ENTROPY, L.LOSS_BINARY_CROSS_ENTROPY):
        raise GgmlValueError(f"from_logits= says whether a cross-entropy takes logits, but output '{name}' is trained "
                             f"with {loss}; leave it None for that output (a list or dict gives one per output)")
    if loss_type == L.LOSS_CROSS_ENTROPY:
        if from_logits is True and activation == "softmax":
            raise GgmlValueError(f"{loss}: from_logits=True takes the raw outputs, but output '{name}' ends in a "
                                 "softmax; drop the activation (ggml_predict then returns logits) or from_logits")
        if from_logits is False and activation != "softmax":
            raise GgmlValueError(f"{loss}: from_logits=False takes probabilities, but output '{name}' does not end "
                                 "in a softmax; add activation='softmax', or set from_logits=True (or leave it None)")
        _check_cross_entropy_output(node, loss)
    if loss_type == L.LOSS_BINARY_CROSS_ENTROPY and from_logits:
        if activation == "sigmoid":
            raise GgmlValueError(f"{loss}: from_logits=True takes the raw outputs, but output '{name}' ends in a "
                                 "sigmoid; drop the activation (ggml_predict then returns logits) or from_logits")
        loss_type = L.LOSS_BINARY_CROSS_ENTROPY_LOGITS
    elif loss_type == L.LOSS_BINARY_CROSS_ENTROPY and activation != "sigmoid":
        warnings.warn(f"binary_crossentropy expects probabilities; output '{name}' does not end in a sigmoid (add "
                      "activation='sigmoid', or compile with from_logits=True for raw outputs)", GgmlpyWarning,
                      stacklevel=4)
    fused = loss_type == L.LOSS_CROSS_ENTROPY and activation == "softmax"
    return HeadSpec(name, loss, loss_type, loss == "sparse_categorical_crossentropy",
                    from_logits=loss_type in (L.LOSS_CROSS_ENTROPY, L.LOSS_BINARY_CROSS_ENTROPY_LOGITS) and not fused,
                    fused=fused, shape=node.shape, weight=weight)


class _DefaultLoss(str):
    """``ggml_compile``'s default loss: the string itself, told apart from the same name given by the caller."""


DEFAULT_LOSS = _DefaultLoss("categorical_crossentropy")


def ggml_compile(model: Model, optimizer: Any = "adam", loss: Any = DEFAULT_LOSS,
                 metrics: Any = ("accuracy",), backend: Any = "auto", loss_weights: Any = None,
                 learning_rate: float | None = None, weight_decay: float = 0.0, shares: Any = None,
                 beta_1: float | None = None, beta_2: float | None = None, epsilon: float | None = None,
                 momentum: float | None = None, nesterov: bool | None = None, rho: float | None = None,
                 centered: bool | None = None, initial_accumulator_value: float | None = None,
                 clipnorm: float | None = None, global_clipnorm: float | None = None,
                 clipvalue: float | None = None, from_logits: Any = None, precision: str | None = "f32") -> Model:
    """Choose the optimizer, the loss and the backend of a model, and put its weights on that backend.

    Arguments:
        model: a model from ``ggml_model_sequential`` or ``ggml_model``.
        optimizer: ``"adam"`` (ggml's AdamW; ``"adamw"`` is the same), ``"sgd"`` (with ``momentum=`` and
            ``nesterov=``), ``"rmsprop"`` (``rho=``, ``momentum=``, ``centered=``, ``epsilon=``), ``"adagrad"``
            (``initial_accumulator_value=``, ``epsilon=``), ``ggml_opt_optimizer_type_adamw()`` /
            ``ggml_opt_optimizer_type_sgd()``, or an optimizer object from ``ggml_optimizer_adam`` /
            ``_sgd`` / ``_rmsprop`` / ``_adagrad``, which holds its settings (then give none of the keywords below
            from ``learning_rate`` on: they are ggmlR's flat shorthand for the same settings). RMSprop and Adagrad
            have Keras 3's update rules and defaults (rho 0.9, epsilon 1e-7, initial accumulator 0.1); Adam keeps
            ggml's (beta_1 0.9, beta_2 0.999, epsilon 1e-8, where Keras' epsilon is 1e-7: give ``epsilon=1e-7``
            for Keras' trajectory); a setting the optimizer does not read is refused. AdamW and plain SGD run
            ggml's fused step ops inside ggml-opt; the others (and any clipping) run as a graph of ggml
            element-wise ops on the model's device after each backward pass, so they train on every backend.
        loss: ``"categorical_crossentropy"`` (one-hot labels), ``"sparse_categorical_crossentropy"``
            (0-based class ids), ``"binary_crossentropy"`` (probabilities: end the model in a sigmoid),
            ``"mse"``, ``"mae"``, ``"huber"`` (delta 1), Keras' ``"kl_divergence"`` (``"kld"``: label and output
            distributions over the last axis), ``"hinge"`` and ``"squared_hinge"`` (labels -1/1; 0/1 labels
            become -1/1 as in Keras), ``"cosine_similarity"`` (Keras' ``CosineSimilarity``: minus the cosine of each
            output row with its label row, -1 at best), or a ``ggml_opt_loss_type_*()`` constant; a list
            gives one loss per output of a multi-output model. The cross-entropies take **logits**: with a
            softmax last layer the softmax is left to ggml's fused loss in training, and ``ggml_predict``
            still returns probabilities; without an activation, the raw outputs are treated as logits.
            A **function** ``fn(ctx, y_true, y_pred)`` built from ggmlpy ops (or ``ggml_opt_loss_custom(fn, name)``)
            is a custom loss: it gets the labels and the outputs as ggml tensors (``[features, batch]``) and
            returns per-sample or per-element values (the batch as the last axis) or a scalar, whose mean is
            the loss; ggml's autodiff trains it, on the model's device. ``ggml_evaluate`` computes it with the
            same function on the CPU. A model with a custom loss is saved with ``ggml_save_weights`` (its loss
            is code: ``ggml_save_model`` and pickling refuse it).
            Any other last activation (sigmoid, tanh, relu), or a dropout after the softmax, is refused:
            it would be trained as if it were logits.
        from_logits: Keras' switch of the cross-entropies: True (the outputs are logits: the model ends without
            an activation, ``ggml_predict`` returns logits), False (probabilities: a softmax or sigmoid last), or
            None (the default: a categorical cross-entropy follows the last activation, as above; binary
            cross-entropy takes probabilities, as in Keras). ``binary_crossentropy`` with ``from_logits=True``
            trains ``max(z, 0) - z*y + log(1 + exp(-|z|))``, stable for any logit, and its accuracy and
            metrics read ``sigmoid(z)``. A list (or dict by output name) gives one per output; a setting that
            contradicts the output's activation is refused.
        metrics: what ``ggml_fit`` logs per epoch (``train_<name>`` and ``val_<name>`` columns) and
            ``ggml_evaluate`` returns besides the loss, with Keras' names: ``"accuracy"`` (also ``"acc"``,
            ``"sparse_categorical_accuracy"``, ``"categorical_accuracy"``, ``"binary_accuracy"``: logged as
            accuracy, for classification losses), ``"auc"``, ``"precision"``, ``"recall"``,
            ``"true_positives"`` / ``"false_positives"`` / ``"true_negatives"`` / ``"false_negatives"``
            (classification losses: each output element a yes/no prediction at threshold 0.5, Keras' rule),
            ``"mae"``, ``"mse"``, ``"rmse"`` (any loss, on what ``ggml_predict`` returns),
            ``"top_k_categorical_accuracy"`` / ``"sparse_top_k_categorical_accuracy"`` (k=5, cross-entropy),
            or ``ggml_metric_auc`` / ``_precision`` / ``_recall`` / ``_top_k_accuracy`` objects with other
            settings. A list applies to every output it fits (a multi-output model logs
            ``<output>_<metric>``); a list of lists (in output order) or a dict by output name gives each
            output its own. The training values are computed from each step's outputs (in training mode,
            as Keras), which costs a copy of the outputs to the host and some numpy per step (an MNIST-sized
            fit with four metrics keeps ~0.8 of its speed: benchmarks/bench_metrics.py). Unweighted (Keras'
            ``metrics``).
        backend: ``"auto"`` (a hardware GPU if there is one, else the CPU), ``"cpu"``, ``"vulkan"``,
            ``"cuda"`` or a device name such as ``"Vulkan0"`` (or a device from ``ggml_backend_devices()``).
            A list of them trains **data-parallel**: one replica of the model per device (local GPUs, the
            CPU, ggml RPC servers' devices ``"RPC0"``, ...), each batch split between them, the replicas'
            gradients summed on the first device before every optimizer step (weights stay identical:
            the same trajectory as one device with the whole batch). ``ggml_predict``/``ggml_evaluate``
            split their batches too. Batch norm uses each replica's own batch statistics and keeps the
            first replica's running statistics (as PyTorch's DDP); dropout masks differ per replica.
        shares: with several backends, how the batch is split: one positive number per backend
            (``[3, 1]`` gives the first device three quarters of each batch: a GPU beside the CPU, or
            machines of different speed); default equal. The split is exact for any shares.
        loss_weights: multi-output models: the weight of each output's loss (default 1 each), a list in
            output order or a dict by output layer name, as ``loss``.
        learning_rate: the optimizer's starting learning rate (default ggml's 1e-3).
        weight_decay: decoupled weight decay in [0, 1].
        beta_1, beta_2, epsilon: Adam's moment decays (in [0, 1)) and the constant added to the root of the second
            moment (>= 0), Keras' names; None keeps ggml's 0.9, 0.999 and 1e-8 (Keras' epsilon is 1e-7). The
            betas only with ``optimizer="adam"``; ``epsilon`` also for RMSprop and Adagrad (> 0 there, default
            1e-7, Keras'). They are saved with the model and its optimizer state.
        momentum, nesterov, rho, centered, initial_accumulator_value: the settings of SGD, RMSprop and Adagrad
            above (Keras' names; None keeps Keras' defaults).
        clipnorm, global_clipnorm, clipvalue: Keras' gradient clipping before every optimizer step, one kind at
            a time: each weight's gradient scaled to an L2 norm of at most ``clipnorm``, all of them together to a
            joint norm of at most ``global_clipnorm``, or every element clamped to ``[-clipvalue, clipvalue]``.
            Works with every optimizer (with gradient accumulation, on the logical batch's mean gradient, as
            Keras' ``gradient_accumulation_steps``).
        precision: the type of the model's matrix products (dense, conv_1d/conv_2d, attention's projections and
            recurrent layers' input projections; conv_2d_transpose and custom layers keep F32): ``"f32"`` (the
            default), ``"bf16"`` or ``"f16"`` (any case; also Keras' policy names ``"float32"``,
            ``"mixed_bfloat16"``, ``"mixed_float16"``). Mixed precision: the weights and the
            optimizer's state stay F32 (the master copy); each training step casts the weights to the chosen type
            inside its graph, multiplies in it (with F32 sums), and passes the gradients back through the cast
            into the F32 weights; everything else (biases, activations, norms, the loss) computes in F32.
            Predictions use the same products. BF16 keeps F32's range (no loss scaling needed); F16 trains with
            dynamic loss scaling as PyTorch's ``GradScaler``: the loss's gradient is multiplied by a scale
            (starting at 2^16), a step whose gradients overflow is skipped and halves the scale, 2000 good steps
            in a row double it. A device that does not compute the type's products keeps F32 (the placement
            report says so). Expect the loss to differ from F32 training by the type's rounding (BF16 keeps 8
            bits of mantissa, F16 11).

    Value: the model, compiled in place (``model = ggml_compile(model, ...)`` and
    ``ggml_compile(model, ...)`` both work). Weights are drawn here (Glorot-uniform kernels, zero biases)
    from numpy's global random state, so ``np.random.seed`` makes runs repeatable; compiling again keeps
    the weights a model already has, and nothing else: as Keras' ``compile``, each call's settings are its
    own, the ones it is not given at their defaults (recompiling for another backend repeats the loss and the
    optimizer). Weights follow the layer objects, not their names: a layer removed
    with ``ggml_pop_layer`` takes its weights along (a new layer starts fresh, even under the same name),
    and a layer that another compiled model holds (a sub-model built from a trained model's nodes, as in
    Keras' encoder pattern) starts from that model's current weights. They are copied now: training one
    model afterwards does not change the other.

    Example:
        >>> model = g.ggml_model_sequential()
        >>> model = g.ggml_layer_dense(model, 3, activation="softmax", input_shape=(4,))
        >>> model = g.ggml_compile(model, optimizer="adam", loss="categorical_crossentropy", backend="cpu")
        >>> model = g.ggml_compile(model, optimizer=g.ggml_optimizer_sgd(0.01, momentum=0.9), loss="mse")
    """
    if not isinstance(model, Model):
        raise GgmlTypeError(f"ggml_compile: expected a model (ggml_model_sequential / ggml_model), got "
                            f"{type(model).__name__}")
    flat = dict(learning_rate=learning_rate, weight_decay=weight_decay or None, beta_1=beta_1, beta_2=beta_2,
                epsilon=epsilon, momentum=momentum, nesterov=nesterov, rho=rho, centered=centered,
                initial_accumulator_value=initial_accumulator_value, clipnorm=clipnorm,
                global_clipnorm=global_clipnorm, clipvalue=clipvalue)
    if isinstance(optimizer, Optimizer):
        given = [k for k, v in flat.items() if v is not None]
        if given:
            raise GgmlValueError(f"ggml_compile: {', '.join(given)} given beside an optimizer object, which holds its "
                                 f"own settings ({optimizer!r}); pass them to the ggml_optimizer_* function instead")
        chosen = optimizer
    else:
        chosen = resolve_optimizer(optimizer, flat, "ggml_compile")
    precision = precision_name(precision, "ggml_compile")
    backend, shares = _backends(backend, shares)
    inputs, outputs, _ = model.graph()
    mask_flow(model)  # a padding mask only where layers honour it
    for n in outputs:
        if n.dtype == "int32":
            raise GgmlValueError(f"the model's output '{n.layer.name}' is its int32 token-id input itself; outputs "
                                 "are float values a loss can train: put a layer (an embedding) between them")
    loss = _by_output(loss, outputs, "loss")
    loss_weights = _by_output(loss_weights, outputs, "loss_weights")
    losses = list(loss) if isinstance(loss, (list, tuple)) else [loss] * len(outputs)
    if len(losses) != len(outputs):
        raise GgmlValueError(f"the model has {len(outputs)} outputs, got {len(losses)} losses")
    weights = [1.0] * len(outputs) if loss_weights is None else list(loss_weights) \
        if isinstance(loss_weights, (list, tuple)) else [loss_weights]
    if len(weights) != len(outputs) or any(not is_real(w) or not 0 <= w <= FLOAT32_MAX for w in weights):
        raise GgmlValueError(f"loss_weights must be {len(outputs)} finite numbers >= 0 (float32: at most "
                             f"{FLOAT32_MAX:.4g}), got {loss_weights!r}")
    logits = _from_logits(_by_output(from_logits, outputs, "from_logits"), losses, len(outputs))
    losses = [ggml_opt_loss_custom(given) if callable(given) and not isinstance(given, CustomLoss) else given
              for given in losses]
    heads = [_head(n, _loss_name(head_loss, i), float(w), f, head_loss if isinstance(head_loss, CustomLoss) else None)
             for i, (n, head_loss, w, f) in enumerate(zip(outputs, losses, weights, logits))]
    if loss is DEFAULT_LOSS:
        heads = [replace(h, default_loss=True) for h in heads]
    _check_custom_losses(heads, several_devices=isinstance(backend, list))
    accuracy, head_metrics = resolve_metrics(metrics, heads, [n.name for n in outputs])
    config = CompileConfig(chosen.name, chosen.spec.ggml_type, heads, ["accuracy"] if accuracy else [], backend,
                           chosen.learning_rate, chosen.weight_decay, adam=chosen.adam, head_metrics=head_metrics,
                           optimizer_spec=chosen.spec,
                           from_logits=logits if any(f is not None for f in logits) else None, shares=shares,
                           precision=precision)
    # before the old one goes (a failure leaves the model as it was); the weights come from the newest holder
    # of each layer: the old runtime, another model sharing the layer, or the copy a layer carries
    runtime = Runtime(model, backend, shares=shares, compute_type=PRECISIONS[precision])
    try:
        replace_runtime(model, runtime, config)
    except BaseException:
        runtime.free()  # the old one is in use: keep it, drop the new one
        raise
    return model


def compile_again(model: Model, undo: Callable[[], None]) -> Model:
    """The model compiled again on its backend with its settings, after a change to what its runtime holds (a
    layer's quantized types, its adapters): the weights come from the old runtime (each layer's newest holder), and
    the optimizer's state starts afresh. Where that fails, ``undo()`` puts the change back and the old runtime
    stays."""
    cfg = compiled(model, "compile")
    try:
        runtime = Runtime(model, cfg.backend, shares=cfg.shares, compute_type=PRECISIONS[cfg.precision])
        try:
            replace_runtime(model, runtime, cfg)
        except BaseException:
            runtime.free()
            raise
    except BaseException:
        undo()
        raise
    return model


def _check_custom_losses(heads: list[HeadSpec], several_devices: bool) -> None:
    """A custom loss is built once now on stand-in outputs: an op ggml cannot train through is refused here, not
    at the first ggml_fit (one that cannot be built on them, depending on the real batch size, is checked there).
    Data-parallel replicas each compute the loss on their share of a batch and the step averages the shares'
    gradients by their sizes: a custom loss that returns one value for the whole batch is not such a mean (a sum
    would shrink by the number of replicas, a maximum would be another function)."""
    for h in heads:
        stand_in = tuple(reversed([STAND_IN_SIZE if d is None else d for d in h.shape]))  # a variable size: any
        batch_value = returns_batch_value(h.custom, stand_in) if h.custom is not None else None
        if batch_value is True and several_devices:
            raise GgmlValueError(
                f"the custom loss '{h.custom.name}' of output '{h.name}' returns one value per batch: data-parallel "
                "training computes it on each device's share of the batch and averages the shares, which is not the "
                "whole batch's value (a sum would shrink by the number of devices); return per-sample values (the "
                "batch as the last axis, averaged as Keras averages them) to train on several devices, or train on "
                "one")


def _from_logits(value: Any, losses: list, n: int) -> list:
    """``from_logits`` per output: None (the output's activation decides), True or False; a loss given as
    ``ggml_opt_loss_type_binary_cross_entropy_logits()`` takes logits."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * n
    if len(values) != n or any(v is not None and not isinstance(v, (bool, np.bool_)) for v in values):
        raise GgmlValueError(f"from_logits must be True, False or None, or {n} of them (a list in output order or a "
                             f"dict by output name), got {value!r}")
    return [True if v is None and is_int(head_loss) and int(head_loss) == L.LOSS_BINARY_CROSS_ENTROPY_LOGITS else
            (None if v is None else bool(v)) for v, head_loss in zip(values, losses)]


def _backends(backend: Any, shares: Any) -> tuple[Any, list[float] | None]:
    """``backend`` as a name, or as a list of two or more distinct device names (data parallel), and the
    shares of the batch each device takes."""
    single = not isinstance(backend, (list, tuple))
    items = [backend] if single else list(backend)
    names = []
    for b in items:
        if isinstance(b, Device):
            b = b.name
        if not isinstance(b, str):
            raise GgmlTypeError(f"backend must be 'auto', 'cpu', 'vulkan', 'cuda', a device name or a device, or a "
                                f"list of them (data parallel), got {b!r}")
        names.append(b)
    if single:
        if shares is not None:
            raise GgmlValueError("shares= splits each batch between several backends; give backend a list of "
                                 "devices (or drop shares)")
        return names[0], None
    if len(names) < 2:
        raise GgmlValueError(f"backend as a list trains data-parallel on two or more devices, got {names!r}; give "
                             "one device as a string")
    if shares is None:
        return names, None
    values = list(np.ravel(shares)) if isinstance(shares, (list, tuple, np.ndarray)) else None
    if values is None or len(values) != len(names) or \
            any(not is_real(v) or not 0 < v <= FLOAT32_MAX for v in values):
        raise GgmlValueError(f"shares must be {len(names)} positive numbers, one per backend, got {shares!r}")
    return names, [float(v) for v in values]


def by_name(values: dict, names: list[str], what: str, kind: str) -> list:
    """Keras' dict form ``{layer name: value}`` as a list in the model's order of its inputs or outputs
    (``kind``); every name exactly once."""
    unknown = [k for k in values if k not in names]
    missing = [k for k in names if k not in values]
    if unknown or missing:
        problem = f"{unknown} name no {kind} of the model" if unknown else f"the {kind}(s) {missing} have none"
        raise GgmlValueError(f"{what}: a dict is keyed by the names of the model's {kind} layers {names}; {problem} "
                             f"(or pass a list in the order of the {kind}s)")
    return [values[k] for k in names]


def _by_output(value: Any, outputs: list, what: str) -> Any:
    """``{output layer name: value}`` as a list in the model's output order; anything else as it is."""
    if not isinstance(value, dict):
        return value
    return by_name(value, [n.layer.name for n in outputs], what, "output")


def build_training_graph(model: Model, cfg: CompileConfig, batch: int, store: Any = None,
                         read_outputs: bool = False, input_shapes: InputShapes = None) -> GraphInstance:
    """The training graph of a compiled model for ``batch`` samples (on the weights of ``store``: a replica's;
    default the model's): a final softmax left to ggml's fused cross-entropy, sequence outputs of a
    cross-entropy made ``[classes, positions * batch]`` rows; ``read_outputs``: the outputs copied where each
    step's metrics read them (compiled metrics not summed on the device); ``input_shapes``: the inputs' sample
    shapes where the model has variable sizes (``runtime.input_shapes_of``)."""
    outputs = model.graph()[1]
    return build_graph(model, store or model.runtime.params, batch, training=True,
                       logits_for={id(n) for n, h in zip(outputs, cfg.heads) if h.fused},
                       rows_for={id(n) for n, h in zip(outputs, cfg.heads) if h.token_level},
                       read_outputs=read_outputs, input_shapes=input_shapes)


def compiled(model: Any, fn: str) -> CompileConfig:
    """The compile settings, or an error saying to compile first."""
    if not isinstance(model, Model):
        raise GgmlTypeError(f"{fn}: expected a model, got {type(model).__name__}")
    if model.compiled is None or model.runtime is None:
        raise GgmlStateError(f"{fn}: the model is not compiled; call ggml_compile(model, ...) first "
                             "(after adding or removing layers, compile again)")
    if not model.runtime.params.alive:
        raise GgmlStateError(f"{fn}: the model's weights have been freed")
    return model.compiled
