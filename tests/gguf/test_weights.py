"""GGUF save/load: weights files (ggmlpy/gguf/weights.py) and the low-level writer (file, kv, tensors).

Round trips are checked three ways: the loaded tensors against the numpy arrays that were
saved, ``gguf_read`` against the same arrays, and the file itself against a small GGUF v3
parser written here with ``struct``/numpy (so the bytes on disk do not depend on ggmlpy's
own reader). Misuse that ggml would abort on runs in a subprocess.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ggmlpy as G
from ggmlpy.errors import GgufFileError, GgufKeyError
from tests.helpers import ROOT


# GGUF value type ids (gguf.h) and the struct codes of the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def parse_gguf(path) -> dict:
    """A minimal GGUF v3 reader: {'version', 'kv': {key: (type, value)}, 'tensors': {name: (ne, type, bytes)}}."""
    raw = Path(path).read_bytes()
    pos = 0

    def take(fmt):
        nonlocal pos
        vals = struct.unpack_from(fmt, raw, pos)
        pos += struct.calcsize(fmt)
        return vals[0]

    def string():
        nonlocal pos
        n = take("<Q")
        s = raw[pos:pos + n].decode()
        pos += n
        return s

    def value(t):
        if t == _STRING:
            return string()
        if t == _ARRAY:
            at, n = take("<I"), take("<Q")
            return at, [value(at) for _ in range(n)]
        return take(_SCALARS[t])

    assert raw[:4] == b"GGUF"
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<q"), take("<q")
    kv = {}
    for _ in range(n_kv):
        key = string()
        t = take("<I")
        kv[key] = (t, value(t))
    infos = []
    for _ in range(n_tensors):
        name = string()
        n_dims = take("<I")
        ne = [take("<q") for _ in range(n_dims)]
        infos.append((name, ne, take("<I"), take("<Q")))
    align = kv.get("general.alignment", (4, 32))[1]
    data_start = -(-pos // align) * align
    tensors = {}
    for i, (name, ne, t, off) in enumerate(infos):
        end = infos[i + 1][3] if i + 1 < len(infos) else len(raw) - data_start
        tensors[name] = (ne, t, raw[data_start + off:data_start + end])
    return {"version": version, "kv": kv, "tensors": tensors}


def ne_of(arr: np.ndarray) -> tuple[int, ...]:
    return tuple(reversed(arr.shape)) + (1,) * (4 - arr.ndim)


_TYPES = {np.dtype(np.float32): G.GGML_TYPE_F32, np.dtype(np.float16): G.GGML_TYPE_F16,
          np.dtype(np.int32): G.GGML_TYPE_I32}


def make_model(arrays: dict, backend, names: bool = True):
    """A no_alloc context with one tensor per array, allocated on ``backend``; returns (ctx, buffer, tensors)."""
    ctx = G.ggml_init(G.ggml_tensor_overhead() * (len(arrays) + 2), no_alloc=True)
    tensors = {}
    for name, arr in arrays.items():
        t = G.ggml_new_tensor_4d(ctx, _TYPES[arr.dtype], *ne_of(arr))
        if names:
            G.ggml_set_name(t, name)
        tensors[name] = t
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, backend)
    return ctx, buf, tensors


@pytest.fixture(scope="module")
def cpu():
    b = G.ggml_backend_cpu_init()
    G.ggml_backend_cpu_set_n_threads(b, 2)
    yield b
    b.free()


@pytest.fixture
def weights():
    rng = np.random.default_rng(7)
    return {
        "fc1.weight": rng.standard_normal((3, 5)).astype(np.float32),      # ne = (5, 3)
        "fc1.bias": rng.standard_normal(3).astype(np.float32),
        "emb": (rng.standard_normal((4, 3, 2)) * 10).astype(np.float16),  # ne = (2, 3, 4)
        "ids": rng.integers(-2**31, 2**31 - 1, size=7).astype(np.int32),
        "conv": rng.standard_normal((2, 3, 2, 2)).astype(np.float32),     # 4-D
    }


def test_round_trip_f32_i32_f16_on_cpu_backend(tmp_path, cpu, weights):
    ctx, buf, tensors = make_model(weights, cpu)
    for name, arr in weights.items():
        G.ggml_backend_tensor_set_data(tensors[name], arr)
    path = tmp_path / "model.gguf"
    G.ggml_save_weights_gguf(path, list(tensors.values()))

    # The file, read without ggmlpy.
    parsed = parse_gguf(path)
    assert parsed["version"] == 3 and parsed["kv"] == {}
    assert list(parsed["tensors"]) == list(weights)
    for name, arr in weights.items():
        ne, t, data = parsed["tensors"][name]
        assert ne == list(reversed(arr.shape)), name
        assert t == _TYPES[arr.dtype], name
        assert data[:arr.nbytes] == arr.tobytes(), name

    # Loaded into a fresh model (other memory, same names).
    ctx2, buf2, fresh = make_model(weights, cpu)
    for t in fresh.values():
        G.ggml_backend_tensor_set_data(t, np.zeros(G.ggml_nelements(t)))
    assert G.ggml_load_weights_gguf(path, list(fresh.values())) == {}
    for name, arr in weights.items():
        got = G.ggml_backend_tensor_get_data(fresh[name])
        assert got.dtype == arr.dtype
        np.testing.assert_array_equal(got, arr.reshape(-1), err_msg=name)

    # gguf_read: ggml layout, leading 1-axes dropped.
    arrays, meta = G.gguf_read(str(path))
    assert meta == {}
    for name, arr in weights.items():
        assert arrays[name].shape == arr.shape and arrays[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(arrays[name], arr, err_msg=name)
    for b in (buf, buf2):
        b.free()
    ctx.free()
    ctx2.free()


def test_dict_names_unnamed_tensors_and_loads_subset(tmp_path, cpu, weights):
    ctx, buf, tensors = make_model(weights, cpu, names=False)
    for name, arr in weights.items():
        G.ggml_backend_tensor_set_data(tensors[name], arr)
    path = tmp_path / "dict.gguf"
    G.ggml_save_weights_gguf(path, tensors)
    assert [G.ggml_get_name(t) for t in tensors.values()] == list(weights)
    assert set(parse_gguf(path)["tensors"]) == set(weights)

    ctx2, buf2, fresh = make_model({"emb": weights["emb"]}, cpu, names=False)
    G.ggml_load_weights_gguf(path, {"emb": fresh["emb"]})   # a subset of the file's tensors
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(fresh["emb"]), weights["emb"])

    G.ggml_set_name(fresh["emb"], "other")
    with pytest.raises(ValueError, match="already named 'other'"):
        G.ggml_save_weights_gguf(tmp_path / "x.gguf", {"emb": fresh["emb"]})
    buf.free()
    buf2.free()
    ctx.free()
    ctx2.free()


def test_host_context_and_no_alloc_false_read(tmp_path, weights):
    ctx = G.ggml_init(1 << 20, no_alloc=False)   # tensors in context memory, no backend buffer
    w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 3)
    G.ggml_set_name(w, "w")
    G.ggml_backend_tensor_set_data(w, weights["fc1.weight"])
    path = tmp_path / "host.gguf"
    G.ggml_save_weights_gguf(path, [w])
    g = G.gguf_init_from_file(path, no_alloc=False)
    assert G.gguf_get_n_tensors(g) == 1 and G.gguf_get_tensor_name(g, 0) == "w"
    assert G.gguf_find_tensor(g, "w") == 0 and G.gguf_find_tensor(g, "nope") == -1
    loaded = G.ggml_get_tensor(g.ggml_ctx, "w")
    np.testing.assert_array_equal(G.ggml_tensor_to_numpy(loaded), weights["fc1.weight"])
    G.gguf_free(g)
    with pytest.raises(RuntimeError, match="freed"):
        G.gguf_get_n_tensors(g)
    ctx.free()


META = {
    "general.architecture": "mlp",
    "general.name": "tiny model ü",
    "model.n_layers": 3,
    "model.offset": -7,
    "model.big": 2**40,
    "train.lr": 1e-3,
    "train.shuffle": True,
    "train.eps": np.float32(1e-5),
    "train.steps": np.uint32(4000000000),
    "model.sizes": [784, 128, 10],
    "model.labels": ["cat", "dog"],
    "model.scales": [0.5, 0.25],
    "model.flags": [True, False, True],
    "model.vec": np.array([1.5, -2.0], dtype=np.float32),
}
# What the file holds: (GGUF type, value) as the parser above reads it.
META_FILE = {
    "general.architecture": (_STRING, "mlp"), "general.name": (_STRING, "tiny model ü"),
    "model.n_layers": (5, 3), "model.offset": (5, -7), "model.big": (11, 2**40),
    "train.lr": (12, 1e-3), "train.shuffle": (7, True), "train.eps": (6, float(np.float32(1e-5))),
    "train.steps": (4, 4000000000), "model.sizes": (_ARRAY, (5, [784, 128, 10])),
    "model.labels": (_ARRAY, (_STRING, ["cat", "dog"])), "model.scales": (_ARRAY, (12, [0.5, 0.25])),
    "model.flags": (_ARRAY, (7, [True, False, True])), "model.vec": (_ARRAY, (6, [1.5, -2.0])),
}


def test_metadata_round_trip(tmp_path, cpu, weights):
    ctx, buf, tensors = make_model({"b": weights["fc1.bias"]}, cpu)
    G.ggml_backend_tensor_set_data(tensors["b"], weights["fc1.bias"])
    path = tmp_path / "meta.gguf"
    G.ggml_save_weights_gguf(path, [tensors["b"]], metadata=META)
    assert parse_gguf(path)["kv"] == META_FILE

    expected = {k: (v.tolist() if isinstance(v, np.ndarray) else v.item() if isinstance(v, np.generic) else v)
                for k, v in META.items()}
    _, meta = G.gguf_read(path)
    assert meta == expected and list(meta) == list(META)
    assert G.ggml_load_weights_gguf(path, [tensors["b"]]) == expected

    g = G.gguf_init_from_file(path)
    assert G.gguf_get_n_kv(g) == len(META)
    i = G.gguf_find_key(g, "train.lr")
    assert G.gguf_get_key(g, i) == "train.lr" and G.gguf_get_val(g, i) == 1e-3
    assert G.gguf_get_val(g, "model.labels") == ["cat", "dog"]
    assert G.gguf_find_key(g, "absent") == -1
    with pytest.raises(KeyError):
        G.gguf_get_val(g, "absent")
    g.free()
    buf.free()
    ctx.free()


def test_low_level_setters_and_only_meta(tmp_path):
    g = G.gguf_init_empty()
    G.gguf_set_val_str(g, "s", "text")
    G.gguf_set_val_i32(g, "i32", -2**31)
    G.gguf_set_val_u32(g, "u32", 2**32 - 1)
    G.gguf_set_val_f32(g, "f32", 0.1)
    G.gguf_set_val_bool(g, "b", False)
    G.gguf_set_val_i64(g, "i64", -2**63)
    G.gguf_set_val_f64(g, "f64", 0.1)
    G.gguf_set_val_i32(g, "i32", 5)   # replaces the earlier value
    path = tmp_path / "kv.gguf"
    G.gguf_write_to_file(g, path, only_meta=True)
    g.free()
    kv = parse_gguf(path)["kv"]
    assert kv == {"s": (8, "text"), "u32": (4, 2**32 - 1), "f32": (6, float(np.float32(0.1))), "b": (7, False),
                  "i64": (11, -2**63), "f64": (12, 0.1), "i32": (5, 5)}
    _, meta = G.gguf_read(path)
    assert meta == {k: v for k, (_, v) in kv.items()}


def test_mismatch_raises_and_writes_nothing(tmp_path, cpu, weights):
    ctx, buf, tensors = make_model(weights, cpu)
    for name, arr in weights.items():
        G.ggml_backend_tensor_set_data(tensors[name], arr)
    path = tmp_path / "m.gguf"
    G.ggml_save_weights_gguf(path, tensors)

    wrong = {"fc1.weight": np.zeros((3, 5), np.float32),
             "fc1.bias": np.zeros(4, np.float32),      # shape differs
             "emb": np.zeros((4, 3, 2), np.float32)}   # type differs (file: F16)
    ctx2, buf2, fresh = make_model(wrong, cpu)
    G.ggml_backend_tensor_set_data(fresh["fc1.weight"], np.zeros(15))
    with pytest.raises(ValueError, match=r"'fc1\.bias' has shape \[4, 1, 1, 1\].*\[3, 1, 1, 1\]"):
        G.ggml_load_weights_gguf(path, [fresh["fc1.weight"], fresh["fc1.bias"]])
    # Checked before anything is written: the first tensor was not filled.
    np.testing.assert_array_equal(G.ggml_backend_tensor_get_data(fresh["fc1.weight"]), np.zeros(15))
    with pytest.raises(ValueError, match="'emb' is f32 but the file holds f16"):
        G.ggml_load_weights_gguf(path, [fresh["emb"]])
    buf.free()
    buf2.free()
    ctx.free()
    ctx2.free()


def test_missing_tensor_raises_key_error(tmp_path, cpu, weights):
    ctx, buf, tensors = make_model({"a": weights["fc1.bias"], "b": weights["fc1.bias"]}, cpu)
    path = tmp_path / "a.gguf"
    G.ggml_save_weights_gguf(path, [tensors["a"]])
    with pytest.raises(KeyError) as info:
        G.ggml_load_weights_gguf(path, [tensors["b"]])
    assert isinstance(info.value, G.GgmlValueError) and isinstance(info.value, GgufKeyError)
    assert "tensor 'b' is not in" in str(info.value)
    buf.free()
    ctx.free()


def test_missing_or_invalid_file_raises(tmp_path, cpu, weights):
    missing = tmp_path / "absent.gguf"
    for call in (lambda: G.gguf_init_from_file(missing), lambda: G.gguf_read(missing)):
        with pytest.raises(FileNotFoundError, match="absent.gguf"):
            call()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all")
    with pytest.raises(GgufFileError, match="not a valid GGUF file.*magic"):
        G.gguf_init_from_file(junk)
    with pytest.raises(OSError, match="directory"):
        G.gguf_read(tmp_path)

    ctx, buf, tensors = make_model({"w": weights["fc1.weight"]}, cpu)
    with pytest.raises(FileNotFoundError):
        G.ggml_load_weights_gguf(missing, [tensors["w"]])
    good = tmp_path / "good.gguf"
    G.ggml_save_weights_gguf(good, [tensors["w"]])
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:-8])
    for call in (lambda: G.ggml_load_weights_gguf(truncated, [tensors["w"]]), lambda: G.gguf_read(truncated)):
        with pytest.raises(GgufFileError, match="truncated"):
            call()
    with pytest.raises(OSError, match="could not write"):
        G.ggml_save_weights_gguf(tmp_path / "no" / "such" / "dir.gguf", [tensors["w"]])
    buf.free()
    ctx.free()


MISUSE = textwrap.dedent(r"""
    import numpy as np, ggmlpy as G
    b = G.ggml_backend_cpu_init()
    ctx = G.ggml_init(16 * G.ggml_tensor_overhead(), no_alloc=True)
    w = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3); G.ggml_set_name(w, "w")
    v = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3); G.ggml_set_name(v, "w")   # same name
    u = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2)                                  # no name
    buf = G.ggml_backend_alloc_ctx_tensors(ctx, b)
    host = G.ggml_init(1 << 16, no_alloc=False)
    m = G.ggml_new_tensor_2d(host, G.GGML_TYPE_F32, 4, 3)
    tr = G.ggml_transpose(host, m); G.ggml_set_name(tr, "tr")                          # strided view
    G.ggml_save_weights_gguf("ok.gguf", [w])
    n = 0

    def expect(exc, fn, *args):
        global n
        try:
            fn(*args)
        except exc as e:
            n += 1
            print(type(e).__name__, "|", e)
        else:
            raise SystemExit(f"no {exc.__name__} from {fn.__name__}{args[1:]!r}")

    g = G.gguf_init_empty()
    G.gguf_add_tensor(g, w)
    expect(ValueError, G.gguf_add_tensor, g, w)          # ggml: GGML_ABORT duplicate tensor name
    expect(ValueError, G.gguf_add_tensor, g, v)
    expect(ValueError, G.ggml_save_weights_gguf, "x.gguf", [w, v])
    expect(ValueError, G.gguf_add_tensor, g, u)
    expect(ValueError, G.gguf_add_tensor, g, tr)         # ggml: GGML_ASSERT(ggml_is_contiguous) at write
    expect(ValueError, G.gguf_get_key, g, 0)             # ggml: GGML_ASSERT(key_id in range)
    expect(ValueError, G.gguf_get_tensor_name, g, 1)
    expect(ValueError, G.gguf_get_val, g, -1)
    expect(ValueError, G.gguf_set_val_str, g, "", "x")   # ggml: GGML_ASSERT(!key.empty())
    expect(ValueError, G.gguf_set_val_str, g, "general.alignment", "64")   # ggml: GGML_ABORT must be u32
    expect(ValueError, G.gguf_set_val_u32, g, "general.alignment", 3)      # ggml: must be a power of 2
    expect(ValueError, G.gguf_set_val_i32, g, "k", 2**31)
    expect(TypeError, G.gguf_set_val_bool, g, "k", 1)
    expect(TypeError, G.gguf_set_val, g, "k", None)
    buf.free()
    expect(RuntimeError, G.gguf_write_to_file, g, "y.gguf")   # ggml would read freed memory
    f = G.gguf_init_from_file("ok.gguf")
    expect(RuntimeError, G.gguf_write_to_file, f, "z.gguf")   # ggml: GGML_ASSERT(info.t.data)
    g.free()
    expect(RuntimeError, G.gguf_get_n_kv, g)
    print("OK", n)
""")


def test_misuse_raises_instead_of_aborting(tmp_path):
    env = dict(os.environ, GGML_NO_BACKTRACE="1",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", MISUSE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.strip().endswith("OK 17"), proc.stdout
    assert "duplicate tensor name 'w'" in proc.stdout
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()
