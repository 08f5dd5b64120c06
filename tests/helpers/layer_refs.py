"""Float64 numpy references of the model layer's layers, with Keras semantics.

Written from the Keras definitions, not from ggmlpy: data is sample-major and channels last
(``x`` of shape ``(N, *sample_shape)``), and weights are in the user's (Keras) orientation as
``ggml_get_weights`` returns them:

* dense ``weight`` (in, units), ``bias`` (units,)
* conv_2d ``kernel`` (rows, cols, in_channels, filters), conv_1d ``kernel`` (size, in_channels, filters),
  ``bias`` (filters,)
* batch_norm ``gamma``, ``beta``, ``running_mean``, ``running_var`` (C,)
* embedding ``weight`` (vocab_size, dim); position_embedding ``weight`` (sequence_length, dim)
* lstm ``kernel`` (features, 4 units), ``recurrent_kernel`` (units, 4 units), ``bias`` (4 units,), gates in
  Keras' order i, f, c, o
* gru (Keras' ``reset_after=True``) ``kernel`` (features, 3 units), ``recurrent_kernel`` (units, 3 units),
  ``bias`` (2, 3 units) (input bias, recurrent bias), gates in Keras' order z, r, h
* layer_norm ``gamma``, ``beta`` (features,)
* multi_head_attention ``query_kernel``/``key_kernel``/``value_kernel`` (dim, heads, key_dim), their biases
  (heads, key_dim), ``output_kernel`` (heads, key_dim, dim), ``output_bias`` (dim,)

Every function takes and returns float64 arrays and never calls ggmlpy.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Callable

import numpy as np


SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# ---------------------------------------------------------------- activations

def softmax(z: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def activation(z: np.ndarray, name: str | None) -> np.ndarray:
    """Keras' activations by name; ``gelu`` is the tanh approximation."""
    z = np.asarray(z, dtype=np.float64)
    if name is None or name == "linear":
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    if name == "tanh":
        return np.tanh(z)
    if name == "gelu":
        return 0.5 * z * (1.0 + np.tanh(SQRT_2_OVER_PI * (z + 0.044715 * z ** 3)))
    if name == "silu":
        return z / (1.0 + np.exp(-z))
    if name == "softmax":
        return softmax(z, axis=-1)
    # the others Keras 3 names (keras.activations), written from their definitions
    if name in ("elu", "selu"):
        alpha, scale = (1.0, 1.0) if name == "elu" else (1.6732632423543772, 1.0507009873554805)
        return scale * np.where(z > 0, z, alpha * np.expm1(np.minimum(z, 0)))
    if name == "leaky_relu":
        return np.where(z > 0, z, 0.2 * z)
    if name == "relu6":
        return np.clip(z, 0.0, 6.0)
    if name == "hard_sigmoid":
        return np.clip(z + 3.0, 0.0, 6.0) / 6.0
    if name == "hard_silu":
        return z * np.clip(z + 3.0, 0.0, 6.0) / 6.0
    if name == "softsign":
        return z / (1.0 + np.abs(z))
    if name == "softplus":
        return np.logaddexp(0.0, z)
    if name == "mish":
        return z * np.tanh(np.logaddexp(0.0, z))
    if name == "exponential":
        return np.exp(z)
    if name == "celu":   # alpha 1: max(0, x) + min(0, alpha (exp(x / alpha) - 1))
        return np.maximum(z, 0) + np.minimum(0, np.expm1(z))
    if name == "log_sigmoid":
        return -np.logaddexp(0.0, -z)
    if name == "hard_tanh":
        return np.clip(z, -1.0, 1.0)
    if name == "soft_shrink":
        return np.where(z > 0.5, z - 0.5, np.where(z < -0.5, z + 0.5, 0.0))
    if name == "tanh_shrink":
        return z - np.tanh(z)
    if name == "squareplus":
        return (z + np.sqrt(z * z + 4.0)) / 2
    if name == "sparse_plus":
        return np.where(z <= -1, 0.0, np.where(z >= 1, z, (z + 1) ** 2 / 4))
    raise ValueError(f"unknown activation {name!r}")


# ---------------------------------------------------------------- dense / conv / pooling

def dense(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None, act: str | None = None) -> np.ndarray:
    """``act(x @ weight + bias)`` over the last axis of ``x``."""
    z = np.asarray(x, np.float64) @ np.asarray(weight, np.float64)
    if bias is not None:
        z = z + np.asarray(bias, np.float64)
    return activation(z, act)


