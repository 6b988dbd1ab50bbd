/* test_image.c — PNG/JPEG decoding against PIL's pixels, broken files,
 * the PNG writer, and preprocessing against torchvision's numbers
 * (fixtures: tests/reference/gen_images.py). Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vitc.h"

#include "testutil.h"

#define DATA "tests/data/"

static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
static const float imagenet_std[3] = {0.229f, 0.224f, 0.225f};

static int have_png(void) {
    vitc_image img;
    vitc_status st = vitc_image_load(DATA "rgb8.png", 0, &img);
    vitc_image_free(&img);
    return st != VITC_ERR_UNSUPPORTED;
}

static int have_jpeg(void) {
    vitc_image img;
    vitc_status st = vitc_image_load(DATA "gray.jpg", 0, &img);
    vitc_image_free(&img);
    return st != VITC_ERR_UNSUPPORTED;
}

/* Every fixture of images.txt decodes to PIL's pixels (within its tolerance). */
static void test_decode_every_kind(void **state) {
    (void)state;
    FILE *f = fopen(DATA "images.txt", "r");
    char line[512];
    int checked = 0;
    assert_non_null(f);
    while (fgets(line, sizeof line, f)) {
        char name[200], exp[200], path[300];
        int w, h, tol;
        vitc_image img;
        size_t len;
        unsigned char *want;
        int worst = 0;
        if (line[0] == '#' || sscanf(line, "%199s %d %d %199s %d", name, &w, &h, exp, &tol) != 5)
            continue;
        int is_png = strstr(name, ".png") != NULL;
        if ((is_png && !have_png()) || (!is_png && !have_jpeg())) {
            snprintf(path, sizeof path, DATA "%s", name);
            assert_int_equal(vitc_image_load(path, 0, &img), VITC_ERR_UNSUPPORTED);
            checked++;
            continue;
        }
        snprintf(path, sizeof path, DATA "%s", name);
        if (vitc_image_load(path, 0, &img) != VITC_OK)
            fail_msg("%s: %s", name, vitc_last_error());
        assert_int_equal(img.width, w);
        assert_int_equal(img.height, h);
        snprintf(path, sizeof path, DATA "%s", exp);
        want = tu_read_file(path, &len);
        assert_non_null(want);
        assert_int_equal(len, (size_t)w * h * 3);
        for (size_t i = 0; i < len; i++) {
            int d = abs((int)img.rgb[i] - (int)want[i]);
            if (d > worst)
                worst = d;
        }
        if (worst > tol)
            fail_msg("%s: max pixel difference %d > tolerance %d", name, worst, tol);
        free(want);
        /* The in-memory entry point decodes the same bytes to the same pixels. */
        snprintf(path, sizeof path, DATA "%s", name);
        unsigned char *bytes = tu_read_file(path, &len);
        vitc_image mem;
        assert_non_null(bytes);
        if (vitc_image_load_memory(bytes, len, 0, &mem) != VITC_OK)
            fail_msg("%s from memory: %s", name, vitc_last_error());
        assert_int_equal(mem.width, w);
        assert_int_equal(mem.height, h);
        assert_memory_equal(mem.rgb, img.rgb, (size_t)w * h * 3);
        vitc_image_free(&mem);
        /* ... and applies the same pixel limit from the header. */
        assert_int_equal(vitc_image_load_memory(bytes, len, (int64_t)w * h - 1, &mem),
                         VITC_ERR_FORMAT);
        assert_non_null(strstr(vitc_last_error(), "<memory>"));
        assert_null(mem.rgb);
        free(bytes);
        vitc_image_free(&img);
        assert_null(img.rgb);
        checked++;
    }
    fclose(f);
    assert_true(checked >= 19);
}

static void test_load_memory_args(void **state) {
    (void)state;
    vitc_image img;
    static const unsigned char junk[4] = {1, 2, 3, 4};
    assert_int_equal(vitc_image_load_memory(NULL, 4, 0, &img), VITC_ERR_INVALID_ARG);
    assert_null(img.rgb);
    assert_int_equal(vitc_image_load_memory(junk, 0, 0, &img), VITC_ERR_FORMAT);
    assert_int_equal(vitc_image_load_memory(junk, sizeof junk, 0, &img), VITC_ERR_FORMAT);
    assert_non_null(strstr(vitc_last_error(), "not a PNG or JPEG"));
    assert_int_equal(vitc_image_load_memory(junk, sizeof junk, 0, NULL), VITC_ERR_INVALID_ARG);
}

