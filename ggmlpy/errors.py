"""The package's exceptions and warnings, in one place.

Each error subclasses the builtin a Python caller would expect (ValueError for bad
values, TypeError for wrong kinds, RuntimeError for state), so ``except ValueError``
works, while ``except GgmlpyError`` catches everything raised by ggmlpy itself.
"""
from __future__ import annotations


class GgmlpyError(Exception):
    """Base class of every error raised by ggmlpy: ``except GgmlpyError`` catches them all.

    Each subclass also derives from the builtin a Python caller would expect (ValueError,
    TypeError, RuntimeError, OSError, KeyError), so generic handlers keep working. Messages say
    what was expected, what was given and the usual fix.

    Example:
        >>> try:
        ...     ggml_init(-1)
        ... except GgmlpyError as e:
        ...     print(e)
    """


class GgmlValueError(GgmlpyError, ValueError):
    """A value is out of range or a shape does not fit (also a ``ValueError``).

    Raised before ggml is called for what would abort inside C: operand shapes of an op, element
    counts of a data write, a context too full, an out-of-range index, a non-finite training loss.
    """


class GgmlTypeError(GgmlpyError, TypeError):
    """An argument has the wrong kind: a handle of another type, a tensor type an op does not take,
    non-numeric data (also a ``TypeError``)."""


class GgmlStateError(GgmlpyError, RuntimeError):
    """An object is in the wrong state (also a ``RuntimeError``): used after being freed, a tensor
    without memory, ``ggml_opt_eval`` without ``ggml_opt_alloc``, a failed computation."""


class GgmlInUseError(GgmlStateError):
    """An object cannot be freed (or re-allocated) now because a running call uses it (a GgmlStateError).

    Raised when a scheduler, opt context, context, buffer, backend or result is freed while a
    computation, a fit or an epoch that needs it is running: from one of that call's callbacks or
    generators, or from another thread. ggml would otherwise free memory it is still using. Free the
    object after the call has returned (a callback can stop a fit with ``state.stop = True``).
    """


class BackendUnavailableError(GgmlStateError):
    """A backend or device was asked for that this build or this machine does not have (a
    GgmlStateError). The message says which and how to fix it (rebuild with ``GGMLPY_BACKENDS=...``,
    check the driver; for a backend module that was built but did not load, the module file and the library
    it misses); ``ggml_list_devices()`` shows what is available, ``ggml_backend_load_errors()`` what did
    not load."""


class GgufFileError(GgmlpyError, OSError):
    """A GGUF file could not be read (unreadable, truncated or not valid GGUF) or written (also an
    ``OSError``)."""


class GgufFileNotFoundError(GgufFileError, FileNotFoundError):
    """The GGUF file does not exist (a GgufFileError and a ``FileNotFoundError``)."""


class GgufKeyError(GgmlValueError, KeyError):
    """A tensor or a key asked for by name is not in the GGUF file or context (a GgmlValueError and a
    ``KeyError``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GgmlpyWarning(UserWarning):
    """The category of every warning ggmlpy emits (where ggmlR gives an R warning): a short epoch, an
    exhausted source, a non-finite loss with ``on_nonfinite="warn"``, ...

    Filter them with the ``warnings`` module, e.g. ``warnings.simplefilter("error", GgmlpyWarning)``
    turns them into exceptions.
    """


def expect(condition: object, message: str, kind: type[Exception] = GgmlValueError) -> None:
    """Raise ``kind(message)`` unless ``condition`` holds (is true)."""
    if not condition:
        raise kind(message)


def carry_history(exc: BaseException, history: object) -> None:
    """Let the error that ended a fit carry the fit's completed epochs as ``exc.history`` (a DataFrame): any
    exception may, the caller's own (from a generator or a callback) included."""
    exc.history = history  # type: ignore[attr-defined]  # an attribute given to any exception, by design


def history_of(exc: BaseException) -> object:
    """The completed epochs an error carries (``carry_history``), or None."""
    return getattr(exc, "history", None)