def same_padding(n: int, k: int, s: int) -> tuple[int, int, int]:
    """Keras 'same' along one axis: (output size, padding before, padding after)."""
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return out, total // 2, total - total // 2


def _pad_and_size(n: int, k: int, s: int, padding: str) -> tuple[int, int, int]:
    if padding == "valid":
        return (n - k) // s + 1, 0, 0
    if padding == "same":
        return same_padding(n, k, s)
    raise ValueError(padding)


def _dilated(kernel: np.ndarray, rates: Sequence[int]) -> np.ndarray:
    """The kernel with rate - 1 zeros between its taps along each spatial axis (the leading axes)."""
    kernel = np.asarray(kernel, np.float64)
    spatial = kernel.shape[:len(rates)]
    out = np.zeros(tuple(r * (k - 1) + 1 for k, r in zip(spatial, rates)) + kernel.shape[len(rates):])
    out[tuple(slice(None, None, r) for r in rates)] = kernel
    return out


def conv2d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None = None, strides: Sequence[int] = (1, 1),
           padding: str = "valid", act: str | None = None, dilation: Sequence[int] = (1, 1)) -> np.ndarray:
    """Keras Conv2D (cross-correlation): ``x`` (N, H, W, Cin), ``kernel`` (kh, kw, Cin, F) -> (N, OH, OW, F)."""
    x = np.asarray(x, np.float64)
    kernel = _dilated(kernel, dilation)
    n, h, w, cin = x.shape
    kh, kw, kcin, f = kernel.shape
    assert kcin == cin
    sh, sw = strides
    oh, top, bottom = _pad_and_size(h, kh, sh, padding)
    ow, left, right = _pad_and_size(w, kw, sw, padding)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    out = np.zeros((n, oh, ow, f))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, i * sh:i * sh + kh, j * sw:j * sw + kw, :]          # (N, kh, kw, Cin)
            out[:, i, j, :] = np.einsum("nabc,abcf->nf", patch, kernel)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    return activation(out, act)


def conv1d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray | None = None, stride: int = 1,
           padding: str = "valid", act: str | None = None, dilation: int = 1) -> np.ndarray:
    """Keras Conv1D: ``x`` (N, L, Cin), ``kernel`` (k, Cin, F) -> (N, OL, F)."""
    x = np.asarray(x, np.float64)
    kernel = _dilated(kernel, (dilation,))
    n, length, cin = x.shape
    k, kcin, f = kernel.shape
    assert kcin == cin
    ol, before, after = _pad_and_size(length, k, stride, padding)
    xp = np.pad(x, ((0, 0), (before, after), (0, 0)))
    out = np.zeros((n, ol, f))
    for i in range(ol):
        out[:, i, :] = np.einsum("nac,acf->nf", xp[:, i * stride:i * stride + k, :], kernel)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    return activation(out, act)


