"""CMake options per backend (the CPU's instruction sets, Vulkan, CUDA with cuBLAS from the toolkit or
NVIDIA's wheel, OpenBLAS and its OpenMP build, RPC), and which backends to build."""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

from .cache import cache_root
from .messages import BuildError, log


KNOWN_BACKENDS = ("cpu", "blas", "vulkan", "cuda", "rpc")
# What a plain ``pip install .`` builds. "blas" (ggml's BLAS backend on OpenBLAS: MUL_MAT and OUT_PROD
# through cblas_sgemm, 2-4x ggml's own F32 kernels) is dropped with a message when OpenBLAS is missing.
DEFAULT_BACKENDS = "cpu,blas"
BLAS_HINT = ("apt-get install libopenblas-dev libopenblas0-openmp (Debian/Ubuntu; dnf install openblas-devel "
             "on Fedora)")
BLAS_OPENMP_HINT = "apt-get install libopenblas0-openmp (Debian/Ubuntu)"


# ggml's x86 instruction-set options and the /proc/cpuinfo flag of each
X86_FEATURES = {
    "GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_BMI2": "bmi2",
    "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX512": "avx512f",
    "GGML_AVX512_VBMI": "avx512vbmi", "GGML_AVX512_VNNI": "avx512_vnni",
    "GGML_AVX512_BF16": "avx512_bf16", "GGML_AVX_VNNI": "avx_vnni",
    # AMX's tiles and their BF16 products: the CPU's BF16 matrix kernel (patches/0061)
    "GGML_AMX_TILE": "amx_tile", "GGML_AMX_BF16": "amx_bf16",
}
# GGMLPY_CPU=avx2: x86-64-v3 (Haswell, 2013, and every x86 server since), for libraries built to run elsewhere
AVX2_BASELINE = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"}
CPU_LEVELS = ("native", "avx2")


def cpu_level() -> str:
    """The instruction sets the CPU backend is built for: $GGMLPY_CPU, "native" (this machine's, the default)
    or "avx2" (an AVX2 baseline that runs on any x86-64-v3 machine: what a build carried elsewhere needs)."""
    level = os.environ.get("GGMLPY_CPU", "").strip().lower() or "native"
    if level not in CPU_LEVELS:
        raise BuildError(f"GGMLPY_CPU must be one of {', '.join(CPU_LEVELS)}, got {level!r} (native: this "
                         "machine's instruction sets; avx2: a baseline for libraries carried to other machines)")
    return level


