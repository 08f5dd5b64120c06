"""Hypothesis strategies for the fuzz cases (JSON-able dicts, run by ``worker.py`` in a subprocess)."""
from __future__ import annotations

from hypothesis import strategies as st

from tests.fuzz.refops import ALL_OPS
from tests.fuzz.worker import api_functions, BAD_VALUES, GGML_TYPES


# ---------------------------------------------------------------- api: one bad argument

_API = api_functions()
API_TARGETS = sorted((fn, p) for fn, params in _API.items() for p in params)


@st.composite
def api_cases(draw):
    fn, param = draw(st.sampled_from(API_TARGETS))
    return {"family": "api", "fn": fn, "param": param, "value": draw(st.sampled_from(BAD_VALUES))}


# ---------------------------------------------------------------- tensors

_DIM = st.one_of(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8), st.integers(0, 8), st.integers(1, 2 ** 12),
                 st.integers(-3, 2 ** 20),
                 st.sampled_from([2 ** 31, 2 ** 32 + 1, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63]),
                 st.sampled_from(["$nan", "$float", "$none", "$str", "$np_int64", "$true", "$2**70"]))


@st.composite
def tensor_cases(draw):
    how = draw(st.sampled_from(["1d", "2d", "3d", "4d", "nd"]))
    k = 4 if how == "nd" else int(how[0])
    ne = draw(st.lists(_DIM, min_size=k, max_size=k))
    case = {"family": "tensor", "how": how, "ne": ne,
            "mem": draw(st.one_of(st.just(1 << 20), st.just(1 << 22), st.integers(1, 1 << 24),
                                  st.sampled_from([0, -1, 2 ** 50, 2 ** 70, "$float", "$none"]))),
            "no_alloc": draw(st.one_of(st.booleans(), st.booleans(), st.booleans(),
                                       st.sampled_from(["$none", "$str", "$np_bool"]))),
            "type": draw(st.one_of(st.sampled_from(sorted(GGML_TYPES.values())),
                                   st.sampled_from(sorted(GGML_TYPES.values())), st.integers(-2, 45),
                                   st.sampled_from(["$str", "$none", "$float", "$2**70", "$np_int32"])))}
    if how == "nd":
        case["n_dims"] = draw(st.one_of(st.integers(0, 5), st.sampled_from(["$none", "$float", "$2**70"])))
        case["ne"] = ne[:draw(st.integers(0, 4))] if draw(st.booleans()) else ne
    return case


# ---------------------------------------------------------------- set/get data

@st.composite
def data_cases(draw):
    ttype = draw(st.sampled_from(sorted(GGML_TYPES)))
    nd = draw(st.integers(1, 4))
    ne = draw(st.lists(st.integers(1, 5), min_size=nd, max_size=nd))
    if ttype == "q8_0":
        ne[0] = 32
    shape = list(reversed(ne))
    how = draw(st.sampled_from(["exact", "exact", "flat", "transposed", "extra_axis", "short", "long", "random"]))
    if how == "flat":
        shape = [int(__import__("math").prod(ne))]
    elif how == "transposed" and len(shape) >= 2:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    elif how == "extra_axis":
        shape = [1] + shape
    elif how == "short":
        shape = [max(0, int(__import__("math").prod(ne)) - 1)]
    elif how == "long":
        shape = [int(__import__("math").prod(ne)) + 1]
    elif how == "random":
        shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=4))
    array = {"dtype": draw(st.sampled_from(["f32", "f64", "f16", "i32", "i64", "i8", "u8", "bool", "c64", "u64",
                                            "obj", "str"])),
             "shape": shape, "fill": draw(st.sampled_from(["random", "random", "big", "huge", "nan", "inf",
                                                          "int_edge", "int_over", "zero", "list"])),
             "seed": draw(st.integers(0, 1000))}
    return {"family": "data", "ttype": ttype, "ne": ne, "array": array,
            "view": draw(st.sampled_from(["none", "none", "none", "transpose", "view1d"])),
            "offset": draw(st.one_of(st.just("$none"), st.just("$none"), st.integers(-1, 8),
                                     st.sampled_from(["$2**70", "$float", "$np_int64", "$nan", "$true"]))),
            "read_offset": draw(st.one_of(st.integers(0, 3), st.integers(-2, 200), st.sampled_from(["$2**70", "$none",
                                                                                                 "$float"]))),
            "read_n": draw(st.one_of(st.just("$none"), st.integers(-1, 10), st.sampled_from(["$2**70", "$float"])))}


# ---------------------------------------------------------------- ops

_NE = st.lists(st.integers(1, 6), min_size=4, max_size=4)


@st.composite
def ops_cases(draw):
    n_in = draw(st.integers(1, 2))
    inputs = [{"ne": draw(_NE), "type": draw(st.sampled_from(["f32", "f32", "f32", "f16"]))} for _ in range(n_in)]
    chain = []
    for _ in range(draw(st.integers(1, 5))):
        chain.append({"op": draw(st.sampled_from(ALL_OPS)), "c": draw(st.lists(st.integers(0, 1000), min_size=8,
                                                                              max_size=8)),
                      "bad": draw(st.integers(0, 9)) == 0})
    return {"family": "ops", "seed": draw(st.integers(0, 10 ** 6)), "inputs": inputs, "chain": chain}


