#!/usr/bin/env python3
"""Pack, on this machine, what a bare GPU machine needs to run ``benchmarks/gpu_check.py``: it compiles nothing,
downloads nothing, and gets at most 64 MiB carried to it (the lent H100/H200 machines; see docs/guide/building.md).

    python tools/gpu_pack.py                     # into .gpu/ (git-ignored): build, strip, pack, check the size
    python tools/gpu_pack.py --cuda-arch 90 --jobs 2

What ``.gpu/`` holds:

    ggmlpy-gpu.tar.xz   ggmlpy/lib/ (ggml, the CPU backend for the AVX2 baseline, CUDA for --cuda-arch, Vulkan)
                        and the cffi extension ggmlpy/_ffi/_ggml.abi3.so, stripped; unpacked over the checkout there
    wheels/             cffi (the version the extension was built with), pycparser and gguf for CPython 3.12 (the
                        GPU machine's) and 3.11 (to rehearse here) on manylinux x86-64 (the machine's image has
                        numpy, pandas, pytest and PyTorch already)
    debs/               Debian's Vulkan loader (libvulkan1), for an image without one
    MANIFEST.json       each file's size and sha256, the commit and patches it was built from

The build runs in a copy of this checkout's files (``ggmlpy/lib`` here is left as it is) with this interpreter,
which needs cffi and, unless the CUDA toolkit has it, cuBLAS's wheel (``pip install nvidia-cublas==13.0.*`` for
nvcc 13.0); the build cache (``~/.cache/ggmlpy``) is shared, so a second pack reuses it. A CUDA build for one
architecture took about 30 min on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
LIMIT = 64 * 2**20            # what one device run carries, the checkout included
BACKENDS = "cpu,cuda,vulkan"
WHEEL_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
# the GPU machine's Python (3.12), and this project's CI Python (3.11) for the rehearsal here
PYTHONS = ("3.12", "3.11")


def log(message: str) -> None:
    print(f"[gpu_pack] {message}", flush=True)


def run(cmd: list[str], **kw) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked and untracked-but-not-ignored files (what a device run sees) into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def build(work: Path, cuda_arch: str, jobs: int | None) -> None:
    env = dict(os.environ, GGMLPY_CPU="avx2", GGMLPY_CUDA_ARCH=cuda_arch, GGMLPY_BACKENDS=BACKENDS)
    cmd = [sys.executable, "build_ggml.py", "--backends", BACKENDS, "--cuda-arch", cuda_arch]
    run(cmd + (["--jobs", str(jobs)] if jobs else []), cwd=work, env=env)
    # the extension as pip builds it: for Python's limited API (_ggml.abi3.so, which the GPU machine's Python 3.12
    # loads); the ggml build above is reused from the cache
    run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=work, env=env, stdout=subprocess.DEVNULL)


def pack_libraries(work: Path, out: Path) -> Path:
    """Strip the libraries and the extension, then tar.xz them with their paths in the checkout."""
    members = sorted((work / "ggmlpy" / "lib").iterdir()) + [work / "ggmlpy" / "_ffi" / "_ggml.abi3.so"]
    strip = shutil.which("strip")
    for m in members:
        if m.suffix in (".so", ".0") and strip:
            subprocess.run([strip, "--strip-unneeded", str(m)], check=True)
    target = out / "ggmlpy-gpu.tar.xz"
    with tarfile.open(target, "w:xz", preset=9) as tar:
        for m in members:
            tar.add(m, arcname=str(m.relative_to(work)))
    return target


def download_wheels(out: Path) -> None:
    import cffi
    wheels = out / "wheels"
    shutil.rmtree(wheels, ignore_errors=True)
    for version in PYTHONS:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               version, "--implementation", "cp", "-d", str(wheels)]
        for p in WHEEL_PLATFORMS:
            cmd += ["--platform", p]
        run(cmd + [f"cffi=={cffi.__version__}", "pycparser", "gguf"])


def download_vulkan_loader(out: Path) -> None:
    debs = out / "debs"
    shutil.rmtree(debs, ignore_errors=True)
    debs.mkdir(parents=True)
    if shutil.which("apt-get") is None:
        log("no apt-get here: .gpu/debs is empty (the GPU machine then needs its own Vulkan loader)")
        return
    run(["apt-get", "download", "libvulkan1"], cwd=debs)


def manifest(out: Path, cuda_arch: str, started: float) -> dict:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout)
    sys.path.insert(0, str(ROOT))
    from tools.ggml_build import read_pin, source_key
    info = {"commit": commit, "uncommitted_changes": dirty, "source_key": source_key(read_pin()),
            "backends": BACKENDS, "cpu": "avx2",
            "cuda_arch": cuda_arch, "patches": sorted(p.name for p in (ROOT / "patches").glob("*.patch")),
            "packed_in_s": round(time.monotonic() - started),
            "files": {str(p.relative_to(out)): {"bytes": p.stat().st_size,
                                                 "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                      for p in files}}
    (out / "MANIFEST.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def checkout_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    return sum((ROOT / f).stat().st_size for f in files if f and (ROOT / f).is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuda-arch", default="90", help="CUDA architectures to build (default 90: H100/H200)")
    ap.add_argument("--out", default=str(ROOT / ".gpu"), help="where to pack (default .gpu/, git-ignored)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs")
    args = ap.parse_args(argv)
    started = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ggmlpy-gpu-pack-") as tmp:
        work = Path(tmp)
        copy_checkout(work)
        build(work, args.cuda_arch, args.jobs)
        tarball = pack_libraries(work, out)
    download_wheels(out)
    download_vulkan_loader(out)
    info = manifest(out, args.cuda_arch, started)
    packed = sum(f["bytes"] for f in info["files"].values())
    total = packed + checkout_bytes()
    for name, f in info["files"].items():
        log(f"{f['bytes'] / 2**20:8.2f} MiB  {name}")
    log(f"{tarball.name}: {tarball.stat().st_size / 2**20:.1f} MiB; .gpu/ {packed / 2**20:.1f} MiB; with the "
        f"checkout {total / 2**20:.1f} MiB of the {LIMIT // 2**20} MiB a device run carries")
    if total > LIMIT:
        log("too large to carry: build fewer CUDA architectures, or leave the Vulkan module out")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
