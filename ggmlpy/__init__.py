"""ggmlpy: train models on ggml's backends (CPU, Vulkan, CUDA, RPC) from Python.

Start with the model layer, ggmlR's Keras-like API (the first names below): build a model with
``ggml_model_sequential`` and the ``ggml_layer_*`` functions (or ``ggml_input``, the layers applied to nodes, and
``ggml_model``), ``ggml_compile`` it (optimizer, loss, metrics, backend), train it with ``ggml_fit`` (arrays) or
``ggml_fit_generator`` (batches streamed from a generator), then ``ggml_evaluate``, ``ggml_predict`` and
``ggml_save_model``. The user guide (linked at the bottom left) walks through each; the search box finds any name.

The other families follow in this order, each under its heading: ggmlR's dynamic autograd engine: eager
PyTorch-style code whose every step runs as one ggml graph (``ag_tensor``, ``ag_param``, ``with_grad_tape``,
``backward``, the ``ag_*`` ops, layers and losses, ``optimizer_*``, ``lr_scheduler_*``); ggmlR's ONNX importer: an
ONNX model as one ggml graph on a device (``onnx_load``, ``onnx_run``, ``onnx_summary``, ``onnx_inputs``,
``onnx_device_info``), and an imported model as a ggmlpy model that trains (``onnx_to_model``); the training loops,
callbacks and learning-rate schedules (``ggml_fit_opt_gen``, ``ggml_callback_*``, ``ggml_schedule_*``); ggml-opt,
ggml's optimizer (``ggml_opt_*``); GGUF files (``gguf_*``); backends, devices and buffers (``ggml_backend_*``); the
scheduler and graph computation (``ggml_backend_sched_*``, ``ggml_gallocr_*``); graphs and tensors (``ggml_init``,
``ggml_new_tensor_*``, ``ggml_graph_*``); ggml's ops (``ggml_add``, ``ggml_mul_mat``, ... with the context first,
then operands, then scalars, as in ggmlR); the library's version, CPU features and timers, and the tensor types
(``GGML_VERSION``, ``ggml_cpu_has_*``, ``GGML_TYPE_*``); the errors (``GgmlpyError`` and its subclasses). Every
function keeps its ggmlR name.

(For maintainers: this file only re-exports the public names of the tiered subpackages,
docs/guide/architecture.md; ``python tools/exports.py`` writes it: edit the modules, then run that.)
"""
from __future__ import annotations

from inspect import isfunction as _isfunction

from ._ffi import BUILD_INFO
from ._guard import guard as _guard
from .core.glossary import explain as _explain
from .errors import (GgmlpyError, GgmlpyWarning, GgmlStateError, GgmlInUseError, GgmlTypeError, GgmlValueError,
                     BackendUnavailableError, GgufFileError, GgufFileNotFoundError, GgufKeyError)
from .models.layers.layer import (Layer)
from .models.layers.weight import (Weight)
from .autograd.attention import (ag_flash_attention, ag_multihead_attention)
from .autograd.conv import (ag_avg_pool2d, ag_conv2d, ag_max_pool2d)
from .autograd.data import (ag_dataloader, ag_gradcheck, ag_trace)
from .autograd.losses import (ag_cross_entropy_loss, ag_mse_loss, ag_softmax_cross_entropy_loss)
from .autograd.nn import (ag_batch_norm, ag_dropout, ag_embedding, ag_eval, ag_layer_norm, ag_linear, ag_sequential,
                          ag_train)
from .autograd.ops import (ag_add, ag_clamp, ag_exp, ag_log, ag_matmul, ag_mean, ag_mul, ag_pow, ag_relu, ag_reshape,
                           ag_scale, ag_sigmoid, ag_softmax, ag_sub, ag_sum, ag_tanh, ag_transpose)
from .autograd.optim import (check_grad_anomaly, clip_grad_norm, clip_grad_value, optimizer_adam, optimizer_sgd)
from .autograd.parallel import (dp_train)
from .autograd.persist import (ag_load_model, ag_save_model)
from .autograd.schedulers import (lr_scheduler_cosine, lr_scheduler_cyclic, lr_scheduler_onecycle, lr_scheduler_step,
                                  lr_scheduler_warmup_cosine)
from .autograd.tape import (ag_grad, backward, with_grad_tape)
from .autograd.tensor import (ag_default_device, ag_default_dtype, ag_device, ag_dtype, ag_param, ag_tensor,
                              ag_to_device, AgTensor)
from .backend.backend import (ggml_backend_cpu_init, ggml_backend_cpu_set_n_threads, ggml_backend_cuda_init,
                              ggml_backend_dev_init, ggml_backend_free, ggml_backend_get_device,
                              ggml_backend_init_auto, ggml_backend_init_best, ggml_backend_init_by_name,
                              ggml_backend_init_by_type, ggml_backend_is_cpu, ggml_backend_name,
                              ggml_backend_synchronize, ggml_get_n_threads, ggml_set_blas_enabled,
                              ggml_set_n_threads, ggml_vulkan_init)
from .backend.buffer import (ggml_backend_alloc_ctx_tensors, ggml_backend_buffer_clear, ggml_backend_buffer_free,
                             ggml_backend_buffer_get_size, ggml_backend_buffer_get_usage,
                             ggml_backend_buffer_is_host, ggml_backend_buffer_name, ggml_backend_buffer_reset,
                             ggml_backend_buffer_set_usage, GGML_BACKEND_BUFFER_USAGE_ANY,
                             ggml_backend_buffer_usage_any, GGML_BACKEND_BUFFER_USAGE_COMPUTE,
                             ggml_backend_buffer_usage_compute, GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
                             ggml_backend_buffer_usage_weights, ggml_backend_dev_supports_buft)
from .backend.device import (ggml_backend_dev_by_name, ggml_backend_dev_by_type, ggml_backend_dev_count,
                             ggml_backend_dev_description, ggml_backend_dev_get, ggml_backend_dev_get_props,
                             ggml_backend_dev_memory, ggml_backend_dev_name, ggml_backend_dev_offload_op,
                             ggml_backend_dev_supports_op, ggml_backend_dev_type, GGML_BACKEND_DEVICE_TYPE_ACCEL,
                             ggml_backend_device_type_accel, GGML_BACKEND_DEVICE_TYPE_CPU,
                             ggml_backend_device_type_cpu, GGML_BACKEND_DEVICE_TYPE_GPU,
                             ggml_backend_device_type_gpu, GGML_BACKEND_DEVICE_TYPE_IGPU,
                             ggml_backend_device_type_igpu, ggml_backend_devices, ggml_backends_built,
                             ggml_list_devices)
from .backend.registry import (ggml_backend_load, ggml_backend_load_all, ggml_backend_load_errors,
                               ggml_backend_reg_by_name, ggml_backend_reg_count, ggml_backend_reg_dev_count,
                               ggml_backend_reg_dev_get, ggml_backend_reg_get, ggml_backend_reg_name,
                               ggml_backend_reg_names, ggml_backend_register, ggml_backend_unload)
from .backend.rpc import (ggml_backend_rpc_add_server, ggml_backend_rpc_start_server, ggml_rpc_probe,
                          ggml_rpc_protocol_version)
from .backend.scalar import (ggml_get_f32, ggml_get_f32_1d, ggml_get_f32_nd, ggml_get_i32, ggml_get_i32_1d,
                             ggml_get_i32_nd, ggml_new_f32, ggml_new_i32, ggml_set_f32, ggml_set_f32_1d,
                             ggml_set_f32_nd, ggml_set_i32, ggml_set_i32_1d, ggml_set_i32_nd)
from .backend.transfer import (ggml_backend_tensor_get_data, ggml_backend_tensor_set_data, ggml_tensor_to_numpy)
from .compute.alloc import (ggml_gallocr_alloc_graph, ggml_gallocr_free, ggml_gallocr_get_buffer_size,
                            ggml_gallocr_new, ggml_gallocr_reserve)