def cpu_flag_options(level: str = "native") -> list[str]:
    """GGML_NATIVE cannot be combined with GGML_BACKEND_DL, so name the instruction sets: this CPU's
    ("native"), or the AVX2 baseline ("avx2")."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []  # ggml's defaults for the architecture
    if level == "avx2":
        flags = AVX2_BASELINE
    else:
        try:
            flags = set(Path("/proc/cpuinfo").read_text().split("flags", 2)[1].split("\n", 1)[0].split())
        except (OSError, IndexError):
            return []
    return [f"-D{opt}={'ON' if feat in flags else 'OFF'}" for opt, feat in X86_FEATURES.items()]


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


def cuda_options(cuda_arch: str | None) -> tuple[list[str], list[str]]:
    """CMake options of the CUDA backend, and the folders its module loads libraries from."""
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
    return opts + cublas, cuda_runtime_dirs(toolkit, cublas_lib)


def cuda_runtime_dirs(toolkit: Path, cublas_lib: Path | None) -> list[str]:
    """Where the CUDA module finds cudart and cuBLAS at run time, wherever they live."""
    return [str(toolkit / "lib64"), str(toolkit / "lib")] + ([str(cublas_lib)] if cublas_lib else [])


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
        if not (link.is_symlink() and os.readlink(link) == str(real[0])):
            tmp = link_dir / f".{name}.so.{os.getpid()}"  # replaced atomically: builds may run at once
            if tmp.is_symlink() or tmp.exists():
                tmp.unlink()
            tmp.symlink_to(real[0])
            os.replace(tmp, link)
        opts.append(f"-D{var}={link}")
    return opts, base / "lib"


def _cublas_wheel_dir() -> Path | None:
    """The folder of the nvidia-cublas wheel holding include/cublas_v2.h and lib/libcublas.so.* (its layout
    changed between releases: nvidia/cublas/ or nvidia/cu13/)."""
    try:
        import nvidia  # the namespace package of NVIDIA's wheels (untyped: pyproject.toml's mypy overrides)
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
        # llamafile's tinyBLAS kernels for F32/F16 matrix products (llama.cpp builds them, ggml's own
        # CMake leaves them off): the products the BLAS backend does not take (sides < 32, batched
        # attention products) run on them instead of one vec_dot per output element.
        "-DGGML_LLAMAFILE=ON",
        "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    ]
    rpath = ["$ORIGIN"]  # every library finds its siblings in its own folder (ggmlpy/lib/)
    opts += cpu_flag_options(cpu_level())
    if "vulkan" in backends:
        opts += vulkan_options()
    if "cuda" in backends:
        cuda, dirs = cuda_options(cuda_arch)
        opts += cuda
        rpath += dirs
    if "rpc" in backends:
        opts.append("-DGGML_RPC=ON")
    if "blas" in backends:
        opts += ["-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS"]
        openmp = openblas_openmp_dir()
        if openmp is not None:
            # Searched before the system's choice of libopenblas.so.0 (Debian's default: the pthreads build)
            rpath.append(str(openmp))
        else:
            log(f"OpenBLAS's OpenMP build was not found: the BLAS backend will use the system's default "
                f"OpenBLAS, whose own threads compete with ggml's for the cores (1.1-1.3x slower CNN and "
                f"transformer training). To get it: {BLAS_OPENMP_HINT}, then reinstall.")
    return opts + [f"-DCMAKE_INSTALL_RPATH={';'.join(rpath)}"]


def openblas_openmp_dir() -> Path | None:
    """The folder of Debian/Ubuntu's OpenMP build of OpenBLAS (``libopenblas0-openmp``), or None.

    ggml's CPU backend runs on OpenMP; OpenBLAS built on OpenMP runs its products on the same threads, so
    each can take every core (its pthreads build keeps a pool of its own whose idle workers spin beside
    ggml's). The BLAS backend links the generic ``libopenblas.so.0``; putting this folder in its run path
    makes it load the OpenMP build whatever the system's default is."""
    roots = sorted(Path("/usr/lib").glob("*-linux-gnu*")) + [Path("/usr/lib"), Path("/usr/lib64")]
    return next((d / "openblas-openmp" for d in roots if (d / "openblas-openmp" / "libopenblas.so.0").exists()),
                None)


def openblas_found() -> bool:
    """OpenBLAS's library and cblas.h, where ggml's CMake (FindBLAS with BLA_VENDOR=OpenBLAS, then
    pkg-config or the usual include folders) will look for them."""
    pkg = shutil.which("pkg-config")
    if pkg:
        for name in ("openblas", "openblas64"):
            if subprocess.run([pkg, "--exists", name], capture_output=True).returncode == 0:
                return True
    lib_dirs = ["/usr/lib", "/usr/lib64", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu",
                "/usr/lib/aarch64-linux-gnu", "/opt/homebrew/opt/openblas/lib", "/usr/local/opt/openblas/lib"]
    lib_dirs += os.environ.get("LIBRARY_PATH", "").split(os.pathsep)
    have_lib = any(list(Path(d).glob("libopenblas*.so")) + list(Path(d).glob("libopenblas*.dylib"))
                   for d in lib_dirs if d and Path(d).is_dir())
    inc_dirs = ["/usr/include", "/usr/local/include", "/usr/include/openblas",
                "/usr/include/x86_64-linux-gnu/openblas/include", "/opt/homebrew/opt/openblas/include"]
    have_header = any((Path(d) / "cblas.h").exists() for d in inc_dirs)
    return have_lib and have_header


def backends_from_env() -> list[str]:
    """The backends to build: $GGMLPY_BACKENDS, else DEFAULT_BACKENDS (whose "blas" is optional)."""
    text = os.environ.get("GGMLPY_BACKENDS", "").strip()
    return parse_backends(text) if text else parse_backends(DEFAULT_BACKENDS, optional=("blas",))


def parse_backends(text: str, optional: tuple[str, ...] = ()) -> list[str]:
    """The backends named in ``text`` (comma-separated), in build order. A backend in ``optional`` whose
    library is missing is left out with a message; one asked for by name is an error instead."""
    names = [b.strip().lower() for b in text.split(",") if b.strip()]
    if "blas" in names and not openblas_found():
        if "blas" in optional:
            log(f"OpenBLAS was not found: building without the BLAS backend (the CPU backend's own "
                f"matrix kernels are 2-4x slower for training). To get it: {BLAS_HINT}, then reinstall; "
                f"GGMLPY_BACKENDS=cpu silences this message.")
            names.remove("blas")
        else:
            raise BuildError(f"the BLAS backend needs OpenBLAS (library and cblas.h): {BLAS_HINT}; "
                             f"or leave 'blas' out of GGMLPY_BACKENDS")
    unknown = [b for b in names if b not in KNOWN_BACKENDS]
    if unknown:
        raise BuildError(f"unknown backend(s) {unknown}; expected a comma-separated subset of "
                         f"{', '.join(KNOWN_BACKENDS)}")
    if "cpu" not in names:
        names.insert(0, "cpu")  # the scheduler always needs a CPU backend last
    return sorted(set(names), key=KNOWN_BACKENDS.index)
