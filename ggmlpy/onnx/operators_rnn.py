"""ONNX's recurrent layers, LSTM and GRU, unrolled over their steps with ggml's ops (the default activations; forward,
reverse or bidirectional; all sequences of the batch full length)."""
from __future__ import annotations

import numpy as np

from ..ops import elementwise as E
from ..ops.layout import ggml_reshape_2d
from ..ops.linalg import ggml_mul_mat
from ..ops.reduce import ggml_concat
from .operators_shape import slice_axis
from .registry import op
from .values import Build, Value


_RNN_ATTRS = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout",
              "input_forget", "linear_before_reset")


def _check(b: Build, node, xs) -> tuple[Value, Value, Value, Value | None, int, int, int, int, list[bool]]:
    """(x, W, R, B, steps, batch, hidden, features, the directions as reversed flags) of an LSTM or GRU node,
    refusing what is not built."""
    x = xs[0]
    if int(node.attrs.get("layout", 0)) != 0:
        raise b.fail(f"{node.op} with layout=1 (batch first) is not supported")
    if "activations" in node.attrs or "clip" in node.attrs or int(node.attrs.get("input_forget", 0)):
        raise b.fail(f"{node.op} with activations, clip or input_forget other than the defaults is not supported")
    if len(xs) > 4 and xs[4] is not None:
        lens = xs[4].const
        if lens is None or (np.asarray(lens) != x.shape[0]).any():
            raise b.fail(f"{node.op} with sequence_lens shorter than the sequences is not supported")
    if node.op == "LSTM" and len(xs) > 7 and xs[7] is not None:
        raise b.fail("LSTM with peephole weights (P) is not supported")
    direction = node.attrs.get("direction", "forward")
    flags = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if flags is None:
        raise b.fail(f"{node.op} direction '{direction}'")
    bias = xs[3] if len(xs) > 3 else None
    return x, xs[1], xs[2], bias, x.shape[0], x.shape[1], int(node.attrs["hidden_size"]), x.shape[2], flags


def _matrix(b: Build, v: Value, d: int, rows: int, cols: int):
    """Direction ``d``'s [rows, cols] matrix (numpy order) of a [dirs, rows, cols] weight, as ggml's [cols, rows]."""
    return b.contiguous(b.reshaped(Value(v.shape[1:], slice_axis(b, b.tensor(v), v.shape, 0, d, d + 1)), (rows, cols)))


def _vector(b: Build, v: Value | None, d: int, start: int, size: int):
    if v is None:
        return None
    part = slice_axis(b, b.reshaped(v, (v.shape[0], v.shape[1])), (v.shape[0], v.shape[1]), 1, start, start + size)
    return b.contiguous(slice_axis(b, part, (v.shape[0], size), 0, d, d + 1))


def _initial(b: Build, v: Value | None, d: int, batch: int, hidden: int):
    if v is None:
        return b.tensor(Value.of(np.zeros((batch, hidden), np.float32)))
    return b.contiguous(b.reshaped(Value(v.shape[1:], slice_axis(b, b.tensor(v), v.shape, 0, d, d + 1)),
                                   (batch, hidden)))


def _stack(b: Build, parts: list, axis_ggml: int):
    out = parts[0]
    for p in parts[1:]:
        out = ggml_concat(b.ctx, out, p, axis_ggml)
    return out


def _gate(b: Build, w, r, x_t, h, bias):
    """x_t W^T + h R^T (+ bias): [batch, size] in numpy order, ggml [size, batch]."""
    y = E.ggml_add(b.ctx, ggml_mul_mat(b.ctx, w, x_t), ggml_mul_mat(b.ctx, r, h))
    return y if bias is None else E.ggml_add(b.ctx, y, bias)


@op("LSTM", attrs=_RNN_ATTRS)
def _lstm(b: Build, node, xs, opset):
    """Gates i, o, f, c (ONNX's order): c' = f c + i tanh(.), h' = o tanh(c')."""
    x, w, r, bias, steps, batch, hidden, feats, flags = _check(b, node, xs)
    outs_y, outs_h, outs_c = [], [], []
    for d, backwards in enumerate(flags):
        wm = _matrix(b, w, d, 4 * hidden, feats)
        wg = [b.contiguous(slice_axis(b, wm, (4 * hidden, feats), 0, k * hidden, (k + 1) * hidden)) for k in range(4)]
        rg = [b.contiguous(slice_axis(b, _matrix(b, r, d, 4 * hidden, hidden), (4 * hidden, hidden), 0,
                                      k * hidden, (k + 1) * hidden)) for k in range(4)]
        bg = [None if bias is None else E.ggml_add(b.ctx, _vector(b, bias, d, k * hidden, hidden),
                                                    _vector(b, bias, d, (4 + k) * hidden, hidden)) for k in range(4)]
        h = _initial(b, xs[5] if len(xs) > 5 else None, d, batch, hidden)
        c = _initial(b, xs[6] if len(xs) > 6 else None, d, batch, hidden)
        ys = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            x_t = _step_input(b, x, t, batch, feats)
            i, o, f, cc = (_gate(b, wg[k], rg[k], x_t, h, bg[k]) for k in range(4))
            c = E.ggml_add(b.ctx, E.ggml_mul(b.ctx, E.ggml_sigmoid(b.ctx, f), c),
                           E.ggml_mul(b.ctx, E.ggml_sigmoid(b.ctx, i), E.ggml_tanh(b.ctx, cc)))
            h = E.ggml_mul(b.ctx, E.ggml_sigmoid(b.ctx, o), E.ggml_tanh(b.ctx, c))
            ys[t] = h
        outs_y.append(_stack(b, ys, 2))     # [H, batch, steps]: numpy (steps, batch, H)
        outs_h.append(h)
        outs_c.append(c)
    return _rnn_outputs(b, outs_y, outs_h, steps, batch, hidden, len(flags)) + \
        [Value((len(flags), batch, hidden), _stack(b, outs_c, 2))]


