/*
 * test_files.c — vitc never loses a file it replaces and never blocks on a
 * path that is not a regular file (src/io/file.c, issue 7 defects 2 and 5).
 *
 * A full disk is simulated without root: a forked child lowers
 * RLIMIT_FSIZE and ignores SIGXFSZ, so writes past the limit fail with
 * EFBIG. When run as root, a private copy of /dev/full (char 1:7) made with
 * mknod in the test's own directory stands for a device node given as an
 * output; no system path is ever written.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "vitc.h"

#include "testutil.h"

static int setup_dir(void **state) {
    (void)state;
    return tu_make_tmpdir("/tmp/vitc_test_files_XXXXXX");
}

static void write_bytes(const char *path, const char *s) { tu_write_file(path, s, strlen(s)); }

static void assert_file_is(const char *path, const char *want) {
    char buf[256];
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(buf, want, n);
}

static void assert_error(vitc_status s, vitc_status want, const char *needle) {
    assert_int_equal(s, want);
    tu_assert_message_has(needle);
}

/* The writers of vitc, on one path; each writes well over 1 KB. */
enum { W_NPY, W_ST, W_BYTES, W_PNG, N_WRITERS };
static float big[4096];
static uint8_t pixels[64 * 64 * 3];

static vitc_status write_with(int w, const char *path) {
    int64_t shape[1] = {4096};
    const char *name = "x";
    int nd = 1;
    const int64_t *shp = shape;
    const float *d = big;
    for (int i = 0; i < 4096; i++)
        big[i] = (float)i * 0.37f;
    uint32_t x = 2463534242u; /* xorshift: noise PNG cannot compress below 1 KB */
    for (size_t i = 0; i < sizeof pixels; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        pixels[i] = (uint8_t)x;
    }
    switch (w) {
    case W_NPY: return vitc_save_npy(path, big, 1, shape);
    case W_ST: return vitc_safetensors_save(path, 1, &name, &nd, &shp, &d, 0, NULL, NULL);
    case W_BYTES: return vitc_save_bytes(path, big, sizeof big);
    default: return vitc_image_save_png(path, pixels, 64, 64);
    }
}

static int png_built(void) {
    static int built = -1;
    if (built < 0) {
        uint8_t px[3] = {0};
        char p[512];
        snprintf(p, sizeof p, "%s/probe.png", tu_tmpdir);
        built = vitc_image_save_png(p, px, 1, 1) != VITC_ERR_UNSUPPORTED;
        unlink(p);
        if (!built)
            printf("test_files: built without libpng (NO_PNG=1): the PNG writer's cases skipped\n");
    }
    return built;
}

/* ------------------------------------------------------------------ */
/* Writing                                                            */
/* ------------------------------------------------------------------ */

static void test_replace_and_no_leftovers(void **state) {
    (void)state;
    for (int w = 0; w < N_WRITERS; w++) {
        if (w == W_PNG && !png_built())
            continue;
        char *p = tu_tmp_path("out");
        write_bytes(p, "old");
        chmod(p, 0640);
        assert_int_equal(write_with(w, p), VITC_OK);
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        assert_true(sb.st_size > 4096);
        assert_int_equal(sb.st_mode & 0777, 0640); /* the replaced file's mode is kept */
        assert_int_equal(tu_dir_entries(), 1);
        unlink(p);
        /* A new file honours the umask like fopen. */
        mode_t old = umask(027);
        assert_int_equal(write_with(w, p), VITC_OK);
        umask(old);
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(sb.st_mode & 0777, 0640);
        unlink(p);
    }
}

