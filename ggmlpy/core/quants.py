"""ggmlR's quantization family: float32 data to ggml's block formats and back, on ggml's own functions
(``ggml_quantize_chunk``, ggml-quants' ``quantize_row_*_ref`` and ``dequantize_row_*``). numpy in, ``bytes`` out
(and back): a quantized row is the bytes a GGUF file or a ggml tensor of that type holds.

Per type: ``quantize_<type>(src_data, n_rows, n_per_row, imatrix=None)`` (the whole-matrix quantizer, importance
weighted where the type uses an importance matrix), ``quantize_row_<type>_ref(src_data, n_elements)`` (the reference
row quantizer, no importance matrix) and ``dequantize_row_<type>(raw_data, n_elements)``. Types whose quantizer needs
an importance matrix (``ggml_quantize_requires_imatrix``: IQ2_XXS, IQ2_XS, IQ1_S) refuse a call without one.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._ffi import ffi, lib
from ..errors import GgmlTypeError, GgmlValueError
from .args import is_int
from .types import checked_type, type_name


# (ggmlR's name, ggml type constant's name, bits per weight) of every type the family covers
TYPES = {
    "q1_0": ("Q1_0", 1.125), "q4_0": ("Q4_0", 4.5), "q4_1": ("Q4_1", 5.0), "q5_0": ("Q5_0", 5.5),
    "q5_1": ("Q5_1", 6.0), "q8_0": ("Q8_0", 8.5), "q8_1": ("Q8_1", 9.0), "q2_K": ("Q2_K", 2.625),
    "q3_K": ("Q3_K", 3.4375), "q4_K": ("Q4_K", 4.5), "q5_K": ("Q5_K", 5.5), "q6_K": ("Q6_K", 6.5625),
    "q8_K": ("Q8_K", 9.125), "iq2_xxs": ("IQ2_XXS", 2.0625), "iq2_xs": ("IQ2_XS", 2.3125), "iq2_s": ("IQ2_S", 2.5625),
    "iq3_xxs": ("IQ3_XXS", 3.0625), "iq3_s": ("IQ3_S", 3.4375), "iq1_s": ("IQ1_S", 1.5625), "iq1_m": ("IQ1_M", 1.75),
    "iq4_nl": ("IQ4_NL", 4.5), "iq4_xs": ("IQ4_XS", 4.25), "tq1_0": ("TQ1_0", 1.6875), "tq2_0": ("TQ2_0", 2.0625),
    "mxfp4": ("MXFP4", 4.25), "nvfp4": ("NVFP4", 4.5),
}
# which of ggmlR's functions exist for which types (ggmlR 0.8.x's exports)
QUANTIZE = ("q1_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq2_xxs", "iq2_xs",
            "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4", "nvfp4")
ROW_REF = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q8_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K", "iq3_xxs",
           "iq3_s", "iq2_s", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0", "mxfp4")
DEQUANTIZE = ("q1_0", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "q8_K",
              "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m", "iq4_nl", "iq4_xs", "tq1_0", "tq2_0",
              "mxfp4", "nvfp4")


# ggml's quantization tables are global: ggml_quantize_free in one thread while another quantizes would free them
# under it. Every call that reads or frees them holds this lock.
TABLES = threading.RLock()


def ggml_type_of(name: str) -> int:
    return int(getattr(lib, f"GGML_TYPE_{TYPES[name][0]}"))


def type_by_name(name: object, fn: str) -> int:
    """The quantized ggml type a name stands for ("q8_0", "Q4_K", ...), or a ValueError naming the choices."""
    key = {k.lower(): k for k in QUANTIZE}.get(str(name).lower()) if isinstance(name, str) else None
    if key is None:
        raise GgmlValueError(f"{fn}: {name!r} is not a quantization type; expected one of {', '.join(QUANTIZE)}")
    return ggml_type_of(key)


def quantize_rows(t: int, rows: np.ndarray, fn: str) -> bytes:
    """A 2-D float array's rows quantized to type ``t`` (whose block size divides the rows' length)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    imatrix = np.ones(rows.shape[1], np.float32) if lib.ggml_quantize_requires_imatrix(t) else None
    return _chunk(fn, t, rows, rows.shape[0], rows.shape[1], imatrix)


