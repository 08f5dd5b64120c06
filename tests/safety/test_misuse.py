"""Misuse that would make ggml abort the process must raise a Python exception instead.

Each case runs in its own fresh interpreter: an abort shows up as returncode -6 (SIGABRT)
or 134 instead of killing the test runner. The case must exit normally, having raised the
expected exception type (or, for ``None``, having completed without one).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.helpers.subprocesses import run_in_subprocess


PRELUDE = """
import re, numpy as np, ggmlpy as G
def small_ctx(no_alloc=True):
    return G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(64) + 4096, no_alloc=no_alloc)
def run_graph(ctx, out, grads=False):
    # allocate and compute the graph of out on the CPU (where a kernel would abort)
    be = G.ggml_backend_cpu_init()
    s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
    g = G.ggml_new_graph_custom(ctx, 64, grads)
    G.ggml_build_forward_expand(g, out)
    if grads:
        G.ggml_build_backward_expand(ctx, g)
    G.ggml_backend_sched_alloc_graph(s, g)
    if grads:
        G.ggml_graph_reset(g)
    G.ggml_backend_sched_graph_compute(s, g)
"""

# A linear model with static graphs for the ggml-opt cases: out = W x, x [4, 8], W [4, 1].
OPT_PRELUDE = """
be = G.ggml_backend_cpu_init()
G.ggml_backend_cpu_set_n_threads(be, 1)
sched = G.ggml_backend_sched_new([be], parallel=False)
cs = small_ctx()
x = G.ggml_set_input(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 8))
W = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 1))
buf = G.ggml_backend_alloc_ctx_tensors(cs, be)
G.ggml_backend_tensor_set_data(W, np.zeros(4))
cc = G.ggml_init(64 * G.ggml_tensor_overhead() + G.ggml_graph_overhead(), no_alloc=True)
out = G.ggml_mul_mat(cc, W, x)
def new_opt(**kw):
    return G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out, **kw)
"""

# A dynamic opt context (no ctx_compute at init) with one step's graph prepared: out = W x in context c.
DYNAMIC = """
o = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse())
def step_graph():
    ctx = G.ggml_init(64 * G.ggml_tensor_overhead() + 3 * G.ggml_graph_overhead(), no_alloc=True)
    y = G.ggml_mul_mat(ctx, W, x)
    gf = G.ggml_new_graph_custom(ctx, 64, True)
    G.ggml_build_forward_expand(gf, y)
    return ctx, gf, y
c, gf, dyn_out = step_graph()
G.ggml_opt_prepare_alloc(o, c, gf, x, dyn_out)
"""

TEMPLATE = """
{prelude}
try:
{body}
except BaseException as e:
    print("RAISED|" + type(e).__name__ + "|" + str(isinstance(e, {exc})) + "|" + str(e).replace("\\n", " "))
else:
    print("COMPLETED")
"""

# name: (uses the opt prelude, body, expected exception type or None, regex the message must match)
CASES = {
    # ---- the op constructors
    # ---- graph inputs are leaves (ggml 0.25 asserts it in ggml_set_input, which ggml-opt also calls on its inputs)
    "set_input_on_a_view": (False, """
ctx = small_ctx()
G.ggml_set_input(G.ggml_view_1d(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), 4, 0))""", "ValueError",
                            r"ggml_set_input: tensor must be a tensor made by ggml_new_tensor.*VIEW"),
    "set_input_on_an_op_result": (False, """
ctx = small_ctx()
a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
G.ggml_set_input(G.ggml_add(ctx, a, a))""", "ValueError", r"made by ggml_new_tensor.*ADD"),
    "opt_init_inputs_a_reshape": (True, """
xr = G.ggml_reshape_2d(cs, x, 8, 4)
G.ggml_opt_init(sched, G.ggml_opt_loss_type_mean(), ctx_compute=cc, inputs=xr, outputs=G.ggml_sum(cc, xr))""",
                                  "ValueError",
                                  r"ggml_opt_init: inputs must be a tensor made by ggml_new_tensor.*RESHAPE"),
    "mul_mat_mismatched_ne0": (False, """
ctx = small_ctx()
a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 2)
G.ggml_mul_mat(ctx, a, b)""", "ValueError", r"ne\[0\]"),
    "add_not_broadcastable": (False, """
ctx = small_ctx()
a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 3, 3)
G.ggml_add(ctx, a, b)""", "ValueError", r"broadcast"),
    "add_smaller_a": (False, """
ctx = small_ctx()
G.ggml_add(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 1), G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3))""",
                      "ValueError", r"broadcast"),
    "reshape_other_count": (False, """
ctx = small_ctx()
G.ggml_reshape_2d(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), 5, 2)""", "ValueError", r"10.*12|12.*10"),
    "reshape_non_contiguous": (False, """
ctx = small_ctx()
G.ggml_reshape_1d(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)), 12)""",
                               "ValueError", r"contiguous"),
    "get_rows_f32_indices": (False, """
ctx = small_ctx()
G.ggml_get_rows(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3),
                G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2))""",
                             "TypeError", r"I32|i32"),
    "cross_entropy_shapes": (False, """
ctx = small_ctx()
G.ggml_cross_entropy_loss(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3),
                          G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 2))""", "ValueError", r"shape"),
    "soft_max_ext_mask_not_dividing": (False, """
ctx = small_ctx()
G.ggml_soft_max_ext(ctx, G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 3),
                    G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 2))""", "ValueError", r"mask"),
    "soft_max_ext_alibi_without_mask": (False, """
