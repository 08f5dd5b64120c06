"""Creating opt contexts: ``ggml_opt_default_params``, ``ggml_opt_init`` and the fit variants."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from ..compute.checks import check_opt_heads
from ..compute.sched import Scheduler
from ..core.args import is_int, list_arg, weight_decay_arg
from ..core.handle import unwrap, using
from ..errors import expect, GgmlTypeError, GgmlValueError
from ..graph.objects import Context, Tensor
from . import losses as L
from .constants import BUILD_FORWARD, BUILD_GRAD, BUILD_OPT, check_optimizer, OPTIMIZER_ADAMW
from .context import check_static, heads_from, OptContext
from .params import ADAMW_FIELDS, LrUserdata, OptimizerParams, SGD_FIELDS


class OptParams:
    """ggml's ``struct ggml_opt_params`` (``ggml_opt_default_params``), to fill in and pass to ``ggml_opt_init``.

    Public fields, as in C: ``sched``, ``loss_type``, ``build_type``, ``opt_period``, ``optimizer``,
    ``ctx_compute``, ``inputs``, ``outputs``, ``get_opt_pars``, ``get_opt_pars_ud``, plus ``opt_pars``: the
    optimizer hyper-parameters used when ``get_opt_pars`` is None (an OptimizerParams; ``params.adamw`` and
    ``params.sgd`` are shortcuts to its fields). ggmlR's list form works too: ``params["loss_type"]``,
    ``params["build_type"]``, ``params["opt_period"]``, ``params["optimizer"]`` (read and set), and
    ``"loss_type" in params``, ``dict(params)``, ``keys()``/``items()``.
    """
    _KEYS = ("loss_type", "build_type", "opt_period", "optimizer")

    def __init__(self, sched: Scheduler, loss_type: int) -> None:
        self.sched = sched
        self.loss_type = loss_type
        self.build_type = BUILD_OPT
        self.opt_period = 1
        self.optimizer = OPTIMIZER_ADAMW
        self.ctx_compute: Context | None = None
        self.inputs: Tensor | None = None
        self.outputs: Tensor | None = None
        self.opt_pars = OptimizerParams()
        self.get_opt_pars: Callable[[object], object] | None = None  # fn(ud) -> optimizer parameters
        self.get_opt_pars_ud: object = None

    @property
    def adamw(self) -> ADAMW_FIELDS:
        return self.opt_pars.adamw

    @property
    def sgd(self) -> SGD_FIELDS:
        return self.opt_pars.sgd

    def __getitem__(self, key: str) -> object:
        if key not in self._KEYS and key not in ("ctx_compute", "inputs", "outputs", "opt_pars", "get_opt_pars",
                                                 "get_opt_pars_ud", "sched"):
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: object) -> None:
        if key not in self._KEYS:
            raise KeyError(f"{key!r}: the list form sets {', '.join(self._KEYS)} (other fields are attributes)")
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in self._KEYS

    def __iter__(self) -> Iterator[str]:
        return iter(self._KEYS)

    def __len__(self) -> int:
        return len(self._KEYS)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key) if key in self._KEYS else default

    def items(self) -> list:
        return [(k, getattr(self, k)) for k in self._KEYS]

    def values(self) -> list:
        return [getattr(self, k) for k in self._KEYS]

    def keys(self) -> tuple:
        return self._KEYS

    def as_dict(self) -> dict:
        """ggmlR's list: ``{"loss_type", "build_type", "opt_period", "optimizer"}``."""
        return {k: getattr(self, k) for k in self._KEYS}

    def __repr__(self) -> str:
        return (f"<OptParams loss_type={self.loss_type} build_type={self.build_type} opt_period={self.opt_period} "
                f"optimizer={self.optimizer} {self.opt_pars.adamw!r} {self.opt_pars.sgd!r}"
                f"{' get_opt_pars=' + getattr(self.get_opt_pars, '__name__', '?') if self.get_opt_pars else ''}>")


