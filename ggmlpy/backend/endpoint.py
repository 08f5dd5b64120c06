"""``"host:port"`` endpoints of RPC servers: checked, and asked whether anything answers there.

ggml's RPC client aborts the process when an endpoint does not answer (adding a server, or starting a backend
on a device of one that has stopped), so ggmlpy asks first, from Python.
"""
from __future__ import annotations

import math
import numbers
import socket

from ..core.args import c_string
from ..errors import GgmlTypeError, GgmlValueError


MAX_TIMEOUT_S = 86400.0  # a day: longer ones overflow the socket module's clock
QUICK_S = 2.0            # how long a server that is up takes to accept a connection, at most


def parse_endpoint(endpoint: str, fn: str = "endpoint") -> tuple[str, int]:
    """(host, port) of ``"host:port"``; what C receives is checked like every string sent to it (no NUL)."""
    if not isinstance(endpoint, str):
        raise GgmlTypeError(f"{fn}: endpoint must be a str 'host:port', got {endpoint!r}")
    c_string(fn, "endpoint", endpoint)
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise GgmlValueError(f"{fn}: endpoint must be 'host:port' with a port in 1..65535, got {endpoint!r}")
    if not host.isascii() or not host.isprintable() or any(c.isspace() for c in host):
        raise GgmlValueError(f"{fn}: the host of endpoint {endpoint!r} must be an IP address or an ASCII host name")
    return host, int(port)


def timeout_arg(fn: str, timeout: object) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise GgmlTypeError(f"{fn}: timeout must be a number of seconds, got {timeout!r}")
    t = float(timeout)
    if not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
        raise GgmlValueError(f"{fn}: timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:g}], got {timeout!r}")
    return t


def answers(host: str, port: int, seconds: float = QUICK_S) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` within ``seconds``."""
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return True
    except (OSError, UnicodeError, ValueError):  # unreachable, unknown or unencodable host name
        return False
