/*
 * cli_args.c — libFuzzer target for the command-line option parsers.
 *
 * The input is split at NUL bytes into argv; the first byte picks the
 * command. Only the parsers run (the command bodies would open files named by
 * the input). They are static in their command's file, so that file is part
 * of this one.
 */
#include "../../tools/cmd_classify.c"
#include "../../tools/cmd_attention_map.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_MAX_ARGS 64

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf, *argv[FUZZ_MAX_ARGS + 2];
    int argc = 1, rc;
    if (size < 1)
        return 0;
    /* One byte more, so the last argument is NUL-terminated too. */
    if (!(buf = calloc(size, 1)))
        abort();
    memcpy(buf, data + 1, size - 1);
    argv[0] = data[0] & 1 ? "attention-map" : "classify";
    for (size_t i = 0; i < size - 1 && argc <= FUZZ_MAX_ARGS; i++)
        if (i == 0 || buf[i - 1] == '\0')
            argv[argc++] = buf + i;
    argv[argc] = NULL;
    if (data[0] & 1) {
        am_opts o;
        memset(&o, 0, sizeof o);
        rc = am_parse(argc, argv, &o);
        if (rc == 0 && (!o.model || !o.out || !o.image))
            abort(); /* accepted without what the command needs */
    } else {
        classify_opts o;
        memset(&o, 0, sizeof o);
        rc = parse_args(argc, argv, &o);
        if (rc == 0 && (!o.model || o.n_images < 1 || o.topk < 1 || o.batch < 1))
            abort();
        free(o.images);
    }
    free(buf);
    return 0;
}
