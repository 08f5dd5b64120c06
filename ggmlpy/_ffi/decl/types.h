/* Shared types, read first. API mode: "..." lets the compiler supply layouts and values. */
typedef int... int64_t;
enum ggml_status { GGML_STATUS_ALLOC_FAILED, GGML_STATUS_FAILED, GGML_STATUS_SUCCESS, GGML_STATUS_ABORTED, ... };
enum ggml_type {
    GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0, GGML_TYPE_Q8_1, GGML_TYPE_I8, GGML_TYPE_I16, GGML_TYPE_I32, GGML_TYPE_I64,
    GGML_TYPE_F64, GGML_TYPE_BF16, GGML_TYPE_COUNT,
    GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_Q8_K,
    GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ3_XXS, GGML_TYPE_IQ1_S, GGML_TYPE_IQ4_NL, GGML_TYPE_IQ3_S,
    GGML_TYPE_IQ2_S, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ1_M, GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_MXFP4,
    GGML_TYPE_NVFP4, GGML_TYPE_Q1_0, GGML_TYPE_Q2_0, ...
};
enum ggml_ftype {
    GGML_FTYPE_UNKNOWN, GGML_FTYPE_ALL_F32, GGML_FTYPE_MOSTLY_F16, GGML_FTYPE_MOSTLY_Q4_0, GGML_FTYPE_MOSTLY_Q4_1,
    GGML_FTYPE_MOSTLY_Q4_1_SOME_F16, GGML_FTYPE_MOSTLY_Q8_0, GGML_FTYPE_MOSTLY_Q5_0, GGML_FTYPE_MOSTLY_Q5_1,
    GGML_FTYPE_MOSTLY_Q2_K, GGML_FTYPE_MOSTLY_Q3_K, GGML_FTYPE_MOSTLY_Q4_K, GGML_FTYPE_MOSTLY_Q5_K,
    GGML_FTYPE_MOSTLY_Q6_K, GGML_FTYPE_MOSTLY_IQ2_XXS, GGML_FTYPE_MOSTLY_IQ2_XS, GGML_FTYPE_MOSTLY_IQ3_XXS,
    GGML_FTYPE_MOSTLY_IQ1_S, GGML_FTYPE_MOSTLY_IQ4_NL, GGML_FTYPE_MOSTLY_IQ3_S, GGML_FTYPE_MOSTLY_IQ2_S,
    GGML_FTYPE_MOSTLY_IQ4_XS, GGML_FTYPE_MOSTLY_IQ1_M, GGML_FTYPE_MOSTLY_BF16, GGML_FTYPE_MOSTLY_MXFP4,
    GGML_FTYPE_MOSTLY_NVFP4, GGML_FTYPE_MOSTLY_Q1_0, GGML_FTYPE_MOSTLY_Q2_0, ...
};
enum ggml_op { GGML_OP_NONE, GGML_OP_COUNT, ... };
enum ggml_unary_op { GGML_UNARY_OP_COUNT, ... };
enum ggml_op_pool { GGML_OP_POOL_MAX, GGML_OP_POOL_AVG, GGML_OP_POOL_COUNT, ... };
enum ggml_log_level { GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO,
                      GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT, ... };
enum ggml_tensor_flag { GGML_TENSOR_FLAG_INPUT, GGML_TENSOR_FLAG_OUTPUT, GGML_TENSOR_FLAG_PARAM,
                        GGML_TENSOR_FLAG_LOSS, ... };

#define GGML_MAX_DIMS ...
#define GGML_MAX_SRC ...
#define GGML_MAX_NAME ...
#define GGML_DEFAULT_GRAPH_SIZE ...

struct ggml_context;
struct ggml_cgraph;
struct ggml_backend_buffer;

struct ggml_tensor {
    enum ggml_type type;
    struct ggml_backend_buffer * buffer;
    int64_t ne[4];
    size_t nb[4];
    enum ggml_op op;
    int32_t op_params[16];
    int32_t flags;
    struct ggml_tensor * src[10];
    struct ggml_tensor * view_src;
    size_t view_offs;
    void * data;
    char name[64];
    ...;
};

struct ggml_init_params {
    size_t mem_size;
    void * mem_buffer;
    bool no_alloc;
};

/* ggmlR parity (issue 11): enums and constants of the extra ops */
enum ggml_glu_op { GGML_GLU_OP_REGLU, GGML_GLU_OP_GEGLU, GGML_GLU_OP_SWIGLU, GGML_GLU_OP_SWIGLU_OAI,
                   GGML_GLU_OP_GEGLU_ERF, GGML_GLU_OP_GEGLU_QUICK, GGML_GLU_OP_SWIGLU_CLAMP,
                   GGML_GLU_OP_COUNT, ... };
enum ggml_sort_order { GGML_SORT_ORDER_ASC, GGML_SORT_ORDER_DESC, ... };
enum ggml_scale_mode { GGML_SCALE_MODE_NEAREST, GGML_SCALE_MODE_BILINEAR, GGML_SCALE_MODE_BICUBIC, ... };
enum ggml_prec { GGML_PREC_UNDEFINED, GGML_PREC_DEFAULT, GGML_PREC_F32, GGML_PREC_BF16, GGML_PREC_F16,
                 GGML_PREC_Q8, GGML_PREC_Q4, ... };
#define GGML_ROPE_TYPE_NORMAL ...
#define GGML_ROPE_TYPE_NEOX ...
#define GGML_ROPE_TYPE_MROPE ...
#define GGML_ROPE_TYPE_VISION ...
#define GGML_MROPE_SECTIONS ...