/* VITC_IMAGE_ALPHA_WHITE: gray+alpha over white as PIL's alpha_composite
 * gives it (the first row of gray_alpha.png, from Pillow); plain loading
 * drops alpha; unknown flags are refused. */
static void test_load_alpha_on_white(void **state) {
    (void)state;
    static const uint8_t pil_white[8] = {92, 249, 207, 206, 132, 228, 218, 246};
    static const uint8_t dropped[8] = {24, 157, 190, 150, 125, 126, 171, 234};
    vitc_image img;
    if (!have_png())
        skip();
    assert_int_equal(vitc_image_load_flags(DATA "gray_alpha.png", 0, VITC_IMAGE_ALPHA_WHITE, &img),
                     VITC_OK);
    for (int x = 0; x < 8; x++)
        for (int c = 0; c < 3; c++) assert_int_equal(img.rgb[x * 3 + c], pil_white[x]);
    vitc_image_free(&img);
    assert_int_equal(vitc_image_load_flags(DATA "gray_alpha.png", 0, 0, &img), VITC_OK);
    for (int x = 0; x < 8; x++) assert_int_equal(img.rgb[x * 3], dropped[x]);
    vitc_image_free(&img);
    assert_int_equal(vitc_image_load_flags(DATA "gray_alpha.png", 0, 2, &img),
                     VITC_ERR_INVALID_ARG);
    assert_null(img.rgb);
    static const unsigned char junk[4] = {1, 2, 3, 4};
    assert_int_equal(vitc_image_load_memory_flags(junk, sizeof junk, 0, 4, &img),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_load_memory_flags(junk, sizeof junk, 0, VITC_IMAGE_ALPHA_WHITE,
                                                  &img),
                     VITC_ERR_FORMAT);
}

/* Broken or hostile files are errors with a message naming the file. */
static void test_bad_files(void **state) {
    (void)state;
    static const struct {
        const char *name;
        vitc_status want;
        const char *msg;
    } cases[] = {
        {"truncated.png", VITC_ERR_FORMAT, "truncated"},
        {"truncated_header.png", VITC_ERR_FORMAT, "truncated"},
        {"bad_crc.png", VITC_ERR_FORMAT, "corrupt PNG"},
        {"lying_header.png", VITC_ERR_FORMAT, "over the limit"},
        {"truncated.jpg", VITC_ERR_FORMAT, "corrupt JPEG"},
        {"truncated_header.jpg", VITC_ERR_FORMAT, NULL},
        {"lying_header.jpg", VITC_ERR_FORMAT, "over the limit"},
        {"cmyk.jpg", VITC_ERR_UNSUPPORTED, "CMYK"},
        {"empty.png", VITC_ERR_FORMAT, "empty"},
        {"not_an_image.png", VITC_ERR_FORMAT, "not a PNG or JPEG"},
        {"does_not_exist.png", VITC_ERR_IO, "cannot open"},
        {"", VITC_ERR_IO, NULL}, /* the directory tests/data/ itself */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[300];
        vitc_image img = {7, 7, (uint8_t *)&img};
        vitc_status st;
        int is_png = strstr(cases[i].name, ".png") != NULL;
        int is_jpg = strstr(cases[i].name, ".jpg") != NULL;
        snprintf(path, sizeof path, DATA "%s", cases[i].name);
        st = vitc_image_load(path, 0, &img);
        assert_null(img.rgb);
        assert_int_equal(img.width, 0);
        int decoder_needed = cases[i].want != VITC_ERR_IO &&
                             !(cases[i].msg && (!strcmp(cases[i].msg, "empty") ||
                                                !strcmp(cases[i].msg, "not a PNG or JPEG")));
        if (decoder_needed && ((is_png && !have_png()) || (is_jpg && !have_jpeg()))) {
            assert_int_equal(st, VITC_ERR_UNSUPPORTED);
            continue;
        }
        if (st != cases[i].want)
            fail_msg("%s: status %d (%s), want %d", cases[i].name, st, vitc_last_error(),
                     cases[i].want);
        if (cases[i].name[0])
            assert_non_null(strstr(vitc_last_error(), cases[i].name));
        if (cases[i].msg && !strstr(vitc_last_error(), cases[i].msg))
            fail_msg("%s: message '%s' lacks '%s'", cases[i].name, vitc_last_error(),
                     cases[i].msg);
    }
    assert_int_equal(vitc_image_load(NULL, 0, &(vitc_image){0}), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_load(DATA "rgb8.png", 0, NULL), VITC_ERR_INVALID_ARG);
}

