"""Transformer ops: rotary position embeddings (the rope family), timestep embeddings, flash attention and
relative positions.
"""
from __future__ import annotations

from collections.abc import Sequence

from .._ffi import ffi, lib
from ..core.args import c_int_arg, fail, float_arg, is_int, list_arg
from ..core.glossary import fill_doc
from ..core.types import GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, type_name
from ..errors import GgmlTypeError
from ..graph.backward import check_flash_attn_back_scratch
from ..graph.graph import walk_graph
from ..graph.indices import computed_index_bound
from ..graph.objects import Context, Tensor
from .base import contiguous, F32_F16, make_op, operand, rows_contiguous, types


# rope modes (ggmlR's names; GGML_ROPE_TYPE_NORM is C's GGML_ROPE_TYPE_NORMAL)
GGML_ROPE_TYPE_NORM = int(lib.GGML_ROPE_TYPE_NORMAL)
GGML_ROPE_TYPE_NEOX = int(lib.GGML_ROPE_TYPE_NEOX)
GGML_ROPE_TYPE_MROPE = int(lib.GGML_ROPE_TYPE_MROPE)
GGML_ROPE_TYPE_VISION = int(lib.GGML_ROPE_TYPE_VISION)

_ROPE_1D_MODES = {GGML_ROPE_TYPE_NORM: "GGML_ROPE_TYPE_NORM", GGML_ROPE_TYPE_NEOX: "GGML_ROPE_TYPE_NEOX"}
_ROPE_MULTI_MODES = {**_ROPE_1D_MODES, GGML_ROPE_TYPE_MROPE: "GGML_ROPE_TYPE_MROPE",
                     GGML_ROPE_TYPE_VISION: "GGML_ROPE_TYPE_VISION"}


def _required(fn: str, name: str, value: object, usual: str) -> None:
    if value is None:
        fail(fn, f"{name} is required (ggmlR gives it no default); {usual}", GgmlTypeError)


def shape_text(t: Tensor) -> str:
    return str(list(t.shape))


def check_index_bound(fn: str, what: str, idx: Tensor, bound: int, table: str) -> None:
    """Indices computed in the graph whose range is known (an argmax over k values) must fit ``bound``."""
    k = computed_index_bound(idx.ptr)
    if k is not None and k > bound:
        fail(fn, f"{what} are computed in the graph (from a ggml_argmax over {k} values), so they can be up to "
                     f"{k - 1}, but {table} has only {bound}; ggml would write outside its memory. Take the argmax "
                     f"over at most {bound} values")


# ---------------------------------------------------------------- rotary position embedding