from .compute.events import (ggml_backend_event_free, ggml_backend_event_new, ggml_backend_event_record,
                             ggml_backend_event_synchronize, ggml_backend_event_wait,
                             ggml_backend_graph_plan_compute, ggml_backend_graph_plan_create,
                             ggml_backend_graph_plan_free)
from .compute.run import (ggml_backend_graph_compute, ggml_backend_graph_compute_async,
                          ggml_backend_sched_get_n_copies, ggml_backend_sched_get_tensor_backend,
                          ggml_backend_sched_graph_compute, ggml_backend_sched_graph_compute_async,
                          ggml_backend_sched_set_tensor_backend, ggml_backend_sched_synchronize, ggml_graph_compute,
                          ggml_graph_compute_with_ctx, ggml_test)
from .compute.sched import (ggml_backend_sched_alloc_graph, ggml_backend_sched_free, ggml_backend_sched_get_backend,
                            ggml_backend_sched_get_n_backends, ggml_backend_sched_get_n_splits,
                            ggml_backend_sched_new, ggml_backend_sched_reserve, ggml_backend_sched_reset,
                            GGML_SCHED_MAX_BACKENDS)
from .compute.transfer import (ggml_backend_tensor_copy, ggml_backend_tensor_copy_async,
                               ggml_backend_tensor_get_and_sync, ggml_backend_tensor_get_async,
                               ggml_backend_tensor_set_async)
from .core.library import (ggml_cpu_features, ggml_cpu_get_rvv_vlen, ggml_cpu_get_sve_cnt, ggml_cpu_has_amx_int8,
                           ggml_cpu_has_arm_fma, ggml_cpu_has_avx, ggml_cpu_has_avx2, ggml_cpu_has_avx512,
                           ggml_cpu_has_avx512_bf16, ggml_cpu_has_avx512_vbmi, ggml_cpu_has_avx512_vnni,
                           ggml_cpu_has_avx_vnni, ggml_cpu_has_bmi2, ggml_cpu_has_dotprod, ggml_cpu_has_f16c,
                           ggml_cpu_has_fma, ggml_cpu_has_fp16_va, ggml_cpu_has_llamafile, ggml_cpu_has_matmul_int8,
                           ggml_cpu_has_neon, ggml_cpu_has_riscv_v, ggml_cpu_has_sme, ggml_cpu_has_sse3,
                           ggml_cpu_has_ssse3, ggml_cpu_has_sve, ggml_cpu_has_vsx, ggml_cpu_has_vxe,
                           ggml_cpu_has_wasm_simd, ggml_cycles, ggml_cycles_per_ms, ggml_time_init, ggml_time_ms,
                           ggml_time_us, ggml_version)
from .core.quants import (dequantize_row_iq1_m, dequantize_row_iq1_s, dequantize_row_iq2_s, dequantize_row_iq2_xs,
                          dequantize_row_iq2_xxs, dequantize_row_iq3_s, dequantize_row_iq3_xxs,
                          dequantize_row_iq4_nl, dequantize_row_iq4_xs, dequantize_row_mxfp4, dequantize_row_nvfp4,
                          dequantize_row_q1_0, dequantize_row_q2_K, dequantize_row_q3_K, dequantize_row_q4_0,
                          dequantize_row_q4_1, dequantize_row_q4_K, dequantize_row_q5_0, dequantize_row_q5_1,
                          dequantize_row_q5_K, dequantize_row_q6_K, dequantize_row_q8_0, dequantize_row_q8_K,
                          dequantize_row_tq1_0, dequantize_row_tq2_0, ggml_ftype_to_ggml_type, ggml_quant_block_info,
                          ggml_quantize_chunk, ggml_quantize_free, ggml_quantize_init,
                          ggml_quantize_requires_imatrix, iq2xs_free_impl, iq2xs_init_impl, iq3xs_free_impl,
                          iq3xs_init_impl, quantize_iq1_m, quantize_iq1_s, quantize_iq2_s, quantize_iq2_xs,
                          quantize_iq2_xxs, quantize_iq3_s, quantize_iq3_xxs, quantize_iq4_nl, quantize_iq4_xs,
                          quantize_mxfp4, quantize_nvfp4, quantize_q1_0, quantize_q2_K, quantize_q3_K, quantize_q4_0,
                          quantize_q4_1, quantize_q4_K, quantize_q5_0, quantize_q5_1, quantize_q5_K, quantize_q6_K,
                          quantize_q8_0, quantize_row_iq2_s_ref, quantize_row_iq3_s_ref, quantize_row_iq3_xxs_ref,
                          quantize_row_iq4_nl_ref, quantize_row_iq4_xs_ref, quantize_row_mxfp4_ref,
                          quantize_row_q2_K_ref, quantize_row_q3_K_ref, quantize_row_q4_0_ref, quantize_row_q4_1_ref,
                          quantize_row_q4_K_ref, quantize_row_q5_0_ref, quantize_row_q5_1_ref, quantize_row_q5_K_ref,
                          quantize_row_q6_K_ref, quantize_row_q8_0_ref, quantize_row_q8_1_ref, quantize_row_q8_K_ref,
                          quantize_row_tq1_0_ref, quantize_row_tq2_0_ref, quantize_tq1_0, quantize_tq2_0)
from .core.types import (ggml_blck_size, ggml_estimate_memory, ggml_is_quantized, GGML_TYPE_BF16, GGML_TYPE_F16,
                         GGML_TYPE_F32, GGML_TYPE_F64, GGML_TYPE_I16, GGML_TYPE_I32, GGML_TYPE_I64, GGML_TYPE_I8,
                         GGML_TYPE_IQ1_M, GGML_TYPE_IQ1_S, GGML_TYPE_IQ2_S, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_XXS,
                         GGML_TYPE_IQ3_S, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4,
                         ggml_type_name, GGML_TYPE_NVFP4, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, GGML_TYPE_Q2_K,
                         GGML_TYPE_Q3_K, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q4_K, GGML_TYPE_Q5_0,
                         GGML_TYPE_Q5_1, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_0, GGML_TYPE_Q8_1,
                         GGML_TYPE_Q8_K, ggml_type_size, ggml_type_sizef, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0)
from .gguf.file import (gguf_free, gguf_init_empty, gguf_init_from_file)
from .gguf.header import (gguf_type_name)
from .gguf.kv import (gguf_find_key, gguf_get_key, gguf_get_kv_type, gguf_get_n_kv, gguf_get_val, gguf_remove_key,
                      gguf_set_val, gguf_set_val_bool, gguf_set_val_f32, gguf_set_val_f64, gguf_set_val_i32,
                      gguf_set_val_i64, gguf_set_val_str, gguf_set_val_u32)
from .gguf.reader import (gguf_load, gguf_metadata, gguf_tensor_data, gguf_tensor_info, gguf_tensor_names)
from .gguf.tensors import (gguf_add_tensor, gguf_find_tensor, gguf_get_n_tensors, gguf_get_tensor_name,
                           gguf_get_tensor_shape, gguf_get_tensor_size, gguf_get_tensor_type, gguf_write_to_file)
from .gguf.weights import (ggml_load_weights_gguf, ggml_save_weights_gguf, gguf_read)
from .graph.backward import (ggml_build_backward_expand, ggml_graph_get_grad)
from .graph.context import (GGML_DEFAULT_GRAPH_SIZE, ggml_free, ggml_get_first_tensor, ggml_get_max_tensor_size,
                            ggml_get_mem_size, ggml_get_next_tensor, ggml_get_no_alloc, ggml_graph_overhead,
                            ggml_init, ggml_init_auto, ggml_reset, ggml_set_no_alloc, ggml_tensor_num,
                            ggml_tensor_overhead, ggml_used_mem)
