/*
 * labels.c — libFuzzer target for the labels file reader of `vitc classify`
 * (cli_read_labels in tools/cmd_classify.c).
 *
 * The first two bytes choose the class count, the rest is the file. It is
 * handed over as a memfd's /proc path, so the reader opens a regular file
 * exactly as it would on disk, with no disk involved.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    char **labels = NULL;
    int n, fd, rc;
    if (size < 2)
        return 0;
    n = 1 + (data[0] | data[1] << 8) % 2048;
    fd = memfd_create("labels", 0);
    if (fd < 0)
        abort();
    if (size > 2 && write(fd, data + 2, size - 2) != (ssize_t)(size - 2))
        abort();
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    rc = cli_read_labels(path, n, &labels);
    close(fd);
    if (rc != 0)
        return 0;
    /* Accepted: exactly n strings, none with a line break left in it. */
    for (int i = 0; i < n; i++) {
        if (!labels[i] || strchr(labels[i], '\n'))
            abort();
        free(labels[i]);
    }
    free(labels);
    return 0;
}
