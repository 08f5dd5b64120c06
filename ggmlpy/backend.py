"""Backends, devices, the registry and buffers (ggml-backend.h).

Devices are owned by ggml's registry (never freed); a ``Backend`` owns one
``ggml_backend_t``; a ``Buffer`` owns one ``ggml_backend_buffer_t`` and keeps the
backend that made it alive.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

from ._ffi import BUILD_INFO, ffi, lib
from ._handle import Handle, free_handle, unwrap
from .errors import BackendUnavailableError, GgmlStateError, expect

DEVICE_TYPES = {
    lib.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    lib.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
}


def _str(c_str: Any) -> str:
    return ffi.string(c_str).decode("utf-8", "replace") if c_str != ffi.NULL else ""


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_n_threads = [_default_threads()]
_cpu_backends: "weakref.WeakSet[Backend]" = weakref.WeakSet()


# ---------------------------------------------------------------- devices and registry

@dataclass(frozen=True)
class Device:
    """A device known to ggml's registry (CPU, Vulkan0, CUDA0, RPC0, ...)."""
    ptr: Any

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_dev_name(self.ptr))

    @property
    def description(self) -> str:
        return _str(lib.ggml_backend_dev_description(self.ptr))

    @property
    def type(self) -> str:
        return DEVICE_TYPES.get(lib.ggml_backend_dev_type(self.ptr), "other")

    @property
    def backend_name(self) -> str:
        """Name of the registry (backend family) this device belongs to: CPU, Vulkan, CUDA, RPC."""
        return _str(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(self.ptr)))

    def memory(self) -> dict:
        free, total = ffi.new("size_t *"), ffi.new("size_t *")
        lib.ggml_backend_dev_memory(self.ptr, free, total)
        return {"free": int(free[0]), "total": int(total[0])}

    def __repr__(self) -> str:
        return f"<Device {self.name}: {self.description} ({self.type})>"


def ggml_backend_dev_count() -> int:
    return int(lib.ggml_backend_dev_count())


def ggml_backend_dev_get(index: int) -> Device:
    n = ggml_backend_dev_count()
    expect(isinstance(index, int) and 0 <= index < n,
           f"ggml_backend_dev_get: index must be an int in [0, {n}), got {index!r}")
    return Device(lib.ggml_backend_dev_get(index))


def ggml_backend_dev_by_name(name: str) -> Device | None:
    ptr = lib.ggml_backend_dev_by_name(str(name).encode())
    return Device(ptr) if ptr != ffi.NULL else None


def ggml_backend_dev_name(device: Device) -> str:
    return _as_device(device).name


def ggml_backend_dev_description(device: Device) -> str:
    return _as_device(device).description


def ggml_backend_dev_type(device: Device) -> str:
    return _as_device(device).type


def ggml_backend_dev_memory(device: Device) -> dict:
    return _as_device(device).memory()


def ggml_backend_reg_count() -> int:
    return int(lib.ggml_backend_reg_count())


def ggml_backend_reg_names() -> list[str]:
    return [_str(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))) for i in range(ggml_backend_reg_count())]


def ggml_backend_devices() -> list[Device]:
    return [Device(lib.ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]


def ggml_list_devices():
    """A pandas DataFrame with one row per device: name, description, type, backend, memory."""
    import pandas as pd
    rows = []
    for d in ggml_backend_devices():
        mem = d.memory()
        rows.append({"name": d.name, "description": d.description, "type": d.type,
                     "backend": d.backend_name, "memory_free": mem["free"], "memory_total": mem["total"]})
    return pd.DataFrame(rows, columns=["name", "description", "type", "backend", "memory_free", "memory_total"])


def ggml_backends_built() -> list[str]:
    """Backends compiled into this installation (``GGMLPY_BACKENDS`` at build time)."""
    return list(BUILD_INFO.get("backends", ["cpu"]))


def _as_device(device: Any) -> Device:
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        found = ggml_backend_dev_by_name(device)
        if found is None:
            raise BackendUnavailableError(f"no device named {device!r}; devices: {[d.name for d in ggml_backend_devices()]}")
        return found
    from ._handle import raise_type
    raise_type("device", "Device or device name", device)


# ---------------------------------------------------------------- backends

class Backend(Handle):
    kind = "backend"

    def __init__(self, ptr: Any) -> None:
        super().__init__(ptr, lib.ggml_backend_free)
        self.device = Device(lib.ggml_backend_get_device(ptr))
        self.is_cpu = self.device.type == "cpu"
        if self.is_cpu:
            lib.ggmlpy_cpu_set_n_threads(ptr, _n_threads[0])
            _cpu_backends.add(self)

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_name(self.ptr))

    def _describe(self) -> str:
        return f" {self.device.name}" if self._ptr is not None else ""


