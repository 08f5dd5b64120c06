"""The fuzz worker: runs cases (JSON dicts) one after another and reports each outcome.

``python -m tests.fuzz.worker --case '<json>'`` runs one case and prints its outcome (the reproducer the
runner prints); ``--cases FILE --fd N`` is how ``runner.py`` drives it (outcomes as JSON lines on fd N).

Families (``case["family"]``):
  api     a public function called with one argument replaced by a bad value (the others valid)
  tensor  ggml_init / ggml_new_tensor_* with random (and bad) sizes, types and dimensions
  data    ggml_backend_tensor_set_data / get_data with random arrays, types, shapes, offsets
  ops     chains of ops (views, permutes, transposes included) computed on the CPU, checked against numpy
  gguf    a valid GGUF file written by ggmlpy, mutated, then opened / read / loaded
  fit     ggml_fit_opt_gen with random (and bad) training-loop arguments and sources
Oracles: the process survives, the case ends in time, every exception is a ggmlpy error, results match
numpy (float64 references) where the family computes something.
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import struct
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np

import ggmlpy as G


_TMP: list[Path] = []


def tmp() -> Path:
    """A scratch folder of this worker (made on first use)."""
    if not _TMP:
        _TMP.append(Path(tempfile.mkdtemp(prefix="ggmlpy-fuzz-worker-")))
    return _TMP[0]


F32, F16, I32 = G.GGML_TYPE_F32, G.GGML_TYPE_F16, G.GGML_TYPE_I32


from tests.fuzz.oracle import Wrong  # noqa: E402


# ---------------------------------------------------------------- special values

class _Obj:
    def __repr__(self) -> str:
        return "<object>"


SPECIAL: dict[str, Any] = {
    "$none": None, "$str": "x", "$empty": "", "$nul": "a\0b", "$surrogate": "\ud800", "$float": 1.5,
    "$nan": float("nan"), "$inf": float("inf"), "$-inf": float("-inf"), "$2**70": 2 ** 70, "$-2**70": -2 ** 70,
    "$2**63": 2 ** 63, "$2**64": 2 ** 64, "$2**31": 2 ** 31, "$2**32": 2 ** 32, "$-1": -1, "$0": 0,
    "$true": True, "$np_int64": np.int64(3), "$np_int32": np.int32(2), "$np_float32": np.float32(0.5),
    "$np_float64": np.float64(2.0), "$np_bool": np.bool_(True), "$np_nan": np.float32("nan"),
    "$list": [1, 2], "$empty_list": [], "$tuple": (1,), "$dict": {}, "$obj": _Obj(), "$bytes": b"x",
    "$huge_float": 1e308, "$tiny": 5e-324, "$complex": 1 + 2j, "$np_array": np.zeros(3), "$np_2d": np.zeros((2, 2)),
    "$big_str": "x" * 100000, "$fn": (lambda: None),
}
BAD_VALUES = sorted(SPECIAL)


def V(x: Any) -> Any:
    """Decode a JSON value: '$name' is a special value, lists are decoded element-wise."""
    if isinstance(x, str) and x.startswith("$"):
        return SPECIAL[x]
    if isinstance(x, list):
        return [V(v) for v in x]
    return x


# ---------------------------------------------------------------- the world: valid values by parameter name

class World:
    """Valid objects for every parameter name, made on demand for one case."""

    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self.cache:
            self.cache[name] = getattr(self, "_" + name)()
        return self.cache[name]

    # C objects
    def _backend(self):
        b = G.ggml_backend_cpu_init()
        G.ggml_backend_cpu_set_n_threads(b, 1)
        return b

    def _sched(self):
        return G.ggml_backend_sched_new([self.get("backend")], parallel=False, graph_size=256)

    def _ctx(self):
        return G.ggml_init(256 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(256, True) + 4096, no_alloc=True)

    def _host_ctx(self):
        return G.ggml_init(1 << 20, no_alloc=False)

    def _leafs(self):
        ctx = self.get("ctx")
        a = G.ggml_set_name(G.ggml_new_tensor_2d(ctx, F32, 4, 3), "a")
        b = G.ggml_set_name(G.ggml_new_tensor_2d(ctx, F32, 4, 3), "b")
        idx = G.ggml_set_name(G.ggml_new_tensor_1d(ctx, I32, 3), "idx")
        x = G.ggml_set_input(G.ggml_set_name(G.ggml_new_tensor_2d(ctx, F32, 4, 8), "x"))
        w = G.ggml_set_param(G.ggml_set_name(G.ggml_new_tensor_2d(ctx, F32, 4, 2), "w"))
        buf = G.ggml_backend_alloc_ctx_tensors(ctx, self.get("backend"))
        for t in (a, b, x, w):
            G.ggml_backend_tensor_set_data(t, np.linspace(-1, 1, G.ggml_nelements(t)))
        G.ggml_backend_tensor_set_data(idx, [0, 2, 1])
        return {"a": a, "b": b, "idx": idx, "x": x, "w": w, "buffer": buf}

    def _a(self):
        return self.get("leafs")["a"]

    def _b(self):
        return self.get("leafs")["b"]

    def _tensor(self):
        return self.get("a")

    def _buffer(self):
        return self.get("leafs")["buffer"]

    def _out(self):
        lf = self.get("leafs")
        return G.ggml_mul_mat(self.get("ctx"), lf["w"], lf["x"])

    def _graph(self):
        g = G.ggml_new_graph_custom(self.get("ctx"), 256, True)
        G.ggml_build_forward_expand(g, G.ggml_add(self.get("ctx"), self.get("a"), self.get("b")))
        return g

    def _galloc(self):
        return G.ggml_gallocr_new(self.get("backend"))

    def _dataset(self):
        ds = G.ggml_opt_dataset_init(F32, F32, 4, 2, 16, 1)
        return ds

    def _opt_ctx(self):
        lf = self.get("leafs")
        return G.ggml_opt_init_for_fit(self.get("sched"), G.ggml_opt_loss_type_mse(), ctx_compute=self.get("ctx"),
                                       inputs=lf["x"], outputs=self.get("out"))["opt_ctx"]

    def _lr_ud(self):
        return G.ggml_opt_init_for_fit(G.ggml_backend_sched_new([self.get("backend")], parallel=False),
                                       G.ggml_opt_loss_type_mse(), ctx_compute=self.get("ctx"),
                                       inputs=self.get("leafs")["x"], outputs=self.get("out"))["lr_ud"]

    def _result(self):
        return G.ggml_opt_result_init()

    def _gguf(self):
        g = G.gguf_init_empty()
        G.gguf_set_val(g, "k", 1)
        G.gguf_add_tensor(g, self.get("a"))
        return g

    def _path(self):
        p = tmp() / "world.gguf"
        G.ggml_save_weights_gguf(p, [self.get("a"), self.get("b")], {"k": 1})
        return str(p)

    def _device(self):
        return G.ggml_backend_dev_get(0)

    def _model(self):
        m = G.ggml_model_sequential()
        m = G.ggml_layer_dense(m, 3, activation="relu", input_shape=(4,))
        m = G.ggml_layer_dense(m, 2, activation="softmax")
        return G.ggml_compile(m, optimizer="adam", loss="categorical_crossentropy", backend="cpu")

    def _node(self):
        return G.ggml_input(shape=(4,))

    def _history(self):
        import pandas as pd
        return pd.DataFrame({"epoch": [1, 2], "train_loss": [1.0, 0.5], "train_accuracy": [0.5, 0.6],
                             "val_loss": [1.0, 0.7], "val_accuracy": [0.4, 0.5]})


# name -> how to build a valid value (a World attribute, or a constant)
VALID: dict[str, Any] = {
    "ctx": "ctx", "ctx_compute": "ctx", "a": "a", "b": "b", "tensor": "tensor", "t": "tensor", "graph": "graph",
    "sched": "sched", "backend": "backend", "buffer": "buffer", "galloc": "galloc", "dataset": "dataset",
    "ds": "dataset", "opt_ctx": "opt_ctx", "result": "result", "lr_ud": "lr_ud", "device": "device",
    "model": "model", "model_or_node": "model", "node": "node", "history": "history", "inputs": "leafs.x",
    "outputs": "out", "data_batch": "leafs.x", "labels_batch": None, "mask": None, "path": "path",
    "result_train": None, "result_eval": None, "snapshot": None, "nodes": None,
}
CONSTANTS: dict[str, Any] = {
    "type": F32, "n_dims": 2, "ne": [4, 3], "ne0": 4, "ne1": 3, "ne2": 1, "ne3": 1, "nb1": 16, "nb2": 48,
    "nb3": 48, "offset": 0, "name": "n", "key": "k", "value": 1, "key_id": 0, "tensor_id": 0, "mem_size": 1 << 16,
    "no_alloc": True, "size": 64, "grads": False, "n_threads": 1, "index": 0, "i": 0, "ihead": 0, "eps": 1e-5,
    "s": 2.0, "min": -1.0, "max": 1.0, "negative_slope": 0.1, "dim": 0, "n_past": 0, "axis0": 1, "axis1": 0,
    "axis2": 2, "axis3": 3, "op": 0, "k0": 1, "k1": 1, "s0": 1, "s1": 1, "p0": 0, "p1": 0, "p2": 0, "p3": 0,
    "d0": 1, "d1": 1, "scale": 1.0, "max_bias": 0.0, "type_data": F32, "type_label": F32, "ne_datapoint": 4,
    "ne_label": 2, "ndata": 16, "ndata_shard": 1, "idata": -1, "ibatch": 0, "rows": slice(0, 8), "iter": 1,
    "adamw_lr": 0.01, "sgd_lr": 0.01, "loss_type": 3, "optimizer": 0, "opt_period": 1, "optimizer_type": 0,
    "build_type": 2, "nepoch": 1, "nbatch_logical": 8, "val_split": 0.0, "silent": True, "epochs": 1,
    "batch_size": 4, "x": np.zeros((8, 4), np.float32), "y": np.zeros((8, 2), np.float32), "t_": 0,
    "monitor": "val_loss", "patience": 2, "min_delta": 0.0, "mode": "auto", "factor": 0.5, "min_lr": 1e-7,
    "step_size": 2, "gamma": 0.5, "eta_min": 0.0, "T_max": 4, "endpoint": "127.0.0.1:1", "timeout": 0.2,
    "n_elements": None, "data": [1.0] * 12, "backward": True, "include_optimizer": False, "raw": False,
    "only_meta": False, "labels_off": 0, "labels_offs": None, "loss_types": [3], "loss_weights": None,
    "loss_mask_ne0": None, "weight_decay": 0.0, "on_nonfinite": "raise", "callbacks": None, "learning_rate": None,
    "allow_partial": False, "params": None, "state": None, "weights": {}, "metadata": None, "tensors": None,
    "title": None, "shape": (4,), "dtype": "float32", "from_": 0, "to": None, "layer": None, "trainable": True,
    "units": 3, "shuffle": False, "shuffle_all": False, "prefetch": 0, "steps_per_epoch": None,
    "validation_steps": None, "initial_epoch": 0, "generator": None, "validation_generator": None,
    "validation_data": None, "validation_split": 0.0, "verbose": 0, "class_weight": None, "sample_weight": None,
    "head_names": None, "buffer_id": 0, "is_2D": False, "dst_type": F32, "inplace": False, "callback_train": None,
    "callback_eval": None, "idata_split": -1, "parallel": False, "graph_size": 64, "op_offload": False,
    "backends": None, "cache_dir": None, "devices": None, "t": 0, "metrics": None, "loss": "mse",
}
# never called by the fuzzer: they block by design (a server loop) or start other processes
SKIP = {"ggml_backend_rpc_start_server"}


def valid_value(name: str, world: World, fn: str = "") -> Any:
    if fn == "ggml_plot_history" and name == "path":
        return str(tmp() / "history.png")
    if name in VALID and VALID[name] is not None:
        spec = VALID[name]
        if "." in spec:
            obj, key = spec.split(".")
            return world.get(obj)[key]
        return world.get(spec)
    if name == "backends":
        return [world.get("backend")]
    if name == "path":
        return world.get("path")
    return CONSTANTS.get(name)


def api_functions() -> dict[str, list[str]]:
    """Public functions and the names of their parameters (``*args``/``**kwargs`` left out)."""
    out = {}
    for name in sorted(G.__all__):
        obj = getattr(G, name)
        if not inspect.isfunction(obj) or name in SKIP:
            continue
        sig = inspect.signature(obj).parameters.values()
        if any(p.kind == p.VAR_POSITIONAL for p in sig):
            continue  # the model layer's layer functions: their arguments are the layer class's (not filled here)
        out[name] = [p.name for p in sig if p.kind != p.VAR_KEYWORD]
    return out


def run_api(case: dict) -> None:
    fn = getattr(G, case["fn"])
    world = World()
    sig = inspect.signature(fn)
    args = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.name == case["param"]:
            args.append(V(case["value"]))
        elif p.default is not inspect.Parameter.empty and p.name not in VALID:
            args.append(p.default)
        else:
            v = valid_value(p.name, world, case["fn"])
            if v is None and p.default is not inspect.Parameter.empty:
                v = p.default
            args.append(v)
    if case["fn"] == "ggml_backend_rpc_add_server" and case["param"] == "endpoint":
        pass  # probing a bad endpoint must not connect anywhere slow
    fn(*args)


# ---------------------------------------------------------------- tensor creation

def run_tensor(case: dict) -> None:
    ctx = G.ggml_init(V(case["mem"]), no_alloc=V(case["no_alloc"]))
    ne = V(case["ne"])
    t_type = V(case["type"])
    how = case["how"]
    if how == "nd":
        t = G.ggml_new_tensor(ctx, t_type, V(case.get("n_dims", len(ne))), ne)
    else:
        k = int(how[0])
        t = getattr(G, f"ggml_new_tensor_{how}")(ctx, t_type, *ne[:k])
    shape = G.ggml_tensor_shape(t)
    used = ne[:V(case["n_dims"])] if how == "nd" else ne[:int(how[0])]
    want = [int(v) for v in used] + [1] * (4 - len(used))
    n = G.ggml_n_dims(t)
    if list(shape) != want[:4]:
        raise Wrong(f"shape {shape}, asked for {ne}")
    nel = math.prod(shape)
    if G.ggml_nelements(t) != nel:
        raise Wrong(f"nelements {G.ggml_nelements(t)} != prod{shape} = {nel}")
    if not (1 <= n <= 4):
        raise Wrong(f"n_dims {n}")
    if not V(case["no_alloc"]):
        data = G.ggml_backend_tensor_get_data(t)
        if data.size != nel:
            raise Wrong(f"read {data.size} values from a tensor of {nel}")


# ---------------------------------------------------------------- set/get data

NP_TYPES = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i16": np.int16, "i8": np.int8,
            "f64": np.float64, "i64": np.int64, "u8": np.uint8, "bool": np.bool_, "c64": np.complex64,
            "u64": np.uint64, "obj": object, "str": np.str_}
GGML_TYPES = {"f32": G.GGML_TYPE_F32, "f16": G.GGML_TYPE_F16, "bf16": G.GGML_TYPE_BF16, "i32": G.GGML_TYPE_I32,
              "i16": G.GGML_TYPE_I16, "i8": G.GGML_TYPE_I8, "f64": G.GGML_TYPE_F64, "i64": G.GGML_TYPE_I64,
              "q8_0": G.GGML_TYPE_Q8_0}


def make_array(spec: dict) -> Any:
    rng = np.random.default_rng(spec.get("seed", 0))
    shape = tuple(spec["shape"])
    fill = spec.get("fill", "random")
    dt = spec["dtype"]
    if fill == "list":
        return rng.integers(-3, 4, size=shape).tolist()
    if dt == "str":
        return np.full(shape, "a")
    if dt == "obj":
        return np.full(shape, None, dtype=object)
    base = {"random": lambda: rng.uniform(-3, 3, size=shape), "big": lambda: rng.uniform(-1e6, 1e6, size=shape),
            "huge": lambda: np.full(shape, 3e38), "nan": lambda: np.full(shape, np.nan),
            "inf": lambda: np.full(shape, np.inf), "int_edge": lambda: np.full(shape, 2 ** 31 - 1.0),
            "int_over": lambda: np.full(shape, 300.0), "zero": lambda: np.zeros(shape)}[fill]()
    if dt in ("i32", "i16", "i8", "i64", "u8", "u64"):
        base = np.clip(np.nan_to_num(np.round(base)), -2 ** 62, 2 ** 62)
    if dt == "c64":
        return (base + 1j).astype(np.complex64)
    with np.errstate(all="ignore"):
        return base.astype(NP_TYPES[dt])


def _cast_ref(arr: np.ndarray, ttype: str) -> np.ndarray:
    """What a tensor of ``ttype`` must hold after an exact write of ``arr``."""
    with np.errstate(all="ignore"):
        if ttype == "bf16":
            f = arr.astype(np.float32)
            return f.astype(np.float64)
        return arr.astype(NP_TYPES[ttype] if ttype in NP_TYPES else np.float32).astype(np.float64)


def run_data(case: dict) -> None:
    ttype = case["ttype"]
    ne = case["ne"]
    backend = G.ggml_backend_cpu_init()
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    t = G.ggml_new_tensor(ctx, GGML_TYPES[ttype], len(ne), ne)
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    view = case.get("view", "none")
    target = t
    if view == "transpose":
        vctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
        target = G.ggml_transpose(vctx, t)
    elif view == "view1d":
        vctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
        n = max(1, G.ggml_nelements(t) // 2)
        target = G.ggml_view_1d(vctx, t, n, 0)
    arr = make_array(case["array"])
    offset = V(case.get("offset", "$none"))
    G.ggml_backend_tensor_set_data(target, arr, offset) if offset is not None else \
        G.ggml_backend_tensor_set_data(target, arr)
    got = G.ggml_backend_tensor_get_data(target)
    np_arr = np.asarray(arr)
    if offset is None and ttype != "q8_0" and view == "none":
        ref = _cast_ref(np_arr.reshape(-1), ttype)
        g64 = got.astype(np.float64)
        if g64.size != ref.size:
            raise Wrong(f"read {g64.size} values after writing {ref.size}")
        tol = 1e-2 if ttype == "bf16" else (1e-3 if ttype == "f16" else 0)
        same = np.isclose(g64, ref, rtol=tol, atol=0, equal_nan=True) | ((g64 == ref) & np.isinf(ref))
        if not same.all():
            i = int(np.argmin(same))
            raise Wrong(f"wrote {np_arr.reshape(-1)[i]!r} ({np_arr.dtype}) into {ttype}, read back {got[i]!r}")
    ro = V(case.get("read_offset", 0))
    rn = V(case.get("read_n", "$none"))
    part = G.ggml_backend_tensor_get_data(target, ro, rn)
    full = G.ggml_backend_tensor_get_data(target)
    if not np.array_equal(part, full[ro: ro + (len(full) - ro if rn is None else rn)], equal_nan=True):
        raise Wrong(f"get_data(offset={ro}, n_elements={rn}) differs from the slice of the full read")


# ---------------------------------------------------------------- GGUF files

def _base_file(kind: str) -> Path:
    p = tmp() / f"base_{kind}.gguf"
    if p.exists():
        return p
    if kind == "model":
        m = World()._model()
        G.ggml_save_model(m, p)
        return p
    backend = G.ggml_backend_cpu_init()
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    tensors = [G.ggml_set_name(G.ggml_new_tensor_2d(ctx, F32, 4, 3), "w.f32"),
               G.ggml_set_name(G.ggml_new_tensor_1d(ctx, F16, 8), "b.f16"),
               G.ggml_set_name(G.ggml_new_tensor_2d(ctx, I32, 2, 2), "ids.i32"),
               G.ggml_set_name(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I8, 5), "s.i8")]
    G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    for t in tensors:
        G.ggml_backend_tensor_set_data(t, np.arange(G.ggml_nelements(t)) % 7)
    meta = {"general.name": "fuzz", "n": 3, "big": 2 ** 40, "f": 0.5, "flag": True, "arr": [1, 2, 3],
            "names": ["a", "bc", "def"], "floats": [0.5, 1.5]} if kind == "weights" else {}
    G.ggml_save_weights_gguf(p, tensors, meta)
    return p


def header_fields(data: bytes) -> list[tuple[int, int]]:
    """(offset, size) of every number in a GGUF header: counts, string lengths, value types, array sizes,
    numeric values, tensor dimensions, types and offsets (the fields a mutation should hit)."""
    fields: list[tuple[int, int]] = []
    pos = 8
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def num(size: int) -> int:
        nonlocal pos
        fields.append((pos, size))
        v = int.from_bytes(data[pos:pos + size], "little")
        pos += size
        return v

    def string() -> None:
        nonlocal pos
        n = num(8)
        pos += n

    fields.append((4, 4))  # version
    n_tensors, n_kv = num(8), num(8)
    for _ in range(n_kv):
        string()
        t = num(4)
        n = 1
        if t == 9:
            t, n = num(4), num(8)
        for _ in range(n):
            if t == 8:
                string()
            else:
                num(sizes[t])
    for _ in range(n_tensors):
        string()
        for _ in range(num(4)):
            num(8)
        num(4)
        num(8)
    return fields


def mutate(data: bytes, mutations: list) -> bytes:
    b = bytearray(data)
    fields = header_fields(data)
    for m in mutations:
        op = m[0]
        if op == "field":  # overwrite one header number with a chosen value
            at, size = fields[int(m[1]) % len(fields)]
            b[at:at + size] = (int(m[2]) % (1 << (8 * size))).to_bytes(size, "little")
            continue
        pos = int(m[1] * max(len(b) - 1, 0)) if isinstance(m[1], float) else int(m[1])
        pos = min(max(pos, 0), len(b))
        if op == "flip" and b:
            pos = min(pos, len(b) - 1)
            b[pos] ^= 1 << (int(m[2]) % 8)
        elif op == "byte" and b:
            pos = min(pos, len(b) - 1)
            b[pos] = int(m[2]) & 0xFF
        elif op == "truncate":
            del b[pos:]
        elif op == "insert":
            b[pos:pos] = bytes.fromhex(m[2])
        elif op == "delete":
            del b[pos:pos + int(m[2])]
        elif op in ("u64", "u32"):
            size = 8 if op == "u64" else 4
            pos = min(pos, max(len(b) - size, 0))
            b[pos:pos + size] = struct.pack("<Q" if size == 8 else "<I", int(m[2]) % (1 << (8 * size)))
    return bytes(b)


def run_gguf(case: dict) -> None:
    data = _base_file(case["base"]).read_bytes()
    p = tmp() / f"case_{os.getpid()}.gguf"
    p.write_bytes(mutate(data, case["mutations"]))
    action = case["action"]
    if action == "init":
        with G.gguf_init_from_file(p, no_alloc=case.get("no_alloc", True)) as g:
            for k in range(G.gguf_get_n_kv(g)):
                G.gguf_get_key(g, k), G.gguf_get_kv_type(g, k), G.gguf_get_val(g, k)
            for i in range(G.gguf_get_n_tensors(g)):
                G.gguf_get_tensor_name(g, i), G.gguf_get_tensor_type(g, i), G.gguf_get_tensor_shape(g, i)
                G.gguf_get_tensor_size(g, i)
            if g.ggml_ctx is not None:
                for i in range(G.gguf_get_n_tensors(g)):
                    t = G.ggml_get_tensor(g.ggml_ctx, G.gguf_get_tensor_name(g, i))
                    if t is not None and G.ggml_tensor_type(t) in (F32, F16, I32, G.GGML_TYPE_I8):
                        G.ggml_backend_tensor_get_data(t)
            G.gguf_write_to_file(g, tmp() / "rewrite.gguf", only_meta=True)
    elif action == "read":
        G.gguf_read(p, raw=case.get("raw", False))
    elif action == "load_weights":
        ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
        ts = {"w.f32": G.ggml_new_tensor_2d(ctx, F32, 4, 3), "b.f16": G.ggml_new_tensor_1d(ctx, F16, 8)}
        G.ggml_backend_alloc_ctx_tensors(ctx, G.ggml_backend_cpu_init())
        G.ggml_load_weights_gguf(p, ts)
    elif action == "load_model":
        m = G.ggml_load_model(p, backend="cpu")
        G.ggml_predict(m, np.zeros((2, 4), np.float32))
    else:
        raise ValueError(action)
    if not case["mutations"] and action == "read":
        pass


# ---------------------------------------------------------------- ops against numpy

from tests.fuzz import refops  # noqa: E402  (after G: refops uses it)


def run_ops(case: dict) -> None:
    refops.run(case)


# ---------------------------------------------------------------- the training loop

from tests.fuzz import fitcases  # noqa: E402


def run_fit(case: dict) -> None:
    fitcases.run(case)


EXECUTORS = {"api": run_api, "tensor": run_tensor, "data": run_data, "gguf": run_gguf, "ops": run_ops,
             "fit": run_fit}


def run_one(case: dict) -> tuple[str, str]:
    try:
        EXECUTORS[case["family"]](case)
    except Wrong as exc:
        if str(exc) == "(skip)":
            return "ok", "skipped"
        return "wrong", str(exc)
    except G.GgmlpyError as exc:
        return "refused", f"{type(exc).__name__}: {exc}"[:500]
    except fitcases.SourceError as exc:  # raised by a fuzzed source: must come out unchanged
        return "refused", f"the source's own {type(exc).__name__}"
    except BaseException as exc:  # noqa: BLE001 - anything else escaped ggmlpy
        tb = traceback.format_exc().strip().splitlines()
        return "leak", f"{type(exc).__name__}: {exc}"[:400] + " | " + " / ".join(tb[-6:])[:1200]
    finally:
        gc.collect()
    return "ok", ""


def main() -> None:
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases")
    ap.add_argument("--case")
    ap.add_argument("--fd", type=int)
    args = ap.parse_args()
    cases = json.loads(Path(args.cases).read_text()) if args.cases else [json.loads(args.case)]
    out = os.fdopen(args.fd, "w", buffering=1) if args.fd is not None else sys.stdout
    for i, case in enumerate(cases):
        out.write(json.dumps({"event": "start", "i": i}) + "\n")
        out.flush()
        status, detail = run_one(case)
        out.write(json.dumps({"event": "end", "i": i, "status": status, "detail": detail}) + "\n")
        out.flush()
    out.close()
    import shutil
    for d in _TMP:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
