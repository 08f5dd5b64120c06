"""Training on another machine's devices through ggml's RPC backend.

Server side: ``ggml_backend_rpc_start_server("0.0.0.0:50052")`` serves this machine's devices
(blocking; run it in its own process). Client side: ``ggml_backend_rpc_add_server("host:50052")``
registers the server's devices (named RPC0, RPC1, ...) so they can be used like local ones, e.g.
``ggml_backend_init_by_name("RPC0")`` in a scheduler. A connection that cannot be made, or whose
handshake is not a ggml server's answer within the timeout, fails the call (patches/0054: ggml
aborted the process, or waited forever for an endpoint that accepts and never answers). Client and
server must be built from the same ggml version (the wire protocol is versioned:
``ggml_rpc_protocol_version()``).
"""
from __future__ import annotations

import os

from .._ffi import ffi, lib
from ..core.args import c_string, n_threads_arg
from ..errors import BackendUnavailableError, GgmlTypeError, GgmlValueError
from .backend import ggml_get_n_threads
from .device import as_device, Device, ggml_backend_devices, ggml_backends_built
from .endpoint import answers, parse_endpoint, timeout_arg
from .modules import rebuild_hint


_servers: dict[str, list[Device]] = {}


def _require_rpc() -> None:
    if lib.ggml_backend_reg_by_name(b"RPC") == ffi.NULL:
        built = "rpc" in ggml_backends_built()
        raise BackendUnavailableError("the RPC backend is " + ("built but did not load" if built else
                                      f"not built: rebuild with {rebuild_hint('rpc')}"))


def ggml_rpc_protocol_version() -> str:
    """The version of ggml's RPC wire protocol this build speaks, ``"major.minor.patch"``: the one source of it
    is the built ``ggml-rpc.h``.

    A client and a server must have the same major version (and the server a minor version at least the
    client's), or the connection is refused; both sides built from the same ggmlpy always agree. ggml 0.20.x
    spoke 5.x, 0.25.x speaks 7.x (ggmlpy's ops besides ggml's own raise the patch number).

    Value: a str ``"major.minor.patch"``.

    Example:
        >>> ggml_rpc_protocol_version().split(".")[0]
        '7'
    """
    return f"{lib.RPC_PROTO_MAJOR_VERSION}.{lib.RPC_PROTO_MINOR_VERSION}.{lib.RPC_PROTO_PATCH_VERSION}"


