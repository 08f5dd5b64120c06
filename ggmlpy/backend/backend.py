"""Backends (``Backend``): creating them on a device, freeing, synchronizing (and what async calls left
queued), the BLAS backend, and the user's thread count.
"""
from __future__ import annotations

import os
import weakref
from collections.abc import Iterable

from .._ffi import CData, ffi, lib
from ..core.args import c_string, is_int, n_threads_arg
from ..core.handle import computing, free_handle, Handle, HANDLE_LOCK, unique_handles, unwrap
from ..errors import BackendUnavailableError, expect, GgmlStateError
from .device import (
    as_device,
    decode_str,
    Device,
    device_caps,
    device_type_arg,
    DEVICE_TYPE_NAMES,
    ggml_backend_dev_by_type,
    ggml_backend_devices,
    ggml_backends_built,
)
from .modules import DEVICE_HINTS, family_problem, rebuild_hint, warn_gpu_fallback


def _default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


_n_threads = [_default_threads()]
_threads_set_by_user = [False]


_blas_disabled = [False]
_cpu_backends: weakref.WeakSet[Backend] = weakref.WeakSet()
_blas_backends: weakref.WeakSet[Backend] = weakref.WeakSet()

# ggml's CPU backend (and OpenBLAS's OpenMP build) run their threads on an OpenMP pool, which does not survive
# fork(): a forked child's first parallel region waits forever, deaf to Ctrl-C. A child of a process that may
# have started the pool (a CPU or BLAS backend with more than one thread) therefore computes on one thread,
# where ggml opens no parallel region; asking for more there is refused with the fix.
_pool_may_exist = [False]
_forked_single_thread = [False]
FORK_FIX = ("start worker processes with multiprocessing's 'spawn' (or 'forkserver') start method, e.g. "
            "multiprocessing.get_context('spawn').Pool(), or fork before ggmlpy computes anything")


def _note_threads(n: int) -> None:
    if n > 1:
        _pool_may_exist[0] = True


def _one_thread_after_fork() -> None:
    if not _pool_may_exist[0]:
        return
    _forked_single_thread[0] = True
    _n_threads[0] = 1
    _threads_set_by_user[0] = True  # the thread policy keeps 1
    for b in list(_cpu_backends) + list(_blas_backends):
        if b.alive and b.n_threads != 1:
            lib.ggmlpy_cpu_set_n_threads(b.ptr, 1)
            b.n_threads = 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_one_thread_after_fork)


def check_threads_after_fork(fn: str, n: int) -> None:
    """Refuse more than one thread in a process forked after ggml's thread pool may have started."""
    if n > 1 and _forked_single_thread[0]:
        raise GgmlStateError(f"{fn}: this process was forked from one that ran ggml's thread pool (OpenMP), which "
                             f"does not survive fork(): ggml computes on one thread here, {n} were asked for. "
                             f"For parallel workers, {FORK_FIX}")


class Backend(Handle):
    kind = "backend"

    def __init__(self, ptr: CData) -> None:
        super().__init__(ptr, lib.ggml_backend_free)
        self.device = Device(lib.ggml_backend_get_device(ptr))
        self.is_cpu = self.device.type == "cpu"
        self.is_rpc = not self.is_cpu and self.device.backend_name.startswith("RPC")  # checked after computes
        self.n_threads = 0
        # the user set this backend's count (ggml_backend_cpu_set_n_threads): the thread policy leaves it alone
        self.threads_chosen = False
        if self.is_cpu:
            lib.ggmlpy_cpu_set_n_threads(ptr, _n_threads[0])
            self.n_threads = _n_threads[0]
            _note_threads(self.n_threads)
            _cpu_backends.add(self)
        elif self.device.name == "BLAS":
            _blas_backends.add(self)
            _pool_may_exist[0] = True  # OpenBLAS starts its own threads as it likes

    @property
    def name(self) -> str:
        return decode_str(lib.ggml_backend_name(self.ptr))

    def _describe(self) -> str:
        return f" {self.device.name}" if self._ptr is not None else ""

    def free(self) -> None:
        # Asynchronous work queued on it (compute.transfer and compute.run: async reads/writes/computes, recorded
        # events) is finished first: ggml would otherwise free the queue while it still points at Python memory.
        if self._ptr is not None and (self.__dict__.get("_async_pending") or self.__dict__.get("_recorded_events")):
            finish_backend(self)
        super().free()