def _pooling_2d(x: np.ndarray, pool_size: Sequence[int], strides: Sequence[int] | None, reduce) -> np.ndarray:
    """Keras' 2-D pooling with padding 'valid': ``reduce`` over each window, (N, H, W, C) -> (N, OH, OW, C)."""
    x = np.asarray(x, np.float64)
    ph, pw = pool_size
    sh, sw = strides if strides is not None else pool_size
    n, h, w, c = x.shape
    oh, ow = (h - ph) // sh + 1, (w - pw) // sw + 1
    out = np.empty((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            out[:, i, j, :] = reduce(x[:, i * sh:i * sh + ph, j * sw:j * sw + pw, :], axis=(1, 2))
    return out


def _same_windows(size: int, k: int, s: int) -> list[slice]:
    """Keras' padding='same' windows over one axis: ceil(size / s) of them, clipped to the input (the padded
    positions take no part in a max or a mean)."""
    out = -(-size // s)
    before = max((out - 1) * s + k - size, 0) // 2
    return [slice(max(i * s - before, 0), min(i * s - before + k, size)) for i in range(out)]


def pooling_same(x: np.ndarray, pool_size: Sequence[int], strides: Sequence[int] | None, op: str) -> np.ndarray:
    """Keras' MaxPooling / AveragePooling (1-D: (N, steps, C); 2-D: (N, H, W, C)) with padding='same'."""
    x = np.asarray(x, np.float64)
    strides = strides or pool_size
    reduce = np.max if op == "max" else np.mean
    axes = [_same_windows(x.shape[1 + a], pool_size[a], strides[a]) for a in range(len(pool_size))]
    if len(axes) == 1:
        return np.stack([reduce(x[:, w, :], axis=1) for w in axes[0]], axis=1)
    return np.stack([np.stack([reduce(x[:, r, c, :], axis=(1, 2)) for c in axes[1]], axis=1) for r in axes[0]],
                    axis=1)


def max_pooling_2d(x: np.ndarray, pool_size: Sequence[int] = (2, 2), strides: Sequence[int] | None = None
                   ) -> np.ndarray:
    """Keras MaxPooling2D with padding 'valid'."""
    return _pooling_2d(x, pool_size, strides, np.max)


def average_pooling_2d(x: np.ndarray, pool_size: Sequence[int] = (2, 2), strides: Sequence[int] | None = None
                       ) -> np.ndarray:
    """Keras AveragePooling2D with padding 'valid': the mean of each window."""
    return _pooling_2d(x, pool_size, strides, np.mean)


def pooling_1d(x: np.ndarray, pool_size: int, strides: int | None, op: str) -> np.ndarray:
    """Keras MaxPooling1D / AveragePooling1D with padding 'valid': (N, steps, C) -> (N, out_steps, C)."""
    x = np.asarray(x, np.float64)
    s = strides or pool_size
    out_steps = (x.shape[1] - pool_size) // s + 1
    windows = [x[:, i * s:i * s + pool_size, :] for i in range(out_steps)]
    return np.stack([w.max(axis=1) if op == "max" else w.mean(axis=1) for w in windows], axis=1)


def upsampling_2d(x: np.ndarray, size: Sequence[int] = (2, 2)) -> np.ndarray:
    """Keras UpSampling2D(interpolation='nearest'): each pixel repeated size[0] x size[1] times."""
    return np.repeat(np.repeat(np.asarray(x, np.float64), size[0], axis=1), size[1], axis=2)


def repeat_vector(x: np.ndarray, n: int) -> np.ndarray:
    """Keras RepeatVector: (N, F) -> (N, n, F)."""
    return np.repeat(np.asarray(x, np.float64)[:, None, :], n, axis=1)


def global_average_pooling_2d(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).mean(axis=(1, 2))


def global_max_pooling_2d(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64).max(axis=(1, 2))


def flatten(x: np.ndarray) -> np.ndarray:
    """Keras Flatten: a C-order reshape of each sample (channels fastest)."""
    x = np.asarray(x, np.float64)
    return x.reshape(x.shape[0], -1)


# ---------------------------------------------------------------- normalisation, dropout, embedding

def batch_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (last axis) mean and biased variance over every other axis (batch included)."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(x.ndim - 1))
    return x.mean(axis=axes), x.var(axis=axes)


def batch_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, running_mean: np.ndarray,
               running_var: np.ndarray, eps: float = 1e-5, training: bool = False) -> np.ndarray:
    """Keras BatchNormalization over the last axis: batch statistics in training, running ones otherwise."""
    x = np.asarray(x, np.float64)
    if training:
        mean, var = batch_stats(x)
    else:
        mean, var = np.asarray(running_mean, np.float64), np.asarray(running_var, np.float64)
    return (x - mean) / np.sqrt(var + eps) * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)


def running_update(running: np.ndarray, batch: np.ndarray, momentum: float) -> np.ndarray:
    """Keras: ``running = momentum * running + (1 - momentum) * batch``."""
    return momentum * np.asarray(running, np.float64) + (1.0 - momentum) * np.asarray(batch, np.float64)


def dropout(x: np.ndarray, rate: float, training: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Inverted dropout: identity in inference; in training ``x * mask / (1 - rate)`` with a 0/1 ``mask``."""
    x = np.asarray(x, np.float64)
    if not training or rate == 0:
        return x
    assert mask is not None
    return x * mask / (1.0 - rate)


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Keras Embedding: ids (N, steps) -> (N, steps, dim) rows of ``table`` (vocab, dim)."""
    return np.asarray(table, np.float64)[np.asarray(ids, np.int64)]


# ---------------------------------------------------------------- merging

def add(xs: Sequence[np.ndarray]) -> np.ndarray:
    out = np.asarray(xs[0], np.float64)
    for x in xs[1:]:
        out = out + np.asarray(x, np.float64)
    return out


def concatenate(xs: Sequence[np.ndarray], axis: int = -1) -> np.ndarray:
    """Keras Concatenate: ``axis`` counts the axes of one sample (negative from the end); the batch
    axis is never joined."""
    arrs = [np.asarray(x, np.float64) for x in xs]
    np_axis = axis + 1 if axis >= 0 else axis
    return np.concatenate(arrs, axis=np_axis)


# ---------------------------------------------------------------- loss and finite differences

def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def recurrence(cell: Callable, x: np.ndarray, units: int, n_states: int, return_sequences: bool = False,
               mask: np.ndarray | None = None, initial_state: Sequence[np.ndarray] | None = None,
               return_state: bool = False, zero_output_for_mask: bool = False):
    """Keras' RNN loop over ``x`` (N, steps, features): ``cell(x_t, states) -> (output, new states)`` from
    ``initial_state`` (zeros by default). Where ``mask`` (N, steps) is False the step is skipped: the states are
    carried over and its output is the previous step's output (zeros before the first), or zeros with
    ``zero_output_for_mask`` (which Keras' Bidirectional sets with return_sequences). Returns the output sequence
    (``return_sequences``) or the last output, and with ``return_state`` ``[output, *final states]``."""
    x = np.asarray(x, np.float64)
    n, steps, _ = x.shape
    states = [np.zeros((n, units)) for _ in range(n_states)] if initial_state is None else \
        [np.asarray(s, np.float64) for s in initial_state]
    prev, seq = np.zeros((n, units)), []
    for t in range(steps):
        out, new = cell(x[:, t], states)
        if mask is not None:
            keep = np.asarray(mask, bool)[:, t, None]
            new = [np.where(keep, a, b) for a, b in zip(new, states)]
            out = np.where(keep, out, 0.0 if zero_output_for_mask else prev)
        states, prev = new, out
        seq.append(out)
    output = np.stack(seq, axis=1) if return_sequences else seq[-1]
    return [output, *states] if return_state else output


def lstm(x: np.ndarray, kernel: np.ndarray, recurrent_kernel: np.ndarray, bias: np.ndarray,
         return_sequences: bool = False, **kw):
    """Keras' LSTM (tanh, sigmoid gates) over ``x`` (N, steps, features), states [h, c]; ``kw``: ``recurrence``'s
    mask, initial_state, return_state, zero_output_for_mask."""
    units = recurrent_kernel.shape[0]

    def cell(x_t, states):
        h, c = states
        z = x_t @ kernel + h @ recurrent_kernel + bias
        i, f, cc, o = (z[:, k * units:(k + 1) * units] for k in range(4))
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(cc)
        h = sigmoid(o) * np.tanh(c)
        return h, [h, c]
    return recurrence(cell, x, units, 2, return_sequences, **kw)


def gru(x: np.ndarray, kernel: np.ndarray, recurrent_kernel: np.ndarray, bias: np.ndarray,
        return_sequences: bool = False, **kw):
    """Keras' GRU with ``reset_after=True`` (its default) over ``x`` (N, steps, features), state [h]; ``kw`` as
    ``lstm``'s."""
    units = recurrent_kernel.shape[0]

    def cell(x_t, states):
        h, = states
        xz = x_t @ kernel + bias[0]
        hz = h @ recurrent_kernel + bias[1]
        z = sigmoid(xz[:, :units] + hz[:, :units])
        r = sigmoid(xz[:, units:2 * units] + hz[:, units:2 * units])
        hh = np.tanh(xz[:, 2 * units:] + r * hz[:, 2 * units:])
        h = z * h + (1 - z) * hh
        return h, [h]
    return recurrence(cell, x, units, 1, return_sequences, **kw)


def bidirectional(x: np.ndarray, w: dict, prefix: str, rnn: Callable, return_sequences: bool = False,
                  merge_mode: str = "concat", mask: np.ndarray | None = None) -> np.ndarray:
    """Keras' Bidirectional around ``rnn`` (``lstm`` or ``gru``), weights ``<prefix>.forward_<name>`` and
    ``<prefix>.backward_<name>``: the backward copy reads the steps (and the mask) last to first, its sequence is
    flipped back into the input's order; with return_sequences masked steps output zeros (Keras forces
    zero_output_for_mask); the two merged by ``merge_mode`` (concat, sum, mul, ave)."""
    def run(direction, xs, m):
        return rnn(xs, w[f"{prefix}.{direction}_kernel"], w[f"{prefix}.{direction}_recurrent_kernel"],
                   w[f"{prefix}.{direction}_bias"], return_sequences, mask=m, zero_output_for_mask=return_sequences)
    x = np.asarray(x, np.float64)
    fwd = run("forward", x, mask)
    bwd = run("backward", x[:, ::-1], None if mask is None else np.asarray(mask)[:, ::-1])
    if return_sequences:
        bwd = bwd[:, ::-1]
    return {"concat": lambda: np.concatenate([fwd, bwd], axis=-1), "sum": lambda: fwd + bwd,
            "mul": lambda: fwd * bwd, "ave": lambda: (fwd + bwd) / 2}[merge_mode]()


def masked_average(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Keras' GlobalAveragePooling1D with a mask (N, steps): the mean over the real steps."""
    m = np.asarray(mask, np.float64)[..., None]
    return (np.asarray(x, np.float64) * m).sum(axis=1) / m.sum(axis=1)


def time_distributed(fn: Callable, x: np.ndarray) -> np.ndarray:
    """Keras' TimeDistributed: ``fn`` on each step ``x[:, t]`` (one set of weights), stacked along axis 1."""
    x = np.asarray(x, np.float64)
    return np.stack([fn(x[:, t]) for t in range(x.shape[1])], axis=1)


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Normalise each position over its last axis (biased variance), then scale and shift."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def multi_head_attention(query: np.ndarray, w: dict, prefix: str, causal: bool = False,
                         value: np.ndarray | None = None, key: np.ndarray | None = None,
                         mask: np.ndarray | None = None) -> np.ndarray:
    """Keras' MultiHeadAttention(query, value, key, attention_mask): ``value`` is ``query`` by default
    (self-attention), ``key`` is ``value``; per head ``softmax(q k^T / sqrt(key_dim)) v``, where ``mask``
    (N, query steps, value steps) is 0 Keras' masked softmax adds -1e9 to the score, and ``causal`` hides later
    steps; then the output projection back to the query's dimension."""
    q_in = np.asarray(query, np.float64)
    v_in = q_in if value is None else np.asarray(value, np.float64)
    k_in = v_in if key is None else np.asarray(key, np.float64)
    q = np.einsum("ntd,dhk->nthk", q_in, w[prefix + ".query_kernel"]) + w[prefix + ".query_bias"]
    k = np.einsum("ntd,dhk->nthk", k_in, w[prefix + ".key_kernel"]) + w[prefix + ".key_bias"]
    v = np.einsum("ntd,dhk->nthk", v_in, w[prefix + ".value_kernel"]) + w[prefix + ".value_bias"]
    scores = np.einsum("nqhk,nshk->nhqs", q / np.sqrt(q.shape[-1]), k)
    if mask is not None:
        scores = scores + (1.0 - np.asarray(mask, np.float64)[:, None]) * -1e9
    if causal:
        scores = np.where(np.triu(np.ones(scores.shape[-2:], bool), 1), -np.inf, scores)
    att = softmax(scores, axis=-1)
    o = np.einsum("nhqs,nshk->nqhk", att, v)
    return np.einsum("nqhk,hkd->nqd", o, w[prefix + ".output_kernel"]) + w[prefix + ".output_bias"]


def position_embedding(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """``x`` (N, steps, dim) plus a learned vector per position (row ``t`` of ``table`` at step ``t``)."""
    x = np.asarray(x, np.float64)
    return x + np.asarray(table, np.float64)[: x.shape[1]]


def mse(pred, y) -> float:
    """Keras/ggml mean squared error over every output element; for a multi-output model (lists) the sum of the
    outputs' losses (Keras' total loss, loss weights 1)."""
    if isinstance(pred, (list, tuple)):
        assert len(pred) == len(y)
        return sum(mse(p, t) for p, t in zip(pred, y))
    d = np.asarray(pred, np.float64) - np.asarray(y, np.float64)
    return float(np.mean(d * d))


def fd_gradients(loss: Callable[[dict], float], weights: dict, names: Sequence[str], h: float = 1e-6
                 ) -> dict[str, np.ndarray]:
    """Central finite differences of ``loss(weights)`` (float64) w.r.t. each weight named in ``names``."""
    w = {k: np.array(v, dtype=np.float64) for k, v in weights.items()}
    grads = {}
    for name in names:
        arr = w[name]
        g = np.zeros_like(arr)
        flat, gflat = arr.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            old = flat[i]
            flat[i] = old + h
            up = loss(w)
            flat[i] = old - h
            down = loss(w)
            flat[i] = old
            gflat[i] = (up - down) / (2 * h)
        grads[name] = g
    return grads
