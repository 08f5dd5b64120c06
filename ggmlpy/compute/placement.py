"""Where a scheduler runs each op of a graph, and what it copies between backends to do so.

``PlacementRecorder`` watches the computes of one scheduler through ggml's eval callback
(``ggml_backend_sched_set_eval_callback``): for every node ggml is about to compute, it records the op, the
backend the scheduler gave it, and the tensors the scheduler copied from another backend for it (ggml names
those copies ``<backend>#<tensor>#<n>``). It asks for no node's data, so the compute itself is unchanged: each
split still runs as one graph. ``Placement`` is what it saw, for people (``str``) and for tests.
"""
from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend
from ..backend.device import Device
from ..core.handle import unwrap
from ..errors import GgmlpyWarning
from .sched import Scheduler


if TYPE_CHECKING:
    from typing_extensions import Self


# the largest storage-buffer offset alignment a Vulkan device asks for: a view may start that far past its binding
_MAX_ALIGNMENT = 256
# ops that compute nothing (their result views another tensor's memory): not counted as work anywhere
NO_WORK_OPS = {"NONE", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
# device types whose backends compute in host memory: the CPU itself and ggml's BLAS backend
_HOST_TYPES = (int(lib.GGML_BACKEND_DEVICE_TYPE_CPU), int(lib.GGML_BACKEND_DEVICE_TYPE_ACCEL))


@dataclass
class Placement:
    """Where one compute of a graph ran (``ggml_model_placement``'s result).

    Attributes:
        what: what was computed, e.g. ``"training step of 'cnn', batch 100"``.
        n_splits: how many parts ggml's scheduler cut the graph into (one per change of backend).
        splits: ``(backend name, [op names in order])`` of each part, in the order they ran.
        copied: ``(tensor name, bytes)`` of every tensor the scheduler copied between backends.
        host: the names of the backends that compute in host memory (the CPU, ggml's BLAS backend).
        why: for each op a host backend computed while a device was in the scheduler, why the device did not
            (``{"IM2COL_BACK": "Vulkan0 refuses IM2COL_BACK: its 151.0 MB operand is past ..."}``).
        notes: what the model's layers built in a form other than their fastest on this device, and why (a
            recurrent layer unrolled step by step where the device has its whole-sequence op).
    """
    what: str
    n_splits: int
    splits: list[tuple[str, list[str]]] = field(default_factory=list)
    copied: list[tuple[str, int]] = field(default_factory=list)
    host: frozenset = frozenset()
    why: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def devices(self) -> list[str]:
        """The backends that computed something, in the order they first did."""
        return list(dict.fromkeys(b for b, _ in self.splits))

    @property
    def cpu_ops(self) -> list[str]:
        """The names of the ops a CPU-side backend (the CPU, BLAS) computed, each once; empty when none did."""
        return sorted({op for b, ops in self.splits if b in self.host for op in ops})

    @property
    def copies(self) -> int:
        """How many tensors the scheduler copied between backends (device <-> host on a GPU)."""
        return len(self.copied)

    @property
    def copy_bytes(self) -> int:
        """The bytes those copies moved."""
        return sum(n for _, n in self.copied)

    def op_counts(self, backend: str | None = None) -> Counter:
        """How many times each op ran (on ``backend`` only, when given)."""
        return Counter(op for b, ops in self.splits if backend in (None, b) for op in ops)

    def __str__(self) -> str:
        lines = [f"{self.what}: {self.n_splits} split{'s' * (self.n_splits != 1)}, {self.copies} cop"
                 f"{'y' if self.copies == 1 else 'ies'} between backends ({_bytes(self.copy_bytes)})"]
        for i, (backend, ops) in enumerate(self.splits, 1):
            counts = ", ".join(f"{op} {n}" for op, n in Counter(ops).most_common())
            lines.append(f"  split {i}: {backend:8} {len(ops):5} ops: {counts}")
        gpu = [b for b in self.devices if b not in self.host]
        if gpu:
            lines.append("  on the CPU: " + (", ".join(self.cpu_ops) if self.cpu_ops else "nothing"))
            for op in self.cpu_ops:
                if op in self.why:
                    lines.append(f"    {op}: {self.why[op]}")
        for name, n in sorted(self.copied, key=lambda c: -c[1])[:8]:
            lines.append(f"  copied: {name} ({_bytes(n)})")
        if len(self.copied) > 8:
            lines.append(f"  ... and {len(self.copied) - 8} more copies")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"<Placement {self.what!r}: {self.n_splits} splits on {self.devices}, {self.copies} copies "
                f"({self.copy_bytes} bytes), cpu_ops={self.cpu_ops}>")