# ---------------------------------------------------------------- GGUF files

_FIELD_VALUES = st.one_of(st.integers(0, 16), st.sampled_from([2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 62,
                                                                2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64 - 8, 255,
                                                                65535, 1 << 40, 4096, 31, 32, 33]),
                           st.integers(0, 2 ** 64 - 1))
_MUTATION = st.one_of(
    st.tuples(st.just("field"), st.integers(0, 200), _FIELD_VALUES),
    st.tuples(st.just("field"), st.integers(0, 200), _FIELD_VALUES),
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 7)),
    st.tuples(st.just("byte"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16).map(bytes.hex)),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(1, 16)),
    st.tuples(st.sampled_from(["u64", "u32"]), st.floats(0, 1),
              st.sampled_from([0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 255,
                               65535, 1 << 40])),
).map(list)


@st.composite
def gguf_cases(draw):
    action = draw(st.sampled_from(["init", "init", "read", "load_weights", "load_model"]))
    base = "model" if action == "load_model" else draw(st.sampled_from(["weights", "weights", "model", "empty"]))
    case = {"family": "gguf", "base": base, "action": action,
            "mutations": draw(st.lists(_MUTATION, min_size=1, max_size=3))}
    if action == "init":
        case["no_alloc"] = draw(st.booleans())
    if action == "read":
        case["raw"] = draw(st.booleans())
    return case


# ---------------------------------------------------------------- training loop

_SPE = st.one_of(st.none(), st.integers(1, 4), st.integers(1, 4),
                 st.sampled_from(["$0", "$-1", "$float", "$str", "$2**70", "$nan", "$np_int64", "$true"]))


@st.composite
def fit_cases(draw):
    source = draw(st.sampled_from(["genfn", "genfn", "genobj", "list", "iter", "callable", "infinite", "cycle",
                                   "lambda_gen", "string", "none"]))
    case = {"family": "fit", "source": source, "n": draw(st.integers(0, 4)), "seed": draw(st.integers(0, 100)),
            "bad_batch": draw(st.one_of(st.none(), st.none(), st.sampled_from(
                ["transposed", "short", "nan", "str", "none_y", "triple", "dict", "complex", "flat", "int", "huge",
                 "object", "ragged", "scalar", "raise"]))),
            "loss": draw(st.sampled_from(["mse", "mse", "mse", "mse", "ce", "mae", "huber", "bce", "bad"])),
            "epochs": draw(st.one_of(st.integers(1, 3), st.integers(0, 3),
                                     st.sampled_from(["$-1", "$float", "$none", "$nan"]))),
            "callbacks": draw(st.sampled_from([None, None, "early", "cosine", "step", "plateau", "stop", "raises",
                                               "typo", "not_callable"]))}
    if source in ("infinite", "cycle"):  # an endless source: steps_per_epoch given, or the error must come at once
        case["steps_per_epoch"] = draw(st.one_of(st.integers(1, 3), st.none()))
    else:
        case["steps_per_epoch"] = draw(_SPE)
    if case["steps_per_epoch"] is None:
        del case["steps_per_epoch"]
    for key, strat in (("nbatch_logical", st.one_of(st.sampled_from([8, 16, 24, 12]), st.sampled_from(
                            ["$0", "$-1", "$float", "$str", "$2**70"]))),
                       ("prefetch", st.one_of(st.integers(0, 3), st.sampled_from(["$-1", "$float", "$2**70", "$str"]))),
                       ("learning_rate", st.one_of(st.floats(1e-4, 1.0), st.sampled_from(
                           ["$nan", "$inf", "$0", "$-1", "$str", "$huge_float", "$np_float32"]))),
                       ("weight_decay", st.one_of(st.floats(0, 1), st.sampled_from(["$nan", "$-1", "$2**70"]))),
                       ("initial_epoch", st.one_of(st.integers(0, 3), st.sampled_from(["$-1", "$float", "$2**70"]))),
                       ("on_nonfinite", st.sampled_from(["raise", "warn", "$str", "$none"])),
                       ("optimizer", st.one_of(st.sampled_from([0, 1]), st.sampled_from(["$-1", "$2**70", "$str"])))):
        if draw(st.integers(0, 3)) == 0:
            case[key] = draw(strat)
    if draw(st.integers(0, 3)) == 0:
        case["val_source"] = draw(st.sampled_from(["genfn", "list", "iter", "callable"]))
        if draw(st.booleans()):
            case["validation_steps"] = draw(_SPE.filter(lambda v: v is not None))
    return case


FAMILIES = {"api": api_cases, "tensor": tensor_cases, "data": data_cases, "ops": ops_cases, "gguf": gguf_cases,
            "fit": fit_cases}