ctx = small_ctx()
G.ggml_soft_max_ext(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), None, 1.0, 8.0)""", "ValueError", r"mask"),
    "unary_on_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_sqr(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)))""", "ValueError", r"cont"),
    "add_with_a_transposed_a": (False, """
ctx = small_ctx()
t = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 4)
G.ggml_add(ctx, G.ggml_transpose(ctx, t), t)""", "ValueError", r"cont"),
    "mul_mat_f32_by_f16": (False, """
ctx = small_ctx()
G.ggml_mul_mat(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3),
               G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F16, 4, 2))""",
                           "TypeError", r"F32|f32"),
    "add_f32_and_f16": (False, """
ctx = small_ctx()
G.ggml_add(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4), G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F16, 4))""",
                        "TypeError", r"f16|F16"),
    "scale_f16": (False, """
ctx = small_ctx()
G.ggml_scale(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F16, 4), 2.0)""", "TypeError", r"f32|F32"),
    "sum_rows_i32": (False, """
ctx = small_ctx()
G.ggml_sum_rows(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I32, 4, 3))""", "TypeError", r"f32|F32"),
    "im2col_f16_data_f32_result": (False, """
ctx = small_ctx()
G.ggml_im2col(ctx, G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 3, 3, 1, 1),
              G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F16, 6, 6, 1, 1), 1, 1, 0, 0, 1, 1)""", "TypeError", r"b must"),
    "set_param_bf16": (False, """
ctx = small_ctx()
G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_BF16, 4))""", "TypeError", r"F32 or F16"),
    "backward_through_bf16": (False, """
ctx = small_ctx()
x = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))
y = G.ggml_cpy(ctx, G.ggml_cpy(ctx, x, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_BF16, 4)),
               G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))
loss = G.ggml_set_loss(G.ggml_sum(ctx, y))
g = G.ggml_new_graph_custom(ctx, 64, True)
G.ggml_build_forward_expand(g, loss)
G.ggml_build_backward_expand(ctx, g)""", "TypeError", r"bf16"),
    # ---- contexts and graphs
    "new_tensor_in_a_full_context": (False, """
ctx = G.ggml_init(G.ggml_tensor_overhead() + 256, no_alloc=False)
for i in range(8):
    G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 16)""", "ValueError", r"full"),
    "no_alloc_context_full": (False, """
ctx = G.ggml_init(4 * G.ggml_tensor_overhead(), no_alloc=True)
for i in range(8):
    G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 16)""", "ValueError", r"full"),
    "graph_too_small": (False, """
ctx = small_ctx()
y = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
for i in range(10):
    y = G.ggml_sqr(ctx, y)
g = G.ggml_new_graph_custom(ctx, 4)
G.ggml_build_forward_expand(g, y)""", "ValueError", r"too small"),
    "backward_without_loss": (False, """
ctx = small_ctx()
x = G.ggml_set_param(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))
g = G.ggml_new_graph_custom(ctx, 64, True)
G.ggml_build_forward_expand(g, G.ggml_sum(ctx, x))
G.ggml_build_backward_expand(ctx, g)""", "ValueError", r"loss"),
    "set_loss_non_scalar": (False, """
ctx = small_ctx()
G.ggml_set_loss(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4))""", "ValueError", r"scalar"),
    # ---- data
    "set_data_too_many_elements": (False, """
ctx = small_ctx(no_alloc=False)
t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_backend_tensor_set_data(t, np.zeros(5))""", "ValueError", r"4.*5|5.*4"),
    "set_data_unallocated": (False, """
ctx = small_ctx()
t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_backend_tensor_set_data(t, np.zeros(4))""", "RuntimeError", r"memory"),
    "alloc_ctx_tensors_on_a_host_context": (False, """
ctx = small_ctx(no_alloc=False)
G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_backend_alloc_ctx_tensors(ctx, G.ggml_backend_cpu_init())""", "RuntimeError", r"no_alloc"),
    # ---- devices, backends, schedulers
    "dev_get_999": (False, """
G.ggml_backend_dev_get(999)""", "ValueError", r"999"),
    "sched_after_backend_freed": (False, """
be = G.ggml_backend_cpu_init()
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=16)
ctx = small_ctx()
g = G.ggml_new_graph_custom(ctx, 16)
G.ggml_build_forward_expand(g, G.ggml_relu(ctx, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)))
G.ggml_backend_free(be)
G.ggml_backend_sched_graph_compute(s, g)""", "RuntimeError", r"freed"),
    "tensor_of_freed_context": (False, """
ctx = small_ctx(no_alloc=False)
t = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_free(ctx)
G.ggml_backend_tensor_get_data(t)""", "RuntimeError", r"freed"),
    "sched_too_small_for_the_leafs": (False, """
be = G.ggml_backend_cpu_init()
ctx = G.ggml_init(1 << 20, no_alloc=True)
xs = [G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 2) for _ in range(40)]
y = xs[0]
for t in xs[1:]:
    y = G.ggml_add(ctx, y, t)
g = G.ggml_new_graph_custom(ctx, 64)
G.ggml_build_forward_expand(g, y)
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=40)
G.ggml_backend_sched_alloc_graph(s, g)""", "ValueError", r"leafs"),
    "get_rows_index_out_of_range": (False, """
be = G.ggml_backend_cpu_init()
ctx = small_ctx()
table = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
idx = G.ggml_set_input(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2))
g = G.ggml_new_graph_custom(ctx, 16)
G.ggml_build_forward_expand(g, G.ggml_get_rows(ctx, table, idx))
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=16)
G.ggml_backend_sched_alloc_graph(s, g)
G.ggml_backend_tensor_set_data(idx, [0, 3])
G.ggml_backend_sched_graph_compute(s, g)""", "ValueError", r"out of range"),
    "sched_alloc_again_after_compute_works": (False, """
be = G.ggml_backend_cpu_init()
ctx = small_ctx()
x = G.ggml_set_input(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 3))
y = G.ggml_set_output(G.ggml_scale(ctx, x, 3.0))
g = G.ggml_new_graph_custom(ctx, 16)
G.ggml_build_forward_expand(g, y)
s = G.ggml_backend_sched_new([be], parallel=False, graph_size=16)
for v in (1.0, 2.0):
    G.ggml_backend_sched_alloc_graph(s, g)      # ggml would abort on the second alloc without a reset
    G.ggml_backend_tensor_set_data(x, [v, v, v])
    G.ggml_backend_sched_graph_compute(s, g)
    assert list(G.ggml_backend_tensor_get_data(y)) == [3 * v] * 3""", None, None),
    # ---- ggml-opt
    # third red-team round: the core
    "sched_alloc_of_a_view_of_an_unplaced_leaf": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 3, 2)
