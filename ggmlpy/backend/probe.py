"""Whether a backend really runs an op: CPU kernels are probed once in a helper process (a missing kernel
aborts ggml), cached on disk, and a buffer is checked usable by the backend that computes.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from .._ffi import BUILD_INFO, CData, ffi, lib, LIB_DIR


if TYPE_CHECKING:
    from .backend import Backend

_NO_COMPUTE = {"NONE", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"}
_F32 = int(lib.GGML_TYPE_F32)
# op_params (int32[16]) lie between ``op`` and ``flags`` in struct ggml_tensor (not in the cdef)
_OP_PARAMS_AT = ffi.offsetof("struct ggml_tensor", "op") + 4
_N_OP_PARAMS = (ffi.offsetof("struct ggml_tensor", "flags") - _OP_PARAMS_AT) // 4
PROBE_TIMEOUT_S = 60.0
_MAX_PROBE_BYTES = 1 << 28  # larger instances are not run (assumed supported, as supports_op says)

_lock = threading.Lock()
_known: dict[str, tuple[bool, str]] = {}
_disk_loaded = [False]
_helper: list[_Helper | None] = [None]
_log = logging.getLogger(__name__)


def _op_name(p: CData) -> str:
    return ffi.string(lib.ggml_op_name(p.op)).decode()


def _layout(t: CData) -> tuple[int, bool, bool]:
    return (int(t.type), bool(lib.ggml_is_contiguous(t)), int(t.nb[0]) == int(lib.ggml_type_size(t.type)))


def signature(p: CData) -> str | None:
    """The key of node ``p``'s kernel choice, or None when it needs no run (nothing to compute, or all
    contiguous F32)."""
    name = _op_name(p)
    if name in _NO_COMPUTE or "CUSTOM" in name or name.startswith("MAP"):
        return None  # custom ops carry function pointers: never run them elsewhere
    tensors = [p] + [s for s in p.src if s != ffi.NULL]
    if all(t.type == _F32 and lib.ggml_is_contiguous(t) for t in tensors):
        return None
    params = ffi.unpack(ffi.cast("int32_t *", ffi.cast("char *", p) + _OP_PARAMS_AT), _N_OP_PARAMS)
    srcs = [_layout(s) if s != ffi.NULL else None for s in p.src]
    while srcs and srcs[-1] is None:
        srcs.pop()
    return json.dumps([name, list(params), _layout(p), srcs])


def _describe(p: CData) -> dict:
    def one(t: CData) -> dict | None:
        if t == ffi.NULL:
            return None
        return {"type": int(t.type), "ne": [int(t.ne[i]) for i in range(4)], "nb": [int(t.nb[i]) for i in range(4)]}
    srcs = [one(s) for s in p.src]
    while srcs and srcs[-1] is None:
        srcs.pop()
    return {"op": int(p.op), "params": list(ffi.unpack(ffi.cast("int32_t *", ffi.cast("char *", p) + _OP_PARAMS_AT),
                                                       _N_OP_PARAMS)),
            "dst": one(p), "srcs": srcs}


def _span(d: dict) -> int:
    size = int(lib.ggml_type_size(d["type"]))
    blck = int(lib.ggml_blck_size(d["type"]))
    # the last byte any element can be at, dim 0 included: a transposed source has its large stride there
    rows = [d["ne"][0] // max(blck, 1)] + list(d["ne"][1:4])
    return size + sum((rows[i] - 1) * d["nb"][i] for i in range(4)) + 64


def cpu_kernel_runs(p: CData) -> tuple[bool, str]:
    """(True, "") when ggml's CPU backend can compute node ``p`` (tensor pointer); (False, ggml's message)
    when its kernel aborts on these types or layouts."""
    sig = signature(p)
    if sig is None or os.environ.get("GGMLPY_PROBE_KERNELS", "1") == "0":
        return True, ""
    with _lock:
        found = _known.get(sig)
        if found is None:
            _load_disk()
            found = _known.get(sig)
        if found is None:
            desc = _describe(p)
            if sum(_span(d) for d in [desc["dst"], *desc["srcs"]] if d) > _MAX_PROBE_BYTES:
                return True, ""
            found = _probe(desc)
            if found is None:  # the helper could not run at all: trust supports_op
                return True, ""
            _known[sig] = found
            _save_disk(sig, found)
    return found


# ---------------------------------------------------------------- the disk cache

def _cache_file() -> Path:
    root = Path(os.environ.get("GGMLPY_CACHE") or Path.home() / ".cache" / "ggmlpy")
    build = json.dumps(BUILD_INFO, sort_keys=True)
    stamp = []
    for f in sorted(LIB_DIR.glob("*ggml*")):
        try:
            st = f.stat()
            stamp.append(f"{f.name}:{st.st_size}:{int(st.st_mtime)}")
        except OSError:
            pass
    key = hashlib.sha1((build + "|".join(stamp)).encode()).hexdigest()[:16]
    return root / f"cpu-kernels-{key}.json"


def _load_disk() -> None:
    if _disk_loaded[0]:
        return
    _disk_loaded[0] = True
    try:
        data = json.loads(_cache_file().read_text())
        for sig, (ok, msg) in data.items():
            _known.setdefault(sig, (bool(ok), str(msg)))
    except (OSError, ValueError, TypeError):
        pass


def _save_disk(sig: str, found: tuple[bool, str]) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        data[sig] = list(found)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cpu-kernels-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass


# ---------------------------------------------------------------- the helper process

def _probe(desc: dict) -> tuple[bool, str] | None:
    """Run one op in the helper; restarts it after an abort. None if no helper can be started."""
    for _ in range(2):
        helper = _helper[0]
        if helper is None or helper.proc.poll() is not None:
            if helper is not None:
                helper.close()
            try:
                helper = _helper[0] = _Helper()
            except OSError:
                return None
        answer = helper.ask(desc)
        if helper.proc.poll() is not None or answer is None:  # it aborted (the answer) or never read the request
            helper.close()
            _helper[0] = None
        if answer is not None:
            return answer
    return None


@atexit.register
def _stop_helper() -> None:
    if _helper[0] is not None:
        _helper[0].close()
        _helper[0] = None


HELPER_CODE = "from ggmlpy.backend.probe import _serve; _serve()"


class _Helper:
    def __init__(self) -> None:
        env = dict(os.environ)
        env["GGML_NO_BACKTRACE"] = "1"
        env["GGMLPY_PROBE_KERNELS"] = "0"
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", HELPER_CODE],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, env=env,
                                     cwd=root)
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def close(self) -> None:
        """End the helper (it exits when its input closes) and release its pipes."""
        for f in (self.stdin, self.stdout):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()

    def ask(self, desc: dict) -> tuple[bool, str] | None:
        try:
            self.stdin.write((json.dumps(desc) + "\n").encode())
            self.stdin.flush()
        except OSError:
            return None
        sel = selectors.DefaultSelector()
        sel.register(self.stdout, selectors.EVENT_READ)
        ready = sel.select(PROBE_TIMEOUT_S)
        sel.close()
        if not ready:
            self.proc.kill()
            self.proc.wait()
            return False, f"the kernel did not finish within {PROBE_TIMEOUT_S:.0f} s on a small input"
        line = self.stdout.readline()
        if line.strip() == b"ok":
            return True, ""
        self.proc.wait()
        self.err.seek(0)
        text = self.err.read().decode("utf-8", "replace")
        reason = next((ln.split("ggml is aborting the process:", 1)[1].strip() for ln in reversed(text.splitlines())
                       if "aborting the process" in ln), "")
        if not reason and self.proc.returncode >= 0 and "GGML_ASSERT" not in text:
            # the helper exited by itself (a Python error, not a kernel's abort): no answer, nothing cached
            _log.warning("ggmlpy's CPU kernel probe failed (exit code %s): %s", self.proc.returncode,
                         text.strip().splitlines()[-1:] or "no output")
            return None
        if not reason:
            reason = next((ln.strip() for ln in reversed(text.splitlines()) if "GGML_ASSERT" in ln or "error" in ln),
                          f"the process ended with code {self.proc.returncode}")
        return False, reason


def _serve() -> None:  # pragma: no cover - runs in the helper process
    """The helper's loop: one JSON description per line in, "ok" per line out; an unsupported kernel
    aborts the process (which is the answer)."""
    backend = lib.ggml_backend_dev_init(lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU), ffi.NULL)
    lib.ggmlpy_cpu_set_n_threads(backend, 1)
    for line in sys.stdin:
        desc = json.loads(line)
        _run_one(backend, desc)
        sys.stdout.write("ok\n")
        sys.stdout.flush()


def _run_one(backend: CData, desc: dict) -> None:  # pragma: no cover - runs in the helper process
    n = 2 + len(desc["srcs"])
    params = ffi.new("struct ggml_init_params *", {"mem_size": n * int(lib.ggml_tensor_overhead())
                                                   + int(lib.ggml_graph_overhead_custom(16, False)) + 4096,
                                                   "mem_buffer": ffi.NULL, "no_alloc": True})
    ctx = lib.ggml_init(params[0])
    keep = []
    try:
        def make(d: dict) -> CData:
            t = lib.ggml_new_tensor_4d(ctx, d["type"], *d["ne"])
            for i in range(4):
                t.nb[i] = d["nb"][i]
            mem = ffi.new("char[]", _span(d))
            keep.append(mem)
            t.data = mem
            return t
        dst = make(desc["dst"])
        dst.op = desc["op"]
        ffi.memmove(ffi.cast("char *", dst) + _OP_PARAMS_AT, ffi.new("int32_t[]", desc["params"]), 4 * _N_OP_PARAMS)
        for i, s in enumerate(desc["srcs"]):
            if s is not None:
                dst.src[i] = make(s)
        graph = lib.ggml_new_graph_custom(ctx, 16, False)
        lib.ggml_build_forward_expand(graph, dst)
        lib.ggml_backend_graph_compute(backend, graph)
    finally:
        lib.ggml_free(ctx)


def buffer_usable(backend: Backend, buf: CData) -> bool:
    """Whether ``backend`` (a Backend) can compute on tensors in buffer ``buf`` (the CPU: host memory; a
    device backend: its own buffers)."""
    if backend.is_cpu:
        return bool(lib.ggml_backend_buffer_is_host(buf))
    buft = lib.ggml_backend_buffer_get_type(buf)
    return buft == lib.ggml_backend_get_default_buffer_type(backend.ptr) or \
        buft == lib.ggml_backend_dev_buffer_type(lib.ggml_backend_get_device(backend.ptr))


def backend_runs(backend: Backend, p: CData) -> tuple[bool, str]:
    """Whether ``backend`` implements node ``p`` for its types and layouts: ggml's ``supports_op``, confirmed
    for the CPU by running its kernel once (``cpu_kernel_runs``: the CPU answers True for kernels that abort)."""
    if not lib.ggml_backend_supports_op(backend.ptr, p):
        return False, f"{backend.name} does not implement it (ggml_backend_supports_op)"
    if backend.is_cpu:
        ok, why = cpu_kernel_runs(p)
        if not ok:
            where = why.split("/src/", 1)[-1]
            return False, f"ggml's CPU kernel for it aborts ({where})"
    return True, ""
