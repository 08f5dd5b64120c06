"""Pinned host memory between numpy arrays and the tensors of a scheduler's devices, so that a training step waits for
its device once (patches/0052): ``Uploads`` queue a batch's writes ahead of the step's computation, ``Reads`` queue
reads of its results behind it; the values are in host memory after the step's one wait (``ggml_opt_eval_finish``,
which synchronizes the scheduler).

A tensor in host memory is written at once and read after the wait, directly. A device without pinned host memory
(an RPC server) is written and read with ggml's blocking calls, as before. Each object owns one pinned buffer, cut
into a slot per tensor; a slot is rewritten only after the wait that ended the step which used it.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .._ffi import CData, ffi, lib
from ..backend.backend import Backend
from ..backend.buffer import Buffer
from ..backend.transfer import ggml_backend_tensor_get_data, numpy_dtype, write_array
from ..graph.nodes import ptr_key
from ..graph.objects import Tensor


_ALIGN = 64  # bytes between slots: a cache line, more than any device's copy alignment needs


def holder(t: CData, backends: Sequence[Backend]) -> Backend | None:
    """The backend of ``backends`` whose device holds tensor pointer ``t``'s memory; None for host memory, or for
    device memory none of them holds (read and written with ggml's blocking calls)."""
    buf = t.view_src.buffer if t.view_src != ffi.NULL else t.buffer
    if buf == ffi.NULL or lib.ggml_backend_buffer_is_host(buf):
        return None
    buft = lib.ggml_backend_buffer_get_type(buf)
    for b in backends:
        if lib.ggml_backend_supports_buft(b.ptr, buft):
            return b
    return None


class _Slots:
    """One pinned buffer of the first device among ``backends`` that has pinned memory, cut into ``sizes`` slots
    (none when no device has it: every transfer is then a blocking one)."""

    def __init__(self, sizes: Sequence[int], backends: Sequence[Backend]) -> None:
        self.offsets: list[int] = []
        self.buffer: Buffer | None = None
        self.base: CData = ffi.NULL
        buft = ffi.NULL
        for b in backends:
            dev = lib.ggml_backend_get_device(b.ptr)
            if dev != ffi.NULL and lib.ggml_backend_dev_type(dev) != lib.GGML_BACKEND_DEVICE_TYPE_CPU:
                buft = lib.ggml_backend_dev_host_buffer_type(dev)
                if buft != ffi.NULL:
                    break
        if buft == ffi.NULL or not sizes:
            return
        total = 0
        for n in sizes:
            self.offsets.append(total)
            total += (int(n) + _ALIGN - 1) // _ALIGN * _ALIGN
        ptr = lib.ggml_backend_buft_alloc_buffer(buft, max(total, _ALIGN))
        if ptr == ffi.NULL:  # no pinned memory left: blocking transfers, as without it
            self.offsets = []
            return
        self.buffer = Buffer(ptr)
        self.base = ffi.cast("char *", lib.ggml_backend_buffer_get_base(ptr))

    def slot(self, i: int) -> CData:
        return ffi.cast("char *", self.base) + self.offsets[i]

    def array(self, i: int, dtype: np.dtype, count: int) -> np.ndarray:
        """Slot ``i`` as a numpy array of ``count`` elements (a view of the pinned memory)."""
        return np.frombuffer(ffi.buffer(self.slot(i), count * dtype.itemsize), dtype=dtype, count=count)

    @property
    def pinned(self) -> bool:
        return self.buffer is not None

    def free(self) -> None:
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None
            self.base = ffi.NULL


class Uploads:
    """A step's writes into ``tensors`` (its inputs, labels, weights, dropout seeds), queued on the devices that hold
    them ahead of the work queued next (the step's graph). Two sets of slots (``parity`` 0 and 1): the host can
    stage the next step's batch while the step before it may still be reading the other set."""

    def __init__(self, tensors: Sequence[Tensor], backends: Sequence[Backend]) -> None:
        self.backends = list(backends)
        self._index = {ptr_key(t.ptr): i for i, t in enumerate(tensors)}
        self._n = len(tensors)
        self._slots = _Slots([int(lib.ggml_nbytes(t.ptr)) for t in tensors] * 2, self.backends)

    def stage(self, t: CData, arr: np.ndarray, parity: int = 0) -> tuple[CData, np.ndarray, CData]:
        """Copy contiguous ``arr`` (of ``t``'s dtype, at most its size; checked by the caller) for tensor pointer
        ``t`` into its slot of set ``parity`` where ``t`` is in pinned slots (host work only: nothing is queued);
        ``send`` queues what this returns."""
        i = self._index.get(ptr_key(t))
        if i is None or not self._slots.pinned or arr.nbytes > int(lib.ggml_nbytes(t)):
            return t, arr, ffi.NULL
        k = i + parity * self._n
        np.copyto(self._slots.array(k, arr.dtype, arr.size), arr.reshape(-1))
        return t, arr, self._slots.slot(k)

    def send(self, staged: tuple[CData, np.ndarray, CData]) -> None:
        """Queue a staged write on the device that holds the tensor (a blocking write where it has no pinned slot or
        is in host memory)."""
        t, arr, slot = staged
        backend = holder(t, self.backends) if slot != ffi.NULL and lib.ggml_is_contiguous(t) else None
        if backend is None:
            write_array(t, arr)
        else:
            lib.ggml_backend_tensor_set_async(backend.ptr, t, slot, 0, arr.nbytes)

    def write(self, t: CData, arr: np.ndarray, parity: int = 0) -> None:
        """``send(stage(...))``: queue the write of ``arr`` into ``t`` now."""
        self.send(self.stage(t, arr, parity))

    def free(self) -> None:
        self._slots.free()


class Reads:
    """Reads of ``tensors`` (a step's outputs, its heads' losses), queued behind the computation (``queue``); their
    values after the step's wait (``values``)."""

    def __init__(self, tensors: Sequence[Tensor], backends: Sequence[Backend]) -> None:
        self.tensors = list(tensors)
        self.backends = list(backends)
        self._dtypes = [numpy_dtype(t) for t in self.tensors]
        self._slots = _Slots([int(lib.ggml_nbytes(t.ptr)) for t in self.tensors], self.backends)
        self._queued: list[bool] = [False] * len(self.tensors)

    def queue(self) -> None:
        """Queue the reads of the tensors on device memory (call after the computation was queued)."""
        for i, t in enumerate(self.tensors):
            p = t.ptr
            backend = holder(p, self.backends) if self._slots.pinned and lib.ggml_is_contiguous(p) else None
            self._queued[i] = backend is not None
            if backend is not None:
                lib.ggml_backend_tensor_get_async(backend.ptr, p, self._slots.slot(i), 0, lib.ggml_nbytes(p))

    def values(self) -> list[np.ndarray]:
        """Each tensor's elements, 1-D in ggml order (a copy): call after the wait that ended the step."""
        out = []
        for i, t in enumerate(self.tensors):
            if self._queued[i]:
                n = int(lib.ggml_nelements(t.ptr))
                out.append(self._slots.array(i, self._dtypes[i], n).copy())
            else:
                out.append(ggml_backend_tensor_get_data(t))
        return out

    def free(self) -> None:
        self._slots.free()