g = G.ggml_new_graph_custom(c, 64, False); G.ggml_build_forward_expand(g, G.ggml_cont(c, G.ggml_transpose(c, x)))
G.ggml_backend_sched_alloc_graph(s, g)""", "RuntimeError", r"not marked as an input"),
    "conv_1d_padding_beyond_32_bits": (False, """
c = small_ctx()
G.ggml_conv_1d(c, G.ggml_new_tensor_3d(c, G.GGML_TYPE_F32, 3, 1, 1), G.ggml_new_tensor_2d(c, G.GGML_TYPE_F32, 8, 1),
               1, 2 ** 30, 1)""", "ValueError", r"32-bit"),
    "conv_2d_direct_padding_beyond_32_bits": (False, """
c = small_ctx()
G.ggml_conv_2d_direct(c, G.ggml_new_tensor_4d(c, G.GGML_TYPE_F32, 3, 3, 1, 1),
                      G.ggml_new_tensor_4d(c, G.GGML_TYPE_F32, 8, 8, 1, 1), 1, 1, 2 ** 30, 0, 1, 1)""", "ValueError",
                                              r"32-bit"),
    "view_at_a_byte_offset_inside_an_element": (False, """
c = small_ctx()
G.ggml_view_1d(c, G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 16), 4, 2)""",
                                                "ValueError", r"multiple of the element size"),
    "graph_plan_of_a_graph_that_grew": (False, """
be = G.ggml_backend_cpu_init(); c = G.ggml_init(1 << 20)
x = G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4); G.ggml_set_f32(x, 1.0)
g = G.ggml_new_graph_custom(c, 64, False); y = G.ggml_add(c, x, x); G.ggml_build_forward_expand(g, y)
p = G.ggml_backend_graph_plan_create(be, g)
G.ggml_build_forward_expand(g, G.ggml_scale(c, y, 10.0))
G.ggml_backend_graph_plan_compute(be, p)""", "RuntimeError", r"create a new one"),
    "buffer_cleared_by_a_fit_callback": (True, """
batches = [(np.ones((8, 4)), np.ones((8, 1)))]
G.ggml_fit_opt_gen(sched, cc, x, out, batches, silent=True,
                   callbacks=[{"on_epoch_end": lambda e, logs, st: G.ggml_backend_buffer_clear(buf)}])""",
                                         "RuntimeError",
                                         r"in use by"),
    "gguf_save_onto_a_full_device": (False, """
c = small_ctx(no_alloc=False); t = G.ggml_set_name(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4), "t")
G.ggml_save_weights_gguf("/dev/full", [t])""", "OSError", r"No space left"),
    # dynamic graphs (no ctx_compute at init): the step's graph lives in the ctx_compute of prepare_alloc
    "opt_dynamic_alloc_after_ctx_compute_freed": (True, DYNAMIC + """
c.free()
G.ggml_opt_alloc(o, True)""", "RuntimeError", r"ctx_compute given to ggml_opt_prepare_alloc has been freed"),
    "opt_dynamic_eval_after_ctx_compute_freed": (True, DYNAMIC + """
G.ggml_opt_alloc(o, True)
c.free()
G.ggml_opt_eval(o, None)""", "RuntimeError", r"has been freed"),
    "opt_dynamic_labels_after_ctx_compute_freed": (True, DYNAMIC + """
G.ggml_opt_alloc(o, True)
lab = G.ggml_opt_labels(o)
G.ggml_opt_eval(o, None)
c.free()
G.ggml_backend_tensor_get_data(lab)""", "RuntimeError", r"freed"),
    "opt_dynamic_loss_after_ctx_compute_freed": (True, DYNAMIC + """
G.ggml_opt_alloc(o, True)
G.ggml_opt_eval(o, None)
c.free()
G.ggml_backend_tensor_get_data(G.ggml_opt_loss(o))""", "RuntimeError", r"freed"),
    "opt_dynamic_labels_of_an_earlier_step": (True, DYNAMIC + """
G.ggml_opt_alloc(o, True)
lab = G.ggml_opt_labels(o)
G.ggml_opt_eval(o, None)
c2, gf2, out2 = step_graph()
G.ggml_opt_prepare_alloc(o, c2, gf2, x, out2)
G.ggml_opt_alloc(o, True)
G.ggml_backend_tensor_set_data(lab, np.zeros(8))""", "RuntimeError", r"ggml_opt_alloc made new labels"),
    "opt_dynamic_parameter_of_another_shape": (True, DYNAMIC + """
G.ggml_opt_alloc(o, True)
G.ggml_opt_eval(o, None)
V = G.ggml_set_param(G.ggml_new_tensor_2d(cs, G.GGML_TYPE_F32, 4, 2))
G.ggml_backend_alloc_ctx_tensors(cs, be)
c3 = G.ggml_init(64 * G.ggml_tensor_overhead() + 3 * G.ggml_graph_overhead(), no_alloc=True)
out3 = G.ggml_mul_mat(c3, V, x)
gf3 = G.ggml_new_graph_custom(c3, 64, True)
G.ggml_build_forward_expand(gf3, out3)
G.ggml_opt_prepare_alloc(o, c3, gf3, x, out3)""", "ValueError", r"paired by node position"),
    "opt_adamw_beta_that_rounds_to_one": (True, """