def ggml_opt_default_params(sched: Scheduler, loss_type: int) -> OptParams:
    """ggml's default parameters of an opt context, to adjust and pass to ``ggml_opt_init(params)``.

    The fields are ggml's (see OptParams): build type OPT, ``opt_period`` 1, optimizer AdamW, no
    ``ctx_compute``/``inputs``/``outputs`` (dynamic graphs until set), and ggml's default optimizer
    hyper-parameters in ``opt_pars``, changed through public, checked fields (``params.adamw.alpha``,
    ``.beta1``, ``.beta2``, ``.eps``, ``.wd``; ``params.sgd.alpha``, ``.wd``). Instead of constants,
    ``get_opt_pars`` may be a function ``f(get_opt_pars_ud)`` returning the parameters (an
    OptimizerParams or a dict ``{"adamw": {...}, "sgd": {...}}``) before every optimizer step, as ggml's
    callback. ggmlR returns the list ``loss_type, build_type, opt_period, optimizer``: index the object
    with those names (``params["opt_period"]``) or call ``params.as_dict()``.

    Arguments:
        sched: the Scheduler the context will run on.
        loss_type: a loss type constant (``ggml_opt_loss_type_mse()``, ...).

    Value: an OptParams.

    Example:
        >>> params = ggml_opt_default_params(sched, ggml_opt_loss_type_mse())
        >>> params.ctx_compute, params.inputs, params.outputs = ctx, x, out
        >>> params.adamw.alpha = 0.01; params.adamw.beta1 = 0.5
        >>> opt_ctx = ggml_opt_init(params)
    """
    unwrap(sched, Scheduler, "ggml_opt_default_params(sched)")
    L.check_loss_type(loss_type, "ggml_opt_default_params(loss_type)")
    return OptParams(sched, int(loss_type))


def ggml_opt_init(sched: Scheduler | OptParams, loss_type: int | None = None, optimizer: int = OPTIMIZER_ADAMW,
                  opt_period: int = 1, ctx_compute: Context | None = None, inputs: Tensor | None = None,
                  outputs: Tensor | None = None, build_type: int = BUILD_OPT) -> OptContext:
    """An optimization context: the forward, backward and optimizer graphs for training a model.

    The low-level training API (ggml-opt): per batch, write the inputs and labels, then call
    ``ggml_opt_alloc`` and ``ggml_opt_eval``. The fit functions do all of this for you. With
    ``ctx_compute``, ``inputs`` and ``outputs`` the graphs are built once (static graphs, the usual
    case); without them the graph is supplied before every ``ggml_opt_alloc`` with
    ``ggml_opt_prepare_alloc`` (dynamic graphs, ggml's own losses only). The context uses ggml's
    default optimizer parameters (AdamW lr 1e-3); ``ggml_opt_init_for_fit`` returns a handle to change
    the learning rate. The model is checked first: no trainable tensor, ops without a backward pass,
    a scheduler too small or already serving another static opt context raise before ggml is called.

    ggml's own form ``ggml_opt_init(params)`` takes an OptParams from ``ggml_opt_default_params`` instead
    (every setting, the optimizer hyper-parameters and a ``get_opt_pars`` callback included, comes from its
    fields; the other arguments must then be left out). The context reads ``params.opt_pars`` at every
    optimizer step, so changing its fields later changes the following steps.

    Arguments:
        sched: the Scheduler the graphs run on (``ggml_backend_sched_new``), or an OptParams (ggml's form).
        loss_type: a loss type constant (``ggml_opt_loss_type_mse()``, ``..._cross_entropy()`` (logits),
            ...); with several outputs, a list of them, one per output. Required unless ``sched`` is an
            OptParams.
        optimizer: [glossary]
        opt_period: gradient accumulation: the optimizer steps once every ``opt_period`` evals
            (default 1: every batch).
        ctx_compute: the Context holding the model graph (default None: dynamic graphs).
        inputs: the input Tensor of the model, already allocated (default None).
        outputs: the output Tensor the loss is computed from (default None); a list for several heads.
        build_type: ``ggml_opt_build_type_opt()`` (the default: train) or ``..._forward()`` (evaluate
            only); ``..._grad()`` is refused.

    Value: an OptContext handle (a context manager; freed with ``ggml_opt_free``). Its labels tensor
    (``ggml_opt_labels``) receives the labels of each batch.

    Example:
        >>> opt = ggml_opt_init(sched, ggml_opt_loss_type_cross_entropy(), ctx_compute=ctx, inputs=x,
        ...                     outputs=logits)
        >>> ggml_backend_tensor_set_data(x, xb); ggml_backend_tensor_set_data(ggml_opt_labels(opt), yb)
        >>> ggml_opt_alloc(opt, True); ggml_opt_eval(opt, res)
    """
    if isinstance(sched, OptParams):
        p = sched
        given = [name for name, value, default in (
            ("loss_type", loss_type, None), ("optimizer", optimizer, OPTIMIZER_ADAMW), ("opt_period", opt_period, 1),
            ("ctx_compute", ctx_compute, None), ("inputs", inputs, None), ("outputs", outputs, None),
            ("build_type", build_type, BUILD_OPT)) if value is not default and value != default]
        if given:
            raise GgmlValueError(f"ggml_opt_init: with an OptParams, every setting comes from its fields; set "
                                 f"params.{given[0]} instead of passing {', '.join(given)}")
        if p.get_opt_pars is not None and not callable(p.get_opt_pars):
            raise GgmlTypeError(f"ggml_opt_init: params.get_opt_pars must be None or a function "
                                f"f(get_opt_pars_ud) returning the optimizer parameters, got {p.get_opt_pars!r}")
        if not isinstance(p.opt_pars, OptimizerParams):
            raise GgmlTypeError("ggml_opt_init: params.opt_pars must be an OptimizerParams "
                                f"(ggml_opt_get_default_optimizer_params()), got {p.opt_pars!r}")
        lr_ud = LrUserdata(params=p.opt_pars.c_struct)
        if p.get_opt_pars is not None:
            fn, ud = p.get_opt_pars, p.get_opt_pars_ud
            lr_ud.provider = lambda: fn(ud)
        opt = opt_init(p.sched, p.loss_type, p.optimizer, p.opt_period, p.ctx_compute, p.inputs, p.outputs,
                        p.build_type, lr_ud)
        opt.opt_pars_owner = p.opt_pars  # the struct ggml reads lives as long as the context
        return opt
    if loss_type is None:
        raise GgmlTypeError("ggml_opt_init: loss_type is required (or pass an OptParams from "
                            "ggml_opt_default_params as the only argument)")
    return opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type)


def opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type=BUILD_OPT,
              lr_ud=None, loss_mask_ne0=None, loss_weights=None, sample_weighted=False,
              extra_outputs=(), penalties=(), tallies=None) -> OptContext:
    unwrap(sched, Scheduler, "sched")
    check_optimizer(optimizer)
    expect(is_int(opt_period) and 1 <= opt_period < 1 << 31,
           f"opt_period must be an int in [1, 2**31 - 1], got {opt_period!r}")
    if build_type not in (BUILD_FORWARD, BUILD_GRAD, BUILD_OPT):
        raise GgmlValueError("build_type must be ggml_opt_build_type_forward(), ggml_opt_build_type_grad() or "
                             f"ggml_opt_build_type_opt(), got {build_type!r}")
    if build_type == BUILD_GRAD and ctx_compute is None:
        raise GgmlValueError("build type GRAD (gradients only) needs static graphs: pass ctx_compute, inputs and "
                             "outputs")
    def busy(other: str) -> str:
        return (f"this scheduler is in use by {other} (in this thread or another); build the opt context after "
                "that call has returned, or on another scheduler")
    # "serves no opt context" and building one are one step: two threads cannot both pass; and no other call may
    # run the scheduler meanwhile (marked exclusively: a compute on it is refused until the build is done)
    with sched.opt_lock, using([sched], "ggml_opt_init", exclusive=[sched], busy=busy):
        return _opt_init_locked(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type,
                                lr_ud, loss_mask_ne0, loss_weights, sample_weighted, extra_outputs, penalties,
                                tallies)


def _opt_init_locked(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, build_type, lr_ud,
                     loss_mask_ne0, loss_weights, sample_weighted, extra_outputs, penalties=(),
                     tallies=None) -> OptContext:
    check_static(sched, ctx_compute, inputs, outputs)
    if ctx_compute is None:
        types = loss_type if isinstance(loss_type, (list, tuple)) else [loss_type]
        for t in types:
            L.check_loss_type(t)
            if t not in L.BUILTIN_LOSSES or len(types) > 1:
                raise GgmlValueError("dynamic graphs support ggml's own losses (mean, sum, cross_entropy, mse) "
                                     "with one head; pass ctx_compute/inputs/outputs for the others")
        # dynamic graphs: ggml-opt builds the graph from ggml_opt_prepare_alloc's outputs, none exists here
        heads = [L.Head(int(types[0]), None)]  # type: ignore[arg-type]  # no outputs tensor before that
    else:
        heads = heads_from(outputs, loss_type, loss_weights, sample_weighted)
        to_ggml = len(heads) == 1 and heads[0].loss_type in L.BUILTIN_LOSSES and heads[0].weight == 1.0 \
            and not sample_weighted and (tallies is None or not tallies.device)
        check_opt_heads(heads, "ggml_opt_init", to_ggml)
    if loss_mask_ne0 is not None:
        expect(is_int(loss_mask_ne0) and loss_mask_ne0 >= 0,
               f"loss_mask_ne0 must be None or an int >= 0, got {loss_mask_ne0!r}")
    return OptContext(sched, heads, optimizer, opt_period, ctx_compute, inputs, build_type, lr_ud,
                      loss_mask_ne0 or None, extra_outputs, penalties, tallies)


