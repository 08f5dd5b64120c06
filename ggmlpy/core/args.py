"""The one set of argument validators: integers, reals, booleans, learning rates, weight decays, thread counts,
lists and C strings.

Every tier checks a Python argument with these before it reaches ggml (whose asserts abort the process),
so one rule has one code path and one message. A function elsewhere that only checks the kind of an argument, or
only wraps one of these, is a validator growing back (tests/project/test_style.py finds them).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import NoReturn, TYPE_CHECKING

import numpy as np

from .._ffi import lib
from ..errors import GgmlTypeError, GgmlValueError


if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10: only the type checker reads it


INT64_MAX = (1 << 63) - 1


def c_string(fn: str, what: str, value: object) -> bytes:
    """``value`` (a str) as UTF-8 bytes for C; refuses NUL characters, which C would cut the string at."""
    if not isinstance(value, str):
        raise GgmlTypeError(f"{fn}: {what} must be a str, got {value!r}")
    if "\0" in value:
        raise GgmlValueError(f"{fn}: {what} must not contain NUL characters ('\\0'): C would cut it at the first "
                             f"one, got {value!r}; remove them")
    try:
        return value.encode()
    except UnicodeEncodeError:  # lone surrogates ('\udc80' from undecodable bytes) have no UTF-8 form
        raise GgmlValueError(f"{fn}: {what} must be valid Unicode text, got {value!r} (it holds lone surrogate "
                             "characters, which have no UTF-8 form)") from None


Shape = tuple[int, int, int, int]


def fail(fn: str | None, message: str, kind: type[Exception] = GgmlValueError) -> NoReturn:
    raise kind(f"{fn}: {message}" if fn else message)


INT32_MAX = (1 << 31) - 1  # ggml takes sizes, strides and counts of its ops as C ints
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32: below it, values lose precision or 0


def is_int(value: object) -> TypeGuard[int | np.integer]:
    """An integer argument: a Python or numpy int, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: object) -> TypeGuard[float | np.integer | np.floating]:
    """A real-number argument: a Python or numpy int or float, not a bool (any ``numbers.Real``: the type
    names the kinds ggmlpy meets)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def bool_arg(fn: str | None, name: str, value: object) -> bool:
    """``value`` as a bool: True or False (numpy's bools too); anything else, 0 and 1 included, is a
    GgmlTypeError."""
    if not isinstance(value, (bool, np.bool_)):
        fail(fn, f"{name} must be True or False, got {value!r}", GgmlTypeError)
    return bool(value)


LR_FLOOR = 1e-12  # the smallest rate a schedule sets: ggml aborts on a learning rate <= 0


def positive_float32_arg(what: str, value: object, hint: str = "") -> float:
    """A number ggml keeps as a float32 and needs > 0 (a learning rate, a normalisation's eps): a finite number
    in [FLOAT32_TINY, FLOAT32_MAX] (1e-300 would become 0, 1e300 inf); anything else is a GgmlValueError.
    ``hint`` ends the message (the usual value)."""
    if not is_real(value) or not FLOAT32_TINY <= value <= FLOAT32_MAX:
        raise GgmlValueError(f"{what} must be a finite number > 0 that float32 holds (ggml keeps it as one: "
                             f"{FLOAT32_TINY:.3g} to {FLOAT32_MAX:.4g}), got {value!r}{hint}")
    return float(value)


def learning_rate_arg(what: str, value: object, schedule: bool = False) -> float:
    """The one rule for learning rates, which ggml keeps as float32.

    A rate the user gives (``ggml_compile``, ``ggml_fit_opt*``, ``trainer.set_lr``) must be a finite number
    in [FLOAT32_TINY, FLOAT32_MAX] (``positive_float32_arg``): 1e-300 would become 0 and change nothing, 1e300
    inf and make every weight NaN, so both raise. A rate set while training (``schedule``: ``ggml_opt_set_lr``
    and the learning-rate callbacks) may decay to 0, meaning "stop learning": values in [0, LR_FLOOR) become
    LR_FLOOR, since ggml aborts on 0."""
    if schedule:
        if not is_real(value) or not 0 <= value <= FLOAT32_MAX:
            raise GgmlValueError(f"{what} must be a finite number >= 0 (ggml keeps it as a float32: at most "
                                 f"{FLOAT32_MAX:.4g}), got {value!r}")
        return max(float(value), LR_FLOOR)
    return positive_float32_arg(what, value)


def weight_decay_arg(value: object) -> float:
    """ggml-opt's weight decay (AdamW's decoupled one): a number in [0, 1], the fraction of each weight taken
    off per optimizer step."""
    if not is_real(value) or not 0 <= value <= 1:
        raise GgmlValueError(f"weight_decay must be a number in [0, 1], got {value!r}")
    return float(value)


def int_arg(fn: str | None, name: str, value: object, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """``value`` as an int in [minimum, maximum] (numpy ints accepted). ``maximum`` defaults to the largest
    int64 (what C receives for sizes); C ``int`` arguments pass INT32_MAX (``c_int_arg``), else cffi raises
    OverflowError."""
    if not is_int(value):
        fail(fn, f"{name} must be an int, got {value!r}", GgmlTypeError)
    v = int(value)
    if minimum is not None and v < minimum:
        fail(fn, f"{name} must be >= {minimum}, got {v}")
    if v > maximum:
        fail(fn, f"{name} must be <= {maximum}, got {v}")
    if v < -maximum - 1:
        fail(fn, f"{name} must be >= {-maximum - 1}, got {v}")
    return v


MAX_THREADS = int(getattr(lib, "GGML_MAX_N_THREADS", 512))


def n_threads_arg(fn: str, value: object, name: str = "n_threads") -> int:
    """A thread count for ggml's CPU backend: an int in [1, GGML_MAX_N_THREADS] (a larger one would overflow
    C or make ggml start that many threads)."""
    return int_arg(fn, name, value, 1, MAX_THREADS)


def list_arg(fn: str, name: str, value: object, what: str = "values") -> list:
    """``value`` (a list, tuple or other iterable, not a str/bytes/dict) as a list; GgmlTypeError otherwise."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
        fail(fn, f"{name} must be a list of {what}, got {value!r}", GgmlTypeError)
    return list(value)