def _rope(fn: str, ctx: Context, a: object, b: object, c: object, n_dims: object, mode: object, n_ctx_orig: object,
          freq_base: object, freq_scale: object, ext_factor: object, attn_factor: object, beta_fast: object,
          beta_slow: object, sections: object, inplace: bool) -> Tensor:
    """The checks shared by every rope variant (ggml_rope_impl's asserts and the CPU kernel's), then the call.
    ``sections`` is None for the 1-D variants (rope, rope_ext), else rope_multi's four section sizes."""
    multi = sections is not None
    a, b = operand(fn, a), operand(fn, b, "b")
    types(fn, a, F32_F16)
    rows_contiguous(fn, a)  # the kernel reads and writes each row as contiguous elements
    _required(fn, "n_dims", n_dims, "the usual value is the head size a.ne[0] (ggml rotates the first n_dims "
                                    "values of each row)")
    n_dims = c_int_arg(fn, "n_dims", n_dims, 1)
    modes = _ROPE_MULTI_MODES if multi else _ROPE_1D_MODES
    if not is_int(mode):
        fail(fn, f"mode must be an int ({', '.join(f'{k}' for k in sorted(modes.values()))}), got {mode!r}",
                 GgmlTypeError)
    if int(mode) not in modes:
        hint = "" if multi else "; the multi-section modes (MROPE, VISION) need ggml_rope_multi"
        fail(fn, f"mode must be one of {', '.join(f'{v} ({k})' for k, v in sorted(modes.items()))}, got "
                     f"{mode!r}{hint}")
    mode = int(mode)
    ne0 = a.shape[0]
    if n_dims % 2 or n_dims > ne0:
        fail(fn, f"n_dims must be even and at most a.ne[0]={ne0} (the values of each row that are rotated, in "
                     f"pairs), got {n_dims}")
    mrope = bool(mode & GGML_ROPE_TYPE_MROPE)
    sect = [0, 0, 0, 0]
    if multi:
        sect = list_arg(fn, "sections", sections, "4 ints")
        if len(sect) != 4 or not all(is_int(s) for s in sect):
            fail(fn, f"sections must be 4 ints (rotated pairs per section: t, h, w, e), got {sections!r}",
                     GgmlTypeError)
        sect = [c_int_arg(fn, f"sections[{i}]", s, 0) for i, s in enumerate(sect)]
        if mrope:
            if sum(sect[:3]) == 0:
                fail(fn, f"with mode {mode} the first three sections must not all be 0, got {sect}")
            if sum(sect) > ne0:
                fail(fn, f"the sections add up to {sum(sect)} pairs, more than a.ne[0]={ne0}")
        if mode == GGML_ROPE_TYPE_VISION and 2 * n_dims != ne0:
            fail(fn, f"GGML_ROPE_TYPE_VISION rotates pairs (i, i + n_dims) over the whole row, so n_dims must be "
                         f"a.ne[0] / 2 = {ne0 / 2:g}, got {n_dims}")
    n_pos = 4 * a.shape[2] if mrope else a.shape[2]
    types(fn, b, {GGML_TYPE_I32}, "b (the positions)")
    if b.shape != (n_pos, 1, 1, 1) or not lib.ggml_is_contiguous(b.ptr):
        per = "4 positions (t, h, w, e) per token: 4 * a.ne[2]" if mrope else "one position per a.ne[2] (token)"
        fail(fn, f"b must be a contiguous I32 vector of {n_pos} positions ({per}), got shape {shape_text(b)}")
    if c is not None:
        c = operand(fn, c, "c")
        types(fn, c, {GGML_TYPE_F32}, "c (the frequency factors)")
        if c.shape[1:] != (1, 1, 1) or c.shape[0] < n_dims // 2 or not lib.ggml_is_contiguous(c.ptr):
            fail(fn, f"c must be a contiguous F32 vector of at least n_dims / 2 = {n_dims // 2} frequency "
                         f"factors, got shape {shape_text(c)}")
        param = int(lib.GGML_TENSOR_FLAG_PARAM)
        if any(t.flags & param for t in walk_graph([c.ptr])):
            # ggml_build_backward_expand aborts on a frequency factor that needs a gradient
            fail(fn, "the frequency factors c are (or are computed from) a trainable parameter, but ggml has no "
                         "gradient for them; use constant factors (a tensor not marked with ggml_set_param)")
    n_ctx_orig = c_int_arg(fn, "n_ctx_orig", n_ctx_orig, 0)
    freq_base = float_arg(fn, "freq_base", freq_base, finite=True)
    freq_scale = float_arg(fn, "freq_scale", freq_scale, finite=True)
    if freq_base <= 0 or freq_scale <= 0:
        fail(fn, f"freq_base and freq_scale must be > 0 (usually 10000 and 1), got {freq_base} and {freq_scale}")
    floats = [float_arg(fn, name, v, finite=True) for name, v in
              (("ext_factor", ext_factor), ("attn_factor", attn_factor), ("beta_fast", beta_fast),
               ("beta_slow", beta_slow))]
    tensors: tuple[Tensor | None, ...]
    args: tuple[object, ...]
    if fn in ("ggml_rope", "ggml_rope_inplace"):  # C's short form: ggml's defaults for the rest
        tensors, args = (a, b), (n_dims, mode)
    elif multi:
        tensors, args = (a, b, c), (n_dims, ffi.new("int[4]", sect), mode, n_ctx_orig, freq_base, freq_scale, *floats)
    else:
        tensors, args = (a, b, c), (n_dims, mode, n_ctx_orig, freq_base, freq_scale, *floats)
    return make_op(fn, ctx, getattr(lib, fn), tensors, None if inplace else a.shape, args, a.type)


_ROPE_ARGS = """a: F32 or F16 tensor ``[head_dim, n_head, n_tokens, batch]`` with contiguous rows.
        b: the positions, a contiguous I32 vector with one position per token (``a.ne[2]`` values)."""
_ROPE_THETA = """Each position ``p`` (token ``i2`` of a) rotates the first ``n_dims`` values of its rows in pairs by the
    angles ``theta_i = p * freq_base**(-2 i / n_dims)``, ``i < n_dims / 2``; the other values are copied.
    ``GGML_ROPE_TYPE_NORM`` (LLaMA) pairs neighbours ``(x[2i], x[2i+1])``, ``GGML_ROPE_TYPE_NEOX``
    (GPT-NeoX, Falcon) pairs the halves ``(x[i], x[i + n_dims/2])``; each pair becomes
    ``(x0 cos - x1 sin, x0 sin + x1 cos)``."""


