/*
 * index.h — the embedding index directory that `vitc embed --files-from
 * LIST --out DIR` writes (one process, or K MPI ranks) and `vitc similar
 * --index DIR` reads as one index.
 *
 * DIR holds one shard per rank, shard-RRRRR-of-KKKKK.safetensors (the
 * rank's contiguous share of LIST: tensor "embeddings" [rows, dim] float32
 * and, as metadata, the index's key, the shard's place in LIST and its
 * rows' paths), and index.json, written last, which lists the shards. The
 * key (the model by content, precisions, pooling, preprocessing, LIST's
 * hash and K) is the same string in every shard and in the manifest: a
 * shard whose key differs was made by another run.
 */
#ifndef VITC_CLI_INDEX_H
#define VITC_CLI_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define INDEX_MANIFEST "index.json"
#define INDEX_FORMAT "vitc-embedding-index"
#define INDEX_VERSION 1
/* shard numbers have five digits */
#define INDEX_MAX_SHARDS 99999
/* lines of a --files-from list */
#define INDEX_MAX_LIST 100000000

/* LIST's non-empty lines (a trailing \r dropped): paths as bytes, relative
 * ones to the working directory. CLI_OK or a reported error. */
int index_read_list(const char *path, char ***paths, int *n);
void index_free_paths(char **paths, int64_t n);
/* 64-bit FNV-1a of the list (each path and its NUL), as 16 hex digits. */
void index_list_hash(char *const *paths, int n, char hex[17]);

/* Rank r's contiguous share of n entries over k ranks: [*first, *first + *count). */
void index_share(int n, int r, int k, int *first, int *count);
/* "shard-RRRRR-of-KKKKK.safetensors" */
void index_shard_name(char *buf, size_t cap, int r, int k);

/* The model's identity by content (cache_model_sig without the files'
 * times: a copy on another machine is the same model). */
json_t *index_model_id(const char *model);

/* What index_shard_state found at a shard's path. */
enum {
    INDEX_SHARD_ABSENT,  /* no file: embed it */
    INDEX_SHARD_DONE,    /* complete, valid, this key and place: skip it */
    INDEX_SHARD_DAMAGED, /* torn or unreadable: embed it again */
    INDEX_SHARD_FOREIGN  /* a valid shard of another key, or not a file: refuse */
};
/* The state of the shard at path for key (the index's key string) and
 * place ({"rank", "first", "entries"}, compact, sorted); why gets the
 * reason for DAMAGED and FOREIGN, *rows the rows of a DONE shard. */
int index_shard_state(const char *path, const char *key, const char *place, int64_t dim,
                      int64_t *rows, char *why, size_t why_cap);

/* Writes the shard atomically (a temporary file renamed over path): emb
 * [rows, dim], paths[rows]. NULL, or why not. */
const char *index_save_shard(const char *path, const char *key, const char *place,
                             const float *emb, int64_t rows, int64_t dim,
                             const char *const *paths, int failed);

/* Removes what a killed writer of shard name left in dir (its temporary
 * files, name.tmp*). */
void index_sweep_temps(const char *dir, const char *name);

/* 1 (and its name in name) when dir holds a shard file of a run of other
 * than k ranks: its list was cut differently, so resuming cannot reuse it. */
int index_other_shards(const char *dir, int k, char *name, size_t cap);

/* Writes DIR/index.json atomically: the key and, per rank, its file, place,
 * rows and bytes. CLI_OK or a reported error. */
int index_save_manifest(const char *dir, const char *key, int k, int n_entries,
                        const long long *rows, const long long *bytes);

/* 1 when dir holds an index.json (an index directory, not an image folder). */
int index_is_dir(const char *dir);
/* The manifest's key (a new string: compact, sorted keys), or NULL with
 * why. Used to refuse writing another run's index into dir. */
char *index_manifest_key(const char *dir, char *why, size_t why_cap);

/* An index read whole: every shard, in rank order. */
typedef struct index_data {
    json_t *key;   /* the manifest's key object */
    char *key_str; /* the same, compact and sorted */
    float *emb;    /* [rows, dim] */
    char **paths;  /* [rows] */
    int64_t rows, dim;
} index_data;
/* Reads dir's manifest and every shard it lists, refusing a missing,
 * damaged or foreign shard with one line naming it. CLI_OK or reported. */
int index_load(const char *dir, index_data *d);
void index_data_free(index_data *d);

#endif
