/*
 * vitc.h — self-attention for computer vision, in C.
 *
 * The only public header of libvitc. Everything is prefixed vitc_ / VITC_.
 * Tensors are float32, row-major, in PyTorch's dimension order; shapes are
 * int64_t arrays. Functions that can fail return vitc_status (0 = ok,
 * negative = error) and leave a readable message for vitc_last_error().
 * The library never exits or aborts on bad input.
 *
 * Ten lines of C:
 *
 *   vitc_layer_config cfg = vitc_layer_default_config(VITC_CONV_SA_BLOCK);
 *   cfg.in_channels = 64;
 *   vitc_layer *sa;
 *   if (vitc_layer_create(&cfg, &sa) != VITC_OK) { puts(vitc_last_error()); return 1; }
 *   vitc_safetensors *st;                        // weights saved from PyTorch
 *   vitc_safetensors_load("convsa.safetensors", &st);
 *   vitc_layer_load_safetensors(sa, st, NULL, 1);   // by PyTorch key names
 *   int64_t shape[4] = {1, 64, 32, 32}, oshape[8]; int ond;
 *   vitc_layer_output_shape(sa, 4, shape, &ond, oshape);
 *   vitc_layer_forward(sa, x, 4, shape, out);    // out: [1, 64, 32, 32]
 *
 * Thread safety: a loaded ViT (vitc_vit) is read-only to inference run
 * through sessions (vitc_session_create): any number of threads may run
 * forwards on one model at once, each with its own session (a session holds
 * a forward's activations and scratch; one session is used by one thread at
 * a time). Calls that take a non-const vitc_vit * (vitc_vit_forward and the
 * rest of the model API, vitc_vit_set_precision, vitc_vit_param,
 * vitc_vit_save, training) write the model: not while its sessions run.
 * Other objects (layers, files) are not shared between threads while one
 * of them runs a forward; distinct objects may be used from distinct
 * threads. The error message is thread-local. (The Python binding gives
 * each thread its own session for inference and serialises the rest on
 * one object with a lock.)
 */
#ifndef VITC_H
#define VITC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VITC_VERSION_MAJOR 0
#define VITC_VERSION_MINOR 1
#define VITC_VERSION_PATCH 0
#define VITC_VERSION_STRING "0.1.0"

#if defined(__GNUC__) && !defined(VITC_STATIC_BUILD)
#define VITC_API __attribute__((visibility("default")))
#else
#define VITC_API
#endif

/* ------------------------------------------------------------------ */
/* Status and errors                                                  */
/* ------------------------------------------------------------------ */

typedef enum vitc_status {
    VITC_OK = 0,
    VITC_ERR_INVALID_ARG = -1,  /* a bad argument or configuration */
    VITC_ERR_SHAPE = -2,        /* a tensor of the wrong shape */
    VITC_ERR_NOMEM = -3,        /* allocation failed or size overflowed */
    VITC_ERR_IO = -4,           /* a file could not be opened, read or written */
    VITC_ERR_FORMAT = -5,       /* a file is malformed (header, offsets, dtype) */
    VITC_ERR_KEY = -6,          /* a missing or unexpected weight name */
    VITC_ERR_UNSUPPORTED = -7   /* valid but not supported by this build */
} vitc_status;

/* Static name of a status ("ok", "invalid argument", ...). */
VITC_API const char *vitc_status_str(vitc_status s);
/* Message of the last failure on this thread ("" if none). Valid until the
 * next failing call on this thread. */
VITC_API const char *vitc_last_error(void);
VITC_API const char *vitc_version(void);

/* ------------------------------------------------------------------ */
/* Runtime: threads and kernel paths                                  */
/* ------------------------------------------------------------------ */

/* Threads used by every parallel loop of the library. n <= 0 restores the
 * default: the number of CPUs this process may run on. */
VITC_API void vitc_set_num_threads(int n);
VITC_API int vitc_get_num_threads(void);
/* Kernel path in use: "avx512", "avx2" or "generic". Chosen at run time from
 * cpuid; the environment variable VITC_ARCH forces one. */
VITC_API const char *vitc_get_arch(void);
/* Force a path ("avx512", "avx2", "generic", or NULL/"auto" for the best the
 * CPU supports). Fails when the CPU lacks the instructions. */
VITC_API vitc_status vitc_set_arch(const char *name);
/* GEMM backend in use: "openblas" or "builtin". By default the built-in
 * GEMM runs on the AVX-512 path (it measured faster than OpenBLAS there) and
 * OpenBLAS, when the build has it, on the others. VITC_GEMM=builtin|openblas
 * or vitc_set_gemm_backend() (NULL/"auto" = the default) force one. */
VITC_API const char *vitc_get_gemm_backend(void);
VITC_API vitc_status vitc_set_gemm_backend(const char *name);
/* This CPU as vitc read it at run time (brand, vendor, family / model,
 * microarchitecture, AVX-512 datapath, AMX, cache sizes) and the GEMM cache
 * blocking chosen from it for the kernel path in use. VITC_CACHE=l1d=48K,
 * l2=2M pretends other caches; VITC_BLOCKING=kc,mc,nc (or kc=..,mc=..,
 * nc=..,lp_mc=..,lp_nb=..) forces the blocks (docs/kernels.md).
 * form VITC_CPU_INFO_TEXT: two lines for people ("cpu: ...", "caches:
 * ..."); VITC_CPU_INFO_KEYS: "key=value" lines (id, vendor, brand, family,
 * model, stepping, uarch, avx512, datapath, amx, l1d, l2, l3, line,
 * cache_from, arch, kc, mc, nc, lp_mc, lp_nb, blocking_from). Writes at
 * most len bytes, NUL-terminated (buf may be NULL with len 0); returns the
 * length of the whole text, as snprintf does. */
#define VITC_CPU_INFO_TEXT 0
#define VITC_CPU_INFO_KEYS 1
VITC_API size_t vitc_cpu_info(char *buf, size_t len, int form);

/* ------------------------------------------------------------------ */
/* Safetensors                                                        */
/* ------------------------------------------------------------------ */

/* A safetensors file held in memory, every tensor converted to float32
 * (F32, F16 and BF16 files are accepted). */
/* Most dimensions a tensor may have, read or written (numpy 2's limit;
 * numpy 1.x holds 32): more is VITC_ERR_FORMAT on load, VITC_ERR_SHAPE on save. */
#define VITC_SAFETENSORS_MAX_NDIM 64
typedef struct vitc_safetensors vitc_safetensors;

VITC_API vitc_status vitc_safetensors_load(const char *path, vitc_safetensors **out);
/* Same, from bytes in memory (copied). */
VITC_API vitc_status vitc_safetensors_load_memory(const void *bytes, size_t len,
                                                  vitc_safetensors **out);
VITC_API void vitc_safetensors_free(vitc_safetensors *st);
VITC_API int vitc_safetensors_count(const vitc_safetensors *st);
/* Tensor i (0 <= i < count), in file order. Pointers stay valid until free. */
VITC_API vitc_status vitc_safetensors_tensor(const vitc_safetensors *st, int i,
                                             const char **name, const char **dtype,
                                             int *ndim, const int64_t **shape,
                                             const float **data);
/* Index of a tensor by name, -1 when absent. */
VITC_API int vitc_safetensors_find(const vitc_safetensors *st, const char *name);
VITC_API int vitc_safetensors_metadata_count(const vitc_safetensors *st);
VITC_API vitc_status vitc_safetensors_metadata(const vitc_safetensors *st, int i,
                                               const char **key, const char **value);
/* Value of a metadata key, NULL when absent. */
VITC_API const char *vitc_safetensors_get_metadata(const vitc_safetensors *st,
                                                   const char *key);

/* Write n float32 tensors (and optional string metadata) as a safetensors
 * file. names[i], ndims[i], shapes[i], data[i] describe tensor i. */
VITC_API vitc_status vitc_safetensors_save(const char *path, int n,
                                           const char *const *names,
                                           const int *ndims,
                                           const int64_t *const *shapes,
                                           const float *const *data, int n_meta,
                                           const char *const *meta_keys,
                                           const char *const *meta_values);

/* ------------------------------------------------------------------ */
/* Files                                                              */
/* ------------------------------------------------------------------ */

/* Every file vitc writes (safetensors, PNG, .npy) replaces its path
 * atomically: a temporary file in the same directory, fsync, rename. On any
 * failure (full disk, EFBIG) the old file is untouched and only the
 * temporary is removed. A path that exists and is not a regular file (device
 * node, FIFO, directory) is refused and left alone. */

/* Write a float32 array as a little-endian .npy file (format 1.0, C order,
 * ndim 0..32). */
VITC_API vitc_status vitc_save_npy(const char *path, const float *data, int ndim,
                                   const int64_t *shape);
/* Write bytes data[0..len) as path, replaced atomically as above: for a
 * caller's own outputs (the CLI's JSON files) with the same guarantees. */
