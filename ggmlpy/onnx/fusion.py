"""Rewrites of an ONNX graph for inference that compute the same values with fewer passes over the data (or over
smaller data). A BatchNormalization whose input is a Conv's output, read by nothing else, with the convolution's
weights and the normalization's parameters all initializers, becomes the Conv's own weights and bias (each output
channel's kernel scaled by ``scale / sqrt(var + eps)``, the bias ``(bias - mean) * that + beta``), as exporters
and runtimes fold it; and a Relu read only by a MaxPool moves after it (max and relu commute: relu then runs on the
pooled, smaller tensor). The rewritten graph is what ``onnx_load`` builds; the model's own (``OnnxModel.spec``) is
kept for the summaries and for ``onnx_to_model``, whose batch norm keeps its statistics apart."""
from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from .protobuf import GraphSpec, Node


def for_inference(spec: GraphSpec) -> GraphSpec:
    """``spec`` with every rewrite of this module applied."""
    return relu_after_max_pool(fold_batch_norms(spec))


def relu_after_max_pool(spec: GraphSpec) -> GraphSpec:
    """``spec`` with each Relu -> MaxPool pair (the Relu's output read only by the pool, the pool's indices unused)
    made MaxPool -> Relu, the Relu keeping the pool's output name."""
    uses = Counter(name for node in spec.nodes for name in node.inputs if name)
    uses.update(name for name, _ in spec.outputs)
    maker = {out: node for node in spec.nodes for out in node.outputs if out}
    swapped: dict[int, list[Node]] = {}
    dropped: set[int] = set()
    for node in spec.nodes:
        relu = maker.get(node.inputs[0]) if node.op == "MaxPool" else None
        if relu is None or relu.op != "Relu" or uses[node.inputs[0]] != 1 or any(node.outputs[1:]):
            continue
        pooled = f"{node.outputs[0]}#before_relu"
        swapped[id(node)] = [Node("MaxPool", node.name, [relu.inputs[0]], [pooled], dict(node.attrs), node.domain),
                             Node("Relu", relu.name, [pooled], [node.outputs[0]], {}, relu.domain)]
        dropped.add(id(relu))
    if not swapped:
        return spec
    nodes = [m for n in spec.nodes if id(n) not in dropped for m in swapped.get(id(n), [n])]
    return dataclasses.replace(spec, nodes=nodes)


def fold_batch_norms(spec: GraphSpec) -> GraphSpec:
    """``spec`` with each foldable Conv -> BatchNormalization pair made one Conv (a new GraphSpec; ``spec`` is not
    changed)."""
    uses = Counter(name for node in spec.nodes for name in node.inputs if name)
    uses.update(name for name, _ in spec.outputs)
    maker = {out: node for node in spec.nodes for out in node.outputs if out}
    inits = dict(spec.initializers)
    replaced: dict[int, Node] = {}
    dropped: set[int] = set()
    for node in spec.nodes:
        if node.op != "BatchNormalization" or int(node.attrs.get("training_mode", 0)) or any(node.outputs[1:]):
            continue
        conv = maker.get(node.inputs[0])
        params = node.inputs[1:5]
        if conv is None or conv.op != "Conv" or uses[node.inputs[0]] != 1 or id(conv) in replaced:
            continue
        weights = conv.inputs[1:3]
        if not all(n in spec.initializers for n in params + [w for w in weights if w]) or uses[weights[0]] != 1:
            continue
        if any(np.asarray(spec.initializers[n]).dtype.kind != "f" for n in params + [w for w in weights if w]):
            continue
        scale, beta, mean, var = (np.asarray(spec.initializers[n], np.float64) for n in params)
        a = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        w = np.asarray(spec.initializers[weights[0]], np.float64)
        if a.shape != (w.shape[0],):
            continue
        bias = np.asarray(spec.initializers[weights[1]], np.float64) if len(weights) > 1 and weights[1] else 0.0
        w_name, b_name = f"{node.outputs[0]}#folded_kernel", f"{node.outputs[0]}#folded_bias"   # outputs: unique
        inits[w_name] = (w * a.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        inits[b_name] = ((bias - mean) * a + beta).astype(np.float32)
        replaced[id(conv)] = Node("Conv", conv.name, [conv.inputs[0], w_name, b_name], [node.outputs[0]],
                                  dict(conv.attrs), conv.domain)
        dropped.add(id(node))
    if not replaced:
        return spec
    nodes = [replaced.get(id(n), n) for n in spec.nodes if id(n) not in dropped]
    used = {name for n in nodes for name in n.inputs} | {name for name, _ in spec.outputs}
    return dataclasses.replace(spec, nodes=nodes, initializers={k: v for k, v in inits.items() if k in used})
