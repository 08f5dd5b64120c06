"""ggml's backend registry, device properties and buffer queries (ggmlR's backend.R, first half).

Registries (backend families: CPU, BLAS, Vulkan, CUDA, RPC) and devices belong to ggml and live as long
as the process: a ``Registry`` and a ``Device`` are plain references, never freed. Device types and
buffer usages are ints, given by ggmlR's zero-argument functions (``ggml_backend_device_type_gpu()``)
and, as in ggml, by ``GGML_BACKEND_DEVICE_TYPE_*`` / ``GGML_BACKEND_BUFFER_USAGE_*`` constants.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ._ffi import ffi, lib
from ._checks import is_int
from ._handle import raise_type, unwrap, using
from .backend import Backend, Buffer, Device, _as_device, _str, ggml_backend_dev_init, ggml_backend_devices, \
    ggml_backend_reg_count, ggml_backend_reg_names
from .errors import BackendUnavailableError, GgmlStateError, GgmlTypeError, GgmlValueError

GGML_BACKEND_DEVICE_TYPE_CPU = int(lib.GGML_BACKEND_DEVICE_TYPE_CPU)
GGML_BACKEND_DEVICE_TYPE_GPU = int(lib.GGML_BACKEND_DEVICE_TYPE_GPU)
GGML_BACKEND_DEVICE_TYPE_IGPU = int(lib.GGML_BACKEND_DEVICE_TYPE_IGPU)
GGML_BACKEND_DEVICE_TYPE_ACCEL = int(lib.GGML_BACKEND_DEVICE_TYPE_ACCEL)
GGML_BACKEND_BUFFER_USAGE_ANY = int(lib.GGML_BACKEND_BUFFER_USAGE_ANY)
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = int(lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
GGML_BACKEND_BUFFER_USAGE_COMPUTE = int(lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE)

_DEVICE_TYPE_NAMES = {GGML_BACKEND_DEVICE_TYPE_CPU: "cpu", GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
                      GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu", GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel"}
_USAGE_NAMES = {GGML_BACKEND_BUFFER_USAGE_ANY: "any", GGML_BACKEND_BUFFER_USAGE_WEIGHTS: "weights",
                GGML_BACKEND_BUFFER_USAGE_COMPUTE: "compute"}


# ---------------------------------------------------------------- constants (ggmlR's zero-argument functions)

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


def ggml_backend_buffer_usage_any() -> int:
    """The buffer-usage constant "any" (no particular use; the default of a new buffer).

    Value: an int (0, ``GGML_BACKEND_BUFFER_USAGE_ANY``).

    Example:
        >>> ggml_backend_buffer_get_usage(buf) == ggml_backend_buffer_usage_any()
    """
    return GGML_BACKEND_BUFFER_USAGE_ANY


def ggml_backend_buffer_usage_weights() -> int:
    """The buffer-usage constant "weights": the buffer holds a model's parameters.

    ggml's scheduler uses it to decide where to run an op whose weights live in host memory.

    Value: an int (1, ``GGML_BACKEND_BUFFER_USAGE_WEIGHTS``).

    Example:
        >>> ggml_backend_buffer_set_usage(buf, ggml_backend_buffer_usage_weights())
    """
    return GGML_BACKEND_BUFFER_USAGE_WEIGHTS


def ggml_backend_buffer_usage_compute() -> int:
    """The buffer-usage constant "compute": the buffer holds intermediate results of a graph.

    Value: an int (2, ``GGML_BACKEND_BUFFER_USAGE_COMPUTE``).

    Example:
        >>> ggml_backend_buffer_set_usage(buf, ggml_backend_buffer_usage_compute())
    """
    return GGML_BACKEND_BUFFER_USAGE_COMPUTE


def _device_type_arg(fn: str, type: Any) -> int:
    if not is_int(type):
        raise GgmlTypeError(f"{fn}: type must be a device-type constant (an int such as "
                            f"ggml_backend_device_type_gpu()), got {type!r}")
    if int(type) not in _DEVICE_TYPE_NAMES:
        known = ", ".join(f"{v} ({n})" for v, n in _DEVICE_TYPE_NAMES.items())
        raise GgmlValueError(f"{fn}: type must be one of {known}, got {type!r}; use the "
                             "ggml_backend_device_type_*() functions")
    return int(type)


# ---------------------------------------------------------------- registries

@dataclass(frozen=True)
class Registry:
    """A backend family of ggml's registry (CPU, BLAS, Vulkan, CUDA, RPC): owned by ggml, never freed."""
    ptr: Any

    @property
    def name(self) -> str:
        return _str(lib.ggml_backend_reg_name(self.ptr))

    def dev_count(self) -> int:
        return int(lib.ggml_backend_reg_dev_count(self.ptr))

    def __repr__(self) -> str:
        return f"<Registry {self.name}: {self.dev_count()} device(s)>"


