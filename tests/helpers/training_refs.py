"""Small models and float64 numpy references for the training tests.

Layout reminder: a tensor with ne = (ne0, ne1) is a C-ordered numpy array of shape (ne1, ne0);
a batch of N samples of K features is an (N, K) array for an input tensor [K, N].
ggml_mul_mat(W [K, M], x [K, N]) -> [M, N] is ``x @ W.T`` with W as an (M, K) array.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import ggmlpy as G


F32 = G.GGML_TYPE_F32


class Net:
    """A no_alloc context of leaf tensors (inputs, parameters) on one backend, plus the ops built on them."""

    def __init__(self, backend: Any, n_tensors: int = 256) -> None:
        self.backend = backend
        self.ctx = G.ggml_init(n_tensors * G.ggml_tensor_overhead() + G.ggml_graph_overhead(1024, True) + 4096,
                               no_alloc=True)
        self.buf = None
        self._values: list[tuple[Any, np.ndarray]] = []

    def leaf(self, shape: tuple[int, ...], value: np.ndarray | None = None, param: bool = False,
             dtype: int = F32) -> Any:
        """A tensor of numpy shape ``shape`` (ggml ne reversed); a parameter gets ``value`` at alloc()."""
        ne = list(reversed(shape))
        t = G.ggml_new_tensor(self.ctx, dtype, len(ne), ne)
        if param:
            G.ggml_set_param(t)
        else:
            G.ggml_set_input(t)
        if value is not None:
            self._values.append((t, np.asarray(value)))
        return t

    def alloc(self) -> Net:
        self.buf = G.ggml_backend_alloc_ctx_tensors(self.ctx, self.backend)
        for t, v in self._values:
            G.ggml_backend_tensor_set_data(t, v.astype(np.float32))
        return self

    def set(self, t: Any, value: np.ndarray) -> None:
        G.ggml_backend_tensor_set_data(t, np.asarray(value, dtype=np.float32))

    @staticmethod
    def get(t: Any) -> np.ndarray:
        """The tensor's values as float32, in numpy layout (ne reversed, trailing 1-axes of ne dropped)."""
        ne = list(G.ggml_tensor_shape(t))
        while len(ne) > 1 and ne[-1] == 1:
            ne.pop()
        return G.ggml_backend_tensor_get_data(t).reshape(tuple(reversed(ne)))

    def free(self) -> None:
        if self.buf is not None:
            self.buf.free()
        self.ctx.free()


class Linear:
    """out = W x + b: x [K, N] input, W [K, M] and b [M] parameters, out [M, N]."""

    def __init__(self, backend: Any, K: int, M: int, N: int, seed: int = 0, bias: bool = True,
                 W: np.ndarray | None = None, b: np.ndarray | None = None) -> None:
        rng = np.random.default_rng(seed)
        self.K, self.M, self.N = K, M, N
        self.W0 = (rng.normal(0, 0.5, (M, K)) if W is None else W).astype(np.float32)
        self.b0 = (rng.normal(0, 0.1, (M,)) if b is None else b).astype(np.float32) if bias else None
        self.net = Net(backend)
        self.x = self.net.leaf((N, K))
        self.W = self.net.leaf((M, K), self.W0, param=True)
        self.b = self.net.leaf((M,), self.b0, param=True) if bias else None
        self.net.alloc()
        self.out = G.ggml_mul_mat(self.net.ctx, self.W, self.x)
        if bias:
            self.out = G.ggml_add(self.net.ctx, self.out, self.b)

    def params(self) -> dict[str, np.ndarray]:
        p = {"W": Net.get(self.W).astype(np.float64)}
        if self.b is not None:
            p["b"] = Net.get(self.b).astype(np.float64)
        return p

    def free(self) -> None:
        self.net.free()


# ---------------------------------------------------------------- float64 references

