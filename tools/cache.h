/*
 * cache.h — the embedding caches that `vitc similar` (a folder's image
 * embeddings) and `vitc zero-shot` (a label set's class embeddings) keep in
 * the user's cache directory: where they go, the model's identity by
 * content, and the safe write (a private folder, a temporary file renamed
 * over the cache's name, never through a link).
 */
#ifndef VITC_CLI_CACHE_H
#define VITC_CLI_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "vitc.h"

/* 64-bit FNV-1a over n bytes, continuing from h (start: CACHE_FNV_BASIS).
 * Names a cache file by its key; the key itself is compared whole. */
#define CACHE_FNV_BASIS 1469598103934665603ULL
uint64_t cache_fnv1a(uint64_t h, const void *p, size_t n);

/* Bytes as lowercase hex (a file name in a key, whatever its encoding),
 * and the inverse: a new string, or NULL (not hex, a NUL byte, no memory). */
json_t *cache_json_hex(const char *s);
char *cache_unhex(const char *h);

/* The model's identity by content, not by path: a checkpoint file's, or
 * every .safetensors and .json file of a Hub directory (weights, shards,
 * config, processor, index, tokenizer.json / vocab.json), by name; with
 * text, the tokenizer files that are not JSON too (merges.txt,
 * spiece.model, *.txt.gz), and for a file the directory it lies in (where
 * a Hub file's config and tokenizer are). Each file: [size, mtime_ns,
 * content hash]. */
json_t *cache_model_sig(const char *path, int text);

/* The cache folder into dir: given (--cache), else
 * $XDG_CACHE_HOME/vitc/SUB, else $HOME/.cache/vitc/SUB, created 0700 when
 * missing. 0, or -1 with why in why (no cache is then kept). */
int cache_folder(const char *given, const char *sub, char *dir, size_t cap, char *why,
                 size_t why_cap);

/* Writes one float32 tensor [rows, dim] named tensor and metadata
 * (n_meta pairs) to path inside dir: only into a private directory of this
 * user, through a temporary file (tmp_tag names it) renamed over path, so a
 * link planted under path is replaced, never followed. NULL, or why not. */
const char *cache_save(const char *dir, const char *path, const char *tmp_tag,
                       const char *tensor, const float *data, int64_t rows, int64_t dim,
                       int n_meta, const char *const *meta_keys, const char *const *meta_vals);

/* The cache at path when it is a regular file (not a link: vitc writes
 * none, and reading through one could block on a FIFO or read a stranger's
 * file) whose metadata key_name equals key and whose tensor is [*, dim]:
 * the open file (the caller frees it) with its rows in *data, *rows. NULL
 * when absent or stale. */
vitc_safetensors *cache_open(const char *path, const char *key_name, const char *key,
                             const char *tensor, int64_t dim, const float **data, int64_t *rows);

#endif