p = G.ggml_opt_get_default_optimizer_params()
p.adamw.beta1 = 0.99999999""", "ValueError", r"beta1 must be in \[0, 1\)"),
    "opt_set_state_with_negative_second_moments": (True, """
opt = new_opt()["opt_ctx"]
st = G.ggml_opt_get_state(opt, {"W": W})
st["v"]["W"] = -np.ones(4)
G.ggml_opt_set_state(opt, st, {"W": W})""", "ValueError", r">= 0"),
    "opt_set_state_with_moments_of_none": (True, """
opt = new_opt()["opt_ctx"]
st = G.ggml_opt_get_state(opt, {"W": W})
st["m"]["W"] = [None] * 4
G.ggml_opt_set_state(opt, st, {"W": W})""", "TypeError", r"numeric"),
    "fit_opt_labels_wider_than_the_outputs": (True, """
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 2, 64, 1)
G.ggml_fit_opt(sched, cc, x, out, ds, G.ggml_opt_loss_type_mse(), nbatch_logical=8, nepoch=1, silent=True)""",
                                              "ValueError",
                                             r"outputs hold 1 values per datapoint, the dataset's labels 2"),
    "fit_opt_data_of_another_width": (True, """
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 2, 1, 16, 1)
G.ggml_fit_opt(sched, cc, x, out, ds, G.ggml_opt_loss_type_mse(), nepoch=1, silent=True)""", "ValueError",
                                      r"datapoints of 4 values .* the dataset.s have 2"),
    "fit_opt_gen_one_input_listed_twice": (True, """
G.ggml_fit_opt_gen(sched, cc, [x, x], out, [], silent=True)""", "ValueError", r"again"),
    "fit_opt_gen_negative_loss_weights": (True, """
batches = [{"inputs": [np.ones((8, 4))], "labels": [np.ones((8, 1))], "weights": [-np.ones(8)]}]
G.ggml_fit_opt_gen(sched, cc, x, out, batches, loss_type=G.ggml_opt_loss_type_weighted_mse(), silent=True)""",
                                           "ValueError", r"must be >= 0"),
    "fit_opt_gen_initial_epoch_beyond_c": (True, """
G.ggml_fit_opt_gen(sched, cc, x, out, [], initial_epoch=2 ** 70, silent=True)""", "ValueError", r"initial_epoch"),
    "opt_alloc_twice": (True, """
opt = new_opt()["opt_ctx"]
G.ggml_opt_alloc(opt, True)
G.ggml_opt_alloc(opt, True)""", "RuntimeError", r"already"),
    "opt_eval_without_alloc": (True, """
opt = new_opt()["opt_ctx"]
G.ggml_opt_eval(opt, None)""", "RuntimeError", r"alloc"),
    "opt_set_lr_negative": (True, """
G.ggml_opt_set_lr(new_opt()["lr_ud"], adamw_lr=-0.1)""", "ValueError", r"-0.1"),
    "opt_weight_decay_2": (True, """
new_opt(weight_decay=2)""", "ValueError", r"weight_decay"),
    "opt_two_static_contexts_on_one_scheduler": (True, """
a = new_opt()
b = new_opt()""", "RuntimeError", r"scheduler"),
    "opt_forward_only_asked_for_backward": (True, """
opt = G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out,
                      build_type=G.ggml_opt_build_type_forward())
