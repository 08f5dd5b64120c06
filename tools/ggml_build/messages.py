"""What the build tells the user: its errors, and the ``[ggmlpy]`` progress lines (on stderr, and on
pip's terminal when pip runs the build)."""
from __future__ import annotations

import os
import sys


class BuildError(RuntimeError):
    """A build step failed; the message says what to install or change."""


class ChecksumMismatch(BuildError):
    """A file (or an index's listing of it) does not match the pinned sha256."""


_tty: object = None  # None: not looked for yet; False: none to write to
_tty_lines = 0


def _progress_tty():
    """pip captures a build's output and shows it only with -v or on failure; when pip runs us from a
    terminal, progress lines also go to that terminal (GGMLPY_PROGRESS=0 turns this off)."""
    global _tty
    if _tty is None:
        _tty = False
        under_pip = "PIP_BUILD_TRACKER" in os.environ or "PIP_REQ_TRACKER" in os.environ
        if under_pip and os.environ.get("GGMLPY_PROGRESS", "1") != "0" and not sys.stderr.isatty():
            try:
                _tty = open("/dev/tty", "w")  # noqa: SIM115 - kept open for the whole build
            except OSError:
                _tty = False
    return _tty or None


def log(msg: str) -> None:
    line = f"[ggmlpy] {msg}"
    print(line, file=sys.stderr, flush=True)
    tty = _progress_tty()
    if tty is not None:
        global _tty_lines
        try:
            # The first line starts below pip's "Building wheel for ggmlpy ..."; later ones clear the
            # spinner character pip wrote at the start of the line.
            tty.write(("\n" if _tty_lines == 0 else "\r\033[K") + line + "\n")
            tty.flush()
            _tty_lines += 1
        except OSError:
            pass
