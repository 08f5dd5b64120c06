"""The model layer's one data rule: arrays are sample-major, in the user's orientation.

``x`` is ``(N, *input_shape)`` (channels last), ``y`` is ``(N, *output_shape)`` (one-hot for
categorical cross-entropy) or ``(N,)`` 0-based class ids for the sparse loss. A C-ordered array of
that shape is already in ggml layout, so nothing is transposed; a wrong shape is refused with both
shapes named, and a hint when the axes look swapped.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Union

import numpy as np
import numpy.typing as npt

from ...backend.transfer import as_numeric
from ...core.args import is_int, is_real
from ...errors import GgmlTypeError, GgmlValueError
from ..network.model import Model, Node
from .compile import by_name, CompileConfig
from .heads import HeadSpec


if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10: only the type checker reads it


# x or y of ggml_fit, ggml_predict, ggml_evaluate: an array-like (for one input or output; a DataFrame too), a list of
# them in the model's order, or a dict by layer name (Keras' forms)
ModelData = Union[npt.ArrayLike, Sequence[npt.ArrayLike], Mapping[str, npt.ArrayLike]]


def _fmt(shape: tuple) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _as_numeric(value: object, what: str) -> np.ndarray:
    arr = as_numeric(value, what)
    if np.iscomplexobj(arr):
        raise GgmlTypeError(f"{what}: complex data cannot train a real-valued model")
    return arr


def _fits(shape: tuple, expected: tuple) -> bool:
    """Whether a sample shape is ``expected``, a None there taking any size (a variable size)."""
    return len(shape) == len(expected) and all(e is None or s == e for s, e in zip(shape, expected))


def check_shape(arr: np.ndarray, expected: tuple, what: str, n: int | None = None) -> None:
    """``arr`` must be ``(N, *expected)`` (N == n when given; a None in ``expected`` is a size that may vary)."""
    if arr.ndim == len(expected) + 1 and _fits(tuple(arr.shape[1:]), tuple(expected)) and \
            (n is None or arr.shape[0] == n):
        if any(e is None and s == 0 for s, e in zip(arr.shape[1:], expected)):
            raise GgmlValueError(f"{what}: samples of shape {_fmt(arr.shape[1:])} have no values along a variable "
                                 f"size of {_fmt(tuple(expected))}; give at least one (a sequence of one step)")
        return
    want = _fmt(("N" if n is None else n,) + tuple(expected))
    msg = f"{what} must have shape {want} (samples first, one sample {_fmt(tuple(expected))}), got {_fmt(arr.shape)}"
    if None in expected:
        msg += "; None is a size that may vary from call to call (one size within a call: pad the samples to it)"
    if arr.ndim == len(expected) + 1 and _fits(tuple(arr.shape[1:]), tuple(expected)):
        msg += f"; it has {arr.shape[0]} samples where {n} were expected (x and y must have one row per sample)"
    elif arr.ndim == 2 and len(expected) == 1 and arr.shape[0] == expected[0] and (n is None or arr.shape[1] == n):
        msg += "; it looks transposed: pass arr.T (samples as rows)"
    elif _fits(tuple(arr.shape), tuple(expected)) and n in (None, 1):
        msg += "; it is one sample without the samples axis: pass arr[None] (or arr.reshape(1, *arr.shape))"
    elif arr.ndim == len(expected) + 1 and None not in expected and sorted(arr.shape[1:]) == sorted(expected):
        msg += "; the axes look permuted: put samples first and channels last (np.moveaxis / np.transpose)"
    raise GgmlValueError(msg)


def _one_array_list(value: object, rank: int) -> TypeGuard[list | tuple]:
    """``[x]``: a list holding one whole array (Keras' form for a model with one input or output)."""
    return isinstance(value, (list, tuple)) and len(value) == 1 and np.ndim(value[0]) == rank \
        and not isinstance(value[0], (list, tuple))


def _float32(arr: np.ndarray, label: str, finite: bool) -> np.ndarray:
    """``arr`` as C-ordered float32, refusing values float32 cannot hold (they would become inf) and, with
    ``finite``, NaN and inf (one NaN input makes every weight NaN after the next step)."""
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.ascontiguousarray(arr, dtype=np.float32)
    if finite and out.size and not np.isfinite(out).all():
        bad = ~np.isfinite(out)
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        src = arr[where]
        why = (f"{src:g} is beyond float32's range (+-{float(np.finfo(np.float32).max):.4g})"
               if np.isfinite(src) else f"it is {src}")
        raise GgmlValueError(f"{label}: the value at {where} cannot train: {why} ({int(bad.sum())} such values); "
                             "training on it would make every weight NaN. Clean or rescale the data (np.nan_to_num, "
                             "np.clip) first")
    if not finite and out.size and not np.can_cast(arr.dtype, np.float32, "safe"):  # float64 may overflow
        overflow = np.isinf(out) & np.isfinite(arr)
        if overflow.any():
            where = tuple(int(i) for i in np.argwhere(overflow)[0])
            raise GgmlValueError(f"{label}: the value {arr[where]:g} at {where} is beyond float32's range "
                                 f"(+-{float(np.finfo(np.float32).max):.4g}) and would become inf; rescale the data")
    return out


def model_inputs(model: Model, x: object, what: str = "x", n: int | None = None, finite: bool = False,
                 allow_empty: bool = False) -> list[np.ndarray]:
    """One C-ordered array per model input, float32 (int32 for token ids), shapes checked. ``finite``: NaN and
    inf are refused (data that trains or validates). ``allow_empty``: zero samples are fine (a prediction)."""
    inputs = model.graph()[0]
    if isinstance(x, dict):
        values = by_name(x, [n.name for n in inputs], what, "input")
    else:
        if len(inputs) == 1 and _one_array_list(x, len(inputs[0].shape) + 1):
            x = x[0]
        values = list(x) if isinstance(x, (list, tuple)) and len(inputs) > 1 else [x]
    if len(values) != len(inputs):
        raise GgmlValueError(f"{what}: the model has {len(inputs)} inputs, got {len(values)} arrays (pass a list in "
                             "the order of the model's inputs)")
    out = []
    for i, (node, value) in enumerate(zip(inputs, values)):
        label = what if len(inputs) == 1 else f"{what}[{i}] ('{node.layer.name}')"
        arr = _as_numeric(value, label)
        check_shape(arr, node.shape, label, n)
        n = arr.shape[0] if n is None else n
        if node.dtype == "int32":
            if not np.issubdtype(arr.dtype, np.integer):
                if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                    raise GgmlValueError(f"{label}: token ids must be integers")
            out.append(_token_ids(arr, model, node, label))
        else:
            out.append(_float32(arr, label, finite))
    if n == 0 and not allow_empty:
        raise GgmlValueError(f"{what} has no samples")
    return out


def _token_ids(arr: np.ndarray, model: Model, node: Node, label: str) -> np.ndarray:
    """int32 ids, each inside the vocabulary of every layer that reads this input: an embedding's ``vocab_size``,
    or a layer's ``vocab_sizes`` (one per input, None where it sets none: an imported ONNX graph's tables)."""
    for n in model.graph()[2]:
        for k, i in enumerate(n.inputs):
            if i is not node:
                continue
            limits = getattr(n.layer, "vocab_sizes", None)
            limit = limits[k] if limits is not None else getattr(n.layer, "vocab_size", None)
            if limit is None:
                continue
            bad = (arr < 0) | (arr >= limit)  # on the values as given: 1e30 does not wrap first
            if bad.any():
                where = tuple(int(j) for j in np.argwhere(bad)[0])
                raise GgmlValueError(f"{label}: token id {arr[where]:g} at {where} is outside [0, {limit}) of "
                                     f"{n.layer.kind} '{n.layer.name}'")
    return np.ascontiguousarray(arr, dtype=np.int32)


def model_targets(model: Model, cfg: CompileConfig, y: object, xs: list[np.ndarray],
                  what: str = "y") -> list[np.ndarray]:
    """One float32 array per output, in the shape of the outputs the inputs ``xs`` (``model_inputs``') make (class
    ids made one-hot)."""
    heads = cfg.heads
    n = xs[0].shape[0]
    if y is None:
        raise GgmlValueError(f"{what} is missing: this model's loss needs labels ({what} of shape (N, ...))")
    if isinstance(y, dict):
        values = by_name(y, [h.name for h in heads], what, "output")
    else:
        if len(heads) == 1 and _one_array_list(y, len(heads[0].shape) + 1) or len(heads) == 1 and \
                heads[0].sparse and _one_array_list(y, len(heads[0].shape)):
            y = y[0]
        values = list(y) if isinstance(y, (list, tuple)) and len(heads) > 1 else [y]
    if len(values) != len(heads):
        raise GgmlValueError(f"{what}: the model has {len(heads)} outputs, got {len(values)} label arrays")
    ys = [_target(h, _as_numeric(v, what if len(heads) == 1 else f"{what}[{i}] ('{h.name}')"), n,
                  what if len(heads) == 1 else f"{what}[{i}] ('{h.name}')")
          for i, (h, v) in enumerate(zip(heads, values))]
    _check_target_sizes(model, cfg, xs, ys, what)
    return ys


def _target(h: HeadSpec, arr: np.ndarray, n: int, what: str) -> np.ndarray:
    units = h.shape[-1]
    if h.sparse:
        ids_shape = (n,) + tuple(h.shape[:-1])   # one id per sample, or per position of a sequence output
        if _fits(arr.shape, ids_shape + (1,)):
            arr = arr[..., 0]
        if not _fits(arr.shape, ids_shape):
            raise GgmlValueError(f"{what}: sparse_categorical_crossentropy takes class ids of shape "
                                 f"{_fmt(ids_shape)}, got {_fmt(arr.shape)}"
                                 + ("; for one-hot labels use categorical_crossentropy"
                                    if _fits(arr.shape, ids_shape + (units,)) else ""))
        if not np.issubdtype(arr.dtype, np.integer) and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
            raise GgmlValueError(f"{what}: class ids must be integers")
        bad = (arr < 0) | (arr >= units)  # on the values as given: 1e30 does not wrap first
        if bad.any():
            raise GgmlValueError(f"{what}: class id {arr[bad][0]:g} is outside [0, {units}) (the output has "
                                 f"{units} units; ids are 0-based)")
        ids = arr.astype(np.int64)
        onehot = np.zeros(ids.shape + (units,), dtype=np.float32)
        np.put_along_axis(onehot, ids[..., None], 1.0, axis=-1)
        return onehot
    if h.loss == "categorical_crossentropy" and units == 1:
        default = (" (ggml_compile's default loss: the last ggml_compile was given no loss=, and compiling again "
                   "resets every setting it is not given, as Keras' compile does)" if h.default_loss else "")
        raise GgmlValueError(f"{what}: output '{h.name}' has 1 unit, where categorical_crossentropy{default} needs 2 "
                             "or more classes (a softmax of one value is always 1); compile with the loss this "
                             "output trains on: loss='mse' for a number, loss='binary_crossentropy' and a sigmoid "
                             "for yes/no")
    if arr.ndim == 1 and h.shape == (1,):
        arr = arr.reshape(-1, 1)
    if h.loss == "categorical_crossentropy" and arr.ndim == 1 and arr.shape[0] == n and units > 1:
        default = (" by categorical_crossentropy, ggml_compile's default loss: the last ggml_compile was given no "
                   "loss= (compiling again resets every setting it is not given, as Keras' compile does)"
                   if h.default_loss else "")
        raise GgmlValueError(f"{what}: got class ids of shape {_fmt(arr.shape)} where one-hot labels "
                             f"({n}, {units}) are expected{default}; compile with "
                             "loss='sparse_categorical_crossentropy' for class ids, or pass one-hot labels")
    check_shape(arr, h.shape, what, n)
    out = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.all(np.isfinite(out)):
        raise GgmlValueError(f"{what} contains NaN or infinite values")
    if h.loss in ("hinge", "squared_hinge") and np.all((out == 0) | (out == 1)):
        out = 2 * out - 1  # Keras' rule: 0/1 labels of a hinge loss are -1/1
    if h.loss == "categorical_crossentropy":
        rows = out.reshape(-1, units)      # one distribution per sample (or per position of a sequence)
        sums = rows.sum(axis=1)
        if (rows < 0).any() or np.any(np.abs(sums - 1) > 1e-3):
            row = int(np.argmax((rows < 0).any(axis=1) | (np.abs(sums - 1) > 1e-3)))
            where = f"sample {row}" if rows.shape[0] == n else f"sample {row // (rows.shape[0] // n)}, position " \
                                                                 f"{row % (rows.shape[0] // n)}"
            raise GgmlValueError(f"{what}: categorical cross-entropy needs labels >= 0 summing to 1 per sample "
                                 f"(one-hot); {where} sums to {sums[row]:g}")
    if h.loss == "binary_crossentropy" and ((out < 0) | (out > 1)).any():
        raise GgmlValueError(f"{what}: binary cross-entropy needs labels in [0, 1]")
    return out


def _check_target_sizes(model: Model, cfg: CompileConfig, xs: list[np.ndarray], ys: list[np.ndarray],
                       what: str = "y") -> None:
    """Where the outputs have variable sizes, each label array (``model_targets``') is the shape of the outputs
    that the inputs ``xs`` make (a sequence's labels as long as its steps)."""
    if not any(None in h.shape for h in cfg.heads):
        return
    sizes = model.concrete_shapes([x.shape[1:] for x in xs])
    for h, node, y in zip(cfg.heads, model.graph()[1], ys):
        want = sizes[id(node)]
        if tuple(y.shape[1:]) != tuple(want):
            label = what if len(cfg.heads) == 1 else f"{what} ('{h.name}')"
            given, kind = (y.shape[1:-1], "class ids") if h.sparse else (y.shape[1:], "labels")  # ids as given
            raise GgmlValueError(f"{label}: {kind} of samples {_fmt(tuple(given))}, where x's samples of "
                                 f"{', '.join(_fmt(tuple(x.shape[1:])) for x in xs)} make outputs of "
                                 f"{_fmt(tuple(want))} (the variable sizes of x and y must agree)")


def sample_weights(cfg: CompileConfig, targets: list[np.ndarray], n: int, sample_weight: object,
                   class_weight: object, what: str = "sample_weight") -> np.ndarray | None:
    """Per-sample loss weights (N,) from ``sample_weight`` and/or ``class_weight``, or None."""
    if sample_weight is None and class_weight is None:
        return None
    if any(h.token_level for h in cfg.heads):
        raise GgmlValueError(f"{what if sample_weight is not None else 'class_weight'}: per-sample or per-class "
                             "weights are not supported with a cross-entropy over sequence outputs (steps, classes); "
                             "train without them, or weight the data by repeating samples")
    w = np.ones(n, dtype=np.float64)
    if sample_weight is not None:
        sw = _as_numeric(sample_weight, what).astype(np.float64)
        if sw.shape not in ((n,), (n, 1)):
            raise GgmlValueError(f"{what} must have shape ({n},): one weight per sample, got {_fmt(sw.shape)}")
        if not np.all(np.isfinite(sw)) or (sw < 0).any():
            raise GgmlValueError(f"{what} must be finite and >= 0")
        w *= sw.reshape(-1)
    if class_weight is not None:
        if not isinstance(class_weight, dict):
            raise GgmlTypeError(f"class_weight must be a dict {{class id: weight}}, got {type(class_weight).__name__}")
        head = cfg.heads[0]
        if not head.classification or len(cfg.heads) != 1:
            raise GgmlValueError("class_weight needs a single classification output")
        y = targets[0]
        classes = y.argmax(axis=1) if y.shape[1] > 1 else (y[:, 0] > 0.5).astype(int)
        table = np.ones(max(y.shape[1], 2))
        for k, v in class_weight.items():
            if not is_int(k) or not 0 <= k < len(table):
                raise GgmlValueError(f"class_weight keys must be class ids in [0, {len(table)}), got {k!r}")
            if not is_real(v) or not np.isfinite(v) or v < 0:
                raise GgmlValueError(f"class_weight[{k}] must be a finite number >= 0, got {v!r}")
            table[int(k)] = v
        w *= table[classes]
    with np.errstate(over="ignore"):
        out = w.astype(np.float32)
    if not np.isfinite(out).all():
        raise GgmlValueError(f"{what if sample_weight is not None else 'class_weight'}: a sample's weight "
                             f"({w[~np.isfinite(out)][0]:g}) is beyond float32's range "
                             f"(+-{float(np.finfo(np.float32).max):.4g}); rescale the weights")
    return out


def rows(arrays: list[np.ndarray], index: np.ndarray) -> list[np.ndarray]:
    return [a[index] for a in arrays]


def training_batches(heads: list[HeadSpec], xs: list[np.ndarray], ys: list[np.ndarray], w: np.ndarray | None,
                     batch: int, shuffle: bool, rng: np.random.Generator):
    """A generator function: one epoch of full batches (ggml layout, ready to write). A last partial batch
    is completed with samples drawn at random from the rest of the epoch, so every sample is seen each
    epoch and every step has exactly ``batch`` rows (a few samples count twice in that step)."""
    n = xs[0].shape[0]

    def epoch():
        order = rng.permutation(n) if shuffle else np.arange(n)
        for start in range(0, n, batch):
            idx = order[start:start + batch]
            if not shuffle and len(idx) == batch:  # in order: views, no copy
                rows_ = slice(start, start + batch)
                yield feed_dict(heads, [a[rows_] for a in xs], [a[rows_] for a in ys], None if w is None else w[rows_])
                continue
            if len(idx) < batch:
                fill = rng.choice(order[:start], batch - len(idx), replace=False) if start >= batch - len(idx) \
                    else rng.choice(order, batch - len(idx), replace=True)
                idx = np.concatenate([idx, fill])
            yield feed_dict(heads, rows(xs, idx), rows(ys, idx), None if w is None else w[idx])
    return epoch


def continuing_passes(epoch_batches, batches_per_pass: int, steps_per_epoch: int):
    """Keras 3's ``steps_per_epoch`` on arrays, as a generator function: each epoch takes the next
    ``steps_per_epoch`` batches of the current pass over the data (``epoch_batches()``), and a pass that runs
    out ends its epoch early; the next epoch starts a new pass (reshuffled)."""
    state = {"pass": None, "seen": 0}

    def epoch():
        if state["pass"] is None or state["seen"] >= batches_per_pass:
            state["pass"], state["seen"] = epoch_batches(), 0
        for _ in range(steps_per_epoch):
            if state["seen"] >= batches_per_pass:
                return
            state["seen"] += 1
            yield next(state["pass"])
    return epoch


def feed_dict(heads: list[HeadSpec], xs: list[np.ndarray], ys: list[np.ndarray], w: np.ndarray | None) -> dict:
    """A batch in the form the training loop writes: inputs, labels and (per head) weights. The labels of a
    cross-entropy over sequence outputs are rows ``(N * steps, classes)``, as its training graph's outputs."""
    ys = [y.reshape(-1, h.shape[-1]) if h.token_level else y for h, y in zip(heads, ys)]
    batch = {"inputs": xs, "labels": ys}
    if w is not None:
        batch["weights"] = [w.reshape(-1)] * len(ys)  # 1-D: fits the weights tensor whatever its rank
    return batch


def split_batch(batch: object, what: str) -> tuple[object, object, object]:
    """``(x, y)`` or ``(x, y, sample_weight)`` from a generator's batch."""
    if isinstance(batch, dict):
        unknown = set(batch) - {"x", "y", "sample_weight"}
        if unknown or "x" not in batch or "y" not in batch:
            raise GgmlValueError(f"{what}: a dict batch has keys 'x', 'y' and optional 'sample_weight', got "
                                 f"{sorted(batch)}")
        return batch["x"], batch["y"], batch.get("sample_weight")
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3):
        return batch[0], batch[1], batch[2] if len(batch) == 3 else None
    raise GgmlValueError(f"{what}: a batch is (x, y) or (x, y, sample_weight) with sample-major arrays, got "
                         f"{type(batch).__name__}" + (f" of length {len(batch)}" if hasattr(batch, "__len__") else ""))