VITC_API vitc_status vitc_save_bytes(const char *path, const void *data, size_t len);
/* Open a file for reading as vitc opens its own inputs: never blocks (a FIFO
 * or device is refused at once), only regular files, at most max_bytes
 * (0: no limit). *size (may be NULL) gets the size. Close with fclose. */
VITC_API vitc_status vitc_open_read(const char *path, int64_t max_bytes, FILE **out,
                                    int64_t *size);

/* ------------------------------------------------------------------ */
/* Attention layers: one engine, the seed blocks as presets           */
/* ------------------------------------------------------------------ */

typedef enum vitc_layer_kind {
    VITC_ATTENTION_BLOCK = 0,       /* AttentionBlock: patch conv + q/k/v/out Linear, [B,C,H,W] -> [B,N,E] */
    VITC_CONV_SA_BLOCK = 1,         /* ConvSABlock: 1x1 conv q,k (C/8), v (C), gamma*attn + x */
    VITC_SELF_ATTENTION_GROUP = 2,  /* SelfAttention(ni), GroupNorm(1, ni), q/k/v/proj, + input */
    VITC_SELF_ATTENTION_BATCH = 3,  /* SelfAttention(ni) with BatchNorm2d and fused qkv */
    VITC_SELF_ATTENTION_MULTIHEAD = 4, /* SelfAttentionMultiHead(ni, nheads) */
    VITC_MULTIHEAD_ATTENTION = 5,   /* torch.nn.MultiheadAttention */
    VITC_T2T_ATTENTION = 6,         /* T2T-ViT Attention(dim, chan, heads), V skip */
    VITC_SINGLE_HEAD_ATTENTION = 7  /* NumPy seed: x @ W_q ... @ W_o */
} vitc_layer_kind;

typedef struct vitc_layer_config {
    vitc_layer_kind kind;
    int in_channels;  /* AttentionBlock in_channels; ConvSA in_channels; SelfAttention* ni;
                         T2T dim; SingleHead embedding_dim; MHA: 0 (embed_dim is used) */
    int embed_dim;    /* AttentionBlock embed_dim; T2T chan; SingleHead d_k; MHA embed_dim */
    int num_heads;    /* heads (AttentionBlock, SelfAttentionMultiHead, MHA, T2T) */
    int patch_size;   /* AttentionBlock */
    int kdim, vdim;   /* MHA (0 = embed_dim) */
    int bias;         /* MHA bias (default 1); T2T qkv_bias (default 0) */
    int batch_first;  /* MHA (default 0: [L, B, E]) */
    float qk_scale;   /* T2T qk_scale; 0 = (chan/heads)^-0.5 */
    float eps;        /* norm eps (default 1e-5) */
    float momentum;   /* BatchNorm momentum (default 0.1) */
    int add_bias_kv;   /* MHA: learned bias_k, bias_v [1, 1, E] appended to the keys/values */
    int add_zero_attn; /* MHA: a zero key and value appended (after bias_k/bias_v) */
    float dropout;     /* MHA: dropout on the attention weights in training mode (0..1) */
} vitc_layer_config;

typedef struct vitc_layer vitc_layer;

/* The defaults of the PyTorch constructor of that kind. */
VITC_API vitc_layer_config vitc_layer_default_config(vitc_layer_kind kind);
/* Fails (VITC_ERR_INVALID_ARG) on an invalid configuration: embed_dim not
 * divisible by heads, ConvSA with fewer than 8 channels, ... Parameters start
 * as vitc_layer_reset_parameters(layer, 0) sets them (load real weights
 * before use). The layer starts in training mode. */
VITC_API vitc_status vitc_layer_create(const vitc_layer_config *cfg, vitc_layer **out);
VITC_API void vitc_layer_free(vitc_layer *layer);
VITC_API const vitc_layer_config *vitc_layer_get_config(const vitc_layer *layer);
/* reset_parameters(): torch's default initialisation, from a deterministic
 * generator (splitmix64) seeded with seed: Linear/Conv2d weights and biases
 * U(-1/sqrt(fan_in), 1/sqrt(fan_in)); MHA in-projection Xavier-uniform, its
 * biases 0; ConvSA gamma 0; norm weight 1, bias 0, running stats 0 and 1;
 * SingleHeadAttention N(0, 1) * 0.1 as its NumPy seed. vitc_layer_create
 * calls it with seed 0. */
VITC_API vitc_status vitc_layer_reset_parameters(vitc_layer *layer, uint64_t seed);

/* Parameters and buffers, in PyTorch's state_dict order, all in one
 * allocation. data points into it and may be written. */
VITC_API int vitc_layer_num_params(const vitc_layer *layer);
VITC_API vitc_status vitc_layer_param(vitc_layer *layer, int i, const char **name,
                                      int *ndim, const int64_t **shape, float **data);

/* load_state_dict: n tensors by PyTorch key name. Missing, unexpected (when
 * strict) or mis-shaped keys are errors that name the key and both shapes.
 * Alias names (diffusers' group_norm/query/key/value/proj_attn) are
 * accepted. num_batches_tracked is ignored. */
VITC_API vitc_status vitc_layer_load(vitc_layer *layer, int n, const char *const *names,
                                     const int *ndims, const int64_t *const *shapes,
                                     const float *const *data, int strict);
/* The same from a safetensors file; prefix (may be NULL) is stripped from
 * the file's names first ("block." for "block.q.weight"). */
VITC_API vitc_status vitc_layer_load_safetensors(vitc_layer *layer,
                                                 const vitc_safetensors *st,
                                                 const char *prefix, int strict);

/* .train() / .eval() */
VITC_API void vitc_layer_set_training(vitc_layer *layer, int training);
VITC_API int vitc_layer_is_training(const vitc_layer *layer);

/* Output shape for an input shape (also validates the input shape). */
VITC_API vitc_status vitc_layer_output_shape(const vitc_layer *layer, int ndim,
                                             const int64_t *shape, int *out_ndim,
                                             int64_t out_shape[8]);
/* Forward of every kind but MHA's cross-attention form (for MHA it is
 * self-attention, query = key = value = x, need_weights false).
 * out must hold the element count of vitc_layer_output_shape. In training
 * mode a BatchNorm layer updates its running statistics. */
VITC_API vitc_status vitc_layer_forward(vitc_layer *layer, const float *x, int ndim,
                                        const int64_t *shape, float *out);

/* Mask element types for MHA and SDPA. */
typedef enum vitc_mask_type {
    VITC_MASK_NONE = 0,
    VITC_MASK_BOOL = 1,   /* uint8_t, 0 or 1 */
    VITC_MASK_FLOAT = 2   /* float, added to the scores */
} vitc_mask_type;

typedef struct vitc_tensor_view {
    const void *data;
    int ndim;
    int64_t shape[8];
} vitc_tensor_view;

/* torch.nn.MultiheadAttention.forward(query, key, value, key_padding_mask,
 * need_weights, attn_mask, average_attn_weights).
 * query [L,B,E] (or [B,L,E] when batch_first, or unbatched [L,E]),
 * key [S,B,kdim], value [S,B,vdim]. key_padding_mask [B,S] (or [S]);
 * its True (bool) means "ignore this key". attn_mask [L,S] or [B*heads,L,S];
 * bool True means "not allowed", float is added. */
typedef struct vitc_mha_args {
    vitc_tensor_view query, key, value;   /* float */
    vitc_tensor_view key_padding_mask;    /* data NULL when absent */
    vitc_mask_type key_padding_mask_type;
    vitc_tensor_view attn_mask;           /* data NULL when absent */
    vitc_mask_type attn_mask_type;
    int need_weights;
    int average_attn_weights;
} vitc_mha_args;

/* Shapes of the outputs: out like query with E channels; weights
 * [B,L,S] averaged or [B,heads,L,S] (unbatched: without B). */
VITC_API vitc_status vitc_mha_output_shapes(const vitc_layer *layer, const vitc_mha_args *a,
                                            int *out_ndim, int64_t out_shape[8],
                                            int *w_ndim, int64_t w_shape[8]);
/* weights may be NULL when need_weights is 0. */
VITC_API vitc_status vitc_mha_forward(vitc_layer *layer, const vitc_mha_args *a,
                                      float *out, float *weights);

/* F.scaled_dot_product_attention (torch 2.x semantics): q [...,L,d],
 * k [...,S,d], v [...,S,dv] with equal leading dims, out [...,L,dv].
 * mask broadcasts to [...,L,S]; a bool mask's True means "takes part", a
 * float mask is added. scale: a finite value > 0 is used as given; 0 (or
 * any value <= 0, since C has no "not given") means torch's default
 * 1/sqrt(d); NaN and +-inf are refused (VITC_ERR_INVALID_ARG). A row with
 * no allowed key gives 0, as torch 2.x's scaled_dot_product_attention does
 * (1.13 gave NaN). */
