/*
 * cmd_tokenize.c — `vitc tokenize`: the ids a CLIP or SigLIP checkpoint's
 * text tower sees for a text, for debugging a prompt (what was cut at the
 * context, what a character became). Reads only the tokenizer files, not
 * the weights.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_text.h"

static const char tokenize_usage[] =
    "usage: vitc tokenize --model M [--json] TEXT...\n"
    "\n"
    "Print the token ids a CLIP or SigLIP checkpoint's text tower sees for each\n"
    "TEXT: start and end tokens added, cut at the context keeping the end token,\n"
    "padded as the model pads. M is a Hub directory or a tokenizer file\n"
    "(tokenizer.json, spiece.model, bpe_simple_vocab_16e6.txt.gz).\n"
    "\n"
    "options:\n"
    "  --model M      the checkpoint's directory or its tokenizer file\n"
    "  --context N    pad / cut to N ids, 1..65536 (default: the tokenizer's own)\n"
    "  --json         one JSON object per text and line:\n"
    "                 {\"text\": T, \"n\": N, \"ids\": [...]} (n: the ids before padding)\n"
    "  -h, --help     this help\n"
    "\n"
    "Text: one line per text, \"n=N:\" and the ids before the padding, then\n"
    "\"+ P x ID\" for the padding. Exit status: 0 ok, 1 when the tokenizer could\n"
    "not be read, 2 for a usage error (an empty text or invalid UTF-8 too).\n";

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL;
    int json = 0, context = 0;
    const cli_opt opts[] = {
        {"--model", NULL, CLI_STRING, &model, 0, 0, NULL},
        {"--context", NULL, CLI_INT, &context, 1, 65536, NULL},
        {"--json", NULL, CLI_FLAG, &json, 0, 0, NULL},
    };
    const cli_spec spec = {opts, (int)(sizeof opts / sizeof opts[0]), -1, "text"};
    char **pos = malloc(sizeof *pos * (size_t)(argc > 0 ? argc : 1));
    int n_pos = 0, rc;
    if (!pos)
        return cli_error("out of memory");
    rc = cli_parse_command("tokenize", &spec, argc, argv, pos, &n_pos);
    if (rc == CLI_PARSE_HELP) {
        fputs(tokenize_usage, stdout);
        free(pos);
        return CLI_OK;
    }
    if (rc != 0) {
        free(pos);
        return rc;
    }
    if (!model || n_pos < 1) {
        free(pos);
        return cli_usage_error("tokenize", "--model and one text at least are required");
    }
    for (int i = 0; i < n_pos; i++) {
        char what[32];
        snprintf(what, sizeof what, "text %d", i + 1);
        if ((rc = cli_check_text(what, pos[i])) != CLI_OK) {
            free(pos);
            return rc;
        }
    }
    vitc_tokenizer *t = NULL;
    if (vitc_tokenizer_load(model, &t) != VITC_OK) {
        free(pos);
        return cli_error("%s", vitc_last_error());
    }
    int ctx = context ? context : vitc_tokenizer_context(t);
    int32_t *ids = malloc(sizeof *ids * (size_t)(ctx > 0 ? ctx : 1));
    if (!ids)
        rc = cli_error("out of memory");
    for (int i = 0; ids && i < n_pos && rc == CLI_OK; i++) {
        int n = 0;
        if (vitc_tokenizer_encode(t, pos[i], -1, ids, ctx, &n) != VITC_OK) {
            rc = cli_error("text %d: %s", i + 1, vitc_last_error());
            break;
        }
        if (json) {
            fputs("{\"text\": ", stdout);
            cli_json_string(stdout, pos[i]);
            printf(", \"n\": %d, \"ids\": [", n);
            for (int k = 0; k < ctx; k++) printf(k ? ", %d" : "%d", (int)ids[k]);
            fputs("]}\n", stdout);
        } else {
            printf("n=%d:", n);
            for (int k = 0; k < n; k++) printf(" %d", (int)ids[k]);
            if (n < ctx)
                printf(" + %d x %d", ctx - n, (int)ids[n]);
            putchar('\n');
        }
    }
    if (rc == CLI_OK && (fflush(stdout) != 0 || ferror(stdout)))
        rc = cli_error("writing the results failed: %s", strerror(errno));
    free(ids);
    free(pos);
    vitc_tokenizer_free(t);
    return rc;
}
