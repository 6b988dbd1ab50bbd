/*
 * cli_text.h — what the commands that read text share (zero-shot, embed
 * --text, similar --text, tokenize): the text tower's presence, the checks
 * on user text, a lines file, and prompts through the text tower in batches.
 */
#ifndef VITC_CLI_TEXT_H
#define VITC_CLI_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"

/* Bounds on user text (docs/limits.md): a text past them is refused
 * before any work. A CLIP or SigLIP prompt is cut at 77 / 64 tokens
 * anyway, a few hundred bytes; the bytes cap bounds the tokenizer's time. */
#define CLI_TEXT_MAX_BYTES 4096
#define CLI_TEXT_MAX_COUNT 50000
#define CLI_TEXT_FILE_MAX_BYTES (16LL << 20)
/* Prompts per text-tower forward. */
#define CLI_TEXT_BATCH 32

/* CLI_OK when m (loaded from model_path) has a text tower and its
 * tokenizer; else the one-line error (which checkpoint has one, which
 * files are missing) and CLI_FAIL. */
int cli_text_model(const char *model_path, vitc_vit *m);
/* A text as given (what: "label 3", "--text"): not empty, valid UTF-8
 * (else the byte offset is named), at most CLI_TEXT_MAX_BYTES. CLI_OK or
 * a printed error and CLI_USAGE. */
int cli_check_text(const char *what, const char *s);
/* The lines of a file (what names the option) into *out / *n: "\n" or
 * "\r\n" ends a line, the last newline optional; an empty line, a NUL
 * byte, more than CLI_TEXT_MAX_COUNT lines or CLI_TEXT_FILE_MAX_BYTES
 * bytes is an error. Each line checked as cli_check_text's. The caller
 * frees with cli_free_texts (on errors too). CLI_OK or the exit status. */
int cli_read_lines(const char *what, const char *path, char ***out, int *n);
/* s split at commas, each piece's surrounding spaces removed (as
 * transformers' pipelines split a label string); pieces checked. */
int cli_split_labels(const char *s, char ***out, int *n);
void cli_free_texts(char **v, int n);
/* The projected text features of texts[0..n) into out [n, dim],
 * CLI_TEXT_BATCH at a time, progress in pr (may be NULL). CLI_OK or the
 * library's error printed and CLI_FAIL. */
int cli_encode_texts(vitc_vit *m, const char *const *texts, int64_t n, float *out,
                     cli_progress *pr, int64_t done0);

#endif