def ggml_rope(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int = 0) -> Tensor:
    """Rotary position embedding (RoPE) of ``a`` at the positions ``b``, with ggml's default frequencies.

    {theta} The base frequency is 10000; ``ggml_rope_ext`` sets it and the context-extension
    (YaRN) parameters. Differentiable with respect to ``a`` (ggml's backward rotates back).

    Arguments:
        ctx: [glossary]
        {args}
        n_dims: the number of values of each row that are rotated: even, ``<= a.ne[0]`` (usually
            ``a.ne[0]``, the head size).
        mode: ``GGML_ROPE_TYPE_NORM`` (0, the default) or ``GGML_ROPE_TYPE_NEOX`` (2).

    Value: a new Tensor of a's shape and type. Raises GgmlValueError for an odd or too large
    ``n_dims``, another mode or positions of the wrong length, GgmlTypeError for other types.

    Example:
        >>> q = ggml_rope(ctx, q, pos, 64, GGML_ROPE_TYPE_NEOX)   # q [64, n_head, n_tokens], pos I32 [n_tokens]
    """
    return _rope("ggml_rope", ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, None, False)


def ggml_rope_inplace(ctx: Context, a: Tensor, b: Tensor, n_dims: int, mode: int = 0) -> Tensor:
    """Rotary position embedding of ``a`` **in place**: ``ggml_rope`` writing into a's own data.

    The result is a view of ``a``; when the graph runs, a's values are replaced by their rotation.
    For inference only: in-place ops may not lie on the path to a trainable parameter (use
    ``ggml_rope`` there).

    Arguments:
        ctx: [glossary: header]
        {args}
        n_dims: the number of values of each row that are rotated: even, ``<= a.ne[0]``.
        mode: ``GGML_ROPE_TYPE_NORM`` (0, the default) or ``GGML_ROPE_TYPE_NEOX`` (2).

    Value: a Tensor of a's shape and type viewing a's data.

    Example:
        >>> k = ggml_rope_inplace(ctx, k, pos, 64)
    """
    return _rope("ggml_rope_inplace", ctx, a, b, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0, None, True)


_ROPE_EXT_ARGS = """c: None (the default) or the frequency factors: a contiguous F32 vector of at least ``n_dims / 2``
            values, dividing the angles (``theta_i / c[i]``, as in Phi-3 long-context models). They get no
            gradient: c may not be (or be computed from) a trainable parameter.
        n_dims: the number of values of each row that are rotated: even, ``<= a.ne[0]``. Required (ggmlR
            gives it no default; None raises GgmlTypeError).
        {mode}
        n_ctx_orig: the context length the model was trained with, used by YaRN (an int >= 0, default 0).
        freq_base: the base frequency (> 0, default 10000; 500000 for LLaMA 3).
        freq_scale: the factor applied to every angle (> 0, default 1.0; ``n_ctx_orig / n_ctx`` for linear
            scaling).
        ext_factor: YaRN's extrapolation mix (default 0.0: YaRN off).
        attn_factor: the magnitude scale of the rotated values (default 1.0).
        beta_fast: YaRN's high correction dimension parameter (default 32.0).
        beta_slow: YaRN's low correction dimension parameter (default 1.0)."""
_ROPE_EXT_MODE = "mode: ``GGML_ROPE_TYPE_NORM`` (0, the default) or ``GGML_ROPE_TYPE_NEOX`` (2)."


def ggml_rope_ext(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None = None, n_dims: int | None = None,
                  mode: int = 0, n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
                  ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
                  beta_slow: float = 1.0) -> Tensor:
    """Rotary position embedding with every ggml option: frequency base and factors, linear and YaRN scaling.

    {theta} ``freq_scale`` multiplies every angle, ``c`` divides ``theta_i`` by ``c[i]``,
    ``attn_factor`` scales the rotated values, and ``ext_factor > 0`` turns on YaRN (mixing
    interpolated and extrapolated angles between the correction dimensions set by ``beta_fast``,
    ``beta_slow`` and ``n_ctx_orig``). Differentiable with respect to ``a`` (not to ``c``).

    Arguments:
        ctx: [glossary]
        {args}
        {ext}

    Value: a new Tensor of a's shape and type.

    Example:
        >>> q = ggml_rope_ext(ctx, q, pos, None, 128, GGML_ROPE_TYPE_NEOX, 8192, 500000.0)
    """
    return _rope("ggml_rope_ext", ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, None, False)