def dequantize_bytes(t: int, raw: bytes, n: int) -> np.ndarray:
    """``n`` float32 values from the bytes of ``n`` values of quantized type ``t`` (ggml's own decoder)."""
    name = next((k for k in DEQUANTIZE if ggml_type_of(k) == t), None)
    if name is None:
        raise GgmlTypeError(f"ggml has no decoder of {type_name(t)} data")
    return globals()[f"dequantize_row_{name}"](raw, n)


@dataclass(frozen=True)
class QuantizedArray:
    """An array's values in a quantized type as ggml stores them (a quantized model's weight, a quantized file's
    tensor): its type, its bytes, its shape in numpy order (ggml's ne reversed). Copies of it stay bit-identical
    where floats would be quantized again."""
    type: int
    data: bytes
    shape: tuple[int, ...]

    def floats(self) -> np.ndarray:
        """The values decoded to float32 (ggml's own decoder), in ``shape``."""
        return dequantize_bytes(self.type, self.data, int(np.prod(self.shape, dtype=np.int64))).reshape(self.shape)


def _floats(fn: str, data: object, n: int, what: str = "src_data") -> np.ndarray:
    arr = np.asarray(data)
    if arr.dtype.kind not in "fiu" or arr.dtype == np.bool_:
        raise GgmlTypeError(f"{fn}: {what} must be numbers, got {arr.dtype}")
    flat = np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)
    if flat.size != n:
        raise GgmlValueError(f"{fn}: {what} has {flat.size} values, expected {n}")
    if not np.isfinite(flat).all():
        raise GgmlValueError(f"{fn}: {what} holds NaN or infinite values, which no block format stores")
    return flat


def _count(fn: str, name: str, v: object, block: int = 1) -> int:
    if not is_int(v) or int(v) < 1:
        raise GgmlValueError(f"{fn}: {name} must be an int >= 1, got {v!r}")
    if int(v) % block:
        raise GgmlValueError(f"{fn}: {name} must be a multiple of the type's block size {block}, got {v}")
    return int(v)


def _chunk(fn: str, t: int, src_data: object, n_rows: object, n_per_row: object, imatrix: object) -> bytes:
    block = int(lib.ggml_blck_size(t))
    rows, per_row = _count(fn, "n_rows", n_rows), _count(fn, "n_per_row", n_per_row, block)
    src = _floats(fn, src_data, rows * per_row)
    im = ffi.NULL
    if imatrix is not None:
        weights = _floats(fn, imatrix, per_row, "imatrix")
        if (weights < 0).any():
            raise GgmlValueError(f"{fn}: imatrix holds negative importances")
        im = ffi.from_buffer("float[]", weights)
    elif lib.ggml_quantize_requires_imatrix(t):
        raise GgmlValueError(f"{fn}: {type_name(t)} needs an importance matrix (imatrix: n_per_row weights, one per "
                             "column, e.g. the mean squared activation of each input); ggml would abort without one")
    out = bytearray(int(lib.ggml_row_size(t, per_row)) * rows)
    with TABLES:
        written = lib.ggml_quantize_chunk(t, ffi.from_buffer("float[]", src), ffi.from_buffer(out), 0, rows, per_row,
                                          im)
    if int(written) != len(out):
        raise GgmlValueError(f"{fn}: ggml wrote {written} bytes, expected {len(out)}")
    return bytes(out)


