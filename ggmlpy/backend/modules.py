"""The backend modules of ggmlpy's library folder that were built but give no device, and why.

Importing ggmlpy loads every ``libggml-<backend>.so`` module of its library folder with ggml's
``ggml_backend_load_all_from_path``, which in a Release build drops a module it cannot use without a word:
a CUDA module whose cuBLAS is not on the library path, a Vulkan module without the Vulkan loader, a CPU
variant built for instructions this CPU lacks (its score is 0), a Vulkan module that finds no driver. This
module finds, for every backend named in ``build_info.json``, what became of it: when the family is not in
ggml's registry, it loads each of its module files once more with ``dlopen`` (exactly as ggml's own loader
did: the module's constructors run and it is closed again; ``ggml_backend_init``, the call that would
register it, is never made) to learn the system's error, which names the missing library; when the family
is registered with no device, it says so. Each finding is one ``ModuleProblem``, with a message that names
the module, the reason and the usual fix; ``device``, ``backend`` and ``registry`` surface them.
"""
from __future__ import annotations

import _ctypes  # dlopen, dlsym, dlclose: ctypes' own, raising OSError with the system's message
import ctypes
import inspect
import os
import re
import threading
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from .._ffi import BUILD_INFO, ffi, lib, LIB_DIR
from ..errors import GgmlpyWarning


# ggml's registry names of the families ggmlpy builds (ggml_backend_reg_by_name ignores case)
FAMILY_NAMES = {"cpu": "CPU", "blas": "BLAS", "vulkan": "Vulkan", "cuda": "CUDA", "rpc": "RPC"}
# families whose devices are GPUs: "auto" would have taken one
GPU_FAMILIES = ("cuda", "vulkan", "hip", "musa", "sycl", "opencl", "metal")
# families that have no device until the user adds one (an RPC server)
DEVICES_ADDED_LATER = ("rpc",)
LOAD_FAILURES = ("missing", "load", "unsupported", "init")  # the stages at which a module gave no registry

# what `pip install .` builds (tools/ggml_build/options.py's DEFAULT_BACKENDS; tests/project keeps them equal):
# a rebuild hint names these too, so that following it keeps OpenBLAS's speed on the CPU
DEFAULT_BUILD = ("cpu", "blas")


def rebuild_hint(*families: str) -> str:
    """The command that rebuilds ggmlpy with ``families`` besides the default ones."""
    return "GGMLPY_BACKENDS=" + ",".join((*DEFAULT_BUILD, *families)) + " pip install ."


DEVICE_HINTS = {  # built and loaded, but no such device
    "vulkan": "check the Vulkan driver (vulkaninfo); a CPU-only Vulkan device (Mesa's lavapipe) is used "
              "only when selected with GGML_VK_VISIBLE_DEVICES=0",
    "cuda": "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES; ggml logs why CUDA did not start",
    "rpc": "add a server first with ggml_backend_rpc_add_server('host:port')",
}

_LIBRARY_PATH = "on LD_LIBRARY_PATH before starting Python (the dynamic loader reads it only at start)"


@dataclass(frozen=True)
class ModuleProblem:
    """A backend that was built but offers no device: its module, the stage at which it stopped, and why.

    ``stage`` is ``"missing"`` (no module file), ``"load"`` (dlopen failed: ``error`` is the system's
    message, ``missing_library`` the library it could not find), ``"unsupported"`` (the module's
    ``ggml_backend_score`` is 0 on this machine), ``"init"`` (it loads, but ggml did not register it) or
    ``"no device"`` (registered, with no device). ``message`` says all of it with the usual fix.
    """
    backend: str
    module: str
    path: str
    stage: str
    error: str
    missing_library: str | None
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


def family_name(family: str) -> str:
    return FAMILY_NAMES.get(family.lower(), family)


def module_files(family: str, folder: Path = LIB_DIR) -> list[Path]:
    """The module files of a family in ``folder``, as ggml looks for them: ``libggml-<family>.so`` and
    its variants ``libggml-<family>-<variant>.so``."""
    try:
        names = sorted(p.name for p in folder.iterdir())
    except OSError:
        return []
    return [folder / n for n in names if n == f"libggml-{family}.so"
            or (n.startswith(f"libggml-{family}-") and n.endswith(".so"))]