def _registered(ptr: Any) -> bool:
    return any(lib.ggml_backend_reg_get(i) == ptr for i in range(ggml_backend_reg_count()))


def _reg(reg: Any, fn: str) -> Any:
    """The pointer of a Registry (or a registry name) that is still registered."""
    if isinstance(reg, str):
        found = ggml_backend_reg_by_name(reg)
        if found is None:
            raise BackendUnavailableError(f"{fn}: no backend registry named {reg!r}; registries: "
                                          f"{ggml_backend_reg_names()}")
        return found.ptr
    if not isinstance(reg, Registry):
        raise_type(f"{fn}(reg)", "Registry (ggml_backend_reg_get/ggml_backend_reg_by_name) or registry name", reg)
    if not _registered(reg.ptr):
        raise GgmlStateError(f"{fn}: this registry is no longer registered with ggml; get it again with "
                             "ggml_backend_reg_by_name")
    return reg.ptr


def ggml_backend_reg_get(index: int) -> Registry:
    """Backend registry (family) number ``index``: CPU, BLAS, Vulkan, CUDA, RPC, as built.

    Arguments:
        index: an int in ``[0, ggml_backend_reg_count())`` (else GgmlValueError).

    Value: a Registry (owned by ggml: never freed).

    Example:
        >>> [ggml_backend_reg_name(ggml_backend_reg_get(i)) for i in range(ggml_backend_reg_count())]
    """
    n = ggml_backend_reg_count()
    if not is_int(index) or not 0 <= int(index) < n:
        raise GgmlValueError(f"ggml_backend_reg_get: index must be an int in [0, {n}) (ggml_backend_reg_count()), "
                             f"got {index!r}")
    return Registry(lib.ggml_backend_reg_get(int(index)))


def ggml_backend_reg_by_name(name: str) -> Registry | None:
    """The backend registry called ``name`` (``"CPU"``, ``"Vulkan"``, ``"CUDA"``, ``"RPC"``, ``"BLAS"``), or None.

    The match ignores case, as in ggml.

    Arguments:
        name: a registry name (see ``ggml_backend_reg_names``).

    Value: a Registry, or None when no such family is loaded.

    Example:
        >>> ggml_backend_reg_by_name("Vulkan") is not None
    """
    from .context import c_string
    ptr = lib.ggml_backend_reg_by_name(c_string("ggml_backend_reg_by_name", "name", name))
    return Registry(ptr) if ptr != ffi.NULL else None


def ggml_backend_reg_name(reg: Registry) -> str:
    """The name of a backend registry, e.g. ``"CPU"`` or ``"Vulkan"``.

    Arguments:
        reg: a Registry (from ``ggml_backend_reg_get``/``ggml_backend_reg_by_name``).

    Value: a str.

    Example:
        >>> ggml_backend_reg_name(ggml_backend_reg_by_name("cpu"))
        'CPU'
    """
    return _str(lib.ggml_backend_reg_name(_reg(reg, "ggml_backend_reg_name")))


def ggml_backend_reg_dev_count(reg: Registry) -> int:
    """The number of devices a backend registry offers (e.g. the Vulkan GPUs).

    Arguments:
        reg: a Registry, or a registry name such as ``"Vulkan"``.

    Value: an int (may be 0: a family built but without a device on this machine).

    Example:
        >>> ggml_backend_reg_dev_count(ggml_backend_reg_by_name("CPU"))
        1
    """
    return int(lib.ggml_backend_reg_dev_count(_reg(reg, "ggml_backend_reg_dev_count")))