def _make_quantize(name: str) -> Callable[..., bytes]:
    t_name, bpw = TYPES[name]

    def quantize(src_data: object, n_rows: int, n_per_row: int, imatrix: object = None) -> bytes:
        return _chunk(f"quantize_{name}", ggml_type_of(name), src_data, n_rows, n_per_row, imatrix)
    quantize.__name__ = quantize.__qualname__ = f"quantize_{name}"
    needs = "required: ggml refuses this type without one" if name in ("iq2_xxs", "iq2_xs", "iq1_s") else \
        "None: every column alike"
    block = int(lib.ggml_blck_size(ggml_type_of(name)))
    quantize.__doc__ = f"""Quantize float data to {t_name} (blocks of {block} values, {bpw} bits per weight), by rows.

    Arguments:
        src_data: n_rows * n_per_row finite numbers (any shape; read in C order).
        n_rows: the number of rows.
        n_per_row: values per row, a multiple of {t_name}'s block size ({block}).
        imatrix: n_per_row non-negative importances weighting each column's error ({needs}).

    Value: bytes, n_rows * ggml_row_size(GGML_TYPE_{t_name}, n_per_row) of them.

    Example:
        >>> q = quantize_{name}(np.random.randn(4, 256), 4, 256)
    """
    return quantize


def _make_row_ref(name: str) -> Callable[..., bytes]:
    t_name, bpw = TYPES[name]
    c_fn = getattr(lib, f"quantize_row_{name}_ref")

    def quantize_row_ref(src_data: object, n_elements: int) -> bytes:
        fn = f"quantize_row_{name}_ref"
        t = ggml_type_of(name)
        n = _count(fn, "n_elements", n_elements, int(lib.ggml_blck_size(t)))
        src = _floats(fn, src_data, n)
        out = bytearray(int(lib.ggml_row_size(t, n)))
        with TABLES:
            lib.ggml_quantize_init(t)   # the lookup tables some types' reference quantizers read (IQ3, IQ2_S)
            c_fn(ffi.from_buffer("float[]", src), ffi.from_buffer(out), n)
        return bytes(out)
    quantize_row_ref.__name__ = quantize_row_ref.__qualname__ = f"quantize_row_{name}_ref"
    block = int(lib.ggml_blck_size(ggml_type_of(name)))
    quantize_row_ref.__doc__ = f"""Quantize one row to {t_name} (blocks of {block} values, {bpw} bits per weight) with
    ggml's reference quantizer.

    Arguments:
        src_data: n_elements finite numbers.
        n_elements: the row's length, a multiple of {t_name}'s block size ({block}).

    Value: bytes, ggml_row_size(GGML_TYPE_{t_name}, n_elements) of them.

    Example:
        >>> q = quantize_row_{name}_ref(np.random.randn(256), 256)
    """
    return quantize_row_ref


def _make_dequantize(name: str) -> Callable[..., np.ndarray]:
    t_name, bpw = TYPES[name]
    c_fn = getattr(lib, f"dequantize_row_{name}")

    def dequantize_row(raw_data: bytes, n_elements: int) -> np.ndarray:
        fn = f"dequantize_row_{name}"
        t = ggml_type_of(name)
        n = _count(fn, "n_elements", n_elements, int(lib.ggml_blck_size(t)))
        if not isinstance(raw_data, (bytes, bytearray, memoryview, np.ndarray)):
            raise GgmlTypeError(f"{fn}: raw_data must be bytes (a quantize_* result), got {type(raw_data).__name__}")
        raw = bytes(np.ascontiguousarray(raw_data).reshape(-1).view(np.uint8)) if isinstance(raw_data, np.ndarray) \
            else bytes(raw_data)
        need = int(lib.ggml_row_size(t, n))
        if len(raw) != need:
            raise GgmlValueError(f"{fn}: {n_elements} values of {t_name} take {need} bytes, raw_data has {len(raw)}")
        out = np.empty(n, np.float32)
        with TABLES:   # the IQ decoders read the grids too
            c_fn(ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n)
        return out
    dequantize_row.__name__ = dequantize_row.__qualname__ = f"dequantize_row_{name}"
    block = int(lib.ggml_blck_size(ggml_type_of(name)))
    dequantize_row.__doc__ = f"""Decode {t_name} data (blocks of {block} values, {bpw} bits per weight) back to float32.

    Arguments:
        raw_data: the bytes of n_elements / block-size {t_name} blocks (a quantize_{name} result, or a row of one).
        n_elements: the number of values, a multiple of {t_name}'s block size ({block}).

    Value: a float32 numpy array of n_elements values.

    Example:
        >>> x = dequantize_row_{name}(q, 256)          # q: 256 values' worth of {t_name} bytes
    """
    return dequantize_row


