"""The one set of argument validators: integers, reals, learning rates, thread counts, lists and C strings.

Every tier checks a Python argument with these before it reaches ggml (whose asserts abort the process),
so one rule has one code path and one message.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .._ffi import lib
from ..errors import GgmlTypeError, GgmlValueError


INT64_MAX = (1 << 63) - 1


def c_string(fn: str, what: str, value: Any) -> bytes:
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


def fail(fn: str | None, message: str, kind: type[Exception] = GgmlValueError) -> None:
    raise kind(f"{fn}: {message}" if fn else message)


INT32_MAX = (1 << 31) - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32: below it, values lose precision or 0


def is_int(value: Any) -> bool:
    """An integer argument: a Python or numpy int, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    """A real-number argument: a Python or numpy int or float, not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


LR_FLOOR = 1e-12  # the smallest rate a schedule sets: ggml aborts on a learning rate <= 0


def learning_rate_arg(what: str, value: Any, schedule: bool = False) -> float:
    """The one rule for learning rates, which ggml keeps as float32.

    A rate the user gives (``ggml_compile``, ``ggml_fit_opt*``, ``trainer.set_lr``) must be a finite number
    in [FLOAT32_TINY, FLOAT32_MAX]: 1e-300 would become 0 and change nothing, 1e300 inf and make every
    weight NaN, so both raise. A rate set while training (``schedule``: ``ggml_opt_set_lr`` and the
    learning-rate callbacks) may decay to 0, meaning "stop learning": values in [0, LR_FLOOR) become
    LR_FLOOR, since ggml aborts on 0."""
    if schedule:
        if not is_real(value) or not 0 <= value <= FLOAT32_MAX:
            raise GgmlValueError(f"{what} must be a finite number >= 0 (ggml keeps it as a float32: at most "
                                 f"{FLOAT32_MAX:.4g}), got {value!r}")
        return max(float(value), LR_FLOOR)
    if not is_real(value) or not FLOAT32_TINY <= value <= FLOAT32_MAX:
        raise GgmlValueError(f"{what} must be a finite number > 0 that float32 holds (ggml keeps it as one: "
                             f"{FLOAT32_TINY:.3g} to {FLOAT32_MAX:.4g}), got {value!r}")
    return float(value)


def int_arg(fn: str, name: str, value: Any, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
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


def n_threads_arg(fn: str, value: Any, name: str = "n_threads") -> int:
    """A thread count for ggml's CPU backend: an int in [1, GGML_MAX_N_THREADS] (a larger one would overflow
    C or make ggml start that many threads)."""
    return int_arg(fn, name, value, 1, MAX_THREADS)


def list_arg(fn: str, name: str, value: Any, what: str = "values") -> list:
    """``value`` (a list, tuple or other iterable, not a str/bytes/dict) as a list; GgmlTypeError otherwise."""
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
        fail(fn, f"{name} must be a list of {what}, got {value!r}", GgmlTypeError)
    return list(value)


def c_int_arg(fn: str, name: str, value: Any, minimum: int | None = None) -> int:
    """An argument ggml takes as a C ``int`` (32 bits)."""
    return int_arg(fn, name, value, minimum, INT32_MAX)


def float_arg(fn: str, name: str, value: Any, finite: bool = False) -> float:
    """``value`` as a float: any real number (numpy scalars included), never NaN (no ggml parameter means
    anything with NaN: the result would be NaN garbage). ``finite``: also not inf nor beyond float32's range
    (C ``float`` parameters: a larger value would silently become inf)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
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


def eps_arg(fn: str, name: str, value: Any) -> float:
    """A finite number >= 0 (ggml's norm kernels assert eps >= 0, which NaN also fails)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        fail(fn, f"{name} must be a number, got {value!r}", GgmlTypeError)
    try:
        v = float(value)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v) or v < 0:
        fail(fn, f"{name} must be a finite number >= 0, got {value!r}; the usual value is 1e-5 (1e-6 for RMS norm)")
    return v
