"""The loaded ggml library itself: version, timers and the CPU features its kernels were built for
(``ggml_cpu_has_*``).
"""
from __future__ import annotations

import functools
from typing import Callable

from .._ffi import ffi, lib


def ggml_version() -> str:
    """The version of the ggml library ggmlpy runs on, e.g. ``"0.20.2"``.

    Value: a str (ggml's own ``ggml_version()``; ggmlR reports a fixed version string instead).

    Example:
        >>> ggml_version()
        '0.20.2'
    """
    return ffi.string(lib.ggml_version()).decode()


def ggml_time_init() -> None:
    """Initialise ggml's timer (ggmlR calls it before ``ggml_time_ms``/``ggml_time_us``; harmless to repeat).

    Value: None.

    Example:
        >>> ggml_time_init(); t0 = ggml_time_ms()
    """
    lib.ggml_time_init()


def ggml_time_ms() -> int:
    """ggml's monotonic clock in milliseconds (differences measure elapsed time).

    Value: an int (milliseconds).

    Example:
        >>> t0 = ggml_time_ms(); ...; elapsed = ggml_time_ms() - t0
    """
    return int(lib.ggml_time_ms())


def ggml_time_us() -> int:
    """ggml's monotonic clock in microseconds (the clock of ggml's progress bars).

    Value: an int (microseconds).

    Example:
        >>> t0 = ggml_time_us(); ...; elapsed_us = ggml_time_us() - t0
    """
    return int(lib.ggml_time_us())


def ggml_cycles() -> int:
    """ggml's cycle counter (C's ``clock()``: processor time in clock ticks), for low-level benchmarks.

    Value: an int.

    Example:
        >>> c0 = ggml_cycles()
    """
    return int(lib.ggml_cycles())


def ggml_cycles_per_ms() -> int:
    """How many ``ggml_cycles()`` ticks make a millisecond.

    Value: an int.

    Example:
        >>> (ggml_cycles() - c0) / ggml_cycles_per_ms()     # milliseconds of processor time
    """
    return int(lib.ggml_cycles_per_ms())


# ggmlR's ggml_cpu_has_<name> -> the name ggml's CPU backend reports
_HAS = {
    "sse3": "SSE3", "ssse3": "SSSE3", "avx": "AVX", "avx_vnni": "AVX_VNNI", "avx2": "AVX2", "bmi2": "BMI2",
    "f16c": "F16C", "fma": "FMA", "avx512": "AVX512", "avx512_vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI", "avx512_bf16": "AVX512_BF16", "amx_int8": "AMX_INT8", "neon": "NEON",
    "arm_fma": "ARM_FMA", "fp16_va": "FP16_VA", "dotprod": "DOTPROD", "matmul_int8": "MATMUL_INT8",
    "sve": "SVE", "sme": "SME", "riscv_v": "RISCV_V", "vsx": "VSX", "vxe": "VXE", "wasm_simd": "WASM_SIMD",
    "llamafile": "LLAMAFILE",
}
_WHAT = {  # for the docstrings
    "sse3": "x86 SSE3", "ssse3": "x86 SSSE3", "avx": "x86 AVX", "avx_vnni": "x86 AVX-VNNI", "avx2": "x86 AVX2",
    "bmi2": "x86 BMI2", "f16c": "x86 F16C (half-precision conversion)", "fma": "x86 FMA3",
    "avx512": "x86 AVX-512 (foundation)", "avx512_vbmi": "x86 AVX-512 VBMI", "avx512_vnni": "x86 AVX-512 VNNI",
    "avx512_bf16": "x86 AVX-512 BF16", "amx_int8": "x86 AMX INT8", "neon": "ARM NEON", "arm_fma": "ARM FMA",
    "fp16_va": "ARM half-precision vector arithmetic", "dotprod": "ARM dot-product instructions",
    "matmul_int8": "ARM INT8 matrix multiply", "sve": "ARM SVE", "sme": "ARM SME", "riscv_v": "RISC-V vector",
    "vsx": "POWER VSX", "vxe": "IBM Z vector extensions", "wasm_simd": "WebAssembly SIMD",
    "llamafile": "llamafile's tinyBLAS matrix kernels (a build option)",
}