_BUILD_HINTS = {  # the backend was not built
    "vulkan": "rebuild with GGMLPY_BACKENDS=cpu,vulkan pip install . (needs glslc, libvulkan-dev, spirv-headers)",
    "cuda": "rebuild with GGMLPY_BACKENDS=cpu,cuda pip install . on a machine with nvcc",
    "rpc": "rebuild with GGMLPY_BACKENDS=cpu,rpc pip install .",
}
_DEVICE_HINTS = {  # built, but no such device
    "vulkan": "check the Vulkan driver (vulkaninfo); a CPU-only Vulkan device (Mesa's lavapipe) is used "
              "only when selected with GGML_VK_VISIBLE_DEVICES=0",
    "cuda": "check the NVIDIA driver (nvidia-smi) and CUDA_VISIBLE_DEVICES; ggml logs why CUDA did not start",
    "rpc": "add a server first with ggml_backend_rpc_add_server('host:port')",
}


def _init_device(device_name: str, family: str, params: str | None = None) -> Backend:
    dev = lib.ggml_backend_dev_by_name(device_name.encode())
    if dev == ffi.NULL:
        built = family.lower() in ggml_backends_built()
        reason = (f"the {family} backend is built but has no device {device_name!r}" if built else
                  f"this ggmlpy was built without the {family} backend")
        hint = (_DEVICE_HINTS if built else _BUILD_HINTS).get(family.lower(), "")
        devices = [d.name for d in ggml_backend_devices()]
        raise BackendUnavailableError(f"{reason} (devices: {devices}); {hint}".rstrip("; "))
    ptr = lib.ggml_backend_dev_init(dev, params.encode() if params else ffi.NULL)
    if ptr == ffi.NULL:
        raise BackendUnavailableError(f"ggml could not initialise device {device_name!r}")
    return Backend(ptr)


def ggml_backend_cpu_init() -> Backend:
    return _init_device("CPU", "cpu")