/* The pixel limit is applied from the header: a 37x23 image passes at
 * exactly its pixel count and fails one below. */
static void test_pixel_limit(void **state) {
    (void)state;
    vitc_image img;
    const char *files[] = {DATA "rgb8.png", DATA "rgb8_interlaced.png", DATA "rgb444.jpg"};
    for (int i = 0; i < 3; i++) {
        if ((i < 2 && !have_png()) || (i == 2 && !have_jpeg()))
            continue;
        assert_int_equal(vitc_image_load(files[i], 37 * 23, &img), VITC_OK);
        vitc_image_free(&img);
        assert_int_equal(vitc_image_load(files[i], 37 * 23 - 1, &img), VITC_ERR_FORMAT);
        assert_non_null(strstr(vitc_last_error(), "over the limit"));
        assert_null(img.rgb);
    }
}

static void test_png_roundtrip(void **state) {
    (void)state;
    char path[] = "/tmp/vitc_test_image_XXXXXX";
    int fd = mkstemp(path);
    int w = 19, h = 7;
    uint8_t px[19 * 7 * 3];
    vitc_image img;
    assert_true(fd >= 0);
    close(fd);
    for (int i = 0; i < w * h * 3; i++)
        px[i] = (uint8_t)(i * 37 + 11);
    if (!have_png()) {
        assert_int_equal(vitc_image_save_png(path, px, w, h), VITC_ERR_UNSUPPORTED);
        remove(path);
        return;
    }
    assert_int_equal(vitc_image_save_png(path, px, w, h), VITC_OK);
    assert_int_equal(vitc_image_load(path, 0, &img), VITC_OK);
    assert_int_equal(img.width, w);
    assert_int_equal(img.height, h);
    assert_memory_equal(img.rgb, px, sizeof px);
    vitc_image_free(&img);
    remove(path);
    assert_int_equal(vitc_image_save_png(path, px, 0, h), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_save_png("/nonexistent-dir/x.png", px, w, h), VITC_ERR_IO);
}

/* Preprocessing against torchvision's ImageClassification on uint8 tensors.
 * Resizing rounds to uint8 as torchvision does, so the result is exact but
 * for a rare tie (x.5 within a float ulp) rounding the other way: one level,
 * 1/255/std <= 0.0175 after normalisation. */
static void check_preprocess(const char *src, int resize, int crop, const char *ref) {
    vitc_image img;
    size_t n = (size_t)3 * crop * crop, len;
    float *out = malloc(n * sizeof(float)), *want;
    int off = 0;
    double worst = 0;
    if (!have_png())
        return;
    assert_int_equal(vitc_image_load(src, 0, &img), VITC_OK);
    assert_int_equal(vitc_image_preprocess(&img, resize, crop, imagenet_mean, imagenet_std, out),
                     VITC_OK);
    want = (float *)tu_read_file(ref, &len);
    assert_non_null(want);
    assert_int_equal(len, n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)out[i] - want[i]);
        if (d > 1e-6)
            off++;
        if (d > worst)
            worst = d;
    }
    if (worst > 0.0176 || off > 2)
        fail_msg("%s resize %d crop %d: max diff %g, %d values off", src, resize, crop, worst,
                 off);
    free(want);
    free(out);
    vitc_image_free(&img);
}

static void test_preprocess_vs_torchvision(void **state) {
    (void)state;
    check_preprocess(DATA "photo.png", 64, 56, DATA "photo_pre_64_56.f32");  /* downscale */
    check_preprocess(DATA "gray8.png", 40, 48, DATA "gray8_pre_40_48.f32");  /* up + pad */
    check_preprocess(DATA "rgb8.png", 0, 21, DATA "rgb8_pre_0_21.f32");      /* no resize */
}