def ggml_rpc_probe(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``endpoint`` (a quick check for a server being up).

    It only checks that the port is open, not that a ggml RPC server is behind it, and it does not use the
    server: ``ggml_backend_rpc_add_server`` checks the rest (the handshake) when it connects.

    Arguments:
        endpoint: ``"host:port"`` (port 1-65535; an IPv6 host may be bracketed), else GgmlValueError.
        timeout: seconds to wait for the connection, a number in (0, 86400] (default 2.0).

    Value: a bool.

    Example:
        >>> ggml_rpc_probe("192.168.1.20:50052")
        True
    """
    host, port = parse_endpoint(endpoint, "ggml_rpc_probe")
    return answers(host, port, timeout_arg("ggml_rpc_probe", timeout))


def ggml_backend_rpc_add_server(endpoint: str, timeout: float = 2.0) -> list[Device]:
    """Register the devices of the RPC server at ``endpoint``, so they can be used like local ones.

    The server's devices appear as ``RPC0``, ``RPC1``, ... in ``ggml_list_devices``; start one with
    ``ggml_backend_init_by_name("RPC0")`` and put it in a scheduler. Adding the same endpoint again
    returns the same devices. Client and server must be built from the same ggml version.

    ggml's server takes one client at a time: this process keeps one connection per server, which
    every model and device of that server shares, and another process waits until it is closed (when
    the last backend or buffer on the server is freed).

    Arguments:
        endpoint: ``"host:port"`` of a running ``ggml_backend_rpc_start_server``.
        timeout: seconds the connection and the server's handshake may take, in (0, 86400] (default 2.0);
            a new connection made later (starting a device of this server) has the same limit.

    Value: the list of new Devices. Raises BackendUnavailableError when no ggml RPC server answers
    there in time (nothing listening, another service on the port, another protocol version, or a
    server serving another client), or this installation was built without RPC
    (``GGMLPY_BACKENDS=cpu,blas,rpc pip install .``).

    Example:
        >>> devs = ggml_backend_rpc_add_server("gpu-box:50052")
        >>> sched = ggml_backend_sched_new([ggml_backend_init_by_name(devs[0].name)])
    """
    fn = "ggml_backend_rpc_add_server"
    parse_endpoint(endpoint, fn)
    seconds = timeout_arg(fn, timeout)
    _require_rpc()
    if endpoint in _servers:
        return list(_servers[endpoint])
    before = {d.name for d in ggml_backend_devices()}
    lib.ggmlpy_rpc_set_connect_timeout_ms(max(1, round(seconds * 1000)))
    reg = lib.ggmlpy_rpc_add_server(c_string(fn, "endpoint", endpoint))
    if reg == ffi.NULL:
        raise BackendUnavailableError(
            f"no ggml RPC server answered at {endpoint} within {seconds:g} s: nothing listens there, another "
            "service does, the server speaks another protocol version, or it is serving another client (ggml's "
            "server takes one at a time). Start one there with ggmlpy.ggml_backend_rpc_start_server(endpoint), "
            "or pass a longer timeout")
    lib.ggml_backend_register(reg)
    devices = [d for d in ggml_backend_devices() if d.name not in before]
    _servers[endpoint] = devices
    return list(devices)


def ggml_backend_rpc_start_server(endpoint: str, cache_dir: str | None = None, n_threads: int | None = None,
                                  devices: list | None = None) -> None:
    """Serve this machine's devices to RPC clients at ``endpoint``; blocks until the process ends.

    Run it in its own process (or a dedicated machine): clients connect with
    ``ggml_backend_rpc_add_server``.

    Arguments:
        endpoint: ``"host:port"`` to listen on, e.g. ``"0.0.0.0:50052"`` for every interface.
        cache_dir: a directory where the server caches tensors it receives, or None (the default: no
            cache).
        n_threads: CPU threads for the served CPU device (default None: ``ggml_get_n_threads()``).
        devices: the Devices (or device names) to serve, or None (the default: every non-RPC device
            but ggml's BLAS accelerator, GPUs first).

    Value: None (it only returns if the server stops). Raises BackendUnavailableError when this
    installation was built without RPC.

    Example:
        >>> ggml_backend_rpc_start_server("0.0.0.0:50052")     # on the machine with the GPU
    """
    fn = "ggml_backend_rpc_start_server"
    parse_endpoint(endpoint, fn)
    threads = ggml_get_n_threads() if n_threads is None else n_threads_arg(fn, n_threads)
    cache = ffi.NULL
    if cache_dir is not None:
        try:
            cache_path = os.fspath(cache_dir)
        except TypeError:
            raise GgmlTypeError(f"{fn}: cache_dir must be a str, an os.PathLike or None, got {cache_dir!r}") from None
        if isinstance(cache_path, bytes):
            cache_path = os.fsdecode(cache_path)
        if cache_path:
            cache = c_string(fn, "cache_dir", cache_path)
    if devices is not None and (isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__")):
        raise GgmlTypeError(f"{fn}: devices must be a list of Devices or device names, or None, got {devices!r}")
    _require_rpc()
    if devices is None:
        # not ggml's BLAS device: an accelerator of the host's CPU with no memory of its own
        devices = [d for d in ggml_backend_devices() if d.backend_name != "RPC" and d.type != "accel"]
        devices.sort(key=lambda d: d.type == "cpu")
    devs = [as_device(d) for d in devices]
    if not devs:
        raise GgmlValueError(f"{fn}: no device to serve (devices is empty)")
    arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in devs])
    if not lib.ggmlpy_rpc_start_server(c_string(fn, "endpoint", endpoint), cache, int(threads), len(devs), arr):
        raise BackendUnavailableError("the RPC backend does not offer a server entry point")