def ggml_backend_reg_dev_get(reg: Registry, index: int) -> Device:
    """Device number ``index`` of a backend registry.

    Arguments:
        reg: a Registry, or a registry name such as ``"Vulkan"``.
        index: an int in ``[0, ggml_backend_reg_dev_count(reg))`` (else GgmlValueError).

    Value: a Device (owned by ggml: never freed).

    Example:
        >>> ggml_backend_dev_name(ggml_backend_reg_dev_get(ggml_backend_reg_by_name("CPU"), 0))
        'CPU'
    """
    ptr = _reg(reg, "ggml_backend_reg_dev_get")
    n = int(lib.ggml_backend_reg_dev_count(ptr))
    if not is_int(index) or not 0 <= int(index) < n:
        raise GgmlValueError(f"ggml_backend_reg_dev_get: index must be an int in [0, {n}) (the registry's "
                             f"ggml_backend_reg_dev_count), got {index!r}")
    return Device(lib.ggml_backend_reg_dev_get(ptr, int(index)))


def ggml_backend_load_all() -> None:
    """Load every dynamically loadable ggml backend library ggml finds.

    ggml looks for ``libggml-<name>.so`` files in the directory named by the environment variable
    ``GGML_BACKEND_DIR``, next to the Python executable and in the working directory. ggmlpy's own
    backends are linked in and registered already, so this only matters for extra backend libraries
    built with ``GGML_BACKEND_DL=ON`` for the same ggml version (others are skipped with a log message).

    Value: None. New families show up in ``ggml_backend_reg_names()`` and their devices in
    ``ggml_backend_devices()``.

    Example:
        >>> ggml_backend_load_all()
    """
    lib.ggml_backend_load_all()


def ggml_backend_load(path: str) -> Registry | None:
    """Load one backend library (a ``libggml-<name>.so`` built with ``GGML_BACKEND_DL=ON``) and register it.

    Like any shared library, the file runs code when it is loaded: load only libraries you trust, built
    for this ggml version (``GGML_VERSION``).

    Arguments:
        path: the path of the library file (a str or os.PathLike).

    Value: the new Registry, or None when the file is missing or is not a loadable ggml backend (ggml
    logs why).

    Example:
        >>> ggml_backend_load("/nonexistent/libggml-foo.so") is None
        True
    """
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or not path or "\0" in path:
        raise GgmlTypeError(f"ggml_backend_load: path must be the path of a library file (a non-empty str), "
                            f"got {path!r}")
    if not os.path.isfile(path):  # ggml logs and returns NULL too; say so without calling it
        return None
    ptr = lib.ggml_backend_load(path.encode())
    return Registry(ptr) if ptr != ffi.NULL else None


def ggml_backend_unload(reg: Registry) -> None:
    """Unloading a backend registry is refused: it would leave dangling pointers behind.

    ggml's unload removes the family's devices from the registry and closes its library, while every
    Device, Backend, Buffer, event or scheduler made from it still points into that library's code and
    memory: the next use would crash the interpreter, and ggmlpy cannot know every such object (a
    Device is a plain reference). Free the objects and let the process end instead.

    Arguments:
        reg: a Registry (checked, then refused).

    Value: never returns; raises GgmlStateError.

    Example:
        >>> ggml_backend_unload(ggml_backend_reg_by_name("CPU"))     # raises GgmlStateError
    """
    ptr = _reg(reg, "ggml_backend_unload")
    raise GgmlStateError(f"ggml_backend_unload: unloading the {_str(lib.ggml_backend_reg_name(ptr))} registry is "
                         "refused: devices, backends and buffers made from it (which ggmlpy cannot all track) would "
                         "point into unloaded code and crash the interpreter on their next use. Free the backends "
                         "you no longer need with ggml_backend_free instead")


def ggml_backend_register(reg: Registry) -> None:
    """Add a backend registry (and its devices) to ggml's registry; one already there is left as is.

    Every Registry ggmlpy hands out is registered already (``ggml_backend_load`` and
    ``ggml_backend_rpc_add_server`` register what they load), so this is for parity with ggmlR and ggml:
    registries implemented in C by other code.

    Arguments:
        reg: a Registry.

    Value: None.

    Example:
        >>> ggml_backend_register(ggml_backend_reg_by_name("CPU"))     # already there: nothing changes
    """
    if not isinstance(reg, Registry):
        raise_type("ggml_backend_register(reg)", "Registry (ggml_backend_reg_get/ggml_backend_reg_by_name)", reg)
    if reg.ptr == ffi.NULL:
        raise GgmlValueError("ggml_backend_register: the registry is NULL")
    lib.ggml_backend_register(reg.ptr)