def ggml_rope_ext_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None = None, n_dims: int | None = None,
                          mode: int = 0, n_ctx_orig: int = 0, freq_base: float = 10000.0, freq_scale: float = 1.0,
                          ext_factor: float = 0.0, attn_factor: float = 1.0, beta_fast: float = 32.0,
                          beta_slow: float = 1.0) -> Tensor:
    """``ggml_rope_ext`` **in place**: the rotation is written into a's own data.

    The result is a view of ``a``. For inference only: in-place ops may not lie on the path to a
    trainable parameter (use ``ggml_rope_ext`` there).

    Arguments:
        ctx: [glossary: header]
        {args}
        {ext}

    Value: a Tensor of a's shape and type viewing a's data.

    Example:
        >>> k = ggml_rope_ext_inplace(ctx, k, pos, None, 128, GGML_ROPE_TYPE_NEOX, 0, 1e6)
    """
    return _rope("ggml_rope_ext_inplace", ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, None, True)


_ROPE_MULTI_DOC = """For ``GGML_ROPE_TYPE_MROPE`` (Qwen2-VL) and ``GGML_ROPE_TYPE_VISION`` each token has four positions
    (time, height, width, extra): ``b`` holds ``4 * a.ne[2]`` values, all first positions, then all
    second ones, and so on. ``sections`` gives how many rotation pairs use each of the four positions,
    in turn (``(i mod sum(sections))`` picks the section of pair ``i``). MROPE pairs values like NEOX and
    keeps one angle sequence across sections; VISION rotates pairs ``(x[i], x[i + n_dims])`` over the
    whole row (so ``n_dims`` must be ``a.ne[0] / 2``) and restarts the angles in each section. With
    ``GGML_ROPE_TYPE_NORM``/``GGML_ROPE_TYPE_NEOX`` (mode 0, ggmlR's default, or 2) the sections are
    ignored and this is ``ggml_rope_ext``. Differentiable with respect to ``a`` (not to ``c``)."""
_ROPE_MULTI_ARGS = """a: F32 or F16 tensor ``[head_dim, n_head, n_tokens, batch]`` with contiguous rows.
        b: the positions, a contiguous I32 vector: ``4 * a.ne[2]`` values for MROPE/VISION (t, h, w, e
            blocks), ``a.ne[2]`` otherwise."""
_ROPE_MULTI_SECTIONS = """sections: 4 ints >= 0 (default ``[0, 0, 0, 0]``): the rotation pairs of each section. For
            MROPE and VISION the first three may not all be 0 and their total may not exceed ``a.ne[0]``.
        mode: ``GGML_ROPE_TYPE_MROPE`` (8), ``GGML_ROPE_TYPE_VISION`` (24), or 0/2 (plain rope,
            sections ignored; 0 is the default)."""


def ggml_rope_multi(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None = None, n_dims: int | None = None,
                    sections: Sequence[int] = (0, 0, 0, 0), mode: int = 0, n_ctx_orig: int = 0,
                    freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                    attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0) -> Tensor:
    """Multi-section rotary position embedding (M-RoPE), for vision-language and vision models.

    {multi}

    Arguments:
        ctx: [glossary]
        {args}
        {ext}

    Value: a new Tensor of a's shape and type.

    Example:
        >>> q = ggml_rope_multi(ctx, q, pos4, None, 128, [16, 24, 24, 0], GGML_ROPE_TYPE_MROPE, 0, 1e6)
    """
    return _rope("ggml_rope_multi", ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor,
                 attn_factor, beta_fast, beta_slow, sections, False)


def ggml_rope_multi_inplace(ctx: Context, a: Tensor, b: Tensor, c: Tensor | None = None, n_dims: int | None = None,
                            sections: Sequence[int] = (0, 0, 0, 0), mode: int = 0, n_ctx_orig: int = 0,
                            freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
                            attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0) -> Tensor:
    """``ggml_rope_multi`` **in place**: the rotation is written into a's own data.

    The result is a view of ``a``. For inference only: in-place ops may not lie on the path to a
    trainable parameter (use ``ggml_rope_multi`` there).

    Arguments:
        ctx: [glossary: header]
        {args}
        {ext}

    Value: a Tensor of a's shape and type viewing a's data.

    Example:
        >>> v = ggml_rope_multi_inplace(ctx, v, pos4, None, 32, [16, 16, 0, 0], GGML_ROPE_TYPE_VISION)
    """
    return _rope("ggml_rope_multi_inplace", ctx, a, b, c, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                 ext_factor, attn_factor, beta_fast, beta_slow, sections, True)