from .graph.graph import (ggml_build_forward_expand, ggml_graph_dump_dot, ggml_graph_get_tensor, ggml_graph_n_nodes,
                          ggml_graph_node, ggml_graph_print, ggml_graph_reset, ggml_new_graph, ggml_new_graph_custom)
from .graph.introspect import (ggml_are_same_layout, ggml_are_same_shape, ggml_are_same_stride, ggml_can_repeat,
                               ggml_element_size, ggml_get_unary_op, ggml_is_contiguous, ggml_is_contiguous_0,
                               ggml_is_contiguous_1, ggml_is_contiguous_2, ggml_is_contiguous_channels,
                               ggml_is_contiguous_rows, ggml_is_contiguously_allocated, ggml_is_permuted,
                               ggml_is_transposed, ggml_nrows, ggml_op_desc, ggml_op_name, ggml_op_symbol,
                               ggml_tensor_nb, ggml_unary_op_name)
from .graph.tensor import (ggml_dup_tensor, ggml_get_name, ggml_get_tensor, ggml_n_dims, ggml_nbytes, ggml_nelements,
                           ggml_new_tensor, ggml_new_tensor_1d, ggml_new_tensor_2d, ggml_new_tensor_3d,
                           ggml_new_tensor_4d, ggml_set_input, ggml_set_loss, ggml_set_name, ggml_set_output,
                           ggml_set_param, ggml_tensor_shape, ggml_tensor_type)
from .models.builders import (ggml_add_layer, ggml_apply, ggml_average_layer, ggml_concatenate, ggml_custom,
                              ggml_custom_layer, ggml_freeze_weights, ggml_get_layer, ggml_get_weights, ggml_input,
                              ggml_layer_add, ggml_layer_average, ggml_layer_concatenate, ggml_layer_maximum,
                              ggml_layer_minimum, ggml_layer_multiply, ggml_layer_subtract, ggml_maximum_layer,
                              ggml_minimum_layer, ggml_model, ggml_model_sequential, ggml_model_summary,
                              ggml_multiply_layer, ggml_pop_layer, ggml_set_weights, ggml_subtract_layer,
                              ggml_unfreeze_weights)
from .models.engine.compile import (ggml_compile)
from .models.engine.fitting import (ggml_evaluate, ggml_fit, ggml_fit_generator, ggml_predict, ggml_predict_classes)
from .models.engine.metrics import (ggml_metric_auc, ggml_metric_precision, ggml_metric_recall,
                                    ggml_metric_top_k_accuracy)
from .models.engine.optimizers import (ggml_optimizer_adagrad, ggml_optimizer_adam, ggml_optimizer_rmsprop,
                                       ggml_optimizer_sgd)
from .models.engine.snapshot import (ggml_snapshot_free)
from .models.io.checkpoints import (ggml_callback_model_checkpoint)
from .models.io.lora import (ggml_add_lora, ggml_load_lora, ggml_merge_lora, ggml_save_lora)
from .models.io.preprocessing import (ggml_pad_sequences, ggml_to_categorical)
from .models.io.quantized import (ggml_model_quantization, ggml_quantize_model)
from .models.io.saving import (ggml_load_model, ggml_load_weights, ggml_save_model, ggml_save_weights)
from .models.layers.normalization import (ggml_layer_adapt)
from .models.layers.regularizers import (ggml_regularizer_l1, ggml_regularizer_l1_l2, ggml_regularizer_l2)
from .models.placement_report import (ggml_model_placement, ggml_model_profile)
from .models.trainer import (ggml_trainer)
from .onnx.api import (onnx_device_info, onnx_inputs, onnx_load, onnx_run, onnx_summary)
from .onnx.trainable import (onnx_to_model, OnnxGraph)
from .ops.activation import (ggml_add1, ggml_ceil, ggml_floor, ggml_geglu, ggml_geglu_erf, ggml_geglu_quick,
                             ggml_geglu_split, ggml_gelu_erf, ggml_gelu_quick, ggml_glu, GGML_GLU_OP_GEGLU,
                             GGML_GLU_OP_GEGLU_ERF, GGML_GLU_OP_GEGLU_QUICK, GGML_GLU_OP_REGLU, GGML_GLU_OP_SWIGLU,
                             GGML_GLU_OP_SWIGLU_OAI, ggml_glu_split, ggml_hardsigmoid, ggml_reglu, ggml_reglu_split,
                             ggml_round, ggml_swiglu, ggml_swiglu_clamp, ggml_swiglu_split)
from .ops.attention import (ggml_add_rel_pos, ggml_flash_attn_back, ggml_flash_attn_back_offsets,
                            ggml_flash_attn_ext, ggml_get_rel_pos, ggml_rope, ggml_rope_ext, ggml_rope_ext_inplace,
                            ggml_rope_inplace, ggml_rope_multi, ggml_rope_multi_inplace, GGML_ROPE_TYPE_MROPE,
                            GGML_ROPE_TYPE_NEOX, GGML_ROPE_TYPE_NORM, GGML_ROPE_TYPE_VISION, ggml_timestep_embedding)
from .ops.backward import (ggml_gelu_back, ggml_get_rows_back, ggml_norm_back, ggml_rms_norm_back, ggml_silu_back,
                           ggml_soft_max_ext_back, ggml_soft_max_ext_back_inplace)
from .ops.conv import (ggml_conv_1d_dw, ggml_conv_2d_direct, ggml_conv_2d_dw, ggml_conv_2d_dw_direct,
                       ggml_conv_2d_tiled, ggml_conv_transpose_1d, ggml_conv_transpose_2d_p0, ggml_im2col,
                       GGML_OP_POOL_AVG, GGML_OP_POOL_MAX, ggml_pool_1d, ggml_pool_2d, GGML_SCALE_MODE_BICUBIC,
                       GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_NEAREST)
from .ops.elementwise import (ggml_abs, ggml_add, ggml_clamp, ggml_cont, ggml_cos, ggml_diag_mask_inf, ggml_div,
                              ggml_dup, ggml_elu, ggml_exp, ggml_gelu, ggml_hardswish, ggml_leaky_relu, ggml_log,
                              ggml_mul, ggml_neg, ggml_norm, ggml_relu, ggml_rms_norm, ggml_scale, ggml_scale_bias,
                              ggml_sgn, ggml_sigmoid, ggml_silu, ggml_sin, ggml_soft_max, ggml_soft_max_ext,
                              ggml_softplus, ggml_sqr, ggml_sqrt, ggml_step, ggml_sub, ggml_tanh)
from .ops.inplace import (ggml_abs_inplace, ggml_add_inplace, ggml_ceil_inplace, ggml_clamp_inplace,
                          ggml_diag_mask_inf_inplace, ggml_div_inplace, ggml_dup_inplace, ggml_elu_inplace,
                          ggml_exp_inplace, ggml_floor_inplace, ggml_gelu_inplace, ggml_log_inplace,
                          ggml_mul_inplace, ggml_neg_inplace, ggml_norm_inplace, ggml_relu_inplace,
                          ggml_rms_norm_inplace, ggml_round_inplace, ggml_scale_inplace, ggml_sigmoid_inplace,
                          ggml_silu_inplace, ggml_soft_max_ext_inplace, ggml_soft_max_inplace, ggml_softplus_inplace,
                          ggml_sqr_inplace, ggml_sqrt_inplace, ggml_sub_inplace, ggml_tanh_inplace)
from .ops.layout import (ggml_cast, ggml_cpy, ggml_diag, ggml_diag_mask_zero, ggml_get_rows, ggml_pad, ggml_permute,
                         ggml_reshape, ggml_reshape_1d, ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d, ggml_set,
                         ggml_set_1d, ggml_set_2d, ggml_set_zero, ggml_transpose, ggml_view_1d, ggml_view_2d,
                         ggml_view_3d, ggml_view_4d, ggml_view_tensor)