G.ggml_opt_alloc(opt, False)   # forward is fine ...
G.ggml_opt_eval(opt, None)
G.ggml_opt_alloc(opt, True)    # ... a backward pass is not""", "RuntimeError", r"forward"),
    "opt_freed_context": (True, """
opt = new_opt()["opt_ctx"]
G.ggml_opt_free(opt)
G.ggml_opt_alloc(opt, True)""", "RuntimeError", r"freed"),
    "opt_freed_result": (False, """
r = G.ggml_opt_result_init()
r.free()
G.ggml_opt_result_loss(r)""", "RuntimeError", r"freed"),
    "opt_fit_nbatch_logical_not_a_multiple": (True, """
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 48, 1)
G.ggml_opt_fit(sched, cc, x, out, ds, G.ggml_opt_loss_type_mse(), G.ggml_opt_optimizer_type_adamw(),
               nepoch=1, nbatch_logical=12, silent=True)""", "ValueError", r"nbatch_logical"),
    "opt_dataset_ndata_0": (False, """
G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 0)""", "ValueError", r"ndata"),
    "opt_untrainable_op_in_model": (True, """
out2 = G.ggml_leaky_relu(cc, G.ggml_mul_mat(cc, W, x), 0.1, False)
G.ggml_opt_init_for_fit(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out2)""",
                                    "ValueError", r"LEAKY_RELU"),
    # ---- scalar arguments the CPU kernels assert on (issue 9)
    "norm_negative_eps": (False, """
ctx = small_ctx()
run_graph(ctx, G.ggml_norm(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), -1.0))""",
                          "ValueError", r"eps.*>= 0"),
    "norm_nan_eps": (False, """
ctx = small_ctx()
run_graph(ctx, G.ggml_norm(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), float("nan")))""",
                     "ValueError", r"eps.*finite"),
    "rms_norm_negative_eps": (False, """
ctx = small_ctx()
run_graph(ctx, G.ggml_rms_norm(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3), -1e-5))""", "ValueError", r"eps"),
    "soft_max_ext_max_bias_backward": (False, """
ctx = small_ctx()
a = G.ggml_set_param(G.ggml_new_tensor_3d(ctx, G.GGML_TYPE_F32, 4, 3, 2))
mask = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)
loss = G.ggml_set_loss(G.ggml_sum(ctx, G.ggml_soft_max_ext(ctx, a, mask, 1.0, 8.0)))
run_graph(ctx, loss, grads=True)""", "ValueError", r"max_bias"),
    "soft_max_ext_nan_max_bias": (False, """
ctx = small_ctx()
G.ggml_soft_max_ext(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3),
                    G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3),
                    1.0, float("nan"))""", "ValueError", r"max_bias"),
    # ---- sizes (issue 9)
    "init_larger_than_memory": (False, """
G.ggml_init(2**50)""", "ValueError", r"memory"),
    "graph_overhead_near_2_63": (False, """
G.ggml_graph_overhead(2**63 - 1)""", "ValueError", r"at most"),
    "new_graph_custom_near_2_63": (False, """
G.ggml_new_graph_custom(small_ctx(), 2**62)""", "ValueError", r"at most"),
    "sched_graph_size_2_40": (False, """
G.ggml_backend_sched_new([G.ggml_backend_cpu_init()], parallel=False, graph_size=2**40)""",
                              "ValueError", r"graph_size"),
    "dataset_too_large_for_memory": (False, """
G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 784, 10, 10**10)""", "ValueError", r"memory"),
    "new_tensor_element_count_overflow": (False, """
ctx = small_ctx()
t = G.ggml_new_tensor_4d(ctx, G.GGML_TYPE_F32, 2**31, 2**31, 1, 1)
print("nelements", G.ggml_nelements(t))""", "ValueError", r"64-bit"),
    "mul_mat_result_overflow": (False, """
ctx = small_ctx()
a = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 2**31)
b = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 1, 2**32)
G.ggml_mul_mat(ctx, a, b)""", "ValueError", r"64-bit"),
    "leafs_counted_over_calls": (False, """
ctx = small_ctx()
g = G.ggml_new_graph_custom(ctx, 4, False)
t = [G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4) for _ in range(6)]
G.ggml_build_forward_expand(g, G.ggml_add(ctx, G.ggml_add(ctx, t[0], t[1]), t[2]))
G.ggml_build_forward_expand(g, G.ggml_add(ctx, G.ggml_add(ctx, t[3], t[4]), t[5]))""", "ValueError", r"leafs"),
    # ---- strided operands of kernels that read them as contiguous (garbage before, issue 9)
    "sum_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_sum(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)))""",
                                 "ValueError", r"ggml_cont"),
    "mean_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_mean(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)))""",
                                  "ValueError", r"ggml_cont"),
    "leaky_relu_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_leaky_relu(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)), 0.1)""",
                                        "ValueError", r"ggml_cont"),
    "pool_1d_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_pool_1d(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)),
               G.GGML_OP_POOL_MAX, 1, 1)""",
                                     "ValueError", r"ggml_cont"),
    "pool_2d_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_pool_2d(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)), G.GGML_OP_POOL_MAX,
               1, 1, 1, 1)""", "ValueError", r"ggml_cont"),
    "argmax_of_a_transposed_view": (False, """
ctx = small_ctx()
G.ggml_argmax(ctx, G.ggml_transpose(ctx, G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 3)))""",
                                    "ValueError", r"ggml_cont"),
    # ---- strings cut at a NUL byte (issue 9)
    "set_name_with_nul": (False, """
G.ggml_set_name(G.ggml_new_tensor_1d(small_ctx(), G.GGML_TYPE_F32, 4), "w\\0extra")""", "ValueError", r"NUL"),
    "get_tensor_with_nul": (False, """
ctx = small_ctx()
G.ggml_set_name(G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4), "w")
print(G.ggml_get_tensor(ctx, "w\\0x"))""", "ValueError", r"NUL"),
    "gguf_keys_with_nul_do_not_merge": (False, """
g = G.gguf_init_empty()
G.gguf_set_val_i32(g, "a.b", 1)
G.gguf_set_val_i32(g, "a.b\\0c", 2)""", "ValueError", r"NUL"),
    "gguf_find_tensor_with_nul": (False, """
G.gguf_find_tensor(G.gguf_init_empty(), "w\\0x")""", "ValueError", r"NUL"),
    # ---- use after free through a second path (issue 9 §1): what keeps a tensor's header and memory alive
    "operand_viewing_a_freed_context": (False, """
a = small_ctx(False); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 64)
b = small_ctx(); v = G.ggml_view_1d(b, t, 8, 0)
a.free()
G.ggml_relu(small_ctx(), v)""", "RuntimeError", r"freed"),
    "operand_computed_from_a_freed_context": (False, """
a = small_ctx(False); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 64)
b = small_ctx(False); r = G.ggml_relu(b, t)
a.free()
G.ggml_sqr(small_ctx(False), r)""", "RuntimeError", r"freed"),
    "graph_of_a_freed_source_context": (False, """
a = small_ctx(False); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 64)
c = small_ctx(False); g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_relu(c, t))
a.free()
G.ggml_graph_compute(c, g)""", "RuntimeError", r"freed"),
    "tensor_by_name_of_an_op_on_a_freed_context": (False, """
a = small_ctx(False); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 64)
c = small_ctx(False); G.ggml_set_name(G.ggml_relu(c, t), "r")
a.free()
G.ggml_sqr(c, G.ggml_get_tensor(c, "r"))""", "RuntimeError", r"freed"),
    "set_data_after_the_scheduler_was_freed": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 1 << 20))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_relu(c, x))
G.ggml_backend_sched_alloc_graph(s, g)
G.ggml_backend_sched_free(s)
G.ggml_backend_tensor_set_data(x, np.ones(1 << 20))""", "RuntimeError", r"no memory"),
    "get_data_after_the_scheduler_was_reset": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 1 << 20))
y = G.ggml_set_output(G.ggml_relu(c, x))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y)
G.ggml_backend_sched_alloc_graph(s, g)
G.ggml_backend_sched_reset(s)
G.ggml_backend_tensor_get_data(y)""", "RuntimeError", r"no memory"),
    "compute_after_the_scheduler_grew_for_another_graph": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4))
