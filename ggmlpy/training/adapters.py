"""From what the user passes as a generator to batches written into tensors.

``Source`` gives every kind of Python data source ggmlR's epoch semantics:
a zero-argument callable (``None`` ends the epoch), a generator function (called once per
epoch), a re-iterable such as a list or a DataLoader (``iter()`` per epoch, continued
while not exhausted), a one-shot iterator (consumed across epochs), or an object with Keras'
``PyDataset`` protocol (``len()`` batches ``obj[0]``... per epoch, each epoch from batch 0, its
``on_epoch_begin``/``on_epoch_end`` called around every epoch, also one that steps_per_epoch cuts short).

``BatchWriter`` turns one batch into arrays of the right dtype and size for the input,
label and weight tensors of one opt context, with errors that name the tensor.
"""
from __future__ import annotations

import dis
import functools
import inspect
import itertools
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any, Protocol, TYPE_CHECKING

import numpy as np

from ..backend.transfer import checked_values, NUMPY_DTYPES, numpy_shape, refuse_complex, shape_problem
from ..errors import GgmlTypeError, GgmlValueError
from ..graph.indices import check_indices
from ..graph.nodes import ptr_key, tensor_label
from ..graph.objects import Tensor
from ..opt.dataset import all_distributions, not_distributions


if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10: only the type checker reads it


CALLABLE, GENERATOR_FUNCTION, REITERABLE, ITERATOR = "callable", "generator function", "re-iterable", "iterator"
SEQUENCE = "sequence of batches"  # Keras' PyDataset / keras.utils.Sequence: __len__ and __getitem__(i)


class BatchSequence(Protocol):
    """Keras' PyDataset (keras.utils.Sequence): batch ``i`` is ``obj[i]``, ``len(obj)`` batches per epoch."""
    def __len__(self) -> int: ...
    def __getitem__(self, i: int) -> object: ...


def is_batch_sequence(obj: object) -> TypeGuard[BatchSequence]:
    """Keras' ``PyDataset`` protocol: ``len(obj)`` batches, ``obj[i]`` the i-th, ``on_epoch_end()`` after each epoch
    (a plain list or tuple of batches is a re-iterable instead)."""
    if isinstance(obj, (list, tuple, str, bytes, dict, np.ndarray)):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and \
        (not hasattr(obj, "__iter__") or hasattr(obj, "on_epoch_end"))


def _sequence_epoch(obj: BatchSequence) -> Iterator[object]:
    """One epoch of a PyDataset: ``on_epoch_begin()``, ``obj[0] .. obj[len - 1]``, then ``on_epoch_end()`` also
    when the epoch stops early (steps_per_epoch, an error), as Keras calls it after every epoch."""
    begin = getattr(obj, "on_epoch_begin", None)
    if callable(begin):
        begin()
    try:
        for i in range(len(obj)):
            yield obj[i]
    finally:
        end = getattr(obj, "on_epoch_end", None)
        if callable(end):
            end()


