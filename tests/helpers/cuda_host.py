"""CUDA kernels of ours run on the host: a kernel file's source, cut between two markers, compiled as C++ with a
shim that stands in for CUDA's built-ins and with launchers that emulate the grid, loaded with ctypes. Tests
check the kernels' arithmetic and indexing against ggml's CPU ops on machines without a GPU."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest


def host_library(tmp_dir: Path, source: Path, start: str, end: str, shim: str, launchers: str,
                 edit: Callable[[str], str] = lambda text: text, std: str = "c++17") -> ctypes.CDLL:
    """The kernels of ``source`` from the line holding ``start`` up to ``end`` (``edit`` may rewrite them),
    between ``shim`` and ``launchers``, compiled by g++ into a library in ``tmp_dir``. Skips, saying why, where
    the vendored source or g++ is missing."""
    if not source.exists():
        pytest.skip(f"the vendored ggml source is not unpacked ({source}: run python build_ggml.py)")
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++ to compile the kernels' source for the host")
    text = source.read_text()
    kernels = edit(text[text.index(start):text.index(end)])
    src = tmp_dir / f"{source.stem}_emu.cpp"
    src.write_text(shim + kernels + launchers)
    so = src.with_suffix(".so")
    proc = subprocess.run([compiler, f"-std={std}", "-O1", "-shared", "-fPIC", "-pthread", str(src), "-o", str(so)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return ctypes.CDLL(str(so))