VITC_API vitc_status vitc_sdpa(const vitc_tensor_view *q, const vitc_tensor_view *k,
                               const vitc_tensor_view *v, const vitc_tensor_view *mask,
                               vitc_mask_type mask_type, float scale, float *out);

/* softmax(x / temperature) along dim (negative counts from the end). */
VITC_API vitc_status vitc_softmax(const float *x, int ndim, const int64_t *shape, int dim,
                                  float temperature, float *out);

/* ---- Training: layer backward ----------------------------------- */

/* Backward of the last training-mode vitc_layer_forward: dy has the
 * forward's output shape (ndim, shape), dx receives the input gradient
 * (the forward's input shape, overwritten), and every parameter's gradient
 * accumulates (+=) into the layer's gradients, as torch's .grad does, until
 * vitc_layer_zero_grad. Errors: no training-mode forward recorded since the
 * last eval-mode or failed one; dy of another shape. MultiheadAttention
 * here is vitc_layer_forward's self-attention: dx = d_query + d_key +
 * d_value (vitc_mha_backward gives the three). Backward does not consume the
 * record: calling it twice accumulates twice. */
VITC_API vitc_status vitc_layer_backward(vitc_layer *layer, const float *dy, int ndim,
                                         const int64_t *shape, float *dx);
/* Sets every gradient to 0 (optimizer.zero_grad(set_to_none=False)). */
VITC_API vitc_status vitc_layer_zero_grad(vitc_layer *layer);
/* The gradient of a parameter by torch key name (or alias), shaped like it:
 * zeros until a backward. Buffers (running_mean, running_var) have none
 * (VITC_ERR_KEY). grad points into the layer and stays valid until it is
 * freed. */
VITC_API vitc_status vitc_layer_grad(vitc_layer *layer, const char *name, int *ndim,
                                     const int64_t **shape, float **grad);

/* Backward of the last training-mode vitc_mha_forward (any masks, kdim,
 * vdim, batch_first, unbatched): d_out has the output's shape; d_query,
 * d_key, d_value receive the gradients of query, key and value (shaped like
 * them, overwritten), and the parameters' gradients accumulate. When query,
 * key and value were one array (self-attention), its gradient is the sum
 * d_query + d_key + d_value: the caller adds them. */
VITC_API vitc_status vitc_mha_backward(vitc_layer *layer, const vitc_tensor_view *d_out,
                                       float *d_query, float *d_key, float *d_value);

/* ---- end of the layer training block ------------------------------ */

/* ---- training: gradients of the functional attention and softmax --- */

/* The gradient of vitc_sdpa's out = softmax(q k^T scale + mask) v for q, k
 * and v, given dout = dL/dout [...,L,dv]: what torch autograd gives through
 * F.scaled_dot_product_attention (same shapes, mask and scale conventions
 * as vitc_sdpa). dq, dk, dv (shaped like q, k, v) are overwritten. The
 * forward is recomputed inside (O(L) extra memory, never L x S). A row
 * with no allowed key (a constant 0 in the forward) gets a zero dq row and
 * adds nothing to dk and dv, as torch 2.x's autograd gives. */
VITC_API vitc_status vitc_sdpa_backward(const vitc_tensor_view *q, const vitc_tensor_view *k,
                                        const vitc_tensor_view *v, const vitc_tensor_view *mask,
                                        vitc_mask_type mask_type, float scale, const float *dout,
                                        float *dq, float *dk, float *dv);

/* What a training step uses: the forward that also writes the
 * log-sum-exp of each query row, lse [..., L] = log sum_j exp(s_ij) (natural
 * log; -inf for a row with no allowed key), and the backward from that
 * forward's out and lse, which then skips vitc_sdpa_backward's recomputed
 * forward (four of its five L x S x d products remain: S = q k^T again, dP,
 * dV, dQ, dK). Same shapes, mask and scale conventions as vitc_sdpa; out and
 * lse must come from vitc_sdpa_lse on the same q, k, v, mask and scale.
 * Bitwise the same gradients as vitc_sdpa_backward. */
VITC_API vitc_status vitc_sdpa_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                                   const vitc_tensor_view *v, const vitc_tensor_view *mask,
                                   vitc_mask_type mask_type, float scale, float *out, float *lse);
VITC_API vitc_status vitc_sdpa_backward_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                                            const vitc_tensor_view *v,
                                            const vitc_tensor_view *mask,
                                            vitc_mask_type mask_type, float scale,
                                            const float *out, const float *lse, const float *dout,
                                            float *dq, float *dk, float *dv);

/* The gradient of y = vitc_softmax(x, dim, temperature) given y and
 * dy = dL/dy (both of shape): dx = y o (dy - sum_dim(dy o y)) / temperature.
 * dx may be dy (in place). */
VITC_API vitc_status vitc_softmax_backward(const float *y, const float *dy, int ndim,
                                           const int64_t *shape, int dim, float temperature,
                                           float *dx);

/* ------------------------------------------------------------------ */
/* Images                                                             */
/* ------------------------------------------------------------------ */

typedef struct vitc_image {
    int width, height;
    uint8_t *rgb; /* [height, width, 3], 8 bits per channel */
} vitc_image;

/* Decode a PNG (gray, RGB, RGBA, 16-bit, palette) or JPEG into 8-bit RGB.
 * Images over max_pixels (0 = 100 megapixels) are refused before any
 * allocation. */
VITC_API vitc_status vitc_image_load(const char *path, int64_t max_pixels, vitc_image *out);
/* The same from bytes in memory (an upload, an archive member); messages
 * name the image "<memory>". The bytes are only read. */
VITC_API vitc_status vitc_image_load_memory(const void *bytes, size_t len, int64_t max_pixels,
                                            vitc_image *out);
/* Flags of the _flags variants (0 is the plain functions' conversion).
 * VITC_IMAGE_ALPHA_WHITE: alpha (RGBA, gray+alpha, tRNS) is composited over
 * opaque white as PIL's Image.alpha_composite computes it, what transformers'
 * image processors do when do_convert_rgb is set; without it alpha is
 * dropped, as Image.convert("RGB"). vitc_vit_image_flags says which a Hub
 * model's processor wants. Unknown bits are an error. */
#define VITC_IMAGE_ALPHA_WHITE 1
VITC_API vitc_status vitc_image_load_flags(const char *path, int64_t max_pixels, int flags,
                                           vitc_image *out);
VITC_API vitc_status vitc_image_load_memory_flags(const void *bytes, size_t len,
                                                  int64_t max_pixels, int flags,
                                                  vitc_image *out);
VITC_API void vitc_image_free(vitc_image *img);
VITC_API vitc_status vitc_image_save_png(const char *path, const uint8_t *rgb, int width,
                                         int height);
/* A 16-bit grayscale PNG of gray [height, width] (host-order values; depth
 * maps, `vitc depth --raw FILE.png`). Written through a temporary file and
 * renamed, as every writer of the library. */
VITC_API vitc_status vitc_image_save_png16(const char *path, const uint16_t *gray, int width,
                                           int height);
/* torchvision preprocessing: resize the shorter side to `resize` with
 * antialiased bilinear (0 = no resize), center crop crop x crop, /255,
 * normalize. out: [3, crop, crop]. Memory: only the crop's window of the
 * resized image is computed; its intermediates are capped at 1 GiB. */
VITC_API vitc_status vitc_image_preprocess(const vitc_image *img, int resize, int crop,
                                           const float mean[3], const float std[3],
                                           float *out);
/* The same for a model of `channels` input channels: 3 is RGB (as above);
 * 1 is luminance as torchvision's Grayscale on the uint8 tensor
 * (0.2989 R + 0.587 G + 0.114 B in float32, truncated), applied before the
 * resize; any other count is an error. mean/std: `channels` values.
 * out: [channels, crop, crop], what vitc_vit_forward reads per image when
 * channels is the model's in_channels. */
VITC_API vitc_status vitc_image_preprocess_channels(const vitc_image *img, int resize, int crop,
                                                    int channels, const float *mean,
                                                    const float *std, float *out);

/* ------------------------------------------------------------------ */
/* Datasets (src/data/dataset.c)                                      */
/* ------------------------------------------------------------------ */

/* Where Debian's dataset-fashion-mnist package puts the IDX files. */
#define VITC_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

typedef struct vitc_dataset vitc_dataset;

/* IDX files as MNIST and Fashion-MNIST ship them (raw, or gzip when built
 * with zlib): images [N, S, S] uint8, labels [N] uint8. Every header field is
 * checked (magic, element type, dimensions, counts, the data's length against
 * the header, nothing after it); the images are kept once, as bytes. Class
 * names are "0", "1", ... (at least 10 classes). */
VITC_API vitc_status vitc_dataset_open_idx(const char *images, const char *labels,
                                           vitc_dataset **out);
/* DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]; dir NULL is
 * VITC_FASHION_MNIST_DIR. fashion_labels: name the classes "T-shirt/top", ... */
VITC_API vitc_status vitc_dataset_open_mnist_dir(const char *dir, int train, int fashion_labels,
                                                 vitc_dataset **out);
/* torchvision's ImageFolder over root/<class>/(sub-folders/)IMAGE.png|jpg|jpeg: classes are
 * the sorted sub-folders (n_classes 0), or the given list (another split of
 * the same classes: a folder not in it is an error, a missing one has no
 * images); files sorted, sub-folders walked. Only the file list is kept:
 * images are decoded when a batch needs them, so a tree larger than memory
 * streams from disk. No class folder, or no image, is an error. */
VITC_API vitc_status vitc_dataset_open_folder(const char *root, int n_classes,
                                              const char *const *classes, vitc_dataset **out);
VITC_API void vitc_dataset_free(vitc_dataset *d);
VITC_API int64_t vitc_dataset_size(const vitc_dataset *d);
VITC_API int vitc_dataset_num_classes(const vitc_dataset *d);
VITC_API const char *vitc_dataset_class_name(const vitc_dataset *d, int i);
/* Label of sample i, -1 when out of range. */
VITC_API int64_t vitc_dataset_label(const vitc_dataset *d, int64_t i);
/* Side of an IDX set's images; 0 for an ImageFolder. */
VITC_API int vitc_dataset_image_side(const vitc_dataset *d);
/* Keep only the first n samples (a subset for quick runs). */
VITC_API vitc_status vitc_dataset_truncate(vitc_dataset *d, int64_t n);
/* ImageFolder images that could not be decoded so far (each counted once):
 * they are skipped, never fatal. */
VITC_API int64_t vitc_dataset_num_skipped(const vitc_dataset *d);
VITC_API const char *vitc_dataset_skipped_path(const vitc_dataset *d, int64_t i);

enum {
    VITC_AUG_CROP = 1,         /* RandomCrop(S, padding=pad), zero fill */
    VITC_AUG_FLIP = 2,         /* RandomHorizontalFlip(0.5) */
    VITC_AUG_RESIZED_CROP = 4  /* RandomResizedCrop(S) (ImageFolder; bilinear) */
};

typedef struct vitc_batch_opts {
    int image_size;          /* S: the model's input side */
    int channels;            /* 1 or 3: gray sets are repeated, RGB made gray (ITU-R 601-2) */
    float mean[3], std[3];   /* Normalize after ToTensor's /255 */
    unsigned augment;        /* VITC_AUG_* bits; 0: the eval transform */
    int pad;                 /* RandomCrop's padding (4) */
    uint64_t seed;           /* the batch's augmentation seed */
    int64_t first;           /* place of idx[0] in the whole batch (0; a data-parallel
                              * rank loading its shard gives its offset, so that sample
                              * k draws the same choices in a shard as in the batch) */
} vitc_batch_opts;

/* No augmentation, mean 0, std 1, pad 4. */
VITC_API vitc_batch_opts vitc_batch_default_opts(int image_size, int channels);
/* Samples idx[0..n) into images [n, C, S, S] and labels [n]. Without
 * augmentation an IDX image is resized (bilinear) to S when it is not S, an
 * ImageFolder image has its shorter side resized to S (antialiased) and is
 * center-cropped. Sample k's random choices come from (seed, first + k) alone.
 * Unreadable images are skipped: the valid samples come first, their count
 * in *n_valid. */
VITC_API vitc_status vitc_dataset_load_batch(vitc_dataset *d, const int64_t *idx, int n,
                                             const vitc_batch_opts *o, float *images,
                                             int64_t *labels, int *n_valid);

/* ------------------------------------------------------------------ */
/* Training: loss, optimizers, gradient clipping, LR schedules        */
/* (src/train/loss.c, optim.c, lr.c)                                  */
/* ------------------------------------------------------------------ */

/* F.cross_entropy(logits, labels, label_smoothing=eps), mean reduction:
 *   loss = mean_b [ (1 - eps) * (-log p[b, y_b]) + eps * mean_c (-log p[b, c]) ]
 * with p = softmax(logits[b]). logits [B, C]; labels [B] class indices
 * (int64, like torch's long targets), each in [0, C); eps in [0, 1].
 * dlogits [B, C] (may be NULL) receives d loss / d logits =
 * (p - (1 - eps) * onehot(y) - eps / C) / B. Computed in double per row
 * (log-sum-exp about the row max), so logits in the thousands are fine. */
VITC_API vitc_status vitc_cross_entropy(const float *logits, const int64_t *labels, int64_t B,
                                        int64_t C, float label_smoothing, float *loss,
                                        float *dlogits);

typedef enum vitc_optim_kind {
    VITC_OPTIM_SGD = 0,   /* torch.optim.SGD */
    VITC_OPTIM_ADAMW = 1  /* torch.optim.AdamW */
} vitc_optim_kind;

typedef struct vitc_optim_config {
    vitc_optim_kind kind;
    /* double, as torch's Python floats: the update uses them unrounded. */
    double lr;
    double weight_decay;
    /* AdamW */
    double beta1, beta2, eps;
    int amsgrad;
    /* SGD */
    double momentum, dampening;
    int nesterov;
    /* 0 (default): weight decay skips biases, norm weights, the class token
     * and the position embedding (the no-decay group of timm / the ViT
     * paper); 1: every tensor decays, as torch.optim over model.parameters(). */
    int decay_all;
} vitc_optim_config;

typedef struct vitc_optimizer vitc_optimizer;
typedef struct vitc_vit vitc_vit; /* (C11 allows the repeated typedef) */

/* torch's defaults: AdamW lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
 * decay 1e-2; SGD lr 1e-3, no momentum, dampening or weight decay. */
VITC_API vitc_optim_config vitc_optim_default_config(vitc_optim_kind kind);
/* An optimizer over every parameter of a model or layer; allocates the
 * model's gradients (zeroed) if it has none yet. The optimizer must be
 * freed by the caller; once its model is freed every call on it fails
 * (VITC_ERR_INVALID_ARG) instead of touching freed memory. */
VITC_API vitc_status vitc_optimizer_create_vit(vitc_vit *m, const vitc_optim_config *cfg,
                                               vitc_optimizer **out);
VITC_API vitc_status vitc_optimizer_create_layer(vitc_layer *l, const vitc_optim_config *cfg,
                                                 vitc_optimizer **out);
VITC_API void vitc_optimizer_free(vitc_optimizer *o);
/* One update from the accumulated gradients, exactly as torch's step():
 * AdamW: step += 1; p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *        p -= lr/(1-b1^step) * m / (sqrt(v)/sqrt(1-b2^step) + eps)
 *        (amsgrad: vmax = max(vmax, v) replaces v in the denominator).
 * SGD:   d = g + wd*p; buf = d on the first step, else momentum*buf +
 *        (1-dampening)*d; d = nesterov ? d + momentum*buf : buf (when
 *        momentum != 0); p -= lr*d. */
VITC_API vitc_status vitc_optimizer_step(vitc_optimizer *o);
/* Sets every gradient to 0 (gradients accumulate until then, as in torch). */
VITC_API vitc_status vitc_optimizer_zero_grad(vitc_optimizer *o);
VITC_API vitc_status vitc_optimizer_set_lr(vitc_optimizer *o, double lr);
VITC_API double vitc_optimizer_get_lr(const vitc_optimizer *o);
/* SGD's momentum or AdamW's beta1 (what OneCycleLR cycles). */
VITC_API vitc_status vitc_optimizer_set_momentum(vitc_optimizer *o, double momentum);
VITC_API double vitc_optimizer_get_momentum(const vitc_optimizer *o);
VITC_API const vitc_optim_config *vitc_optimizer_get_config(const vitc_optimizer *o);
/* Optimizer state for checkpoints. The state arrays have the layout of the
 * flat parameter array (num_params floats, tensors at their offsets), under
 * torch's state names: AdamW "exp_avg", "exp_avg_sq" (+ "max_exp_avg_sq"
 * with amsgrad), SGD with momentum "momentum_buffer". data points into the
 * optimizer and may be written (restore = copy in, then set the step).
 * step counts the updates done. SGD's momentum buffer starts as the first
 * momentum step's direction (torch creates it then); set_step(n > 0) marks
 * a restored buffer as started, set_step(0) as not. */
VITC_API size_t vitc_optimizer_num_params(const vitc_optimizer *o);
VITC_API int vitc_optimizer_num_states(const vitc_optimizer *o);
VITC_API vitc_status vitc_optimizer_state(vitc_optimizer *o, int i, const char **name,
                                          float **data);
