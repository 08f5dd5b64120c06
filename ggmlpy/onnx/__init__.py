"""ggmlR's ONNX import: an ONNX model (a file or its bytes) becomes one ggml graph computed by ggml's scheduler on a
chosen device, its weights loaded once into the device's memory (``onnx_load``, ``onnx_run``, ``onnx_summary``,
``onnx_inputs``, ``onnx_device_info``). The ``onnx`` package parses the protobuf; every operator is built from ggml's
ops (``operators_*.py``), values whose contents are known when the graph is built (shapes, axes, constants) are
computed in numpy, and what a model needs that ggml lacks is refused when it loads, naming the op, the node and the
opset.
"""