# every function of the family, by ggmlR's name (written out: the package's exports and mypy read them)
quantize_q1_0 = _make_quantize("q1_0")
quantize_q4_0 = _make_quantize("q4_0")
quantize_q4_1 = _make_quantize("q4_1")
quantize_q5_0 = _make_quantize("q5_0")
quantize_q5_1 = _make_quantize("q5_1")
quantize_q8_0 = _make_quantize("q8_0")
quantize_q2_K = _make_quantize("q2_K")
quantize_q3_K = _make_quantize("q3_K")
quantize_q4_K = _make_quantize("q4_K")
quantize_q5_K = _make_quantize("q5_K")
quantize_q6_K = _make_quantize("q6_K")
quantize_iq2_xxs = _make_quantize("iq2_xxs")
quantize_iq2_xs = _make_quantize("iq2_xs")
quantize_iq2_s = _make_quantize("iq2_s")
quantize_iq3_xxs = _make_quantize("iq3_xxs")
quantize_iq3_s = _make_quantize("iq3_s")
quantize_iq1_s = _make_quantize("iq1_s")
quantize_iq1_m = _make_quantize("iq1_m")
quantize_iq4_nl = _make_quantize("iq4_nl")
quantize_iq4_xs = _make_quantize("iq4_xs")
quantize_tq1_0 = _make_quantize("tq1_0")
quantize_tq2_0 = _make_quantize("tq2_0")
quantize_mxfp4 = _make_quantize("mxfp4")
quantize_nvfp4 = _make_quantize("nvfp4")
quantize_row_q4_0_ref = _make_row_ref("q4_0")
quantize_row_q4_1_ref = _make_row_ref("q4_1")
quantize_row_q5_0_ref = _make_row_ref("q5_0")
quantize_row_q5_1_ref = _make_row_ref("q5_1")
quantize_row_q8_0_ref = _make_row_ref("q8_0")
quantize_row_q8_1_ref = _make_row_ref("q8_1")
quantize_row_q2_K_ref = _make_row_ref("q2_K")
quantize_row_q3_K_ref = _make_row_ref("q3_K")
quantize_row_q4_K_ref = _make_row_ref("q4_K")
quantize_row_q5_K_ref = _make_row_ref("q5_K")
quantize_row_q6_K_ref = _make_row_ref("q6_K")
quantize_row_q8_K_ref = _make_row_ref("q8_K")
quantize_row_iq3_xxs_ref = _make_row_ref("iq3_xxs")
quantize_row_iq3_s_ref = _make_row_ref("iq3_s")
quantize_row_iq2_s_ref = _make_row_ref("iq2_s")
quantize_row_iq4_nl_ref = _make_row_ref("iq4_nl")
quantize_row_iq4_xs_ref = _make_row_ref("iq4_xs")
quantize_row_tq1_0_ref = _make_row_ref("tq1_0")
quantize_row_tq2_0_ref = _make_row_ref("tq2_0")
quantize_row_mxfp4_ref = _make_row_ref("mxfp4")
dequantize_row_q1_0 = _make_dequantize("q1_0")
dequantize_row_q4_0 = _make_dequantize("q4_0")
dequantize_row_q4_1 = _make_dequantize("q4_1")
dequantize_row_q5_0 = _make_dequantize("q5_0")
dequantize_row_q5_1 = _make_dequantize("q5_1")
dequantize_row_q8_0 = _make_dequantize("q8_0")
dequantize_row_q2_K = _make_dequantize("q2_K")
dequantize_row_q3_K = _make_dequantize("q3_K")
dequantize_row_q4_K = _make_dequantize("q4_K")
dequantize_row_q5_K = _make_dequantize("q5_K")
dequantize_row_q6_K = _make_dequantize("q6_K")
dequantize_row_q8_K = _make_dequantize("q8_K")
dequantize_row_iq2_xxs = _make_dequantize("iq2_xxs")
dequantize_row_iq2_xs = _make_dequantize("iq2_xs")
dequantize_row_iq2_s = _make_dequantize("iq2_s")
dequantize_row_iq3_xxs = _make_dequantize("iq3_xxs")
dequantize_row_iq3_s = _make_dequantize("iq3_s")
dequantize_row_iq1_s = _make_dequantize("iq1_s")
dequantize_row_iq1_m = _make_dequantize("iq1_m")
dequantize_row_iq4_nl = _make_dequantize("iq4_nl")
dequantize_row_iq4_xs = _make_dequantize("iq4_xs")
dequantize_row_tq1_0 = _make_dequantize("tq1_0")
dequantize_row_tq2_0 = _make_dequantize("tq2_0")
dequantize_row_mxfp4 = _make_dequantize("mxfp4")
dequantize_row_nvfp4 = _make_dequantize("nvfp4")