y = G.ggml_set_output(G.ggml_relu(c, x))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y)
G.ggml_backend_sched_alloc_graph(s, g); G.ggml_backend_tensor_set_data(x, [1, -2, 3, -4])
c2 = small_ctx(); x2 = G.ggml_set_input(G.ggml_new_tensor_1d(c2, G.GGML_TYPE_F32, 1 << 22))
g2 = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c2, 64), G.ggml_relu(c2, x2))
G.ggml_backend_sched_alloc_graph(s, g2)   # the scheduler's buffer grows: x's old memory is gone
G.ggml_backend_sched_graph_compute(s, g)  # x was never written in the new memory""",
                                                           "RuntimeError", r"no memory|holds no values"),
    "realloc_after_the_scheduler_grew_computes_right": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4))
y = G.ggml_set_output(G.ggml_relu(c, x))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y)
c2 = small_ctx(); x2 = G.ggml_set_input(G.ggml_new_tensor_1d(c2, G.GGML_TYPE_F32, 1 << 22))
g2 = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c2, 64), G.ggml_relu(c2, x2))
for graph in (g, g2, g, g2, g):
    G.ggml_backend_sched_alloc_graph(s, graph)
G.ggml_backend_tensor_set_data(x, [1, -2, 3, -4]); G.ggml_backend_sched_graph_compute(s, g)
assert G.ggml_backend_tensor_get_data(y).tolist() == [1, 0, 3, 0], G.ggml_backend_tensor_get_data(y)""", None, ""),
    "set_data_after_the_graph_allocator_was_freed": (False, """
be = G.ggml_backend_cpu_init(); ga = G.ggml_gallocr_new(be)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 1 << 20))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_set_output(G.ggml_relu(c, x)))
G.ggml_gallocr_alloc_graph(ga, g)
G.ggml_gallocr_free(ga)
G.ggml_backend_tensor_set_data(x, np.ones(1 << 20))""", "RuntimeError", r"no memory"),
    "compute_after_the_graph_allocator_was_freed": (False, """
be = G.ggml_backend_cpu_init(); ga = G.ggml_gallocr_new(be)
c = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 1 << 20))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_set_output(G.ggml_relu(c, x)))
G.ggml_gallocr_alloc_graph(ga, g)
G.ggml_gallocr_free(ga)
G.ggml_backend_graph_compute(be, g)""", "RuntimeError", r"no memory"),
    "view_in_another_context_after_its_buffer_was_freed": (False, """
be = G.ggml_backend_cpu_init()
a = small_ctx(); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 1 << 20); buf = G.ggml_backend_alloc_ctx_tensors(a, be)
v = G.ggml_view_1d(small_ctx(), t, 8, 0)
buf.free()
G.ggml_backend_tensor_set_data(v, np.ones(8))""", "RuntimeError", r"no memory"),
    "view_follows_its_tensor_to_new_memory": (False, """
be = G.ggml_backend_cpu_init()
a = small_ctx(); t = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 1 << 20); buf = G.ggml_backend_alloc_ctx_tensors(a, be)
v = G.ggml_view_1d(small_ctx(), t, 8, 4 * 8)
buf.free(); buf2 = G.ggml_backend_alloc_ctx_tensors(a, be)
G.ggml_backend_tensor_set_data(v, np.arange(8.0))
assert G.ggml_backend_tensor_get_data(t, 8, 8).tolist() == list(range(8))""", None, ""),
    "compute_after_a_new_buffer_and_a_new_allocator": (False, """
be = G.ggml_backend_cpu_init()
a = small_ctx(); w = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 4); buf = G.ggml_backend_alloc_ctx_tensors(a, be)
c = small_ctx(); y = G.ggml_set_output(G.ggml_relu(c, w))
g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y)
ga = G.ggml_gallocr_new(be); G.ggml_gallocr_alloc_graph(ga, g)
buf.free(); ga.free()                                   # both gone: w and y lost their memory
buf = G.ggml_backend_alloc_ctx_tensors(a, be); G.ggml_backend_tensor_set_data(w, [1, -2, 3, -4])
ga = G.ggml_gallocr_new(be); G.ggml_gallocr_alloc_graph(ga, g)
G.ggml_backend_graph_compute(be, g)                     # works again with the new memory
assert G.ggml_backend_tensor_get_data(y).tolist() == [1, 0, 3, 0]""", None, ""),
    "sched_compute_of_a_copy_into_a_fresh_tensor": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
a = small_ctx(); x = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 4); buf = G.ggml_backend_alloc_ctx_tensors(a, be)
G.ggml_backend_tensor_set_data(x, [1.5, -2, 3, 4])
c = small_ctx()
y = G.ggml_set_output(G.ggml_cpy(c, x, G.ggml_new_tensor_1d(c, G.GGML_TYPE_F16, 4)))  # a destination only
G.ggml_backend_sched_graph_compute(s, G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y))
assert G.ggml_backend_tensor_get_data(y).tolist() == [1.5, -2, 3, 4]""", None, ""),
    "backend_compute_of_an_unallocated_graph": (False, """
be = G.ggml_backend_cpu_init()
c = small_ctx(); x = G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4)
G.ggml_backend_graph_compute(be, G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_relu(c, x)))""",
                                              "RuntimeError", r"no memory"),
    "sched_compute_of_an_input_never_written": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
