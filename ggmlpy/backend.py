"""Backends, devices, the registry and buffers (ggml-backend.h).

Devices are owned by ggml's registry (never freed); a ``Backend`` owns one
``ggml_backend_t``; a ``Buffer`` owns one ``ggml_backend_buffer_t`` and keeps the
backend that made it alive.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._ffi import BUILD_INFO, ffi, lib
from ._handle import Handle, free_handle, unwrap, using
from .errors import BackendUnavailableError, GgmlStateError, expect

if TYPE_CHECKING:
    from .opt import StepWork

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
_threads_set_by_user = [False]
# Below this much work per compute, one thread is faster: the thread pool's barrier after every node
# costs more than it saves (measured on this project's 2 shared cores, the model layer's training step of
# an MLP: 0.7 MFLOP 0.41 ms on one thread vs 12.4 ms on two, 32 MFLOP 2.1 vs 14.9 ms, 230 MFLOP
# 20 vs 30 ms, with the other core busy). The model layer applies it per graph unless the user chose a
# count with ggml_set_n_threads.
SMALL_GRAPH_FLOPS = 50e6
# ggml's BLAS backend (OpenBLAS) takes the F32 matrix products (MUL_MAT, OUT_PROD) of a scheduler that runs
# on the CPU; the CPU backend does the rest. The two thread pools never compute at once, so the thread count
# is the budget of each, given per training graph (split_threads) by what each pool would do with it.
# Measured on this project's 2 shared cores, the median of alternated runs (CPU pool, OpenBLAS threads):
#   MNIST-FC (1.2 GFLOP of products, 2.7 M pool elements per step): (1, 2) 47.5k samples/s, (2, 2) 42k,
#     (2, 1) 38k, (1, 1) 36.5k;
#   the small CNN (0.17 GFLOP of thin products, 28 M pool elements: im2col, pooling and their backward):
#     (2, 1) 5.3k, (2, 2) 4.8k, (1, 2) 3.8k, (1, 1) 3.8k;
#   MLP 4096-4096-4096-10, batch 256 (43 GFLOP, 147 M pool elements, mostly AdamW over 34 M weights):
#     (2, 2) 104 GFLOP/s, (1, 2) 94; MLP 1024 wide, batch 256 (11.5 M pool elements): (1, 2) 81, (2, 2) 75;
#     MLP 256 wide, batch 256 (150 product flops per pool element): (1, 2) 71, (1, 1) 54;
#   the example's char transformer (1.5 GFLOP of products, 42 M pool elements: 35 flops per element):
#     (2, 1) 31k tokens/s, (2, 2) 28k, (1, 1) 28k, (1, 2) 26k.
# OpenBLAS's idle worker spins (sched_yield) for a while after each product, beside ggml's pool: a second
# OpenBLAS thread pays only where the products outweigh the pool's work, and ggml's pool needs a lot of
# its own work before its barrier after every node is worth a second thread. (Before patch 0010, OUT_PROD
# ignored the backend's count altogether.)
BLAS_PARALLEL_FLOPS = SMALL_GRAPH_FLOPS  # OpenBLAS's products per step, at least
BLAS_FLOPS_PER_POOL_ELEMENT = 75.0  # ... and at least this many product flops per element op of the pool
POOL_PARALLEL_ELEMENTS = 20e6  # ggml's pool next to OpenBLAS: element ops per step for a second thread
_blas_disabled = [False]
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
    """The number of devices ggml knows: the CPU, each GPU of the built backends, added RPC devices.

    Value: an int (at least 1: the CPU).

    Example:
        >>> [ggml_backend_dev_name(ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]
        ['CPU']
    """
    return int(lib.ggml_backend_dev_count())


def ggml_backend_dev_get(index: int) -> Device:
    """Device number ``index`` of ggml's registry.

    Arguments:
        index: an int in ``[0, ggml_backend_dev_count())`` (else GgmlValueError).

    Value: a Device (owned by ggml's registry: never freed).

    Example:
        >>> dev = ggml_backend_dev_get(0)
    """
    n = ggml_backend_dev_count()
    expect(isinstance(index, int) and 0 <= index < n,
           f"ggml_backend_dev_get: index must be an int in [0, {n}), got {index!r}")
    return Device(lib.ggml_backend_dev_get(index))


def ggml_backend_dev_by_name(name: str) -> Device | None:
    """The device called ``name`` (``"CPU"``, ``"Vulkan0"``, ``"CUDA0"``, ``"RPC0"``, ...), or None.

    Arguments:
        name: the device name, as ``ggml_backend_dev_name`` gives it.

    Value: a Device, or None when there is no such device.

    Example:
        >>> ggml_backend_dev_by_name("Vulkan0") is not None
    """
    from .context import c_string
    ptr = lib.ggml_backend_dev_by_name(c_string("ggml_backend_dev_by_name", "name", name))
    return Device(ptr) if ptr != ffi.NULL else None


def ggml_backend_dev_name(device: Device) -> str:
    """The short name of a device, e.g. ``"CPU"``, ``"Vulkan0"``, ``"CUDA0"``.

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: a str.

    Example:
        >>> ggml_backend_dev_name(ggml_backend_dev_get(0))
        'CPU'
    """
    return _as_device(device).name


def ggml_backend_dev_description(device: Device) -> str:
    """A human-readable description of a device (the CPU model, the GPU's name).

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: a str.

    Example:
        >>> ggml_backend_dev_description("CPU")
    """
    return _as_device(device).description


def ggml_backend_dev_type(device: Device) -> int:
    """The kind of a device, as ggml's device-type constant (ggmlR's form).

    Compare it with ``ggml_backend_device_type_cpu()``, ``ggml_backend_device_type_gpu()``,
    ``ggml_backend_device_type_igpu()`` (integrated GPU) or ``ggml_backend_device_type_accel()``
    (an accelerator that helps the CPU, such as BLAS). The readable name (``"cpu"``, ``"gpu"``,
    ``"igpu"``, ``"accel"``) is ``device.type`` of a Device (and the ``type`` column of
    ``ggml_list_devices``).

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: an int (0 CPU, 1 GPU, 2 integrated GPU, 3 accelerator: ggml's enum ggml_backend_dev_type).

    Example:
        >>> gpus = [d.name for d in ggml_backend_devices()
        ...         if ggml_backend_dev_type(d) == ggml_backend_device_type_gpu()]
    """
    return int(lib.ggml_backend_dev_type(_as_device(device).ptr))


def ggml_backend_dev_memory(device: Device) -> dict:
    """Free and total memory of a device, in bytes (system memory for the CPU).

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: a dict ``{"free": int, "total": int}``.

    Example:
        >>> ggml_backend_dev_memory("CPU")["total"] // 2**30     # GiB
    """
    return _as_device(device).memory()


def ggml_backend_reg_count() -> int:
    """The number of backend families (registries) loaded: CPU, plus Vulkan, CUDA, RPC as built.

    Value: an int.

    Example:
        >>> ggml_backend_reg_count()
    """
    return int(lib.ggml_backend_reg_count())


def ggml_backend_reg_names() -> list[str]:
    """The names of the loaded backend families, e.g. ``['CPU', 'Vulkan']``.

    Which families can appear depends on the build (``ggml_backends_built``).

    Value: a list of str.

    Example:
        >>> "Vulkan" in ggml_backend_reg_names()
    """
    return [_str(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))) for i in range(ggml_backend_reg_count())]


def ggml_backend_devices() -> list[Device]:
    """Every device ggml knows (CPU, GPUs, added RPC devices), in ggml's registry order.

    Value: a list of Device objects (with ``.name``, ``.description``, ``.type``, ``.backend_name``,
    ``.memory()``).

    Example:
        >>> [d.name for d in ggml_backend_devices()]
        ['CPU']
    """
    return [Device(lib.ggml_backend_dev_get(i)) for i in range(ggml_backend_dev_count())]


def ggml_list_devices():
    """A table of every device ggml knows: the quick way to see what this machine offers.

    Value: a pandas DataFrame with one row per device and columns ``name``, ``description``, ``type``
    (cpu/gpu/igpu/accel), ``backend`` (the family: CPU, Vulkan, CUDA, RPC), ``memory_free`` and
    ``memory_total`` (bytes).

    Example:
        >>> print(ggml_list_devices())
    """
    import pandas as pd
    rows = []
    for d in ggml_backend_devices():
        mem = d.memory()
        rows.append({"name": d.name, "description": d.description, "type": d.type,
                     "backend": d.backend_name, "memory_free": mem["free"], "memory_total": mem["total"]})
    return pd.DataFrame(rows, columns=["name", "description", "type", "backend", "memory_free", "memory_total"])


def ggml_backends_built() -> list[str]:
    """The backends compiled into this installation, e.g. ``['cpu', 'vulkan']``.

    Chosen at build time with ``GGMLPY_BACKENDS=cpu,vulkan pip install .``; a built backend may still
    find no device on this machine (see ``ggml_list_devices``).

    Value: a list of lower-case str.

    Example:
        >>> "cuda" in ggml_backends_built()
    """
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
        self.n_threads = 0
        if self.is_cpu:
            lib.ggmlpy_cpu_set_n_threads(ptr, _n_threads[0])
            self.n_threads = _n_threads[0]
            _cpu_backends.add(self)

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_name(self.ptr))

    def _describe(self) -> str:
        return f" {self.device.name}" if self._ptr is not None else ""

    def free(self) -> None:
        # Asynchronous work queued on it (backend_async: async reads/writes/computes, recorded events) is
        # finished first: ggml would otherwise free the queue while it still points at Python memory.
        if self._ptr is not None and (self.__dict__.get("_async_pending") or self.__dict__.get("_recorded_events")):
            from .backend_async import finish_backend
            finish_backend(self)
        super().free()


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
    from .context import c_string
    dev = lib.ggml_backend_dev_by_name(c_string(f"ggml_{family.lower()}_init", "device name", device_name))
    if dev == ffi.NULL:
        built = family.lower() in ggml_backends_built()
        reason = (f"the {family} backend is built but has no device {device_name!r}" if built else
                  f"this ggmlpy was built without the {family} backend")
        hint = (_DEVICE_HINTS if built else _BUILD_HINTS).get(family.lower(), "")
        devices = [d.name for d in ggml_backend_devices()]
        raise BackendUnavailableError(f"{reason} (devices: {devices}); {hint}".rstrip("; "))
    ptr = lib.ggml_backend_dev_init(dev, c_string(f"ggml_{family.lower()}_init", "params", params) if params else ffi.NULL)
    if ptr == ffi.NULL:
        raise BackendUnavailableError(f"ggml could not initialise device {device_name!r}")
    return Backend(ptr)


def ggml_backend_cpu_init() -> Backend:
    """Start a CPU backend.

    It computes with ``ggml_get_n_threads()`` threads (change it with ``ggml_set_n_threads`` or
    ``ggml_backend_cpu_set_n_threads``). Free it with ``ggml_backend_free`` (or let it be collected).

    Value: a Backend handle (a context manager).

    Example:
        >>> cpu = ggml_backend_cpu_init()
        >>> sched = ggml_backend_sched_new([cpu])
    """
    return _init_device("CPU", "cpu")


def ggml_vulkan_init(device: int = 0) -> Backend:
    """Start the Vulkan backend on GPU number ``device``.

    Arguments:
        device: the Vulkan device index (an int >= 0, default 0: the device named ``"Vulkan0"``).

    Value: a Backend handle. Raises BackendUnavailableError, saying why and what to do, when this
    installation was built without Vulkan or the device does not exist.

    Example:
        >>> gpu = ggml_vulkan_init(0)
        >>> sched = ggml_backend_sched_new([gpu])      # the CPU is appended as fallback
    """
    expect(isinstance(device, int) and device >= 0, f"ggml_vulkan_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"Vulkan{device}", "Vulkan")


def ggml_backend_cuda_init(device: int = 0) -> Backend:
    """Start the CUDA backend on GPU number ``device``.

    Arguments:
        device: the CUDA device index (an int >= 0, default 0: the device named ``"CUDA0"``).

    Value: a Backend handle. Raises BackendUnavailableError, saying why and what to do, when this
    installation was built without CUDA or the device does not exist.

    Example:
        >>> gpu = ggml_backend_cuda_init()
    """
    expect(isinstance(device, int) and device >= 0, f"ggml_backend_cuda_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"CUDA{device}", "CUDA")


def ggml_backend_init_by_name(name: str, params: str | None = None) -> Backend:
    """Start a backend on the device called ``name``.

    Arguments:
        name: a device name: ``"CPU"``, ``"Vulkan0"``, ``"CUDA1"``, ``"RPC0"``, ... (see
            ``ggml_list_devices``).
        params: an optional, backend-specific parameter string passed to the device's init (default
            None; the built-in backends need none).

    Value: a Backend handle. Raises BackendUnavailableError when there is no such device.

    Example:
        >>> b = ggml_backend_init_by_name("Vulkan0")
    """
    expect(isinstance(name, str) and name, f"ggml_backend_init_by_name: name must be a device name, got {name!r}")
    family = "".join(c for c in name if not c.isdigit()) or name
    return _init_device(name, family, params)


def ggml_backend_dev_init(device: Device, params: str | None = None) -> Backend:
    """Start a backend on ``device``.

    Arguments:
        device: a Device or a device name.
        params: an optional, backend-specific parameter string (default None).

    Value: a Backend handle. Raises BackendUnavailableError when the device cannot be started.

    Example:
        >>> b = ggml_backend_dev_init(ggml_backend_devices()[0])
    """
    d = _as_device(device)
    return _init_device(d.name, d.backend_name, params)


def ggml_backend_init_best() -> Backend:
    """Start ggml's preferred backend: a GPU if there is one, else an integrated GPU, else the CPU.

    ``ggml_backend_init_auto("auto")`` is the variant that skips software-emulated GPUs.

    Value: a Backend handle.

    Example:
        >>> b = ggml_backend_init_best()
        >>> ggml_backend_name(b)
    """
    return Backend(lib.ggml_backend_init_best())


def is_software_device(dev: Device) -> bool:
    """A GPU API emulated on the CPU (Mesa's lavapipe/llvmpipe): slower than the CPU backend, so "auto"
    skips it (ask for it by name or with "vulkan")."""
    return "llvmpipe" in dev.description.lower() or "lavapipe" in dev.description.lower()


def ggml_backend_init_auto(backend: str = "auto") -> Backend:
    """Start a backend chosen by a short name, the way ``ggml_backend_sched_new("auto")`` does.

    Arguments:
        backend: ``"auto"`` (the default: the first local hardware GPU, CUDA before Vulkan as ggml ranks
            them, skipping CPU-emulated ones such as Mesa's lavapipe and remote RPC devices, which are used
            only when named: a server that went away aborts the process; else the CPU), ``"cpu"``, ``"vulkan"``
            (device 0), ``"cuda"`` (device 0), or a device name such as ``"Vulkan1"``.

    Value: a Backend handle. Raises BackendUnavailableError for a backend or device that is missing.

    Example:
        >>> b = ggml_backend_init_auto("auto")
    """
    expect(isinstance(backend, str), f"backend must be a string, got {backend!r}")
    choice = backend.lower()
    if choice == "auto":
        for dev in ggml_backend_devices():
            if dev.type == "gpu" and not is_software_device(dev) and dev.backend_name != "RPC":
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
    """Free a backend, and first whatever depends on it (schedulers and buffers built on it).

    Idempotent. Handles that depend on the backend raise GgmlStateError when used afterwards.

    Arguments:
        backend: a Backend.

    Value: None.

    Example:
        >>> ggml_backend_free(cpu)
    """
    free_handle(backend, Backend, "ggml_backend_free(backend)")


def ggml_backend_name(backend: Backend) -> str:
    """The name of a backend, e.g. ``"CPU"`` or ``"Vulkan0"``.

    Arguments:
        backend: a Backend.

    Value: a str.

    Example:
        >>> ggml_backend_name(ggml_backend_cpu_init())
        'CPU'
    """
    unwrap(backend, Backend, "ggml_backend_name(backend)")
    return backend.name


def ggml_backend_get_device(backend: Backend) -> Device:
    """The device a backend runs on.

    Arguments:
        backend: a Backend.

    Value: a Device.

    Example:
        >>> ggml_backend_dev_description(ggml_backend_get_device(gpu))
    """
    unwrap(backend, Backend, "ggml_backend_get_device(backend)")
    return backend.device


def ggml_backend_is_cpu(backend: Backend) -> bool:
    """Whether a backend runs on the CPU device.

    Arguments:
        backend: a Backend.

    Value: a bool.

    Example:
        >>> ggml_backend_is_cpu(ggml_backend_cpu_init())
        True
    """
    unwrap(backend, Backend, "ggml_backend_is_cpu(backend)")
    return backend.is_cpu


def ggml_backend_synchronize(backend: Backend) -> None:
    """Wait until every operation queued on a backend (computes, copies) has finished.

    Computations and transfers through ggmlpy's synchronous functions already return finished results;
    after the asynchronous ones (``ggml_backend_tensor_set_async``, ``ggml_backend_tensor_get_async``,
    ``ggml_backend_tensor_copy_async``, ``ggml_backend_graph_compute_async``) this is the call after
    which their arrays hold the data and their tensors, buffers and contexts may be freed again.

    Arguments:
        backend: a Backend.

    Value: None.

    Example:
        >>> ggml_backend_synchronize(gpu)
    """
    unwrap(backend, Backend, "ggml_backend_synchronize(backend)")
    from .backend_async import finish_backend
    finish_backend(backend)


def ggml_backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    """Set the number of threads of one CPU backend.

    ``ggml_set_n_threads`` sets it for every CPU backend at once (and for later ones).

    Arguments:
        backend: a CPU Backend (another kind raises GgmlStateError).
        n_threads: an int in [1, 512] (ggml's GGML_MAX_N_THREADS).

    Value: None.

    Example:
        >>> ggml_backend_cpu_set_n_threads(cpu, 4)
    """
    ptr = unwrap(backend, Backend, "ggml_backend_cpu_set_n_threads(backend)")
    from ._checks import n_threads_arg
    n_threads = n_threads_arg("ggml_backend_cpu_set_n_threads", n_threads)
    expect(backend.is_cpu, f"ggml_backend_cpu_set_n_threads: {backend.name} is not a CPU backend", GgmlStateError)
    lib.ggmlpy_cpu_set_n_threads(ptr, n_threads)
    backend.n_threads = n_threads


def ggml_set_n_threads(n_threads: int) -> int:
    """Set the thread count of every CPU backend: those alive now and those created later.

    The default is the number of CPUs this process may use. Scheduler CPU fallbacks and the CPU
    backend of ``ggml_graph_compute`` follow it too.

    Arguments:
        n_threads: an int in [1, 512] (ggml's GGML_MAX_N_THREADS; else GgmlValueError).

    Value: the thread count set, an int (as in ggmlR).

    Example:
        >>> ggml_set_n_threads(8)
        8
    """
    from ._checks import n_threads_arg
    n_threads = n_threads_arg("ggml_set_n_threads", n_threads)
    _n_threads[0] = n_threads
    _threads_set_by_user[0] = True
    for b in list(_cpu_backends):
        if b.alive:
            lib.ggmlpy_cpu_set_n_threads(b.ptr, n_threads)
            b.n_threads = n_threads
    return n_threads


def threads_for(backend: "Backend", flops: float) -> int:
    """Give a CPU backend the threads a graph of ``flops`` per compute runs best with: the user's count if
    they set one with ``ggml_set_n_threads``, else one thread for a small graph and the default for others.
    Returns the count it had before (to restore it)."""
    if not backend.is_cpu:
        return 0
    before = backend.n_threads
    n = _n_threads[0] if _threads_set_by_user[0] or flops >= SMALL_GRAPH_FLOPS else 1
    if n != before:
        lib.ggmlpy_cpu_set_n_threads(backend.ptr, n)
        backend.n_threads = n
    return before


def set_backend_threads(backend: "Backend", n: int) -> None:
    if (backend.is_cpu or is_blas(backend)) and n >= 1 and n != backend.n_threads:
        lib.ggmlpy_cpu_set_n_threads(backend.ptr, n)
        backend.n_threads = n


def is_blas(backend: "Backend") -> bool:
    return backend.device.name == "BLAS"


def blas_device() -> "Device | None":
    """ggml's BLAS device ("BLAS", built by default when OpenBLAS is installed), or None."""
    if _blas_disabled[0]:
        return None
    return next((d for d in ggml_backend_devices() if d.name == "BLAS"), None)


def blas_backend_init() -> "Backend | None":
    """A BLAS backend to put before a CPU backend in a scheduler (it computes with one thread until
    split_threads gives it more), or None when this build has none."""
    dev = blas_device()
    if dev is None:
        return None
    backend = ggml_backend_dev_init(dev)
    set_backend_threads(backend, 1)
    return backend


def ggml_set_blas_enabled(enabled: bool) -> None:
    """Whether schedulers made from a name (``ggml_backend_sched_new("cpu")``) and the model layer put
    ggml's BLAS backend before the CPU backend (the default, when this build has it). Disabling it runs
    every op on ggml's own CPU kernels (e.g. to compare them). Schedulers made before keep theirs.

    Arguments:
        enabled: a bool.

    Value: None.

    Example:
        >>> ggml_set_blas_enabled(False)
    """
    _blas_disabled[0] = not bool(enabled)


def blas_shares_cpu_pool() -> bool:
    """Whether ggml's BLAS backend runs its products on the CPU backend's own threads: OpenBLAS built on
    OpenMP, as ggml's CPU backend is. Then both may take every thread, as neither pool waits beside the other."""
    from . import openblas
    from .cpu_features import uses_openmp
    return openblas.threading_model() == "openmp" and uses_openmp()


def split_threads(backends, work: "StepWork") -> list:
    """Set the threads of a scheduler's CPU and BLAS backends for a training graph doing ``work`` per step
    (``opt.training_step_work``). With a BLAS backend, the thread budget ``ggml_get_n_threads()`` goes to
    OpenBLAS when the products reach BLAS_PARALLEL_FLOPS and BLAS_FLOPS_PER_POOL_ELEMENT times the pool's
    element ops, and to ggml's pool when those reach POOL_PARALLEL_ELEMENTS; each gets one thread
    otherwise. Without a BLAS backend, the CPU backends get the count ``threads_for`` picks (one thread for
    a small graph unless the user set a count). Returns [(backend, count before)] for restore_threads."""
    blas = [b for b in backends if is_blas(b) and b.alive]
    if not blas:
        return [(b, threads_for(b, work.flops)) for b in backends if b.alive and b.is_cpu]
    n = _n_threads[0]
    if blas_shares_cpu_pool():
        blas_n = pool_n = n if _threads_set_by_user[0] or work.flops >= SMALL_GRAPH_FLOPS else 1
    else:
        blas_n = n if work.blas_flops >= max(BLAS_PARALLEL_FLOPS,
                                             BLAS_FLOPS_PER_POOL_ELEMENT * work.pool_elements) else 1
        pool_n = n if work.pool_elements >= POOL_PARALLEL_ELEMENTS else 1
    before = []
    for b in backends:
        if not b.alive or not (b.is_cpu or is_blas(b)):
            continue
        before.append((b, b.n_threads))
        set_backend_threads(b, blas_n if is_blas(b) else pool_n)
    return before


def restore_threads(before: list) -> None:
    for b, n in before:
        if b.alive:
            set_backend_threads(b, n)


def ggml_get_n_threads() -> int:
    """The thread count new CPU backends get (set with ``ggml_set_n_threads``).

    Value: an int; by default the number of CPUs available to this process.

    Example:
        >>> ggml_get_n_threads()
    """
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
    """Free a backend buffer; the tensors placed in it lose their memory.

    Idempotent. Reading or writing those tensors afterwards raises GgmlStateError instead of touching
    freed memory.

    Arguments:
        buffer: a Buffer (e.g. from ``ggml_backend_alloc_ctx_tensors``).

    Value: None.

    Example:
        >>> ggml_backend_buffer_free(buf)
    """
    free_handle(buffer, Buffer, "ggml_backend_buffer_free(buffer)")


def ggml_backend_buffer_get_size(buffer: Buffer) -> int:
    """The size of a backend buffer in bytes.

    Arguments:
        buffer: a Buffer.

    Value: an int.

    Example:
        >>> ggml_backend_buffer_get_size(ggml_backend_alloc_ctx_tensors(ctx, cpu))
    """
    unwrap(buffer, Buffer, "ggml_backend_buffer_get_size(buffer)")
    return buffer.size


def ggml_backend_buffer_name(buffer: Buffer) -> str:
    """The name of a buffer (that of its buffer type), e.g. ``"CPU"`` or ``"Vulkan0"``.

    Arguments:
        buffer: a Buffer.

    Value: a str.

    Example:
        >>> ggml_backend_buffer_name(buf)
    """
    unwrap(buffer, Buffer, "ggml_backend_buffer_name(buffer)")
    return buffer.name


def ggml_backend_buffer_clear(buffer: Buffer, value: int = 0) -> None:
    """Set every byte of a backend buffer to ``value`` (all its tensors at once).

    Arguments:
        buffer: a Buffer.
        value: the byte to write, an int in [0, 255] (default 0: zeroes every tensor of any type).

    Value: None.

    Example:
        >>> ggml_backend_buffer_clear(buf)           # all tensors = 0
    """
    ptr = unwrap(buffer, Buffer, "ggml_backend_buffer_clear(buffer)")
    expect(isinstance(value, int) and 0 <= value <= 255, f"value must be a byte in [0, 255], got {value!r}")
    # a compute or fit reading the buffer (another thread, a callback) would see it change under it
    with using([], "ggml_backend_buffer_clear", exclusive=[buffer],
               busy=lambda call: f"ggml_backend_buffer_clear: the buffer is in use by {call}, which would see its "
                                 "values change mid-way; clear it after that call returns"):
        lib.ggml_backend_buffer_clear(ptr, value)


def ggml_backend_alloc_ctx_tensors(ctx, backend: Backend) -> Buffer | None:
    """Give every tensor of a ``no_alloc=True`` context memory on ``backend``, in one buffer.

    The usual way to place a model's parameters and inputs on a device: create them in a
    ``no_alloc=True`` context, call this once, then write their data with
    ``ggml_backend_tensor_set_data``. The buffer stays alive with the context (or until
    ``ggml_backend_buffer_free``).

    Arguments:
        ctx: a Context created with ``no_alloc=True`` (else GgmlStateError).
        backend: the Backend whose memory receives the tensors.

    Value: the Buffer, or None when the context has no tensor needing memory. Raises
    GgmlStateError when the allocation fails (out of device memory).

    Example:
        >>> ctx = ggml_init(16 * ggml_tensor_overhead(), no_alloc=True)
        >>> w = ggml_set_param(ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 8))
        >>> buf = ggml_backend_alloc_ctx_tensors(ctx, backend)
    """
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