# ---------------------------------------------------------------- devices

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
    t = _device_type_arg("ggml_backend_dev_by_type", type)
    ptr = lib.ggml_backend_dev_by_type(t)
    return Device(ptr) if ptr != ffi.NULL else None


def ggml_backend_init_by_type(type: int, params: str | None = None) -> Backend:
    """Start a backend on the first device of a kind (the first GPU, the CPU, ...).

    Arguments:
        type: a device-type constant such as ``ggml_backend_device_type_gpu()``.
        params: an optional, backend-specific parameter string (default None; the built-in backends need
            none).

    Value: a Backend handle. Raises BackendUnavailableError when there is no device of that kind (ggmlR
    returns NULL there); ``ggml_list_devices()`` shows what there is.

    Example:
        >>> cpu = ggml_backend_init_by_type(ggml_backend_device_type_cpu())
    """
    fn = "ggml_backend_init_by_type"
    t = _device_type_arg(fn, type)
    dev = ggml_backend_dev_by_type(t)
    if dev is None:
        raise BackendUnavailableError(f"{fn}: there is no {_DEVICE_TYPE_NAMES[t]} device (devices: "
                                      f"{[(d.name, d.type) for d in ggml_backend_devices()]}); ggml_list_devices() "
                                      "shows what this machine offers")
    return ggml_backend_dev_init(dev, params)


def _props(dev: Device) -> Any:
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
    dev = _as_device(device)
    p = _props(dev)
    caps = p.caps
    return {
        "name": _str(p.name),
        "description": _str(p.description),
        "memory_free": int(p.memory_free),
        "memory_total": int(p.memory_total),
        "type": int(p.type),
        "device_id": _str(p.device_id),
        "caps": {"async": bool(getattr(caps, "async")), "host_buffer": bool(caps.host_buffer),
                 "buffer_from_host_ptr": bool(caps.buffer_from_host_ptr), "events": bool(caps.events)},
    }


def device_caps(dev: Device) -> dict:
    """The ``caps`` of ``ggml_backend_dev_get_props`` for a Device."""
    caps = _props(dev).caps
    return {"async": bool(getattr(caps, "async")), "events": bool(caps.events)}


def _op(op: Any, fn: str) -> Any:
    from .context import Tensor, as_tensor
    if not isinstance(op, Tensor):
        raise_type(f"{fn}(op)", "Tensor (an op's result, e.g. ggml_add(ctx, a, b))", op)
    return as_tensor(op, f"{fn}(op)")


def ggml_backend_dev_supports_op(device: Device, op: Any) -> bool:
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
    dev = _as_device(device)
    t = _op(op, "ggml_backend_dev_supports_op")
    with using(t.keepers, "ggml_backend_dev_supports_op"):
        return bool(lib.ggml_backend_dev_supports_op(dev.ptr, t.ptr))


def ggml_backend_dev_offload_op(device: Device, op: Any) -> bool:
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
    dev = _as_device(device)
    t = _op(op, "ggml_backend_dev_offload_op")
    with using(t.keepers, "ggml_backend_dev_offload_op"):
        return bool(lib.ggml_backend_dev_offload_op(dev.ptr, t.ptr))


def _buft(buft: Any, fn: str) -> Any:
    if isinstance(buft, Buffer):
        return lib.ggml_backend_buffer_get_type(unwrap(buft, Buffer, f"{fn}(buft)"))
    if isinstance(buft, Backend):
        return lib.ggml_backend_get_default_buffer_type(unwrap(buft, Backend, f"{fn}(buft)"))
    if isinstance(buft, (Device, str)):
        return lib.ggml_backend_dev_buffer_type(_as_device(buft).ptr)
    raise_type(f"{fn}(buft)", "buffer type: a Buffer (its type), a Backend or a Device (their default buffer type)",
               buft)


