"""benchmarks/bench_peak.py's counts: the FLOPs and the bytes it charges each profiled node, against counts made by
hand from the ops' definitions, on shapes as the profile gives them (trailing 1s dropped: a one-channel kernel's
shape has three dimensions), and its stream rate a positive figure."""
from __future__ import annotations

import sys

import pytest

from ggmlpy.compute.profile import NodeTime
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def peak():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_peak
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return bench_peak


def _node(op, shape, sources, params=(0, 0, 0, 0)):
    return NodeTime(op, "CPU", shape, sources, 1e-3, params)


def test_products_flops(peak):
    # dst [10, 100] = W [784, 10]^T x [784, 100]: 1000 outputs of 784 terms
    assert peak.product_flops(_node("MUL_MAT", (10, 100), ((784, 10), (784, 100)))) == 2 * 1000 * 784
    # dst [784, 500] = x [784, 100] dy [500, 100]^T: sums of 100 terms
    assert peak.product_flops(_node("OUT_PROD", (784, 500), ((784, 100), (500, 100)))) == 2 * 784 * 500 * 100
    # 14 x 14 x 16 x 100 outputs, each 3 x 3 x 8 taps
    assert peak.product_flops(_node("CONV_2D_TILED", (14, 14, 16, 100), ((3, 3, 8, 16), (14, 14, 8, 100), (16,)))) \
        == 2 * 14 * 14 * 16 * 100 * 72
    assert peak.product_flops(_node("ADD", (10, 100), ((10, 100), (10,)))) == 0


def test_a_one_channel_kernels_backward_is_counted_whatever_it_computes(peak):
    """A kernel of one output channel (3 x 3 x 4 x 1, shown as (3, 3, 4)) over 2 images of 8 x 8 x 4, padding 0:
    6 x 6 outputs each; both gradients asked (op params 1, 1), then the kernel's alone."""
    sources = ((3, 3, 4), (8, 8, 4, 2), (6, 6, 1, 2), (6, 6, 1, 2))
    both = _node("CONV_2D_TILED_BACK", (8 * 8 * 4 * 2 + 36 + 1,), sources, (1, 1, 0, 0))
    kernel_only = _node("CONV_2D_TILED_BACK", (8 * 8 * 4 * 2 + 36 + 1,), sources, (0, 1, 0, 0))
    per_gradient = 2 * (6 * 6 * 2) * 36
    assert peak.product_flops(both) == 2 * per_gradient
    assert peak.product_flops(kernel_only) == per_gradient
    read = 36 + 8 * 8 * 4 * 2 + 6 * 6 * 2              # the kernel, the images, the output gradient
    assert peak.node_bytes(both) == 4 * (read + 36 + 1 + 8 * 8 * 4 * 2)   # the kernel's, bias's, images' gradients
    assert peak.node_bytes(kernel_only) == 4 * (read + 36 + 1)


def test_other_nodes_move_their_operands_and_result_once(peak):
    assert peak.node_bytes(_node("MUL_MAT", (10, 100), ((784, 10), (784, 100)))) == 4 * (1000 + 7840 + 78400)


def test_the_stream_rate_is_a_rate(peak):
    rate = peak.stream_rate(1, floats=1 << 14, reps=4, rounds=2)
    assert 0.1 < rate < 10_000   # GB/s: a memcpy's order, nowhere near 0 or a unit error