from .ops.linalg import (ggml_cross_entropy_loss, ggml_mul_mat, ggml_mul_mat_id, ggml_out_prod, GGML_PREC_BF16,
                         GGML_PREC_DEFAULT, GGML_PREC_F16, GGML_PREC_F32, GGML_PREC_Q4, GGML_PREC_Q8,
                         ggml_prec_set_acc, ggml_prec_set_src)
from .ops.recurrent import (ggml_gru_cell, ggml_gru_seq, ggml_lstm_cell, ggml_lstm_seq)
from .ops.reduce import (ggml_argmax, ggml_concat, ggml_count_equal, ggml_group_norm, ggml_group_norm_inplace,
                         ggml_l2_norm, ggml_l2_norm_inplace, ggml_mean, ggml_repeat, ggml_repeat_back, ggml_sum,
                         ggml_sum_rows)
from .ops.resize import (ggml_pad_ext, ggml_pad_reflect_1d, ggml_roll, ggml_upscale, ggml_win_part, ggml_win_unpart)
from .ops.sort import (ggml_arange, ggml_argsort, GGML_SORT_ORDER_ASC, GGML_SORT_ORDER_DESC, ggml_top_k)
from .opt.api import (ggml_opt_alloc, ggml_opt_context_optimizer_type, ggml_opt_eval, ggml_opt_free,
                      ggml_opt_grad_acc, ggml_opt_inputs, ggml_opt_labels, ggml_opt_labels_i, ggml_opt_loss,
                      ggml_opt_loss_i, ggml_opt_loss_weights_i, ggml_opt_n_loss, ggml_opt_ncorrect,
                      ggml_opt_ncorrect_i, ggml_opt_outputs, ggml_opt_outputs_i, ggml_opt_pred,
                      ggml_opt_prepare_alloc, ggml_opt_reset, ggml_opt_static_graphs)
from .opt.constants import (ggml_opt_build_type_forward, ggml_opt_build_type_grad, ggml_opt_build_type_opt,
                            ggml_opt_optimizer_name, ggml_opt_optimizer_type_adamw, ggml_opt_optimizer_type_sgd)
from .opt.custom_loss import (ggml_opt_loss_custom)
from .opt.dataset import (ggml_opt_dataset_data, ggml_opt_dataset_free, ggml_opt_dataset_get_batch,
                          ggml_opt_dataset_get_batch_head, ggml_opt_dataset_get_batch_rows, ggml_opt_dataset_init,
                          ggml_opt_dataset_labels, ggml_opt_dataset_ndata, ggml_opt_dataset_shuffle,
                          ggml_opt_dataset_weights)
from .opt.init import (ggml_opt_default_params, ggml_opt_init, ggml_opt_init_for_fit, ggml_opt_init_for_fit_multi)
from .opt.loops import (ggml_opt_epoch, ggml_opt_fit)
from .opt.losses import (ggml_opt_loss_type_binary_cross_entropy, ggml_opt_loss_type_binary_cross_entropy_logits,
                         ggml_opt_loss_type_cosine_similarity, ggml_opt_loss_type_cross_entropy,
                         ggml_opt_loss_type_hinge, ggml_opt_loss_type_huber, ggml_opt_loss_type_kl_divergence,
                         ggml_opt_loss_type_mae, ggml_opt_loss_type_mean, ggml_opt_loss_type_mse,
                         ggml_opt_loss_type_squared_hinge, ggml_opt_loss_type_sum, ggml_opt_loss_type_weighted_mse)
from .opt.params import (ggml_opt_get_default_optimizer_params, ggml_opt_get_lr, ggml_opt_set_lr)
from .opt.result import (ggml_opt_result_accuracy, ggml_opt_result_accuracy_i, ggml_opt_result_free,
                         ggml_opt_result_init, ggml_opt_result_loss, ggml_opt_result_loss_i, ggml_opt_result_n_loss,
                         ggml_opt_result_ndata, ggml_opt_result_pred, ggml_opt_result_reset)
from .opt.state import (ggml_opt_get_iter, ggml_opt_get_state, ggml_opt_grad_m, ggml_opt_grad_v, ggml_opt_set_iter,
                        ggml_opt_set_state)
from .training.callbacks import (ggml_callback_early_stopping, ggml_schedule_cosine_decay,
                                 ggml_schedule_learning_rate, ggml_schedule_reduce_on_plateau,
                                 ggml_schedule_step_decay)
from .training.csv_logger import (ggml_callback_csv_logger)
from .training.fit import (ggml_fit_opt, ggml_fit_opt_gen, ggml_fit_opt_multi, ggml_opt_fit_multi)
from .training.plot import (ggml_plot_history)
from .models.builders import LAYER_FUNCTIONS as _layer_functions

# made from the built-in layer classes (models/builders.py)
ggml_activation = _layer_functions["ggml_activation"]
ggml_average_pooling_1d = _layer_functions["ggml_average_pooling_1d"]
ggml_average_pooling_2d = _layer_functions["ggml_average_pooling_2d"]
ggml_batch_norm = _layer_functions["ggml_batch_norm"]
ggml_bidirectional = _layer_functions["ggml_bidirectional"]
ggml_conv_1d = _layer_functions["ggml_conv_1d"]
ggml_conv_2d = _layer_functions["ggml_conv_2d"]
ggml_conv_2d_transpose = _layer_functions["ggml_conv_2d_transpose"]
ggml_dense = _layer_functions["ggml_dense"]
ggml_dropout = _layer_functions["ggml_dropout"]
ggml_embedding = _layer_functions["ggml_embedding"]
ggml_flatten = _layer_functions["ggml_flatten"]
ggml_global_average_pooling_1d = _layer_functions["ggml_global_average_pooling_1d"]
ggml_global_average_pooling_2d = _layer_functions["ggml_global_average_pooling_2d"]
ggml_global_max_pooling_1d = _layer_functions["ggml_global_max_pooling_1d"]
ggml_global_max_pooling_2d = _layer_functions["ggml_global_max_pooling_2d"]
ggml_gru = _layer_functions["ggml_gru"]
ggml_layer_activation = _layer_functions["ggml_layer_activation"]
ggml_layer_average_pooling_1d = _layer_functions["ggml_layer_average_pooling_1d"]
ggml_layer_average_pooling_2d = _layer_functions["ggml_layer_average_pooling_2d"]
ggml_layer_batch_norm = _layer_functions["ggml_layer_batch_norm"]
ggml_layer_bidirectional = _layer_functions["ggml_layer_bidirectional"]
ggml_layer_conv_1d = _layer_functions["ggml_layer_conv_1d"]
ggml_layer_conv_2d = _layer_functions["ggml_layer_conv_2d"]
ggml_layer_conv_2d_transpose = _layer_functions["ggml_layer_conv_2d_transpose"]
ggml_layer_dense = _layer_functions["ggml_layer_dense"]
ggml_layer_dropout = _layer_functions["ggml_layer_dropout"]
ggml_layer_embedding = _layer_functions["ggml_layer_embedding"]
ggml_layer_flatten = _layer_functions["ggml_layer_flatten"]
ggml_layer_global_average_pooling_1d = _layer_functions["ggml_layer_global_average_pooling_1d"]
ggml_layer_global_average_pooling_2d = _layer_functions["ggml_layer_global_average_pooling_2d"]
ggml_layer_global_max_pooling_1d = _layer_functions["ggml_layer_global_max_pooling_1d"]
ggml_layer_global_max_pooling_2d = _layer_functions["ggml_layer_global_max_pooling_2d"]
ggml_layer_gru = _layer_functions["ggml_layer_gru"]
ggml_layer_layer_norm = _layer_functions["ggml_layer_layer_norm"]
ggml_layer_lstm = _layer_functions["ggml_layer_lstm"]
ggml_layer_masking = _layer_functions["ggml_layer_masking"]
ggml_layer_max_pooling_1d = _layer_functions["ggml_layer_max_pooling_1d"]
ggml_layer_max_pooling_2d = _layer_functions["ggml_layer_max_pooling_2d"]
ggml_layer_multi_head_attention = _layer_functions["ggml_layer_multi_head_attention"]
ggml_layer_norm = _layer_functions["ggml_layer_norm"]
ggml_layer_normalization = _layer_functions["ggml_layer_normalization"]
ggml_layer_position_embedding = _layer_functions["ggml_layer_position_embedding"]
ggml_layer_random_flip = _layer_functions["ggml_layer_random_flip"]
ggml_layer_random_rotation = _layer_functions["ggml_layer_random_rotation"]
ggml_layer_random_translation = _layer_functions["ggml_layer_random_translation"]
ggml_layer_random_zoom = _layer_functions["ggml_layer_random_zoom"]
ggml_layer_repeat_vector = _layer_functions["ggml_layer_repeat_vector"]
ggml_layer_rescaling = _layer_functions["ggml_layer_rescaling"]
ggml_layer_reshape = _layer_functions["ggml_layer_reshape"]
ggml_layer_time_distributed = _layer_functions["ggml_layer_time_distributed"]
ggml_layer_upsampling_2d = _layer_functions["ggml_layer_upsampling_2d"]
ggml_lstm = _layer_functions["ggml_lstm"]
ggml_masking = _layer_functions["ggml_masking"]
ggml_max_pooling_1d = _layer_functions["ggml_max_pooling_1d"]
ggml_max_pooling_2d = _layer_functions["ggml_max_pooling_2d"]
ggml_multi_head_attention = _layer_functions["ggml_multi_head_attention"]
ggml_normalization = _layer_functions["ggml_normalization"]
ggml_position_embedding = _layer_functions["ggml_position_embedding"]
ggml_random_flip = _layer_functions["ggml_random_flip"]
ggml_random_rotation = _layer_functions["ggml_random_rotation"]
ggml_random_translation = _layer_functions["ggml_random_translation"]
ggml_random_zoom = _layer_functions["ggml_random_zoom"]
ggml_repeat_vector = _layer_functions["ggml_repeat_vector"]
ggml_rescaling = _layer_functions["ggml_rescaling"]
ggml_time_distributed = _layer_functions["ggml_time_distributed"]
ggml_upsampling_2d = _layer_functions["ggml_upsampling_2d"]

