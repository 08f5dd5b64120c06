"""File paths given to C: what ``fopen`` would block on (a FIFO) or refuse, checked first so that the
user gets a clear error.
"""
from __future__ import annotations

import os
import stat
from typing import Union

from ..errors import expect, GgmlTypeError, GgmlValueError, GgufFileError, GgufFileNotFoundError


PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]  # a file name, as os.fspath takes it


def fs_path(path: PathArg, fn: str) -> str:
    try:
        p = os.fspath(path)
    except TypeError:
        raise GgmlTypeError(f"{fn}: path must be a str or os.PathLike, got {type(path).__name__}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    expect(p != "" and "\0" not in p, f"{fn}: path must be a non-empty file name without NUL characters, got {p!r}")
    try:
        os.fsencode(p)
    except UnicodeEncodeError:
        raise GgmlValueError(f"{fn}: path {p!r} cannot be encoded for the file system (lone surrogate "
                             "characters)") from None
    return p


def os_reason(lines: list[str]) -> str:
    return f" (ggml: {'; '.join(s.strip() for s in lines)})" if lines else ""


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return "not a regular file"


def check_readable_file(p: str, fn: str) -> int:
    """Refuse what ggml cannot read as a GGUF file; returns the file's size. Only regular files: ggml seeks
    and asks for the size, and opening a FIFO (or a device) blocks until a writer comes, in C, where
    Ctrl-C cannot reach it."""
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise GgufFileNotFoundError(f"{fn}: no such file: {p!r}") from None
    except (OSError, ValueError) as exc:
        raise GgufFileError(f"{fn}: cannot access {p!r}: {getattr(exc, 'strerror', None) or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GgufFileError(f"{fn}: {p!r} is {_file_kind(st.st_mode)}, not a GGUF file; ggmlpy reads regular files "
                            "only (a pipe or device cannot be seeked, and opening one can block forever): copy the "
                            "data to a file first")
    if not os.access(p, os.R_OK):
        raise GgufFileError(f"{fn}: {p!r} is not readable (permission denied)")
    return int(st.st_size)


def check_writable_path(p: str, fn: str) -> None:
    """Writing to an existing FIFO or socket would block in C (waiting for a reader); a directory fails."""
    try:
        st = os.stat(p)
    except OSError:
        return  # a new file (a missing folder is reported by the write itself)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode)):  # a character device: /dev/null
        raise GgufFileError(f"{fn}: {p!r} is {_file_kind(st.st_mode)}; write GGUF to a regular file")


def path_bytes(p: PathArg) -> bytes:
    raw = os.fsencode(p)
    if b"\0" in raw:
        raise GgmlValueError(f"a file path must not contain NUL characters, got {p!r}")
    return raw