def missing_library(error: str, path: str) -> str | None:
    """The library a dlopen error says it could not find (not the module itself), or None."""
    m = re.match(r"\s*(\S+?): cannot open shared object file", error)
    if m is None or os.path.basename(m.group(1)) == os.path.basename(path):
        return None
    return m.group(1)


def library_fix(library: str | None) -> str:
    """The usual fix when ``library`` (a soname such as ``libcublas.so.13``) cannot be found."""
    if library is None:
        return ("the module does not fit the libraries of this machine (built elsewhere, or against other "
                "versions): reinstall ggmlpy here (pip install .)")
    major = library.rsplit(".so.", 1)[-1].split(".")[0] if ".so." in library else ""
    suffix = "" if major in ("", "13") else f"-cu{major}"
    if library.startswith(("libcublas", "libcublasLt")):
        return (f"cuBLAS is missing: pip install nvidia-cublas{suffix} in the environment ggmlpy was built in, "
                f"or put the folder holding {library} (the CUDA toolkit's lib64) {_LIBRARY_PATH}")
    if library.startswith("libcudart"):
        return (f"the CUDA runtime is missing: pip install nvidia-cuda-runtime{suffix} in the environment ggmlpy "
                f"was built in, or put the folder holding {library} (the CUDA toolkit's lib64) {_LIBRARY_PATH}")
    if library.startswith("libcuda.so"):
        return f"{library} comes with the NVIDIA driver: install the driver (nvidia-smi should then list the GPU)"
    if library.startswith("libvulkan"):
        return (f"the Vulkan loader is missing: install it (apt-get install libvulkan1), or put the folder "
                f"holding {library} {_LIBRARY_PATH}")
    if library.startswith(("libopenblas", "libgomp")):
        return (f"OpenBLAS is missing: apt-get install libopenblas0-openmp, or put the folder holding {library} "
                f"{_LIBRARY_PATH}")
    return f"install the package that provides {library}, or put the folder holding it {_LIBRARY_PATH}"


def _init_fix(family: str) -> str:
    if family == "vulkan":
        visible = os.environ.get("GGML_VK_VISIBLE_DEVICES")
        named = (f", or GGML_VK_VISIBLE_DEVICES={visible} names a device that does not exist"
                 if visible is not None else "")
        return (f"no Vulkan driver (ICD) was found{named}; vulkaninfo --summary lists the devices "
                "(mesa-vulkan-drivers gives lavapipe, a CPU Vulkan device)")
    if family == "cuda":
        return "ggml logs why CUDA did not start (the ggmlpy.ggml logger); nvidia-smi should list the GPU"
    return "reinstall ggmlpy (pip install .)"


