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

/* Added for ggmlpy.gguf: file layout, typed getters, arrays, key removal. */
#define GGUF_DEFAULT_ALIGNMENT ...
const char * gguf_type_name(enum gguf_type type);
uint32_t gguf_get_version(const struct gguf_context * ctx);
size_t gguf_get_alignment(const struct gguf_context * ctx);
size_t gguf_get_data_offset(const struct gguf_context * ctx);
enum gguf_type gguf_get_arr_type(const struct gguf_context * ctx, int64_t key_id);
uint8_t gguf_get_val_u8(const struct gguf_context * ctx, int64_t key_id);
int8_t gguf_get_val_i8(const struct gguf_context * ctx, int64_t key_id);
uint16_t gguf_get_val_u16(const struct gguf_context * ctx, int64_t key_id);
int16_t gguf_get_val_i16(const struct gguf_context * ctx, int64_t key_id);
uint64_t gguf_get_val_u64(const struct gguf_context * ctx, int64_t key_id);
size_t gguf_get_arr_n(const struct gguf_context * ctx, int64_t key_id);
const void * gguf_get_arr_data(const struct gguf_context * ctx, int64_t key_id);
const char * gguf_get_arr_str(const struct gguf_context * ctx, int64_t key_id, size_t i);
size_t gguf_get_tensor_offset(const struct gguf_context * ctx, int64_t tensor_id);
const int64_t * gguf_get_tensor_ne(const struct gguf_context * ctx, int64_t tensor_id);
int64_t gguf_remove_key(struct gguf_context * ctx, const char * key);
void gguf_set_val_u8(struct gguf_context * ctx, const char * key, uint8_t val);
void gguf_set_val_i8(struct gguf_context * ctx, const char * key, int8_t val);
void gguf_set_val_u16(struct gguf_context * ctx, const char * key, uint16_t val);
void gguf_set_val_i16(struct gguf_context * ctx, const char * key, int16_t val);
void gguf_set_val_u64(struct gguf_context * ctx, const char * key, uint64_t val);
void gguf_set_arr_data(struct gguf_context * ctx, const char * key, enum gguf_type type, const void * data, size_t n);
void gguf_set_arr_str(struct gguf_context * ctx, const char * key, const char ** data, size_t n);