def _bytes(n: int) -> str:
    for unit, size in (("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


class SchedWatcher:
    """What every watcher of a scheduler's computes shares (``with watcher(sched):``): entering installs ggml's
    eval callback, which calls the watcher's ``_on_eval(tensor, ask)`` (its answer says whether ggml stops after
    that node); leaving removes it. Only one watcher is on a scheduler at a time. An exception in ``_on_eval``
    cannot pass through ggml: the first one is kept and raised when the block ends (its report would be
    incomplete)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self._ptr = unwrap(sched, Scheduler, f"{type(self).__name__}(sched)")
        self._names = {pointer_key(b.ptr): ffi.string(lib.ggml_backend_name(b.ptr)).decode() for b in sched.backends}
        self._handle: CData | None = None
        self._error: Exception | None = None

    def backend_of(self, t: CData) -> str:
        """The name of the backend the scheduler gave node ``t`` ("?" when it gave none)."""
        b = lib.ggml_backend_sched_get_tensor_backend(self._ptr, t)
        return self._names.get(pointer_key(b), "?") if b != ffi.NULL else "?"

    def __enter__(self) -> Self:
        self._handle = ffi.new_handle(self)
        lib.ggml_backend_sched_set_eval_callback(self._ptr, lib._ggmlpy_sched_eval_cb, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sched.alive:
            lib.ggml_backend_sched_set_eval_callback(self._ptr, ffi.NULL, ffi.NULL)
        self._handle = None
        error, self._error = self._error, None
        if error is not None and exc[0] is None:
            raise error

    def _on_eval(self, t: CData, ask: bool) -> bool:
        raise NotImplementedError


class PlacementRecorder(SchedWatcher):
    """Records where a scheduler computes each node while it is entered (``with PlacementRecorder(sched):``).

    Only one recorder watches a scheduler at a time; leaving the block removes the callback."""

    def __init__(self, sched: Scheduler) -> None:
        super().__init__(sched)
        self._host = {self._names[pointer_key(b.ptr)] for b in sched.backends if is_host_backend(b)}
        self._devices = [b for b in sched.backends if not is_host_backend(b)]
        self._nodes: list[tuple[str, str]] = []
        self._copies: dict[int, tuple[str, int]] = {}
        self._why: dict[str, str] = {}

    def _on_eval(self, t: CData, ask: bool) -> bool:
        """ggml's eval callback: record each node before it runs, and ask for none (no split changes)."""
        if ask:
            self._see(t)
        return False

    def _see(self, t: CData) -> None:
        op = ffi.string(lib.ggml_op_desc(t)).decode()
        if op in NO_WORK_OPS:
            return
        backend = self.backend_of(t)
        self._nodes.append((backend, op))
        if self._devices and backend in self._host and op not in self._why:
            self._why[op] = why_not_on_device(self._devices[0], t, op)
        for s in t.src:
            if s == ffi.NULL or pointer_key(s) in self._copies:
                continue
            name = ffi.string(s.name).decode("utf-8", "replace")
            if name.split("#", 1)[0] in self._names.values() and name.count("#") >= 2:
                self._copies[pointer_key(s)] = (name, int(lib.ggml_nbytes(s)))

    def placement(self, what: str) -> Placement:
        """What the computes inside the block did (the last compute's split count)."""
        splits: list[tuple[str, list[str]]] = []
        for backend, op in self._nodes:
            if not splits or splits[-1][0] != backend:
                splits.append((backend, []))
            splits[-1][1].append(op)
        n_splits = int(lib.ggml_backend_sched_get_n_splits(self._ptr)) if self.sched.alive else len(splits)
        return Placement(what, n_splits, splits, list(self._copies.values()), frozenset(self._host), dict(self._why))


def why_not_on_device(device: Backend, t: CData, op: str) -> str:
    """Why a host backend, not ``device`` (the scheduler's first device), computed node ``t``."""
    name = ffi.string(lib.ggml_backend_name(device.ptr)).decode()
    if lib.ggml_backend_supports_op(device.ptr, t):
        return (f"{name} computes {op}, but ggml's scheduler gave this one to the CPU (its inputs were in host "
                "memory, or the device's buffer type cannot hold one of them)")
    tensors = [t] + [s for s in t.src if s != ffi.NULL]
    largest = max(int(lib.ggml_nbytes(x)) for x in tensors)
    limit = Device(lib.ggml_backend_get_device(device.ptr)).max_binding_bytes
    if limit is not None and largest + _MAX_ALIGNMENT > limit:
        return (f"{name} refuses {op}: a {_bytes(largest)} tensor of it is past the {_bytes(limit)} one shader "
                "binding covers on this device (maxStorageBufferRange)")
    loops = int(lib.ggmlpy_vk_shader_loops_refused(lib.ggml_backend_get_device(device.ptr), t))
    if loops:
        return (f"{name} (lavapipe) refuses {op} at this size: its shader would loop about {loops} times, and "
                "lavapipe stops a shader's loops after 65535 iterations (the result would be wrong); a GPU "
                "computes it")
    operands = ", ".join(f"{ffi.string(lib.ggml_type_name(x.type)).decode()} "
                         f"{list(x.ne)[:max(1, int(lib.ggml_n_dims(x)))]}"
                         f"{'' if lib.ggml_is_contiguous(x) else ' (strided)'}" for x in tensors[1:])
    return f"{name} does not compute {op} with these operands ({operands or 'none'})"


def is_host_backend(backend: Backend) -> bool:
    """Whether ``backend`` computes in host memory (the CPU, ggml's BLAS backend), not on a device."""
    return int(lib.ggml_backend_dev_type(lib.ggml_backend_get_device(backend.ptr))) in _HOST_TYPES


def warn_if_host_ops(placement: Placement) -> None:
    """Warn when a step on a device still computed ops on the CPU, naming them and what the copies cost."""
    device = next((b for b in placement.devices if b not in placement.host), None)
    if device is None or not placement.cpu_ops:
        return
    warnings.warn(f"{placement.what} on {device} computes {', '.join(placement.cpu_ops)} on the CPU: "
                  f"{placement.n_splits} splits and {placement.copies} copies between the device and the host "
                  f"({_bytes(placement.copy_bytes)}) every step{_reasons(placement)}. ggml_model_placement(model) "
                  "lists where each op runs; an op the device lacks stays on the CPU", GgmlpyWarning, stacklevel=5)


def _reasons(placement: Placement) -> str:
    why = [f"{op}: {placement.why[op]}" for op in placement.cpu_ops if op in placement.why]
    return f" ({'; '.join(why[:3])}{'; ...' if len(why) > 3 else ''})" if why else ""


def pointer_key(p: CData) -> int:
    return int(ffi.cast("uintptr_t", p))


@ffi.def_extern()
def _ggmlpy_sched_eval_cb(t, ask, user_data):  # noqa: ANN001 - C signature
    # the watcher (a PlacementRecorder, a profile's NodeTimer) says whether ggml stops after this node
    watcher = ffi.from_handle(user_data)
    try:
        return bool(watcher._on_eval(t, bool(ask)))
    except Exception as error:  # never raise into C: the first one is raised when the watching block ends
        if watcher._error is None:
            watcher._error = error
        return False