def ggml_opt_init_for_fit(sched: Scheduler, loss_type: int, optimizer: int = OPTIMIZER_ADAMW, opt_period: int = 1,
                          ctx_compute: Context | None = None, inputs: Tensor | None = None,
                          outputs: Tensor | None = None, loss_mask_ne0: int | None = None,
                          weight_decay: float = 0.0) -> dict:
    """An opt context plus the handle that changes its learning rate: what a training loop needs.

    Like ``ggml_opt_init`` (build type OPT), with the learning rate and weight decay held in ``lr_ud``
    so that ``ggml_opt_set_lr``/``ggml_opt_get_lr`` and LR schedules can change them between steps.

    Arguments:
        sched: the Scheduler the graphs run on.
        loss_type: a loss type constant, e.g. ``ggml_opt_loss_type_mse()``; cross-entropy takes logits,
            binary cross-entropy probabilities.
        optimizer: [glossary]
        opt_period: the optimizer steps once every ``opt_period`` evals (default 1).
        ctx_compute: the Context holding the model graph (default None: dynamic graphs).
        inputs: the allocated input Tensor (default None).
        outputs: the output Tensor (default None).
        loss_mask_ne0: for weighted MSE, the width of each weight row: None or 1 (one weight per
            sample) or the outputs' ne[0] (one per element). Default None.
        weight_decay: [glossary]

    Value: a dict ``{"opt_ctx": OptContext, "lr_ud": LrUserdata}``.

    Example:
        >>> fit = ggml_opt_init_for_fit(sched, ggml_opt_loss_type_mse(), ctx_compute=ctx, inputs=x,
        ...                             outputs=out, weight_decay=0.01)
        >>> ggml_opt_set_lr(fit["lr_ud"], adamw_lr=3e-4)
    """
    lr_ud = LrUserdata(weight_decay_arg(weight_decay))
    opt = opt_init(sched, loss_type, optimizer, opt_period, ctx_compute, inputs, outputs, BUILD_OPT, lr_ud,
                    loss_mask_ne0)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def ggml_opt_init_for_fit_multi(sched: Scheduler, loss_types: Sequence[int], loss_weights: Sequence[float] | None,
                                labels_offs: Sequence[int] | None = None, optimizer: int = OPTIMIZER_ADAMW,
                                opt_period: int = 1, ctx_compute: Context | None = None,
                                inputs: Tensor | None = None, outputs: Sequence[Tensor] | None = None,
                                weight_decay: float = 0.0) -> dict:
    """An opt context for several output heads: total loss = sum_i loss_weights[i] * loss_i.

    Each head has its own loss type and weight; every head's loss is a mean over its output elements
    (cross-entropy on logits as usual). The heads' labels sit side by side in one label row per
    sample; ``labels_offs`` says where each head's columns start. Static graphs only.

    Arguments:
        sched: the Scheduler the graphs run on.
        loss_types: one loss type constant per head.
        loss_weights: one weight (a finite number >= 0) per head, or None for all 1.
        labels_offs: the 0-based column where each head's labels start, or None (the default: heads
            back to back in the order of ``outputs``).
        optimizer: [glossary]
        opt_period: the optimizer steps once every ``opt_period`` evals (default 1).
        ctx_compute: the Context holding the model graph (required).
        inputs: the allocated input Tensor (required).
        outputs: the list of output Tensors, one per head (all with the same batch size).
        weight_decay: decoupled weight decay in [0, 1] (default 0: off).

    Value: a dict ``{"opt_ctx": OptContext, "lr_ud": LrUserdata}``. Raises GgmlValueError without
    ``ctx_compute`` or when the counts of heads, types and weights differ.

    Example:
        >>> fit = ggml_opt_init_for_fit_multi(sched, [ggml_opt_loss_type_cross_entropy(),
        ...     ggml_opt_loss_type_mse()], [1.0, 0.5], ctx_compute=ctx, inputs=x, outputs=[logits, box])
    """
    if ctx_compute is None:
        raise GgmlValueError("ggml_opt_init_for_fit_multi needs static graphs: pass ctx_compute, inputs, outputs")
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    weights = [1.0] * len(outs) if loss_weights is None else loss_weights
    lr_ud = LrUserdata(weight_decay_arg(weight_decay))
    types = list_arg("ggml_opt_init_for_fit_multi", "loss_types", loss_types, "loss types, one per head")
    opt = opt_init(sched, types, optimizer, opt_period, ctx_compute, inputs, outs, BUILD_OPT, lr_ud,
                    None, weights)
    opt.labels_offs = resolve_labels_offs(opt.heads, labels_offs)
    return {"opt_ctx": opt, "lr_ud": lr_ud}


def resolve_labels_offs(heads: list[L.Head], labels_offs: Sequence[int] | None) -> list[int]:
    widths = [h.outputs.nelements() // L.physical_batch(h.outputs) for h in heads]
    if labels_offs is None:
        return [int(x) for x in np.concatenate([[0], np.cumsum(widths)[:-1]])]
    offs = list_arg("ggml_opt_init_for_fit_multi", "labels_offs", labels_offs, "ints, one per head")
    if len(offs) != len(heads) or any(not is_int(o) or o < 0
                                      for o in offs):
        raise GgmlValueError(f"labels_offs must hold one int >= 0 per head ({len(heads)}), got {labels_offs!r}")
    return [int(o) for o in offs]