VITC_API int64_t vitc_optimizer_get_step(const vitc_optimizer *o);
VITC_API vitc_status vitc_optimizer_set_step(vitc_optimizer *o, int64_t step);
/* torch.nn.utils.clip_grad_norm_(params, max_norm): total = the L2 norm of
 * all gradients together (accumulated in double); every gradient is scaled
 * by min(1, max_norm / (total + 1e-6)). total_norm (may be NULL) receives
 * the norm before clipping. */
VITC_API vitc_status vitc_clip_grad_norm_optimizer(vitc_optimizer *o, float max_norm,
                                                   float *total_norm);
VITC_API vitc_status vitc_clip_grad_norm_vit(vitc_vit *m, float max_norm, float *total_norm);
VITC_API vitc_status vitc_clip_grad_norm_layer(vitc_layer *l, float max_norm,
                                               float *total_norm);

/* Linear warmup, then cosine to min_lr, for step s = 0, 1, ...:
 *   s < W:       lr = base_lr * (s + 1) / W
 *   W <= s < T:  lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * (s - W) / (T - W))) / 2
 *   s >= T:      lr = min_lr
 * (W = warmup_steps >= 0, T = total_steps > W). The same numbers as torch's
 * SequentialLR([LinearLR(start_factor=1/W, total_iters=W-1),
 * CosineAnnealingLR(T_max=T-W, eta_min=min_lr)], milestones=[W]). */
VITC_API vitc_status vitc_lr_warmup_cosine(int64_t step, int64_t warmup_steps,
                                           int64_t total_steps, double base_lr, double min_lr,
                                           double *lr);

typedef struct vitc_onecycle_config {
    double max_lr;
    int64_t total_steps;
    double pct_start;          /* 0.3 */
    int anneal_linear;         /* 0: 'cos' (default), 1: 'linear' */
    double div_factor;         /* 25: initial_lr = max_lr / div_factor */
    double final_div_factor;   /* 1e4: min_lr = initial_lr / final_div_factor */
    int three_phase;           /* 0 */
    int cycle_momentum;        /* 1 */
    double base_momentum;      /* 0.85 */
    double max_momentum;       /* 0.95 */
} vitc_onecycle_config;

/* torch.optim.lr_scheduler.OneCycleLR's defaults for max_lr and total_steps. */
VITC_API vitc_onecycle_config vitc_onecycle_default_config(double max_lr, int64_t total_steps);
/* OneCycleLR's lr (and momentum, when cycle_momentum; else *momentum is
 * left alone) at step 0 <= step <= total_steps, torch's get_lr() exactly. */
VITC_API vitc_status vitc_lr_onecycle(const vitc_onecycle_config *c, int64_t step, double *lr,
                                      double *momentum);
/* Per-tensor learning rates: tensor i (the model's parameter i, state_dict
 * order) is updated with lr * scale_i, weight decay included (as a torch
 * param group of that lr). Every scale starts at 1. set_layer_decay(F)
 * sets BEiT's / timm's layer-wise decay for a model of depth L: block l
 * (0-based) gets F^(L - l), what precedes the first block (patch and
 * position embeddings, class token, a pre-norm) F^(L + 1), the final norm
 * and the head 1; F = 1 restores 1 everywhere. F in (0, 1]. A layer's
 * optimizer (no blocks) keeps 1. A scale of 0 freezes the tensor: neither
 * it nor its optimizer state changes (torch's requires_grad=False). */
VITC_API vitc_status vitc_optimizer_set_layer_decay(vitc_optimizer *o, double decay);
VITC_API vitc_status vitc_optimizer_set_lr_scale(vitc_optimizer *o, int i, double scale);
/* Tensor i's scale, NAN for a bad index or optimizer. */
VITC_API double vitc_optimizer_get_lr_scale(const vitc_optimizer *o, int i);
/* ---- end training: loss, optimizers, schedules ---------------------- */

/* ------------------------------------------------------------------ */
/* Vision Transformer                                                 */
/* ------------------------------------------------------------------ */

typedef struct vitc_vit_config {
    int image_size, patch_size, in_channels;
    int hidden_dim, depth, num_heads, mlp_dim, num_classes;
    float norm_eps;
    float mean[3], std[3];
} vitc_vit_config;

typedef struct vitc_vit vitc_vit;

/* Load a torchvision- or timm-named checkpoint. The architecture comes from
 * __metadata__["vitc.config"], else arch (e.g. "vit_b_16"), else from the
 * tensors' names and shapes. */
VITC_API vitc_status vitc_vit_load(const char *path, const char *arch, vitc_vit **out);

/* The arithmetic of the forward's weight GEMMs (qkv, out_proj, fc1, fc2
 * and the patch embedding's). LayerNorm, softmax, GELU, residuals
 * and the head stay fp32 in every precision; attention's two products
 * follow vitc_vit_set_attention_precision (by default bf16 under BF16 and
 * int8 under INT8 weights, where the CPU runs them faster).
 *   FP32: weights packed once into the GEMM microkernel's panels.
 *   BF16: weights rounded once to bfloat16 (nearest even), activations per
 *         call; products summed in fp32 (vdpbf16ps, or a portable reference
 *         giving the same numbers).
 *   INT8: weights int8, symmetric per output channel; activations uint8 with
 *         a scale and zero point per row (token), int32 sums (vpdpbusd, or
 *         the reference); dequantized in fp32. */
typedef enum vitc_precision {
    VITC_PRECISION_FP32 = 0,
    VITC_PRECISION_BF16 = 1,
    VITC_PRECISION_INT8 = 2
} vitc_precision;

/* vitc_vit_load, then vitc_vit_set_precision(precision), with the same
 * numbers bit for bit, but the weights are packed while the file is read:
 * each Linear weight is converted as soon as its tensor is read and its
 * fp32 pages given back, so the peak resident memory while loading is
 * about the converted model plus one fp32 matrix (in bf16 / int8 well
 * below an fp32 load's), not the fp32 model's. Safetensors files (F32, F16,
 * BF16 tensors) and Hub models as vitc_vit_load takes them. FP32 packs into
 * the GEMM's fp32 panels, which unpack exactly (a training forward,
 * vitc_vit_param and vitc_vit_save see the file's weights bit for bit).
 * A training checkpoint (vitc.* state) and T2T-ViT are read whole first.
 * An unknown precision: VITC_ERR_INVALID_ARG. A CPU without the bf16 /
 * int8 instructions loads as well (the portable reference path). */
VITC_API vitc_status vitc_vit_load_precision(const char *path, const char *arch,
                                             vitc_precision precision, vitc_vit **out);
VITC_API vitc_status vitc_vit_from_safetensors(const vitc_safetensors *st, const char *arch,
                                               vitc_vit **out);
VITC_API void vitc_vit_free(vitc_vit *m);
VITC_API const vitc_vit_config *vitc_vit_get_config(const vitc_vit *m);
/* Name of the architecture recognised ("vit_b_16", ..., or "custom"). */
VITC_API const char *vitc_vit_arch_name(const vitc_vit *m);
/* Class labels from metadata; NULL when there are none. */
VITC_API const char *vitc_vit_label(const vitc_vit *m, int index);
/* images [B, C, H, W] (normalized) -> logits [B, num_classes]. H and W may
 * differ from image_size (position embeddings are interpolated). */
VITC_API vitc_status vitc_vit_forward(vitc_vit *m, const float *images, int B, int H, int W,
                                      float *logits);
/* Per-layer attention probabilities attn [depth, B, heads, N, N] (may be
 * NULL) and the attention rollout [B, N, N] (may be NULL); N = prefix tokens (1: the
 * class token; DeiT 2, DINOv2 registers 1 + R, SigLIP 0) + patches. */
VITC_API vitc_status vitc_vit_attention_maps(vitc_vit *m, const float *images, int B, int H,
                                             int W, float *attn, float *rollout);

/* ---- Hugging Face Hub models and embeddings ------------------------ */

/* vitc_vit_load also takes a Hub model: a directory with config.json and
 * model.safetensors (or a sharded model.safetensors.index.json), or one of
 * those files with config.json beside it. model_type vit, deit, dinov2,
 * dinov2_with_registers, clip, clip_vision_model, siglip and
 * siglip_vision_model are read (docs/hub.md); the backbone prefix (vit.,
 * deit., dinov2., vision_model.) may be present or absent. Tensors the forward does not use (pooler, position_ids, ...)
 * are skipped and listed by vitc_vit_ignored. */