def ggml_quantize_chunk(type: int, src: object, nrows: int, n_per_row: int,  # noqa: A002 - ggmlR's name
                        imatrix: object = None) -> bytes:
    """Quantize float data to any quantized ggml type, row by row (ggml's ``ggml_quantize_chunk``).

    Arguments:
        type: the target type, a quantized GGML_TYPE_* (``GGML_TYPE_Q8_0``, ``GGML_TYPE_Q4_K``, ...).
        src: nrows * n_per_row finite numbers.
        nrows: the number of rows.
        n_per_row: values per row, a multiple of the type's block size.
        imatrix: None, or n_per_row non-negative importances (required by the types
            ``ggml_quantize_requires_imatrix`` names).

    Value: bytes, nrows * ggml_row_size(type, n_per_row) of them.

    Example:
        >>> q = ggml_quantize_chunk(GGML_TYPE_Q8_0, np.random.randn(256), 1, 256)
    """
    fn = "ggml_quantize_chunk"
    t = checked_type(fn, type)
    if not lib.ggml_is_quantized(t):
        raise GgmlValueError(f"{fn}: {type_name(t)} is not a quantized type; expected GGML_TYPE_Q*, IQ*, TQ*, MXFP4 "
                             "or NVFP4")
    if t in (int(lib.GGML_TYPE_Q8_1), int(lib.GGML_TYPE_Q8_K)):
        raise GgmlValueError(f"{fn}: {type_name(t)} is an intermediate type of ggml's dot products, with no "
                             f"whole-matrix quantizer; use quantize_row_{type_name(t).replace('_k', '_K')}_ref")
    return _chunk(fn, t, src, nrows, n_per_row, imatrix)


def ggml_quantize_requires_imatrix(type: int) -> bool:  # noqa: A002 - ggmlR's name
    """Whether quantizing to ``type`` needs an importance matrix (IQ2_XXS, IQ2_XS, IQ1_S: ggml aborts without one).

    Arguments:
        type: a GGML_TYPE_* constant.

    Value: a bool.

    Example:
        >>> ggml_quantize_requires_imatrix(GGML_TYPE_IQ2_XXS)
        True
    """
    return bool(lib.ggml_quantize_requires_imatrix(checked_type("ggml_quantize_requires_imatrix", type)))


def ggml_quantize_init(type: int) -> None:  # noqa: A002 - ggmlR's name
    """Make the lookup tables quantizing to ``type`` reads (the IQ types' grids); the quantizers call it themselves.

    Arguments:
        type: a GGML_TYPE_* constant.

    Value: None.

    Example:
        >>> ggml_quantize_init(GGML_TYPE_IQ2_XS)
    """
    _with_tables(lib.ggml_quantize_init, checked_type("ggml_quantize_init", type))


