"""cffi builder (API mode) for ggmlpy._ffi._ggml.

The declarations in decl/*.h are compiled against ggml's real headers, so struct
layouts and enum values come from the compiler, not from hand-typed numbers.
The extension links libggml and libggml-base from ggmlpy/lib/ (built by
build_ggml.py) and finds them at run time through an $ORIGIN rpath.
"""
from __future__ import annotations

from pathlib import Path

import cffi


HERE = Path(__file__).resolve().parent
PKG = HERE.parent
ROOT = PKG.parent
LIB_DIR = PKG / "lib"
INCLUDE_DIR = ROOT / "vendor" / "ggml" / "include"
DECL_ORDER = ["types.h", "ggml.h", "ggml-backend.h", "ggml-opt.h", "gguf.h", "quants.h", "extras.h"]
# ggml-quants.h's functions (exported by libggml-base) take internal block types: declared here with void *
QUANT_PROTOTYPES = "\n".join(line for line in (HERE / "decl" / "quants.h").read_text().splitlines()
                              if line.startswith(("void quantize_row", "void dequantize_row", "void iq2xs",
                                                  "void iq3xs")))

# Backend-specific functions live in modules loaded at run time (GGML_BACKEND_DL);
# these shims find them through the registry so Python never handles raw function pointers.
SHIMS = r"""
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-opt.h"
#include "gguf.h"
#include "ggml-rpc.h"  /* only its protocol version macros: the RPC functions live in the RPC module */

static void * ggmlpy_proc(const char * reg_name, const char * fn) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(reg_name);
    return reg ? ggml_backend_reg_get_proc_address(reg, fn) : NULL;
}

static int ggmlpy_cpu_set_n_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (!dev) return 0;
    ggml_backend_set_n_threads_t fn = (ggml_backend_set_n_threads_t)
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads");
    if (!fn) return 0;
    fn(backend, n_threads);
    return 1;
}

/* The CPU backend's features (ggml_backend_get_features of its registry): {name, value} pairs ending with a
   NULL name, or NULL when the CPU backend has no such entry point. */
static const struct ggml_backend_feature * ggmlpy_cpu_features(void) {
    ggml_backend_get_features_t fn = (ggml_backend_get_features_t) ggmlpy_proc("CPU", "ggml_backend_get_features");
    return fn ? fn(ggml_backend_reg_by_name("CPU")) : NULL;
}

typedef ggml_backend_reg_t (*ggmlpy_rpc_add_server_t)(const char *);
static ggml_backend_reg_t ggmlpy_rpc_add_server(const char * endpoint) {
    ggmlpy_rpc_add_server_t fn = (ggmlpy_rpc_add_server_t) ggmlpy_proc("RPC", "ggml_backend_rpc_add_server");
    return fn ? fn(endpoint) : NULL;
}

/* How long a new connection to an RPC server may take, handshake included (patches/0054); nothing without it. */
typedef void (*ggmlpy_rpc_timeout_t)(int);
static void ggmlpy_rpc_set_connect_timeout_ms(int timeout_ms) {
    ggmlpy_rpc_timeout_t fn = (ggmlpy_rpc_timeout_t) ggmlpy_proc("RPC", "ggml_backend_rpc_set_connect_timeout_ms");
    if (fn) fn(timeout_ms);
}

/* Connections to RPC servers lost so far (patches/0020): 0 without the RPC backend. */
typedef int (*ggmlpy_rpc_lost_t)(void);
static int ggmlpy_rpc_lost_connections(void) {
    /* looked up once it is there: this runs after every tensor transfer */
    static ggmlpy_rpc_lost_t fn = NULL;
    if (!fn) fn = (ggmlpy_rpc_lost_t) ggmlpy_proc("RPC", "ggml_backend_rpc_lost_connections");
    return fn ? fn() : 0;
}

/* The most bytes one storage-buffer binding of a Vulkan device covers (patches/0041), 0 for another device. */
typedef size_t (*ggmlpy_vk_range_t)(ggml_backend_dev_t);
static size_t ggmlpy_vk_max_storage_buffer_range(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    if (!reg || reg != ggml_backend_reg_by_name("Vulkan")) return 0;
    ggmlpy_vk_range_t fn =
        (ggmlpy_vk_range_t) ggml_backend_reg_get_proc_address(reg, "ggmlpy_vk_max_storage_buffer_range");
    return fn ? fn(dev) : 0;
}

/* On a lavapipe device, the loop iterations that made ggml-vulkan refuse an op (its shader would pass lavapipe's
   65535: patches/0046); 0 for another device, or an op below that. */
typedef uint64_t (*ggmlpy_vk_loops_t)(ggml_backend_dev_t, const struct ggml_tensor *);
static uint64_t ggmlpy_vk_shader_loops_refused(ggml_backend_dev_t dev, const struct ggml_tensor * op) {
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    if (!reg || reg != ggml_backend_reg_by_name("Vulkan")) return 0;
    ggmlpy_vk_loops_t fn = (ggmlpy_vk_loops_t) ggml_backend_reg_get_proc_address(reg, "ggmlpy_vk_shader_loops_refused");
    return fn ? fn(dev, op) : 0;
}

/* Per-node times of the CPU graph computes the calling thread makes (patches/0079): the layout ggml-cpu.c writes. */
struct ggmlpy_cpu_node_time {
    const struct ggml_tensor * first;
    const struct ggml_tensor * last;
    int64_t nodes;
    int64_t ns;
};
struct ggmlpy_cpu_node_timer {
    struct ggmlpy_cpu_node_time * times;
    int64_t capacity;
    int64_t count;
};
typedef struct ggmlpy_cpu_node_timer * (*ggmlpy_cpu_timer_t)(struct ggmlpy_cpu_node_timer *);
/* The calling thread's timer set to `timer` (NULL: none), *previous the one it replaces; 0 without the entry point. */
static int ggmlpy_cpu_node_timer_set(struct ggmlpy_cpu_node_timer * timer, struct ggmlpy_cpu_node_timer ** previous) {
    ggmlpy_cpu_timer_t fn = (ggmlpy_cpu_timer_t) ggmlpy_proc("CPU", "ggmlpy_cpu_set_node_timer");
    if (!fn) return 0;
    struct ggmlpy_cpu_node_timer * replaced = fn(timer);
    if (previous) *previous = replaced;
    return 1;
}
static int ggmlpy_cpu_node_timer_available(void) {
    return ggmlpy_proc("CPU", "ggmlpy_cpu_set_node_timer") != NULL;
}

typedef void (*ggmlpy_rpc_start_server_t)(const char *, const char *, size_t, size_t, ggml_backend_dev_t *);
static int ggmlpy_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads,
                                   size_t n_devices, ggml_backend_dev_t * devices) {
    ggmlpy_rpc_start_server_t fn = (ggmlpy_rpc_start_server_t) ggmlpy_proc("RPC", "ggml_backend_rpc_start_server");
    if (!fn) return 0;
    fn(endpoint, cache_dir, n_threads, n_devices, devices);  /* blocks while serving */
    return 1;
}
"""


def make_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef("\n".join((HERE / "decl" / name).read_text() for name in DECL_ORDER))
    ffi.set_source(
        "ggmlpy._ffi._ggml",
        SHIMS + "\n" + QUANT_PROTOTYPES + "\n",
        include_dirs=[str(INCLUDE_DIR)],
        library_dirs=[str(LIB_DIR)],
        # The libraries are shipped under their SONAMEs only (libggml.so.0, ...).
        extra_link_args=["-l:libggml.so.0", "-l:libggml-base.so.0", "-Wl,-rpath,$ORIGIN/../lib"],
    )
    return ffi


ffibuilder = make_ffi()

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=str(ROOT), verbose=True)