def ggml_vulkan_init(device: int = 0) -> Backend:
    expect(isinstance(device, int) and device >= 0, f"ggml_vulkan_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"Vulkan{device}", "Vulkan")


def ggml_backend_cuda_init(device: int = 0) -> Backend:
    expect(isinstance(device, int) and device >= 0, f"ggml_backend_cuda_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"CUDA{device}", "CUDA")


def ggml_backend_init_by_name(name: str, params: str | None = None) -> Backend:
    expect(isinstance(name, str) and name, f"ggml_backend_init_by_name: name must be a device name, got {name!r}")
    family = "".join(c for c in name if not c.isdigit()) or name
    return _init_device(name, family, params)


def ggml_backend_dev_init(device: Device, params: str | None = None) -> Backend:
    d = _as_device(device)
    return _init_device(d.name, d.backend_name, params)


def ggml_backend_init_best() -> Backend:
    return Backend(lib.ggml_backend_init_best())


def is_software_device(dev: Device) -> bool:
    """A GPU API emulated on the CPU (Mesa's lavapipe/llvmpipe): slower than the CPU backend, so "auto"
    skips it (ask for it by name or with "vulkan")."""
    return "llvmpipe" in dev.description.lower() or "lavapipe" in dev.description.lower()


def ggml_backend_init_auto(backend: str = "auto") -> Backend:
    """``"auto"`` = the first hardware GPU (CUDA before Vulkan, as ggml ranks them), else the CPU;
    ``"cpu"``, ``"vulkan"``, ``"cuda"`` or a device name (``"Vulkan0"``) ask for that one."""
    expect(isinstance(backend, str), f"backend must be a string, got {backend!r}")
    choice = backend.lower()
    if choice == "auto":
        for dev in ggml_backend_devices():
            if dev.type == "gpu" and not is_software_device(dev):
                return ggml_backend_dev_init(dev)
        return ggml_backend_cpu_init()
    if choice == "cpu":
        return ggml_backend_cpu_init()
    if choice == "vulkan":
        return ggml_vulkan_init(0)
    if choice == "cuda":
        return ggml_backend_cuda_init(0)
    return ggml_backend_init_by_name(backend)


def ggml_backend_free(backend: Backend) -> None:
    free_handle(backend, Backend, "ggml_backend_free(backend)")


def ggml_backend_name(backend: Backend) -> str:
    unwrap(backend, Backend, "ggml_backend_name(backend)")
    return backend.name


def ggml_backend_get_device(backend: Backend) -> Device:
    unwrap(backend, Backend, "ggml_backend_get_device(backend)")
    return backend.device


def ggml_backend_is_cpu(backend: Backend) -> bool:
    unwrap(backend, Backend, "ggml_backend_is_cpu(backend)")
    return backend.is_cpu


def ggml_backend_synchronize(backend: Backend) -> None:
    lib.ggml_backend_synchronize(unwrap(backend, Backend, "ggml_backend_synchronize(backend)"))


def ggml_backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    ptr = unwrap(backend, Backend, "ggml_backend_cpu_set_n_threads(backend)")
    expect(isinstance(n_threads, int) and n_threads >= 1,
           f"n_threads must be an int >= 1, got {n_threads!r}")
    expect(backend.is_cpu, f"ggml_backend_cpu_set_n_threads: {backend.name} is not a CPU backend", GgmlStateError)
    lib.ggmlpy_cpu_set_n_threads(ptr, n_threads)


def ggml_set_n_threads(n_threads: int) -> None:
    """Thread count for every CPU backend, those alive now and those created later."""
    expect(isinstance(n_threads, int) and n_threads >= 1, f"n_threads must be an int >= 1, got {n_threads!r}")
    _n_threads[0] = n_threads
    for b in list(_cpu_backends):
        if b.alive:
            lib.ggmlpy_cpu_set_n_threads(b.ptr, n_threads)


def ggml_get_n_threads() -> int:
    return _n_threads[0]


# ---------------------------------------------------------------- buffers

class Buffer(Handle):
    kind = "backend buffer"

    def __init__(self, ptr: Any, ctx: Any = None, backend: Backend | None = None) -> None:
        super().__init__(ptr, lib.ggml_backend_buffer_free, parents=[backend] if backend else [])
        self._ctx_ref = weakref.ref(ctx) if ctx is not None else None

    def _before_free(self) -> None:
        # Detach the context's tensors from the memory about to go, so later data transfers
        # raise "no buffer" instead of writing into freed memory.
        ctx = self._ctx_ref() if self._ctx_ref else None
        if ctx is not None and ctx.alive:
            ctx._detach_buffer(self._ptr)

    @property
    def size(self) -> int:
        return int(lib.ggml_backend_buffer_get_size(self.ptr))

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_buffer_name(self.ptr))


def ggml_backend_buffer_free(buffer: Buffer) -> None:
    free_handle(buffer, Buffer, "ggml_backend_buffer_free(buffer)")


def ggml_backend_buffer_get_size(buffer: Buffer) -> int:
    unwrap(buffer, Buffer, "ggml_backend_buffer_get_size(buffer)")
    return buffer.size


def ggml_backend_buffer_name(buffer: Buffer) -> str:
    unwrap(buffer, Buffer, "ggml_backend_buffer_name(buffer)")
    return buffer.name


def ggml_backend_buffer_clear(buffer: Buffer, value: int = 0) -> None:
    ptr = unwrap(buffer, Buffer, "ggml_backend_buffer_clear(buffer)")
    expect(isinstance(value, int) and 0 <= value <= 255, f"value must be a byte in [0, 255], got {value!r}")
    lib.ggml_backend_buffer_clear(ptr, value)


def ggml_backend_alloc_ctx_tensors(ctx, backend: Backend) -> Buffer | None:
    """Allocate every tensor of a ``no_alloc`` context on ``backend``; None if there was nothing to allocate."""
    from .context import Context
    ctx_ptr = unwrap(ctx, Context, "ggml_backend_alloc_ctx_tensors(ctx)")
    b_ptr = unwrap(backend, Backend, "ggml_backend_alloc_ctx_tensors(backend)")
    expect(ctx.no_alloc, "ggml_backend_alloc_ctx_tensors: the context must be created with no_alloc=True "
                         "(its tensors already have memory)", GgmlStateError)
    ptr = lib.ggml_backend_alloc_ctx_tensors(ctx_ptr, b_ptr)
    if ptr == ffi.NULL:
        if any(t.data == ffi.NULL and t.view_src == ffi.NULL for t in ctx._iter_tensor_ptrs()):
            raise GgmlStateError(f"could not allocate the context's tensors on {backend.name} (out of memory?)")
        return None
    buffer = Buffer(ptr, ctx=ctx, backend=backend)
    ctx._buffers.append(buffer)  # the tensors need it: it lives until freed explicitly or with the context
    return buffer