static void test_preprocess_args(void **state) {
    (void)state;
    uint8_t px[4 * 2 * 3] = {0};
    vitc_image img = {4, 2, px};
    float out[3 * 4 * 4];
    float bad_std[3] = {0.229f, 0.0f, 0.225f};
    assert_int_equal(vitc_image_preprocess(&img, 0, 0, imagenet_mean, imagenet_std, out),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_preprocess(&img, -1, 2, imagenet_mean, imagenet_std, out),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_preprocess(&img, 0, 2, imagenet_mean, bad_std, out),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_image_preprocess(NULL, 0, 2, imagenet_mean, imagenet_std, out),
                     VITC_ERR_INVALID_ARG);
    /* A crop larger than the image pads with zeros (torchvision's fill 0,
     * then normalised): 4x2 black image, crop 4 -> every value -mean/std. */
    assert_int_equal(vitc_image_preprocess(&img, 0, 4, imagenet_mean, imagenet_std, out),
                     VITC_OK);
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 16; i++)
            assert_float_equal(out[c * 16 + i], -imagenet_mean[c] / imagenet_std[c], 1e-6);
    /* resize 1 of a wide image: shorter side 1, longer int(1 * 4 / 2) = 2. */
    px[0] = 255;
    assert_int_equal(vitc_image_preprocess(&img, 1, 1, imagenet_mean, imagenet_std, out),
                     VITC_OK);
}

/* One channel is torchvision's Grayscale on the uint8 tensor: float32
 * 0.2989 r + 0.587 g + 0.114 b, truncated. The reference is the float64 sum,
 * on pixels whose sum is not within 1e-3 of an integer (where float32 and
 * float64 could truncate differently). */
static void test_preprocess_gray(void **state) {
    (void)state;
    enum { W = 64 };
    uint8_t px[W * 3];
    vitc_image img = {W, 1, px};
    const float mean = 0.25f, std = 0.5f;
    float out[W * W];
    uint64_t seed = 12345;
    int checked = 0;
    for (int i = 0; i < W * 3; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        px[i] = (uint8_t)(seed >> 56);
    }
    /* no resize, crop W: row 0 of the crop's middle holds the pixels */
    assert_int_equal(vitc_image_preprocess_channels(&img, 0, W, 1, &mean, &std, out), VITC_OK);
    for (int x = 0; x < W; x++) {
        double l = 0.2989 * px[3 * x] + 0.587 * px[3 * x + 1] + 0.114 * px[3 * x + 2];
        double want = (floor(l) / 255.0 - mean) / std;
        double got = out[(W - 1) / 2 * W + x]; /* torchvision pads (W - 1) / 2 rows on top */
        if (fabs(l - floor(l + 0.5)) < 1e-3)
            continue;
        assert_float_equal(got, want, 1e-6);
        checked++;
    }
    assert_true(checked > W / 2);
    /* the rest is the padding, normalised zero */
    assert_float_equal(out[0], (0.0 - mean) / std, 1e-6);
    /* channel counts images cannot make */
    for (int ch = -1; ch <= 64; ch += 1)
        if (ch != 1 && ch != 3)
            assert_int_equal(vitc_image_preprocess_channels(&img, 0, 4, ch, imagenet_mean,
                                                            imagenet_std, out),
                             VITC_ERR_INVALID_ARG);
}

/* Only the crop's window of the resize is computed: a smaller crop equals
 * the middle of a crop that covers the whole resized image, bit for bit. */
static void test_preprocess_window_is_full_resize(void **state) {
    (void)state;
    enum { H = 37, W = 91, R = 23, FULL_W = 56 }; /* resized: 23 x int(23*91/37) = 56 */
    static uint8_t px[H * W * 3];
    static float full[3 * FULL_W * FULL_W], part[3 * 17 * 17];
    vitc_image img = {W, H, px};
    for (int i = 0; i < H * W * 3; i++)
        px[i] = (uint8_t)((i * 7919u) >> 3);
    assert_int_equal(vitc_image_preprocess(&img, R, FULL_W, imagenet_mean, imagenet_std, full),
                     VITC_OK);
    assert_int_equal(vitc_image_preprocess(&img, R, 17, imagenet_mean, imagenet_std, part),
                     VITC_OK);
    /* full: the 23 rows sit at padding offset (56 - 23) / 2 = 16, columns
     * at 0; the 17 crop starts at row round(6 / 2) = 3, column round(39/2) = 20 */
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < 17; y++)
            for (int x = 0; x < 17; x++)
                assert_memory_equal(&part[(c * 17 + y) * 17 + x],
                                    &full[(c * FULL_W + 16 + 3 + y) * FULL_W + 20 + x],
                                    sizeof(float));
}

