"""Training throughput of examples/char_transformer.py's model, ggmlpy next to PyTorch CPU, and what it costs.

(a) throughput: the example's transformer (token embedding + learned positions, 2 pre-norm blocks of
    causal multi-head attention and a GELU MLP, final layer norm, softmax over 98 characters), trained
    with AdamW on the same batches of standard-library text (the example's stream, made once and kept in
    memory), in alternating rounds in one process:
      ggmlpy:  ``ggml_fit_generator(model, batches, epochs=2, verbose=0)``, the second epoch timed (the
               first builds the graph, the optimizer and the allocations);
      PyTorch: the same architecture as ``torch.nn`` modules (separate q/k/v projections as ggmlpy,
               ``scaled_dot_product_attention(is_causal=True)``, tanh GELU, AdamW), a warm-up epoch, then
               the timed epoch; starting from ggmlpy's initial weights (the first batch's loss is compared:
               the two sides compute the same function).
    When ggmlpy's build has ggml's BLAS backend (OpenBLAS, which takes the large F32 products), a third side
    runs ggmlpy with it switched off (``ggml_set_blas_enabled(False)``): ggml's own CPU kernels. All with
    the same thread count (``ggml_set_n_threads`` / ``torch.set_num_threads``). Tokens/s = batch x sequence
    length x steps / seconds; the ratio is taken per round (the order rotates) and for the best runs.
(b) attention cost vs sequence length: one causal multi-head attention layer (dim 128, 4 heads of 32,
    batch 8, MSE against a random target, AdamW), step time for lengths 64, 128, 256, 512 with the growth
    per doubling (linear parts: 2x; the T^2 scores: 4x), ggmlpy and PyTorch (SDPA, and a "naive" PyTorch
    attention that materialises the scores as ggml does).
(c) where the time goes, by timing variants: the transformer's training step without its attention
    layers, its forward pass alone (``ggml_predict`` / ``torch.no_grad``), and op by op at the model's
    shapes, as single-op graphs on ggml's CPU backend (its own kernels, no BLAS) next to torch: the three
    products of an MLP layer's training step (``ggml_mul_mat`` forward; ``ggml_out_prod``, which ggml's
    backward uses for both the weight and the input gradients), the six of the attention core (scores,
    values and their gradients, batched over heads x batch) and the masked softmax.

The machine is shared and noisy: only ratios measured in one run count; the best run of each side is
the least disturbed. Usage: python benchmarks/bench_transformer.py [--threads 2] [--reps 4] [--steps 6]
[--parts a,b,c] [--lengths 64,128,256,512] [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
import char_transformer as CT  # noqa: E402  the example's model and text stream
from bench_fit import loadavg  # noqa: E402

import ggmlpy as G  # noqa: E402


try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - optional
    torch = None


# ---------------------------------------------------------------- sizes

FULL = {k: CT.DEFAULT[k] for k in ("seq", "dim", "heads", "blocks", "batch")}   # the example's default model
QUICK = {k: CT.QUICK[k] for k in ("seq", "dim", "heads", "blocks", "batch")}    # the example's --quick model
LR = 1e-3


# ---------------------------------------------------------------- ggmlpy side

def ggml_model(cfg: dict, attention: bool = True):
    """The example's model (``char_transformer.build_model``), or the same without its attention layers."""
    np.random.seed(0)
    if attention:
        return CT.build_model(cfg["seq"], cfg["dim"], cfg["heads"], cfg["blocks"], "cpu", LR)
    ids = G.ggml_input((cfg["seq"],), dtype="int32", name="ids")
    x = G.ggml_layer_position_embedding(G.ggml_layer_embedding(ids, CT.VOCAB, cfg["dim"], name="tok"), cfg["seq"],
                                        name="pos")
    for b in range(cfg["blocks"]):
        m = G.ggml_layer_dense(G.ggml_layer_layer_norm(x, name=f"b{b}_ln2"), 4 * cfg["dim"], activation="gelu",
                               name=f"b{b}_fc1")
        x = G.ggml_layer_add([x, G.ggml_layer_dense(m, cfg["dim"], name=f"b{b}_fc2")])
    out = G.ggml_layer_dense(G.ggml_layer_layer_norm(x, name="ln_f"), CT.VOCAB, activation="softmax", name="head")
    return G.ggml_compile(G.ggml_model(ids, out), optimizer="adamw", loss="sparse_categorical_crossentropy",
                          backend="cpu", learning_rate=LR, weight_decay=0.01)


