#!/usr/bin/env python3
"""Fetch, patch and build the pinned ggml into ggmlpy/lib/.

    python build_ggml.py [--backends cpu,vulkan,cuda,rpc] [--cuda-arch 90] [--force]

Steps: read ggml.pin -> download the pinned sdist from PyPI (cached) -> check its
sha256 -> unpack its ggml tree into vendor/ggml/ -> apply patches/*.patch -> CMake
with GGML_BACKEND_DL (each backend its own loadable module) -> copy the libraries
into ggmlpy/lib/ together with build_info.json.

A build whose source, patches and options are unchanged is reused from the cache
(``$GGMLPY_CACHE`` or ``~/.cache/ggmlpy``), so repeated installs are quick.
The backends also come from ``$GGMLPY_BACKENDS`` (default ``cpu``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
PIN_FILE = ROOT / "ggml.pin"
PATCH_DIR = ROOT / "patches"
VENDOR_DIR = ROOT / "vendor" / "ggml"
LIB_DIR = ROOT / "ggmlpy" / "lib"
KNOWN_BACKENDS = ("cpu", "vulkan", "cuda", "rpc")
# Bump when the way we configure or install changes, so old cache entries are not reused.
BUILD_RECIPE_VERSION = "3"


class BuildError(RuntimeError):
    """A build step failed; the message says what to install or change."""


def log(msg: str) -> None:
    print(f"[build_ggml] {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("GGMLPY_CACHE", Path.home() / ".cache" / "ggmlpy"))


def read_pin() -> dict:
    return json.loads(PIN_FILE.read_text())


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_archive(pin: dict) -> Path:
    """Download the pinned sdist with pip (PyPI is the one registry we rely on)."""
    archive_dir = cache_root() / "archives"
    archive = archive_dir / pin["filename"]
    if archive.exists() and sha256_of(archive) == pin["sha256"]:
        return archive
    archive_dir.mkdir(parents=True, exist_ok=True)
    log(f"downloading {pin['package']}=={pin['version']} (sdist) from PyPI")
    with tempfile.TemporaryDirectory() as tmp:
        got = Path(tmp) / pin["filename"]
        errors = []
        for cmd, env in _pip_commands():
            cmd = cmd + ["download", "--no-deps", "--no-binary", ":all:", f"{pin['package']}=={pin['version']}",
                         "-d", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode == 0 and got.exists():
                break
            errors.append(f"$ {' '.join(cmd)}\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        else:
            raise BuildError(f"could not download {pin['package']}=={pin['version']} from PyPI; or place "
                             f"{pin['filename']} in {archive_dir}:\n" + "\n".join(errors))
        digest = sha256_of(got)
        if digest != pin["sha256"]:
            raise BuildError(f"sha256 mismatch for {pin['filename']}: expected {pin['sha256']}, "
                             f"got {digest}; refusing to build from an unverified archive")
        shutil.move(str(got), archive)
    return archive


def _pip_commands() -> list[tuple[list[str], dict]]:
    """Ways to run pip. Inside pip's isolated build environment pip itself is hidden (its PYTHONPATH
    overlay shadows the interpreter's site-packages), so also try without that overlay, and pip on PATH."""
    plain = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME")}
    commands = [([sys.executable, "-m", "pip"], dict(os.environ)), ([sys.executable, "-m", "pip"], plain)]
    for name in ("pip3", "pip"):
        found = shutil.which(name)
        if found:
            commands.append(([found], plain))
    return commands


def patch_files() -> list[Path]:
    return sorted(PATCH_DIR.glob("*.patch")) if PATCH_DIR.is_dir() else []


def source_key(pin: dict) -> str:
    h = hashlib.sha256(pin["sha256"].encode())
    for p in patch_files():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def unpack_and_patch(pin: dict, archive: Path) -> None:
    """Lay out vendor/ggml/ from the archive plus our patches, unless already there."""
    stamp = VENDOR_DIR / ".ggmlpy-source"
    key = source_key(pin)
    if stamp.exists() and stamp.read_text().strip() == key:
        return
    if VENDOR_DIR.exists():
        shutil.rmtree(VENDOR_DIR)
    VENDOR_DIR.parent.mkdir(parents=True, exist_ok=True)
    prefix = pin["subdir"].rstrip("/") + "/"
    log(f"unpacking {prefix} into {VENDOR_DIR.relative_to(ROOT)}")
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            m.name = m.name[len(prefix):]
            if m.name and not m.name.startswith(("/", "..")):
                members.append(m)
        tar.extractall(VENDOR_DIR, members=members, filter="data")
    for patch in patch_files():
        log(f"applying {patch.name}")
        proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(patch)],
                              cwd=VENDOR_DIR, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"patch {patch.name} does not apply to ggml {pin['ggml_version']}:\n"
                             f"{proc.stdout}{proc.stderr}")
    stamp.write_text(key + "\n")