static void test_npy_content(void **state) {
    (void)state;
    float v[6] = {1.5f, -2.0f, 0.0f, 3.25f, 1e-3f, -7.0f};
    int64_t shape[2] = {2, 3};
    char *p = tu_tmp_path("a.npy");
    assert_int_equal(vitc_save_npy(p, v, 2, shape), VITC_OK);
    unsigned char b[512];
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    assert_memory_equal(b, "\x93NUMPY\x01\x00", 8);
    size_t hl = b[8] | (size_t)b[9] << 8;
    assert_int_equal((10 + hl) % 64, 0);
    assert_int_equal(n, 10 + hl + sizeof v);
    assert_int_equal(b[10 + hl - 1], '\n');
    assert_non_null(memmem(b + 10, hl, "'shape': (2, 3)", 15));
    assert_non_null(memmem(b + 10, hl, "'descr': '<f4'", 14));
    assert_memory_equal(b + 10 + hl, v, sizeof v); /* little-endian host */
    /* 1-D is a Python 1-tuple; 0-D an empty one. */
    assert_int_equal(vitc_save_npy(p, v, 1, (const int64_t[]){6}), VITC_OK);
    f = fopen(p, "rb");
    n = fread(b, 1, sizeof b, f);
    fclose(f);
    assert_non_null(memmem(b, n, "'shape': (6,)", 13));
    assert_int_equal(vitc_save_npy(p, v, 0, NULL), VITC_OK);
    f = fopen(p, "rb");
    n = fread(b, 1, sizeof b, f);
    fclose(f);
    assert_non_null(memmem(b, n, "'shape': ()", 11));
    assert_error(vitc_save_npy(p, v, 33, shape), VITC_ERR_SHAPE, "ndim 33");
    assert_error(vitc_save_npy(p, v, 2, (const int64_t[]){2, -3}), VITC_ERR_SHAPE, "bad shape");
    assert_error(vitc_save_npy(p, NULL, 2, shape), VITC_ERR_INVALID_ARG, "data is NULL");
    unlink(p);
}

/* Each writer, in a child whose file-size limit is 1 KB with SIGXFSZ
 * ignored: the write fails with EFBIG, which must be reported; the file that
 * was there must be byte-identical and no temporary file may be left. */
static void test_full_disk_keeps_old_file(void **state) {
    (void)state;
    for (int w = 0; w < N_WRITERS; w++) {
        if (w == W_PNG && !png_built())
            continue;
        char *p = tu_tmp_path("keep");
        write_bytes(p, "precious");
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            struct rlimit rl = {1024, 1024};
            signal(SIGXFSZ, SIG_IGN);
            if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
                _exit(10);
            vitc_status s = write_with(w, p);
            if (s != VITC_ERR_IO)
                _exit(11);
            if (!strstr(vitc_last_error(), "File too large") || !strstr(vitc_last_error(), p))
                _exit(12);
            _exit(0);
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
        assert_file_is(p, "precious");
        assert_int_equal(tu_dir_entries(), 1);
        unlink(p);
    }
}

/* A path that exists and is not a regular file is refused, not replaced. */
static void test_non_regular_targets_left_alone(void **state) {
    (void)state;
    char *fifo = tu_tmp_path("fifo"), *dir = tu_tmp_path("dir"), *dev = tu_tmp_path("full");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(mkdir(dir, 0700), 0);
    int have_dev = geteuid() == 0 && mknod(dev, S_IFCHR | 0600, makedev(1, 7)) == 0;
    for (int w = 0; w < N_WRITERS; w++) {
        if (w == W_PNG && !png_built())
            continue;
        struct stat sb;
        assert_error(write_with(w, fifo), VITC_ERR_IO, "is a FIFO");
        assert_int_equal(stat(fifo, &sb), 0);
        assert_true(S_ISFIFO(sb.st_mode));
        assert_error(write_with(w, dir), VITC_ERR_IO, "is a directory");
        assert_int_equal(stat(dir, &sb), 0);
        assert_true(S_ISDIR(sb.st_mode));
        if (have_dev) {
            assert_error(write_with(w, dev), VITC_ERR_IO, "is a character device");
            assert_int_equal(stat(dev, &sb), 0);
            assert_true(S_ISCHR(sb.st_mode));
            assert_int_equal(sb.st_rdev, makedev(1, 7));
        }
    }
    assert_int_equal(tu_dir_entries(), 2 + have_dev);
    unlink(fifo);
    rmdir(dir);
    unlink(dev);
    if (!have_dev)
        print_message("      (not root: the device-node case ran only as a FIFO and a directory)\n");
}

/* A symbolic link to a file stays a link; the file it names gets the data. */
static void test_symlink_followed(void **state) {
    (void)state;
    char *real = tu_tmp_path("real.npy"), *link = tu_tmp_path("link.npy"), *dangling = tu_tmp_path("d");
    write_bytes(real, "old");
    assert_int_equal(symlink("real.npy", link), 0);
    float v = 2.0f;
    assert_int_equal(vitc_save_npy(link, &v, 1, (const int64_t[]){1}), VITC_OK);
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    assert_int_equal(stat(real, &sb), 0);
    assert_int_equal(sb.st_size, 128 + 4);
    assert_int_equal(symlink("nowhere/x", dangling), 0);
    assert_error(vitc_save_npy(dangling, &v, 1, (const int64_t[]){1}), VITC_ERR_IO,
                 "leads nowhere");
    assert_int_equal(tu_dir_entries(), 3);
    unlink(real);
    unlink(link);
    unlink(dangling);
}

