"""Where ``ag_*`` values live: one ``Engine`` per device (its backend, the graphs cached for it, what moved over its
bus), the ``Storage`` a parameter, a moment or a statistic keeps on it, and the defaults ``ag_device`` and
``ag_dtype`` set.

Every change of a stored value (an optimizer step, ``.data = ...``) takes a new number from one counter, the
*epoch*; a lazy value remembers the epoch it was made in, so a value made before its inputs changed is refused
instead of being computed from the new ones (``lazy.py``).
"""
from __future__ import annotations

import itertools
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..backend.backend import Backend, ggml_backend_init_auto
from ..backend.buffer import Buffer, ggml_backend_alloc_ctx_tensors, ggml_backend_buffer_clear
from ..backend.device import ggml_backend_devices
from ..backend.transfer import ggml_backend_tensor_get_data, ggml_backend_tensor_set_data
from ..core.types import GGML_TYPE_BF16, GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32
from ..errors import BackendUnavailableError, GgmlpyWarning, GgmlValueError
from ..graph.context import ggml_init, ggml_tensor_overhead
from ..graph.objects import Context, Tensor
from ..graph.tensor import ggml_new_tensor, ggml_set_param


DTYPES = {"f32": GGML_TYPE_F32, "f16": GGML_TYPE_F16, "bf16": GGML_TYPE_BF16, "i32": GGML_TYPE_I32}
NUMPY = {"f32": np.float32, "f16": np.float16, "bf16": np.float32, "i32": np.int32}
_lock = threading.RLock()
_epoch = [0]
_serials = itertools.count(1)


def next_epoch() -> int:
    """A new epoch: the number a change of a stored value is stamped with."""
    with _lock:
        _epoch[0] += 1
        return _epoch[0]


def epoch() -> int:
    """The current epoch: what a new lazy value is stamped with."""
    return _epoch[0]


@dataclass
class Counters:
    """What an engine did: graph computes, graphs built, host-to-device and device-to-host transfers."""
    computes: int = 0
    graphs_built: int = 0
    uploads: int = 0
    upload_bytes: int = 0
    downloads: int = 0
    download_bytes: int = 0
    placements: list = field(default_factory=list)

    def snapshot(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in COUNTS)


COUNTS = ("computes", "graphs_built", "uploads", "upload_bytes", "downloads", "download_bytes")


class Engine:
    """One device as ``ag_*`` uses it: its backend, the graphs cached for it (``lazy.GraphCache``) and the
    counts of what it computed and moved. ``name``: ``"cpu"`` or a ggml device name (``"Vulkan0"``)."""

    def __init__(self, name: str, backend: Backend) -> None:
        self.name, self.backend = name, backend
        self.counters = Counters()
        self.graphs: object = None  # lazy.GraphCache, made on the first compute
        self.effects: list = []     # writes the next compute makes (a batch norm's running statistics)
        self.threads_key: object = None   # (graph, thread budget) the backends' thread counts are set for
        self.lock = threading.RLock()

    def upload(self, t: Tensor, data: np.ndarray) -> None:
        ggml_backend_tensor_set_data(t, data)
        self.counters.uploads += 1
        self.counters.upload_bytes += int(data.nbytes)

    def download(self, t: Tensor) -> np.ndarray:
        out = ggml_backend_tensor_get_data(t)
        self.counters.downloads += 1
        self.counters.download_bytes += int(out.nbytes)
        return out


class Storage:
    """A tensor of its own on an engine's device (its context and buffer), holding one value between graphs:
    a parameter, an optimizer's moment, a running statistic. ``modified``: the epoch of its last change."""

    def __init__(self, engine: Engine, shape: tuple[int, ...], dtype: str, data: np.ndarray | None = None,
                 trainable: bool = False) -> None:
        self.engine, self.shape, self.dtype = engine, shape, dtype
        self.serial = next(_serials)  # names it in the keys of cached graphs (an id() could be reused)
        ne = tuple(reversed(shape)) or (1,)
        self.ctx: Context = ggml_init(mem_size=2 * ggml_tensor_overhead(), no_alloc=True)
        self.tensor: Tensor = ggml_new_tensor(self.ctx, DTYPES[dtype], len(ne), ne)
        if trainable:
            ggml_set_param(self.tensor)  # ggml's backward gives it a gradient in every graph it is part of
        self.buffer: Buffer | None = ggml_backend_alloc_ctx_tensors(self.ctx, engine.backend)
        self.modified = next_epoch()
        if data is None:
            if self.buffer is not None:
                ggml_backend_buffer_clear(self.buffer, 0)
        else:
            self.write(data)

    def write(self, data: np.ndarray) -> None:
        self.engine.upload(self.tensor, np.ascontiguousarray(data, dtype=NUMPY[self.dtype]).reshape(-1))
        self.modified = next_epoch()

    def read(self) -> np.ndarray:
        return self.engine.download(self.tensor).reshape(self.shape)

    def touched(self, at: int | None = None) -> None:
        """Its value was changed by a graph: now (an optimizer step), or as of epoch ``at`` (a deferred write)."""
        self.modified = next_epoch() if at is None else max(self.modified, at)