def probe_module(path: Path) -> tuple[str, str]:
    """Load a module file that ggml did not register once more, to learn why: (stage, error).

    The stage is ``"load"`` (error: dlopen's message), ``"unsupported"`` (its ggml_backend_score is 0),
    or ``"init"``. The module is closed again; its ``ggml_backend_init`` is never called, so nothing is
    registered or left initialised: this is the load and score that ggml's loader itself made.
    """
    try:
        handle = _ctypes.dlopen(str(path), os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return "load", str(exc)
    try:
        try:
            score = ctypes.CFUNCTYPE(ctypes.c_int)(_ctypes.dlsym(handle, "ggml_backend_score"))
        except OSError:  # a module without variants has no score
            score = None
        if score is not None and score() == 0:
            return "unsupported", "ggml_backend_score() is 0"
        try:
            _ctypes.dlsym(handle, "ggml_backend_init")
        except OSError:
            return "init", "the library has no ggml_backend_init: it is not a ggml backend module"
        return "init", "ggml_backend_init returned no backend, or one of another ggml version"
    finally:
        _ctypes.dlclose(handle)


def _message(family: str, module: str, path: str, stage: str, error: str, library: str | None) -> str:
    name = family_name(family)
    if stage == "missing":
        return (f"the {name} backend was built, but its module {module} is not in {LIB_DIR}: reinstall ggmlpy "
                "(pip install .)")
    if stage == "load":
        return f"the {name} backend module {module} ({path}) cannot be loaded: {error}; {library_fix(library)}"
    if stage == "unsupported":
        return (f"the {name} backend module {module} does not run on this machine (its ggml_backend_score is 0: "
                "a variant built for what this machine lacks, such as the CPU's instruction sets); reinstall ggmlpy "
                "on this machine (pip install .)")
    if stage == "init":
        return f"the {name} backend module {module} loads but did not start ({error}): {_init_fix(family)}"
    hint = DEVICE_HINTS.get(family, "")
    return f"the {name} backend module {module} loaded but found no device" + (f"; {hint}" if hint else "")


_lock = threading.Lock()
_probed: dict[str, tuple[str, str]] = {}
_warned: set[str] = set()


def _probe_cached(path: Path) -> tuple[str, str]:
    with _lock:
        key = str(path)
        if key not in _probed:
            _probed[key] = probe_module(path)
        return _probed[key]


def module_problems() -> list[ModuleProblem]:
    """Every backend named in build_info.json that offers no device now, one ModuleProblem per module file
    (the families that have no device until one is added, RPC, excepted)."""
    problems = []
    for family in BUILD_INFO.get("backends", ["cpu"]):
        family = str(family).lower()
        reg = lib.ggml_backend_reg_by_name(family.encode())
        if reg != ffi.NULL and (int(lib.ggml_backend_reg_dev_count(reg)) > 0 or family in DEVICES_ADDED_LATER):
            continue
        files = module_files(family)
        if reg != ffi.NULL:
            loaded = next((p for p in files if p.name == f"libggml-{family}.so"), files[0] if files else None)
            module = loaded.name if loaded is not None else f"libggml-{family}.so"
            path = str(loaded) if loaded is not None else ""
            problems.append(ModuleProblem(family, module, path, "no device", "", None,
                                          _message(family, module, path, "no device", "", None)))
            continue
        if not files:
            module = f"libggml-{family}.so"
            problems.append(ModuleProblem(family, module, str(LIB_DIR / module), "missing", "", None,
                                          _message(family, module, "", "missing", "", None)))
            continue
        for file in files:
            stage, error = _probe_cached(file)
            library = missing_library(error, str(file)) if stage == "load" else None
            problems.append(ModuleProblem(family, file.name, str(file), stage, error, library,
                                          _message(family, file.name, str(file), stage, error, library)))
    return problems


def family_problem(family: str) -> str | None:
    """The messages of what became of a family's modules (``"vulkan"``, ``"CUDA"``), joined; None when the
    family is not built or has devices."""
    found = [p.message for p in module_problems() if p.backend == family.lower()]
    return "; ".join(found) if found else None


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside ggmlpy, so that a warning points at the caller's line."""
    package = str(Path(__file__).resolve().parent.parent) + os.sep
    here = inspect.currentframe()  # None only on Pythons without frames
    frame, level = (here.f_back if here is not None else None), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def warn_problems(problems: list[ModuleProblem], context: str, once: bool = False) -> None:
    """Warn (GgmlpyWarning) with each problem's message after ``context``; with ``once``, each at most once
    per process."""
    for p in problems:
        if once:
            with _lock:
                if p.path in _warned:
                    continue
                _warned.add(p.path)
        warnings.warn(f"{context}{p.message}", GgmlpyWarning, stacklevel=_user_stacklevel())


def warn_gpu_fallback(what: str) -> None:
    """Called when ``what`` (e.g. ``'backend="auto"'``) falls back to the CPU: warn once about each GPU module
    that was built but did not load (a GPU family that loaded and found no device is the ordinary machine
    without that GPU, and is not warned about)."""
    failed = [p for p in module_problems() if p.backend in GPU_FAMILIES and p.stage in LOAD_FAILURES]
    warn_problems(failed, f"{what} uses the CPU; a GPU backend that was built did not load: ", once=True)