def ggml_quantize_free() -> None:
    """Free the tables ``ggml_quantize_init`` made (they are made again when needed).

    Value: None.

    Example:
        >>> ggml_quantize_free()
    """
    with TABLES:
        lib.ggml_quantize_free()


def _with_tables(c_fn: Callable[[int], None], arg: int) -> None:
    """A call that makes or frees some of ggml's quantization tables, holding their lock."""
    with TABLES:
        c_fn(arg)


def _grid(fn: str, v: object, allowed: tuple[int, ...], what: str) -> int:
    if not is_int(v) or int(v) not in allowed:
        raise GgmlValueError(f"{fn}: {what} must be one of {allowed}, got {v!r}")
    return int(v)


def iq2xs_init_impl(type: int) -> None:  # noqa: A002 - ggmlR's name
    """Make the IQ2/IQ1 grids for ``type`` (GGML_TYPE_IQ2_XXS, _IQ2_XS, _IQ2_S, _IQ1_S or _IQ1_M).

    Arguments:
        type: one of those GGML_TYPE_* constants.

    Value: None.

    Example:
        >>> iq2xs_init_impl(GGML_TYPE_IQ2_XXS)
    """
    _with_tables(lib.iq2xs_init_impl, _grid("iq2xs_init_impl", type, _IQ2_TYPES, "type"))


def iq2xs_free_impl(type: int) -> None:  # noqa: A002 - ggmlR's name
    """Free the IQ2/IQ1 grids of ``type`` (made again when needed).

    Arguments:
        type: GGML_TYPE_IQ2_XXS, _IQ2_XS, _IQ2_S, _IQ1_S or _IQ1_M.

    Value: None.

    Example:
        >>> iq2xs_free_impl(GGML_TYPE_IQ2_XXS)
    """
    _with_tables(lib.iq2xs_free_impl, _grid("iq2xs_free_impl", type, _IQ2_TYPES, "type"))


def iq3xs_init_impl(grid_size: int) -> None:
    """Make the IQ3 grid of ``grid_size`` points (256: IQ3_XXS, 512: IQ3_S).

    Arguments:
        grid_size: 256 or 512.

    Value: None.

    Example:
        >>> iq3xs_init_impl(256)
    """
    _with_tables(lib.iq3xs_init_impl, _grid("iq3xs_init_impl", grid_size, (256, 512), "grid_size"))


def iq3xs_free_impl(grid_size: int) -> None:
    """Free the IQ3 grid of ``grid_size`` points (made again when needed).

    Arguments:
        grid_size: 256 or 512.

    Value: None.

    Example:
        >>> iq3xs_free_impl(256)
    """
    _with_tables(lib.iq3xs_free_impl, _grid("iq3xs_free_impl", grid_size, (256, 512), "grid_size"))


