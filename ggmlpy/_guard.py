"""The last line of defence of the public API: a Python error from inside ggmlpy becomes a ggmlpy error.

Arguments are checked before ggml is called (``ggmlpy.core.args`` and each tier's checks), with messages that say
what was expected. What a check missed would surface as a bare ``TypeError: '<' not supported ...``, an
``OverflowError`` from cffi, a ``ZeroDivisionError`` or a ``ValueError`` from numpy: each public function is wrapped so
that such an error, raised by ggmlpy's own code (or by numpy, cffi, pandas, matplotlib or the standard library called
from it), leaves as the matching ggmlpy error instead (GgmlTypeError, GgmlValueError or
GgmlStateError, still a subclass of TypeError / ValueError / RuntimeError), naming the function and
chaining the original as ``__cause__``. Errors no argument can cause (an AttributeError, a NameError, a
failed assert, an IndexError or KeyError raised in ggmlpy's own code) are ggmlpy's bugs: they leave as a
GgmlStateError that says "internal error in ggmlpy" and asks for a report, instead of blaming an argument.

An error raised by the caller's own code (a generator, a callback, an ``__array__``) is never touched:
it propagates unchanged, as the generator contract says. Neither are KeyboardInterrupt, SystemExit, ggmlpy's
own errors, OSError (a file system's answer) or warnings.

The same wrapper makes calls on one context take turns (a function whose first argument is ``ctx`` holds that
context's lock: ggml's context is not thread-safe) and counts the call for the exit hook. It is the only frame
between the caller's line and the function in a traceback (tests/public/test_arguments.py counts them); a converted
error's original (its ``__cause__``) starts at the function itself.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sysconfig
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

from .core.handle import public_call
from .errors import carry_history, GgmlpyError, GgmlStateError, GgmlTypeError, GgmlValueError, history_of
from .graph.objects import Context


if TYPE_CHECKING:
    from typing import ParamSpec  # Python 3.10: only the type checker reads it

    P = ParamSpec("P")
R = TypeVar("R")


_PKG = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _library_roots() -> tuple[str, ...]:
    roots = [_PKG]
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            roots.append(os.path.abspath(path) + os.sep)
    import importlib.util
    for name in ("numpy", "pandas", "matplotlib", "PIL", "cffi", "tqdm", "_cffi_backend", "dateutil", "pytz"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is not None and spec.origin:
            base = os.path.dirname(os.path.abspath(spec.origin))
            roots.append(base + os.sep if spec.submodule_search_locations else os.path.abspath(spec.origin))
    return tuple(roots)


_ROOTS: list[tuple[str, ...]] = []


def _ours(tb: TracebackType | None) -> bool:
    """Whether every frame from the guarded call down to the raise is ggmlpy's or a library's it uses: an
    error that passed through the caller's code (a generator, a callback) is the caller's."""
    if not _ROOTS:
        _ROOTS.append(_library_roots())
    roots = _ROOTS[0]
    tb = tb.tb_next if tb is not None else None  # the guard's own frame
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith("<frozen") and not os.path.abspath(filename).startswith(roots):
            return False
        tb = tb.tb_next
    return True


# Python errors that never come from an argument that help() allows: raised in ggmlpy's own code, they are
# ggmlpy's bugs (an argument problem is caught by a check first, with a message that says what was expected)
_BUGS = (AttributeError, NameError, AssertionError, RecursionError, LookupError, ZeroDivisionError)
REPORT = "please report it, with the traceback, to ggmlpy's issue tracker"


def _raised_here(tb: TracebackType | None) -> bool:
    """Whether the innermost frame is ggmlpy's own code (not numpy, cffi or the standard library)."""
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PKG)


def _converted(fn: str, exc: Exception) -> GgmlpyError | None:
    if isinstance(exc, GgmlpyError) or isinstance(exc, OSError) or not _ours(exc.__traceback__):
        return None
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, _BUGS) and (not isinstance(exc, (LookupError, ZeroDivisionError))
                                   or _raised_here(exc.__traceback__)):
        return GgmlStateError(f"{fn}: internal error in ggmlpy ({what}): this is a bug in ggmlpy, not in your "
                              f"arguments; {REPORT}")
    bug_if = f"see help(ggmlpy.{fn}); if the arguments match it, this is a bug in ggmlpy: {REPORT}"
    if isinstance(exc, TypeError):
        return GgmlTypeError(f"{fn}: an argument has the wrong kind ({what}); {bug_if}")
    if isinstance(exc, MemoryError):
        return GgmlValueError(f"{fn}: out of memory ({what}): the arguments ask for more memory than is available")
    if isinstance(exc, (ValueError, ArithmeticError, LookupError)):
        return GgmlValueError(f"{fn}: an argument is out of range or inconsistent ({what}); {bug_if}")
    if isinstance(exc, RuntimeError):
        return GgmlStateError(f"{fn}: {what}")
    return None


def _call_mismatch(func: Callable, args: tuple, kwargs: dict) -> str:
    """What is wrong with the call itself (an argument the function does not have, one missing, too many),
    said with the function's own arguments; "" when the call matches the signature."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        names = ", ".join(p for p in signature.parameters if p not in ("args", "kwargs")) or "none"
        return (f"{exc} (its arguments: {names}; a Keras argument of the same purpose may have another name here "
                f"or not exist yet, see help(ggmlpy.{func.__name__}))")
    return ""


def guard(func: Callable[P, R]) -> Callable[P, R]:
    """``func`` with its non-ggmlpy errors from inside ggmlpy turned into ggmlpy errors, its calls on one
    context taking turns (see the module)."""
    name = func.__name__
    params = list(inspect.signature(func).parameters)
    takes_ctx = bool(params) and params[0] == "ctx"

    @functools.wraps(func)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = (args[0] if args else kwargs.get("ctx")) if takes_ctx else None
        # not a Context: the function's own checks say what is wrong
        lock = ctx.lock if isinstance(ctx, Context) else contextlib.nullcontext()
        try:
            with public_call(), lock:  # counted for the exit hook (core/handle.py)
                return func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - converted or re-raised unchanged
            mismatch = _call_mismatch(func, args, kwargs) if isinstance(exc, TypeError) \
                and not isinstance(exc, GgmlpyError) else None
            if mismatch:
                raise GgmlTypeError(f"{name}: {mismatch}") from None
            new = _converted(name, exc)
            if new is None:
                raise
            history = history_of(exc)
            if history is not None:  # a fit's completed epochs travel with its error
                carry_history(new, history)
            if exc.__traceback__ is not None:  # the original starts at the function: this frame shows once
                exc.__traceback__ = exc.__traceback__.tb_next
            raise new from exc

    return guarded
