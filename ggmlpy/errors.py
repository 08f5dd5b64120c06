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


class GgufFileError(GgmlpyError, OSError):
    """A GGUF file could not be read (unreadable or not valid GGUF) or written."""


class GgufFileNotFoundError(GgufFileError, FileNotFoundError):
    """The GGUF file does not exist."""


class GgufKeyError(GgmlValueError, KeyError):
    """A tensor or a key asked for by name is not in the GGUF file or context."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GgmlpyWarning(UserWarning):
    """Warnings ggmlpy emits (R warnings in ggmlR)."""


def expect(condition: bool, message: str, kind: type[Exception] = GgmlValueError) -> None:
    """Raise ``kind(message)`` unless ``condition`` holds."""
    if not condition:
        raise kind(message)