_IQ2_TYPES = tuple(int(getattr(lib, f"GGML_TYPE_{n}")) for n in ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"))


def ggml_quant_block_info(type: int) -> dict:  # noqa: A002 - ggmlR's name
    """What a ggml type's blocks are: its name, bytes per block, values per block, and whether it is quantized.

    Arguments:
        type: a GGML_TYPE_* constant.

    Value: a dict ``{"type_name", "type_size", "block_size", "is_quantized"}`` (ggmlR's named list).

    Example:
        >>> ggml_quant_block_info(GGML_TYPE_Q4_0)
        {'type_name': 'q4_0', 'type_size': 18, 'block_size': 32, 'is_quantized': True}
    """
    t = checked_type("ggml_quant_block_info", type)
    return {"type_name": type_name(t), "type_size": int(lib.ggml_type_size(t)),
            "block_size": int(lib.ggml_blck_size(t)), "is_quantized": bool(lib.ggml_is_quantized(t))}


def ggml_ftype_to_ggml_type(ftype: int) -> int:
    """The tensor type a whole-model file type (``GGML_FTYPE_MOSTLY_Q4_K``, ...: llama.cpp's file types) stands for.

    Arguments:
        ftype: a GGML_FTYPE_* value (an int from -1, unknown, to the last file type).

    Value: a GGML_TYPE_* int (GGML_TYPE_COUNT for an unknown file type).

    Example:
        >>> ggml_ftype_to_ggml_type(2)        # GGML_FTYPE_MOSTLY_Q4_0
        2
    """
    if not is_int(ftype) or not -1 <= int(ftype) <= int(lib.GGML_FTYPE_MOSTLY_Q2_0):
        raise GgmlValueError(f"ggml_ftype_to_ggml_type: ftype must be a GGML_FTYPE_* value (-1 to "
                             f"{int(lib.GGML_FTYPE_MOSTLY_Q2_0)}), got {ftype!r}")
    if int(ftype) in (5, 6):   # values ggml removed (Q4_2, Q4_3): it would abort
        raise GgmlValueError(f"ggml_ftype_to_ggml_type: file type {ftype} was removed from ggml")
    return int(lib.ggml_ftype_to_ggml_type(int(ftype)))


__all__ = [
    "quantize_q1_0", "quantize_q4_0", "quantize_q4_1", "quantize_q5_0", "quantize_q5_1", "quantize_q8_0",
    "quantize_q2_K", "quantize_q3_K", "quantize_q4_K", "quantize_q5_K", "quantize_q6_K", "quantize_iq2_xxs",
    "quantize_iq2_xs", "quantize_iq2_s", "quantize_iq3_xxs", "quantize_iq3_s", "quantize_iq1_s", "quantize_iq1_m",
    "quantize_iq4_nl", "quantize_iq4_xs", "quantize_tq1_0", "quantize_tq2_0", "quantize_mxfp4", "quantize_nvfp4",
    "quantize_row_q4_0_ref", "quantize_row_q4_1_ref", "quantize_row_q5_0_ref", "quantize_row_q5_1_ref",
    "quantize_row_q8_0_ref", "quantize_row_q8_1_ref", "quantize_row_q2_K_ref", "quantize_row_q3_K_ref",
    "quantize_row_q4_K_ref", "quantize_row_q5_K_ref", "quantize_row_q6_K_ref", "quantize_row_q8_K_ref",
    "quantize_row_iq3_xxs_ref", "quantize_row_iq3_s_ref", "quantize_row_iq2_s_ref", "quantize_row_iq4_nl_ref",
    "quantize_row_iq4_xs_ref", "quantize_row_tq1_0_ref", "quantize_row_tq2_0_ref", "quantize_row_mxfp4_ref",
    "dequantize_row_q1_0", "dequantize_row_q4_0", "dequantize_row_q4_1", "dequantize_row_q5_0",
    "dequantize_row_q5_1", "dequantize_row_q8_0", "dequantize_row_q2_K", "dequantize_row_q3_K",
    "dequantize_row_q4_K", "dequantize_row_q5_K", "dequantize_row_q6_K", "dequantize_row_q8_K",
    "dequantize_row_iq2_xxs", "dequantize_row_iq2_xs", "dequantize_row_iq2_s", "dequantize_row_iq3_xxs",
    "dequantize_row_iq3_s", "dequantize_row_iq1_s", "dequantize_row_iq1_m", "dequantize_row_iq4_nl",
    "dequantize_row_iq4_xs", "dequantize_row_tq1_0", "dequantize_row_tq2_0", "dequantize_row_mxfp4",
    "dequantize_row_nvfp4", "ggml_quantize_chunk", "ggml_quantize_requires_imatrix", "ggml_quantize_init",
    "ggml_quantize_free", "ggml_quant_block_info", "ggml_ftype_to_ggml_type", "iq2xs_init_impl", "iq2xs_free_impl",
    "iq3xs_init_impl", "iq3xs_free_impl",
]
