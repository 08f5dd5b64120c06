"""The tape and the backward pass: ``with_grad_tape`` records, ``backward`` turns a loss into gradients (lazy
values lowered through ggml's own backward pass, computed with the step that reads them)."""
from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from ..core.args import is_int
from ..errors import GgmlStateError, GgmlTypeError, GgmlValueError
from .lazy import evaluate, fetch, known, Op
from .ops import ag_add
from .tensor import AgTensor, require_open_tape_state, result, TAPE, Tape


__all__ = ["with_grad_tape", "backward", "ag_grad"]

GRAD = Op("grad", lambda b, xs, attrs: xs[0], grad=True)  # lowered by lazy.Builder.backward
PENDING: weakref.WeakSet[AgTensor] = weakref.WeakSet()      # the gradients made, until they are gone


class Grads(Mapping):
    """The gradients one ``backward`` computed: leaf (or its ``.id``) -> an f32 AgTensor of the leaf's shape."""

    def __init__(self, pairs: dict[int, tuple[AgTensor, AgTensor]]) -> None:
        self._pairs = pairs  # leaf id -> (leaf, gradient)

    def _key(self, k: object) -> int:
        if isinstance(k, AgTensor):
            return k.id
        if is_int(k):
            return int(k)
        raise TypeError(f"Grads are keyed by AgTensor or its .id, got {type(k).__name__}")

    def __getitem__(self, k: object) -> AgTensor:
        try:
            return self._pairs[self._key(k)][1]
        except (KeyError, TypeError, ValueError):
            raise KeyError(k) from None

    def __setitem__(self, k: object, g: AgTensor) -> None:
        key = self._key(k)
        self._pairs[key] = (self._pairs[key][0], g)

    def __iter__(self) -> Iterator[AgTensor]:
        return iter(leaf for leaf, _ in self._pairs.values())

    def __len__(self) -> int:
        return len(self._pairs)

    def __contains__(self, k: object) -> bool:
        try:
            return self._key(k) in self._pairs
        except (TypeError, ValueError):
            return False

    def __repr__(self) -> str:
        return f"<Grads of {len(self)} tensors>"


class TapeBlock:
    def __init__(self) -> None:
        self.tape = Tape()

    def __enter__(self) -> Tape:
        require_open_tape_state()
        previous = TAPE.latest
        if previous is not None:   # it can no longer be differentiated: its values' inputs can go
            previous.release(any(g.inputs and g.inputs[0].tape is previous and not known(g) for g in list(PENDING)))
        TAPE.current = TAPE.latest = self.tape
        return self.tape

    def __exit__(self, *exc: object) -> None:
        TAPE.current = None
        self.tape.open = False


def with_grad_tape(fn: Callable[[], object] | None = None) -> object:
    """Record the ops of a block (or of ``fn()``) whose inputs need a gradient, for ``backward``.

    A new tape starts with each block; blocks do not nest (RuntimeError-like GgmlStateError). Outside a tape
    nothing is recorded and results have ``requires_grad`` False. A value made by an earlier tape is a constant
    on this one.

    Arguments:
        fn: a function of no arguments to run on a new tape; None: use the result as a context manager.

    Value: with ``fn``, what ``fn()`` returns; without, a context manager whose ``as`` target is the tape
    (``len(tape)``: the ops it recorded).

    Example:
        >>> with with_grad_tape() as tape:
        ...     loss = ag_mse_loss(model(x), y)
        >>> grads = backward(loss)
    """
    if fn is None:
        return TapeBlock()
    if not callable(fn):
        raise GgmlTypeError(f"with_grad_tape: fn must be a function of no arguments (or None), got {fn!r}")
    with TapeBlock():
        return fn()


