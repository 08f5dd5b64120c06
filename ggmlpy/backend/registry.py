"""ggml's backend registry: device-type and buffer-usage constants, registries, loading backends at run time."""
from __future__ import annotations

import os
from dataclasses import dataclass

from .._ffi import CData, ffi, lib
from ..core.args import c_string, is_int
from ..core.handle import raise_type
from ..errors import BackendUnavailableError, GgmlStateError, GgmlTypeError, GgmlValueError
from .device import decode_str, Device
from .modules import module_problems


@dataclass(frozen=True)
class Registry:
    """A backend family of ggml's registry (CPU, BLAS, Vulkan, CUDA, RPC): owned by ggml, never freed."""
    ptr: CData

    @property
    def name(self) -> str:
        return decode_str(lib.ggml_backend_reg_name(self.ptr))

    def dev_count(self) -> int:
        return int(lib.ggml_backend_reg_dev_count(self.ptr))

    def __repr__(self) -> str:
        return f"<Registry {self.name}: {self.dev_count()} device(s)>"


def _registered(ptr: CData) -> bool:
    return any(lib.ggml_backend_reg_get(i) == ptr for i in range(ggml_backend_reg_count()))


def _reg(reg: object, fn: str) -> CData:
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
    return decode_str(lib.ggml_backend_reg_name(_reg(reg, "ggml_backend_reg_name")))


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


def ggml_backend_load_errors() -> list[dict]:
    """The backends that were built but offer no device, and why: a module that did not load names the
    library it misses.

    Importing ggmlpy loads each backend module of its library folder (``libggml-cuda.so``,
    ``libggml-vulkan.so``, ...) into ggml's registry; ggml drops one it cannot use without a word. This says
    what became of every backend of ``ggml_backends_built()`` that has no device: the module could not be
    loaded (a CUDA module whose cuBLAS is not on the library path, a Vulkan module without the Vulkan
    loader), does not run on this CPU, did not start (no Vulkan driver), or loaded and found no device (RPC,
    which has devices only once a server is added, is left out). ``ggml_list_devices()`` warns with the same
    messages, asking for such a backend by name raises BackendUnavailableError with them, and
    ``backend="auto"`` warns once when it uses the CPU because a GPU module did not load.

    Value: a list of dicts, one per module file (empty when every built backend has a device), each with
    ``backend`` (the family as built: ``"cuda"``, ``"vulkan"``), ``module`` (the file name), ``path``,
    ``stage`` (``"load"``: the system could not load it; ``"unsupported"``: its score is 0 on this
    machine; ``"init"``: it loads but did not start; ``"no device"``: it started and found none;
    ``"missing"``: no such file), ``error`` (what the system or ggml said, e.g. ``"libcublas.so.13: cannot
    open shared object file: No such file or directory"``), ``missing_library`` (``"libcublas.so.13"``, or
    None) and ``message`` (all of it, with the usual fix).

    Example:
        >>> for e in ggml_backend_load_errors():
        ...     print(e["message"])
    """
    return [p.as_dict() for p in module_problems()]


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
    raise GgmlStateError(f"ggml_backend_unload: unloading the {decode_str(lib.ggml_backend_reg_name(ptr))} registry is "
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
    return [decode_str(lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))) for i in range(ggml_backend_reg_count())]