def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def loss_and_dout(kind: str, out: np.ndarray, y: np.ndarray | None = None, w: np.ndarray | None = None,
                  eps: float = 1e-7) -> tuple[float, np.ndarray]:
    """ggmlR's loss of one physical batch (``out`` is (N, ne0)) and its gradient with respect to ``out``."""
    out = np.asarray(out, dtype=np.float64)
    n = out.size
    if kind == "mean":
        return out.sum() / n, np.full_like(out, 1.0 / n)
    if kind == "sum":
        return out.sum(), np.ones_like(out)
    if kind == "cross_entropy":
        p = softmax(out)
        rows = out.shape[0]
        logp = np.log(p)
        return -(y * logp).sum() / rows, (p * y.sum(axis=1, keepdims=True) - y) / rows
    e = out - y
    if kind == "mse":
        return (e ** 2).sum() / n, 2 * e / n
    if kind == "weighted_mse":
        wb = np.broadcast_to(w, out.shape)
        return (wb * e ** 2).sum() / n, 2 * wb * e / n
    if kind == "mae":
        return np.abs(e).sum() / n, np.sign(e) / n
    if kind == "huber":
        a = np.abs(e)
        return np.where(a <= 1, 0.5 * e ** 2, a - 0.5).sum() / n, np.clip(e, -1, 1) / n
    if kind == "binary_cross_entropy":
        p = out * (1 - 2 * eps) + eps
        loss = -(y * np.log(p) + (1 - y) * np.log(1 - p)).sum() / n
        return loss, -(1 - 2 * eps) * (y / p - (1 - y) / (1 - p)) / n
    if kind == "custom_log_cosh":  # Keras' LogCosh, the custom loss of test_losses: mean log(cosh(out - y))
        e = out - y
        return np.log(np.cosh(e)).sum() / n, np.tanh(e) / n
    if kind == "binary_cross_entropy_logits":  # Keras' from_logits=True: -(y log s + (1 - y) log(1 - s)), s = sigmoid
        log_s, log_not_s = -np.logaddexp(0, -out), -np.logaddexp(0, out)
        return -(y * log_s + (1 - y) * log_not_s).sum() / n, (1 / (1 + np.exp(-out)) - y) / n
    if kind == "kl_divergence":  # Keras: the mean over rows of sum_k y log(y / p), both kept above eps in the logs
        rows = out.shape[0]
        p, yq = out * (1 - 2 * eps) + eps, y * (1 - 2 * eps) + eps
        return (y * (np.log(yq) - np.log(p))).sum() / rows, -(1 - 2 * eps) * y / p / rows
    if kind == "cosine_similarity":  # Keras: -mean over rows of (y/|y|).(p/|p|)
        rows = out.shape[0]
        r = np.sqrt((out ** 2).sum(axis=1, keepdims=True) + 1e-12)
        yn = y / np.sqrt((y ** 2).sum(axis=1, keepdims=True) + 1e-12)
        pn = out / r
        cos = (yn * pn).sum(axis=1, keepdims=True)
        return -cos.sum() / rows, -(yn - cos * pn) / r / rows
    if kind in ("hinge", "squared_hinge"):  # Keras: max(1 - y out, 0), squared for squared_hinge; labels -1 / 1
        margin = np.maximum(1 - y * out, 0)
        active = (1 - y * out) > 0
        if kind == "hinge":
            return margin.sum() / n, np.where(active, -y, 0.0) / n
        return (margin ** 2).sum() / n, -2 * margin * y / n
    raise ValueError(kind)


def linear_forward(p: dict, x: np.ndarray) -> np.ndarray:
    out = x @ p["W"].T
    return out + p["b"] if "b" in p else out


def linear_grads(p: dict, x: np.ndarray, dout: np.ndarray) -> dict:
    g = {"W": dout.T @ x}
    if "b" in p:
        g["b"] = dout.sum(axis=0)
    return g


def adamw_step(p: dict, g: dict, state: dict, lr: float, wd: float = 0.0, beta1: float = 0.9,
               beta2: float = 0.999, eps: float = 1e-8) -> None:
    """ggml's OPT_STEP_ADAMW (ggml-internals 1.12), in place, float64."""
    state["t"] = state.get("t", 0) + 1
    t = state["t"]
    for k in p:
        m = state.setdefault("m_" + k, np.zeros_like(p[k]))
        v = state.setdefault("v_" + k, np.zeros_like(p[k]))
        m[...] = beta1 * m + (1 - beta1) * g[k]
        v[...] = beta2 * v + (1 - beta2) * g[k] ** 2
        mh = m / (1 - beta1 ** t)
        vh = np.sqrt(v / (1 - beta2 ** t)) + eps
        p[k] = p[k] * (1 - lr * wd) - lr * mh / vh


def sgd_step(p: dict, g: dict, lr: float, wd: float = 0.0) -> None:
    for k in p:
        p[k] = p[k] * (1 - lr * wd) - lr * g[k]