static void test_unwritable(void **state) {
    (void)state;
    float v = 1.0f;
    assert_error(vitc_save_npy(tu_tmp_path("no/such/dir.npy"), &v, 0, NULL), VITC_ERR_IO,
                 "No such file or directory");
    if (geteuid() == 0) {
        print_message("      (root: permissions are not enforced, read-only case skipped)\n");
        return;
    }
    char *p = tu_tmp_path("ro.npy");
    write_bytes(p, "old");
    chmod(p, 0444);
    assert_error(vitc_save_npy(p, &v, 0, NULL), VITC_ERR_IO, "cannot write");
    assert_file_is(p, "old");
    unlink(p);
}

/* ------------------------------------------------------------------ */
/* Reading                                                            */
/* ------------------------------------------------------------------ */

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "test_files: an open blocked on a FIFO\n";
    ssize_t r = write(2, m, sizeof m - 1);
    (void)r;
    _exit(99);
}

/* Every API that opens a path refuses a FIFO at once (the old code blocked
 * in open forever: no writer ever comes); an alarm turns a hang into a
 * failure. */
static void test_fifo_inputs_do_not_block(void **state) {
    (void)state;
    char *fifo = tu_tmp_path("in.fifo");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_alarm);
    alarm(5);
    vitc_safetensors *st = NULL;
    vitc_image img = {0};
    vitc_vit *m = NULL;
    FILE *f = NULL;
    assert_error(vitc_safetensors_load(fifo, &st), VITC_ERR_IO, "is a FIFO");
    assert_null(st);
    vitc_status s = vitc_image_load(fifo, 0, &img);
    if (s != VITC_ERR_UNSUPPORTED)
        assert_error(s, VITC_ERR_IO, "is a FIFO");
    assert_error(vitc_vit_load(fifo, NULL, &m), VITC_ERR_IO, "is a FIFO");
    assert_error(vitc_open_read(fifo, 0, &f, NULL), VITC_ERR_IO, "is a FIFO");
    assert_null(f);
    /* A device reads forever too (/dev/zero); a directory is no file. */
    assert_error(vitc_safetensors_load("/dev/zero", &st), VITC_ERR_IO, "is a character device");
    assert_error(vitc_safetensors_load(tu_tmpdir, &st), VITC_ERR_IO, "is a directory");
    alarm(0);
    unlink(fifo);
}

static void test_open_read(void **state) {
    (void)state;
    char *p = tu_tmp_path("r.txt");
    write_bytes(p, "hello");
    FILE *f = NULL;
    int64_t size = -1;
    assert_int_equal(vitc_open_read(p, 0, &f, &size), VITC_OK);
    assert_int_equal(size, 5);
    char buf[8] = {0};
    assert_int_equal(fread(buf, 1, sizeof buf, f), 5); /* blocking mode again: plain reads */
    assert_int_equal(fcntl(fileno(f), F_GETFL) & O_NONBLOCK, 0);
    assert_string_equal(buf, "hello");
    fclose(f);
    assert_int_equal(vitc_open_read(p, 5, &f, NULL), VITC_OK);
    fclose(f);
    assert_error(vitc_open_read(p, 4, &f, NULL), VITC_ERR_FORMAT, "over the limit of 4 bytes");
    assert_null(f);
    assert_error(vitc_open_read(tu_tmp_path("absent"), 0, &f, NULL), VITC_ERR_IO, "cannot open");
    assert_error(vitc_open_read(NULL, 0, &f, NULL), VITC_ERR_INVALID_ARG, "path is NULL");
    assert_error(vitc_open_read(p, -1, &f, NULL), VITC_ERR_INVALID_ARG, "max_bytes");
    unlink(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replace_and_no_leftovers),
        cmocka_unit_test(test_npy_content),
        cmocka_unit_test(test_full_disk_keeps_old_file),
        cmocka_unit_test(test_non_regular_targets_left_alone),
        cmocka_unit_test(test_symlink_followed),
        cmocka_unit_test(test_unwritable),
        cmocka_unit_test(test_fifo_inputs_do_not_block),
        cmocka_unit_test(test_open_read),
    };
    return cmocka_run_group_tests(tests, setup_dir, tu_teardown_tmpdir);
}
