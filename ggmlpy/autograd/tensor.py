"""``AgTensor``, the value of ggmlR's autograd engine, and the state of the tape that records ops.

An AgTensor is lazy (``lazy.py``): a leaf (``ag_param``'s storage on the device, ``ag_tensor``'s host data) or an
op over other AgTensors, computed when it is read (``.numpy()``, ``.item()``, ``float()``) or when an optimizer
steps. Shapes are numpy's (samples first, C order): an ``(N, F)`` AgTensor is ggml's ``[F, N]``.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..backend.transfer import as_numeric, checked_values
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from .device import default, Engine, engine, epoch, next_epoch, resolve_device, resolve_dtype, set_default, Storage
from .lazy import evaluate, fetch, flush_effects, known, Op


_ids = itertools.count(1)
# the arithmetic operators of AgTensor, filled in by ops.py (which builds on this module)
OPERATORS: dict[str, Callable[..., AgTensor]] = {}


class Tape:
    """One ``with_grad_tape`` block: it records the ops whose inputs need a gradient (``len(tape)`` of them)."""

    def __init__(self) -> None:
        self.n = 0
        self.open = True
        self.computed: list[weakref.ref] = []   # its values computed so far (weakly)

    def release(self, pending: bool) -> None:
        """This tape will not be differentiated again (a newer one started; ``pending``: gradients of its loss
        are still to compute, so not yet): its computed values drop what they were computed from."""
        if pending:
            return
        for ref in self.computed:
            n = ref()
            if n is not None and known(n):
                n.drop_inputs()
        self.computed = []

    def __len__(self) -> int:
        return self.n

    def __repr__(self) -> str:
        return f"<grad tape: {self.n} ops{'' if self.open else ', closed'}>"


class _TapeState(threading.local):
    current: Tape | None = None
    latest: Tape | None = None


TAPE = _TapeState()


class AgTensor:
    """A value of the autograd engine on one device (see the module's docstring and ``ag_tensor``).

    Attributes: ``shape`` (numpy's), ``dtype`` (``"f32"``, ``"f16"``, ``"bf16"`` or ``"i32"``), ``device``,
    ``requires_grad``, ``grad`` (the accumulated gradient of a leaf, an AgTensor, or None), ``id``; ``data``
    (the value as numpy, assignable with the same shape). Methods: ``numpy()``, ``item()``; operators
    ``+ - * / @ **`` and unary ``-``, with AgTensors, arrays and numbers.
    """

    # numpy operands hand the operation back: ``np.float64(2) * t`` is ``t.__rmul__`` (an AgTensor on the tape),
    # not numpy's product of t's values (which would drop it from the tape)
    __array_ufunc__ = None

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "engine", "created", "writes", "storage", "host",
                 "result", "tape", "requires_grad", "grad", "id", "group", "__weakref__")

    def __init__(self, eng: Engine, shape: tuple[int, ...], dtype: str, op: Op | None = None,
                 inputs: tuple[AgTensor, ...] = (), attrs: tuple = ()) -> None:
        self.engine, self.shape, self.dtype = eng, shape, dtype
        self.op, self.inputs, self.attrs = op, inputs, attrs
        self.created = epoch()
        self.writes: tuple[Storage, ...] = ()
        self.storage: Storage | None = None
        self.host: np.ndarray | None = None
        self.result: tuple | None = None
        self.tape: Tape | None = None
        self.requires_grad = False
        self.grad: AgTensor | None = None
        self.id = next(_ids)
        self.group: tuple = ()  # weak references to values best computed with this one (one backward's gradients)

    # ---- what it is
    @property
    def device(self) -> str:
        return self.engine.name

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d AgTensor")
        return self.shape[0]

    def __repr__(self) -> str:
        state = "stored" if self.storage is not None else "host" if self.host is not None else \
            "computed" if known(self) else f"lazy {self.op.name}" if self.op else "?"
        grad = ", requires_grad" if self.requires_grad else ""
        return f"<AgTensor {self.shape} {self.dtype} on {self.device}, {state}{grad}>"

    def drop_inputs(self) -> None:
        """Forget the values this one was computed from (it is known and will not be differentiated)."""
        self.inputs = ()

    # ---- its value
    def numpy(self) -> np.ndarray:
        """The value as a new numpy array (float32; int32 for integer data), computed first if needed."""
        with self.engine.lock:   # another thread's run of the same graph cannot come between compute and read
            if self.storage is not None and any(self.storage in e.writes for e in self.engine.effects):
                flush_effects(self.engine)   # a statistic a batch norm's forward has yet to write
            if not known(self):
                evaluate([self])
            value = fetch(self)
        return np.array(value, dtype=np.int32 if self.dtype == "i32" else np.float32).reshape(self.shape)

    def item(self) -> float:
        """The value of a one-element AgTensor as a Python number."""
        if self.size != 1:
            raise GgmlValueError(f"item() needs a one-element AgTensor, this one has shape {self.shape}")
        v = self.numpy().reshape(-1)[0]
        return int(v) if self.dtype == "i32" else float(v)

    def __float__(self) -> float:
        return float(self.item())

    def __array__(self, dtype: npt.DTypeLike | None = None, copy: object = None) -> np.ndarray:
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    @property
    def data(self) -> np.ndarray:
        return self.numpy()

    @data.setter
    def data(self, value: object) -> None:
        if self.op is not None:
            raise GgmlValueError("only a leaf (ag_tensor, ag_param) has assignable data; this AgTensor is the result "
                                 f"of {self.op.name}")
        arr = leaf_values(value, "data", self.dtype == "i32")
        if arr.shape != self.shape:
            raise GgmlValueError(f"data must keep the shape {self.shape}, got {arr.shape}; make a new tensor for "
                                 "another shape")
        if self.storage is not None:
            flush_effects(self.engine)   # a pending batch-norm statistic reads the old value: write it first
            self.storage.write(arr)
        else:
            self.host = arr
            self.created = next_epoch()

    # ---- operators (ops.py fills OPERATORS)
    def __add__(self, o: object) -> AgTensor:
        return OPERATORS["add"](self, o)

    def __radd__(self, o: object) -> AgTensor:
        return OPERATORS["add"](self, o)

    def __sub__(self, o: object) -> AgTensor:
        return OPERATORS["sub"](self, o)

    def __rsub__(self, o: object) -> AgTensor:
        return OPERATORS["rsub"](self, o)

    def __mul__(self, o: object) -> AgTensor:
        return OPERATORS["mul"](self, o)

    def __rmul__(self, o: object) -> AgTensor:
        return OPERATORS["mul"](self, o)

    def __truediv__(self, o: object) -> AgTensor:
        return OPERATORS["div"](self, o)

    def __rtruediv__(self, o: object) -> AgTensor:
        return OPERATORS["rdiv"](self, o)

    def __matmul__(self, o: object) -> AgTensor:
        return OPERATORS["matmul"](self, o)

    def __rmatmul__(self, o: object) -> AgTensor:
        return OPERATORS["rmatmul"](self, o)

    def __pow__(self, p: object) -> AgTensor:
        return OPERATORS["pow"](self, p)

    def __neg__(self) -> AgTensor:
        return OPERATORS["neg"](self)

    @property
    def T(self) -> AgTensor:  # noqa: N802 - numpy's name
        return OPERATORS["transpose"](self)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:  # identity: AgTensors are keys of gradient mappings
        return self is other

    def __bool__(self) -> bool:
        raise TypeError("the truth value of an AgTensor is ambiguous; compare its .item() or .numpy()")


def leaf_values(data: object, what: str, integer: bool | None = None) -> np.ndarray:
    """``data`` as the host value of a leaf: float32, or int32 for integer data (``integer``: which one; None:
    by the data's kind). Values that do not fit (a float beyond float32's range, a fractional id) are refused."""
    if isinstance(data, AgTensor):
        data = data.numpy()
    arr = as_numeric(data, what)
    if arr.ndim > 4:
        raise GgmlValueError(f"{what}: AgTensors have at most 4 dimensions, got shape {arr.shape}")
    if integer is None:
        integer = arr.dtype.kind in "iub"
    dtype = np.dtype(np.int32 if integer else np.float32)
    flat = checked_values(np.ascontiguousarray(arr).reshape(-1), dtype, what)
    return np.ascontiguousarray(flat).reshape(arr.shape)


def make_leaf(data: object, device: object, dtype: object, trainable: bool, fn: str) -> AgTensor:
    """A leaf: on the device (``trainable``: a parameter, with a gradient) or as host data written at each use."""
    name = resolve_device(device, fn)
    eng = engine(name)
    arr = leaf_values(data, f"{fn}(data)")
    if arr.size == 0:
        raise GgmlValueError(f"{fn}: data has no elements (shape {arr.shape}); an AgTensor holds at least one")
    if arr.dtype == np.int32:
        if trainable:
            raise GgmlTypeError(f"{fn}: integer data cannot require a gradient; pass floats (np.asarray(data, "
                                "float))")
        t = AgTensor(eng, arr.shape, "i32")
        t.host = arr
        return t
    kind = resolve_dtype(dtype, fn, name)
    arr = rounded(arr, kind)
    if trainable:   # an f32 master; f16/bf16: the type its matrix products take it in (a cast in the graph)
        t = AgTensor(eng, arr.shape, kind)
        t.storage = Storage(eng, arr.shape, "f32", arr, trainable=True)
        t.requires_grad = True
    else:           # data: rounded to the type, written as f32
        t = AgTensor(eng, arr.shape, "f32")
        t.host = arr
    return t


def rounded(arr: np.ndarray, kind: str) -> np.ndarray:
    """float32 values rounded to ``kind``'s precision ("f16"; "bf16": to nearest, ties to even)."""
    if kind == "f16":
        return arr.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        bits = arr.astype(np.float32).view(np.uint32).astype(np.uint64)
        up = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(0xFFFF0000)
        return up.astype(np.uint32).view(np.float32).reshape(arr.shape)
    return arr


def result(op: Op, inputs: tuple[AgTensor, ...], shape: tuple[int, ...], attrs: tuple = (),
           dtype: str = "f32", differentiable: bool = True) -> AgTensor:
    """The lazy result of ``op`` on ``inputs`` (one device), recorded on the open tape when an input needs a
    gradient there."""
    eng = inputs[0].engine
    for x in inputs[1:]:
        if x.engine is not eng:
            raise GgmlValueError(f"{op.name}: its inputs are on {eng.name} and {x.engine.name}; one op works on one "
                                 "device: move one with ag_to_device")
    out = AgTensor(eng, shape, dtype, op, inputs, attrs)
    tape = TAPE.current
    if tape is not None and differentiable:
        for x in inputs:   # a parameter, or an op this tape recorded (an earlier tape's value is a constant)
            if x.requires_grad and (x.op is None or x.tape is tape):
                out.tape, out.requires_grad = tape, True
                tape.n += 1
                break
    return out


def require_open_tape_state() -> None:
    if TAPE.current is not None:
        raise GgmlStateError("with_grad_tape blocks do not nest: one tape is already recording")


# ---------------------------------------------------------------- public constructors and devices

__all__ = ["AgTensor", "ag_tensor", "ag_param", "ag_to_device", "ag_device", "ag_dtype", "ag_default_device",
           "ag_default_dtype"]


def ag_tensor(data: object, device: str | None = None, dtype: str | None = None) -> AgTensor:
    """A tensor of data that needs no gradient (inputs, targets, constants), on ``device``.

    Its values stay on the host until a graph reads them, and are written to the device once per compute that
    uses them (a batch is one upload per step).

    Arguments:
        data: a number, list or numpy array of up to 4 dimensions, samples first (``(N, F)``); integer data
            (class ids, token ids) stays integer (``dtype`` "i32").
        device: "cpu", "gpu" (the first GPU) or a ggml device name ("Vulkan0"); None: the default (ag_device).
        dtype: "f32", "f16" or "bf16" (values rounded to it); None: the default (ag_dtype).

    Value: an AgTensor with ``requires_grad`` False.

    Example:
        >>> x = ag_tensor(np.random.rand(32, 784))
    """
    return make_leaf(data, device, dtype, False, "ag_tensor")


def ag_param(data: object, device: str | None = None, dtype: str | None = None) -> AgTensor:
    """A trainable tensor: stored on ``device``, with a gradient from ``backward`` (``.grad``).

    Arguments:
        data: floating-point values (number, list or array, up to 4 dimensions).
        device: "cpu", "gpu" or a ggml device name; None: the default (ag_device).
        dtype: "f32" (default: the ag_dtype default), "f16" or "bf16" (f16 on Vulkan): an f32 master, which the
            optimizer updates, multiplied in that type (``x @ W.T`` casts W in the graph where the device
            computes the type's products); the values start rounded to it.

    Value: an AgTensor with ``requires_grad`` True.

    Example:
        >>> W = ag_param(np.random.randn(10, 784) * 0.01)
    """
    return make_leaf(data, device, dtype, True, "ag_param")


def ag_to_device(x: AgTensor, device: str) -> AgTensor:
    """A copy of ``x`` on another device, keeping ``requires_grad`` (``x`` itself when it is there already).

    Arguments:
        x: an AgTensor.
        device: "cpu", "gpu" or a ggml device name.

    Value: an AgTensor on ``device``.

    Example:
        >>> W = ag_to_device(W, "Vulkan0")
    """
    if not isinstance(x, AgTensor):
        raise GgmlTypeError(f"ag_to_device: x must be an AgTensor, got {type(x).__name__}")
    name = resolve_device(device, "ag_to_device")
    if name == x.device:
        return x
    if x.op is not None and x.requires_grad:
        raise GgmlValueError("ag_to_device: this value is on a grad tape, and a copy to another device would cut "
                             "its gradient; move the parameters (and data) before the forward pass instead")
    if x.requires_grad and x.op is None:
        return make_leaf(x.numpy(), name, x.dtype, True, "ag_to_device")
    out = make_leaf(x.numpy(), name, "f32" if x.dtype == "i32" else x.dtype, False, "ag_to_device")
    return out


def ag_device(device: str) -> str:
    """Set the default device of new tensors; returns the previous one.

    Arguments:
        device: "cpu", "gpu" (the first GPU; none: BackendUnavailableError) or a ggml device name ("Vulkan0").

    Value: the previous default's name.

    Example:
        >>> before = ag_device("gpu")
    """
    from_name = resolve_device(device, "ag_device")
    engine(from_name)   # a device that cannot start is refused now, not at the first op
    return set_default("device", from_name)


def ag_dtype(dtype: str) -> str:
    """Set the default storage type of new tensors; returns the previous one.

    Arguments:
        dtype: "f32", "f16" or "bf16": the type of new parameters' products and of new data's values (results
            and gradients are f32 whatever it is).

    Value: the previous default.

    Example:
        >>> before = ag_dtype("bf16")
    """
    return set_default("dtype", resolve_dtype(dtype, "ag_dtype"))


def ag_default_device() -> str:
    """The default device of new tensors (what ag_device set; "cpu" at first).

    Value: a device name.

    Example:
        >>> ag_default_device()
        'cpu'
    """
    return default("device")


def ag_default_dtype() -> str:
    """The default storage type of new tensors (what ag_dtype set; "f32" at first).

    Value: "f32", "f16" or "bf16".

    Example:
        >>> ag_default_dtype()
        'f32'
    """
    return default("dtype")