_BUILD_HINTS = {  # the backend was not built
    "vulkan": f"rebuild with {rebuild_hint('vulkan')} (needs glslc, libvulkan-dev, spirv-headers)",
    "cuda": f"rebuild with {rebuild_hint('cuda')} on a machine with nvcc",
    "rpc": f"rebuild with {rebuild_hint('rpc')}",
}
def _init_device(device_name: str, family: str, params: str | None = None) -> Backend:
    dev = lib.ggml_backend_dev_by_name(c_string(f"ggml_{family.lower()}_init", "device name", device_name))
    if dev == ffi.NULL:
        built = family.lower() in ggml_backends_built()
        devices = [d.name for d in ggml_backend_devices()]
        problem = family_problem(family) if built else None  # a module that did not load, or found no device
        if problem is not None:
            raise BackendUnavailableError(f"there is no device {device_name!r}: {problem} (devices: {devices})")
        reason = (f"the {family} backend is built but has no device {device_name!r}" if built else
                  f"this ggmlpy was built without the {family} backend")
        hint = (DEVICE_HINTS if built else _BUILD_HINTS).get(family.lower(), "")
        raise BackendUnavailableError(f"{reason} (devices: {devices}); {hint}".rstrip("; "))
    ptr = lib.ggml_backend_dev_init(dev, c_string(f"ggml_{family.lower()}_init", "params", params) if params
                                    else ffi.NULL)
    if ptr == ffi.NULL and family.upper() == "RPC":   # its connection failed (patches/0054): nothing aborted
        endpoint = decode_str(lib.ggml_backend_dev_description(dev))
        raise BackendUnavailableError(f"device {device_name!r} is on the RPC server at {endpoint}, which stopped "
                                      "answering (or is unreachable, or serving another process: ggml's server takes "
                                      "one client at a time); start the server again, or use another device")
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
    installation was built without Vulkan, the device does not exist, or the Vulkan module did not load
    (the message names the module file and the missing library, e.g. the Vulkan loader ``libvulkan.so.1``).

    Example:
        >>> gpu = ggml_vulkan_init(0)
        >>> sched = ggml_backend_sched_new([gpu])      # the CPU is appended as fallback
    """
    expect(is_int(device) and device >= 0, f"ggml_vulkan_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"Vulkan{device}", "Vulkan")


def ggml_backend_cuda_init(device: int = 0) -> Backend:
    """Start the CUDA backend on GPU number ``device``.

    Arguments:
        device: the CUDA device index (an int >= 0, default 0: the device named ``"CUDA0"``).

    Value: a Backend handle. Raises BackendUnavailableError, saying why and what to do, when this
    installation was built without CUDA, the device does not exist, or the CUDA module did not load (the
    message names the module file and the missing library, e.g. cuBLAS's ``libcublas.so.13``).

    Example:
        >>> gpu = ggml_backend_cuda_init()
    """
    expect(is_int(device) and device >= 0, f"ggml_backend_cuda_init: device must be an int >= 0, got {device!r}")
    return _init_device(f"CUDA{device}", "CUDA")


def ggml_backend_init_by_name(name: str, params: str | None = None) -> Backend:
    """Start a backend on the device called ``name``.

    Arguments:
        name: a device name: ``"CPU"``, ``"Vulkan0"``, ``"CUDA1"``, ``"RPC0"``, ... (see
            ``ggml_list_devices``).
        params: an optional, backend-specific parameter string passed to the device's init (default
            None; the built-in backends need none).

    Value: a Backend handle. Raises BackendUnavailableError when there is no such device (saying why when
    its backend module was built but did not load: ``ggml_backend_load_errors``).

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
    d = as_device(device)
    return _init_device(d.name, d.backend_name, params)


