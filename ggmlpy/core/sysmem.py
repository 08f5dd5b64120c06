"""How much memory this process may still allocate: physical memory, /proc/meminfo, cgroup limits and
rlimits, read before a large ggml allocation so that it raises MemoryError instead of being killed.
"""
from __future__ import annotations

import functools
import os

from ..errors import GgmlValueError


@functools.lru_cache(maxsize=1)
def physical_memory() -> int:
    """Bytes of physical memory (RAM plus swap when /proc/meminfo says so); 2**62 when unknown. Read once."""
    total = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "SwapTotal"):
                    total += int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        total = 0
    if total <= 0:
        try:
            total = int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            total = 1 << 62
    return total


def _read_kv(path: str) -> dict[str, int]:
    """'key value [kB]' lines of a /proc or cgroup file as bytes (kB converted); {} if unreadable."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.replace(":", " ").split()
                if len(parts) >= 2 and parts[1].isdigit():
                    out[parts[0]] = int(parts[1]) * (1024 if parts[2:3] == ["kB"] else 1)
    except (OSError, ValueError):
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
        return int(text) if text.isdigit() else None
    except (OSError, ValueError):
        return None


def _cgroup_available() -> int | None:
    """Bytes this process's memory cgroup (a container's limit) still allows, or None without a limit."""
    roots = [("/sys/fs/cgroup", "memory.max", "memory.current"),                       # cgroup v2
             ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes")]  # cgroup v1
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.strip().split(":", 2) for line in f]
    except OSError:
        lines = []
    best = None
    for root, limit_file, usage_file in roots:
        rel = next((p for _, ctrl, p in (x for x in lines if len(x) == 3)
                    if (ctrl == "" and root.endswith("cgroup")) or "memory" in ctrl.split(",")), "/")
        for d in dict.fromkeys((os.path.join(root, rel.lstrip("/")), root)):
            limit, usage = _read_int(os.path.join(d, limit_file)), _read_int(os.path.join(d, usage_file))
            if limit is None or usage is None or limit >= 1 << 60:
                continue
            stat = _read_kv(os.path.join(d, "memory.stat"))
            reclaimable = stat.get("inactive_file", stat.get("total_inactive_file", 0))
            free = max(0, limit - usage + reclaimable)
            best = free if best is None else min(best, free)
            break
    return best


def available_memory() -> int:
    """Bytes a new allocation can have now (not only the machine's total): /proc/meminfo's MemAvailable plus
    free swap, less under a container's memory limit (cgroup) and, with strict overcommit
    (vm.overcommit_memory=2), under CommitLimit - Committed_AS. physical_memory() when unknown."""
    info = _read_kv("/proc/meminfo")
    if "MemAvailable" not in info:
        return physical_memory()
    avail = info["MemAvailable"] + info.get("SwapFree", 0)
    if _read_int("/proc/sys/vm/overcommit_memory") == 2 and "CommitLimit" in info:
        avail = min(avail, max(0, info["CommitLimit"] - info.get("Committed_AS", 0)))
    cgroup = _cgroup_available()
    if cgroup is not None:
        avail = min(avail, cgroup)
    limited = _rlimit_available()
    if limited is not None:
        avail = min(avail, limited)
    return avail


def _rlimit_available() -> int | None:
    """What the process's own limits leave (``ulimit -v``: RLIMIT_AS against VmSize, ``ulimit -d``: RLIMIT_DATA
    against VmData, as on many clusters): malloc fails beyond them whatever the machine has free. None when
    unlimited."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    status = _read_kv("/proc/self/status")
    room = []
    for limit, used in ((getattr(resource, "RLIMIT_AS", None), "VmSize"),
                        (getattr(resource, "RLIMIT_DATA", None), "VmData")):
        if limit is None:
            continue
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY and used in status:
            room.append(max(0, soft - status[used]))
    return min(room) if room else None


# Allocations below this size are not checked against the available memory (reading it costs file reads).
_SMALL_ALLOCATION = 64 << 20


def check_fits_memory(fn: str, what: str, nbytes: int, fix: str) -> None:
    """Refuse an allocation larger than the memory available now (ggml would abort when malloc fails, C++
    throw bad_alloc, or the kernel kill the process once the memory is touched)."""
    limit = physical_memory()
    if nbytes > limit:
        raise GgmlValueError(f"{fn}: {what} needs {nbytes} bytes, more than this machine's memory ({limit} bytes); "
                             f"{fix}")
    if nbytes > _SMALL_ALLOCATION:
        avail = available_memory()
        if nbytes > avail:
            raise GgmlValueError(f"{fn}: {what} needs {nbytes} bytes, more than the memory available now "
                                 f"({avail} of {limit} bytes; other processes or a container limit use the rest); "
                                 f"{fix}")
