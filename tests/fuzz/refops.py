"""Random chains of ggml ops built on the CPU and checked against numpy float64 references.

A case gives the input shapes and a list of steps ``[op, choice...]``; the raw choices are mapped onto
valid arguments for the tensors at hand (so most chains are valid), except where a step asks for a bad
one on purpose (``"bad": true``), which ggmlpy must refuse with its own error. Every tensor carries its
reference (a 4-D float64 array in ggml layout ``(ne3, ne2, ne1, ne0)``) and a tolerance; after the
chain is computed each result must match its reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

import ggmlpy as G


F32, I32 = G.GGML_TYPE_F32, G.GGML_TYPE_I32


from tests.fuzz.oracle import Wrong  # noqa: E402


@dataclass
class T:
    t: Any                 # the ggmlpy Tensor
    ref: np.ndarray        # float64 (or int) reference, shape (ne3, ne2, ne1, ne0)
    tol: float = 1e-5      # relative tolerance accumulated along the chain
    name: str = "input"    # the op that made it


def contiguous(t: Any) -> bool:
    from ggmlpy._ffi import lib
    return bool(lib.ggml_is_contiguous(t.ptr))


def ne_of(ref: np.ndarray) -> list[int]:
    return list(reversed(ref.shape))


class Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.backend = G.ggml_backend_cpu_init()
        G.ggml_backend_cpu_set_n_threads(self.backend, 1)
        self.ctx_in = G.ggml_init(64 * G.ggml_tensor_overhead(), no_alloc=True)
        self.ctx = G.ggml_init(512 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(512) + 4096, no_alloc=True)
        self.leafs: list[tuple[Any, np.ndarray]] = []
        self.tensors: list[T] = []
        self.must_refuse = ""  # the compute must be refused (e.g. an out-of-range row index)

    def leaf(self, ne: list[int], kind: str = "f32", lo: float = -2.0, hi: float = 2.0, bound: int = 0) -> T:
        shape = tuple(reversed(ne))
        if kind == "i32":
            values = self.rng.integers(0, max(bound, 1), size=shape).astype(np.int32)
            t = G.ggml_new_tensor(self.ctx_in, I32, 4, ne)
        elif kind == "f16":
            values = self.rng.uniform(lo, hi, size=shape).astype(np.float16)
            t = G.ggml_new_tensor(self.ctx_in, G.GGML_TYPE_F16, 4, ne)
        else:
            values = self.rng.uniform(lo, hi, size=shape).astype(np.float32)
            t = G.ggml_new_tensor(self.ctx_in, F32, 4, ne)
        self.leafs.append((t, values))
        return T(t, values.astype(np.float64) if kind != "i32" else values.astype(np.int64))


def _divisor(rng: np.random.Generator, n: int) -> int:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return int(rng.choice(ds))


def _tile_to(b: np.ndarray, shape: tuple) -> np.ndarray:
    return np.tile(b, tuple(n // m for n, m in zip(shape, b.shape)))


def _softmax(x: np.ndarray) -> np.ndarray:
    m = np.max(x, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


UNARY: dict[str, tuple[Callable, Callable, float]] = {
    # name: (ggmlpy builder, numpy reference, tolerance)
    "neg": (G.ggml_neg, lambda x: -x, 1e-6), "abs": (G.ggml_abs, np.abs, 1e-6), "sqr": (G.ggml_sqr, np.square, 1e-6),
    "sqrt": (G.ggml_sqrt, lambda x: np.sqrt(np.abs(x)) * np.where(x < 0, np.nan, 1), 1e-5),
    "exp": (G.ggml_exp, np.exp, 1e-5), "log": (G.ggml_log, lambda x: np.log(np.where(x < 0, np.nan, x)), 1e-5),
    "relu": (G.ggml_relu, lambda x: np.where(x > 0, x, 0.0), 1e-6),  # as ggml: NaN -> 0
    "sigmoid": (G.ggml_sigmoid, lambda x: 1 / (1 + np.exp(-x)), 1e-5), "tanh": (G.ggml_tanh, np.tanh, 1e-5),
    "gelu": (G.ggml_gelu, lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))), 2e-3),
    "silu": (G.ggml_silu, lambda x: x / (1 + np.exp(-x)), 1e-5), "sin": (G.ggml_sin, np.sin, 1e-5),
    "cos": (G.ggml_cos, np.cos, 1e-5), "sgn": (G.ggml_sgn, lambda x: np.nan_to_num(np.sign(x), nan=0.0), 0),
    "step": (G.ggml_step, lambda x: (x > 0) * 1.0, 0),
    "elu": (G.ggml_elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))), 1e-5),
    "softplus": (G.ggml_softplus, lambda x: np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))), 1e-5),
    "hardswish": (G.ggml_hardswish, lambda x: x * np.clip((x + 3) / 6, 0, 1), 1e-5),
    "cont": (G.ggml_cont, lambda x: x, 0), "dup": (G.ggml_dup, lambda x: x, 0),
    "soft_max": (G.ggml_soft_max, _softmax, 1e-5),
    "sum_rows": (G.ggml_sum_rows, lambda x: np.sum(x, axis=-1, keepdims=True), 1e-5),
    "mean": (G.ggml_mean, lambda x: np.mean(x, axis=-1, keepdims=True), 1e-5),
    "sum": (G.ggml_sum, lambda x: np.sum(x).reshape(1, 1, 1, 1), 1e-5),
    "transpose": (G.ggml_transpose, lambda x: np.swapaxes(x, -1, -2), 0),
}
UNARY_NAMES = sorted(UNARY)
PARAM_OPS = ["leaky_relu", "scale", "scale_bias", "clamp", "norm", "rms_norm", "soft_max_ext", "diag_mask_inf",
             "permute", "reshape", "view", "pad", "argmax", "pool_1d", "pool_2d", "cpy"]
BINARY_OPS = ["add", "sub", "mul", "div", "mul_mat", "out_prod", "concat", "repeat", "get_rows", "cross_entropy_loss"]
ALL_OPS = UNARY_NAMES + PARAM_OPS + BINARY_OPS
# ops whose step has no bad variant (or where the "bad" value is legal: an infinite clamp bound; an
# out-of-range get_rows index, which must be refused when the graph is computed instead)
NO_BAD_ARGUMENT = {"clamp", "get_rows", "soft_max_ext", "scale_bias", "argmax", "pool_2d"}


def _param_value(choice: int, bad: bool, good: Callable[[int], Any], bads: list) -> Any:
    return bads[choice % len(bads)] if bad else good(choice)


BAD_FLOATS = [float("nan"), float("inf"), "x", None, 2 ** 2000]
BAD_INTS = [-1, 2 ** 40, 2 ** 70, 1.5, None, "x", float("nan")]


def step(b: Builder, op: str, choices: list[int], bad: bool) -> T | None:
    rng = b.rng
    ctx = b.ctx
    pick = choices[0] % len(b.tensors)
    a = b.tensors[pick]
    x = a.ref
    c = choices[1:] + [0] * 8
    if op in UNARY:
        fn, ref, tol = UNARY[op]
        if op == "sum" and x.size > 4096:
            tol = 1e-4
        out = fn(ctx, a.t)
        return T(out, ref(x), a.tol + tol)
    if op == "leaky_relu":
        slope = _param_value(c[0], bad, lambda k: (k % 7 - 3) / 10, BAD_FLOATS)
        out = G.ggml_leaky_relu(ctx, a.t, slope)
        ref = np.where(x > 0, x, 0.0) + slope * np.where(x < 0, x, 0.0)  # ggml's formula: NaN -> 0
        return T(out, ref, a.tol + 1e-6)
    if op == "scale":
        s = _param_value(c[0], bad, lambda k: (k % 9 - 4) / 2, BAD_FLOATS)
        return T(G.ggml_scale(ctx, a.t, s), x * s, a.tol + 1e-6)
    if op == "scale_bias":
        s, bias = (c[0] % 5 - 2) / 2, (c[1] % 5 - 2) / 4
        return T(G.ggml_scale_bias(ctx, a.t, s, bias), x * s + bias, a.tol + 1e-6)
    if op == "clamp":
        lo = _param_value(c[0], bad, lambda k: -(k % 4) / 2, BAD_FLOATS)
        hi = (c[1] % 4) / 2
        # ggml_clamp works in place (its result views a): clamp a copy, or a's own reference would change
        out = G.ggml_clamp(ctx, G.ggml_cont(ctx, a.t), lo, hi)
        # ggml's MAX(MIN(x, max), min) turns NaN into max (numpy's clip keeps NaN)
        return T(out, np.where(np.isnan(x), hi, np.clip(x, lo, hi)), a.tol + 1e-6)
    if op in ("norm", "rms_norm"):
        eps = _param_value(c[0], bad, lambda k: 10.0 ** -(1 + k % 6), BAD_FLOATS + [-1.0])
        out = (G.ggml_norm if op == "norm" else G.ggml_rms_norm)(ctx, a.t, eps)  # first: a bad eps is refused
        if op == "norm":
            m = x.mean(axis=-1, keepdims=True)
            ref = (x - m) / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + eps)
        else:
            ref = x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True) + eps)
        return T(out, ref, a.tol * 10 + 1e-4)
    if op == "soft_max_ext":
        scale = (c[0] % 4 + 1) / 2
        max_bias = _param_value(c[1], bad, lambda k: 0.0, BAD_FLOATS)
        return T(G.ggml_soft_max_ext(ctx, a.t, None, scale, max_bias), _softmax(x * scale), a.tol + 1e-5)
    if op == "diag_mask_inf":
        n_past = _param_value(c[0], bad, lambda k: k % 3, BAD_INTS)
        out = G.ggml_diag_mask_inf(ctx, a.t, n_past)
        ne0, ne1 = x.shape[-1], x.shape[-2]
        mask = np.arange(ne0)[None, :] > (np.arange(ne1)[:, None] + n_past)
        return T(out, np.where(mask, -np.inf, x), a.tol)
    if op == "permute":
        perms = [p for p in __import__("itertools").permutations(range(4))]
        axes = list(perms[c[0] % 24])
        if bad:
            axes[c[1] % 4] = [4, -1, 1.5, None, 2 ** 40][c[2] % 5]
        out = G.ggml_permute(ctx, a.t, *axes)
        perm_np = [0] * 4
        for i, ax in enumerate(axes):
            perm_np[3 - ax] = 3 - i
        return T(out, np.transpose(x, perm_np), a.tol)
    if op == "reshape":
        n = x.size
        ne = []
        rest = n
        for _ in range(3):
            d = _divisor(rng, rest)
            ne.append(d)
            rest //= d
        ne.append(rest)
        k = 1 + c[0] % 4
        ne = ne[:k - 1] + [math.prod(ne[k - 1:])]
        if bad:
            ne[c[1] % len(ne)] = BAD_INTS[c[2] % len(BAD_INTS)]
        out = getattr(G, f"ggml_reshape_{k}d")(ctx, a.t, *ne)
        return T(out, x.reshape(tuple(reversed(ne + [1] * (4 - len(ne))))), a.tol)
    if op == "view":
        return _view(b, a, c, bad)
    if op == "pad":
        ps = [c[i] % 3 for i in range(4)]
        if bad:
            ps[c[4] % 4] = BAD_INTS[c[5] % len(BAD_INTS)]
        out = G.ggml_pad(ctx, a.t, *ps)
        return T(out, np.pad(x, [(0, ps[3]), (0, ps[2]), (0, ps[1]), (0, ps[0])]), a.tol)
    if op == "argmax":
        out = G.ggml_argmax(ctx, a.t)
        return T(out, np.argmax(x, axis=-1).reshape(1, 1, 1, -1).astype(np.int64), 0)
    if op == "pool_1d":
        k0 = 1 + c[0] % 3
        s0 = 1 + c[1] % 3
        kind = c[2] % 2
        if bad:
            k0 = BAD_INTS[c[3] % len(BAD_INTS)]
        out = G.ggml_pool_1d(ctx, a.t, kind, k0, s0, 0)
        n = x.shape[-1]
        ow = (n - k0) // s0 + 1
        win = np.stack([x[..., i * s0:i * s0 + k0] for i in range(max(ow, 0))], axis=-2) if ow > 0 else None
        ref = (win.max(axis=-1) if kind == 0 else win.mean(axis=-1))
        return T(out, ref, a.tol + 1e-6)
    if op == "pool_2d":
        k0, k1 = 1 + c[0] % 2, 1 + c[1] % 2
        s0, s1 = 1 + c[2] % 2, 1 + c[3] % 2
        kind = c[4] % 2
        out = G.ggml_pool_2d(ctx, a.t, kind, k0, k1, s0, s1, 0, 0)
        h, w = x.shape[-2], x.shape[-1]
        oh, ow = (h - k1) // s1 + 1, (w - k0) // s0 + 1
        ref = np.empty(x.shape[:2] + (oh, ow))
        for i in range(oh):
            for j in range(ow):
                win = x[..., i * s1:i * s1 + k1, j * s0:j * s0 + k0]
                ref[..., i, j] = win.max(axis=(-1, -2)) if kind == 0 else win.mean(axis=(-1, -2))
        return T(out, ref, a.tol + 1e-6)
    if op == "cpy":
        kind = ["f32", "f16"][c[0] % 2]
        dst = b.leaf(list(reversed(x.shape)), kind)
        if bad:
            dst = b.leaf([x.size + 1, 1, 1, 1], kind)
        out = G.ggml_cpy(ctx, a.t, dst.t)
        ref = x.astype(np.float16).astype(np.float64) if kind == "f16" else x.astype(np.float32).astype(np.float64)
        return T(out, ref.reshape(dst.ref.shape), a.tol + (2e-3 if kind == "f16" else 0))
    if op in BINARY_OPS:
        return _binary(b, op, a, c, bad)
    raise ValueError(op)


def _view(b: Builder, a: T, c: list[int], bad: bool) -> T:
    x = a.ref
    if not contiguous(a.t):
        raise Wrong("(skip)")  # a view of a strided tensor views its memory, not its logical order
    flat = np.ascontiguousarray(x).reshape(-1)
    n = flat.size
    esize = 2 if G.ggml_tensor_type(a.t) == G.GGML_TYPE_F16 else 4  # view offsets and strides are in bytes
    k = 1 + c[0] % 2
    if k == 1:
        ne0 = 1 + c[1] % n
        off = c[2] % (n - ne0 + 1)
        if bad:
            ne0, off = [(n + 1, 0), (ne0, n), (0, 0), (2 ** 62, 0)][c[3] % 4]
        out = G.ggml_view_1d(b.ctx, a.t, ne0, off * esize)
        return T(out, flat[off:off + ne0].reshape(1, 1, 1, -1), a.tol)
    ne0 = 1 + c[1] % max(1, min(n, 6))
    ne1 = 1 + c[2] % max(1, n // ne0)
    nb1 = ne0 + c[3] % 3  # elements between rows (>= ne0: rows do not overlap)
    if (ne1 - 1) * nb1 + ne0 > n:
        nb1 = ne0
    off = c[4] % max(1, n - ((ne1 - 1) * nb1 + ne0) + 1)
    if bad:
        nb1 = [0, -4, 2 ** 62, 1.5][c[5] % 4]
        out = G.ggml_view_2d(b.ctx, a.t, ne0, ne1, nb1, off * esize)
        if ne1 > 1 or not isinstance(nb1, int) or nb1 < 1:  # one row: its stride is never used
            raise Wrong("a bad view was accepted")
        raise Wrong("(skip)")
    out = G.ggml_view_2d(b.ctx, a.t, ne0, ne1, nb1 * esize, off * esize)
    ref = np.lib.stride_tricks.as_strided(flat[off:], shape=(ne1, ne0), strides=(nb1 * 8, 8)).copy()
    return T(out, ref.reshape(1, 1, ne1, ne0), a.tol)


def _binary(b: Builder, op: str, a: T, c: list[int], bad: bool) -> T:
    rng = b.rng
    x = a.ref
    shape = x.shape  # (ne3, ne2, ne1, ne0)
    ctx = b.ctx
    if op in ("add", "sub", "mul", "div"):
        same = [t for t in b.tensors if all(n % m == 0 for n, m in zip(shape, t.ref.shape)) and t.ref.dtype != np.int64]
        if c[0] % 2 and same and not bad:
            o = same[c[1] % len(same)]
        else:
            ne = [_divisor(rng, n) for n in reversed(shape)]
            if bad:
                ne[c[2] % 4] = shape[3 - c[2] % 4] + 1  # not a divisor of a's dimension: cannot broadcast
            o = b.leaf(ne, lo=0.5 if op == "div" else -2.0, hi=2.0)
        fn = {"add": G.ggml_add, "sub": G.ggml_sub, "mul": G.ggml_mul, "div": G.ggml_div}[op]
        ref_fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op]
        out = fn(ctx, a.t, o.t)
        with np.errstate(all="ignore"):
            ref = ref_fn(x, _tile_to(o.ref, shape))
        return T(out, ref, a.tol + o.tol + 1e-6)
    if op == "mul_mat":
        k, m, a2, a3 = reversed(shape)
        r2, r3 = 1 + c[0] % 2, 1 + c[1] % 2
        n = 1 + c[2] % 5
        ne_b = [k + (1 if bad else 0), n, a2 * r2, a3 * r3]
        o = b.leaf(ne_b)
        out = G.ggml_mul_mat(ctx, a.t, o.t)
        arep = np.repeat(np.repeat(x, r3, axis=0), r2, axis=1)
        ref = o.ref @ np.swapaxes(arep, -1, -2)
        return T(out, ref, (a.tol + o.tol) * 4 + 1e-5 * k)
    if op == "out_prod":
        m, k, a2, a3 = reversed(shape)
        n = 1 + c[0] % 5
        o = b.leaf([n, k + (1 if bad else 0), a2, a3])
        out = G.ggml_out_prod(ctx, a.t, o.t)
        ref = np.swapaxes(o.ref, -1, -2) @ x
        return T(out, ref, (a.tol + o.tol) * 4 + 1e-5 * k)
    if op == "concat":
        dim = c[0] % 4
        ne = list(reversed(shape))
        ne[dim] = 1 + c[1] % 3
        if bad:
            ne[(dim + 1) % 4] += 1
        o = b.leaf(ne)
        out = G.ggml_concat(ctx, a.t, o.t, dim)
        return T(out, np.concatenate([x, o.ref], axis=3 - dim), a.tol + o.tol)
    if op == "repeat":
        ne = [n * (1 + c[i] % 2) for i, n in enumerate(reversed(shape))]
        if bad:
            dims = [i for i, n in enumerate(reversed(shape)) if n >= 2]
            if not dims:
                raise Wrong("(skip)")  # every size divides a 1: no bad target shape
            k = dims[c[4] % len(dims)]
            ne[k] = list(reversed(shape))[k] + 1  # not a multiple of a's size there
        o = b.leaf(ne)
        out = G.ggml_repeat(ctx, a.t, o.t)
        return T(out, _tile_to(x, tuple(reversed(ne))), a.tol)
    if op == "get_rows":
        rows = shape[2]
        n = 1 + c[0] % 4
        idx = b.leaf([n, 1, 1, 1], kind="i32", bound=rows)
        if shape[0] != 1 or shape[1] != 1:
            raise Wrong("(skip)")
        ref = x[:, :, idx.ref.reshape(-1), :]
        if bad:
            b.leafs[-1][1][..., 0] = rows  # one index out of range: must be refused before ggml reads it
            b.must_refuse = "ggml_get_rows with an index out of range"
        out = G.ggml_get_rows(ctx, a.t, idx.t)
        return T(out, ref, a.tol)
    if op == "cross_entropy_loss":
        ne = list(reversed(shape))
        if bad:
            ne[c[0] % 4] += 1
        o = b.leaf(ne, lo=0.0, hi=1.0)
        out = G.ggml_cross_entropy_loss(ctx, a.t, o.t)
        z = x.reshape(-1, shape[-1])
        ls = z - np.max(z, axis=-1, keepdims=True)
        ls = ls - np.log(np.sum(np.exp(ls), axis=-1, keepdims=True))
        ref = -np.sum(o.ref.reshape(z.shape) * ls) / z.shape[0]
        return T(out, np.array(ref).reshape(1, 1, 1, 1), a.tol + 1e-4)
    raise ValueError(op)


def run(case: dict) -> None:
    b = Builder(case["seed"])
    for spec in case["inputs"]:
        b.tensors.append(b.leaf(spec["ne"], spec.get("type", "f32")))
    outputs: list[T] = []
    for st in case["chain"]:
        bad = st.get("bad", False)
        try:
            res = step(b, st["op"], st["c"], bad)
        except Wrong as exc:
            if str(exc) == "(skip)":
                continue
            raise
        except G.GgmlpyError:
            continue  # refused (a bad argument, or a strided operand an op does not take): the next step
        if bad and st["op"] not in NO_BAD_ARGUMENT and st["op"] not in UNARY:
            raise Wrong(f"{st['op']} accepted a bad argument (choices {st['c']})")
        if res is not None:
            res.name = f"{st['op']}{st['c'][:3]}"
            if G.ggml_tensor_type(res.t) == G.GGML_TYPE_F16:
                res.tol += 2e-3  # stored in half precision
            b.tensors.append(res)
            outputs.append(res)
    if not outputs:
        return
    G.ggml_backend_alloc_ctx_tensors(b.ctx_in, b.backend)
    for t, values in b.leafs:
        G.ggml_backend_tensor_set_data(t, values)
    graph = G.ggml_new_graph_custom(b.ctx, 512, False)
    for o in outputs:
        G.ggml_set_output(o.t)
        G.ggml_build_forward_expand(graph, o.t)
    sched = G.ggml_backend_sched_new([b.backend], parallel=False, graph_size=512)
    G.ggml_backend_sched_alloc_graph(sched, graph)
    G.ggml_backend_sched_graph_compute(sched, graph)
    if b.must_refuse:
        raise Wrong(f"the compute ran {b.must_refuse}")
    for k, o in enumerate(outputs):
        shape = tuple(reversed(G.ggml_tensor_shape(o.t)))
        if shape != o.ref.shape:
            raise Wrong(f"result {k} ({o.name}): shape {shape}, numpy says {o.ref.shape}")
        got = G.ggml_backend_tensor_get_data(o.t).astype(np.float64).reshape(shape)
        ref = o.ref.astype(np.float64)
        scale = np.nanmax(np.abs(np.where(np.isfinite(ref), ref, 0))) if ref.size else 0.0
        atol = o.tol * (1 + scale) * 10
        with np.errstate(all="ignore"):
            ok = np.isclose(got, ref, rtol=o.tol * 10 + 1e-6, atol=atol, equal_nan=True) | (got == ref)
        # values beyond float32 range overflow in ggml: both inf/huge
        ok |= (np.abs(ref) > 1e30) & ~np.isfinite(got)
        if not ok.all():
            i = np.unravel_index(int(np.argmin(ok)), shape)
            raise Wrong(f"result {k} ({o.name}): at {i} ggml {got[i]!r}, numpy {ref[i]!r} (tolerance {o.tol:g})")