def has_blas() -> bool:
    """Whether ggmlpy's CPU schedulers use ggml's BLAS backend (built, and not switched off)."""
    return G.ggml_backend_dev_by_name("BLAS") is not None


@contextlib.contextmanager
def blas_enabled(enabled: bool):
    """ggml's BLAS backend on or off for the schedulers made inside the block (each fit makes its own)."""
    if not has_blas() or enabled:
        yield
        return
    G.ggml_set_blas_enabled(False)
    try:
        yield
    finally:
        G.ggml_set_blas_enabled(True)


class EpochTimer:
    """ggmlR callback: the duration of each epoch."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t = 0.0
        self.cb = {"on_epoch_begin": self._begin, "on_epoch_end": self._end}

    def _begin(self, epoch, logs, state):
        self._t = time.perf_counter()

    def _end(self, epoch, logs, state):
        self.seconds.append(time.perf_counter() - self._t)


def ggml_train_step_s(model, batches: list, init: dict) -> tuple[float, float]:
    """Seconds per training step (the second of two epochs over ``batches``) and the last epoch's loss."""
    G.ggml_set_weights(model, init)
    model.runtime.opt_state.state = None   # a fresh AdamW (a fit continues the last one's moments otherwise)
    timer = EpochTimer()
    hist = G.ggml_fit_generator(model, batches, epochs=2, verbose=0, callbacks=[timer.cb])
    return timer.seconds[-1] / len(batches), float(hist["train_loss"].iloc[-1])


def ggml_forward_s(model, batches: list) -> float:
    G.ggml_predict(model, batches[0][0], batch_size=len(batches[0][0]))   # builds the inference graph
    t = time.perf_counter()
    for x, _ in batches:
        G.ggml_predict(model, x, batch_size=len(x))
    return (time.perf_counter() - t) / len(batches)


# ---------------------------------------------------------------- PyTorch side (the same architecture)

if torch is not None:
    class Attention(torch.nn.Module):
        def __init__(self, dim: int, heads: int, key_dim: int, naive: bool = False) -> None:
            super().__init__()
            self.h, self.k, self.naive = heads, key_dim, naive
            self.q, self.kp, self.v = (torch.nn.Linear(dim, heads * key_dim) for _ in range(3))
            self.o = torch.nn.Linear(heads * key_dim, dim)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (p(x).view(b, t, self.h, self.k).transpose(1, 2) for p in (self.q, self.kp, self.v))
            if self.naive:   # the scores materialised, full T x T, masked, softmax: what ggmlpy computes
                s = (q @ k.transpose(-1, -2)) / math.sqrt(self.k)
                s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
                y = torch.softmax(s, -1) @ v
            else:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(b, t, self.h * self.k))

    class Block(torch.nn.Module):
        def __init__(self, dim: int, heads: int, attention: bool = True) -> None:
            super().__init__()
            self.attention = attention
            if attention:
                self.ln1, self.att = torch.nn.LayerNorm(dim), Attention(dim, heads, dim // heads)
            self.ln2 = torch.nn.LayerNorm(dim)
            self.fc1, self.fc2 = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

        def forward(self, x):
            if self.attention:
                x = x + self.att(self.ln1(x))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class CharTransformer(torch.nn.Module):
        def __init__(self, cfg: dict, attention: bool = True) -> None:
            super().__init__()
            self.tok = torch.nn.Embedding(CT.VOCAB, cfg["dim"])
            self.pos = torch.nn.Parameter(torch.zeros(cfg["seq"], cfg["dim"]))
            self.blocks = torch.nn.ModuleList(Block(cfg["dim"], cfg["heads"], attention) for _ in range(cfg["blocks"]))
            self.ln_f, self.head = torch.nn.LayerNorm(cfg["dim"]), torch.nn.Linear(cfg["dim"], CT.VOCAB)

        def forward(self, ids):
            x = self.tok(ids) + self.pos
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln_f(x))