def _fill_rope_docs() -> None:
    ext = _ROPE_EXT_ARGS.format(mode=_ROPE_EXT_MODE)
    multi_ext = _ROPE_EXT_ARGS.format(mode=_ROPE_MULTI_SECTIONS)
    fill_doc(ggml_rope, theta=_ROPE_THETA, args=_ROPE_ARGS)
    fill_doc(ggml_rope_inplace, theta=_ROPE_THETA, args=_ROPE_ARGS)
    fill_doc(ggml_rope_ext, theta=_ROPE_THETA, args=_ROPE_ARGS, ext=ext)
    fill_doc(ggml_rope_ext_inplace, theta=_ROPE_THETA, args=_ROPE_ARGS, ext=ext)
    fill_doc(ggml_rope_multi, multi=_ROPE_MULTI_DOC, args=_ROPE_MULTI_ARGS, ext=multi_ext)
    fill_doc(ggml_rope_multi_inplace, multi=_ROPE_MULTI_DOC, args=_ROPE_MULTI_ARGS, ext=multi_ext)


_fill_rope_docs()


# ---------------------------------------------------------------- timestep embedding

def ggml_timestep_embedding(ctx: Context, timesteps: Tensor, dim: int, max_period: int = 10000) -> Tensor:
    """Sinusoidal embeddings of diffusion timesteps: ``[N]`` becomes ``[dim, N]``.

    For each timestep ``t`` and ``j < half = dim // 2``, with ``f_j = exp(-ln(max_period) * j / half)``,
    the embedding is ``[cos(t f_0), ..., cos(t f_{half-1}), sin(t f_0), ..., sin(t f_{half-1})]``,
    followed by one 0 when ``dim`` is odd (as in Stable Diffusion). ggml has no backward pass for
    it: the timesteps are data, not parameters.

    Arguments:
        ctx: [glossary]
        timesteps: contiguous F32 vector ``[N]`` of timesteps (any real values).
        dim: the embedding size (an int >= 1).
        max_period: the longest period, an int >= 1 (default 10000).

    Value: a new F32 Tensor ``[dim, N]``: column ``i`` is the embedding of ``timesteps[i]``.

    Example:
        >>> emb = ggml_timestep_embedding(ctx, t, 320)        # t F32 [batch] -> [320, batch]
    """
    fn = "ggml_timestep_embedding"
    timesteps = operand(fn, timesteps, "timesteps")
    types(fn, timesteps, {GGML_TYPE_F32}, "timesteps")
    if timesteps.shape[1:] != (1, 1, 1) or not lib.ggml_is_contiguous(timesteps.ptr):
        fail(fn, f"timesteps must be a contiguous F32 vector [N], got shape {shape_text(timesteps)}")
    dim = c_int_arg(fn, "dim", dim, 1)
    max_period = c_int_arg(fn, "max_period", max_period, 1)
    return make_op(fn, ctx, lib.ggml_timestep_embedding, (timesteps,), (dim, timesteps.shape[0], 1, 1),
               (dim, max_period))


# ---------------------------------------------------------------- flash attention

