"""Training on another machine's devices through ggml's RPC backend.

Server side: ``ggml_backend_rpc_start_server("0.0.0.0:50052")`` serves this machine's devices
(blocking; run it in its own process). Client side: ``ggml_backend_rpc_add_server("host:50052")``
registers the server's devices (named RPC0, RPC1, ...) so they can be used like local ones, e.g.
``ggml_backend_init_by_name("RPC0")`` in a scheduler. ggml aborts the process when an endpoint
does not answer, so the endpoint is probed from Python first. Client and server must be built
from the same ggml version (the wire protocol is versioned).
"""
from __future__ import annotations

import socket

from ._ffi import ffi, lib
from .backend import Device, _as_device, ggml_backend_devices, ggml_backends_built, ggml_get_n_threads
from .errors import BackendUnavailableError, GgmlValueError

_servers: dict[str, list[Device]] = {}


def _parse_endpoint(endpoint: str) -> tuple[str, int]:
    if not isinstance(endpoint, str) or endpoint.count(":") < 1:
        raise GgmlValueError(f"endpoint must be 'host:port', got {endpoint!r}")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GgmlValueError(f"endpoint must be 'host:port' with a port in 1..65535, got {endpoint!r}")
    return host.strip("[]"), int(port)


def _require_rpc() -> None:
    if lib.ggml_backend_reg_by_name(b"RPC") == ffi.NULL:
        built = "rpc" in ggml_backends_built()
        raise BackendUnavailableError("the RPC backend is " + ("built but did not load" if built else
                                      "not built: rebuild with GGMLPY_BACKENDS=cpu,rpc pip install ."))


def ggml_rpc_probe(endpoint: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``endpoint`` (a quick check before using an RPC server).

    ggml aborts the process when an RPC endpoint does not answer, so ggmlpy probes first; this is that
    probe. It only checks that the port is open, not that an RPC server is behind it.

    Arguments:
        endpoint: ``"host:port"`` (port 1-65535; an IPv6 host may be bracketed), else GgmlValueError.
        timeout: seconds to wait for the connection (default 2.0).

    Value: a bool.

    Example:
        >>> ggml_rpc_probe("192.168.1.20:50052")
        True
    """
    host, port = _parse_endpoint(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def ggml_backend_rpc_add_server(endpoint: str, timeout: float = 2.0) -> list[Device]:
    """Register the devices of the RPC server at ``endpoint``, so they can be used like local ones.

    The server's devices appear as ``RPC0``, ``RPC1``, ... in ``ggml_list_devices``; start one with
    ``ggml_backend_init_by_name("RPC0")`` and put it in a scheduler. Adding the same endpoint again
    returns the same devices. Client and server must be built from the same ggml version.

    Arguments:
        endpoint: ``"host:port"`` of a running ``ggml_backend_rpc_start_server``.
        timeout: seconds to wait when probing the endpoint first (default 2.0).

    Value: the list of new Devices. Raises BackendUnavailableError when nothing answers there or
    this installation was built without RPC (``GGMLPY_BACKENDS=cpu,rpc``).

    Example:
        >>> devs = ggml_backend_rpc_add_server("gpu-box:50052")
        >>> sched = ggml_backend_sched_new([ggml_backend_init_by_name(devs[0].name)])
    """
    _require_rpc()
    _parse_endpoint(endpoint)
    if endpoint in _servers:
        return list(_servers[endpoint])
    if not ggml_rpc_probe(endpoint, timeout):
        raise BackendUnavailableError(f"no RPC server answers at {endpoint}; start one there with "
                                      "ggmlpy.ggml_backend_rpc_start_server(endpoint)")
    before = {d.name for d in ggml_backend_devices()}
    reg = lib.ggmlpy_rpc_add_server(endpoint.encode())
    if reg == ffi.NULL:
        raise BackendUnavailableError(f"the RPC server at {endpoint} did not answer the device query")
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
        devices: the Devices (or device names) to serve, or None (the default: every non-RPC device,
            GPUs first).

    Value: None (it only returns if the server stops). Raises BackendUnavailableError when this
    installation was built without RPC.

    Example:
        >>> ggml_backend_rpc_start_server("0.0.0.0:50052")     # on the machine with the GPU
    """
    _require_rpc()
    _parse_endpoint(endpoint)
    if devices is None:
        devices = [d for d in ggml_backend_devices() if d.backend_name != "RPC"]
        devices.sort(key=lambda d: d.type == "cpu")
    devs = [_as_device(d) for d in devices]
    if not devs:
        raise GgmlValueError("no device to serve")
    threads = ggml_get_n_threads() if n_threads is None else n_threads
    if not isinstance(threads, int) or threads < 1:
        raise GgmlValueError(f"n_threads must be an int >= 1, got {n_threads!r}")
    arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in devs])
    cache = cache_dir.encode() if cache_dir else ffi.NULL
    if not lib.ggmlpy_rpc_start_server(endpoint.encode(), cache, threads, len(devs), arr):
        raise BackendUnavailableError("the RPC backend does not offer a server entry point")