def torch_from_ggml(net, w: dict) -> None:
    """Copy ggmlpy's weights (``ggml_get_weights``: Keras' orientation) into the PyTorch model."""
    def put(param, value):
        with torch.no_grad():
            param.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)).reshape(param.shape))
    put(net.tok.weight, w["tok.weight"])
    put(net.pos, w["pos.weight"])
    for b, blk in enumerate(net.blocks):
        if blk.attention:
            put(blk.ln1.weight, w[f"b{b}_ln1.gamma"]); put(blk.ln1.bias, w[f"b{b}_ln1.beta"])   # noqa: E702
            for mod, name in ((blk.att.q, "query"), (blk.att.kp, "key"), (blk.att.v, "value")):
                kern = w[f"b{b}_att.{name}_kernel"]                         # (dim, heads, key_dim)
                put(mod.weight, kern.reshape(kern.shape[0], -1).T)
                put(mod.bias, w[f"b{b}_att.{name}_bias"].reshape(-1))
            out = w[f"b{b}_att.output_kernel"]                              # (heads, key_dim, dim)
            put(blk.att.o.weight, out.reshape(-1, out.shape[-1]).T)
            put(blk.att.o.bias, w[f"b{b}_att.output_bias"])
        put(blk.ln2.weight, w[f"b{b}_ln2.gamma"]); put(blk.ln2.bias, w[f"b{b}_ln2.beta"])       # noqa: E702
        put(blk.fc1.weight, w[f"b{b}_fc1.weight"].T); put(blk.fc1.bias, w[f"b{b}_fc1.bias"])    # noqa: E702
        put(blk.fc2.weight, w[f"b{b}_fc2.weight"].T); put(blk.fc2.bias, w[f"b{b}_fc2.bias"])    # noqa: E702
    put(net.ln_f.weight, w["ln_f.gamma"]); put(net.ln_f.bias, w["ln_f.beta"])                   # noqa: E702
    put(net.head.weight, w["head.weight"].T); put(net.head.bias, w["head.bias"])                # noqa: E702


def torch_batches(batches: list) -> list:
    return [(torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))) for x, y in batches]


def torch_train_step_s(net, tb: list, init_state: dict, loss_fn) -> tuple[float, float]:
    net.load_state_dict(init_state)
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.01)   # ggml's AdamW: betas 0.9/0.999, eps 1e-8
    t = 0.0
    for epoch in range(2):
        if epoch == 1:
            t = time.perf_counter()
        total = 0.0
        for x, y in tb:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
    return (time.perf_counter() - t) / len(tb), total / len(tb)


