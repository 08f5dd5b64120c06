"""Backend buffers (``Buffer``): allocating a context's tensors in one, size, name, usage, clearing, freeing."""
from __future__ import annotations

import weakref

from .._ffi import CData, ffi, lib
from ..core.args import is_int
from ..core.handle import check_rpc_connections, free_handle, Handle, raise_type, unwrap, using
from ..errors import expect, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.objects import Context
from .backend import Backend
from .device import as_device, decode_str, Device


GGML_BACKEND_BUFFER_USAGE_ANY = int(lib.GGML_BACKEND_BUFFER_USAGE_ANY)
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = int(lib.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
GGML_BACKEND_BUFFER_USAGE_COMPUTE = int(lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE)


_USAGE_NAMES = {GGML_BACKEND_BUFFER_USAGE_ANY: "any", GGML_BACKEND_BUFFER_USAGE_WEIGHTS: "weights",
                GGML_BACKEND_BUFFER_USAGE_COMPUTE: "compute"}


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


def _buft(buft: object, fn: str) -> CData:
    if isinstance(buft, Buffer):
        return lib.ggml_backend_buffer_get_type(unwrap(buft, Buffer, f"{fn}(buft)"))
    if isinstance(buft, Backend):
        return lib.ggml_backend_get_default_buffer_type(unwrap(buft, Backend, f"{fn}(buft)"))
    if isinstance(buft, (Device, str)):
        return lib.ggml_backend_dev_buffer_type(as_device(buft).ptr)
    raise_type(f"{fn}(buft)", "buffer type: a Buffer (its type), a Backend or a Device (their default buffer type)",
               buft)


def ggml_backend_dev_supports_buft(device: Device | str, buft: Buffer | Backend | Device | str) -> bool:
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
    dev = as_device(device)
    return bool(lib.ggml_backend_dev_supports_buft(dev.ptr, _buft(buft, "ggml_backend_dev_supports_buft")))


# ---------------------------------------------------------------- buffers

def _buffer(buffer: object, fn: str) -> CData:
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


class Buffer(Handle):
    kind = "backend buffer"

    def __init__(self, ptr: CData, ctx: Context | None = None, backend: Backend | None = None) -> None:
        super().__init__(ptr, lib.ggml_backend_buffer_free, parents=[backend] if backend else [])
        self._ctx_ref = weakref.ref(ctx) if ctx is not None else None

    def _before_free(self) -> None:
        # Detach the context's tensors from the memory about to go, so later data transfers
        # raise "no buffer" instead of writing into freed memory.
        ctx = self._ctx_ref() if self._ctx_ref else None
        if ctx is not None and ctx.alive and self._ptr is not None:
            ctx.detach_buffer(self._ptr)

    @property
    def size(self) -> int:
        return int(lib.ggml_backend_buffer_get_size(self.ptr))

    @property
    def name(self) -> str:
        return decode_str(lib.ggml_backend_buffer_name(self.ptr))


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
    expect(is_int(value) and 0 <= value <= 255, f"value must be a byte in [0, 255], got {value!r}")
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
    ctx_ptr = unwrap(ctx, Context, "ggml_backend_alloc_ctx_tensors(ctx)")
    b_ptr = unwrap(backend, Backend, "ggml_backend_alloc_ctx_tensors(backend)")
    expect(ctx.no_alloc, "ggml_backend_alloc_ctx_tensors: the context must be created with no_alloc=True "
                         "(its tensors already have memory)", GgmlStateError)
    ptr = lib.ggml_backend_alloc_ctx_tensors(ctx_ptr, b_ptr)
    if ptr == ffi.NULL:
        if any(t.data == ffi.NULL and t.view_src == ffi.NULL for t in ctx.tensor_ptrs()):
            if backend.is_rpc:
                check_rpc_connections()  # its server is gone: say so, not "out of memory"
            raise GgmlStateError(f"could not allocate the context's tensors on {backend.name} (out of memory?)")
        return None
    buffer = Buffer(ptr, ctx=ctx, backend=backend)
    ctx.buffers.append(buffer)  # the tensors need it: it lives until freed explicitly or with the context
    return buffer
