"""The ONNX project's backend node tests (the ``onnx`` package makes them: ``collect_testcases``, each a one-node
model with inputs and the outputs ONNX's reference implementation computes) for every operator the importer builds,
and the ones expected to fail, each with its reason (docs/guide/onnx.md lists them)."""
from __future__ import annotations

import re

import numpy as np


# the failures, by test-name pattern, and why (the same list is in docs/guide/onnx.md)
EXPECTED_FAILURES = (
    (r"^test_cast_.*(_to_FLOAT[84]|_to_U?INT[42]$|FLOAT8E4M3FN(UZ)?_to|FNUZ_to|FLOAT4E2M1_to|INT[42]_to|E8M0|"
     r"BFLOAT16_to)|_string|bfloat16_type|^test_celu_bfloat16$",
     "inputs or casts of types numpy cannot hold as numbers or ggml does not compute (bfloat16 inputs, 8-, 4- "
     "and 2-bit floats and integers, strings)"),
    (r"^test_(averagepool|maxpool)_3d",
     "3-D pooling: tensors of rank 5 without a size-1 axis (ggml's tensors have at most 4 dimensions)"),
    (r"empty_set|allowzero_reordered|start_out_of_bounds|zero_size_splits", "tensors with a zero-size dimension"),
    (r"pool_2d_dilations|pool_2d_ceil", "pooling with dilations, or with ceil_mode=1 where it changes the size"),
    (r"training", "training-mode Dropout and BatchNormalization: the importer runs inference"),
    (r"identity_(sequence|opt)", "sequence and optional types"),
    (r"with_argmax", "MaxPool's Indices output"),
    (r"slice_neg_steps", "slices with a negative step of computed data"),
    (r"^test_(gru|lstm)_batchwise$|^test_lstm_with_peepholes$", "LSTM and GRU with layout=1 or peepholes"),
    (r"^test_convtranspose_(3d|output_shape|kernel_shape|dilations|autopad_same)$",
     "ConvTranspose in 3-D, or with output_shape, dilations or auto_pad SAME"),
    (r"^test_quantizelinear_(e4m3fn|e5m2|u?int4|u?int2|float4e2m1)|^test_dequantizelinear_(e4m3fn|u?int4|u?int2|"
     r"float4e2m1)", "QuantizeLinear to 8-bit floats, 4- and 2-bit types; DequantizeLinear of them but e5m2 (numpy "
     "cannot hold them as numbers)"),
    (r"^test_(de)?quantizelinear_blocked", "blocked quantization (block_size > 0)"),
    (r"^test_nonzero_", "NonZero of data the graph computes (its output's shape depends on the values)"),
    (r"^test_scatter_elements_with_reduction_(mul|max|min)$", "ScatterElements of computed data with reduction "
     "mul, max or min"),
    (r"^test_mod_float_edge_cases_fmod_0", "Mod (numpy's) of infinities: NaN where numpy gives the dividend"),
)


def expected_failure(name: str) -> str | None:
    for pattern, reason in EXPECTED_FAILURES:
        if re.search(pattern, name):
            return reason
    return None


def cases(ops: set[str]):
    """The node tests whose operators the importer builds (not the ``_expanded`` function-body variants), their
    random inputs drawn from a fixed seed."""
    import warnings

    from onnx.backend.test.case.node import collect_testcases
    np.random.seed(0)
    out = []
    with warnings.catch_warnings():   # the generators' own casts of out-of-range values warn
        warnings.simplefilter("ignore", RuntimeWarning)
        generated = collect_testcases(None)
    for c in generated:
        if "_expanded" in c.name or not {n.op_type for n in c.model.graph.node} <= ops:
            continue
        out.append(c)
    return out


def run_case(case, device: str) -> None:
    """Load and run one node test, comparing each output with ONNX's (the case's tolerances, at least rtol 1e-3 and
    atol 1e-5: ggml computes in float32)."""
    from onnx import numpy_helper

    import ggmlpy as g
    model = g.onnx_load(case.model.SerializeToString(), device=device)
    try:
        inits = {t.name for t in case.model.graph.initializer}
        names = [i.name for i in case.model.graph.input if i.name not in inits]
        for inputs, outputs in case.data_sets:
            arrays = [numpy_helper.to_array(a) if hasattr(a, "HasField") else np.asarray(a) for a in inputs]
            got = g.onnx_run(model, dict(zip(names, arrays)))
            for (name, value), want in zip(got.items(), outputs):
                want = numpy_helper.to_array(want) if hasattr(want, "HasField") else np.asarray(want)
                assert np.shape(value) == np.shape(want), f"{name}: shape {np.shape(value)}, ONNX {np.shape(want)}"
                np.testing.assert_allclose(np.asarray(value, np.float64), np.asarray(want, np.float64),
                                           rtol=max(case.rtol, 1e-3), atol=max(case.atol, 1e-5), err_msg=name)
    finally:
        model.free()