class Source:
    """One data source with ggmlR's epoch semantics. ``transform`` (optional) maps each batch before it is
    parsed (the model layer turns sample-major batches into ggml layout there)."""

    def __init__(self, obj: object, name: str, transform: Callable[[object], object] | None = None,
                 restart: bool = False) -> None:
        self.name, self.transform = name, transform
        # every epoch from the source's beginning where it can start again (validation, as Keras validates on the
        # first validation_steps batches each epoch); else a re-iterable's pass continues across epochs
        self.restart = restart
        self.obj: Any = obj  # the caller's source, read as its kind (below) says
        self._peeked: list[object] = []  # a batch taken by peek(), served first
        self._keep_epoch = False  # peek() started the next epoch already
        if inspect.isgeneratorfunction(obj):
            self.kind = GENERATOR_FUNCTION
        elif is_batch_sequence(obj):
            self.kind = SEQUENCE
        elif isinstance(obj, Iterator):
            self.kind = ITERATOR
        elif hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes, dict, np.ndarray)):
            self.kind = REITERABLE
        elif callable(obj):
            self.kind = CALLABLE
        else:
            raise GgmlTypeError(f"{name} must be a function returning one batch (or None), a generator function, "
                                f"an iterable of batches, an iterator or a PyDataset-like object (__len__ and "
                                f"__getitem__), got {type(obj).__name__}")
        self._iter: Iterator[object] | None = obj if isinstance(obj, Iterator) and self.kind == ITERATOR else None
        self._exhausted = False
        self._fresh = False   # the current iterator was taken for this epoch
        self._served = 0      # batches served in this epoch

    def peek(self) -> object:
        """The first batch of the next epoch without consuming it (None if the source gives none)."""
        if not self._peeked:
            self.start_epoch()
            self._peeked = [self._next_raw()]
            self._keep_epoch = True
        return self._peeked[0]

    def start_epoch(self) -> None:
        if self._keep_epoch:
            self._keep_epoch = False
            return
        self._served, self._fresh = 0, False
        if self.kind in (GENERATOR_FUNCTION, SEQUENCE):
            self._close()
            epoch = self.obj() if self.kind == GENERATOR_FUNCTION else _sequence_epoch(self.obj)
            self._iter, self._exhausted, self._fresh = iter(epoch), False, True
        elif self.kind == REITERABLE and (self.restart or self._iter is None or self._exhausted):
            self._iter, self._exhausted, self._fresh = iter(self.obj), False, True

    @property
    def served_last(self) -> bool:
        """Whether the batch just taken was the last of a PyDataset's epoch (the one batch Keras lets be shorter)."""
        return self.kind == SEQUENCE and self._served == len(self.obj)

    def next_batch(self) -> object:
        """The next batch of this epoch (transformed), or None when the source ends it."""
        batch = self._peeked.pop() if self._peeked else self._next_raw()
        if batch is not None and self.transform is not None:
            batch = self.transform(batch)
        return batch

    def _next_raw(self) -> object:
        if self.kind == CALLABLE:
            try:
                batch = self.obj()
            except StopIteration:  # ``lambda: next(it)``: the end of the data, like None (PEP 479 would
                return None        # turn it into a RuntimeError inside the feed's generator)
            if isinstance(batch, types.GeneratorType):
                raise GgmlTypeError(f"{self.name} is a function that returned a generator (e.g. lambda: gen()): "
                                    "pass the generator function itself (gen), or a generator object (gen())")
            return batch
        if self._exhausted or self._iter is None:  # an iterator is taken at each epoch's start (start_epoch)
            return None
        try:
            batch = next(self._iter)
        except StopIteration:
            self._exhausted = True
            if self.kind == REITERABLE and self._served == 0 and not self._fresh:
                # steps_per_epoch used up the last pass exactly: a re-iterable starts a new pass
                self.start_epoch()
                return self._next_raw()
            return None
        if batch is None:  # only a function of no arguments ends an epoch with None; here it is a hole in the data
            what = {GENERATOR_FUNCTION: "a generator function", REITERABLE: "a list (or other re-iterable)",
                    ITERATOR: "an iterator"}.get(self.kind, "the source")
            raise GgmlValueError(f"{self.name} gave None as batch {self._served + 1} of this epoch; a None ends an "
                                 f"epoch only for a function of no arguments, and {self.name} is {what}, whose epoch "
                                 "ends when it is exhausted. Leave the None out (or return from the generator), or "
                                 "pass a function that returns None at the end of each epoch")
        self._served += 1
        return batch

    def _close(self) -> None:
        close = getattr(self._iter, "close", None)
        if close is not None and self.kind in (GENERATOR_FUNCTION, SEQUENCE):
            close()

    def close(self) -> None:
        self._close()

    def endless(self) -> str | None:
        """Why this source can never end an epoch by itself (an epoch without a step limit would run
        forever), or None when it may end. Only what is certain is said: a generator whose code has no
        return (``while True:`` without ``break``/``return``), itertools.count/cycle, repeat without times."""
        obj, code = self.obj, None
        if self.kind == GENERATOR_FUNCTION:
            code = _code_of(obj)
        elif self.kind == ITERATOR:
            if isinstance(obj, types.GeneratorType):
                code = obj.gi_code if obj.gi_frame is not None else None  # a finished one ends at once
            elif isinstance(obj, (itertools.count, itertools.cycle)):
                return f"it is an itertools.{type(obj).__name__}, which never ends"
            elif isinstance(obj, itertools.repeat) and len(obj.__reduce__()[1]) == 1:
                return "it is an itertools.repeat without times, which never ends"
        elif self.kind == REITERABLE:
            it = getattr(type(obj), "__iter__", None)
            if inspect.isgeneratorfunction(it):
                code = _code_of(it)
        if code is not None and not _can_return(code):
            name = getattr(code, "co_qualname", code.co_name)
            return (f"its generator '{name}' has no way to end (a 'while True:' loop without break, return "
                    "or raise)")
        return None


def _code_of(fn: object) -> CodeType | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if callable(fn):
        fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    return code if isinstance(code, CodeType) else None


