#!/usr/bin/env python3
"""Fetch, patch and build the pinned ggml into ggmlpy/lib/.

    python build_ggml.py [--backends cpu,blas,vulkan,cuda,rpc] [--cuda-arch 90] [--force] [--jobs N]

Steps: read ggml.pin -> download the pinned sdist straight from the package index pip is configured
with (it is only data: nothing of it is built or resolved by pip) -> check its sha256 -> unpack its
ggml tree and apply patches/*.patch inside the cache -> CMake with GGML_BACKEND_DL (each backend its
own loadable module) -> copy the libraries into ggmlpy/lib/ together with build_info.json. The patched
tree is also copied to vendor/ggml/ (the cffi extension compiles against its headers).

A build whose source, patches and options are unchanged is reused from the cache
(``$GGMLPY_CACHE`` or ``~/.cache/ggmlpy``), so repeated installs are quick. The backends also come
from ``$GGMLPY_BACKENDS`` (default ``cpu,blas``: the BLAS backend is built when OpenBLAS is installed --
``apt-get install libopenblas-dev libopenblas0-openmp`` -- and left out, with a message, when it is not;
it loads OpenBLAS's OpenMP build where that is installed, see ``options.openblas_openmp_dir``).

The code lives in tools/ggml_build/, one module per concern (its __init__ lists them); the cache's
layout is described in tools/ggml_build/cache.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


if str(Path(__file__).resolve().parent) not in sys.path:  # python -P leaves out the script's folder
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from tools.ggml_build import (  # noqa: E402
    backends_from_env,
    build,
    BuildError,
    ChecksumMismatch,
    DEFAULT_BACKENDS,
    fetch_archive,
    LIB_DIR,
    log,
    parse_backends,
    read_pin,
    source_key,
    source_tree,
    sync_vendor,
    VENDOR_DIR,
)


# What setup.py uses (build, backends_from_env, BuildError, LIB_DIR, log) and the steps main() runs.
__all__ = ["DEFAULT_BACKENDS", "LIB_DIR", "VENDOR_DIR", "BuildError", "ChecksumMismatch", "backends_from_env",
           "build", "fetch_archive", "log", "parse_backends", "read_pin", "source_key", "source_tree",
           "sync_vendor", "main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=None,
                    help="comma-separated subset of cpu,blas,vulkan,cuda,rpc (env GGMLPY_BACKENDS; "
                         f"default {DEFAULT_BACKENDS}, blas only when OpenBLAS is installed)")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES, e.g. 90")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache matches")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: the usable cores)")
    ap.add_argument("--print-source-dir", action="store_true",
                    help="only fetch and unpack, then print vendor/ggml's path")
    args = ap.parse_args(argv)
    try:
        if args.print_source_dir:
            pin = read_pin()
            sync_vendor(source_tree(pin, fetch_archive(pin)), source_key(pin))
            print(VENDOR_DIR)
            return 0
        backends = parse_backends(args.backends) if args.backends else backends_from_env()
        build(backends, args.cuda_arch, args.force, args.jobs)
    except BuildError as exc:
        print(f"build_ggml.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