c = small_ctx(); x = G.ggml_set_name(G.ggml_new_tensor_1d(c, G.GGML_TYPE_F32, 4), "x")
G.ggml_backend_sched_graph_compute(s, G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64),
                                                                 G.ggml_relu(c, x)))""",
                                                "RuntimeError", r"'x'.*no values"),
    "sched_compute_after_the_weights_buffer_was_freed": (False, """
be = G.ggml_backend_cpu_init(); s = G.ggml_backend_sched_new([be], parallel=False, graph_size=64)
a = small_ctx(); w = G.ggml_new_tensor_1d(a, G.GGML_TYPE_F32, 1 << 20); buf = G.ggml_backend_alloc_ctx_tensors(a, be)
c = small_ctx(); g = G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), G.ggml_relu(c, w))
G.ggml_backend_sched_alloc_graph(s, g)
buf.free()
G.ggml_backend_sched_graph_compute(s, g)""", "RuntimeError", r"no memory"),
    "opt_eval_after_the_weights_buffer_was_freed": (True, """
opt = new_opt()["opt_ctx"]
buf.free()
G.ggml_opt_alloc(opt, True)""", "RuntimeError", r"no memory"),
    "opt_context_after_its_weights_context_was_freed": (True, """
opt = new_opt()["opt_ctx"]
cs.free()
G.ggml_opt_alloc(opt, True)""", "RuntimeError", r"freed"),
    "compute_on_the_scheduler_of_an_opt_context": (True, """
opt = new_opt()["opt_ctx"]
c = small_ctx(); y = G.ggml_relu(c, x)
G.ggml_backend_sched_graph_compute(sched, G.ggml_build_forward_expand(G.ggml_new_graph_custom(c, 64), y))""",
                                                    "RuntimeError", r"serves a live opt context"),
    "opt_init_with_unallocated_weights": (False, """
be = G.ggml_backend_cpu_init(); sched = G.ggml_backend_sched_new([be], parallel=False)
ci = small_ctx(); x = G.ggml_set_input(G.ggml_new_tensor_2d(ci, G.GGML_TYPE_F32, 4, 8))
G.ggml_backend_alloc_ctx_tensors(ci, be)
cw = small_ctx(); W = G.ggml_set_name(G.ggml_set_param(G.ggml_new_tensor_2d(cw, G.GGML_TYPE_F32, 4, 1)), "W")
cc = small_ctx(); out = G.ggml_mul_mat(cc, W, x)
G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out)""",
                                          "RuntimeError", r"'W'.*no memory"),
    # ---- ops the backend does not implement for these types (issue 9 §2): checked against the backend
    "cpy_f32_to_i8": (False, """
ctx = small_ctx()
a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4); b = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I8, 4)
run_graph(ctx, G.ggml_cpy(ctx, a, b))""", "TypeError", r"CPY.*I8"),
    "cpy_f64_to_f32_on_one_backend": (False, """
be = G.ggml_backend_cpu_init()
ctx = small_ctx(False)
a = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F64, 4); b = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_F32, 4)
G.ggml_backend_graph_compute(be, G.ggml_build_forward_expand(G.ggml_new_graph_custom(ctx, 64),
                                                            G.ggml_cpy(ctx, a, b)))""",
                                     "TypeError", r"CPY.*F64"),
    "get_rows_of_i16_rows": (False, """
ctx = small_ctx()
t = G.ggml_set_name(G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_I16, 4, 3), "table")
run_graph(ctx, G.ggml_get_rows(ctx, t, G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2)))""",
                             "TypeError", r"GET_ROWS.*I16"),
    "get_rows_of_f64_rows": (False, """
ctx = small_ctx(False)
t = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F64, 4, 3); i = G.ggml_new_tensor_1d(ctx, G.GGML_TYPE_I32, 2)
G.ggml_backend_tensor_set_data(i, [0, 1])
G.ggml_graph_compute(ctx, G.ggml_build_forward_expand(G.ggml_new_graph_custom(ctx, 64), G.ggml_get_rows(ctx, t, i)))""",
                             "TypeError", r"GET_ROWS.*F64"),
    "opt_init_with_an_op_the_backend_lacks": (True, """
h = G.ggml_cpy(cc, out, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F64, 1, 8))
out2 = G.ggml_cpy(cc, h, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F32, 1, 8))
G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=out2,
                build_type=G.ggml_opt_build_type_forward())""", "TypeError", r"CPY.*F64"),
    # ---- ggml-opt's type and shape asserts (issue 9 §3)
    "opt_init_f16_outputs": (True, """
h = G.ggml_cpy(cc, out, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F16, 1, 8))
G.ggml_opt_init(sched, G.ggml_opt_loss_type_mse(), ctx_compute=cc, inputs=x, outputs=h)""", "TypeError", r"F32"),
    "opt_init_i32_outputs": (True, """
h = G.ggml_cpy(cc, out, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_I32, 1, 8))
G.ggml_opt_init(sched, G.ggml_opt_loss_type_mean(), ctx_compute=cc, inputs=x, outputs=h)""", "TypeError", r"F32"),
    "fit_opt_f16_outputs": (True, """
h = G.ggml_cpy(cc, out, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F16, 1, 8))
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 16)
G.ggml_fit_opt(sched, cc, x, h, ds, nepoch=1, nbatch_logical=8, silent=True)""", "TypeError", r"F32"),
    "cross_entropy_on_3d_outputs": (True, """
o3 = G.ggml_reshape_3d(cc, G.ggml_mul_mat(cc, G.ggml_repeat(cc, W, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F32, 4, 6)), x),
                       3, 2, 8)
G.ggml_opt_init(sched, G.ggml_opt_loss_type_cross_entropy(), ctx_compute=cc, inputs=x, outputs=o3)""", "ValueError",
                                    r"2-D"),
    "opt_fit_cross_entropy_on_3d_outputs": (True, """