/* A vertical resize whose crop starts below the first input row the taps
 * read. Fuzz regression (tests/fuzz/regressions/image/, replayed by make
 * fuzz): a row pointer was formed outside the buffer, unused but undefined,
 * which clang's UBSan reports. The crop is the window of the full resize,
 * gray as well as RGB. */
static void test_preprocess_window_rows_resized(void **state) {
    (void)state;
    enum { H = 224, W = 225, R = 40, C = 32 }; /* resized: 40 x int(40*225/224) = 40 */
    static uint8_t px[H * W * 3];
    static float full[3 * R * R], part[3 * C * C];
    vitc_image img = {W, H, px};
    for (int i = 0; i < H * W * 3; i++)
        px[i] = (uint8_t)((i * 7919u) >> 5);
    for (int ch = 1; ch <= 3; ch += 2) {
        assert_int_equal(vitc_image_preprocess_channels(&img, R, R, ch, imagenet_mean,
                                                        imagenet_std, full), VITC_OK);
        assert_int_equal(vitc_image_preprocess_channels(&img, R, C, ch, imagenet_mean,
                                                        imagenet_std, part), VITC_OK);
        for (int c = 0; c < ch; c++)
            for (int y = 0; y < C; y++) /* offsets round((40 - 32) / 2) = 4 */
                assert_memory_equal(&part[(c * C + y) * C], &full[(c * R + 4 + y) * R + 4],
                                    C * sizeof(float));
    }
}

/* A 100000x1 image resized to 256 is 25.6M x 256 pixels, of which the
 * crop needs 224 x 224: computed without the 2 GB the whole resize takes.
 * A constant image stays constant. */
static void test_preprocess_extreme_aspect(void **state) {
    (void)state;
    enum { N = 100000, C = 224 };
    uint8_t *px = malloc((size_t)N * 3);
    float *out = malloc(sizeof(float) * 3 * C * C);
    vitc_image wide = {N, 1, px}, tall = {1, N, px};
    assert_non_null(px);
    assert_non_null(out);
    memset(px, 77, (size_t)N * 3);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(vitc_image_preprocess(k ? &tall : &wide, 256, C, imagenet_mean,
                                               imagenet_std, out),
                         VITC_OK);
        for (int c = 0; c < 3; c++)
            for (int i = 0; i < C * C; i++)
                assert_float_equal(out[c * C * C + i],
                                   (77.0f / 255.0f - imagenet_mean[c]) / imagenet_std[c], 1e-6);
    }
    free(out);
    free(px);
}

/* The intermediates' cap is checked before anything is allocated or
 * written: a 10000x10000 image (never touched: a read-only zero mapping)
 * with crop 9999 would need 1.2 GB for the window's width pass. */
static void test_preprocess_intermediate_cap(void **state) {
    (void)state;
    size_t n_img = (size_t)10000 * 10000 * 3, n_out = sizeof(float) * 3 * 9999 * 9999;
    void *px = mmap(NULL, n_img, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *out = mmap(NULL, n_out, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    vitc_image img = {10000, 10000, px};
    if (px == MAP_FAILED || out == MAP_FAILED)
        skip();
    assert_int_equal(vitc_image_preprocess(&img, 9999, 9999, imagenet_mean, imagenet_std, out),
                     VITC_ERR_INVALID_ARG);
    assert_non_null(strstr(vitc_last_error(), "MiB of intermediates"));
    munmap(px, n_img);
    munmap(out, n_out);
}

int main(void) {
    /* A build without a decoder checks that its images are refused as
     * unsupported instead of comparing pixels: say so, or a pass would
     * read as full coverage. */
    if (!have_png())
        printf("test_image: built without libpng (NO_PNG=1): PNG files checked to be refused\n");
    if (!have_jpeg())
        printf("test_image: built without libturbojpeg (NO_JPEG=1): JPEG files checked to be "
               "refused\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_every_kind),
        cmocka_unit_test(test_load_memory_args),
        cmocka_unit_test(test_load_alpha_on_white),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_pixel_limit),
        cmocka_unit_test(test_png_roundtrip),
        cmocka_unit_test(test_preprocess_vs_torchvision),
        cmocka_unit_test(test_preprocess_args),
        cmocka_unit_test(test_preprocess_gray),
        cmocka_unit_test(test_preprocess_window_is_full_resize),
        cmocka_unit_test(test_preprocess_window_rows_resized),
        cmocka_unit_test(test_preprocess_extreme_aspect),
        cmocka_unit_test(test_preprocess_intermediate_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