def backward(loss: AgTensor) -> Grads:
    """Gradients of a scalar loss with respect to the trainable leaves it was computed from.

    The gradients are lazy: they are computed, with the loss and everything between, in the one graph of the
    next read or optimizer step (ggml's backward pass on the device). Each is added into its leaf's ``.grad``,
    which accumulates over calls until ``zero_grad``.

    Arguments:
        loss: a one-element AgTensor computed on the latest tape (``with_grad_tape``).

    Value: a ``Grads`` mapping: leaf (or its ``.id``) -> its gradient from this call (an f32 AgTensor).

    Example:
        >>> grads = backward(loss)
        >>> grads[W].numpy()
    """
    if not isinstance(loss, AgTensor):
        raise GgmlTypeError(f"backward: loss must be an AgTensor, got {type(loss).__name__}")
    if loss.size != 1:
        raise GgmlValueError(f"backward: the loss must be a scalar (one element), got shape {loss.shape}; reduce it "
                             "with ag_sum or ag_mean first")
    if loss.dtype == "i32":
        raise GgmlTypeError("backward: the loss holds integers; it must be floating-point")
    tape = loss.tape
    if tape is None or not loss.requires_grad:
        raise GgmlStateError("backward: this loss was not recorded on a tape (make it inside `with "
                             "with_grad_tape():`, from at least one ag_param)")
    if tape is not TAPE.latest:
        raise GgmlStateError("backward: this loss is from an earlier tape; only the latest tape's loss can be "
                             "differentiated (compute it again inside a new with_grad_tape block)")
    leaves, foreign = _walk(loss, tape)
    if foreign:  # values from outside this tape: constants here, computed first so no gradient flows into them
        evaluate(foreign)
        for f in foreign:
            fetch(f)
    # gradients of other losses still to compute: computed first (one graph differentiates one loss), loss by loss
    earlier: dict[int, list[AgTensor]] = {}
    for g in list(PENDING):
        if g.engine is loss.engine and not known(g) and g.inputs and g.inputs[0] is not loss:
            earlier.setdefault(id(g.inputs[0]), []).append(g)
    for grads in earlier.values():
        evaluate(grads)
    # sums of gradients of earlier calls still to compute (no zero_grad between): computed now, so that each
    # .grad is one sum deep and holds no earlier step's values
    sums = [leaf.grad for leaf in leaves if leaf.grad is not None and not known(leaf.grad)]
    if sums:
        evaluate(sums)
    pairs: dict[int, tuple[AgTensor, AgTensor]] = {}
    for leaf in leaves:
        g = result(GRAD, (loss, leaf), leaf.shape, differentiable=False)
        PENDING.add(g)
        leaf.grad = g if leaf.grad is None else ag_add(leaf.grad, g)
        pairs[leaf.id] = (leaf, g)
    group = tuple(weakref.ref(g) for _, g in pairs.values())
    for _, g in pairs.values():
        g.group = group   # reading one gradient computes them all, in one graph
    return Grads(pairs)


def _walk(loss: AgTensor, tape: Tape) -> tuple[list[AgTensor], list[AgTensor]]:
    """The trainable leaves the tape's ops lead to from ``loss``, and the values from outside the tape, not yet
    computed, that read a trainable leaf (ggml would send gradients through them)."""
    leaves: dict[int, AgTensor] = {}
    outside: dict[int, AgTensor] = {}
    seen: set[int] = set()
    stack = [loss]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        for x in n.inputs:
            if x.op is None:
                if x.requires_grad:
                    leaves.setdefault(id(x), x)
            elif x.tape is tape and x.requires_grad:
                stack.append(x)
            elif not known(x) and _reads_trainable(x):
                outside.setdefault(id(x), x)
    return list(leaves.values()), list(outside.values())


def _reads_trainable(n: AgTensor) -> bool:
    stack, seen = [n], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.op is None:
            if x.requires_grad:
                return True
        elif not known(x):
            stack.extend(x.inputs)
    return False


def ag_grad(x: AgTensor) -> np.ndarray | None:
    """The accumulated gradient of a leaf as a numpy array (computed first if needed), or None.

    Arguments:
        x: an AgTensor (a leaf that ``backward`` reached; others have no gradient).

    Value: a float32 array of x's shape, or None when x has no gradient.

    Example:
        >>> ag_grad(W)
    """
    if not isinstance(x, AgTensor):
        raise GgmlTypeError(f"ag_grad: x must be an AgTensor, got {type(x).__name__}")
    return None if x.grad is None else x.grad.numpy()
