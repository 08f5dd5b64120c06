/* Backend-specific entry points. With GGML_BACKEND_DL they live in separately loaded modules,
   so they are reached through ggml_backend_reg_get_proc_address by small C shims (see build.py). */
int ggmlpy_cpu_set_n_threads(ggml_backend_t backend, int n_threads);
struct ggml_backend_feature { const char * name; const char * value; };
const struct ggml_backend_feature * ggmlpy_cpu_features(void);
ggml_backend_reg_t ggmlpy_rpc_add_server(const char * endpoint);
int ggmlpy_rpc_lost_connections(void);
void ggmlpy_rpc_set_connect_timeout_ms(int timeout_ms);
size_t ggmlpy_vk_max_storage_buffer_range(ggml_backend_dev_t dev);
uint64_t ggmlpy_vk_shader_loops_refused(ggml_backend_dev_t dev, const struct ggml_tensor * op);
/* patches/0079: the CPU's per-node times of the graph computes the calling thread makes (set: NULL stops, *previous
   the timer replaced; 0: the CPU backend has no such timer) */
struct ggmlpy_cpu_node_time { const struct ggml_tensor * first; const struct ggml_tensor * last; int64_t nodes; int64_t ns; };
struct ggmlpy_cpu_node_timer { struct ggmlpy_cpu_node_time * times; int64_t capacity; int64_t count; };
int ggmlpy_cpu_node_timer_set(struct ggmlpy_cpu_node_timer * timer, struct ggmlpy_cpu_node_timer ** previous);
int ggmlpy_cpu_node_timer_available(void);
/* the wire protocol version of ggml's RPC backend (client and server must agree on the major) */
#define RPC_PROTO_MAJOR_VERSION ...
#define RPC_PROTO_MINOR_VERSION ...
#define RPC_PROTO_PATCH_VERSION ...
int ggmlpy_rpc_start_server(const char * endpoint, const char * cache_dir, size_t n_threads, size_t n_devices, ggml_backend_dev_t * devices);

/* Callbacks into Python. */
extern "Python" void _ggmlpy_log_cb(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" void _ggmlpy_abort_cb(const char * error_message);
extern "Python" bool _ggmlpy_sched_eval_cb(struct ggml_tensor * t, bool ask, void * user_data);
extern "Python" void _ggmlpy_epoch_cb(bool train, ggml_opt_context_t opt_ctx, ggml_opt_dataset_t dataset, ggml_opt_result_t result, int64_t ibatch, int64_t ibatch_max, int64_t t_start_us);