_LAZY = {'GgmlClassifier': 'models.io.estimators', 'GgmlRegressor': 'models.io.estimators'}


def __getattr__(name: str):  # the scikit-learn estimators load (and import scikit-learn) when first used
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module("." + _LAZY[name], __name__), name)
    raise AttributeError(f"module 'ggmlpy' has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too: dir(ggmlpy) and tab completion show the estimators
    return sorted(set(globals()) | set(_LAZY))


__version__ = "0.1.0"
__docformat__ = "google"  # for pdoc (docs/README.md): "Arguments:" sections render as lists, examples as code
GGML_VERSION = BUILD_INFO.get("ggml_version", "unknown")

__all__ = [
    "ggml_model_sequential", "ggml_input", "ggml_model", "ggml_compile", "ggml_fit", "ggml_fit_generator",
    "ggml_evaluate", "ggml_predict", "ggml_save_model", "ggml_load_model", "ggml_model_summary", "ggml_trainer",
    "ggml_activation", "ggml_add_layer", "ggml_apply", "ggml_average_layer", "ggml_average_pooling_1d",
    "ggml_average_pooling_2d", "ggml_batch_norm", "ggml_bidirectional", "ggml_concatenate", "ggml_conv_1d",
    "ggml_conv_2d", "ggml_conv_2d_transpose", "ggml_custom", "ggml_custom_layer", "ggml_dense", "ggml_dropout",
    "ggml_embedding", "ggml_flatten", "ggml_freeze_weights", "ggml_get_layer", "ggml_get_weights",
    "ggml_global_average_pooling_1d", "ggml_global_average_pooling_2d", "ggml_global_max_pooling_1d",
    "ggml_global_max_pooling_2d", "ggml_gru", "ggml_layer_activation", "ggml_layer_add", "ggml_layer_average",
    "ggml_layer_average_pooling_1d", "ggml_layer_average_pooling_2d", "ggml_layer_batch_norm",
    "ggml_layer_bidirectional", "ggml_layer_concatenate", "ggml_layer_conv_1d", "ggml_layer_conv_2d",
    "ggml_layer_conv_2d_transpose", "ggml_layer_dense", "ggml_layer_dropout", "ggml_layer_embedding",
    "ggml_layer_flatten", "ggml_layer_global_average_pooling_1d", "ggml_layer_global_average_pooling_2d",
    "ggml_layer_global_max_pooling_1d", "ggml_layer_global_max_pooling_2d", "ggml_layer_gru", "ggml_layer_layer_norm",
    "ggml_layer_lstm", "ggml_layer_masking", "ggml_layer_max_pooling_1d", "ggml_layer_max_pooling_2d",
    "ggml_layer_maximum", "ggml_layer_minimum", "ggml_layer_multi_head_attention", "ggml_layer_multiply",
    "ggml_layer_norm", "ggml_layer_normalization", "ggml_layer_position_embedding", "ggml_layer_random_flip",
    "ggml_layer_random_rotation", "ggml_layer_random_translation", "ggml_layer_random_zoom",
    "ggml_layer_repeat_vector", "ggml_layer_rescaling", "ggml_layer_reshape", "ggml_layer_subtract",
    "ggml_layer_time_distributed", "ggml_layer_upsampling_2d", "ggml_lstm", "ggml_masking", "ggml_max_pooling_1d",
    "ggml_max_pooling_2d", "ggml_maximum_layer", "ggml_minimum_layer", "ggml_multi_head_attention",
    "ggml_multiply_layer", "ggml_normalization", "ggml_pop_layer", "ggml_position_embedding", "ggml_random_flip",
    "ggml_random_rotation", "ggml_random_translation", "ggml_random_zoom", "ggml_repeat_vector", "ggml_rescaling",
    "ggml_set_weights", "ggml_subtract_layer", "ggml_time_distributed", "ggml_unfreeze_weights", "ggml_upsampling_2d",
    "ggml_predict_classes", "ggml_metric_auc", "ggml_metric_precision", "ggml_metric_recall",
    "ggml_metric_top_k_accuracy", "ggml_optimizer_adagrad", "ggml_optimizer_adam", "ggml_optimizer_rmsprop",
    "ggml_optimizer_sgd", "ggml_snapshot_free", "ggml_callback_model_checkpoint", "ggml_add_lora", "ggml_load_lora",
    "ggml_merge_lora", "ggml_save_lora", "ggml_pad_sequences", "ggml_to_categorical", "ggml_model_quantization",
    "ggml_quantize_model", "ggml_load_weights", "ggml_save_weights", "ggml_layer_adapt", "ggml_regularizer_l1",
    "ggml_regularizer_l1_l2", "ggml_regularizer_l2", "ggml_model_placement", "ggml_model_profile", "Layer", "Weight",
    "ag_flash_attention", "ag_multihead_attention", "ag_avg_pool2d", "ag_conv2d", "ag_max_pool2d", "ag_dataloader",
    "ag_gradcheck", "ag_trace", "ag_cross_entropy_loss", "ag_mse_loss", "ag_softmax_cross_entropy_loss",
    "ag_batch_norm", "ag_dropout", "ag_embedding", "ag_eval", "ag_layer_norm", "ag_linear", "ag_sequential",
    "ag_train", "ag_add", "ag_clamp", "ag_exp", "ag_log", "ag_matmul", "ag_mean", "ag_mul", "ag_pow", "ag_relu",
    "ag_reshape", "ag_scale", "ag_sigmoid", "ag_softmax", "ag_sub", "ag_sum", "ag_tanh", "ag_transpose",
    "check_grad_anomaly", "clip_grad_norm", "clip_grad_value", "optimizer_adam", "optimizer_sgd", "dp_train",
    "ag_load_model", "ag_save_model", "lr_scheduler_cosine", "lr_scheduler_cyclic", "lr_scheduler_onecycle",
    "lr_scheduler_step", "lr_scheduler_warmup_cosine", "ag_grad", "backward", "with_grad_tape", "ag_default_device",
    "ag_default_dtype", "ag_device", "ag_dtype", "ag_param", "ag_tensor", "ag_to_device", "AgTensor",
    "onnx_device_info", "onnx_inputs", "onnx_load", "onnx_run", "onnx_summary", "onnx_to_model", "OnnxGraph",
    "ggml_callback_early_stopping", "ggml_schedule_cosine_decay", "ggml_schedule_learning_rate",
    "ggml_schedule_reduce_on_plateau", "ggml_schedule_step_decay", "ggml_callback_csv_logger", "ggml_fit_opt",
    "ggml_fit_opt_gen", "ggml_fit_opt_multi", "ggml_opt_fit_multi", "ggml_plot_history", "ggml_opt_alloc",
    "ggml_opt_context_optimizer_type", "ggml_opt_eval", "ggml_opt_free", "ggml_opt_grad_acc", "ggml_opt_inputs",
    "ggml_opt_labels", "ggml_opt_labels_i", "ggml_opt_loss", "ggml_opt_loss_i", "ggml_opt_loss_weights_i",
    "ggml_opt_n_loss", "ggml_opt_ncorrect", "ggml_opt_ncorrect_i", "ggml_opt_outputs", "ggml_opt_outputs_i",
    "ggml_opt_pred", "ggml_opt_prepare_alloc", "ggml_opt_reset", "ggml_opt_static_graphs",
    "ggml_opt_build_type_forward", "ggml_opt_build_type_grad", "ggml_opt_build_type_opt", "ggml_opt_optimizer_name",
    "ggml_opt_optimizer_type_adamw", "ggml_opt_optimizer_type_sgd", "ggml_opt_loss_custom", "ggml_opt_dataset_data",
    "ggml_opt_dataset_free", "ggml_opt_dataset_get_batch", "ggml_opt_dataset_get_batch_head",
    "ggml_opt_dataset_get_batch_rows", "ggml_opt_dataset_init", "ggml_opt_dataset_labels", "ggml_opt_dataset_ndata",
    "ggml_opt_dataset_shuffle", "ggml_opt_dataset_weights", "ggml_opt_default_params", "ggml_opt_init",
    "ggml_opt_init_for_fit", "ggml_opt_init_for_fit_multi", "ggml_opt_epoch", "ggml_opt_fit",
    "ggml_opt_loss_type_binary_cross_entropy", "ggml_opt_loss_type_binary_cross_entropy_logits",
    "ggml_opt_loss_type_cosine_similarity", "ggml_opt_loss_type_cross_entropy", "ggml_opt_loss_type_hinge",
    "ggml_opt_loss_type_huber", "ggml_opt_loss_type_kl_divergence", "ggml_opt_loss_type_mae",
    "ggml_opt_loss_type_mean", "ggml_opt_loss_type_mse", "ggml_opt_loss_type_squared_hinge", "ggml_opt_loss_type_sum",
    "ggml_opt_loss_type_weighted_mse", "ggml_opt_get_default_optimizer_params", "ggml_opt_get_lr", "ggml_opt_set_lr",
    "ggml_opt_result_accuracy", "ggml_opt_result_accuracy_i", "ggml_opt_result_free", "ggml_opt_result_init",
    "ggml_opt_result_loss", "ggml_opt_result_loss_i", "ggml_opt_result_n_loss", "ggml_opt_result_ndata",
    "ggml_opt_result_pred", "ggml_opt_result_reset", "ggml_opt_get_iter", "ggml_opt_get_state", "ggml_opt_grad_m",
    "ggml_opt_grad_v", "ggml_opt_set_iter", "ggml_opt_set_state", "gguf_free", "gguf_init_empty",
    "gguf_init_from_file", "gguf_type_name", "gguf_find_key", "gguf_get_key", "gguf_get_kv_type", "gguf_get_n_kv",
    "gguf_get_val", "gguf_remove_key", "gguf_set_val", "gguf_set_val_bool", "gguf_set_val_f32", "gguf_set_val_f64",
    "gguf_set_val_i32", "gguf_set_val_i64", "gguf_set_val_str", "gguf_set_val_u32", "gguf_load", "gguf_metadata",
    "gguf_tensor_data", "gguf_tensor_info", "gguf_tensor_names", "gguf_add_tensor", "gguf_find_tensor",
    "gguf_get_n_tensors", "gguf_get_tensor_name", "gguf_get_tensor_shape", "gguf_get_tensor_size",
    "gguf_get_tensor_type", "gguf_write_to_file", "ggml_load_weights_gguf", "ggml_save_weights_gguf", "gguf_read",
    "ggml_backend_cpu_init", "ggml_backend_cpu_set_n_threads", "ggml_backend_cuda_init", "ggml_backend_dev_init",
    "ggml_backend_free", "ggml_backend_get_device", "ggml_backend_init_auto", "ggml_backend_init_best",
    "ggml_backend_init_by_name", "ggml_backend_init_by_type", "ggml_backend_is_cpu", "ggml_backend_name",
    "ggml_backend_synchronize", "ggml_get_n_threads", "ggml_set_blas_enabled", "ggml_set_n_threads",
    "ggml_vulkan_init", "ggml_backend_alloc_ctx_tensors", "ggml_backend_buffer_clear", "ggml_backend_buffer_free",
    "ggml_backend_buffer_get_size", "ggml_backend_buffer_get_usage", "ggml_backend_buffer_is_host",
    "ggml_backend_buffer_name", "ggml_backend_buffer_reset", "ggml_backend_buffer_set_usage",
    "GGML_BACKEND_BUFFER_USAGE_ANY", "ggml_backend_buffer_usage_any", "GGML_BACKEND_BUFFER_USAGE_COMPUTE",
    "ggml_backend_buffer_usage_compute", "GGML_BACKEND_BUFFER_USAGE_WEIGHTS", "ggml_backend_buffer_usage_weights",
    "ggml_backend_dev_supports_buft", "ggml_backend_dev_by_name", "ggml_backend_dev_by_type",
    "ggml_backend_dev_count", "ggml_backend_dev_description", "ggml_backend_dev_get", "ggml_backend_dev_get_props",
    "ggml_backend_dev_memory", "ggml_backend_dev_name", "ggml_backend_dev_offload_op", "ggml_backend_dev_supports_op",
    "ggml_backend_dev_type", "GGML_BACKEND_DEVICE_TYPE_ACCEL", "ggml_backend_device_type_accel",
    "GGML_BACKEND_DEVICE_TYPE_CPU", "ggml_backend_device_type_cpu", "GGML_BACKEND_DEVICE_TYPE_GPU",
    "ggml_backend_device_type_gpu", "GGML_BACKEND_DEVICE_TYPE_IGPU", "ggml_backend_device_type_igpu",
    "ggml_backend_devices", "ggml_backends_built", "ggml_list_devices", "ggml_backend_load", "ggml_backend_load_all",
    "ggml_backend_load_errors", "ggml_backend_reg_by_name", "ggml_backend_reg_count", "ggml_backend_reg_dev_count",
    "ggml_backend_reg_dev_get", "ggml_backend_reg_get", "ggml_backend_reg_name", "ggml_backend_reg_names",
    "ggml_backend_register", "ggml_backend_unload", "ggml_backend_rpc_add_server", "ggml_backend_rpc_start_server",
    "ggml_rpc_probe", "ggml_rpc_protocol_version", "ggml_get_f32", "ggml_get_f32_1d", "ggml_get_f32_nd",
    "ggml_get_i32", "ggml_get_i32_1d", "ggml_get_i32_nd", "ggml_new_f32", "ggml_new_i32", "ggml_set_f32",
    "ggml_set_f32_1d", "ggml_set_f32_nd", "ggml_set_i32", "ggml_set_i32_1d", "ggml_set_i32_nd",
    "ggml_backend_tensor_get_data", "ggml_backend_tensor_set_data", "ggml_tensor_to_numpy",
    "ggml_gallocr_alloc_graph", "ggml_gallocr_free", "ggml_gallocr_get_buffer_size", "ggml_gallocr_new",
    "ggml_gallocr_reserve", "ggml_backend_event_free", "ggml_backend_event_new", "ggml_backend_event_record",
    "ggml_backend_event_synchronize", "ggml_backend_event_wait", "ggml_backend_graph_plan_compute",
    "ggml_backend_graph_plan_create", "ggml_backend_graph_plan_free", "ggml_backend_graph_compute",
    "ggml_backend_graph_compute_async", "ggml_backend_sched_get_n_copies", "ggml_backend_sched_get_tensor_backend",
    "ggml_backend_sched_graph_compute", "ggml_backend_sched_graph_compute_async",
    "ggml_backend_sched_set_tensor_backend", "ggml_backend_sched_synchronize", "ggml_graph_compute",
    "ggml_graph_compute_with_ctx", "ggml_test", "ggml_backend_sched_alloc_graph", "ggml_backend_sched_free",
    "ggml_backend_sched_get_backend", "ggml_backend_sched_get_n_backends", "ggml_backend_sched_get_n_splits",
    "ggml_backend_sched_new", "ggml_backend_sched_reserve", "ggml_backend_sched_reset", "GGML_SCHED_MAX_BACKENDS",
    "ggml_backend_tensor_copy", "ggml_backend_tensor_copy_async", "ggml_backend_tensor_get_and_sync",
    "ggml_backend_tensor_get_async", "ggml_backend_tensor_set_async", "ggml_build_backward_expand",
    "ggml_graph_get_grad", "GGML_DEFAULT_GRAPH_SIZE", "ggml_free", "ggml_get_first_tensor",
    "ggml_get_max_tensor_size", "ggml_get_mem_size", "ggml_get_next_tensor", "ggml_get_no_alloc",
    "ggml_graph_overhead", "ggml_init", "ggml_init_auto", "ggml_reset", "ggml_set_no_alloc", "ggml_tensor_num",
    "ggml_tensor_overhead", "ggml_used_mem", "ggml_build_forward_expand", "ggml_graph_dump_dot",
    "ggml_graph_get_tensor", "ggml_graph_n_nodes", "ggml_graph_node", "ggml_graph_print", "ggml_graph_reset",
    "ggml_new_graph", "ggml_new_graph_custom", "ggml_are_same_layout", "ggml_are_same_shape", "ggml_are_same_stride",
    "ggml_can_repeat", "ggml_element_size", "ggml_get_unary_op", "ggml_is_contiguous", "ggml_is_contiguous_0",
    "ggml_is_contiguous_1", "ggml_is_contiguous_2", "ggml_is_contiguous_channels", "ggml_is_contiguous_rows",
    "ggml_is_contiguously_allocated", "ggml_is_permuted", "ggml_is_transposed", "ggml_nrows", "ggml_op_desc",
    "ggml_op_name", "ggml_op_symbol", "ggml_tensor_nb", "ggml_unary_op_name", "ggml_dup_tensor", "ggml_get_name",
    "ggml_get_tensor", "ggml_n_dims", "ggml_nbytes", "ggml_nelements", "ggml_new_tensor", "ggml_new_tensor_1d",
    "ggml_new_tensor_2d", "ggml_new_tensor_3d", "ggml_new_tensor_4d", "ggml_set_input", "ggml_set_loss",
    "ggml_set_name", "ggml_set_output", "ggml_set_param", "ggml_tensor_shape", "ggml_tensor_type", "ggml_add1",
    "ggml_ceil", "ggml_floor", "ggml_geglu", "ggml_geglu_erf", "ggml_geglu_quick", "ggml_geglu_split",
    "ggml_gelu_erf", "ggml_gelu_quick", "ggml_glu", "GGML_GLU_OP_GEGLU", "GGML_GLU_OP_GEGLU_ERF",
    "GGML_GLU_OP_GEGLU_QUICK", "GGML_GLU_OP_REGLU", "GGML_GLU_OP_SWIGLU", "GGML_GLU_OP_SWIGLU_OAI", "ggml_glu_split",
    "ggml_hardsigmoid", "ggml_reglu", "ggml_reglu_split", "ggml_round", "ggml_swiglu", "ggml_swiglu_clamp",
    "ggml_swiglu_split", "ggml_add_rel_pos", "ggml_flash_attn_back", "ggml_flash_attn_back_offsets",
    "ggml_flash_attn_ext", "ggml_get_rel_pos", "ggml_rope", "ggml_rope_ext", "ggml_rope_ext_inplace",
    "ggml_rope_inplace", "ggml_rope_multi", "ggml_rope_multi_inplace", "GGML_ROPE_TYPE_MROPE", "GGML_ROPE_TYPE_NEOX",
    "GGML_ROPE_TYPE_NORM", "GGML_ROPE_TYPE_VISION", "ggml_timestep_embedding", "ggml_gelu_back", "ggml_get_rows_back",
    "ggml_norm_back", "ggml_rms_norm_back", "ggml_silu_back", "ggml_soft_max_ext_back",
    "ggml_soft_max_ext_back_inplace", "ggml_conv_1d_dw", "ggml_conv_2d_direct", "ggml_conv_2d_dw",
    "ggml_conv_2d_dw_direct", "ggml_conv_2d_tiled", "ggml_conv_transpose_1d", "ggml_conv_transpose_2d_p0",
    "ggml_im2col", "GGML_OP_POOL_AVG", "GGML_OP_POOL_MAX", "ggml_pool_1d", "ggml_pool_2d", "GGML_SCALE_MODE_BICUBIC",
    "GGML_SCALE_MODE_BILINEAR", "GGML_SCALE_MODE_NEAREST", "ggml_abs", "ggml_add", "ggml_clamp", "ggml_cont",
    "ggml_cos", "ggml_diag_mask_inf", "ggml_div", "ggml_dup", "ggml_elu", "ggml_exp", "ggml_gelu", "ggml_hardswish",
    "ggml_leaky_relu", "ggml_log", "ggml_mul", "ggml_neg", "ggml_norm", "ggml_relu", "ggml_rms_norm", "ggml_scale",
    "ggml_scale_bias", "ggml_sgn", "ggml_sigmoid", "ggml_silu", "ggml_sin", "ggml_soft_max", "ggml_soft_max_ext",
    "ggml_softplus", "ggml_sqr", "ggml_sqrt", "ggml_step", "ggml_sub", "ggml_tanh", "ggml_abs_inplace",
    "ggml_add_inplace", "ggml_ceil_inplace", "ggml_clamp_inplace", "ggml_diag_mask_inf_inplace", "ggml_div_inplace",
    "ggml_dup_inplace", "ggml_elu_inplace", "ggml_exp_inplace", "ggml_floor_inplace", "ggml_gelu_inplace",
    "ggml_log_inplace", "ggml_mul_inplace", "ggml_neg_inplace", "ggml_norm_inplace", "ggml_relu_inplace",
    "ggml_rms_norm_inplace", "ggml_round_inplace", "ggml_scale_inplace", "ggml_sigmoid_inplace", "ggml_silu_inplace",
    "ggml_soft_max_ext_inplace", "ggml_soft_max_inplace", "ggml_softplus_inplace", "ggml_sqr_inplace",
    "ggml_sqrt_inplace", "ggml_sub_inplace", "ggml_tanh_inplace", "ggml_cast", "ggml_cpy", "ggml_diag",
    "ggml_diag_mask_zero", "ggml_get_rows", "ggml_pad", "ggml_permute", "ggml_reshape", "ggml_reshape_1d",
    "ggml_reshape_2d", "ggml_reshape_3d", "ggml_reshape_4d", "ggml_set", "ggml_set_1d", "ggml_set_2d",
    "ggml_set_zero", "ggml_transpose", "ggml_view_1d", "ggml_view_2d", "ggml_view_3d", "ggml_view_4d",
    "ggml_view_tensor", "ggml_cross_entropy_loss", "ggml_mul_mat", "ggml_mul_mat_id", "ggml_out_prod",
    "GGML_PREC_BF16", "GGML_PREC_DEFAULT", "GGML_PREC_F16", "GGML_PREC_F32", "GGML_PREC_Q4", "GGML_PREC_Q8",
    "ggml_prec_set_acc", "ggml_prec_set_src", "ggml_gru_cell", "ggml_gru_seq", "ggml_lstm_cell", "ggml_lstm_seq",
    "ggml_argmax", "ggml_concat", "ggml_count_equal", "ggml_group_norm", "ggml_group_norm_inplace", "ggml_l2_norm",
    "ggml_l2_norm_inplace", "ggml_mean", "ggml_repeat", "ggml_repeat_back", "ggml_sum", "ggml_sum_rows",
    "ggml_pad_ext", "ggml_pad_reflect_1d", "ggml_roll", "ggml_upscale", "ggml_win_part", "ggml_win_unpart",
    "ggml_arange", "ggml_argsort", "GGML_SORT_ORDER_ASC", "GGML_SORT_ORDER_DESC", "ggml_top_k", "GGML_VERSION",
    "ggml_cpu_features", "ggml_cpu_get_rvv_vlen", "ggml_cpu_get_sve_cnt", "ggml_cpu_has_amx_int8",
    "ggml_cpu_has_arm_fma", "ggml_cpu_has_avx", "ggml_cpu_has_avx2", "ggml_cpu_has_avx512",
    "ggml_cpu_has_avx512_bf16", "ggml_cpu_has_avx512_vbmi", "ggml_cpu_has_avx512_vnni", "ggml_cpu_has_avx_vnni",
    "ggml_cpu_has_bmi2", "ggml_cpu_has_dotprod", "ggml_cpu_has_f16c", "ggml_cpu_has_fma", "ggml_cpu_has_fp16_va",
    "ggml_cpu_has_llamafile", "ggml_cpu_has_matmul_int8", "ggml_cpu_has_neon", "ggml_cpu_has_riscv_v",
    "ggml_cpu_has_sme", "ggml_cpu_has_sse3", "ggml_cpu_has_ssse3", "ggml_cpu_has_sve", "ggml_cpu_has_vsx",
    "ggml_cpu_has_vxe", "ggml_cpu_has_wasm_simd", "ggml_cycles", "ggml_cycles_per_ms", "ggml_time_init",
    "ggml_time_ms", "ggml_time_us", "ggml_version", "dequantize_row_iq1_m", "dequantize_row_iq1_s",
    "dequantize_row_iq2_s", "dequantize_row_iq2_xs", "dequantize_row_iq2_xxs", "dequantize_row_iq3_s",
    "dequantize_row_iq3_xxs", "dequantize_row_iq4_nl", "dequantize_row_iq4_xs", "dequantize_row_mxfp4",
    "dequantize_row_nvfp4", "dequantize_row_q1_0", "dequantize_row_q2_K", "dequantize_row_q3_K",
    "dequantize_row_q4_0", "dequantize_row_q4_1", "dequantize_row_q4_K", "dequantize_row_q5_0", "dequantize_row_q5_1",
    "dequantize_row_q5_K", "dequantize_row_q6_K", "dequantize_row_q8_0", "dequantize_row_q8_K",
    "dequantize_row_tq1_0", "dequantize_row_tq2_0", "ggml_ftype_to_ggml_type", "ggml_quant_block_info",
    "ggml_quantize_chunk", "ggml_quantize_free", "ggml_quantize_init", "ggml_quantize_requires_imatrix",
    "iq2xs_free_impl", "iq2xs_init_impl", "iq3xs_free_impl", "iq3xs_init_impl", "quantize_iq1_m", "quantize_iq1_s",
    "quantize_iq2_s", "quantize_iq2_xs", "quantize_iq2_xxs", "quantize_iq3_s", "quantize_iq3_xxs", "quantize_iq4_nl",
    "quantize_iq4_xs", "quantize_mxfp4", "quantize_nvfp4", "quantize_q1_0", "quantize_q2_K", "quantize_q3_K",
    "quantize_q4_0", "quantize_q4_1", "quantize_q4_K", "quantize_q5_0", "quantize_q5_1", "quantize_q5_K",
    "quantize_q6_K", "quantize_q8_0", "quantize_row_iq2_s_ref", "quantize_row_iq3_s_ref", "quantize_row_iq3_xxs_ref",
    "quantize_row_iq4_nl_ref", "quantize_row_iq4_xs_ref", "quantize_row_mxfp4_ref", "quantize_row_q2_K_ref",
    "quantize_row_q3_K_ref", "quantize_row_q4_0_ref", "quantize_row_q4_1_ref", "quantize_row_q4_K_ref",
    "quantize_row_q5_0_ref", "quantize_row_q5_1_ref", "quantize_row_q5_K_ref", "quantize_row_q6_K_ref",
    "quantize_row_q8_0_ref", "quantize_row_q8_1_ref", "quantize_row_q8_K_ref", "quantize_row_tq1_0_ref",
    "quantize_row_tq2_0_ref", "quantize_tq1_0", "quantize_tq2_0", "ggml_blck_size", "ggml_estimate_memory",
    "ggml_is_quantized", "GGML_TYPE_BF16", "GGML_TYPE_F16", "GGML_TYPE_F32", "GGML_TYPE_F64", "GGML_TYPE_I16",
    "GGML_TYPE_I32", "GGML_TYPE_I64", "GGML_TYPE_I8", "GGML_TYPE_IQ1_M", "GGML_TYPE_IQ1_S", "GGML_TYPE_IQ2_S",
    "GGML_TYPE_IQ2_XS", "GGML_TYPE_IQ2_XXS", "GGML_TYPE_IQ3_S", "GGML_TYPE_IQ3_XXS", "GGML_TYPE_IQ4_NL",
    "GGML_TYPE_IQ4_XS", "GGML_TYPE_MXFP4", "ggml_type_name", "GGML_TYPE_NVFP4", "GGML_TYPE_Q1_0", "GGML_TYPE_Q2_0",
    "GGML_TYPE_Q2_K", "GGML_TYPE_Q3_K", "GGML_TYPE_Q4_0", "GGML_TYPE_Q4_1", "GGML_TYPE_Q4_K", "GGML_TYPE_Q5_0",
    "GGML_TYPE_Q5_1", "GGML_TYPE_Q5_K", "GGML_TYPE_Q6_K", "GGML_TYPE_Q8_0", "GGML_TYPE_Q8_1", "GGML_TYPE_Q8_K",
    "ggml_type_size", "ggml_type_sizef", "GGML_TYPE_TQ1_0", "GGML_TYPE_TQ2_0", "GgmlpyError", "GgmlpyWarning",
    "GgmlStateError", "GgmlInUseError", "GgmlTypeError", "GgmlValueError", "BackendUnavailableError", "GgufFileError",
    "GgufFileNotFoundError", "GgufKeyError",
]

# docstrings get their shared argument descriptions (core/glossary.py); one wrapper (_guard.py) makes calls on one
# context take turns and a Python error from inside ggmlpy leave a public function as a ggmlpy error
for _name in __all__:
    if _isfunction(globals()[_name]):
        globals()[_name] = _guard(_explain(globals()[_name]))
del _name