@functools.lru_cache(maxsize=1)
def _features() -> dict[str, str]:
    """{name: value} as ggml's CPU backend reports them (read once: they do not change in a process)."""
    out: dict[str, str] = {}
    p = lib.ggmlpy_cpu_features()
    if p == ffi.NULL:
        return out
    i = 0
    while p[i].name != ffi.NULL:
        out[ffi.string(p[i].name).decode()] = ffi.string(p[i].value).decode() if p[i].value != ffi.NULL else ""
        i += 1
    return out


def _has(name: str) -> bool:
    return _features().get(_HAS[name], "0") not in ("", "0")


def uses_openmp() -> bool:
    """Whether ggml's CPU backend runs its thread pool on OpenMP (a build option, on in ggmlpy's build)."""
    return _features().get("OPENMP", "0") not in ("", "0")


def _make_has(name: str) -> Callable[[], bool]:
    def has() -> bool:
        return _has(name)
    has.__name__ = has.__qualname__ = f"ggml_cpu_has_{name}"
    has.__doc__ = f"""Whether ggml's CPU backend uses {_WHAT[name]} here: built with it and found on this CPU.

    Value: a bool (False for a feature of another architecture).

    Example:
        >>> ggml_cpu_has_{name}()
    """
    return has


# one explicit name per feature, so that IDEs, type checkers and tools/exports.py see each of them
ggml_cpu_has_sse3 = _make_has("sse3")
ggml_cpu_has_ssse3 = _make_has("ssse3")
ggml_cpu_has_avx = _make_has("avx")
ggml_cpu_has_avx_vnni = _make_has("avx_vnni")
ggml_cpu_has_avx2 = _make_has("avx2")
ggml_cpu_has_bmi2 = _make_has("bmi2")
ggml_cpu_has_f16c = _make_has("f16c")
ggml_cpu_has_fma = _make_has("fma")
ggml_cpu_has_avx512 = _make_has("avx512")
ggml_cpu_has_avx512_vbmi = _make_has("avx512_vbmi")
ggml_cpu_has_avx512_vnni = _make_has("avx512_vnni")
ggml_cpu_has_avx512_bf16 = _make_has("avx512_bf16")
ggml_cpu_has_amx_int8 = _make_has("amx_int8")
ggml_cpu_has_neon = _make_has("neon")
ggml_cpu_has_arm_fma = _make_has("arm_fma")
ggml_cpu_has_fp16_va = _make_has("fp16_va")
ggml_cpu_has_dotprod = _make_has("dotprod")
ggml_cpu_has_matmul_int8 = _make_has("matmul_int8")
ggml_cpu_has_sve = _make_has("sve")
ggml_cpu_has_sme = _make_has("sme")
ggml_cpu_has_riscv_v = _make_has("riscv_v")
ggml_cpu_has_vsx = _make_has("vsx")
ggml_cpu_has_vxe = _make_has("vxe")
ggml_cpu_has_wasm_simd = _make_has("wasm_simd")
ggml_cpu_has_llamafile = _make_has("llamafile")


def _count(feature: str) -> int:
    try:
        return int(_features().get(feature, "0"))
    except ValueError:
        return 0


def ggml_cpu_get_sve_cnt() -> int:
    """The SVE vector length in bytes ggml's CPU backend found (ARM), 0 without SVE.

    Value: an int.

    Example:
        >>> ggml_cpu_get_sve_cnt()
        0
    """
    return _count("SVE_CNT")


def ggml_cpu_get_rvv_vlen() -> int:
    """The RISC-V vector register length in bytes ggml's CPU backend found, 0 without RVV.

    Value: an int.

    Example:
        >>> ggml_cpu_get_rvv_vlen()
        0
    """
    return _count("RVV_VLEN")


def ggml_cpu_features() -> dict:
    """Every CPU feature ggml knows, in one dict: what each ``ggml_cpu_has_*`` says, plus the SVE and RVV
    vector lengths (ggmlR's named list).

    Value: a dict ``{"sse3": bool, ..., "llamafile": bool, "sve_cnt": int, "rvv_vlen": int}``.

    Example:
        >>> f = ggml_cpu_features()
        >>> f["avx2"], f["neon"]
        (True, False)
    """
    out: dict = {name: _has(name) for name in _HAS}
    out["sve_cnt"] = ggml_cpu_get_sve_cnt()
    out["rvv_vlen"] = ggml_cpu_get_rvv_vlen()
    return out