def _can_return(code: CodeType) -> bool:
    """Whether a generator's code object can end: it holds a return instruction (CPython drops the implicit
    one after a 'while True:' loop that nothing leaves) or a ``raise`` statement (a source that ends its
    stream with an exception, which then propagates: not endless)."""
    try:
        return any(ins.opname in ("RETURN_VALUE", "RETURN_CONST", "RAISE_VARARGS")
                   for ins in dis.get_instructions(code))
    except Exception:  # noqa: BLE001 - another interpreter's code objects: assume it can
        return True


def check_ends(source: Source, limit: int | None, arg: str) -> None:
    """An endless source needs a step limit: without one its first epoch would never end (training would
    run until Ctrl-C and report nothing)."""
    if limit is not None:
        return
    why = source.endless()
    if why is not None:
        raise GgmlValueError(f"the {source.name} never ends an epoch: {why}. Without {arg}, the first epoch would "
                             f"run forever; pass {arg}=<batches per epoch> (or make the source finite)")


@dataclass
class Target:
    tensor: Tensor
    what: str
    dtype: np.dtype
    count: int
    bound: int | None = None  # integer inputs used as ggml_get_rows indices: values must be in [0, bound)
    label: bool = False       # the labels of a head
    shape: tuple[int, ...] = ()  # the tensor's numpy shape (``numpy_shape``): a batch of it needs no more thought


def _target(tensor: Tensor, what: str, bound: int | None = None, label: bool = False) -> Target:
    return Target(tensor, what, NUMPY_DTYPES[tensor.type], tensor.nelements(), bound, label, numpy_shape(tensor))


class Writer(Protocol):
    """What turns a source's batches into what a step runner's step writes: a ``BatchWriter`` (one opt context), a
    ``replicas.ReplicaWriter`` (one list per replica)."""
    name: str

    def parse(self, batch: object, own: bool = False) -> Sequence[object]: ...