typedef enum vitc_pool {
    VITC_POOL_DEFAULT = 0, /* the family's own pooled output (ViT/DeiT: CLS after the final LN) */
    VITC_POOL_CLS = 1,     /* the class token after the final LayerNorm */
    VITC_POOL_MEAN = 2,    /* the mean of the patch tokens after the final LayerNorm */
    VITC_POOL_TOKENS = 3   /* the patch tokens after the final LayerNorm, [P, C] per image */
} vitc_pool;
/* "torchvision", "timm", "hf-vit", "hf-deit", "hf-dinov2", "hf-clip", "hf-siglip". */
VITC_API const char *vitc_vit_family(const vitc_vit *m);
/* 0 for a backbone (vitc_vit_forward then fails; use vitc_vit_embed). */
VITC_API int vitc_vit_has_head(const vitc_vit *m);
/* A fresh classification head of num_classes outputs for fine-tuning, in
 * the family's own classifier layout: torchvision heads.head (zeros, as
 * VisionTransformer's init), timm head (nn.Linear's default init, as
 * reset_classifier), HF ViT classifier on the final-normed class token
 * (ViTModel -> ViTForImageClassification), HF DeiT's class head (both
 * heads for the with-teacher model), DINOv2's classifier over [CLS, mean
 * of the patch tokens] (Dinov2ForImageClassification), T2T-ViT head
 * (trunc_normal_ 0.02); HF weights normal_(0, 0.02), biases zero. CLIP and
 * SigLIP towers keep their embedding head (projection, MAP) and get a
 * linear classifier over the embedding (classifier.weight [K, E]; logits =
 * classifier(vitc_vit_embed's default embedding), trained end to end). labels:
 * num_classes names or NULL; seed draws the init. Every other weight is
 * kept; the model's gradients and packed weights are dropped, and the
 * parameters move: reset before making an optimizer or a paramset. */
VITC_API vitc_status vitc_vit_reset_head(vitc_vit *m, int num_classes, const char *const *labels,
                                         uint64_t seed);
/* Tokens before the patches: 1 (class) or 2 (DeiT's class + distillation). */
VITC_API int vitc_vit_num_prefix_tokens(const vitc_vit *m);
/* Checkpoint tensors skipped as unused by the forward. */
VITC_API int vitc_vit_num_ignored(const vitc_vit *m);
VITC_API const char *vitc_vit_ignored(const vitc_vit *m, int i);
/* Floats per image of the model's primary output: the logits (num_classes)
 * of a classifier (vitc_vit_has_head), else the default embedding
 * (vitc_vit_embed_size with VITC_POOL_DEFAULT: CLIP's image_embeds,
 * SigLIP's pooler output, a backbone's class token after the final norm or
 * its mean of the normed patch tokens). */
VITC_API vitc_status vitc_vit_output_size(const vitc_vit *m, int H, int W, int64_t *floats);
/* images [B, C, H, W] (normalized) -> out [B, vitc_vit_output_size]: the
 * primary output. In training mode (vitc_vit_set_training) the forward is
 * recorded for vitc_vit_backward, whose dout is then the gradient of out. */
VITC_API vitc_status vitc_vit_run(vitc_vit *m, const float *images, int B, int H, int W,
                                  float *out);
/* Floats per image that vitc_vit_embed writes for images of H x W. */
VITC_API vitc_status vitc_vit_embed_size(const vitc_vit *m, vitc_pool pool, int H, int W,
                                         int64_t *floats);
/* images [B, C, H, W] (normalized) -> out [B, embed_size] (not L2-normalized). */
VITC_API vitc_status vitc_vit_embed(vitc_vit *m, const float *images, int B, int H, int W,
                                    vitc_pool pool, float *out);
/* Every token after the final LayerNorm (HF's last_hidden_state):
 * out [B, prefix + patches, hidden_dim]. */
VITC_API vitc_status vitc_vit_forward_features(vitc_vit *m, const float *images, int B, int H,
                                               int W, float *out);

/* ---- sessions: several threads on one model ------------------------ */

/* The run state of inference forwards on one model: activations, scratch,
 * the position embedding resampled for the last image size. The model is
 * only read, so sessions of one model may run in different threads at
 * once, with the same numbers bit for bit as the model API. A session is
 * inference only (eval mode, whatever vitc_vit_set_training says; a model
 * in training mode runs its fp32 row-major weights, as a training forward
 * does): training, recording and vitc_vit_backward stay on the model API.
 * The model's weights must be packed for its precision, as loading,
 * vitc_vit_set_precision, vitc_vit_set_training(m, 0), vitc_vit_prepare and
 * every vitc_vit_* forward leave them; after the parameters changed
 * (vitc_vit_param, an optimizer step, vitc_vit_save in bf16 / int8) a
 * session forward fails (VITC_ERR_INVALID_ARG) until vitc_vit_prepare,
 * except an fp32 model whose row-major weights are resident (the same
 * numbers, without the packed panels). Free a model's sessions before it
 * (a later call on one is refused). */
typedef struct vitc_session vitc_session;
VITC_API vitc_status vitc_session_create(const vitc_vit *m, vitc_session **out);
VITC_API void vitc_session_free(vitc_session *s);
/* vitc_vit_run, vitc_vit_forward, vitc_vit_embed, vitc_vit_forward_features
 * and vitc_vit_attention_maps on s's model. */
VITC_API vitc_status vitc_session_run(vitc_session *s, const float *images, int B, int H, int W,
                                      float *out);
VITC_API vitc_status vitc_session_forward(vitc_session *s, const float *images, int B, int H,
                                          int W, float *logits);
VITC_API vitc_status vitc_session_embed(vitc_session *s, const float *images, int B, int H, int W,
                                        vitc_pool pool, float *out);
VITC_API vitc_status vitc_session_forward_features(vitc_session *s, const float *images, int B,
                                                   int H, int W, float *out);
VITC_API vitc_status vitc_session_attention_maps(vitc_session *s, const float *images, int B,
                                                 int H, int W, float *attn, float *rollout);
/* Packs m's weights for its precision now if they are stale (what every
 * vitc_vit_* forward does first): call it after changing the weights and
 * before running sessions again. is_prepared: 1 when the packs are current
 * (0: a session forward fails, or in fp32 runs the slower row-major path). */
VITC_API vitc_status vitc_vit_prepare(vitc_vit *m);
VITC_API int vitc_vit_is_prepared(const vitc_vit *m);

/* A Hub model's image processor (preprocessor_config.json over the family's
 * defaults), as transformers' slow PIL path computes it: resize (PIL's
 * bilinear/bicubic in uint8), center crop (floor offsets; zero padding where
 * the crop is larger), rescale, normalize. 0 / an error for other models.
 * preprocess_size: the output [H, W] for a width x height image; preprocess:
 * out [in_channels, H, W] (a 1-channel model: the image's luminance, as
 * PIL's convert("L"), with the first mean and std). image_flags: the vitc_image_load_flags flags that decode an
 * image as the processor converts it to RGB (VITC_IMAGE_ALPHA_WHITE where it
 * has do_convert_rgb: CLIP, SigLIP, DINOv2's BiT by default), 0 otherwise. */
VITC_API int vitc_vit_has_processor(const vitc_vit *m);
VITC_API int vitc_vit_image_flags(const vitc_vit *m);
VITC_API vitc_status vitc_vit_preprocess_size(const vitc_vit *m, int width, int height, int *H,
                                              int *W);
VITC_API vitc_status vitc_vit_preprocess(const vitc_vit *m, const vitc_image *img, float *out);

/* ---- inference precision (issue 11) ------------------------------ */

/* vitc_precision: with vitc_vit_load_precision above. */

/* Chooses m's precision and packs its weights for it now. An inference
 * forward (eval mode) reads only the packed weights: the row-major copies
 * of the packed matrices are given back to the OS, so a model holds one
 * copy of each weight (fp32 panels, or 2x / 4x smaller in bf16 / int8).
 * Anything that needs the row-major parameters (vitc_vit_param, an
 * optimizer, a training forward, vitc_vit_save) unpacks them first:
 * exactly in fp32; in bf16 / int8 they are then the converted values (the
 * fp32 originals are gone, as after any quantization). Packing happens
 * again at the next vitc_vit_* inference forward after that, or at
 * vitc_vit_prepare (sessions never pack). docs/precision.md. */
VITC_API vitc_status vitc_vit_set_precision(vitc_vit *m, vitc_precision p);
VITC_API vitc_precision vitc_vit_get_precision(const vitc_vit *m);
/* The arithmetic of the attention's two products, q k^T and P v, in an
 * inference forward: FP32; BF16 (q, k, P and v rounded to bfloat16,
 * nearest even, with fp32 sums: vdpbf16ps, or the portable reference giving
 * the same numbers); or INT8 (q and P quantized per row to u8, as the int8
 * GEMM's activations; k per key and v per channel to s8, symmetric; int32
 * sums: vpdpbusd, or the reference); the mask and the softmax stay fp32.
 * Until set, it follows the weights' precision (the default): FP32 with
 * FP32 weights, BF16 with BF16 weights, INT8 with INT8 weights, on CPUs
 * where that is faster (AMD's AVX-512 cores; Intel's run the vector bf16
 * dot at half their fp32 rate: FP32 there); _auto returns to that default.
 * The getter says which one a forward runs now. Training forwards always
 * run fp32 attention. */