def cpu_flag_options() -> list[str]:
    """GGML_NATIVE cannot be combined with GGML_BACKEND_DL, so name this CPU's features."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []  # ggml's defaults for the architecture
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
    except (OSError, IndexError):
        return []
    wanted = {
        "GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_BMI2": "bmi2",
        "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX512": "avx512f",
        "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
        "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni",
    }
    return [f"-D{opt}={'ON' if feat in flags else 'OFF'}" for opt, feat in wanted.items()]


def require_tool(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise BuildError(f"'{tool}' was not found on PATH. {hint}")
    return path


def vulkan_options() -> list[str]:
    require_tool("glslc", "The Vulkan backend compiles its shaders with glslc: "
                          "apt-get install glslc libvulkan-dev (or install the Vulkan SDK).")
    headers = [Path("/usr/include/vulkan/vulkan.hpp"), Path("/usr/local/include/vulkan/vulkan.hpp")]
    sdk = os.environ.get("VULKAN_SDK")
    if sdk:
        headers.append(Path(sdk) / "include" / "vulkan" / "vulkan.hpp")
    if not any(h.exists() for h in headers):
        raise BuildError("Vulkan C++ headers (vulkan/vulkan.hpp) were not found: "
                         "apt-get install libvulkan-dev (or set VULKAN_SDK).")
    spirv = [Path("/usr/include/spirv/unified1/spirv.hpp"), Path("/usr/local/include/spirv/unified1/spirv.hpp")]
    if sdk:
        spirv.append(Path(sdk) / "include" / "spirv" / "unified1" / "spirv.hpp")
    if not any(h.exists() for h in spirv):
        raise BuildError("SPIR-V headers were not found (ggml's Vulkan build needs them): "
                         "apt-get install spirv-headers (or set VULKAN_SDK).")
    return ["-DGGML_VULKAN=ON"]


def cuda_options(cuda_arch: str | None) -> list[str]:
    toolkit = Path(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda")
    nvcc = str(toolkit / "bin" / "nvcc") if (toolkit / "bin" / "nvcc").exists() else shutil.which("nvcc")
    if not nvcc:
        raise BuildError("The CUDA backend needs nvcc: install the CUDA toolkit "
                         "(https://developer.nvidia.com/cuda-downloads) and put nvcc on PATH or set CUDA_HOME.")
    if not (toolkit / "bin" / "nvcc").exists():
        toolkit = Path(nvcc).resolve().parent.parent
    opts = ["-DGGML_CUDA=ON", "-DGGML_CUDA_FA=OFF", "-DGGML_CUDA_NO_VMM=ON", f"-DCMAKE_CUDA_COMPILER={nvcc}"]
    arch = cuda_arch or os.environ.get("GGMLPY_CUDA_ARCH") or detect_cuda_arch() or "75;80;86;89;90"
    opts.append(f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
    cublas, cublas_lib = cublas_options(toolkit)
    # The CUDA module must find cudart and cuBLAS at run time wherever they live.
    rpath = ["$ORIGIN", str(toolkit / "lib64"), str(toolkit / "lib")] + ([str(cublas_lib)] if cublas_lib else [])
    return opts + cublas + [f"-DCMAKE_INSTALL_RPATH={';'.join(rpath)}"]


def detect_cuda_arch() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    proc = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                          capture_output=True, text=True)
    caps = sorted({c.strip().replace(".", "") for c in proc.stdout.split() if c.strip()})
    return ";".join(caps) or None


def cublas_options(toolkit: Path) -> tuple[list[str], Path | None]:
    """cuBLAS from the toolkit, else from the nvidia-cublas wheel (which lacks unversioned names);
    returns the CMake options and the wheel's library folder (None for the toolkit's)."""
    if list(toolkit.glob("**/libcublas.so")) and list(toolkit.glob("**/cublas_v2.h")):
        return [], None
    base = _cublas_wheel_dir()
    if base is None:
        raise BuildError("cuBLAS was not found in the CUDA toolkit: pip install nvidia-cublas "
                         "(or install the toolkit's libcublas-dev)")
    link_dir = cache_root() / "cublas-links"
    link_dir.mkdir(parents=True, exist_ok=True)
    opts = [f"-DCMAKE_CUDA_FLAGS=-I{base / 'include'}", f"-DCMAKE_CXX_FLAGS=-I{base / 'include'}"]
    for name, var in (("libcublas", "CUDA_cublas_LIBRARY"), ("libcublasLt", "CUDA_cublasLt_LIBRARY")):
        real = sorted((base / "lib").glob(f"{name}.so.*"))
        if not real:
            raise BuildError(f"{name}.so.* missing from the nvidia-cublas wheel at {base}")
        link = link_dir / f"{name}.so"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(real[0])
        opts.append(f"-D{var}={link}")
    return opts, base / "lib"


def _cublas_wheel_dir() -> Path | None:
    """The folder of the nvidia-cublas wheel holding include/cublas_v2.h and lib/libcublas.so.* (its layout
    changed between releases: nvidia/cublas/ or nvidia/cu13/)."""
    try:
        import nvidia  # type: ignore[import-not-found]  # namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for root in map(Path, nvidia.__path__):
        for header in sorted(root.glob("*/include/cublas_v2.h")):
            if list((header.parent.parent / "lib").glob("libcublas.so.*")):
                return header.parent.parent
    return None


def cmake_options(backends: list[str], cuda_arch: str | None) -> list[str]:
    opts = [
        "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_BACKEND_DL=ON",
        "-DGGML_NATIVE=OFF", "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
        "-DGGML_CCACHE=OFF",
        # Every library finds its siblings in its own folder (ggmlpy/lib/).
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    ]
    opts += cpu_flag_options()
    if "vulkan" in backends:
        opts += vulkan_options()
    if "cuda" in backends:
        opts += cuda_options(cuda_arch)
    if "rpc" in backends:
        opts.append("-DGGML_RPC=ON")
    return opts


def parse_backends(text: str) -> list[str]:
    names = [b.strip().lower() for b in text.split(",") if b.strip()]
    unknown = [b for b in names if b not in KNOWN_BACKENDS]
    if unknown:
        raise BuildError(f"unknown backend(s) {unknown}; expected a comma-separated subset of "
                         f"{', '.join(KNOWN_BACKENDS)}")
    if "cpu" not in names:
        names.insert(0, "cpu")  # the scheduler always needs a CPU backend last
    return sorted(set(names), key=KNOWN_BACKENDS.index)


def build(backends: list[str], cuda_arch: str | None = None, force: bool = False,
          jobs: int | None = None) -> Path:
    pin = read_pin()
    archive = fetch_archive(pin)
    unpack_and_patch(pin, archive)
    options = cmake_options(backends, cuda_arch)
    key_src = json.dumps([BUILD_RECIPE_VERSION, source_key(pin), options, platform.machine(),
                          shutil.which("c++") or "", sys.platform])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    build_dir = cache_root() / "build" / key
    done_stamp = build_dir / ".ggmlpy-built"
    if force and build_dir.exists():
        shutil.rmtree(build_dir)
    if done_stamp.exists():
        log(f"ggml unchanged since the last build; reusing {build_dir}")
    else:
        require_tool("cmake", "apt-get install cmake (or pip install cmake).")
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        log(f"configuring ggml {pin['ggml_version']} for backends {','.join(backends)}")
        run(["cmake", "-S", str(VENDOR_DIR), "-B", str(build_dir), *generator, *options])
        log("building (CPU only takes about 30 s on 2 cores; Vulkan about 4 min; CUDA much longer)")
        run(["cmake", "--build", str(build_dir), "--config", "Release",
             "-j", str(jobs or os.cpu_count() or 2)])
        done_stamp.write_text(key + "\n")
    install_libs(build_dir, backends, pin, key)
    return LIB_DIR


def run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"command failed: {' '.join(cmd)}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}")


def install_libs(build_dir: Path, backends: list[str], pin: dict, key: str) -> None:
    """Copy the core libraries under their SONAMEs and every backend module into ggmlpy/lib/."""
    if LIB_DIR.exists():
        shutil.rmtree(LIB_DIR)
    LIB_DIR.mkdir(parents=True)
    for core in ("libggml-base.so.0", "libggml.so.0"):
        src = build_dir / "src" / core
        if not src.exists():
            raise BuildError(f"expected {src} after the build")
        shutil.copy2(src.resolve(), LIB_DIR / core)
    modules = sorted((build_dir / "bin").glob("libggml-*.so"))
    for module in modules:
        shutil.copy2(module, LIB_DIR / module.name)
    missing = [b for b in backends if not (LIB_DIR / f"libggml-{b}.so").exists()]
    if missing:
        raise BuildError(f"the build produced no module for backend(s) {missing}")
    info = {"ggml_version": pin["ggml_version"], "pin_sha256": pin["sha256"], "backends": backends,
            "build_key": key, "patches": [p.name for p in patch_files()]}
    (LIB_DIR / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"installed {', '.join(p.name for p in sorted(LIB_DIR.iterdir()))} into ggmlpy/lib/")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=os.environ.get("GGMLPY_BACKENDS", "cpu"),
                    help="comma-separated subset of cpu,vulkan,cuda,rpc (env GGMLPY_BACKENDS)")
    ap.add_argument("--cuda-arch", default=None, help="CMAKE_CUDA_ARCHITECTURES, e.g. 90")
    ap.add_argument("--force", action="store_true", help="rebuild even if the cache matches")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--print-source-dir", action="store_true",
                    help="only fetch and unpack, then print vendor/ggml's path")
    args = ap.parse_args(argv)
    try:
        if args.print_source_dir:
            pin = read_pin()
            unpack_and_patch(pin, fetch_archive(pin))
            print(VENDOR_DIR)
            return 0
        build(parse_backends(args.backends), args.cuda_arch, args.force, args.jobs)
    except BuildError as exc:
        print(f"build_ggml.py: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
