"""Fetch, patch and build the pinned ggml (``build_ggml.py`` at the repository root is its command line).

One concern a module, each importing only those listed before it:

    messages   the errors, and the ``[ggmlpy]`` progress lines
    checkout   this checkout's paths (ggml.pin, patches/, vendor/ggml/, ggmlpy/lib/) and the pin
    cache      the cache root, file locks, atomic writes and folder replaces, stamps, leftovers
    index      the pinned sdist from pip's index or find-links, sha256-checked; pip as a last resort
    source     the archive's ggml tree unpacked and patched in the cache, copied to vendor/ggml/
    options    CMake options per backend, and which backends to build
    builder    configure, compile and install into ggmlpy/lib/, reusing the cache

The names below are re-exported for build_ggml.py and setup.py. A test replacing a function must patch
it in the module that calls it (``options.openblas_found`` for ``parse_backends``, say): patching it
here, or in build_ggml, changes nothing the build looks up.
"""
from __future__ import annotations

from .builder import build
from .checkout import LIB_DIR, read_pin, VENDOR_DIR
from .index import fetch_archive
from .messages import BuildError, ChecksumMismatch, log
from .options import backends_from_env, DEFAULT_BACKENDS, parse_backends
from .source import source_key, source_tree, sync_vendor


__all__ = ["DEFAULT_BACKENDS", "LIB_DIR", "VENDOR_DIR", "BuildError", "ChecksumMismatch", "backends_from_env",
           "build", "fetch_archive", "log", "parse_backends", "read_pin", "source_key", "source_tree",
           "sync_vendor"]
