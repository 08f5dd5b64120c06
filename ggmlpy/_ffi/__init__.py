"""Entry point to the compiled bindings: ``ffi``, ``lib``, and the package's library folder.

Importing this module loads every backend module that was built (``ggmlpy/lib/``) into
ggml's registry and routes ggml's log (and the message of a fatal assertion) to the
``ggmlpy.ggml`` logger.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Protocol


# ggml prints a backtrace with gdb before aborting; that is slow and never useful to a Python user.
os.environ.setdefault("GGML_NO_BACKTRACE", "1")
# ggml's CPU backend runs on OpenMP, whose threads by default spin for a long time at every barrier:
# on a machine whose cores are shared (CI runners, laptops busy with a data pipeline) a 2-thread run
# was up to 50x slower than a 1-thread one. A short spin keeps quiet-machine speed (measured equal)
# and sleeps instead of fighting for the cores. Users who set either variable keep their choice.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = "10000"
# ggml's Vulkan backend computes F32 matrix products with F16 operands where the device has F16 arithmetic
# (products of more than 8 columns): a float32 model then predicts 5e-4 off its CPU twin and every training
# step differs by as much. Float32 models get float32 products, as on the CPU (and as PyTorch defaults to);
# GGMLPY_VULKAN_F16=1 gives ggml's faster F16 products back. The variable is read when a device starts.
if "GGML_VK_DISABLE_F16" not in os.environ and os.environ.get("GGMLPY_VULKAN_F16") != "1":
    os.environ["GGML_VK_DISABLE_F16"] = "1"
# ggml's CUDA backend computes F32 products in full F32 unless GGML_CUDA_TF32 allows TF32 tensor cores
# (patches/0039: ggml itself turns TF32 on); GGMLPY_CUDA_TF32=1 is ggmlpy's name for that switch.
if "GGML_CUDA_TF32" not in os.environ and os.environ.get("GGMLPY_CUDA_TF32") not in (None, "", "0"):
    os.environ["GGML_CUDA_TF32"] = "1"


def _vulkan_validation(folder: str) -> None:
    """GGMLPY_VK_VALIDATION=<folder>: Vulkan runs under the Khronos validation layer (Debian's
    vulkan-validationlayers), each process writing what the layer reports to <folder>/vvl-<pid>.log (one file a
    process: the layer truncates its log when it opens it). GGMLPY_VK_VALIDATION_SYNC=1 adds synchronization
    validation. Read when ggmlpy is imported, before ggml creates its Vulkan instance."""
    os.makedirs(folder, exist_ok=True)
    settings = os.path.join(folder, f"vk_layer_settings-{os.getpid()}.txt")
    lines = ["khronos_validation.debug_action = VK_DBG_LAYER_ACTION_LOG_MSG",
             f"khronos_validation.log_filename = {os.path.join(folder, f'vvl-{os.getpid()}.log')}",
             "khronos_validation.report_flags = error,warn"]
    if os.environ.get("GGMLPY_VK_VALIDATION_SYNC") == "1":
        lines.append("khronos_validation.enables = VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT")
    with open(settings, "w") as f:
        f.write("\n".join(lines) + "\n")
    layers = [x for x in os.environ.get("VK_INSTANCE_LAYERS", "").split(":") if x]
    os.environ["VK_INSTANCE_LAYERS"] = ":".join(dict.fromkeys(layers + ["VK_LAYER_KHRONOS_validation"]))
    os.environ["VK_LAYER_SETTINGS_PATH"] = settings


if os.environ.get("GGMLPY_VK_VALIDATION"):
    _vulkan_validation(os.environ["GGMLPY_VK_VALIDATION"])

try:
    from ._ggml import ffi, lib  # noqa: E402
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "ggmlpy's compiled bindings are missing or cannot load ggml "
        f"({exc}). Install with 'pip install .' (or run 'python build_ggml.py' and "
        "'python ggmlpy/_ffi/build.py' in a source checkout).") from exc



class CData(Protocol):
    """What annotations call a C object that cffi hands out (cffi's ``FFI.CData``): a pointer, array or struct of
    ggml's headers (``decl/*.h``). The type checker does not read the C declarations: a struct's fields
    (``tensor.ne``) and an array's elements are untyped."""

    def __getattr__(self, name: str) -> Any: ...
    def __setattr__(self, name: str, value: object) -> None: ...
    def __getitem__(self, index: int) -> Any: ...


LIB_DIR = Path(__file__).resolve().parent.parent / "lib"
BUILD_INFO: dict = json.loads((LIB_DIR / "build_info.json").read_text()) \
    if (LIB_DIR / "build_info.json").exists() else {"backends": ["cpu"]}

ggml_logger = logging.getLogger("ggmlpy.ggml")
_LEVELS = {
    lib.GGML_LOG_LEVEL_DEBUG: logging.DEBUG,
    lib.GGML_LOG_LEVEL_INFO: logging.INFO,
    lib.GGML_LOG_LEVEL_WARN: logging.WARNING,
    lib.GGML_LOG_LEVEL_ERROR: logging.ERROR,
}
_pending: list[str] = []
_pending_level = [logging.INFO]


@ffi.def_extern()
def _ggmlpy_log_cb(level, text, user_data):  # noqa: ARG001 - C signature
    # ggml logs partial lines (CONT continues the previous one): join until a newline.
    try:
        if level != lib.GGML_LOG_LEVEL_CONT:
            _pending_level[0] = _LEVELS.get(level, logging.INFO)
        _pending.append(ffi.string(text).decode("utf-8", "replace"))
        if _pending[-1].endswith("\n"):
            message = "".join(_pending).rstrip("\n")
            _pending.clear()
            ggml_logger.log(_pending_level[0], "%s", message)
    except Exception:  # never raise into C
        pass


@ffi.def_extern()
def _ggmlpy_abort_cb(message):
    # Called just before ggml aborts the process: leave the reason where Python users look.
    try:
        text = ffi.string(message).decode("utf-8", "replace")
        ggml_logger.critical("ggml is aborting the process: %s", text)
        for handler in logging.getLogger().handlers + ggml_logger.handlers:
            handler.flush()
    except Exception:
        pass


lib.ggml_log_set(lib._ggmlpy_log_cb, ffi.NULL)
lib.ggml_set_abort_callback(lib._ggmlpy_abort_cb)
lib.ggml_backend_load_all_from_path(str(LIB_DIR).encode())