class BatchWriter:
    """Parses batches for one opt context and writes them into its tensors."""

    def __init__(self, name: str, inputs: list[Tensor], labels: list[Tensor], weights: list[Tensor],
                 bounds: dict[int, int] | None = None, distributions: list[bool] | None = None) -> None:
        self.name = name
        # labels of cross-entropy heads: each row (ne0 values) a distribution over the classes
        self.distributions = distributions or [False] * len(labels)
        bounds = bounds or {}
        # tensors are called by their user-given names ('leaf_0' is ggml's name for an unnamed one)
        self.inputs = [_target(t, f"inputs[{i}] ({tensor_label(t.ptr)})", bounds.get(ptr_key(t.ptr)))
                       for i, t in enumerate(inputs)]
        self.labels = [_target(t, f"labels[{i}]", label=True) for i, t in enumerate(labels)]
        self.weights = [_target(t, f"weights[{i}]") for i, t in enumerate(weights)]

    def parse(self, batch: object, own: bool = False) -> list[tuple[Target, np.ndarray]]:
        """Check one batch and convert it; returns (target, array) pairs ready to write. ``own``: the arrays
        never share memory with the batch (a prefetched batch waits in a queue while the source may refill
        the buffer it yielded)."""
        xs, ys, ws = self.split(batch)
        pairs: list[tuple[Target, np.ndarray]] = []
        for targets, values, kind in ((self.inputs, xs, "inputs"), (self.labels, ys, "labels"),
                                      (self.weights, ws, "weights")):
            if len(values) != len(targets):
                raise GgmlValueError(f"{self.name}: the batch has {len(values)} {kind}, the model expects "
                                     f"{len(targets)}")
            for target, value in zip(targets, values):
                arr = self._convert(target, value)
                if kind == "labels" and self.distributions[len(pairs) - len(self.inputs)]:
                    self._check_distribution(target, arr)
                if kind == "weights" and arr.size and not (arr >= 0).all():  # NaN fails too
                    raise GgmlValueError(f"{self.name}: {target.what} must be >= 0 (a weight per datapoint or "
                                         "element scales its loss; a negative one would train to increase it)")
                if own and isinstance(value, np.ndarray) and np.shares_memory(arr, value):
                    arr = arr.copy()
                pairs.append((target, arr))
        return pairs

    def _check_distribution(self, target: Target, arr: np.ndarray) -> None:
        """Cross-entropy labels, per batch: each row a distribution (``opt.dataset.not_distributions``)."""
        rows = arr.reshape(-1, int(target.tensor.shape[0]))
        if all_distributions(rows):
            return
        bad = not_distributions(rows)
        if bad.any():
            k = int(np.argmax(bad))
            raise GgmlValueError(f"{self.name}: {target.what} are the targets of a cross-entropy, one distribution "
                                 f"over the classes per row; row {k} is {rows[k].tolist()[:8]}"
                                 f"{'...' if rows.shape[1] > 8 else ''}: every value must be >= 0 and the row must "
                                 "not be all zeros (one-hot rows: a 1 at the class)")

    @staticmethod
    def labels_of(pairs: list[tuple[Target, np.ndarray]]) -> list[np.ndarray]:
        """The heads' labels of a parsed batch, in head order."""
        return [arr for target, arr in pairs if target.label]

    def split(self, batch: object) -> tuple[list[object], list[object], list[object]]:
        """A batch's (inputs, labels, weights) lists, its structure checked."""
        needs_labels = bool(self.labels)
        if isinstance(batch, dict):
            unknown = set(batch) - {"inputs", "labels", "weights"}
            if unknown or "inputs" not in batch:
                raise GgmlValueError(f"{self.name}: a dict batch has 'inputs', optional 'labels' and 'weights'; "
                                     f"got keys {sorted(batch)}")
            xs, ys, ws = (_as_list(batch.get(k)) for k in ("inputs", "labels", "weights"))
            if not xs:
                raise GgmlValueError(f"{self.name}: the batch's 'inputs' is empty")
        elif isinstance(batch, (tuple, list)):
            if needs_labels and len(batch) != 2:
                raise GgmlValueError(f"{self.name}: expected a batch (x, y) or {{'inputs': [...], 'labels': [...]}}, "
                                     f"got a {type(batch).__name__} of length {len(batch)}")
            if not needs_labels and len(batch) != 1:
                raise GgmlValueError(f"{self.name}: this loss takes no labels; yield x, (x,) or "
                                     f"{{'inputs': [...]}}, got a {type(batch).__name__} of length {len(batch)}")
            xs, ys, ws = [batch[0]], list(batch[1:]), []
        else:
            if needs_labels:
                raise GgmlValueError(f"{self.name}: expected a batch (x, y) or a dict with 'inputs' and 'labels', "
                                     f"got {type(batch).__name__}")
            xs, ys, ws = [batch], [], []
        if not needs_labels and ys:
            raise GgmlValueError(f"{self.name}: this loss takes no labels, but the batch has {len(ys)}")
        return xs, ys, ws

    def _convert(self, target: Target, value: object) -> np.ndarray:
        if value is None:
            kind = target.what.split("[", 1)[0]     # inputs, labels or weights
            need = {"labels": "(x, y), y the labels this loss compares the outputs with",
                    "weights": "(x, y, w), w a weight per sample, as the first batch had",
                    }.get(kind, "(x, y), x the inputs")
            raise GgmlValueError(f"{self.name}: the batch has no {kind} ({target.what} is None); give each batch as "
                                 f"{need}")
        try:
            arr = np.asarray(value)
        except ValueError as exc:  # a ragged nested list: rows of different lengths
            raise GgmlValueError(f"{self.name}: {target.what} is a {type(value).__name__} whose rows have different "
                                 "lengths (numpy cannot make one array of it); give a numpy array, or lists of equal "
                                 f"lengths ({exc})") from None
        except Exception as exc:  # noqa: BLE001
            raise GgmlValueError(f"{self.name}: {target.what} is not array-like ({type(value).__name__})") from exc
        if arr.dtype.kind not in "biufc":   # numbers and booleans (kind: numpy's one-letter class of the dtype)
            raise GgmlValueError(f"{self.name}: {target.what} must be numeric, got dtype {arr.dtype}")
        problem = None if arr.shape == target.shape else shape_problem(arr.shape, target.tensor, source="the batch")
        if problem is not None:
            raise GgmlValueError(f"{self.name}: {target.what} {problem}")
        if target.dtype.kind in "iu":
            refuse_complex(arr, target.dtype, f"{self.name}: {target.what}")
            if arr.dtype.kind not in "iub":
                raise GgmlValueError(f"{self.name}: {target.what} is an integer tensor ({target.dtype}); the batch "
                                     f"gives {arr.dtype}")
            if target.bound is not None:
                check_indices(arr, target.bound, f"{self.name}: {target.what}")
        # the one conversion check (also the integer range check: values that would wrap)
        return checked_values(arr, target.dtype, f"{self.name}: {target.what}")


def _as_list(value: object) -> list[object]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]
