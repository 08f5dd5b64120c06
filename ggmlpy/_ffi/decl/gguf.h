/* gguf.h: weights files. */
struct gguf_context;
enum gguf_type { GGUF_TYPE_UINT8, GGUF_TYPE_INT8, GGUF_TYPE_UINT16, GGUF_TYPE_INT16, GGUF_TYPE_UINT32,
                 GGUF_TYPE_INT32, GGUF_TYPE_FLOAT32, GGUF_TYPE_BOOL, GGUF_TYPE_STRING, GGUF_TYPE_ARRAY,
                 GGUF_TYPE_UINT64, GGUF_TYPE_INT64, GGUF_TYPE_FLOAT64, ... };
struct gguf_init_params { bool no_alloc; struct ggml_context ** ctx; };
struct gguf_context * gguf_init_empty(void);
struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);
void gguf_free(struct gguf_context * ctx);
int64_t gguf_get_n_kv(const struct gguf_context * ctx);
int64_t gguf_find_key(const struct gguf_context * ctx, const char * key);
const char * gguf_get_key(const struct gguf_context * ctx, int64_t key_id);
enum gguf_type gguf_get_kv_type(const struct gguf_context * ctx, int64_t key_id);
uint32_t gguf_get_val_u32(const struct gguf_context * ctx, int64_t key_id);
int32_t gguf_get_val_i32(const struct gguf_context * ctx, int64_t key_id);
int64_t gguf_get_val_i64(const struct gguf_context * ctx, int64_t key_id);
float gguf_get_val_f32(const struct gguf_context * ctx, int64_t key_id);
double gguf_get_val_f64(const struct gguf_context * ctx, int64_t key_id);
bool gguf_get_val_bool(const struct gguf_context * ctx, int64_t key_id);
const char * gguf_get_val_str(const struct gguf_context * ctx, int64_t key_id);
int64_t gguf_get_n_tensors(const struct gguf_context * ctx);
int64_t gguf_find_tensor(const struct gguf_context * ctx, const char * name);
const char * gguf_get_tensor_name(const struct gguf_context * ctx, int64_t tensor_id);
enum ggml_type gguf_get_tensor_type(const struct gguf_context * ctx, int64_t tensor_id);
size_t gguf_get_tensor_size(const struct gguf_context * ctx, int64_t tensor_id);
void gguf_set_val_u32(struct gguf_context * ctx, const char * key, uint32_t val);
void gguf_set_val_i32(struct gguf_context * ctx, const char * key, int32_t val);
void gguf_set_val_i64(struct gguf_context * ctx, const char * key, int64_t val);
void gguf_set_val_f32(struct gguf_context * ctx, const char * key, float val);
void gguf_set_val_f64(struct gguf_context * ctx, const char * key, double val);
void gguf_set_val_bool(struct gguf_context * ctx, const char * key, bool val);
void gguf_set_val_str(struct gguf_context * ctx, const char * key, const char * val);
void gguf_add_tensor(struct gguf_context * ctx, const struct ggml_tensor * tensor);
bool gguf_write_to_file(const struct gguf_context * ctx, const char * fname, bool only_meta);