def token_ce(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def torch_forward_s(net, tb: list) -> float:
    with torch.no_grad():
        torch.softmax(net(tb[0][0]), -1)
        t = time.perf_counter()
        for x, _ in tb:
            torch.softmax(net(x), -1)
    return (time.perf_counter() - t) / len(tb)


# ---------------------------------------------------------------- (a) throughput

def part_a(cfg: dict, steps: int, reps: int) -> dict:
    batch, seq = cfg["batch"], cfg["seq"]
    stream = CT.windows(CT.corpus_files()[0], seq, batch, seed=0)
    batches = [next(stream) for _ in range(steps)]
    tokens = batch * seq
    model = ggml_model(cfg)
    init = G.ggml_get_weights(model)
    print(f"\n== (a) training throughput: dim {cfg['dim']}, {cfg['heads']} heads, {cfg['blocks']} blocks, "
          f"sequence {seq}, batch {batch} ({tokens} tokens/step), {steps} timed steps per run, {reps} alternating "
          "pairs")
    res = {"cfg": cfg, "steps": steps, "blas": has_blas(), "pairs": []}
    if torch is None:
        print("  PyTorch is not installed: ggmlpy only")
    else:
        net = CharTransformer(cfg)
        torch_from_ggml(net, init)
        init_state = {k: v.clone() for k, v in net.state_dict().items()}
        tb = torch_batches(batches)
        with torch.no_grad():
            lt = float(token_ce(net(tb[0][0]), tb[0][1]))
        lg = G.ggml_evaluate(model, *batches[0], batch_size=batch)["loss"]
        print(f"  same function: first-batch loss ggmlpy {lg:.5f}, PyTorch {lt:.5f} (|diff| {abs(lg - lt):.1e})")
        res["first_loss"] = {"ggml": lg, "torch": lt}
    # sides: ggmlpy as configured (with ggml's BLAS backend when this build has it), ggmlpy on ggml's own CPU
    # kernels only (when there is a BLAS backend to switch off), PyTorch; the order rotates every round
    sides = ["ggml"] + (["ggml_noblas"] if has_blas() else []) + (["torch"] if torch is not None else [])
    names = {"ggml": "ggmlpy" + (" (+BLAS)" if has_blas() else ""), "ggml_noblas": "ggmlpy (no BLAS)",
             "torch": "PyTorch"}
    print("  ggmlpy's scheduler: " + ("ggml's BLAS backend (OpenBLAS) for the large products, the CPU backend for "
                                      "the rest; 'no BLAS' = ggml_set_blas_enabled(False)" if has_blas() else
                                      "the CPU backend (this build has no BLAS backend)"))
    for side in sides:
        res[side] = []
    ggml_train_step_s(model, batches[:2], init)                     # warm-up: page faults, thread pool
    try:
        for rep in range(reps):
            step, loss = {}, {}
            for side in sides[rep % len(sides):] + sides[:rep % len(sides)]:
                if side == "torch":
                    step[side], loss[side] = torch_train_step_s(net, tb, init_state, token_ce)
                else:
                    with blas_enabled(side == "ggml"):
                        step[side], loss[side] = ggml_train_step_s(model, batches, init)
            cells = []
            for side in sides:
                res[side].append(tokens / step[side])
                cells.append(f"{names[side]} {tokens / step[side]:7,.0f} tok/s ({step[side] * 1e3:4.0f} ms, loss "
                             f"{loss[side]:.3f})")
            if "torch" in step:
                res["pairs"].append(step["ggml"] / step["torch"])
                cells.append(f"PyTorch/ggmlpy {res['pairs'][-1]:.2f}")
            print(f"  round {rep + 1}: " + "   ".join(cells))
    finally:
        model.runtime.free()
    for side in sides:
        print(f"  {names[side]:18} best {max(res[side]):8,.0f}  median {statistics.median(res[side]):8,.0f} tokens/s")
    if res.get("torch"):
        res["ratio_best"] = max(res["torch"]) / max(res["ggml"])
        res["ratio_pair_median"] = statistics.median(res["pairs"])
        print(f"  PyTorch / {names['ggml']}: best runs {res['ratio_best']:.2f}, per round "
              f"[{', '.join(f'{p:.2f}' for p in res['pairs'])}] (median {res['ratio_pair_median']:.2f})")
        if "ggml_noblas" in res:
            res["ratio_best_noblas"] = max(res["torch"]) / max(res["ggml_noblas"])
            print(f"  PyTorch / ggmlpy (no BLAS): best runs {res['ratio_best_noblas']:.2f}")
    return res


# ---------------------------------------------------------------- (b) attention cost vs sequence length

def attention_ggml(seq: int, dim: int, heads: int):
    np.random.seed(0)
    x = G.ggml_input((seq, dim), name="x")
    out = G.ggml_layer_multi_head_attention(x, heads, dim // heads, causal=True, name="a")
    return G.ggml_compile(G.ggml_model(x, out), optimizer="adamw", loss="mse", metrics=[], backend="cpu",
                          learning_rate=LR)


def part_b(lengths: list[int], reps: int, dim: int = 128, heads: int = 4, batch: int = 8) -> dict:
    print(f"\n== (b) one causal attention layer (dim {dim}, {heads} heads of {dim // heads}), batch {batch}, "
          f"training step time vs sequence length; best of {reps} alternating runs")
    rng = np.random.default_rng(0)
    rows = []
    for seq in lengths:
        steps = max(2, 16 * 64 // seq)
        data = [(rng.normal(size=(batch, seq, dim)).astype(np.float32),
                 rng.normal(size=(batch, seq, dim)).astype(np.float32)) for _ in range(steps)]
        model = attention_ggml(seq, dim, heads)
        init = G.ggml_get_weights(model)
        times = {"ggml": [], "sdpa": [], "naive": []}
        nets = {}
        if torch is not None:
            td = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data]
            for kind in ("sdpa", "naive"):
                torch.manual_seed(0)
                net = Attention(dim, heads, dim // heads, naive=kind == "naive")
                nets[kind] = (net, {k: v.clone() for k, v in net.state_dict().items()})
        try:
            for rep in range(reps):
                sides = ["ggml"] + list(nets)
                for side in (sides if rep % 2 == 0 else sides[::-1]):
                    if side == "ggml":
                        times["ggml"].append(ggml_train_step_s(model, data, init)[0])
                    else:
                        net, st = nets[side]
                        times[side].append(torch_train_step_s(net, td, st, F.mse_loss)[0])
        finally:
            model.runtime.free()
        row = {"seq": seq, **{k: min(v) * 1e3 for k, v in times.items() if v}}
        rows.append(row)
    cols = [c for c in ("ggml", "sdpa", "naive") if c in rows[0]]
    names = {"ggml": "ggmlpy", "sdpa": "PyTorch SDPA", "naive": "PyTorch naive"}
    print(f"  {'length':>6} " + " ".join(f"{names[c] + ' ms':>16} {'x/doubling':>10}" for c in cols)
          + ("   ggmlpy/SDPA" if "sdpa" in cols else ""))
    for i, r in enumerate(rows):
        cells = []
        for c in cols:
            growth = f"{r[c] / rows[i - 1][c]:.2f}" if i else "-"
            cells.append(f"{r[c]:16.1f} {growth:>10}")
            if i:
                r[f"{c}_growth"] = r[c] / rows[i - 1][c]
        print(f"  {r['seq']:6d} " + " ".join(cells) + (f"   {r['ggml'] / r['sdpa']:11.2f}" if "sdpa" in cols else ""))
    return {"dim": dim, "heads": heads, "batch": batch, "rows": rows}


# ---------------------------------------------------------------- (c) where the time goes

def ggml_graph_ms(shapes: list[tuple[int, ...]], build, iters: int) -> float:
    """Best time of one ggml CPU graph: ``build(ctx, *inputs)`` on F32 inputs of the given ggml shapes (ne)."""
    ctx = G.ggml_init(16 << 20, no_alloc=True)
    backend = G.ggml_backend_cpu_init()
    try:
        new = {1: G.ggml_new_tensor_1d, 2: G.ggml_new_tensor_2d, 3: G.ggml_new_tensor_3d}
        ins = [new[len(ne)](ctx, G.GGML_TYPE_F32, *ne) for ne in shapes]
        graph = G.ggml_build_forward_expand(G.ggml_new_graph(ctx), build(ctx, *ins))
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
        rng = np.random.default_rng(0)
        for t in ins:
            G.ggml_backend_tensor_set_data(t, rng.normal(size=t.nelements()).astype(np.float32))
        G.ggml_backend_graph_compute(backend, graph)
        best = math.inf
        for _ in range(iters):
            t0 = time.perf_counter()
            G.ggml_backend_graph_compute(backend, graph)
            best = min(best, time.perf_counter() - t0)
        del buf
    finally:
        G.ggml_backend_free(backend)
        ctx.free()
    return best * 1e3


def torch_graph_ms(shapes: list[tuple[int, ...]], fn, iters: int) -> float:
    """Best time of ``fn(*inputs)`` on random tensors of the given (torch) shapes."""
    gen = torch.Generator().manual_seed(0)
    ins = [torch.randn(*s, generator=gen) for s in shapes]
    with torch.no_grad():
        fn(*ins)
        best = math.inf
        for _ in range(iters):
            t0 = time.perf_counter()
            fn(*ins)
            best = min(best, time.perf_counter() - t0)
    return best * 1e3


def op_table(cfg: dict, iters: int) -> dict:
    """The products of one MLP layer and the core of one attention layer, op by op, ggml next to torch, at the
    model's shapes. ggml's backward of ``mul_mat(a, b)`` is ``out_prod(b, g)`` for a and ``out_prod(a, g^T)``
    for b; PyTorch computes the same products with matmul/bmm (the softmax is left out: elementwise)."""
    d, n = cfg["dim"], cfg["batch"] * cfg["seq"]
    f = 4 * d
    t, k, bh = cfg["seq"], cfg["dim"] // cfg["heads"], cfg["batch"] * cfg["heads"]
    mm, op = G.ggml_mul_mat, G.ggml_out_prod
    tr = G.ggml_transpose
    # name, flops, ggml input shapes (ne), ggml build, torch shapes, torch fn
    rows = [
        (f"MLP {d}->{f} over {n} tokens: y = W x", 2 * d * f * n,
         [(d, f), (d, n)], lambda c, w, x: mm(c, w, x), [(n, d), (d, f)], lambda x, w: x @ w),
        ("  dW = x g^T  (out_prod)", 2 * d * f * n,
         [(d, n), (f, n)], lambda c, x, g: op(c, x, g), [(n, d), (n, f)], lambda x, g: x.T @ g),
        ("  dx = W g    (out_prod, g^T)", 2 * d * f * n,
         [(d, f), (f, n)], lambda c, w, g: op(c, w, tr(c, g)), [(n, f), (d, f)], lambda g, w: g @ w.T),
        (f"attention {bh} x ({t}x{t}) scores, key_dim {k}: s = k q", 2 * k * t * t * bh,
         [(k, t, bh), (k, t, bh)], lambda c, a, b: mm(c, a, b), [(bh, t, k), (bh, t, k)],
         lambda q, kk: q @ kk.transpose(1, 2)),
        ("  o = v a", 2 * k * t * t * bh,
         [(t, k, bh), (t, t, bh)], lambda c, v, a: mm(c, v, a), [(bh, t, t), (bh, t, k)], lambda a, v: a @ v),
        ("  dv = a g_o^T  (out_prod)", 2 * k * t * t * bh,
         [(t, t, bh), (k, t, bh)], lambda c, a, g: op(c, a, g), [(bh, t, t), (bh, t, k)],
         lambda a, g: a.transpose(1, 2) @ g),
        ("  da = v g_o    (out_prod, g^T)", 2 * k * t * t * bh,
         [(t, k, bh), (k, t, bh)], lambda c, v, g: op(c, v, tr(c, g)), [(bh, t, k), (bh, t, k)],
         lambda g, v: g @ v.transpose(1, 2)),
        ("  dk = q g_s    (out_prod)", 2 * k * t * t * bh,
         [(k, t, bh), (t, t, bh)], lambda c, q, g: op(c, q, g), [(bh, t, t), (bh, t, k)],
         lambda g, q: g.transpose(1, 2) @ q),
        ("  dq = k g_s^T  (out_prod, g^T)", 2 * k * t * t * bh,
         [(k, t, bh), (t, t, bh)], lambda c, kk, g: op(c, kk, tr(c, g)), [(bh, t, t), (bh, t, k)],
         lambda g, kk: g @ kk),
        ("  softmax(s / sqrt(k) + causal mask)", 0,
         [(t, t, bh), (t, t)], lambda c, s, m: G.ggml_soft_max_ext(c, s, m, 1.0 / math.sqrt(k), 0.0),
         [(bh, t, t), (t, t)], lambda s, m: torch.softmax(s / math.sqrt(k) + m, -1)),
    ]
    out = {}
    print(f"  op by op at the model's shapes (one layer), best of {iters}:")
    print(f"    {'':52} {'ggml ms':>8} {'GFLOP/s':>8}"
          + (f" {'torch ms':>9} {'GFLOP/s':>8} {'ratio':>6}" if torch else ""))
    for name, flops, gshapes, gbuild, tshapes, tfn in rows:
        gm = ggml_graph_ms(gshapes, gbuild, iters)
        tm = torch_graph_ms(tshapes, tfn, iters) if torch is not None else None

        def rate(ms: float, flops: float = flops) -> str:
            return f"{flops / ms / 1e6:8.1f}" if flops else f"{'':>8}"
        print(f"    {name:52} {gm:8.2f} {rate(gm)}" + (f" {tm:9.2f} {rate(tm)} {gm / tm:6.1f}" if tm else ""))
        out[name.strip()] = {"ggml_ms": gm, "torch_ms": tm, "flops": flops}
    return out


def part_c(cfg: dict, steps: int, reps: int) -> dict:
    batch, seq = cfg["batch"], cfg["seq"]
    print(f"\n== (c) where the time goes (the model of (a); best of {reps} alternating runs, ms per step)")
    stream = CT.windows(CT.corpus_files()[0], seq, batch, seed=1)
    batches = [next(stream) for _ in range(steps)]
    res: dict = {}
    for attention in (True, False):
        model = ggml_model(cfg, attention)
        init = G.ggml_get_weights(model)
        net = st = tb = None
        if torch is not None:
            net = CharTransformer(cfg, attention)
            torch_from_ggml(net, init)
            st = {k: v.clone() for k, v in net.state_dict().items()}
            tb = torch_batches(batches)
        t = {"ggml_train": [], "torch_train": [], "ggml_fwd": [], "torch_fwd": []}
        try:
            ggml_train_step_s(model, batches[:2], init)
            for rep in range(reps):
                for side in (("ggml", "torch") if rep % 2 == 0 else ("torch", "ggml")):
                    if side == "ggml":
                        t["ggml_train"].append(ggml_train_step_s(model, batches, init)[0])
                        t["ggml_fwd"].append(ggml_forward_s(model, batches))
                    elif net is not None:
                        t["torch_train"].append(torch_train_step_s(net, tb, st, token_ce)[0])
                        t["torch_fwd"].append(torch_forward_s(net, tb))
        finally:
            model.runtime.free()
        res["full" if attention else "no_attention"] = {k: min(v) * 1e3 for k, v in t.items() if v}
    full, mlp = res["full"], res["no_attention"]
    print(f"  {'':34} {'ggmlpy':>9} {'PyTorch':>9} {'ratio':>7}")

    def line(label, key_g, key_t, g_val=None, t_val=None):
        gv = full[key_g] if g_val is None else g_val
        tv = full.get(key_t) if t_val is None else t_val
        print(f"  {label:34} {gv:9.1f} " + (f"{tv:9.1f} {gv / tv:7.2f}" if tv else f"{'-':>9}"))
    line("training step", "ggml_train", "torch_train")
    line("  of which attention (full - none)", "", "", full["ggml_train"] - mlp["ggml_train"],
         full["torch_train"] - mlp["torch_train"] if "torch_train" in full else None)
    line("  of which the rest (no attention)", "", "", mlp["ggml_train"], mlp.get("torch_train"))
    line("forward pass alone", "ggml_fwd", "torch_fwd")
    line("backward + optimizer (step - fwd)", "", "", full["ggml_train"] - full["ggml_fwd"],
         full["torch_train"] - full["torch_fwd"] if "torch_train" in full else None)
    if full["ggml_fwd"] > full["ggml_train"]:
        print("  NOTE: ggml_predict's forward pass took longer than a whole training step: the inference path does "
              "not split the threads between the BLAS and CPU backends as the training loop does (compare "
              "--threads 1)")
    res["ops"] = op_table(cfg, 20)
    return res


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both sides (default 2)")
    ap.add_argument("--reps", type=int, default=4, help="alternating pairs (default 4)")
    ap.add_argument("--steps", type=int, default=6, help="timed training steps per run (default 6)")
    ap.add_argument("--parts", default="a,b,c", help="which parts: a (throughput), b (scaling), c (profile)")
    ap.add_argument("--lengths", default="64,128,256,512", help="sequence lengths for (b)")
    ap.add_argument("--quick", action="store_true", help="the example's --quick model, 2 pairs, short (smoke test)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    lengths = [int(v) for v in args.lengths.split(",")]
    if args.quick:
        args.reps, args.steps, lengths = 2, 3, [v for v in lengths if v <= 128]
    G.ggml_set_n_threads(args.threads)
    if torch is not None:
        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
    print(f"ggmlpy {G.__version__} / ggml {G.GGML_VERSION}"
          + (f", PyTorch {torch.__version__}" if torch is not None else ", no PyTorch")
          + f", Python {platform.python_version()}, {args.threads} threads, CPU; load average at start: {loadavg()}")
    parts = set(args.parts.split(","))
    results: dict = {"config": {"threads": args.threads, "reps": args.reps, "steps": args.steps, "quick": args.quick,
                                "ggml": G.GGML_VERSION, "torch": getattr(torch, "__version__", None)}}
    if "a" in parts:
        results["a"] = part_a(cfg, args.steps, args.reps)
    if "b" in parts:
        results["b"] = part_b(lengths, max(2, args.reps // 2 + 1) if not args.quick else 1)
    if "c" in parts:
        results["c"] = part_c(cfg, args.steps, max(2, args.reps // 2))
    print(f"\nload average at end: {loadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