o3 = G.ggml_reshape_3d(cc, G.ggml_mul_mat(cc, G.ggml_repeat(cc, W, G.ggml_new_tensor_2d(cc, G.GGML_TYPE_F32, 4, 6)), x),
                       3, 2, 8)
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 6, 16)
G.ggml_opt_fit(sched, cc, x, o3, ds, G.ggml_opt_loss_type_cross_entropy(), nbatch_logical=8, silent=True)""",
                                            "ValueError",
                                            r"2-D"),
    "opt_epoch_with_a_dataset_of_another_type": (True, """
opt = new_opt()["opt_ctx"]
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F16, G.GGML_TYPE_F32, 4, 1, 16)
G.ggml_opt_epoch(opt, ds, None, None, -1, False, False)""", "TypeError", r"F16"),
    "opt_epoch_with_a_batch_not_made_of_whole_shards": (True, """
opt = new_opt()["opt_ctx"]
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 32, 16)
G.ggml_opt_epoch(opt, ds, None, None, -1, False, False)""", "ValueError", r"shard"),
    # ---- indices computed inside the graph (issue 9 §1): checkable where their range is known
    "get_rows_with_argmax_indices_beyond_the_table": (False, """
ctx = small_ctx()
table = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 5)
s = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 10, 3)
G.ggml_get_rows(ctx, table, G.ggml_argmax(ctx, s))""", "ValueError", r"argmax over 10.*5 rows"),
    "get_rows_with_argmax_indices_through_a_reshape": (False, """
ctx = small_ctx()
table = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 4, 5)
s = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 10, 6)
G.ggml_get_rows(ctx, table, G.ggml_view_1d(ctx, G.ggml_reshape_1d(ctx, G.ggml_argmax(ctx, s), 6), 6, 0))""",
                                                       "ValueError", r"argmax"),
    "get_rows_with_argmax_indices_within_the_table": (False, """
ctx = small_ctx(False)
table = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 2, 5)
G.ggml_backend_tensor_set_data(table, np.arange(10.0).reshape(5, 2))
s = G.ggml_new_tensor_2d(ctx, G.GGML_TYPE_F32, 5, 2)
G.ggml_backend_tensor_set_data(s, [[0, 0, 0, 9, 0], [0, 0, 0, 0, 9]])
r = G.ggml_get_rows(ctx, table, G.ggml_argmax(ctx, s))
G.ggml_graph_compute(ctx, G.ggml_build_forward_expand(G.ggml_new_graph_custom(ctx, 64), r))
assert G.ggml_backend_tensor_get_data(r).tolist() == [6, 7, 8, 9]""", None, ""),
    "opt_epoch_progress_bar_without_results": (True, """
opt = new_opt()["opt_ctx"]
ds = G.ggml_opt_dataset_init(G.GGML_TYPE_F32, G.GGML_TYPE_F32, 4, 1, 16)
G.ggml_opt_epoch(opt, ds)   # callbacks default to ggml's progress bar, which reads a result""", None, ""),
}


@pytest.fixture(scope="module")
def results():
    """Run every case in its own interpreter, a few at a time."""
    def run(name):
        uses_opt, body, exc, _ = CASES[name]
        code = TEMPLATE.format(prelude=PRELUDE + (OPT_PRELUDE if uses_opt else ""),
                               body="\n".join("    " + line for line in body.strip("\n").splitlines()),
                               exc=exc or "BaseException")
        return name, run_in_subprocess(code, timeout=120)
    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(run, CASES))


@pytest.mark.parametrize("name", sorted(CASES))
def test_misuse_raises_instead_of_aborting(results, name):
    import re
    _, _, exc, pattern = CASES[name]
    rc, out, err = results[name]
    assert rc == 0, f"the interpreter died (returncode {rc}): {err[-1500:]}"
    lines = [line for line in out.splitlines() if line.startswith(("RAISED|", "COMPLETED"))]
    assert lines, f"no verdict: {out[-1000:]} {err[-1500:]}"
    verdict = lines[-1]
    if exc is None:
        assert verdict == "COMPLETED", verdict
        return
    assert verdict.startswith("RAISED|"), f"expected {exc}, nothing was raised"
    _, type_name, is_expected, message = verdict.split("|", 3)
    assert is_expected == "True", f"expected {exc}, got {type_name}: {message}"
    assert re.search(pattern, message), f"{type_name}: {message!r} does not match {pattern!r}"


@pytest.mark.parametrize("op", ["sum", "mean", "leaky_relu", "pool_1d", "argmax"])
def test_reductions_of_a_contiguous_copy_match_numpy(op):
    """The fix refused strided operands: the ggml_cont the message suggests gives numpy's result."""
    import numpy as np

    import ggmlpy as G
    from tests.helpers.compute import compute
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)   # ggml [5, 3]
    v = x.T.astype(np.float64)                                                # numpy twin of its transpose
    build = {"sum": (lambda c, a: G.ggml_sum(c, a), lambda v: v.sum()),
             "mean": (lambda c, a: G.ggml_mean(c, a), lambda v: v.mean(axis=-1)),
             "leaky_relu": (lambda c, a: G.ggml_leaky_relu(c, a, 0.1), lambda v: np.where(v > 0, v, 0.1 * v)),
             "pool_1d": (lambda c, a: G.ggml_pool_1d(c, a, G.GGML_OP_POOL_MAX, 2, 1),
                         lambda v: np.maximum(v[:, :-1], v[:, 1:])),
             "argmax": (lambda c, a: G.ggml_argmax(c, a), lambda v: v.argmax(axis=-1))}
    f, ref = build[op]
    out = compute(lambda c, a: f(c, G.ggml_cont(c, G.ggml_transpose(c, a))), x)[0]
    np.testing.assert_allclose(out.reshape(-1), np.asarray(ref(v)).reshape(-1), rtol=1e-5, atol=1e-5)