VITC_API vitc_status vitc_vit_set_attention_precision(vitc_vit *m, vitc_precision p);
VITC_API vitc_status vitc_vit_set_attention_precision_auto(vitc_vit *m);
VITC_API vitc_precision vitc_vit_get_attention_precision(const vitc_vit *m);
/* "fp32", "bf16", "int8" (NULL for other values) and back (-1 if unknown). */
VITC_API const char *vitc_precision_name(vitc_precision p);
VITC_API int vitc_precision_parse(const char *name);
/* Which kernel each low-precision GEMM runs on this CPU and kernel path,
 * e.g. "bf16: avx512-bf16 (vdpbf16ps), int8: avx512-vnni (vpdpbusd)",
 * "bf16: amx-bf16 (tdpbf16ps), ..." or "... reference", then notes: a
 * VITC_LP_KERNEL in force, or why AMX is not used. Valid until this
 * thread's next call. */
VITC_API const char *vitc_get_precision_paths(void);

/* ---- ViT training ------------------------------------------------ */

/* A new model of cfg with torchvision's VisionTransformer.__init__
 * initialisation drawn from seed; its norm_eps/mean/std are taken as given
 * (vitc_vit_default_config fills torchvision's). */
VITC_API vitc_vit_config vitc_vit_default_config(void);
VITC_API vitc_status vitc_vit_create(const vitc_vit_config *cfg, uint64_t seed, vitc_vit **out);
/* In training mode vitc_vit_forward and vitc_vit_run record what
 * vitc_vit_backward needs (and apply dropout / drop path); eval mode (the
 * default) records nothing. Leaving training mode packs the weights for the
 * model's precision (vitc_vit_prepare). */
VITC_API void vitc_vit_set_training(vitc_vit *m, int training);
VITC_API int vitc_vit_is_training(const vitc_vit *m);
/* Training-mode regularisation, all in [0, 1): torchvision's dropout (after
 * the embedding, the attention branch, the GELU and fc2), attention_dropout
 * (nn.MultiheadAttention's, on the probabilities: those blocks then keep
 * [B, heads, N, N] and run attention unfused), and
 * timm's drop path whose per-block rate rises linearly from 0 at the first
 * block to drop_path at the last. Masks come from the model's generator
 * (seeded by vitc_vit_create's seed). */
VITC_API vitc_status vitc_vit_set_dropout(vitc_vit *m, float dropout, float attention_dropout,
                                          float drop_path);
/* Gradients of the last training forward for dlogits: the gradient of what
 * it returned (vitc_vit_forward's logits, or vitc_vit_run's primary output,
 * [B, vitc_vit_output_size]), accumulated (+=) into the gradients, as torch
 * does. Every family's block and head (activations, SwiGLU, layer scale,
 * prefix tokens, CLIP's pre-norm and projection, SigLIP's attention-pooling
 * head, DINOv2's and DeiT's heads, resampled positions, T2T-ViT's
 * token-transformer stages); VITC_ERR_UNSUPPORTED for T2T-ViT's
 * Token_performer stages, which run forward only. */
VITC_API vitc_status vitc_vit_backward(vitc_vit *m, const float *dlogits);
VITC_API vitc_status vitc_vit_zero_grad(vitc_vit *m);
/* Parameter i (state_dict order): torch name, shape, data, and its gradient
 * (NULL until a backward or zero_grad allocated the gradients). data is the
 * row-major parameter until the next inference forward, which repacks the
 * weights from it (and releases the matrices' pages): ask again after one. */
VITC_API int vitc_vit_num_params(const vitc_vit *m);
VITC_API vitc_status vitc_vit_param(vitc_vit *m, int i, const char **name, int *ndim,
                                    const int64_t **shape, float **data, float **grad);
/* Index of the parameter called name, or -1. */
VITC_API int vitc_vit_find_param(const vitc_vit *m, const char *name);
/* Save as safetensors under the model's names with vitc.config metadata
 * (and, for a Hub family's model, vitc.family: its options and image
 * processor), which vitc_vit_load reads back as the same model. */
VITC_API vitc_status vitc_vit_save(const vitc_vit *m, const char *path);
/* ---- end ViT training ---------------------------------------------- */

/* ---- training checkpoints (src/train/checkpoint.c) ------------------ */
/* A checkpoint is a model file every vitc command loads (the model's
 * tensors and metadata, as vitc_vit_save writes them) plus, when opt is
 * given, the optimizer's state as "vitc.optim.<state>" tensors (flat: the
 * tensors in state_dict order, each at a multiple of 16 floats, whatever
 * the model's layout in memory) and meta_json
 * (a JSON object, may be NULL: the caller's run record: epoch, step,
 * hyperparameters) as "vitc.train" metadata with "optimizer_step" added.
 * Without opt it is a model alone and meta_json goes to "vitc.trained_by".
 * labels (may be NULL: the model's own) are num_classes class names. The
 * file is replaced atomically (temporary file, fsync, rename): a failed or
 * interrupted save leaves the previous file whole. `vitc train` writes and
 * resumes this format. */
VITC_API vitc_status vitc_checkpoint_save(const char *path, vitc_vit *m, vitc_optimizer *opt,
                                          const char *const *labels, const char *meta_json);
/* The model of a checkpoint and (meta_json may be NULL) its vitc.train
 * record, to free with vitc_checkpoint_free_meta. A file without vitc.train
 * (a model alone) is VITC_ERR_FORMAT: load it with vitc_vit_load. */
VITC_API vitc_status vitc_checkpoint_load(const char *path, vitc_vit **m, char **meta_json);
/* Copies the checkpoint's optimizer state and step into opt, an optimizer
 * of the same kind over the model vitc_checkpoint_load returned (or one of
 * its shape); nothing is changed when the file does not fit it. */
VITC_API vitc_status vitc_checkpoint_load_optimizer(const char *path, vitc_optimizer *opt);
VITC_API void vitc_checkpoint_free_meta(char *meta_json);

/* ---- text towers and tokenizers (src/text/, src/models/text.c) ------ */
/* The tokenizer of a CLIP or SigLIP checkpoint, exactly as its own code
 * tokenizes (docs/text.md): CLIP's byte-level BPE (a Hub directory's
 * tokenizer.json, or vocab.json + merges.txt, or open_clip's
 * bpe_simple_vocab_16e6.txt.gz) and SentencePiece Unigram (SigLIP:
 * tokenizer.json or spiece.model). The text cleaning is the one of the
 * source the files come from: transformers' fast tokenizer (NFC,
 * whitespace, lower case), OpenAI / open_clip (ftfy's fixes, HTML
 * unescape, whitespace, lower case), SigLIP (lower case, punctuation
 * removed). path: such a file or a directory holding them. A tokenizer is
 * read-only after loading: any number of threads may encode with it. */
typedef struct vitc_tokenizer vitc_tokenizer;
VITC_API vitc_status vitc_tokenizer_load(const char *path, vitc_tokenizer **out);
VITC_API void vitc_tokenizer_free(vitc_tokenizer *t);
/* The ids the model sees for text (UTF-8, len bytes, or -1: up to the
 * NUL): start / end tokens added, truncated to context keeping the end
 * token, then padded to context as the checkpoint pads (CLIP: transformers'
 * pad id or open_clip's 0; SigLIP: its pad id, which the model reads).
 * ids [context]; *n (may be NULL) the ids before padding. context <= 0:
 * the tokenizer's own (77 for CLIP). Invalid UTF-8 is an error naming the
 * byte offset (VITC_ERR_INVALID_ARG). */
VITC_API vitc_status vitc_tokenizer_encode(const vitc_tokenizer *t, const char *text, int64_t len,
                                           int32_t *ids, int context, int *n);
/* The context length ids are padded to, the vocabulary's size, and the
 * kind: "clip-bpe" or "sentencepiece-unigram". */
VITC_API int vitc_tokenizer_context(const vitc_tokenizer *t);
VITC_API int vitc_tokenizer_vocab_size(const vitc_tokenizer *t);
VITC_API const char *vitc_tokenizer_kind(const vitc_tokenizer *t);

/* A model loaded from a Hub directory with both towers (CLIPModel,
 * SiglipModel) or an open_clip checkpoint has a text tower: has_text 1.
 * text_dim: the width of the projected text features (= the image
 * embedding's); text_context: the positions the tower has (77 / 64). */
VITC_API int vitc_vit_has_text(const vitc_vit *m);
VITC_API int vitc_vit_text_dim(const vitc_vit *m);
VITC_API int vitc_vit_text_context(const vitc_vit *m);
/* The checkpoint's tokenizer (read from the model's directory at load), or
 * NULL when it has none (then vitc_vit_encode_text fails saying which files
 * to add). A tokenizer file there that does not load does not fail the
 * model's load: the tokenizer is NULL and vitc_vit_encode_text reports that
 * file's error (token ids and images still work). Owned by the model. */