def ggml_flash_attn_ext(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                        scale: float | None = None, max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
    """Fused attention ``softmax(scale * K^T Q + mask) V`` per head, without storing the score matrix.

    **Trains** with F32 ``q``, ``k`` and ``v``, ``max_bias=0``, ``logit_softcap=0`` and no sinks: its
    backward pass (``ggml_flash_attn_back``, patches/0056) recomputes the scores a query row at a time,
    so neither direction holds the ``n_q x n_kv`` score matrix. The mask gets no gradient (it must be
    data). Other settings are forward only (building their backward graph raises, naming the reason).

    Layouts (ggml's): ``q [d_k, n_q, n_head, B]``, ``k [d_k, n_kv, n_head_kv, B]``,
    ``v [d_v, n_kv, n_head_kv, B]`` (not transposed), ``mask [>= n_kv, >= n_q, M2, M3]``. Query head
    ``h`` reads key/value head ``h // (n_head / n_head_kv)`` (grouped-query attention) and mask plane
    ``(h % M2, b % M3)``. For query ``i`` the scores are ``s_j = scale * k_j . q_i`` (with
    ``logit_softcap = c > 0``: ``c * tanh(s_j / c)``) plus ``slope_h * mask[j, i]``, where ``slope_h``
    is 1 without ALiBi; a ``-inf`` mask entry excludes key ``j``. The output is permuted:
    ``[d_v, n_head, n_q, B]``. Values are accumulated in F32 (F16 for F16 ``v`` on the CPU): expect
    about three significant digits with F16 k/v.

    Arguments:
        ctx: [glossary]
        q: F32 queries ``[d_k, n_q, n_head, B]`` with contiguous rows.
        k: F16 (or F32) keys ``[d_k, n_kv, n_head_kv, B]`` with contiguous rows; n_head must be a
            multiple of n_head_kv.
        v: values of k's type, ``[d_v, n_kv, n_head_kv, B]``, contiguous rows.
        mask: None (the default: no mask) or a contiguous **F16** tensor ``[n_kv', n_q', M2, M3]`` with
            ``n_kv' >= n_kv``, ``n_q' >= n_q`` and M2, M3 dividing n_head, B. Use 0 for visible keys and
            ``-inf`` for hidden ones (a causal mask: ``-inf`` above the diagonal).
        scale: the factor of the dot products, usually ``1 / sqrt(d_k)``. Required (ggmlR gives it no
            default; None raises GgmlTypeError).
        max_bias: 0.0 (the default) for no ALiBi; > 0 derives per-head ALiBi slopes from it and needs a
            mask (the slopes multiply the mask).
        logit_softcap: 0.0 (the default) for no soft-capping; ``c != 0`` caps scores with
            ``c * tanh(s / c)`` (Gemma 2 uses 50).

    Value: a new F32 Tensor ``[d_v, n_head, n_q, B]``. Raises GgmlTypeError for other types (a mask
    that is not F16, q not F32), GgmlValueError for shapes that do not fit.

    Example:
        >>> out = ggml_flash_attn_ext(ctx, q, k16, v16, mask16, 1 / 64 ** 0.5)   # -> [64, n_head, n_q, 1]
    """
    fn = "ggml_flash_attn_ext"
    q, k, v = operand(fn, q, "q"), operand(fn, k, "k"), operand(fn, v, "v")
    types(fn, q, {GGML_TYPE_F32}, "q")
    types(fn, k, F32_F16, "k")
    types(fn, v, {k.type}, f"v (k is {type_name(k.type)})")
    for what, t in (("q", q), ("k", k), ("v", v)):
        rows_contiguous(fn, t, what)
    (dk, n_q, n_head, nb), (kd, n_kv, n_head_kv, kb), (dv, v1, v2, vb) = q.shape, k.shape, v.shape
    if kd != dk:
        fail(fn, f"q and k must share ne[0] (the key size), got q {shape_text(q)} and k {shape_text(k)}")
    if (v1, v2) != (n_kv, n_head_kv):
        fail(fn, f"v must have k's ne[1] (n_kv) and ne[2] (kv heads), got k {shape_text(k)} and v "
                     f"{shape_text(v)}")
    if n_head % n_head_kv:
        fail(fn, f"the query heads q.ne[2]={n_head} must be a multiple of the key/value heads k.ne[2]={n_head_kv}")
    if not kb == vb == nb:
        fail(fn, f"q, k and v must have the same ne[3] (batch), got {nb}, {kb} and {vb}")
    _required(fn, "scale", scale, "the usual value is 1 / sqrt(q.ne[0])")
    scale = float_arg(fn, "scale", scale, finite=True)
    max_bias = float_arg(fn, "max_bias", max_bias, finite=True)
    logit_softcap = float_arg(fn, "logit_softcap", logit_softcap, finite=True)
    if max_bias < 0:
        fail(fn, f"max_bias must be >= 0 (0 for no ALiBi), got {max_bias}")
    if mask is not None:
        mask = operand(fn, mask, "mask")
        types(fn, mask, {GGML_TYPE_F16}, "mask (ggml's flash attention reads an F16 mask; convert it with "
                                             "ggml_cpy into an F16 tensor)")
        contiguous(fn, mask, "mask")
        m0, m1, m2, m3 = mask.shape
        if m0 < n_kv or m1 < n_q or n_head % m2 or nb % m3:
            fail(fn, f"mask {shape_text(mask)} must have ne[0] >= n_kv={n_kv}, ne[1] >= n_q={n_q}, and ne[2], "
                         f"ne[3] dividing n_head={n_head}, batch={nb}")
    elif max_bias > 0:
        fail(fn, f"max_bias > 0 (ALiBi) needs a mask, got max_bias={max_bias} and no mask")
    return make_op(fn, ctx, lib.ggml_flash_attn_ext, (q, k, v, mask), (dv, n_head, n_q, nb),
               (scale, max_bias, logit_softcap))


def ggml_flash_attn_back(ctx: Context, q: Tensor, k: Tensor, v: Tensor, d: Tensor, masked: bool = True) -> Tensor:
    """The gradients of attention ``softmax(k^T q / sqrt(D)) v`` with respect to ``q``, ``k`` and ``v`` for the
    gradient ``d`` of its output (ggml's original flash-attention backward op, as ggmlR binds it), computed a
    query row at a time without storing the score matrix (patches/0056).

    Training graphs do not need to call it: ``ggml_build_backward_expand`` inserts it for every trainable
    ``ggml_flash_attn_ext``. It is for hand-written backward passes in ggml's older layout.

    Arguments:
        ctx: [glossary]
        q: F32 queries ``[D, N, H, B]`` (D values per head, N query rows, H heads, B batches).
        k: F32 keys ``[D, M, Hkv, B]``; H must be a multiple of Hkv (query head h reads kv head
            ``h // (H / Hkv)``).
        v: F32 values, **transposed**: ``[M, D, Hkv, B]``.
        d: F32 gradient of the attention's output, ``[D, N, H, B]`` (the output's layout is q's).
        masked: True (ggmlR's default) for causal attention: key j is hidden from query i when
            ``j > i + M - N`` (needs ``M >= N``); False for none.

    Value: a new 1-D F32 Tensor holding grad_q, grad_k and grad_v back to back, each contiguous in the
    shape of its tensor (grad_v transposed as v), at the byte offsets ``ggml_flash_attn_back_offsets(q, k,
    v)`` gives (then a scratch of two floats per query row and head). Read them with ``ggml_view_4d``.
    Raises GgmlTypeError for non-F32 operands, GgmlValueError for shapes that do not fit.

    Example:
        >>> g = ggml_flash_attn_back(ctx, q, k, vt, d, masked=True)
        >>> offs = ggml_flash_attn_back_offsets(q, k, vt)
        >>> grad_k = ggml_view_4d(ctx, g, *k.shape, 4 * k.shape[0], 4 * k.shape[0] * k.shape[1],
        ...                       4 * k.shape[0] * k.shape[1] * k.shape[2], offs[1])
    """
    fn = "ggml_flash_attn_back"
    q, k, v, d = (operand(fn, t, what) for t, what in ((q, "q"), (k, "k"), (v, "v"), (d, "d")))
    for what, t in (("q", q), ("k", k), ("v", v), ("d", d)):
        types(fn, t, {GGML_TYPE_F32}, what)
    if not isinstance(masked, (bool, int)) or isinstance(masked, int) and masked not in (0, 1):
        fail(fn, f"masked must be True or False, got {masked!r}", GgmlTypeError)
    (dq, n, h, b), (dk, m, hkv, kb) = q.shape, k.shape
    if dk != dq or kb != b:
        fail(fn, f"k must be [D, M, Hkv, B] with q's D and B, got q {shape_text(q)} and k {shape_text(k)}")
    if hkv == 0 or h % hkv:
        fail(fn, f"the query heads q.ne[2]={h} must be a multiple of the key/value heads k.ne[2]={hkv}")
    if tuple(v.shape) != (m, dq, hkv, b):
        fail(fn, f"v must be the transposed values [M, D, Hkv, B] = {[m, dq, hkv, b]}, got {shape_text(v)}")
    if tuple(d.shape) != tuple(q.shape):
        fail(fn, f"d (the output's gradient) must have q's shape {shape_text(q)}, got {shape_text(d)}")
    if masked and m < n:
        fail(fn, f"causal attention (masked=True) needs at least as many keys as queries, got M={m} < N={n}")
    check_flash_attn_back_scratch(fn, dq, dq, m)
    n_out = ggml_flash_attn_back_offsets(q, k, v)[4] // 4
    return make_op(fn, ctx, lib.ggml_flash_attn_back, (q, k, v, d), (n_out,), (bool(masked),))


def flash_attn_ext_back(ctx: Context, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, d: Tensor,
                        scale: float) -> Tensor:
    """The node ``ggml_build_backward_expand`` makes for ``ggml_flash_attn_ext(ctx, q, k, v, mask, scale)`` whose
    output's gradient is ``d`` (for asking a device whether it computes it; operands as the forward's, unchecked)."""
    return make_op("ggml_flash_attn_ext_back", ctx, lib.ggml_flash_attn_ext_back, (q, k, v, mask, d),
                   (ggml_flash_attn_back_offsets(q, k, v)[4] // 4,), (float(scale),))


def ggml_flash_attn_back_offsets(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int, int]:
    """The byte offsets of grad_q, grad_k, grad_v, the scratch and the end in a ``ggml_flash_attn_back`` result
    for operands ``q``, ``k``, ``v`` (each part padded to ggml's memory alignment).

    Example:
        >>> ggml_flash_attn_back_offsets(q, k, vt)   # (0, 2048, 4096, 6144, 6208) for 512-element q, k, v
    """
    fn = "ggml_flash_attn_back_offsets"
    q, k, v = operand(fn, q, "q"), operand(fn, k, "k"), operand(fn, v, "v")
    offs = ffi.new("size_t[5]")
    lib.ggml_flash_attn_back_offsets(q.ptr, k.ptr, v.ptr, offs)
    return int(offs[0]), int(offs[1]), int(offs[2]), int(offs[3]), int(offs[4])


def ggml_get_rel_pos(ctx: Context, a: Tensor, qh: int, kh: int) -> Tensor:
    """Relative-position embeddings gathered for every (query, key) pair, as in Segment Anything.

    ``a [C, 2 kh - 1]`` holds one embedding per relative offset; the result ``[C, kh, qh]`` has
    ``result[:, k, q] = a[:, q - k + kh - 1]``. ggml requires ``qh == kh``. Not differentiable.

    Arguments:
        ctx: [glossary]
        a: contiguous F16 matrix ``[C, 2 * kh - 1]``.
        qh: the number of query positions (an int >= 1, equal to ``kh``).
        kh: the number of key positions (an int >= 1).

    Value: a new F16 Tensor ``[C, kh, qh]``.

    Example:
        >>> rel_h = ggml_get_rel_pos(ctx, rel_pos_h16, 14, 14)   # rel_pos_h16 F16 [C, 27]
    """
    fn = "ggml_get_rel_pos"
    a = operand(fn, a)
    types(fn, a, {GGML_TYPE_F16})  # the kernel copies 16-bit values into an F16 result (BF16 would be garbage)
    contiguous(fn, a)
    qh, kh = c_int_arg(fn, "qh", qh, 1), c_int_arg(fn, "kh", kh, 1)
    if qh != kh:
        fail(fn, f"ggml supports qh == kh only, got qh={qh}, kh={kh}")
    if a.shape[1] != 2 * kh - 1 or a.shape[2:] != (1, 1):
        fail(fn, f"a must be a matrix [C, 2 * kh - 1] = [C, {2 * kh - 1}], got {shape_text(a)}")
    return make_op(fn, ctx, lib.ggml_get_rel_pos, (a,), (a.shape[0], kh, qh, 1), (qh, kh), GGML_TYPE_F16)


def ggml_add_rel_pos(ctx: Context, a: Tensor, pw: Tensor, ph: Tensor) -> Tensor:
    """Add decomposed relative-position biases to attention scores, as in Segment Anything.

    ``a [K*K, Q, B]`` holds the scores of ``Q`` queries over a ``K x K`` grid of keys (key index
    ``kh * K + kw``); ``pw`` and ``ph`` ``[K, Q1, Q2, B]`` with ``Q1 * Q2 = Q`` hold the width and height
    biases of each query. The result is ``a[kh*K + kw, q, b] + ph[kh, q, b] + pw[kw, q, b]`` (q flattened
    from (Q1, Q2)). Not differentiable.

    Arguments:
        ctx: [glossary]
        a: contiguous F32 scores ``[K*K, Q, B]`` (3-D: ne[3] == 1).
        pw: contiguous F32 width biases ``[K, Q1, Q2, B]``.
        ph: contiguous F32 height biases of pw's shape.

    Value: a new F32 Tensor of a's shape.

    Example:
        >>> attn = ggml_add_rel_pos(ctx, attn, rel_w, rel_h)   # attn [196, 196, n_head], rel_* [14, 14, 14, n_head]
    """
    fn = "ggml_add_rel_pos"
    a, pw, ph = operand(fn, a), operand(fn, pw, "pw"), operand(fn, ph, "ph")
    for what, t in (("a", a), ("pw", pw), ("ph", ph)):
        types(fn, t, {GGML_TYPE_F32}, what)
        contiguous(fn, t, what)
    if pw.shape != ph.shape:
        fail(fn, f"pw and ph must have the same shape, got {shape_text(pw)} and {shape_text(ph)}")
    k, q1, q2, b = pw.shape
    if a.shape != (k * k, q1 * q2, b, 1):
        fail(fn, f"a must be [K*K, Q1*Q2, B, 1] = {[k * k, q1 * q2, b, 1]} for pw/ph {shape_text(pw)}, "
                     f"got {shape_text(a)}")
    return make_op(fn, ctx, lib.ggml_add_rel_pos, (a, pw, ph), a.shape)
