"""Devices (``Device``): listing them, their names, types, memory and properties, and which ops and buffer
types each supports.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._ffi import BUILD_INFO, CData, ffi, lib
from ..core.args import c_string, is_int
from ..core.handle import raise_type, using
from ..errors import BackendUnavailableError, expect, GgmlTypeError, GgmlValueError
from ..graph.objects import as_tensor, Tensor
from .modules import family_problem, module_problems, warn_problems


DEVICE_TYPES = {
    lib.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    lib.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    lib.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    lib.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
}


def decode_str(c_str: CData) -> str:
    return ffi.string(c_str).decode("utf-8", "replace") if c_str != ffi.NULL else ""


@dataclass(frozen=True)
class Device:
    """A device known to ggml's registry (CPU, Vulkan0, CUDA0, RPC0, ...)."""
    ptr: CData

    @property
    def name(self) -> str:
        return decode_str(lib.ggml_backend_dev_name(self.ptr))

    @property
    def description(self) -> str:
        return decode_str(lib.ggml_backend_dev_description(self.ptr))

    @property
    def type(self) -> str:
        return DEVICE_TYPES.get(lib.ggml_backend_dev_type(self.ptr), "other")

    @property
    def backend_name(self) -> str:
        """Name of the registry (backend family) this device belongs to: CPU, Vulkan, CUDA, RPC."""
        return decode_str(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(self.ptr)))

    @property
    def max_binding_bytes(self) -> int | None:
        """The most bytes one shader binding of this device covers, for a Vulkan device (its
        ``maxStorageBufferRange``: 4 GiB on NVIDIA, 128 MiB on Mesa's lavapipe); None for other devices.
        An op whose tensors are larger runs on another backend (``ggml_model_placement`` says so)."""
        n = int(lib.ggmlpy_vk_max_storage_buffer_range(self.ptr))
        return n or None

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
    expect(is_int(index) and 0 <= index < n,
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
    return as_device(device).name


def ggml_backend_dev_description(device: Device) -> str:
    """A human-readable description of a device (the CPU model, the GPU's name).

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: a str.

    Example:
        >>> ggml_backend_dev_description("CPU")
    """
    return as_device(device).description


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
    return int(lib.ggml_backend_dev_type(as_device(device).ptr))


def ggml_backend_dev_memory(device: Device) -> dict:
    """Free and total memory of a device, in bytes (system memory for the CPU).

    Arguments:
        device: a Device (from ``ggml_backend_devices``/``ggml_backend_dev_get``) or a device name such
            as ``"CPU"`` or ``"Vulkan0"`` (an unknown name raises BackendUnavailableError).

    Value: a dict ``{"free": int, "total": int}``.

    Example:
        >>> ggml_backend_dev_memory("CPU")["total"] // 2**30     # GiB
    """
    return as_device(device).memory()


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

    A backend that was built but offers no device is not left out in silence: for each of its module files
    a GgmlpyWarning names the file and why (a module that could not be loaded, with the library it misses
    and the usual fix, e.g. ``libggml-cuda.so ... libcublas.so.13: cannot open shared object file``; or one
    that loaded but found no device). ``ggml_backend_load_errors()`` returns the same as a list.

    Value: a pandas DataFrame with one row per device and columns ``name``, ``description``, ``type``
    (cpu/gpu/igpu/accel), ``backend`` (the family: CPU, Vulkan, CUDA, RPC), ``memory_free`` and
    ``memory_total`` (bytes).

    Example:
        >>> print(ggml_list_devices())
    """
    import pandas as pd
    warn_problems(module_problems(), "")
    rows = []
    for d in ggml_backend_devices():
        mem = d.memory()
        rows.append({"name": d.name, "description": d.description, "type": d.type,
                     "backend": d.backend_name, "memory_free": mem["free"], "memory_total": mem["total"]})
    return pd.DataFrame(rows, columns=["name", "description", "type", "backend", "memory_free", "memory_total"])


def ggml_backends_built() -> list[str]:
    """The backends compiled into this installation, e.g. ``['cpu', 'vulkan']``.

    Chosen at build time with ``GGMLPY_BACKENDS=cpu,blas,vulkan pip install .``; a built backend may still
    find no device on this machine, or its module may not load (see ``ggml_list_devices`` and
    ``ggml_backend_load_errors``).

    Value: a list of lower-case str.

    Example:
        >>> "cuda" in ggml_backends_built()
    """
    return list(BUILD_INFO.get("backends", ["cpu"]))


def as_device(device: object) -> Device:
    if isinstance(device, Device):
        return device
    if isinstance(device, str):
        found = ggml_backend_dev_by_name(device)
        if found is None:
            family = "".join(c for c in device if not c.isdigit())
            problem = family_problem(family) if family.lower() in ggml_backends_built() else None
            devices = [d.name for d in ggml_backend_devices()]
            raise BackendUnavailableError(f"no device named {device!r}; devices: {devices}"
                                          + (f"; {problem}" if problem else ""))
        return found
    raise_type("device", "Device or device name", device)


GGML_BACKEND_DEVICE_TYPE_CPU = int(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
GGML_BACKEND_DEVICE_TYPE_GPU = int(lib.GGML_BACKEND_DEVICE_TYPE_GPU)
GGML_BACKEND_DEVICE_TYPE_IGPU = int(lib.GGML_BACKEND_DEVICE_TYPE_IGPU)
GGML_BACKEND_DEVICE_TYPE_ACCEL = int(lib.GGML_BACKEND_DEVICE_TYPE_ACCEL)


DEVICE_TYPE_NAMES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
                      GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel"}


def ggml_backend_device_type_cpu() -> int:
    """The device-type constant of the CPU (what ``ggml_backend_dev_type`` returns for it).

    Value: an int (0, ``GGML_BACKEND_DEVICE_TYPE_CPU``).

    Example:
        >>> ggml_backend_dev_type("CPU") == ggml_backend_device_type_cpu()
        True
    """
    return GGML_BACKEND_DEVICE_TYPE_CPU


def ggml_backend_device_type_gpu() -> int:
    """The device-type constant of a discrete GPU with its own memory (Vulkan, CUDA devices).

    Value: an int (1, ``GGML_BACKEND_DEVICE_TYPE_GPU``).

    Example:
        >>> gpu = ggml_backend_dev_by_type(ggml_backend_device_type_gpu())   # None without a GPU
    """
    return GGML_BACKEND_DEVICE_TYPE_GPU


def ggml_backend_device_type_igpu() -> int:
    """The device-type constant of an integrated GPU (it shares the host's memory).

    Value: an int (2, ``GGML_BACKEND_DEVICE_TYPE_IGPU``).

    Example:
        >>> igpu = ggml_backend_dev_by_type(ggml_backend_device_type_igpu())
    """
    return GGML_BACKEND_DEVICE_TYPE_IGPU


def ggml_backend_device_type_accel() -> int:
    """The device-type constant of an accelerator that works beside the CPU (BLAS, AMX).

    Value: an int (3, ``GGML_BACKEND_DEVICE_TYPE_ACCEL``).

    Example:
        >>> [d.name for d in ggml_backend_devices()
        ...  if ggml_backend_dev_type(d) == ggml_backend_device_type_accel()]
    """
    return GGML_BACKEND_DEVICE_TYPE_ACCEL


def device_type_arg(fn: str, type: object) -> int:
    if not is_int(type):
        raise GgmlTypeError(f"{fn}: type must be a device-type constant (an int such as "
                            f"ggml_backend_device_type_gpu()), got {type!r}")
    if int(type) not in DEVICE_TYPE_NAMES:
        known = ", ".join(f"{v} ({n})" for v, n in DEVICE_TYPE_NAMES.items())
        raise GgmlValueError(f"{fn}: type must be one of {known}, got {type!r}; use the "
                             "ggml_backend_device_type_*() functions")
    return int(type)


def ggml_backend_dev_by_type(type: int) -> Device | None:
    """The first device of a kind, in ggml's registry order.

    Arguments:
        type: a device-type constant: ``ggml_backend_device_type_cpu()``, ``_gpu()``, ``_igpu()`` or
            ``_accel()`` (another value raises GgmlValueError).

    Value: a Device, or None when there is no device of that kind.

    Example:
        >>> ggml_backend_dev_name(ggml_backend_dev_by_type(ggml_backend_device_type_cpu()))
        'CPU'
    """
    t = device_type_arg("ggml_backend_dev_by_type", type)
    ptr = lib.ggml_backend_dev_by_type(t)
    return Device(ptr) if ptr != ffi.NULL else None


def _props(dev: Device) -> CData:
    props = ffi.new("struct ggml_backend_dev_props *")
    lib.ggml_backend_dev_get_props(dev.ptr, props)
    return props


def ggml_backend_dev_get_props(device: Device) -> dict:
    """Everything ggml says about a device, in one dict.

    Arguments:
        device: a Device or a device name such as ``"CPU"`` or ``"Vulkan0"``.

    Value: a dict with ``name`` and ``description`` (str), ``memory_free`` and ``memory_total`` (bytes,
    int), ``type`` (the device-type int, as ``ggml_backend_dev_type``), ``device_id`` (the PCI bus id of
    a GPU, ``""`` when ggml gives none) and ``caps``, a dict of bools: ``async`` (asynchronous transfers
    and computes), ``host_buffer`` (pinned host buffers), ``buffer_from_host_ptr`` and ``events``
    (``ggml_backend_event_new`` works).

    Example:
        >>> props = ggml_backend_dev_get_props("CPU")
        >>> props["caps"]["events"]
        False
    """
    dev = as_device(device)
    p = _props(dev)
    caps = p.caps
    return {
        "name": decode_str(p.name),
        "description": decode_str(p.description),
        "memory_free": int(p.memory_free),
        "memory_total": int(p.memory_total),
        "type": int(p.type),
        "device_id": decode_str(p.device_id),
        "caps": {"async": bool(getattr(caps, "async")), "host_buffer": bool(caps.host_buffer),
                 "buffer_from_host_ptr": bool(caps.buffer_from_host_ptr), "events": bool(caps.events)},
    }


def device_caps(dev: Device) -> dict:
    """The ``caps`` of ``ggml_backend_dev_get_props`` for a Device."""
    caps = _props(dev).caps
    return {"async": bool(getattr(caps, "async")), "events": bool(caps.events)}


def make_op(op: object, fn: str) -> Tensor:
    if not isinstance(op, Tensor):
        raise_type(f"{fn}(op)", "Tensor (an op's result, e.g. ggml_add(ctx, a, b))", op)
    return as_tensor(op, f"{fn}(op)")


def ggml_backend_dev_supports_op(device: Device | str, op: Tensor) -> bool:
    """Whether a device implements an op for the types and shapes of a given tensor.

    Ask with the tensor an op returned (e.g. ``ggml_add(ctx, a, b)``): its op, operand types and
    layouts are what the device is asked about. The tensor needs no memory.

    Arguments:
        device: a Device or a device name.
        op: a Tensor, the result of the op in question.

    Value: a bool (ggml's answer; ggmlpy's graph checks also run the CPU's kernels once, because ggml's
    CPU answers True for a few combinations whose kernels abort).

    Example:
        >>> ggml_backend_dev_supports_op("CPU", ggml_add(ctx, a, b))
        True
    """
    dev = as_device(device)
    t = make_op(op, "ggml_backend_dev_supports_op")
    with using(t.keepers, "ggml_backend_dev_supports_op"):
        return bool(lib.ggml_backend_dev_supports_op(dev.ptr, t.ptr))


def ggml_backend_dev_offload_op(device: Device | str, op: Tensor) -> bool:
    """Whether ggml's scheduler would move an op whose weights live in host memory onto this device.

    GPU backends say yes for large batches, where copying the weights pays off (the scheduler's
    ``op_offload``); the CPU always says no.

    Arguments:
        device: a Device or a device name.
        op: a Tensor, the result of the op in question.

    Value: a bool.

    Example:
        >>> ggml_backend_dev_offload_op("CPU", ggml_mul_mat(ctx, w, x))
        False
    """
    dev = as_device(device)
    t = make_op(op, "ggml_backend_dev_offload_op")
    with using(t.keepers, "ggml_backend_dev_offload_op"):
        return bool(lib.ggml_backend_dev_offload_op(dev.ptr, t.ptr))