_engines: dict[str, Engine] = {}
_recording = [0]   # > 0 while an ag_trace records where each compute runs


def engines() -> list[Engine]:
    """The devices started so far."""
    return list(_engines.values())


def recording(change: int = 0) -> int:
    """How many ag_trace calls are recording placements (``change``: +1 entering one, -1 leaving)."""
    with _lock:
        _recording[0] += change
        return _recording[0]
_defaults = {"device": "cpu", "dtype": "f32"}


class _ThreadDevice(threading.local):
    name: str | None = None   # this thread's default device, over the process's (dp_train's replicas)


_thread = _ThreadDevice()
_said_bf16: set[str] = set()


def device_names() -> list[str]:
    return ["cpu"] + [d.name for d in ggml_backend_devices() if d.type != "cpu" and d.backend_name not in
                      ("CPU", "BLAS")]


def resolve_device(device: object, fn: str) -> str:
    """The engine name of ``device``: ``None`` (the default), ``"cpu"``, ``"gpu"`` (the first GPU) or a ggml
    device name; anything else is a ValueError naming the devices there are."""
    if device is None:
        return default("device")
    if not isinstance(device, str):
        raise GgmlValueError(f"{fn}: device must be a string such as 'cpu', 'gpu' or 'Vulkan0', got {device!r}")
    names = device_names()
    if device.lower() == "cpu":
        return "cpu"
    if device.lower() == "gpu":
        gpus = [d.name for d in ggml_backend_devices() if d.type == "gpu"]
        if not gpus:
            raise BackendUnavailableError(f"{fn}: device 'gpu' asks for the first GPU, and ggml sees none here "
                                          f"(devices: {names}); use 'cpu', or build ggmlpy with CUDA or Vulkan")
        return gpus[0]
    for n in names:
        if n.lower() == device.lower():
            return n
    raise GgmlValueError(f"{fn}: no device is named {device!r}; expected one of {names + ['gpu']}")


def resolve_dtype(dtype: object, fn: str, device: str | None = None) -> str:
    """The storage type of ``dtype`` (``None``: the default): ``"f32"``, ``"f16"`` or ``"bf16"`` (``"bf16"`` is
    stored as ``"f16"`` on Vulkan, said once per device)."""
    if dtype is None:
        dtype = _defaults["dtype"]
    if dtype not in ("f32", "f16", "bf16"):
        raise GgmlValueError(f"{fn}: dtype must be 'f32', 'f16' or 'bf16', got {dtype!r}")
    if dtype == "bf16" and device is not None and device.lower().startswith("vulkan"):
        if device not in _said_bf16:
            _said_bf16.add(device)
            warnings.warn(f"{device} stores bf16 tensors as f16 (ggml's Vulkan backend computes with f16, as ggmlR "
                          "does there)", GgmlpyWarning, stacklevel=3)
        return "f16"
    return str(dtype)


def engine(name: str) -> Engine:
    """The engine of device ``name`` (a name ``resolve_device`` returned), started on first use."""
    with _lock:
        e = _engines.get(name)
        if e is None or not e.backend.alive:
            e = _engines[name] = Engine(name, ggml_backend_init_auto(name))
        return e


def set_default(key: str, value: str) -> str:
    """Set the default device or dtype; returns the previous one."""
    with _lock:
        before, _defaults[key] = _defaults[key], value
        return before


def default(key: str) -> str:
    if key == "device" and _thread.name is not None:
        return _thread.name
    return _defaults[key]


def thread_device(name: str | None) -> str | None:
    """Set this thread's default device (None: the process's again); returns the one before."""
    before, _thread.name = _thread.name, name
    return before
