"""The package's exceptions and warnings, in one place.

Each error subclasses the builtin a Python caller would expect (ValueError for bad
values, TypeError for wrong kinds, RuntimeError for state), so ``except ValueError``
works, while ``except GgmlpyError`` catches everything raised by ggmlpy itself.
"""
from __future__ import annotations


class GgmlpyError(Exception):
    """Base class of every error raised by ggmlpy."""


class GgmlValueError(GgmlpyError, ValueError):
    """A value is out of range or a shape does not fit."""


class GgmlTypeError(GgmlpyError, TypeError):
    """An argument has the wrong kind (handle type, dtype, ...)."""


class GgmlStateError(GgmlpyError, RuntimeError):
    """An object is in the wrong state: freed, not allocated, not built, ..."""


class BackendUnavailableError(GgmlStateError):
    """A backend was asked for that this build or this machine does not have."""


class GgmlpyWarning(UserWarning):
    """Warnings ggmlpy emits (R warnings in ggmlR)."""


def expect(condition: bool, message: str, kind: type[Exception] = GgmlValueError) -> None:
    """Raise ``kind(message)`` unless ``condition`` holds."""
    if not condition:
        raise kind(message)