def ggml_backend_init_best() -> Backend:
    """Start ggml's preferred backend: a GPU if there is one, else an integrated GPU, else the CPU.

    ``ggml_backend_init_auto("auto")`` is the variant that skips software-emulated GPUs.

    Value: a Backend handle. Raises BackendUnavailableError when the device picked cannot be started (a GPU of
    an RPC server that has stopped: ggml would abort the process). Falling back to the CPU while a GPU backend
    module that was built did not load warns once (GgmlpyWarning), naming the module and why.

    Example:
        >>> b = ggml_backend_init_best()
        >>> ggml_backend_name(b)
    """
    # ggml's rule (ggml_backend_init_best), run here so that starting the device goes through _init_device's checks
    for kind in (lib.GGML_BACKEND_DEVICE_TYPE_GPU, lib.GGML_BACKEND_DEVICE_TYPE_IGPU, lib.GGML_BACKEND_DEVICE_TYPE_CPU):
        dev = lib.ggml_backend_dev_by_type(kind)
        if dev != ffi.NULL:
            d = Device(dev)
            if kind == lib.GGML_BACKEND_DEVICE_TYPE_CPU:
                warn_gpu_fallback("ggml_backend_init_best")
            return _init_device(d.name, d.backend_name)
    raise BackendUnavailableError("ggml lists no device at all (not even the CPU): the installation is broken; "
                                  "reinstall ggmlpy")


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

    Value: a Backend handle. Raises BackendUnavailableError for a backend or device that is missing (naming
    the module file and the missing library when its backend module was built but did not load). When
    ``"auto"`` falls back to the CPU while a GPU backend module that was built did not load (a CUDA module
    whose cuBLAS is not on the library path), it warns once (GgmlpyWarning), naming the module and why.

    Example:
        >>> b = ggml_backend_init_auto("auto")
    """
    expect(isinstance(backend, str), f"backend must be a string, got {backend!r}")
    choice = backend.lower()
    names = ["auto", "cpu", "vulkan", "cuda"] + [d.name for d in ggml_backend_devices()]
    if backend.strip() != backend and backend.strip().lower() in [n.lower() for n in names]:
        raise BackendUnavailableError(f"backend {backend!r} has spaces around the name; did you mean "
                                      f"{backend.strip()!r}?")
    family = "".join(c for c in choice if not c.isdigit())
    if choice not in [n.lower() for n in names] and family.split("[")[0] not in _BUILD_HINTS:
        raise BackendUnavailableError(f"no backend or device is named {backend!r}; choose one of {names} ('auto': "
                                      "a GPU when there is one, else the CPU)")
    if choice == "auto":
        for dev in ggml_backend_devices():
            if dev.type == "gpu" and not is_software_device(dev) and dev.backend_name != "RPC":
                return ggml_backend_dev_init(dev)
        warn_gpu_fallback('backend="auto"')  # a GPU module that was built but did not load: say so, once
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
    finish_backend(backend)


def ggml_backend_cpu_set_n_threads(backend: Backend, n_threads: int) -> None:
    """Set the number of threads of one CPU backend.

    ``ggml_set_n_threads`` sets it for every CPU backend at once (and for later ones). A backend given its count
    here keeps it: the training loops' thread policy (``docs/guide/threads.md``) leaves it alone.

    Arguments:
        backend: a CPU Backend (another kind raises GgmlStateError).
        n_threads: an int in [1, 512] (ggml's GGML_MAX_N_THREADS).

    Value: None.

    Example:
        >>> ggml_backend_cpu_set_n_threads(cpu, 4)
    """
    ptr = unwrap(backend, Backend, "ggml_backend_cpu_set_n_threads(backend)")
    n_threads = n_threads_arg("ggml_backend_cpu_set_n_threads", n_threads)
    expect(backend.is_cpu, f"ggml_backend_cpu_set_n_threads: {backend.name} is not a CPU backend", GgmlStateError)
    check_threads_after_fork("ggml_backend_cpu_set_n_threads", n_threads)
    _note_threads(n_threads)
    lib.ggmlpy_cpu_set_n_threads(ptr, n_threads)
    backend.n_threads = n_threads
    backend.threads_chosen = True


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
    n_threads = n_threads_arg("ggml_set_n_threads", n_threads)
    check_threads_after_fork("ggml_set_n_threads", n_threads)
    _note_threads(n_threads)
    _n_threads[0] = n_threads
    _threads_set_by_user[0] = True
    for b in list(_cpu_backends):
        if b.alive:
            lib.ggmlpy_cpu_set_n_threads(b.ptr, n_threads)
            b.n_threads = n_threads
    return n_threads


def set_backend_threads(backend: Backend, n: int) -> None:
    if (backend.is_cpu or is_blas(backend)) and n >= 1 and n != backend.n_threads:
        if _forked_single_thread[0]:
            n = 1
            if n == backend.n_threads:
                return
        _note_threads(n)
        lib.ggmlpy_cpu_set_n_threads(backend.ptr, n)
        backend.n_threads = n


def is_blas(backend: Backend) -> bool:
    return backend.device.name == "BLAS"


def blas_device() -> Device | None:
    """ggml's BLAS device ("BLAS", built by default when OpenBLAS is installed), or None."""
    if _blas_disabled[0]:
        return None
    return next((d for d in ggml_backend_devices() if d.name == "BLAS"), None)


def blas_backend_init() -> Backend | None:
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


def threads_set_by_user() -> bool:
    """Whether the user chose the thread count (``ggml_set_n_threads``): then the thread policy keeps it."""
    return _threads_set_by_user[0]


def ggml_get_n_threads() -> int:
    """The thread count new CPU backends get (set with ``ggml_set_n_threads``).

    Value: an int; by default the number of CPUs available to this process.

    Example:
        >>> ggml_get_n_threads()
    """
    return _n_threads[0]


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
    t = device_type_arg(fn, type)
    dev = ggml_backend_dev_by_type(t)
    if dev is None:
        raise BackendUnavailableError(f"{fn}: there is no {DEVICE_TYPE_NAMES[t]} device (devices: "
                                      f"{[(d.name, d.type) for d in ggml_backend_devices()]}); ggml_list_devices() "
                                      "shows what this machine offers")
    return ggml_backend_dev_init(dev, params)


def is_async(backend: Backend) -> bool:
    """Whether ``backend``'s device may leave work queued after an async call returns."""
    cached = backend.__dict__.get("_caps_async")
    if cached is None:
        cached = backend.__dict__["_caps_async"] = device_caps(backend.device)["async"]
    return cached


def hold_until_sync(owner: Handle, what: str, handles: Iterable[object], keep: tuple[object, ...] = ()) -> None:
    """Record work queued on ``owner`` (a Backend or Scheduler) until it is synchronized: ``handles`` are marked
    in use by ``what`` (freeing them raises GgmlInUseError) and ``keep`` (numpy arrays, graphs) stays referenced."""
    hs = unique_handles(handles)
    with HANDLE_LOCK:
        for h in hs:
            h.users.append(what)
        pending = owner.__dict__.get("_async_pending")
        if pending is None:
            # one list per owner for its lifetime; an owner collected without a synchronize unmarks them too
            pending = owner.__dict__["_async_pending"] = []
            weakref.finalize(owner, _unmark, pending)
        pending.append((what, hs, keep))


def _unmark(pending: list) -> None:
    with HANDLE_LOCK:
        for what, hs, _keep in pending:
            for h in hs:
                try:
                    h.users.remove(what)
                except ValueError:
                    pass
        pending.clear()


def release_held(owner: Handle) -> None:
    pending = owner.__dict__.get("_async_pending")
    if pending:
        _unmark(pending)


def finish_backend(backend: Backend) -> None:
    """Synchronize ``backend`` (waiting for its other computations in this process first), then let go of what its
    async calls held, and finish the events recorded on it (ggml's Vulkan event keeps a pointer into the
    backend's command pool until it is synchronized)."""
    ptr = backend.ptr
    with computing([backend]):
        lib.ggml_backend_synchronize(ptr)
        for ev in list(backend.__dict__.get("_recorded_events", ())):
            if ev.alive and ev.recorded_on is backend:
                lib.ggml_backend_event_synchronize(ev.ptr)
                ev.recorded_on = None
    release_held(backend)