@op("GRU", attrs=_RNN_ATTRS)
def _gru(b: Build, node, xs, opset):
    """Gates z, r, h (ONNX's order): h' = (1 - z) h~ + z h, with ``linear_before_reset`` (PyTorch's form) or not."""
    x, w, r, bias, steps, batch, hidden, feats, flags = _check(b, node, xs)
    before = int(node.attrs.get("linear_before_reset", 0))
    outs_y, outs_h = [], []
    for d, backwards in enumerate(flags):
        wm, rm = _matrix(b, w, d, 3 * hidden, feats), _matrix(b, r, d, 3 * hidden, hidden)
        wg = [b.contiguous(slice_axis(b, wm, (3 * hidden, feats), 0, k * hidden, (k + 1) * hidden)) for k in range(3)]
        rg = [b.contiguous(slice_axis(b, rm, (3 * hidden, hidden), 0, k * hidden, (k + 1) * hidden)) for k in range(3)]
        wb = [_vector(b, bias, d, k * hidden, hidden) for k in range(3)]
        rb = [_vector(b, bias, d, (3 + k) * hidden, hidden) for k in range(3)]
        h = _initial(b, xs[5] if len(xs) > 5 else None, d, batch, hidden)
        ys = [None] * steps
        for t in (reversed(range(steps)) if backwards else range(steps)):
            x_t = _step_input(b, x, t, batch, feats)
            z = E.ggml_sigmoid(b.ctx, _gate(b, wg[0], rg[0], x_t, h, _sum(b, wb[0], rb[0])))
            rr = E.ggml_sigmoid(b.ctx, _gate(b, wg[1], rg[1], x_t, h, _sum(b, wb[1], rb[1])))
            xw = ggml_mul_mat(b.ctx, wg[2], x_t)
            if wb[2] is not None:
                xw = E.ggml_add(b.ctx, xw, wb[2])
            if before:
                hr = ggml_mul_mat(b.ctx, rg[2], h)
                hr = hr if rb[2] is None else E.ggml_add(b.ctx, hr, rb[2])
                cand = E.ggml_tanh(b.ctx, E.ggml_add(b.ctx, xw, E.ggml_mul(b.ctx, rr, hr)))
            else:
                hr = ggml_mul_mat(b.ctx, rg[2], E.ggml_mul(b.ctx, rr, h))
                hr = hr if rb[2] is None else E.ggml_add(b.ctx, hr, rb[2])
                cand = E.ggml_tanh(b.ctx, E.ggml_add(b.ctx, xw, hr))
            h = E.ggml_add(b.ctx, cand, E.ggml_mul(b.ctx, z, E.ggml_sub(b.ctx, h, cand)))   # (1-z) h~ + z h
            ys[t] = h
        outs_y.append(_stack(b, ys, 2))
        outs_h.append(h)
    return _rnn_outputs(b, outs_y, outs_h, steps, batch, hidden, len(flags))


def _step_input(b: Build, x: Value, t: int, batch: int, feats: int):
    """Step ``t`` of the sequence ``x`` (steps, batch, features) as its own [features, batch] tensor (a copy: a view
    at the step's offset is not aligned as every device's kernels need)."""
    view = slice_axis(b, b.tensor(x), x.shape, 0, t, t + 1)
    return ggml_reshape_2d(b.ctx, E.ggml_cont(b.ctx, view), feats, batch)


def _sum(b: Build, p, q):
    if p is None:
        return q
    return p if q is None else E.ggml_add(b.ctx, p, q)


def _rnn_outputs(b: Build, ys: list, hs: list, steps: int, batch: int, hidden: int, dirs: int) -> list:
    """Y (steps, dirs, batch, hidden) and Y_h (dirs, batch, hidden)."""
    per_dir = [b.reshaped(Value((steps, 1, batch, hidden), y), (steps, 1, batch, hidden)) for y in ys]
    y = _stack(b, [b.contiguous(t) for t in per_dir], 2)
    return [Value((steps, dirs, batch, hidden), y), Value((dirs, batch, hidden), _stack(b, hs, 2))]
