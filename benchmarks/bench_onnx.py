"""ONNX inference through ggmlpy (``onnx_load`` / ``onnx_run``) against onnxruntime on the same model, input and CPU
threads, measured in one run: a CNN (four 3x3 convolutions of 32-64 channels with batch norm and ReLU, max pooling,
global average pooling, a dense head; 32x32 RGB images, batch 16) and a transformer encoder block (d_model 128, 4
heads, feed-forward 256, GELU, layer norms; 64 tokens, batch 8), both built with onnx.helper from a fixed seed at
opset 17. Each is timed as the best of ``--rounds`` calls after a warm-up, alternating the two runtimes; the outputs
are compared first (max absolute difference).

Usage: python benchmarks/bench_onnx.py [--threads 2] [--rounds 20] [--device cpu]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import best_time  # noqa: E402 - the benchmarks' folder


def _model(nodes, inputs, outputs, inits):
    from onnx import helper, numpy_helper
    graph = helper.make_graph(nodes, "bench", inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def cnn():
    from onnx import helper, TensorProto
    rng = np.random.default_rng(0)
    inits, nodes, prev, cin = {}, [], "x", 3
    for i, cout in enumerate((32, 32, 64, 64)):
        inits[f"w{i}"] = rng.normal(0, (2 / (9 * cin)) ** 0.5, (cout, cin, 3, 3)).astype(np.float32)
        inits[f"b{i}"] = np.zeros(cout, np.float32)
        for k, v in (("s", 1.0), ("bb", 0.0), ("m", 0.0), ("v", 1.0)):
            inits[f"{k}{i}"] = (v + 0.1 * rng.normal(size=cout)).astype(np.float32) if k != "v" else \
                rng.uniform(0.5, 1.5, cout).astype(np.float32)
        nodes += [helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"s{i}", f"bb{i}", f"m{i}", f"v{i}"], [f"n{i}"]),
                  helper.make_node("Relu", [f"n{i}"], [f"r{i}"])]
        prev = f"r{i}"
        if i % 2:
            nodes.append(helper.make_node("MaxPool", [prev], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]))
            prev = f"p{i}"
        cin = cout
    inits["fc"] = rng.normal(0, 0.1, (10, 64)).astype(np.float32)
    inits["fb"] = np.zeros(10, np.float32)
    nodes += [helper.make_node("GlobalAveragePool", [prev], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 3, 32, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 10])
    return _model(nodes, [x], [y], inits), rng.normal(size=(16, 3, 32, 32)).astype(np.float32)


def encoder():
    from onnx import helper, TensorProto
    rng = np.random.default_rng(1)
    d, heads, ff, t, n = 128, 4, 256, 64, 8
    k = d // heads
    w = {name: rng.normal(0, d ** -0.5, shape).astype(np.float32) for name, shape in
         (("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, ff)), ("w2", (ff, d)))}
    w.update({"g1": np.ones(d, np.float32), "b1": np.zeros(d, np.float32), "g2": np.ones(d, np.float32),
              "b2": np.zeros(d, np.float32), "heads": np.array([n, t, heads, k], np.int64),
              "merged": np.array([n, t, d], np.int64), "scale": np.array(k ** -0.5, np.float32)})
    N = helper.make_node
    nodes = [N("LayerNormalization", ["x", "g1", "b1"], ["ln1"], axis=-1)]
    for name in ("q", "k", "v"):
        nodes += [N("MatMul", ["ln1", f"w{name}"], [f"{name}0"]), N("Reshape", [f"{name}0", "heads"], [f"{name}1"]),
                  N("Transpose", [f"{name}1"], [f"{name}h"], perm=[0, 2, 1, 3] if name != "k" else [0, 2, 3, 1])]
    nodes += [N("MatMul", ["qh", "kh"], ["s0"]), N("Mul", ["s0", "scale"], ["s1"]),
              N("Softmax", ["s1"], ["a"], axis=-1), N("MatMul", ["a", "vh"], ["o0"]),
              N("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
              N("Reshape", ["o1", "merged"], ["o2"]), N("MatMul", ["o2", "wo"], ["o3"]), N("Add", ["x", "o3"], ["h"]),
              N("LayerNormalization", ["h", "g2", "b2"], ["ln2"], axis=-1), N("MatMul", ["ln2", "w1"], ["f0"]),
              N("Relu", ["f0"], ["f1"]), N("MatMul", ["f1", "w2"], ["f2"]), N("Add", ["h", "f2"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, t, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, t, d])
    return _model(nodes, [x], [y], w), rng.normal(size=(n, t, d)).astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    import onnxruntime as ort

    import ggmlpy as g
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = a.threads, 1
    for name, make in (("CNN", cnn), ("encoder block", encoder)):
        proto, x = make()
        data = proto.SerializeToString()
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        model = g.onnx_load(data, device=a.device, n_threads=a.threads)
        ours, theirs = g.onnx_run(model, {"x": x})["y"], sess.run(None, {"x": x})[0]
        times: dict[str, list[float]] = {"ggmlpy": [], "onnxruntime": []}
        calls = {"ggmlpy": lambda m=model, v=x: g.onnx_run(m, {"x": v}),
                 "onnxruntime": lambda s=sess, v=x: s.run(None, {"x": v})}
        for _ in range(3):   # alternated: a shared machine's noise hits both
            for who, call in calls.items():
                times[who].append(best_time(call, a.rounds))
        ours_t, theirs_t = min(times["ggmlpy"]), min(times["onnxruntime"])
        print(f"{name}: max |ggmlpy - onnxruntime| {np.abs(ours - theirs).max():.2e}; ggmlpy {ours_t * 1e3:.2f} ms, "
              f"onnxruntime {theirs_t * 1e3:.2f} ms per call ({a.threads} threads, {a.device}): "
              f"ggmlpy / onnxruntime speed {theirs_t / ours_t:.2f}x")
        model.free()


if __name__ == "__main__":
    main()