VITC_API const vitc_tokenizer *vitc_vit_tokenizer(const vitc_vit *m);
/* exp(logit_scale) and logit_bias (0 and *has_bias 0 for CLIP): the
 * zero-shot logits are scale * cos(image, text) + bias. */
VITC_API vitc_status vitc_vit_logit_params(const vitc_vit *m, float *scale, float *bias,
                                           int *has_bias);
/* The projected text features of B token sequences ids [B, L] (L <= the
 * tower's context), as transformers' get_text_features: CLIP pools at the
 * first end-of-text id (open_clip's layout and transformers' legacy
 * eos_token_id 2: at the largest id), SigLIP at the last position (pad as
 * the tokenizer does: SigLIP reads its padding). out [B, text_dim], not
 * normalised. B <= 0, L outside [1, context] or an id outside the
 * vocabulary: VITC_ERR_INVALID_ARG naming it. docs/text-towers.md. */
VITC_API vitc_status vitc_vit_encode_text_ids(vitc_vit *m, const int32_t *ids, int B, int L,
                                              float *out);
/* The same from B strings, tokenized with the model's tokenizer. */
VITC_API vitc_status vitc_vit_encode_text(vitc_vit *m, const char *const *texts, int B,
                                          float *out);
/* On a session (threads sharing one model, as vitc_session_embed). */
VITC_API vitc_status vitc_session_encode_text_ids(vitc_session *s, const int32_t *ids, int B,
                                                  int L, float *out);

/* ---- zero-shot classification (src/text/zeroshot.c, docs/zero-shot.md) */
/* A prompt template set by name: "imagenet80" (OpenAI's 80 ImageNet
 * prompts, open_clip's OPENAI_IMAGENET_TEMPLATES) or "simple" (its 7
 * SIMPLE_IMAGENET_TEMPLATES); each holds "{}" where the label goes. The
 * static array and *n (may be NULL), or NULL and 0 for another name. */
VITC_API const char *const *vitc_zero_shot_templates(const char *name, int *n);
/* Class embeddings from prompt embeddings (the OpenAI / open_clip recipe,
 * which big_vision follows for SigLIP too): text [K * T, D], class k's T
 * prompts at rows k*T .. k*T + T-1 (as get_text_features returns them) ->
 * classes [K, D]: each prompt L2-normalised, their mean over the T,
 * normalised again. */
VITC_API vitc_status vitc_zero_shot_classes(const float *text, int64_t K, int64_t T, int64_t D,
                                            float *classes);
/* Probabilities: images [B, D] (image embeddings as vitc_vit_embed returns
 * them; normalised here) against classes [K, D] (vitc_zero_shot_classes)
 * -> probs [B, K], with scale = exp(logit_scale) and bias as
 * vitc_vit_logit_params gives them. sigmoid 0 (CLIP): softmax over the K of
 * scale * cos; sigmoid 1 (SigLIP, has_bias): sigmoid(scale * cos + bias)
 * for each label on its own. Dot products and the softmax in double. */
VITC_API vitc_status vitc_zero_shot_probs(const float *images, int64_t B, const float *classes,
                                          int64_t K, int64_t D, float scale, float bias,
                                          int sigmoid, float *probs);

/* ------------------------------------------------------------------ */
/* Segment Anything (src/models/sam*.c, docs/segment.md)               */
/* ------------------------------------------------------------------ */

/* A loaded SAM: image encoder, prompt encoder and mask decoder, from a
 * transformers SamModel directory (config.json + model.safetensors) or a
 * .safetensors converted from the original sam_vit_*.pth. Read-only after
 * loading: threads may share one (each call has its own scratch). */
typedef struct vitc_sam vitc_sam;
/* One image's embedding (the encoder's output, [256, 64, 64] for the
 * released models) and its sizes: computed once, reused for any number of
 * prompts (segment-anything's predictor.set_image). */
typedef struct vitc_sam_image vitc_sam_image;

VITC_API vitc_status vitc_sam_load(const char *path, vitc_sam **out);
/* vitc_sam_load with the image encoder's weight GEMMs (the blocks' qkv,
 * proj, lin1, lin2 and the neck's two convolutions) in precision "fp32",
 * "bf16" or "int8" (NULL: fp32), as vitc_vit_set_precision describes them;
 * the patch embedding, LayerNorms, attention with its relative positions
 * and the prompt encoder / mask decoder stay fp32. Each weight is held
 * once, packed (bf16 half the bytes of fp32, int8 a quarter). An unknown
 * precision: VITC_ERR_INVALID_ARG; an int8 weight holding NaN or an
 * infinity: VITC_ERR_INVALID_ARG, named. A CPU without the bf16 / int8
 * instructions loads as well (the portable reference path, slower).
 * docs/segment.md, "Precision". */
VITC_API vitc_status vitc_sam_load_precision(const char *path, const char *precision,
                                             vitc_sam **out);
VITC_API void vitc_sam_free(vitc_sam *m);
/* The encoder's input side (1024) and the embedding's shape [C, h, w]. */
VITC_API int vitc_sam_input_size(const vitc_sam *m);
VITC_API void vitc_sam_embedding_shape(const vitc_sam *m, int64_t shape[3]);
/* Preprocess an RGB image as SamProcessor does (longest side resized to the
 * input size, rescale, normalize, zero padding right and bottom) and encode
 * it. */
VITC_API vitc_status vitc_sam_set_image(const vitc_sam *m, const vitc_image *img,
                                        vitc_sam_image **out);
/* The same from an already preprocessed tensor [3, S, S] (S the input
 * size) of an image of orig_w x orig_h pixels. */
VITC_API vitc_status vitc_sam_set_image_tensor(const vitc_sam *m, const float *pixels, int orig_w,
                                               int orig_h, vitc_sam_image **out);
VITC_API void vitc_sam_image_free(vitc_sam_image *e);
/* The embedding [C, h, w] (channels first, as SamModel.get_image_embeddings). */
VITC_API const float *vitc_sam_image_embedding(const vitc_sam_image *e);

/* One prompt, coordinates in the original image's pixels (x right, y down). */
typedef struct vitc_sam_prompt {
    int n_points;
    const float *points; /* [n_points, 2] x, y */
    const int *labels;   /* [n_points] 1 foreground, 0 background */
    const float *box;    /* [4] x0, y0, x1, y1, or NULL */
    const float *mask;   /* [256, 256] low-resolution logits (a previous
                          * result's low_res), or NULL */
    int multimask;       /* 1: the three multimask outputs; 0: the single mask */
    int binary;          /* 1: the result's masks as bytes (binary), not logits:
                          * a quarter of the memory written and read */
} vitc_sam_prompt;

typedef struct vitc_sam_result {
    int n_masks;       /* 3 (multimask) or 1 */
    int height, width; /* the original image's */
    float *masks;      /* [n_masks, height, width] logits (> 0: in the mask);
                        * NULL when the prompt asked for binary */
    float *low_res;    /* [n_masks, 256, 256] logits, reusable as a mask prompt */
    float iou[4];      /* predicted IoU of each mask */
    unsigned char *binary; /* prompt->binary: [n_masks, height, width] 1 where
                            * the logit is > 0, else 0; otherwise NULL */
} vitc_sam_result;
VITC_API vitc_status vitc_sam_predict(const vitc_sam *m, const vitc_sam_image *e,
                                      const vitc_sam_prompt *p, vitc_sam_result *out);
VITC_API void vitc_sam_result_free(vitc_sam_result *r);

/* ------------------------------------------------------------------ */
/* Depth Anything (src/models/depth.c, docs/depth.md)                 */
/* ------------------------------------------------------------------ */

/* A loaded DepthAnythingForDepthEstimation (V1 or V2) directory: the
 * DINOv2 backbone read at four layers, the DPT neck and head. Read-only
 * after loading, shareable by threads. */
typedef struct vitc_depth vitc_depth;
VITC_API vitc_status vitc_depth_load(const char *path, vitc_depth **out);
VITC_API void vitc_depth_free(vitc_depth *m);
/* The preprocessed size [H, W] for a width x height image (the processor's
 * resize: aspect kept, each side at least the configured size, multiples
 * of 14). */
VITC_API vitc_status vitc_depth_input_size(const vitc_depth *m, int width, int height, int *H,
                                           int *W);
/* predicted_depth [B, H, W] of preprocessed pixels [B, 3, H, W]. */
VITC_API vitc_status vitc_depth_forward(const vitc_depth *m, const float *pixels, int B, int H,
                                        int W, float *depth);
/* An RGB image end to end: preprocess, forward, resized back to the
 * image's height x width as the depth-estimation pipeline does. out:
 * [height, width], malloc'd (free with free()). */
VITC_API vitc_status vitc_depth_predict(const vitc_depth *m, const vitc_image *img, float **out);

#ifdef __cplusplus
}
#endif

#endif /* VITC_H */