def c_int_arg(fn: str | None, name: str, value: object, minimum: int | None = None) -> int:
    """An argument ggml takes as a C ``int`` (32 bits)."""
    return int_arg(fn, name, value, minimum, INT32_MAX)


def positive_int_arg(fn: str | None, name: str, value: object) -> int:
    """A size, count or stride ggml takes as a C ``int``: an int in [1, INT32_MAX] (a non-int is a
    GgmlTypeError, one out of range a GgmlValueError)."""
    message = f"{name} must be a positive int (at most 2**31 - 1), got {value!r}"
    if not is_int(value):
        fail(fn, message, GgmlTypeError)
    if not 1 <= value <= INT32_MAX:
        fail(fn, message)
    return int(value)


def int_pair_arg(fn: str | None, name: str, value: object) -> tuple[int, int]:
    """(rows, cols) from a positive int or a pair of them (a kernel size, strides, a pool size)."""
    pair = (value, value) if is_int(value) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        fail(fn, f"{name} must be an int or a pair (rows, cols), got {value!r}")
    return positive_int_arg(fn, name, pair[0]), positive_int_arg(fn, name, pair[1])


def float_arg(fn: str, name: str, value: object, finite: bool = False) -> float:
    """``value`` as a float: any real number (numpy scalars included), never NaN (no ggml parameter means
    anything with NaN: the result would be NaN garbage). ``finite``: also not inf nor beyond float32's range
    (C ``float`` parameters: a larger value would silently become inf)."""
    if not is_real(value):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    try:
        v = float(value)
    except OverflowError:
        fail(fn, f"{name} must be a number in float range, got {value!r}")
    if math.isnan(v):
        fail(fn, f"{name} must be a number, got NaN")
    if finite and not abs(v) <= FLOAT32_MAX:
        fail(fn, f"{name} must be finite (within float32's range, +-{FLOAT32_MAX:.4g}), got {value!r}")
    return v


def eps_arg(fn: str, name: str, value: object) -> float:
    """A finite number >= 0 (ggml's norm kernels assert eps >= 0, which NaN also fails)."""
    if not is_real(value):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v) or v < 0:
        fail(fn, f"{name} must be a finite number >= 0, got {value!r}; the usual value is 1e-5 (1e-6 for RMS norm)")
    return v
