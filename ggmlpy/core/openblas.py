"""Which OpenBLAS ggml's BLAS backend runs on in this process, and how it runs its threads.

OpenBLAS comes in builds that differ in their threads: its own pthreads pool (Debian's default
``libopenblas0-pthread``), OpenMP (``libopenblas0-openmp``, Fedora's ``libopenblaso``) or none. With
OpenMP it runs its products on the same libgomp threads as ggml's CPU backend, so the two never compete
for the cores; with its own pool, its idle workers spin beside ggml's (see ``backend.split_threads``).
The build links the OpenMP variant where it is installed, but the library a process ends up with is the
one loaded first under its name, so this module asks the loaded library itself.
"""
from __future__ import annotations

import ctypes
import os
import sys


# openblas_get_parallel(): how this OpenBLAS was built to run its threads
PARALLEL_MODELS = {0: "sequential", 1: "pthreads", 2: "openmp"}
# the names ggml's BLAS backend may have loaded it under (Debian/Ubuntu, Fedora's OpenMP build, 64-bit ints,
# macOS)
_SONAMES = ("libopenblas.so.0", "libopenblaso.so.0", "libopenblas64_.so.0", "libopenblas.0.dylib")


_found: list = []  # the library once found: it stays loaded for the life of the process


def loaded_openblas() -> ctypes.CDLL | None:
    """The OpenBLAS already loaded into this process (by ggml's BLAS backend), or None. Never loads one.
    Builds whose symbols carry a prefix (numpy's ``scipy_openblas``) are not the one ggml calls: skipped.
    Not finding one is not remembered: the BLAS backend may be loaded later."""
    if _found:
        return _found[0]
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
    if not getattr(os, "RTLD_NOLOAD", 0):  # pragma: no cover - Windows: no way to ask without loading
        return None
    for name in _loaded_paths() + list(_SONAMES):
        try:
            lib = ctypes.CDLL(name, mode=mode)
        except OSError:
            continue
        if hasattr(lib, "cblas_sgemm") and hasattr(lib, "openblas_get_parallel"):
            _found.append(lib)
            return lib
    return None


def _loaded_paths() -> list[str]:
    """Paths of loaded libraries whose name says OpenBLAS (Linux: /proc/self/maps)."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/") and ".so" in p)


def threading_model() -> str | None:
    """How the loaded OpenBLAS runs its threads: "openmp", "pthreads" or "sequential"; None when no OpenBLAS
    is loaded (no BLAS backend in this build) or it cannot tell."""
    lib = loaded_openblas()
    fn = getattr(lib, "openblas_get_parallel", None) if lib is not None else None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_int, []
    return PARALLEL_MODELS.get(int(fn()))


def config() -> str | None:
    """OpenBLAS's own description of its build (version, target, thread count), or None."""
    lib = loaded_openblas()
    fn = getattr(lib, "openblas_get_config", None) if lib is not None else None
    if fn is None:
        return None
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    return fn().decode(errors="replace").strip()