def ggml_backend_dev_supports_buft(device: Device, buft: Any) -> bool:
    """Whether a device can compute on tensors that live in buffers of a given buffer type.

    ggmlpy has no separate buffer-type object: pass a Buffer (its type), a Backend or a Device (its
    default buffer type: where ``ggml_backend_alloc_ctx_tensors`` puts tensors).

    Arguments:
        device: a Device or a device name.
        buft: a Buffer, a Backend, a Device or a device name.

    Value: a bool: e.g. the CPU can use host buffers, a Vulkan device only its own.

    Example:
        >>> ggml_backend_dev_supports_buft("CPU", ggml_backend_cpu_init())
        True
    """
    dev = _as_device(device)
    return bool(lib.ggml_backend_dev_supports_buft(dev.ptr, _buft(buft, "ggml_backend_dev_supports_buft")))


# ---------------------------------------------------------------- buffers

def _buffer(buffer: Any, fn: str) -> Any:
    return unwrap(buffer, Buffer, f"{fn}(buffer)")


def ggml_backend_buffer_is_host(buffer: Buffer) -> bool:
    """Whether a backend buffer is in host memory (the CPU's; readable without a device transfer).

    Arguments:
        buffer: a Buffer (e.g. from ``ggml_backend_alloc_ctx_tensors``).

    Value: a bool: True for CPU buffers, False for a GPU's own memory.

    Example:
        >>> ggml_backend_buffer_is_host(ggml_backend_alloc_ctx_tensors(ctx, ggml_backend_cpu_init()))
        True
    """
    return bool(lib.ggml_backend_buffer_is_host(_buffer(buffer, "ggml_backend_buffer_is_host")))


def ggml_backend_buffer_get_usage(buffer: Buffer) -> int:
    """The usage hint of a backend buffer.

    Arguments:
        buffer: a Buffer.

    Value: an int: ``ggml_backend_buffer_usage_any()`` (the default), ``_weights()`` or ``_compute()``.

    Example:
        >>> ggml_backend_buffer_get_usage(buf) == ggml_backend_buffer_usage_any()
        True
    """
    return int(lib.ggml_backend_buffer_get_usage(_buffer(buffer, "ggml_backend_buffer_get_usage")))


def ggml_backend_buffer_set_usage(buffer: Buffer, usage: int) -> None:
    """Tell ggml what a backend buffer holds; its scheduler uses it when placing ops.

    Marking the buffer of a model's parameters as weights lets a scheduler with ``op_offload`` move
    large ops whose weights are in host memory to the GPU.

    Arguments:
        buffer: a Buffer.
        usage: ``ggml_backend_buffer_usage_any()``, ``ggml_backend_buffer_usage_weights()`` or
            ``ggml_backend_buffer_usage_compute()`` (another value raises GgmlValueError).

    Value: None.

    Example:
        >>> ggml_backend_buffer_set_usage(buf, ggml_backend_buffer_usage_weights())
    """
    fn = "ggml_backend_buffer_set_usage"
    ptr = _buffer(buffer, fn)
    if not is_int(usage):
        raise GgmlTypeError(f"{fn}: usage must be a buffer-usage constant (an int such as "
                            f"ggml_backend_buffer_usage_weights()), got {usage!r}")
    if int(usage) not in _USAGE_NAMES:
        known = ", ".join(f"{v} ({n})" for v, n in _USAGE_NAMES.items())
        raise GgmlValueError(f"{fn}: usage must be one of {known}, got {usage!r}")
    lib.ggml_backend_buffer_set_usage(ptr, int(usage))


def ggml_backend_buffer_reset(buffer: Buffer) -> None:
    """Let the buffer's backend drop per-tensor bookkeeping it keeps for the buffer.

    Only some backends keep any (none of CPU, BLAS, Vulkan and RPC do: for them this does nothing). The
    tensors keep their memory and values; clear those with ``ggml_backend_buffer_clear``.

    Arguments:
        buffer: a Buffer.

    Value: None.

    Example:
        >>> ggml_backend_buffer_reset(buf)
    """
    ptr = _buffer(buffer, "ggml_backend_buffer_reset")
    with using([buffer], "ggml_backend_buffer_reset"):
        lib.ggml_backend_buffer_reset(ptr)

