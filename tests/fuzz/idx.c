/*
 * idx.c — libFuzzer target for the IDX reader of `vitc train` / `vitc eval`
 * (vitc_dataset_open_idx and vitc_dataset_load_batch, src/data/dataset.c).
 *
 * Input: byte 0 picks the batch options (augmentation, model side, channels),
 * bytes 1-2 where the images file ends; the images file, then the labels
 * file. Both are memfds handed over by their /proc paths, so the reader opens
 * regular files exactly as on disk (raw or gzip, by their first bytes).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vitc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd_with(const uint8_t *p, size_t n, char *path, size_t cap) {
    int fd = memfd_create("idx", 0);
    if (fd < 0)
        abort();
    if (n && write(fd, p, n) != (ssize_t)n)
        abort();
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3)
        return 0;
    unsigned opt = data[0];
    size_t body = size - 3, cut = (size_t)(data[1] | data[2] << 8);
    if (cut > body)
        cut = body;
    char ip[64], lp[64];
    int fi = memfd_with(data + 3, cut, ip, sizeof ip);
    int fl = memfd_with(data + 3 + cut, body - cut, lp, sizeof lp);
    vitc_dataset *d = NULL;
    vitc_status s = vitc_dataset_open_idx(ip, lp, &d);
    close(fi);
    close(fl);
    if (s != VITC_OK) {
        if (d || !vitc_last_error()[0])
            abort(); /* a refusal leaves nothing behind and says why */
        return 0;
    }
    int64_t n = vitc_dataset_size(d);
    int classes = vitc_dataset_num_classes(d);
    for (int64_t i = 0; i < n; i++) {
        int64_t y = vitc_dataset_label(d, i);
        if (y < 0 || y >= classes)
            abort(); /* every accepted label names a class */
    }
    /* A batch of the first few samples through the training transform. */
    int nb = n < 4 ? (int)n : 4, side = 4 + (int)(opt >> 3 & 15) * 3;
    int ch = opt & 4 ? 3 : 1;
    vitc_batch_opts o = vitc_batch_default_opts(side, ch);
    o.augment = opt & 3;
    o.seed = opt;
    int64_t idx[4] = {0, n - 1, n / 2, 0}, lab[4];
    float *x = malloc(sizeof(float) * 4 * 3 * (size_t)side * (size_t)side);
    int valid = 0;
    if (!x)
        abort();
    if (nb > 0 && vitc_dataset_load_batch(d, idx, nb, &o, x, lab, &valid) == VITC_OK) {
        if (valid != nb)
            abort(); /* IDX samples are never skipped */
        for (size_t i = 0; i < (size_t)nb * (size_t)ch * (size_t)side * (size_t)side; i++)
            if (!(x[i] >= -1e-6f && x[i] <= 1.0f + 1e-6f))
                abort(); /* pixels/255 normalised with mean 0, std 1: in [0, 1] */
    }
    free(x);
    vitc_dataset_free(d);
    return 0;
}
